"""The Celery application. Settings come from Django's settings under the CELERY_ namespace."""

from __future__ import annotations

import logging
import os
import threading
import time

from celery import Celery
from celery.signals import task_postrun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "callgate.settings")

app = Celery("callgate")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_postrun.connect
def _forget_operation_id(**kwargs) -> None:
    """A task's operation ID (callgate.logmask.OPERATION_ID) ends with the task."""
    from callgate.logmask import OPERATION_ID

    OPERATION_ID.set("")


def run_periodic_in_process(stop: threading.Event, *, tick: float = 5.0) -> None:
    """The embedded default has no broker, so no beat: run the tasks of
    ``CELERY_BEAT_SCHEDULE`` in this thread on their intervals (seconds) until ``stop`` is
    set. Used by ``manage.py demo --serve``; production runs ``celery -A callgate beat``."""
    from django.conf import settings
    from django.db import close_old_connections

    app.loader.import_default_modules()
    next_run = {name: 0.0 for name in settings.CELERY_BEAT_SCHEDULE}
    while not stop.wait(tick):
        for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
            if time.monotonic() < next_run[name]:
                continue
            next_run[name] = time.monotonic() + float(entry["schedule"])
            result = app.tasks[entry["task"]].apply()
            if result.failed():
                logging.getLogger(__name__).error(
                    "periodic task %s failed: %s", name, result.result
                )
        close_old_connections()
