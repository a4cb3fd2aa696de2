"""Liveness and readiness endpoints (django-health-check), outside the login and the API key.

- ``GET /health/``: liveness: the process answers (no check; a restart would not help a
  dependency that is down).
- ``GET /ready/``: readiness: the database answers, the cache (throttles, locks) works, the
  broker accepts a connection (when one is configured), and the oldest pending inbox event
  is younger than ``CALLGATE_READY_INBOX_LAG`` seconds (the workers keep up). 200 when all
  pass, 500 naming the failed check otherwise; ``?format=json`` or ``Accept:
  application/json`` for JSON.
"""

from __future__ import annotations

import dataclasses

from django.conf import settings
from django.utils import timezone
from health_check.base import HealthCheck
from health_check.exceptions import ServiceUnavailable
from health_check.views import HealthCheckView


@dataclasses.dataclass
class Broker(HealthCheck):
    """The Celery broker accepts a connection (skipped without a broker: tasks run in-process)."""

    def run(self) -> None:
        if not settings.CELERY_BROKER_URL:
            return
        from callgate.celery import app

        try:
            with app.connection_for_write(url=settings.CELERY_BROKER_URL) as connection:
                connection.ensure_connection(max_retries=1, timeout=3)
        except Exception as exc:
            raise ServiceUnavailable(f"broker unreachable ({type(exc).__name__})") from exc


@dataclasses.dataclass
class InboxLag(HealthCheck):
    """The oldest pending inbox event, over all projects, is younger than
    ``CALLGATE_READY_INBOX_LAG`` seconds."""

    def run(self) -> None:
        from django.db import connection

        from callgate.models import InboxEvent

        try:  # in django-health-check's executor thread: its own connection, closed after
            oldest = (
                InboxEvent.objects.filter(status=InboxEvent.Status.PENDING)
                .order_by("received_at")
                .values_list("received_at", flat=True)
                .first()
            )
        finally:
            connection.close()
        if oldest is None:
            return
        lag = (timezone.now() - oldest).total_seconds()
        if lag > settings.CALLGATE_READY_INBOX_LAG:
            raise ServiceUnavailable(
                f"the oldest pending inbox event waits {lag:.0f} s "
                f"(limit {settings.CALLGATE_READY_INBOX_LAG} s)"
            )


liveness = HealthCheckView.as_view(checks=())
readiness = HealthCheckView.as_view(
    checks=(
        "health_check.checks.Database",
        "health_check.checks.Cache",
        Broker,
        InboxLag,
    )
)
