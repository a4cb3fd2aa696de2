"""Evaluating alert rules and notifying: the only code that changes ``AlertRule.state``.

``alert_rule_value`` measures a rule's number (from ``CallRollup`` over the window of
``callgate.metrics.covering_window``, or the review queue / inbox now); ``alert_rule_evaluate``
applies the hysteresis (fire at ``threshold``, resolve below ``clear_threshold``), records
an ``AlertEvent`` and its ``AlertDelivery`` rows, and enqueues their delivery after commit
(``alerts.tasks.deliver_alert``, retried by Celery). Webhooks are either Slack-compatible
incoming-webhook JSON (``{"text": …}``) or the signed callgate webhook of
``reviews.webhooks`` (same headers and HMAC; ``"type": "alert"``), both through
``callgate.outbound``'s guard; every notification links (absolutely, on
``CALLGATE_BASE_URL``) to the calls the rule counted (``alert_link``).

The actions of operators (``alert_acknowledge``, ``alert_snooze``, ``alert_unsnooze``,
``alert_resolve``) lock the rule, check its state and record an ``AlertEvent`` with the
actor, like the evaluation.
"""

from __future__ import annotations

import functools
import json
import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import httpx
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q, Sum
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils import timezone

from alerts.models import AlertDelivery, AlertEvent, AlertRule
from callgate import labels, metrics, outbound
from callgate.models import CallRollup, InboxEvent
from callgate.paths import absolute_url
from callgate.selectors import CallFilters, calls_filtered

#: how often a firing rule that nobody acknowledged or snoozed notifies again
REMIND_EVERY = timedelta(hours=1)


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


def alert_calls_link(rule: AlertRule, *, at: datetime) -> str | None:
    """The calls list (path and query) of exactly the calls ``rule`` counted when it was
    evaluated at ``at``: its category or reason, tool and agent, ``since`` the start of its
    window and ``until`` ``at`` (ISO 8601, UTC; the rollups' hours after ``at`` held no
    calls yet). None for rules that count no calls (review age, inbox lag)."""
    if not rule.counts_calls:
        return None
    since, _ = metrics.covering_window(timedelta(minutes=rule.window_minutes), now=at)
    field = "category" if "category" in rule.metric else "reason"
    params = {field: rule.target}
    if rule.tool:
        params["tool"] = rule.tool
    if rule.agent_id:
        params["agent"] = str(rule.agent_id)
    params["since"] = _iso(since)
    params["until"] = _iso(at)
    return reverse("callgate:calls", args=[rule.project.slug]) + "?" + urlencode(params)


def _iso(moment: datetime) -> str:
    """``2026-12-05T23:00:00Z``, with microseconds only when there are some (an ``until``
    must not drop the calls of its last second)."""
    text = moment.astimezone(UTC).isoformat(
        timespec="microseconds" if moment.microsecond else "seconds"
    )
    return text.replace("+00:00", "Z")


def alert_link(rule: AlertRule, *, at: datetime) -> tuple[str, str]:
    """``(path, text)`` of where an alert sends people: the calls it counted, the review
    queue (review age), or the alert history (inbox lag: no list holds the events)."""
    if calls := alert_calls_link(rule, at=at):
        return calls, "View the calls"
    if rule.metric == AlertRule.Metric.REVIEW_AGE:
        return reverse("reviews:queue", args=[rule.project.slug]), "Open the review queue"
    return reverse("alerts:history", args=[rule.project.slug]), "Open the alert history"


def _calls_since_snooze(rule: AlertRule) -> int:
    """Matching calls created since the rule was snoozed (the calls list's filter, counted
    up to ``snooze_calls``)."""
    assert rule.snoozed_at is not None and rule.snooze_calls is not None
    by_category = "category" in rule.metric
    filters = CallFilters(
        category=rule.target if by_category else "",
        reason="" if by_category else rule.target,
        tool=rule.tool,
        agent=rule.agent_id,
        since=rule.snoozed_at,
    )
    return calls_filtered(project=rule.project, filters=filters)[: rule.snooze_calls].count()


