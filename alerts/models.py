"""Alert rules per project, what they fired, and where each notification went.

A rule watches one number (``AlertRule.Metric``) over a window: the rate or count of a
category or reason among a project's calls (overall, or for one tool or agent; read from
the report rollups), the age of the oldest open review item, or the inbox lag. It fires
when the number reaches ``threshold`` and resolves only when it falls below
``clear_threshold`` (hysteresis: a number hovering at the threshold does not flap).

Operators handle a firing rule as in Sentry: acknowledge it (no reminders until it
resolves), snooze it for a time or until N more matching calls (no notifications while
snoozed; the evaluation ends the snooze), or resolve it by hand. Each action is an
``AlertEvent`` with its actor.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from callgate.models import Agent, Project


class AlertRule(models.Model):
    class Metric(models.TextChoices):
        CATEGORY_RATE = "category_rate", "Share of calls in a category"
        CATEGORY_COUNT = "category_count", "Calls in a category"
        REASON_RATE = "reason_rate", "Share of calls with a reason"
        REASON_COUNT = "reason_count", "Calls with a reason"
        REVIEW_AGE = "review_age", "Age of the oldest open review item"
        INBOX_LAG = "inbox_lag", "Inbox lag (oldest event not applied yet)"

    class State(models.TextChoices):
        OK = "ok", "OK"
        FIRING = "firing", "Firing"

    class WebhookFormat(models.TextChoices):
        SLACK = "slack", "Slack-compatible incoming webhook"
        CALLGATE = "callgate", "Signed callgate webhook"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="alert_rules")
    name = models.CharField(max_length=100)
    metric = models.CharField(max_length=20, choices=Metric.choices)
    target = models.CharField(
        max_length=32, blank=True, help_text="The category or reason slug (rate/count metrics)."
    )
    tool = models.CharField(max_length=128, blank=True, help_text="Only this tool (blank: all).")
    agent = models.ForeignKey(
        Agent, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    window_minutes = models.PositiveIntegerField(
        default=60, help_text="Rate/count window, rounded up to whole hours (the rollups' grain)."
    )
    threshold = models.FloatField(
        help_text="Fire at or above: a share 0..1, a count, or seconds (age, lag)."
    )
    clear_threshold = models.FloatField(
        help_text="Resolve below this (at most the threshold): the hysteresis band."
    )
    min_calls = models.PositiveIntegerField(
        default=20, help_text="Rates are not judged on fewer calls than this in the window."
    )
    enabled = models.BooleanField(default=True)
    webhook_url = models.URLField(blank=True)
    webhook_format = models.CharField(
        max_length=10, choices=WebhookFormat.choices, default=WebhookFormat.SLACK
    )
    webhook_secret = models.CharField(
        max_length=128, blank=True, help_text="HMAC key of the signed callgate format."
    )
    emails = models.CharField(max_length=500, blank=True, help_text="Comma-separated addresses.")
    state = models.CharField(max_length=10, choices=State.choices, default=State.OK)
    last_value = models.FloatField(null=True, blank=True)
    last_evaluated_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    #: the last notification (firing, reminder, snooze ended): reminders count from it
    notified_at = models.DateTimeField(null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    #: a snooze: since when, and until a time and/or until ``snooze_calls`` more matching calls
    snoozed_at = models.DateTimeField(null=True, blank=True)
    snoozed_until = models.DateTimeField(null=True, blank=True)
    snooze_calls = models.PositiveIntegerField(null=True, blank=True)
    snoozed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="alertrule_unique_name")
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_rate(self) -> bool:
        return self.metric in (self.Metric.CATEGORY_RATE, self.Metric.REASON_RATE)

    @property
    def is_seconds(self) -> bool:
        return self.metric in (self.Metric.REVIEW_AGE, self.Metric.INBOX_LAG)

    @property
    def counts_calls(self) -> bool:
        """Whether the rule counts calls (and so links to them and can be snoozed until N
        more)."""
        return not self.is_seconds

    @property
    def handled(self) -> bool:
        """Someone acknowledged or snoozed it."""
        return self.acknowledged_at is not None or self.snoozed_at is not None

    def email_list(self) -> list[str]:
        return [e.strip() for e in self.emails.split(",") if e.strip()]


class AlertEvent(models.Model):
    """What happened to a rule (the alert history): it fired, was still firing, resolved,
    or someone acted on it (``actor``; None for the evaluation)."""

    class Kind(models.TextChoices):
        FIRING = "firing", "Fired"
        REMINDER = "reminder", "Still firing"
        RESOLVED = "resolved", "Resolved"
        ACKNOWLEDGED = "acknowledged", "Acknowledged"
        SNOOZED = "snoozed", "Snoozed"
        UNSNOOZED = "unsnoozed", "Snooze ended"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=12, choices=Kind.choices)
    #: the rule's value then (None when it was not measured) and the threshold it crossed
    value = models.FloatField(null=True, blank=True)
    threshold = models.FloatField(null=True, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    message = models.TextField()
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["project", "-at"], name="alertevent_project_recent")]

    def __str__(self) -> str:
        return f"{self.rule} {self.kind} at {self.at:%Y-%m-%d %H:%M}"


class AlertDelivery(models.Model):
    """One notification of an event to one channel; retried by Celery until delivered."""

    class Channel(models.TextChoices):
        WEBHOOK = "webhook", "Webhook"
        EMAIL = "email", "Email"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"

    event = models.ForeignKey(AlertEvent, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.CharField(max_length=10, choices=Channel.choices)
    target = models.CharField(max_length=500)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.channel} {self.target}: {self.status}"
