"""Celery tasks of the review queue: thin shells over services, taking ids.

- ``webhook_deliver(call_id, item_id, delivery_id)``: POST the call's decision to its
  agent's webhook; each attempt is logged as a ``WebhookDelivery``; failures retry with
  exponential backoff and full jitter (``countdown = uniform(0, base * 2**n)``), at most
  ``WEBHOOK_MAX_ATTEMPTS`` attempts.
- ``review_housekeeping()``: periodic (``CELERY_BEAT_SCHEDULE["reviews-housekeeping"]``):
  lapse expired claims, expire approval requests past their timeout.
"""

from __future__ import annotations

import random
import time

import httpx
from celery import shared_task

from callgate.models import ToolCall
from reviews import webhooks
from reviews.models import WebhookDelivery
from reviews.services import review_items_expire, review_leases_lapse


class WebhookFailed(Exception):
    pass


@shared_task(bind=True, max_retries=webhooks.WEBHOOK_MAX_ATTEMPTS - 1, acks_late=True)
def webhook_deliver(self, call_id: int, item_id: int | None, delivery_id: str) -> bool:
    """Deliver one decision. Returns True when the receiver answered 2xx."""

    call = ToolCall.objects.select_related("agent", "decided_by").filter(pk=call_id).first()
    if call is None or not call.agent.webhook_url:
        return False
    attempt = self.request.retries + 1
    if WebhookDelivery.objects.filter(
        delivery_id=delivery_id, ok=True
    ).exists():  # idempotent: already done
        return True
    payload = webhooks.webhook_payload(call=call, item_pk=item_id, delivery_id=delivery_id)
    started = time.monotonic()
    status_code, error = None, ""
    try:
        response = webhooks.webhook_post(
            url=call.agent.webhook_url, secret=call.agent.webhook_secret, payload=payload
        )
        status_code = response.status_code
        if not 200 <= status_code < 300:
            error = f"HTTP {status_code}"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:1000]
    ok = not error
    WebhookDelivery.objects.create(
        project_id=call.project_id,
        item_id=item_id,
        call=call,
        agent=call.agent,
        delivery_id=delivery_id,
        attempt=attempt,
        url=call.agent.webhook_url,
        status_code=status_code,
        error=error,
        ok=ok,
        duration_ms=int((time.monotonic() - started) * 1000),
    )
    if ok:
        return True
    if self.request.retries >= self.max_retries:
        return False
    countdown = random.uniform(0, webhooks.WEBHOOK_BACKOFF_BASE * 2**self.request.retries)
    raise self.retry(countdown=countdown, exc=WebhookFailed(error))


@shared_task
def review_housekeeping() -> dict:
    """Periodic: claims whose lease ran out return to the queue; approvals past their timeout expire."""

    return {"lapsed": review_leases_lapse(), "expired": review_items_expire()}
