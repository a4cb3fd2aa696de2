"""The demo's webhook sink: ``/simulator/webhook-sink/`` receives alert (and decision)
webhooks and shows what arrived, so the demo can show a delivered alert without any
outside service. Kept in memory (the last ``KEEP`` deliveries of this process)."""

from __future__ import annotations

import json
import threading
from collections import deque

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

KEEP = 100
_received: deque[dict] = deque(maxlen=KEEP)
_lock = threading.Lock()

#: the demo's alert rules' webhook secret (signed callgate format)
DEMO_SECRET = "demo-sink-secret"


def received() -> list[dict]:
    """What arrived, newest first: ``{"at", "headers", "body", "signed", "verified"}``."""
    with _lock:
        return list(reversed(_received))


def clear() -> None:
    with _lock:
        _received.clear()


@csrf_exempt
def webhook_sink(request: HttpRequest) -> HttpResponse:
    """POST: record the delivery and answer 204. GET: the page of what arrived."""
    if request.method == "POST":
        from reviews.webhooks import webhook_verify

        raw = request.body.decode("utf-8", "replace")
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw
        signature = request.headers.get("X-Callgate-Signature", "")
        entry = {
            "at": timezone.now(),
            "user_agent": request.headers.get("User-Agent", ""),
            "body": body,
            "pretty": json.dumps(body, indent=2, ensure_ascii=False)
            if not isinstance(body, str)
            else body,
            "signed": bool(signature),
            "verified": bool(signature)
            and webhook_verify(
                secret=DEMO_SECRET,
                timestamp=request.headers.get("X-Callgate-Timestamp", ""),
                body=raw,
                signature=signature,
            ),
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
    """The demo's alert rules, delivering to this sink (created or updated by name)."""
    from alerts.models import AlertRule

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
            webhook_secret=DEMO_SECRET,
        ),
    ]
    return [
        AlertRule.objects.update_or_create(project=project, name=spec.pop("name"), defaults=spec)[0]
        for spec in specs
    ]