def _snooze_over(rule: AlertRule, now: datetime) -> str | None:
    """Why ``rule``'s snooze has ended (its time passed, or N more calls came), or None."""
    if rule.snoozed_at is None:
        return None
    if rule.snoozed_until is not None and now >= rule.snoozed_until:
        return "its time passed"
    if rule.snooze_calls and _calls_since_snooze(rule) >= rule.snooze_calls:
        return (
            f"{rule.snooze_calls:,} more matching call{'' if rule.snooze_calls == 1 else 's'} came"
        )
    return None


def _clear_snooze(rule: AlertRule) -> None:
    rule.snoozed_at = rule.snoozed_until = rule.snooze_calls = rule.snoozed_by = None


def _record(
    rule: AlertRule,
    *,
    kind: str,
    message: str,
    at: datetime,
    value: float | None = None,
    threshold: float | None = None,
    actor=None,
    notify: bool = False,
) -> AlertEvent:
    """One ``AlertEvent`` and, with ``notify``, its deliveries (enqueued after commit);
    ``rule.notified_at`` moves to ``at`` (the caller saves the rule)."""
    event = AlertEvent.objects.create(
        project_id=rule.project_id,
        rule=rule,
        kind=kind,
        value=value,
        threshold=threshold,
        actor=actor,
        message=message,
        at=at,
    )
    if not notify:
        return event
    rule.notified_at = at
    deliveries = []
    if rule.webhook_url:
        deliveries.append(
            AlertDelivery(
                event=event, channel=AlertDelivery.Channel.WEBHOOK, target=rule.webhook_url
            )
        )
    if rule.email_list():
        deliveries.append(
            AlertDelivery(
                event=event,
                channel=AlertDelivery.Channel.EMAIL,
                target=", ".join(rule.email_list()),
            )
        )
    AlertDelivery.objects.bulk_create(deliveries)
    from alerts.tasks import deliver_alert

    for delivery in deliveries:
        transaction.on_commit(functools.partial(deliver_alert.delay, delivery.pk))
    return event


#: the rule fields the evaluation and the actions write
_STATE_FIELDS = [
    "last_value",
    "last_evaluated_at",
    "state",
    "notified_at",
    "acknowledged_at",
    "acknowledged_by",
    "snoozed_at",
    "snoozed_until",
    "snooze_calls",
    "snoozed_by",
]


