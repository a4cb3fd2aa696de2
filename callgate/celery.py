"""The Celery application. Settings come from Django's settings under the CELERY_ namespace."""

from __future__ import annotations

import logging
import os
import threading
import time

from celery import Celery
from celery.signals import task_postrun
from django.conf import settings
from django.db import close_old_connections, transaction

from callgate.logmask import OPERATION_ID

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "callgate.settings")

app = Celery("callgate")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def enqueue_on_commit(task: str, *args: object, **kwargs: object) -> None:
    """Send the task registered as ``task`` (``"callgate.tasks.reconcile_call"``) with
    ``args`` and ``kwargs`` once the current transaction commits, or at once outside one.

    By name, through ``app.signature(...).delay()`` (which still honours
    ``task_always_eager`` in the embedded default), so that the modules whose writes start
    background work (ingest, services, escalation) need not import the task modules that
    call them: the dependency runs one way, from tasks to the core.

    Never raises for the broker: a task that cannot be sent is logged, and the periodic
    sweep of its kind (inbox, reconciling calls, webhook outbox) picks the work up later, so
    nothing already committed is lost and no request fails after its commit."""

    def send() -> None:
        if task not in app.tasks:
            # a process that never imported the task modules (the embedded default's web
            # server while the demo seeds, a test): without its task, an eager signature
            # goes to the broker there is not ("AlwaysEagerIgnored"), and the work is lost
            app.loader.import_default_modules()
        try:
            app.signature(task, args=args, kwargs=kwargs).delay()
        except Exception:  # the broker is unreachable: the sweepers catch up
            logging.getLogger(__name__).warning(
                "could not send %s%r; its sweep will pick it up", task, args, exc_info=True
            )

    transaction.on_commit(send)


@task_postrun.connect
def _forget_operation_id(**kwargs) -> None:
    """A task's operation ID (callgate.logmask.OPERATION_ID) ends with the task."""
    OPERATION_ID.set("")


def run_periodic_in_process(stop: threading.Event, *, tick: float = 5.0) -> None:
    """The embedded default has no broker, so no beat: run the tasks of
    ``CELERY_BEAT_SCHEDULE`` in this thread on their intervals (seconds) until ``stop`` is
    set. Used by ``manage.py demo --serve``; production runs ``celery -A callgate beat``."""

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
