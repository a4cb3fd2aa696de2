"""A real Celery worker process against the broker in CELERY_BROKER_URL (Redis in CI)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.test import SimpleTestCase

from callgate.celery import app
from callgate.tasks import ping

BROKER_URL = os.environ.get("CELERY_BROKER_URL")
#: seconds to wait for the worker to start and answer
RESULT_TIMEOUT = 60


@pytest.mark.worker
@pytest.mark.skipif(
    not BROKER_URL,
    reason="CELERY_BROKER_URL is unset: no broker to start a worker against "
    "(CI sets it; local SQLite runs use eager tasks)",
)
class CeleryWorkerTests(SimpleTestCase):
    def setUp(self):
        # A queue of our own, so that no other worker on the same Redis takes the task.
        self.queue = f"test-ping-{uuid.uuid4().hex[:12]}"
        self.log_path = (
            Path(settings.BASE_DIR) / "test-artifacts" / f"celery-worker-{self.queue}.log"
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "callgate.settings", "DEBUG": "true"}
        self.log_file = self.log_path.open("w")
        self.worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "callgate",
                "worker",
                "--pool=solo",
                "-c",
                "1",
                "-Q",
                self.queue,
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--loglevel=INFO",
                "-n",
                f"{self.queue}@%h",
            ],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
        )
        # conftest makes every task eager; this test needs the broker
        self.addCleanup(setattr, app.conf, "task_always_eager", app.conf.task_always_eager)
        app.conf.task_always_eager = False

    def tearDown(self):
        self.worker.terminate()
        try:
            self.worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.worker.kill()
            self.worker.wait()
        self.log_file.close()

    def test_it_runs_a_task_in_a_worker_process(self):
        result = ping.apply_async(queue=self.queue)
        try:
            value = result.get(timeout=RESULT_TIMEOUT)
        except Exception as exc:
            raise AssertionError(
                f"no answer from the worker within {RESULT_TIMEOUT}s ({exc!r}); "
                f"worker log:\n{self.log_path.read_text()[-4000:]}"
            ) from exc
        assert value == "pong"
        assert result.successful()
        assert self.worker.poll() is None  # it ran in the worker, which is still up
        assert "callgate.tasks.ping" in self.log_path.read_text()
