"""Evaluating alert rules and notifying: the only code that changes ``AlertRule.state``.

``alert_rule_value`` measures a rule's number (from ``CallRollup`` over the window of
``callgate.metrics.covering_window``, or the review queue / inbox now); ``alert_rule_evaluate``
applies the hysteresis (fire at ``threshold``, resolve below ``clear_threshold``), records
an ``AlertEvent`` and its ``AlertDelivery`` rows, and enqueues their delivery after commit
(``alerts.tasks.deliver_alert``, retried by Celery). Webhooks are either Slack-compatible
incoming-webhook JSON (``{"text": …}``) or the signed callgate webhook of
``reviews.webhooks`` (same headers and HMAC; ``"type": "alert"``).
"""

from __future__ import annotations

import functools
import json
import uuid
from datetime import datetime, timedelta

import httpx
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q, Sum
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils import timezone

from alerts.models import AlertDelivery, AlertEvent, AlertRule
from callgate import labels, metrics
from callgate.models import CallRollup, InboxEvent


class DeliveryError(Exception):
    """A notification did not get through (retried)."""


def alert_rule_value(rule: AlertRule, *, now: datetime | None = None) -> tuple[float | None, int]:
    """``(value, calls)``: the rule's number now and the calls it was computed from.

    Rates are shares 0..1 of the window's calls (None with fewer than ``min_calls``: too
    few to judge); counts are calls; ``review_age`` and ``inbox_lag`` are seconds (0 when
    nothing waits). The window is ``metrics.covering_window(window_minutes)``: the whole
    UTC hours holding the last ``window_minutes`` (up to an hour more), counted from the
    rollups."""
    now = now or timezone.now()
    if rule.metric == AlertRule.Metric.REVIEW_AGE:
        from reviews.models import ReviewItem

        oldest = (
            ReviewItem.objects.filter(project=rule.project, status__in=ReviewItem.OPEN_STATUSES)
            .order_by("created_at")
            .values_list("created_at", flat=True)
            .first()
        )
        return ((now - oldest).total_seconds() if oldest else 0.0), 0
    if rule.metric == AlertRule.Metric.INBOX_LAG:
        oldest = (
            InboxEvent.objects.filter(project=rule.project, status=InboxEvent.Status.PENDING)
            .order_by("id")
            .values_list("received_at", flat=True)
            .first()
        )
        return ((now - oldest).total_seconds() if oldest else 0.0), 0
    since, until = metrics.covering_window(timedelta(minutes=rule.window_minutes), now=now)
    rows = CallRollup.objects.filter(project=rule.project, bucket__gte=since, bucket__lt=until)
    if rule.tool:
        rows = rows.filter(tool_name="" if rule.tool == metrics.NO_TOOL else rule.tool)
    if rule.agent_id:
        rows = rows.filter(agent_id=rule.agent_id)
    field = (
        "category"
        if rule.metric in (AlertRule.Metric.CATEGORY_RATE, AlertRule.Metric.CATEGORY_COUNT)
        else "reason"
    )
    agg = rows.aggregate(
        total=Coalesce(Sum("calls"), 0),
        hits=Coalesce(Sum("calls", filter=Q(**{field: rule.target})), 0),
    )
    if rule.is_rate:
        if agg["total"] < max(rule.min_calls, 1):
            return None, agg["total"]
        return agg["hits"] / agg["total"], agg["total"]
    return float(agg["hits"]), agg["total"]


def format_value(rule: AlertRule, value: float | None) -> str:
    """``12.5%``, ``42 calls``, ``7 min``; "—" for None."""
    if value is None:
        return "—"
    if rule.is_rate:
        return f"{value * 100:.1f}%"
    if rule.is_seconds:
        from callgate.templatetags.callgate_tags import age

        return age(value)
    return f"{value:,.0f} call{'' if value == 1 else 's'}"