def alert_rule_evaluate(rule: AlertRule, *, now: datetime | None = None) -> AlertEvent | None:
    """Measure ``rule`` and move its state with hysteresis: OK → firing when the value
    reaches ``threshold``; firing → OK when it falls below ``clear_threshold`` (which ends an
    acknowledgement); no change otherwise, or when a rate has too few calls.

    Notifications (deliveries enqueued after commit) go out on firing and resolving, and
    every ``REMIND_EVERY`` while a rule fires and nobody acknowledged or snoozed it; none
    while it is snoozed. A snooze ends here when its time has passed or its N more matching
    calls came (a "Snooze ended" event, notifying when the rule still fires). Returns the
    last ``AlertEvent`` recorded, or None."""
    now = now or timezone.now()
    value, _ = alert_rule_value(rule, now=now)
    event = None
    with transaction.atomic():
        locked = (
            AlertRule.objects.select_for_update(of=("self",))
            .select_related("project", "agent")
            .get(pk=rule.pk)
        )
        locked.last_value = value
        locked.last_evaluated_at = now
        if why := _snooze_over(locked, now):
            _clear_snooze(locked)
            event = _record(
                locked,
                kind=AlertEvent.Kind.UNSNOOZED,
                value=value,
                message=f"{locked.name}: the snooze ended ({why})"
                + (", still firing." if locked.state == AlertRule.State.FIRING else "."),
                at=now,
                notify=locked.state == AlertRule.State.FIRING,
            )
        snoozed = locked.snoozed_at is not None
        if value is not None:
            if locked.state == AlertRule.State.OK and value >= locked.threshold:
                locked.state = AlertRule.State.FIRING
                event = _record(
                    locked,
                    kind=AlertEvent.Kind.FIRING,
                    value=value,
                    threshold=locked.threshold,
                    message=_message(locked, AlertEvent.Kind.FIRING, value),
                    at=now,
                    notify=not snoozed,
                )
            elif locked.state == AlertRule.State.FIRING and value < locked.clear_threshold:
                locked.state = AlertRule.State.OK
                locked.acknowledged_at = locked.acknowledged_by = None
                event = _record(
                    locked,
                    kind=AlertEvent.Kind.RESOLVED,
                    value=value,
                    threshold=locked.clear_threshold,
                    message=_message(locked, AlertEvent.Kind.RESOLVED, value),
                    at=now,
                    notify=not snoozed,
                )
            elif (
                locked.state == AlertRule.State.FIRING
                and not locked.handled
                and (locked.notified_at is None or now - locked.notified_at >= REMIND_EVERY)
            ):
                event = _record(
                    locked,
                    kind=AlertEvent.Kind.REMINDER,
                    value=value,
                    threshold=locked.threshold,
                    message=_message(locked, AlertEvent.Kind.REMINDER, value),
                    at=now,
                    notify=True,
                )
        locked.save(update_fields=_STATE_FIELDS)
    _copy_state(locked, rule)
    return event


def _copy_state(source: AlertRule, rule: AlertRule) -> None:
    for name in _STATE_FIELDS:
        setattr(rule, name, getattr(source, name))


class AlertActionError(Exception):
    """The action does not fit the rule's state now (someone else acted first, or it is
    not firing); the message says so for people."""


#: the longest snooze by time, and by calls
MAX_SNOOZE = timedelta(days=30)
MAX_SNOOZE_CALLS = 1_000_000


def _act(rule: AlertRule, action) -> AlertEvent:
    """Run ``action(locked)`` on the rule locked for update and save its state."""
    with transaction.atomic():
        locked = (
            AlertRule.objects.select_for_update(of=("self",))
            .select_related("project", "agent")
            .get(pk=rule.pk)
        )
        event = action(locked)
        locked.save(update_fields=_STATE_FIELDS)
    _copy_state(locked, rule)
    return event


def alert_acknowledge(*, rule: AlertRule, actor) -> AlertEvent:
    """Acknowledge a firing rule: no reminders until it resolves. Raises
    ``AlertActionError`` when it is not firing or is acknowledged already."""

    def action(locked: AlertRule) -> AlertEvent:
        if locked.state != AlertRule.State.FIRING:
            raise AlertActionError(f"“{locked.name}” is not firing: nothing to acknowledge.")
        if locked.acknowledged_at is not None:
            raise AlertActionError(f"“{locked.name}” is acknowledged already.")
        now = timezone.now()
        locked.acknowledged_at, locked.acknowledged_by = now, actor
        return _record(
            locked,
            kind=AlertEvent.Kind.ACKNOWLEDGED,
            value=locked.last_value,
            actor=actor,
            message=f"{locked.name}: acknowledged by {actor.get_username()}.",
            at=now,
        )

    return _act(rule, action)


