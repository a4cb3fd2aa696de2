"""Celery tasks of the review queue: thin shells over services, taking ids.

- ``webhook_deliver(delivery_id)``: send one decision from the webhook outbox
  (``reviews.services.webhook_attempt``: each attempt logged as a ``WebhookDelivery``);
  a failed attempt is retried by Celery after the full-jitter backoff the service chose,
  at most ``WEBHOOK_MAX_ATTEMPTS`` attempts.
- ``sweep_webhooks()``: periodic (``CELERY_BEAT_SCHEDULE["webhook-outbox-sweep"]``):
  re-sends outbox rows whose next attempt is overdue (a lost broker message or worker).
- ``review_housekeeping()``: periodic (``CELERY_BEAT_SCHEDULE["reviews-housekeeping"]``):
  lapse expired claims, expire approval requests past their timeout.
"""

from __future__ import annotations

import random  # noqa: F401  (tests patch reviews.tasks.random.uniform: the backoff's jitter)
from datetime import timedelta

from celery import shared_task

from reviews import webhooks
from reviews.services import review_items_expire, review_leases_lapse, webhook_attempt

#: an outbox row this overdue has lost its task: the sweeper sends it
WEBHOOK_SWEEP_GRACE = timedelta(seconds=60)
WEBHOOK_SWEEP_BATCH = 200


@shared_task(
    bind=True,
    name="reviews.tasks.webhook_deliver",
    max_retries=webhooks.WEBHOOK_MAX_ATTEMPTS - 1,
    ignore_result=True,
)
def webhook_deliver(self, delivery_id: str) -> str:
    """Deliver one decision from the outbox; returns the attempt's outcome (``delivered``,
    ``failed``, ``given_up``, ``skipped``). Idempotent: a delivered row is skipped."""

    attempt = webhook_attempt(delivery_id=delivery_id)
    if attempt.outcome == "failed" and self.request.retries < self.max_retries:
        raise self.retry(countdown=attempt.retry_in)
    return attempt.outcome


@shared_task(name="reviews.tasks.sweep_webhooks", ignore_result=True)
def sweep_webhooks() -> int:
    """Enqueue ``webhook_deliver`` for the outbox rows whose next attempt is overdue;
    returns how many. A row enqueued twice is sent once (``webhook_attempt`` holds it)."""
    from reviews.services import webhook_outbox_overdue

    overdue = webhook_outbox_overdue(grace=WEBHOOK_SWEEP_GRACE, limit=WEBHOOK_SWEEP_BATCH)
    for delivery_id in overdue:
        webhook_deliver.delay(delivery_id)
    return len(overdue)


@shared_task(name="reviews.tasks.review_housekeeping")
def review_housekeeping() -> dict:
    """Periodic: claims whose lease ran out return to the queue; approvals past their timeout expire."""

    return {"lapsed": review_leases_lapse(), "expired": review_items_expire()}
