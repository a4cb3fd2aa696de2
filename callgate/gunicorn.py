"""gunicorn's configuration for callgate (``gunicorn -c python:callgate.gunicorn
callgate.wsgi``): the Prometheus multiprocess bookkeeping. Every other setting (bind,
workers, timeout, logger class) stays on the command line.

With several workers each is its own process with its own counters; prometheus_client's
multiprocess mode makes them write to files in ``PROMETHEUS_MULTIPROC_DIR`` and
``/metrics`` (``callgate.prometheus.metrics_view``) sums them, so a scrape sees every
worker's requests whichever worker answers. The hooks:

- ``on_starting`` (the master, before the first fork): the directory is set
  (``DEFAULT_DIR`` when the environment names none; the workers inherit the variable, and
  import prometheus_client after it is set) and emptied of a previous run's files;
- ``child_exit``: a worker that exited (recycled, killed) has its live gauges marked dead
  (``multiprocess.mark_process_dead``); its counters stay in the sums, as Prometheus
  expects of a counter.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from prometheus_client import multiprocess

#: Where the workers' metric files go when ``PROMETHEUS_MULTIPROC_DIR`` is unset.
DEFAULT_DIR = "/tmp/callgate-prometheus"


def on_starting(server) -> None:
    """Set and empty ``PROMETHEUS_MULTIPROC_DIR`` before any worker starts."""
    path = Path(os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", DEFAULT_DIR))
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


def child_exit(server, worker) -> None:
    """A worker exited: its live gauges no longer count (``mark_process_dead``)."""
    multiprocess.mark_process_dead(worker.pid)