def alert_snooze(
    *, rule: AlertRule, actor, duration: timedelta | None = None, calls: int | None = None
) -> AlertEvent:
    """Snooze a rule for ``duration`` and/or until ``calls`` more matching calls (the first
    to come ends it; the evaluation checks every minute): no notifications meanwhile.
    Raises ``ValueError`` naming the field for a duration outside 1 min–``MAX_SNOOZE``, a
    call count outside 1–``MAX_SNOOZE_CALLS``, neither, or calls on a rule that counts
    none."""
    if duration is None and calls is None:
        raise ValueError("minutes: say for how long, or until how many more calls (calls).")
    if duration is not None and not timedelta(minutes=1) <= duration <= MAX_SNOOZE:
        raise ValueError("minutes: a snooze lasts from 1 minute to 30 days.")
    if calls is not None:
        if not rule.counts_calls:
            raise ValueError("calls: this rule counts no calls; snooze it for a time.")
        if not 1 <= calls <= MAX_SNOOZE_CALLS:
            raise ValueError(f"calls: from 1 to {MAX_SNOOZE_CALLS:,}.")

    def action(locked: AlertRule) -> AlertEvent:
        now = timezone.now()
        locked.snoozed_at, locked.snoozed_by = now, actor
        locked.snoozed_until = now + duration if duration is not None else None
        locked.snooze_calls = calls
        terms = []
        if duration is not None:
            terms.append(
                f"for {_duration_text(duration)} (until {locked.snoozed_until:%Y-%m-%d %H:%M} UTC)"
            )
        if calls is not None:
            terms.append(f"until {calls:,} more matching call{'' if calls == 1 else 's'}")
        return _record(
            locked,
            kind=AlertEvent.Kind.SNOOZED,
            value=locked.last_value,
            actor=actor,
            message=f"{locked.name}: snoozed by {actor.get_username()} {' or '.join(terms)}.",
            at=now,
        )

    return _act(rule, action)


def _duration_text(duration: timedelta) -> str:
    minutes = round(duration.total_seconds() / 60)
    if minutes % 1440 == 0:
        return f"{minutes // 1440} d"
    if minutes % 60 == 0:
        return f"{minutes // 60} h"
    return f"{minutes} min"


def alert_unsnooze(*, rule: AlertRule, actor) -> AlertEvent:
    """End a snooze by hand. Raises ``AlertActionError`` when the rule is not snoozed."""

    def action(locked: AlertRule) -> AlertEvent:
        if locked.snoozed_at is None:
            raise AlertActionError(f"“{locked.name}” is not snoozed.")
        _clear_snooze(locked)
        return _record(
            locked,
            kind=AlertEvent.Kind.UNSNOOZED,
            value=locked.last_value,
            actor=actor,
            message=f"{locked.name}: unsnoozed by {actor.get_username()}.",
            at=timezone.now(),
        )

    return _act(rule, action)


def alert_resolve(*, rule: AlertRule, actor) -> AlertEvent:
    """Resolve a firing rule by hand: back to OK, its acknowledgement and snooze ended, the
    resolution notified. The next evaluation fires it again if its number is still at the
    threshold. Raises ``AlertActionError`` when it is not firing."""

    def action(locked: AlertRule) -> AlertEvent:
        if locked.state != AlertRule.State.FIRING:
            raise AlertActionError(f"“{locked.name}” is not firing: nothing to resolve.")
        locked.state = AlertRule.State.OK
        locked.acknowledged_at = locked.acknowledged_by = None
        _clear_snooze(locked)
        return _record(
            locked,
            kind=AlertEvent.Kind.RESOLVED,
            value=locked.last_value,
            actor=actor,
            message=f"{locked.name}: resolved by {actor.get_username()}.",
            at=timezone.now(),
            notify=True,
        )

    return _act(rule, action)


def _message(rule: AlertRule, kind: str, value: float) -> str:
    if kind == AlertEvent.Kind.FIRING:
        return (
            f"{rule.name}: {describe(rule)} is {format_value(rule, value)}, "
            f"at or above {format_value(rule, rule.threshold)}."
        )
    if kind == AlertEvent.Kind.REMINDER:
        return (
            f"{rule.name} is still firing: {describe(rule)} is {format_value(rule, value)}, "
            f"at or above {format_value(rule, rule.threshold)}."
        )
    return (
        f"{rule.name} resolved: {describe(rule)} is {format_value(rule, value)}, "
        f"below {format_value(rule, rule.clear_threshold)}."
    )


