"""Prometheus metrics of callgate (``GET /metrics``, with django-prometheus's request,
response and database metrics). Counters are per process (one gunicorn or Celery worker
each; Prometheus sums them); the inbox gauges are read from the database at scrape time.

- ``callgate_verdicts_total{reason, route}``: events classified (``callgate.ingest``);
- ``callgate_inbox_pending`` and ``callgate_inbox_oldest_age_seconds``: the inbox backlog;
- ``callgate_inbox_quarantined_total``: poison events set aside (``callgate.inbox``);
- ``callgate_reconcile_outcomes_total{outcome}``: reconcile look-ups (``callgate.tasks``);
- ``callgate_webhook_attempts_total{outcome}``: webhook deliveries (``reviews.services``).
"""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter
from prometheus_client.core import GaugeMetricFamily

VERDICTS = Counter(
    "callgate_verdicts", "Events classified, by reason and route.", ["reason", "route"]
)
QUARANTINED = Counter("callgate_inbox_quarantined", "Inbox events quarantined.")
RECONCILE_OUTCOMES = Counter(
    "callgate_reconcile_outcomes", "Reconcile look-ups, by outcome.", ["outcome"]
)
WEBHOOK_ATTEMPTS = Counter(
    "callgate_webhook_attempts", "Decision webhook attempts, by outcome.", ["outcome"]
)


class InboxCollector:
    """The inbox backlog over all projects, read when Prometheus scrapes."""

    def describe(self):
        """The metric names, without reading the database (called at registration)."""
        yield GaugeMetricFamily("callgate_inbox_pending", "Inbox events waiting to be applied.")
        yield GaugeMetricFamily(
            "callgate_inbox_oldest_age_seconds", "Age of the oldest pending inbox event."
        )

    def collect(self):
        from django.db.models import Count, Min
        from django.utils import timezone

        from callgate.models import InboxEvent

        row = InboxEvent.objects.filter(status=InboxEvent.Status.PENDING).aggregate(
            pending=Count("pk"), oldest=Min("received_at")
        )
        age = (timezone.now() - row["oldest"]).total_seconds() if row["oldest"] else 0.0
        yield GaugeMetricFamily(
            "callgate_inbox_pending", "Inbox events waiting to be applied.", value=row["pending"]
        )
        yield GaugeMetricFamily(
            "callgate_inbox_oldest_age_seconds",
            "Age of the oldest pending inbox event.",
            value=age,
        )


def register_collectors() -> None:
    """Called once from ``CallgateConfig.ready``."""
    REGISTRY.register(InboxCollector())