def describe(rule: AlertRule) -> str:
    """The rule's condition in words: "Share of calls in a category “Transient” (tool
    get_weather) over 1 h"."""
    what = rule.get_metric_display()
    if rule.target:
        kind = "category" if "category" in rule.metric else "reason"
        what += f" “{labels.label(rule.target, kind)}”"
    scope = []
    if rule.tool:
        scope.append(f"tool {rule.tool}")
    if rule.agent:
        scope.append(f"agent {rule.agent.name}")
    if scope:
        what += f" ({', '.join(scope)})"
    if not rule.is_seconds:
        hours = -(-rule.window_minutes // 60)
        what += f" over {hours} h"
    return what


def alert_rule_evaluate(rule: AlertRule, *, now: datetime | None = None) -> AlertEvent | None:
    """Measure ``rule`` and move its state with hysteresis: OK → firing when the value
    reaches ``threshold``; firing → OK when it falls below ``clear_threshold``; no
    change (and no notification) otherwise, or when a rate has too few calls. Returns the
    ``AlertEvent`` recorded, or None. Deliveries are enqueued after commit."""
    now = now or timezone.now()
    value, _ = alert_rule_value(rule, now=now)
    with transaction.atomic():
        locked = AlertRule.objects.select_for_update().get(pk=rule.pk)
        locked.last_value = value
        locked.last_evaluated_at = now
        kind = None
        if value is not None:
            if locked.state == AlertRule.State.OK and value >= locked.threshold:
                kind, locked.state = AlertEvent.Kind.FIRING, AlertRule.State.FIRING
            elif locked.state == AlertRule.State.FIRING and value < locked.clear_threshold:
                kind, locked.state = AlertEvent.Kind.RESOLVED, AlertRule.State.OK
        locked.save(update_fields=["last_value", "last_evaluated_at", "state"])
        if kind is None:
            return None
        assert value is not None  # the state moves only on a measured value
        event = AlertEvent.objects.create(
            project_id=locked.project_id,
            rule=locked,
            kind=kind,
            value=value,
            threshold=locked.threshold
            if kind == AlertEvent.Kind.FIRING
            else locked.clear_threshold,
            message=_message(locked, kind, value),
            at=now,
        )
        deliveries = []
        if locked.webhook_url:
            deliveries.append(
                AlertDelivery(
                    event=event, channel=AlertDelivery.Channel.WEBHOOK, target=locked.webhook_url
                )
            )
        if locked.email_list():
            deliveries.append(
                AlertDelivery(
                    event=event,
                    channel=AlertDelivery.Channel.EMAIL,
                    target=", ".join(locked.email_list()),
                )
            )
        AlertDelivery.objects.bulk_create(deliveries)
        from alerts.tasks import deliver_alert

        for delivery in deliveries:
            transaction.on_commit(functools.partial(deliver_alert.delay, delivery.pk))
    rule.state, rule.last_value, rule.last_evaluated_at = locked.state, value, now
    return event


def _message(rule: AlertRule, kind: str, value: float) -> str:
    if kind == AlertEvent.Kind.FIRING:
        return (
            f"{rule.name}: {describe(rule)} is {format_value(rule, value)}, "
            f"at or above {format_value(rule, rule.threshold)}."
        )
    return (
        f"{rule.name} resolved: {describe(rule)} is {format_value(rule, value)}, "
        f"below {format_value(rule, rule.clear_threshold)}."
    )


def alert_payload(delivery: AlertDelivery) -> dict:
    """The signed callgate webhook body of an alert: ``{"type": "alert", "delivery_id",
    "event": "firing"|"resolved", "project", "rule": {"id", "name", "metric", "target",
    "tool", "agent"}, "value", "threshold", "message", "at", "url"}``."""
    event = delivery.event
    rule = event.rule
    return {
        "type": "alert",
        "delivery_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"callgate-alert-{delivery.pk}")),
        "event": event.kind,
        "project": rule.project.slug,
        "rule": {
            "id": rule.pk,
            "name": rule.name,
            "metric": rule.metric,
            "target": rule.target or None,
            "tool": rule.tool or None,
            "agent": rule.agent_id,
        },
        "value": event.value,
        "threshold": event.threshold,
        "message": event.message,
        "at": event.at.isoformat(),
        "url": reverse("alerts:history", args=[rule.project.slug]),
    }


def alert_deliver(delivery: AlertDelivery) -> None:
    """Send one notification. Webhooks: a 2xx answer delivers; anything else raises
    ``DeliveryError``. Email: Django's mail backend (``send_mail``); its errors raise
    ``DeliveryError``."""
    from reviews import webhooks

    event = delivery.event
    rule = event.rule
    try:
        if delivery.channel == AlertDelivery.Channel.EMAIL:
            subject = (
                "[callgate] " if event.kind == "firing" else "[callgate] resolved: "
            ) + rule.name
            send_mail(subject, event.message, None, rule.email_list())
            return
        if rule.webhook_format == AlertRule.WebhookFormat.CALLGATE:
            response = webhooks.webhook_post(
                url=delivery.target, secret=rule.webhook_secret, payload=alert_payload(delivery)
            )
        else:
            icon = ":rotating_light:" if event.kind == "firing" else ":white_check_mark:"
            body = json.dumps({"text": f"{icon} [{rule.project.name}] {event.message}"})
            with httpx.Client(
                transport=webhooks.TRANSPORT, timeout=webhooks.WEBHOOK_TIMEOUT
            ) as client:
                response = client.post(
                    delivery.target,
                    content=body.encode(),
                    headers={"Content-Type": "application/json", "User-Agent": "callgate-alert/1"},
                )
    except (httpx.HTTPError, OSError) as exc:
        raise DeliveryError(f"{type(exc).__name__}: {exc}") from exc
    if not 200 <= response.status_code < 300:
        raise DeliveryError(f"HTTP {response.status_code}")