def alert_payload(delivery: AlertDelivery) -> dict:
    """The signed callgate webhook body of an alert: ``{"type": "alert", "delivery_id",
    "event": "firing"|"reminder"|"resolved"|"unsnoozed", "project", "rule": {"id", "name",
    "metric", "target", "tool", "agent"}, "value", "threshold", "message", "at", "url",
    "history_url"}``. ``url`` is absolute (``CALLGATE_BASE_URL``): the calls the rule
    counted at ``at`` (``alert_link``); ``history_url`` the project's alert history."""
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
        "url": absolute_url(alert_link(rule, at=event.at)[0]),
        "history_url": absolute_url(reverse("alerts:history", args=[rule.project.slug])),
    }


#: email subjects by event kind
_SUBJECT: dict[str, str] = {
    AlertEvent.Kind.FIRING: "[callgate] ",
    AlertEvent.Kind.REMINDER: "[callgate] still firing: ",
    AlertEvent.Kind.RESOLVED: "[callgate] resolved: ",
    AlertEvent.Kind.UNSNOOZED: "[callgate] snooze ended: ",
}
_ICON: dict[str, str] = {
    AlertEvent.Kind.FIRING: ":rotating_light:",
    AlertEvent.Kind.REMINDER: ":rotating_light:",
    AlertEvent.Kind.RESOLVED: ":white_check_mark:",
    AlertEvent.Kind.UNSNOOZED: ":alarm_clock:",
}


def _slack_escape(text: str) -> str:
    """Slack mrkdwn's three control characters as entities
    (https://api.slack.com/reference/surfaces/formatting#escaping)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def alert_texts(event: AlertEvent) -> tuple[str, str, str]:
    """``(email subject, email body, Slack mrkdwn text)`` of an event's notification; both
    texts carry the absolute link of ``alert_link`` (Slack as ``<url|text>``)."""
    rule = event.rule
    path, link_text = alert_link(rule, at=event.at)
    url = absolute_url(path)
    history = absolute_url(reverse("alerts:history", args=[rule.project.slug]))
    subject = _SUBJECT.get(event.kind, "[callgate] ") + rule.name
    body = f"{event.message}\n\n{link_text}: {url}\nAlert history: {history}\n"
    slack = (
        f"{_ICON.get(event.kind, ':bell:')} [{_slack_escape(rule.project.name)}] "
        f"{_slack_escape(event.message)} <{url}|{link_text}>"
    )
    return subject, body, slack


def alert_deliver(delivery: AlertDelivery) -> None:
    """Send one notification. Webhooks (through ``callgate.outbound``'s guard: a URL on a
    non-public address is refused unless ``CALLGATE_OUTBOUND_ALLOW`` admits it): a 2xx
    answer delivers; anything else, or a refusal, raises ``DeliveryError``. Email: Django's
    mail backend (``send_mail``); its errors raise ``DeliveryError``."""
    from reviews import webhooks

    event = delivery.event
    rule = event.rule
    subject, body, slack = alert_texts(event)
    try:
        if delivery.channel == AlertDelivery.Channel.EMAIL:
            send_mail(subject, body, None, rule.email_list())
            return
        if rule.webhook_format == AlertRule.WebhookFormat.CALLGATE:
            response = webhooks.webhook_post(
                url=delivery.target, secret=rule.webhook_secret, payload=alert_payload(delivery)
            )
        else:
            with outbound.client(
                transport=webhooks.TRANSPORT, timeout=webhooks.WEBHOOK_TIMEOUT
            ) as client:
                response = client.post(
                    delivery.target,
                    content=json.dumps({"text": slack}).encode(),
                    headers={"Content-Type": "application/json", "User-Agent": "callgate-alert/1"},
                )
    except (httpx.HTTPError, OSError) as exc:
        raise DeliveryError(f"{type(exc).__name__}: {exc}") from exc
    if not 200 <= response.status_code < 300:
        raise DeliveryError(f"HTTP {response.status_code}")
