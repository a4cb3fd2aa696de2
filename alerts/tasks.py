"""Celery tasks of the alerts: the beat evaluation and the retried delivery."""

from __future__ import annotations

import logging

from celery import shared_task
from django.utils import timezone

from alerts.models import AlertDelivery, AlertRule
from alerts.services import DeliveryError, alert_deliver, alert_rule_evaluate

logger = logging.getLogger(__name__)

#: attempts per notification (the first and the retries), backoff base in seconds
MAX_ATTEMPTS = 6
BACKOFF_BASE = 10


@shared_task(name="alerts.tasks.evaluate_alerts", ignore_result=True)
def evaluate_alerts() -> dict:
    """Celery beat, every minute: evaluate every enabled rule (after the rollups refresh)."""
    fired = resolved = 0
    for rule in AlertRule.objects.filter(enabled=True).select_related("project", "agent"):
        event = alert_rule_evaluate(rule)
        if event is not None:
            fired += event.kind == "firing"
            resolved += event.kind == "resolved"
    return {"fired": fired, "resolved": resolved}


@shared_task(
    bind=True, name="alerts.tasks.deliver_alert", ignore_result=True, max_retries=MAX_ATTEMPTS - 1
)
def deliver_alert(self, delivery_id: int) -> str:
    """Send one notification; on failure Celery retries it with exponential backoff
    (``BACKOFF_BASE`` · 2^n seconds) up to ``MAX_ATTEMPTS`` attempts, then marks it failed."""
    delivery = (
        AlertDelivery.objects.select_related("event__rule__project").filter(pk=delivery_id).first()
    )
    if delivery is None or delivery.status == AlertDelivery.Status.DELIVERED:
        return "skipped"
    delivery.attempts += 1
    try:
        alert_deliver(delivery)
    except DeliveryError as exc:
        delivery.last_error = str(exc)[:2000]
        last = self.request.retries >= self.max_retries
        delivery.status = AlertDelivery.Status.FAILED if last else AlertDelivery.Status.PENDING
        delivery.save(update_fields=["attempts", "last_error", "status"])
        if last:
            logger.warning("alert delivery %s failed for good: %s", delivery_id, exc)
            return "failed"
        raise self.retry(exc=exc, countdown=BACKOFF_BASE * 2**self.request.retries) from exc
    delivery.status = AlertDelivery.Status.DELIVERED
    delivery.delivered_at = timezone.now()
    delivery.save(update_fields=["attempts", "last_error", "status", "delivered_at"])
    return "delivered"
