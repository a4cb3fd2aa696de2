"""What the benchmarks share: one request through callgate's WSGI application, and the
real Celery processes (worker, beat) that a benchmark starts beside it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import IO

from callgate.celery import app
from callgate.wsgi import application  # the server's start-up, including its gc.freeze()

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def call(
    method: str, path: str, body: bytes, key: str, content_type: str = "application/json"
) -> tuple[int, bytes]:
    """One request through the WSGI application, as a WSGI server (gunicorn) calls it."""
    status: list[str] = []
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "bench",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_TYPE": content_type,
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_HOST": "bench",
        "HTTP_AUTHORIZATION": f"Bearer {key}",
        "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
        "wsgi.version": (1, 0),
    }
    response = application(environ, lambda code, headers, exc_info=None: status.append(code))
    try:
        content = b"".join(response)
    finally:
        response.close()
    return int(status[0].split()[0]), content


def all_queues() -> list[str]:
    """Every queue a task may be routed to (``callgate.queues`` under the prefix)."""
    return sorted({q.name for q in app.conf.task_queues or ()} | {app.conf.task_default_queue})


def celery_worker(
    concurrency: int,
    *,
    env: dict[str, str] | None = None,
    log: IO[bytes] | None = None,
    own_group: bool = False,
) -> subprocess.Popen:
    """A real ``celery -A callgate worker`` (prefork, ``concurrency`` processes) reading
    every queue, against the broker of ``env`` (default: this process's environment).
    ``own_group``: in a process group of its own, so that the worker and its pool children
    can be signalled together (``os.killpg(worker.pid, …)``)."""
    return subprocess.Popen(
        [
            str(BIN / "celery"),
            "-A",
            "callgate",
            "worker",
            "--concurrency",
            str(concurrency),
            "--pool",
            "prefork",
            "--loglevel",
            "WARNING",
            "-Q",
            ",".join(all_queues()),
        ],
        cwd=ROOT,
        env=env if env is not None else os.environ.copy(),
        stdout=log,
        stderr=subprocess.STDOUT if log is not None else None,
        start_new_session=own_group,
    )


def celery_beat(
    schedule: Path, *, env: dict[str, str] | None = None, log: IO[bytes] | None = None
) -> subprocess.Popen:
    """A real ``celery -A callgate beat`` (``CELERY_BEAT_SCHEDULE``), keeping its state in
    ``schedule``, in a process group of its own."""
    return subprocess.Popen(
        [
            str(BIN / "celery"),
            "-A",
            "callgate",
            "beat",
            "--loglevel",
            "WARNING",
            "--schedule",
            str(schedule),
        ],
        cwd=ROOT,
        env=env if env is not None else os.environ.copy(),
        stdout=log,
        stderr=subprocess.STDOUT if log is not None else None,
        start_new_session=True,
    )
