"""The demo's webhook sink: ``/simulator/webhook-sink/`` receives alert (and decision)
webhooks and shows what arrived, so the demo can show a delivered alert without any
outside service. Kept in memory (the last ``KEEP`` deliveries of this process).

A signed delivery (Standard Webhooks headers, ``reviews.webhooks``) is verified as its
receiver would, with the secret of whoever sent it: an alert (``"type": "alert"``) with its
rule's ``webhook_secret`` (the body's ``rule.id`` in its ``project``), a decision
(``"type": "decision"``) with the agent's ``webhook_secret`` (the ``webhook-id`` header is
its outbox row's ``delivery_id``). The page says which sender's secret verified it, or why
it did not verify."""

from __future__ import annotations

import json
import secrets
import threading
import uuid
from collections import deque

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from alerts.models import AlertRule
from reviews.models import WebhookOutbox

KEEP = 100
_received: deque[dict] = deque(maxlen=KEEP)
_lock = threading.Lock()


def received() -> list[dict]:
    """What arrived, newest first: ``{"at", "user_agent", "body", "pretty", "signed",
    "verified", "sender", "why"}`` (``sender``: who the delivery says sent it, in words;
    ``why``: why a signed delivery did not verify)."""
    with _lock:
        return list(reversed(_received))


def clear() -> None:
    with _lock:
        _received.clear()


def sender_of(body: object, delivery_id: str) -> tuple[str, str | None]:
    """Who sent a delivery, in words, and their webhook secret (None: no such sender here).
    ``body`` is the parsed JSON body, ``delivery_id`` the ``webhook-id`` header."""
    if not isinstance(body, dict):
        return "an unknown sender", None
    kind = body.get("type")
    if kind == "alert":
        named = body.get("rule")
        rule_id = named.get("id") if isinstance(named, dict) else None
        rule = (
            AlertRule.objects.filter(pk=rule_id, project__slug=str(body.get("project", ""))).first()
            if isinstance(rule_id, int)
            else None
        )
        if rule is None:
            return f"alert rule #{rule_id} (not in this callgate)", None
        return f"alert rule “{rule.name}”", rule.webhook_secret
    if kind == "decision":
        row = (
            WebhookOutbox.objects.filter(delivery_id=delivery_id)
            .select_related("call__agent")
            .first()
            if _is_uuid(delivery_id)
            else None
        )
        if row is None:
            return f"decision {delivery_id or '(no webhook-id)'} (no such delivery here)", None
        return f"agent “{row.call.agent.name}”", row.call.agent.webhook_secret
    return "an unknown sender", None


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def verify(raw: bytes, headers, body: object) -> dict:
    """``{"signed", "verified", "sender", "why"}`` of one delivery (see the module docstring)."""
    if not headers.get("webhook-signature"):
        return {"signed": False, "verified": False, "sender": "", "why": ""}
    sender, secret = sender_of(body, headers.get("webhook-id", ""))
    if secret is None:
        return {"signed": True, "verified": False, "sender": sender, "why": "no secret to check"}
    try:
        # the sender signs with the secret's raw bytes (an empty one as " ", reviews.webhooks)
        Webhook((secret or " ").encode()).verify(raw, dict(headers), json_parse=False)
    except WebhookVerificationError as exc:
        return {"signed": True, "verified": False, "sender": sender, "why": str(exc)}
    return {"signed": True, "verified": True, "sender": sender, "why": ""}


@csrf_exempt
def webhook_sink(request: HttpRequest) -> HttpResponse:
    """POST: record the delivery and answer 204. GET: the page of what arrived."""
    if request.method == "POST":
        raw = request.body
        text = raw.decode("utf-8", "replace")
        try:
            body = json.loads(text)
        except ValueError:
            body = text
        entry = {
            "at": timezone.now(),
            "user_agent": request.headers.get("User-Agent", ""),
            "body": body,
            "pretty": json.dumps(body, indent=2, ensure_ascii=False)
            if not isinstance(body, str)
            else body,
            **verify(raw, request.headers, body),
        }
        with _lock:
            _received.append(entry)
        return HttpResponse(status=204)
    if request.method != "GET":
        return JsonResponse({"error": "GET or POST"}, status=405)
    return _page(request)


@login_required
def _page(request: HttpRequest) -> HttpResponse:
    return render(request, "demo/webhook_sink.html", {"deliveries": received()})


def demo_alert_rules(*, project, public_url: str) -> list:
    """The demo's alert rules, delivering to this sink (created or updated by name; a signed
    rule gets its own random secret when created, kept when updated)."""
    sink = f"{public_url.rstrip('/')}/simulator/webhook-sink/"
    specs = [
        dict(
            name="Transient failures above 20 %",
            metric=AlertRule.Metric.CATEGORY_RATE,
            target="transient",
            window_minutes=60,
            threshold=0.2,
            clear_threshold=0.1,
            min_calls=10,
            webhook_url=sink,
            webhook_format=AlertRule.WebhookFormat.SLACK,
            emails="oncall@example.com",
        ),
        dict(
            name="Unknown outcomes in the last 24 h",
            metric=AlertRule.Metric.CATEGORY_COUNT,
            target="unknown_outcome",
            window_minutes=24 * 60,
            threshold=1,
            clear_threshold=1,
            webhook_url=sink,
            webhook_format=AlertRule.WebhookFormat.SLACK,
        ),
        dict(
            name="Review item waiting over 30 min",
            metric=AlertRule.Metric.REVIEW_AGE,
            target="",
            threshold=1800,
            clear_threshold=600,
            webhook_url=sink,
            webhook_format=AlertRule.WebhookFormat.CALLGATE,
        ),
    ]
    return [
        AlertRule.objects.update_or_create(
            project=project,
            name=spec.pop("name"),
            defaults=spec,
            create_defaults={**spec, "webhook_secret": secrets.token_urlsafe(24)},
        )[0]
        for spec in specs
    ]
