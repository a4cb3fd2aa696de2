"""Prometheus multiprocess mode (issue 16): under gunicorn with several workers, /metrics
sums the counters of every process (``PROMETHEUS_MULTIPROC_DIR``, ``callgate.gunicorn``)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import httpx
from django.conf import settings
from django.db import connection
from django.test import TransactionTestCase

from callgate import gunicorn
from tests.factories import BaseTestCase

ROOT = Path(__file__).resolve().parents[2]
VERDICT = 'callgate_verdicts_total{reason="ok",route="proceed"}'


def value(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def count_in_a_process(path: str, n: int) -> None:
    """A separate interpreter in multiprocess mode counts ``n`` ok verdicts and exits."""
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from callgate.prometheus import VERDICTS, QUARANTINED; "
            "VERDICTS.labels('ok', 'proceed').inc(int(sys.argv[1])); QUARANTINED.inc()",
            str(n),
        ],
        cwd=ROOT,
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": path},
        check=True,
        timeout=60,
    )


class MultiprocessMetricsTests(BaseTestCase):
    def test_metrics_sums_the_counters_of_every_process(self):
        from callgate.prometheus import VERDICTS

        VERDICTS.labels("ok", "proceed").inc(100)  # this process's own: not in the files
        with tempfile.TemporaryDirectory() as path:
            count_in_a_process(path, 3)
            count_in_a_process(path, 4)
            self.assertEqual(len(list(Path(path).glob("counter_*.db"))), 2)  # one per process
            with mock.patch.dict(os.environ, {"PROMETHEUS_MULTIPROC_DIR": path}):
                text = self.client.get("/metrics").content.decode()
        self.assertEqual(value(text, VERDICT), 7)
        self.assertEqual(value(text, "callgate_inbox_quarantined_total"), 2)
        self.assertIn("callgate_inbox_pending 0.0", text)  # the gauges read the database
        # without the directory: this process's own registry, which counted none of them
        self.assertGreaterEqual(value(self.client.get("/metrics").content.decode(), VERDICT), 100)

    def test_a_dead_workers_live_gauges_are_dropped(self):
        with tempfile.TemporaryDirectory() as path:
            live = Path(path) / "gauge_livesum_4242.db"
            live.write_bytes(b"")
            kept = Path(path) / "counter_4242.db"
            kept.write_bytes(b"")
            with mock.patch.dict(os.environ, {"PROMETHEUS_MULTIPROC_DIR": path}):
                gunicorn.child_exit(None, SimpleNamespace(pid=4242))
            self.assertFalse(live.exists())
            self.assertTrue(kept.exists())  # a counter keeps counting in the sums


class GunicornWorkersTests(TransactionTestCase):
    """The production command: gunicorn with two workers and ``callgate.gunicorn``."""

    def setUp(self):
        if connection.vendor != "postgresql":
            self.skipTest("the gunicorn workers need a database server (DATABASE_URL)")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.dir = tempfile.mkdtemp()
        cfg = settings.DATABASES["default"]
        database_url = f"postgres://{cfg['USER']}@{cfg['HOST']}:{cfg['PORT']}/{cfg['NAME']}"
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "DEBUG": "true",
            "PROMETHEUS_MULTIPROC_DIR": self.dir + "/metrics",
        }
        env.pop("CELERY_BROKER_URL", None)  # eager: nothing leaves the workers
        self.server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "-c",
                "python:callgate.gunicorn",
                "callgate.wsgi",
                "--bind",
                f"127.0.0.1:{self.port}",
                "--workers",
                "2",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.addCleanup(self.stop)

    def stop(self):
        self.server.send_signal(signal.SIGTERM)
        try:
            self.server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()

    def test_metrics_counts_the_requests_of_both_workers(self):
        base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        files: list[Path] = []
        while time.monotonic() < deadline:  # both workers up: each has its counter file
            files = list(Path(self.dir, "metrics").glob("counter_*.db"))
            if len(files) >= 2:
                break
            time.sleep(0.2)
        self.assertGreaterEqual(len(files), 2, "gunicorn's workers wrote no metric files")
        requests = 30
        with httpx.Client(base_url=base, timeout=10) as client:
            for _ in range(requests):
                self.assertEqual(client.get("/health/").status_code, 200)
            for _ in range(3):  # whichever worker answers, it reports both workers' requests
                text = client.get("/metrics").text
                total = value(text, 'django_http_requests_total_by_method_total{method="GET"}')
                self.assertGreaterEqual(total, requests)
