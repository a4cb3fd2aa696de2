"""Prometheus metrics of callgate (``GET /metrics``, with django-prometheus's request,
response and database metrics); the inbox gauges are read from the database at scrape time.

Under gunicorn with several workers, ``PROMETHEUS_MULTIPROC_DIR`` (set by
``callgate.gunicorn`` before the workers start) puts prometheus_client in multiprocess mode:
each process writes its counters to files there, and whichever worker answers ``/metrics``
sums every process's files (``metrics_view``), the live ones and the dead ones (the
``child_exit`` hook marks a dead worker's live gauges gone). Without it (the embedded
default, one process) the counters are the process's own.

- ``callgate_verdicts_total{reason, route}``: events classified (``callgate.ingest``);
- ``callgate_inbox_pending`` and ``callgate_inbox_oldest_age_seconds``: the inbox backlog;
- ``callgate_inbox_quarantined_total``: poison events set aside (``callgate.inbox``);
- ``callgate_reconcile_outcomes_total{outcome}``: reconcile look-ups (``callgate.tasks``);
- ``callgate_webhook_attempts_total{outcome}``: webhook deliveries (``reviews.services``).
"""

from __future__ import annotations

import os

from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    generate_latest,
    multiprocess,
)
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


def multiprocess_dir() -> str | None:
    """The directory of multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``), or None."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def metrics_registry() -> CollectorRegistry:
    """What ``/metrics`` serves: in multiprocess mode a fresh registry summing every
    process's files, plus the inbox gauges (read from the database, the same whichever
    process answers); otherwise this process's default registry (the gauges included)."""
    path = multiprocess_dir()
    if path is None:
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=path)
    registry.register(InboxCollector())
    return registry


def metrics_view(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: the Prometheus text format (``CONTENT_TYPE_LATEST``) of
    ``metrics_registry``. Replaces django-prometheus's view, whose multiprocess registry
    leaves out collectors such as the inbox gauges."""
    return HttpResponse(generate_latest(metrics_registry()), content_type=CONTENT_TYPE_LATEST)
