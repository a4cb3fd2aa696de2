"""Reads of the alerts for pages: the firing rules nobody handled (the navigation's count)
and the firing rules with what operators need to act on them (the overview's panel)."""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict

from django.db.models import Max, Q, QuerySet
from django.utils import timezone

from alerts.models import AlertEvent, AlertRule
from alerts.services import alert_link, format_value
from callgate.models import Project


def _unhandled_q() -> Q:
    """Not acknowledged, and not snoozed (or snoozed until a time that has passed: the
    evaluation ends such a snooze within a minute)."""
    return Q(acknowledged_at__isnull=True) & (
        Q(snoozed_at__isnull=True) | Q(snoozed_until__lte=timezone.now())
    )


def firing_unhandled_count(*, project: Project) -> int:
    """How many of the project's enabled rules fire with nobody handling them: one COUNT."""
    return (
        AlertRule.objects.filter(project=project, enabled=True, state=AlertRule.State.FIRING)
        .filter(_unhandled_q())
        .count()
    )


def firing_rules(*, project: Project) -> QuerySet[AlertRule]:
    """The project's enabled firing rules, the unhandled ones first, then by name."""
    return (
        AlertRule.objects.filter(project=project, enabled=True, state=AlertRule.State.FIRING)
        .select_related("agent", "acknowledged_by", "snoozed_by", "project")
        .order_by("acknowledged_at", "snoozed_at", "name")
    )


class FiringRow(TypedDict):
    """One firing rule as the panel shows it."""

    rule: AlertRule
    value_text: str
    threshold_text: str
    since: datetime | None
    link: str
    link_text: str


def firing_panel(*, project: Project) -> list[FiringRow]:
    """The firing rules (``firing_rules``) with their value, threshold, since when they fire
    and the link to the calls behind them (as counted at their last evaluation). Two
    queries."""
    rules = list(firing_rules(project=project))
    fired_at = dict(
        AlertEvent.objects.filter(rule__in=rules, kind=AlertEvent.Kind.FIRING)
        .values("rule_id")
        .annotate(at=Max("at"))
        .values_list("rule_id", "at")
    )
    rows: list[FiringRow] = []
    for rule in rules:
        link, link_text = alert_link(rule, at=rule.last_evaluated_at or timezone.now())
        rows.append(
            {
                "rule": rule,
                "value_text": format_value(rule, rule.last_value),
                "threshold_text": format_value(rule, rule.threshold),
                "since": fired_at.get(rule.pk),
                "link": link,
                "link_text": link_text,
            }
        )
    return rows
