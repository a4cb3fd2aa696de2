"""Celery tasks of the review queue: thin shells over services, taking ids.

- ``webhook_deliver(delivery_id)``: send one decision from the webhook outbox
  (``reviews.services.webhook_attempt``: each attempt logged as a ``WebhookDelivery``);
  a failed attempt is retried by Celery after the full-jitter backoff the service chose,
  at most ``WEBHOOK_MAX_ATTEMPTS`` attempts.
- ``sweep_webhooks()``: periodic (``CELERY_BEAT_SCHEDULE["webhook-outbox-sweep"]``):
  re-sends outbox rows whose next attempt is overdue (a lost broker message or worker).
- ``review_housekeeping()``: periodic (``CELERY_BEAT_SCHEDULE["reviews-housekeeping"]``):
  lapse expired claims, expire approval requests past their timeout.
- ``review_items_notify(item_ids)``: new items (``callgate.escalation``, on commit) to the
  projects' Slack webhooks (``slack_notify``) and email recipients (``email_notify``);
  ``slack_respond`` answers a Slack click through its ``response_url``.
"""

from __future__ import annotations

import logging
import random  # noqa: F401  (tests patch reviews.tasks.random.uniform: the backoff's jitter)
import smtplib
from datetime import timedelta

from celery import shared_task

from reviews import notifications, slack, webhooks
from reviews.models import ReviewItem
from reviews.services import review_items_expire, review_leases_lapse, webhook_attempt
from reviews.slack import SlackDeliveryError

logger = logging.getLogger(__name__)

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


# --- notifications outside the dashboard (reviews.notifications, reviews.slack) ---------------


@shared_task(name="reviews.tasks.review_items_notify", ignore_result=True)
def review_items_notify(item_ids: list[int]) -> dict:
    """New review items (enqueued by ``callgate.escalation`` on commit): one Slack post and
    one email task per item whose project has them; returns how many of each."""
    to_slack, to_email = notifications.review_items_channels(item_ids)
    for item_id in to_slack:
        slack_notify.delay(item_id)
    for item_id in to_email:
        email_notify.delay(item_id)
    return {"slack": len(to_slack), "email": len(to_email)}


@shared_task(
    name="reviews.tasks.slack_notify",
    autoretry_for=(SlackDeliveryError,),
    retry_backoff=True,
    max_retries=5,
    ignore_result=True,
)
def slack_notify(item_id: int) -> str:
    """Post the item's interactive message to its project's Slack incoming webhook;
    ``skipped`` for a closed item or a project without one, ``refused`` for a URL that will
    never work (logged). Celery retries a transport error, 429 or 5xx with backoff."""
    item = (
        ReviewItem.objects.select_related("project", "call", "call__contract", "agent")
        .filter(pk=item_id)
        .first()
    )
    url = notifications.slack_webhook_of(item) if item is not None and item.is_open else ""
    if item is None or not url:
        return "skipped"
    try:
        slack.slack_post(url, slack.slack_message(item))
    except slack.SlackRefused as exc:
        logger.warning("Slack post of review item %s refused: %s", item_id, exc)
        return "refused"
    return "posted"


@shared_task(
    name="reviews.tasks.slack_respond",
    autoretry_for=(SlackDeliveryError,),
    retry_backoff=True,
    max_retries=5,
    ignore_result=True,
)
def slack_respond(response_url: str, body: dict) -> str:
    """Answer a Slack interaction through its ``response_url`` (the message updated, or an
    ephemeral reply); retried as ``slack_notify``."""
    try:
        slack.slack_post(response_url, body)
    except slack.SlackRefused as exc:
        logger.warning("Slack response refused: %s", exc)
        return "refused"
    return "posted"


@shared_task(
    name="reviews.tasks.email_notify",
    autoretry_for=(smtplib.SMTPException, OSError),
    retry_backoff=True,
    max_retries=5,
    ignore_result=True,
)
def email_notify(item_id: int) -> int:
    """Email the item to its project's recipients, operators with their decision links
    (``reviews.notifications.email_notify``); returns how many messages were sent. Celery
    retries SMTP and connection errors with backoff."""
    item = (
        ReviewItem.objects.select_related("project", "call", "call__contract", "agent")
        .filter(pk=item_id)
        .first()
    )
    return notifications.email_notify(item=item) if item is not None else 0
