"""The review queue: escalated tool calls waiting for a human decision."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from callgate.models import Project, ToolCall


class ReviewItem(models.Model):
    """A call a human must decide on: escalated (route ``review``) or waiting for approval
    before execution. At most one open item per call (a partial unique constraint)."""

    class Status(models.TextChoices):
        OPEN = "open", "Open"
        CLAIMED = "claimed", "Claimed"
        RESOLVED = "resolved", "Resolved"
        EXPIRED = "expired", "Expired"
        SETTLED = "settled", "Settled by a later event"

    class Kind(models.TextChoices):
        ESCALATION = "escalation", "Escalation"
        APPROVAL = "approval", "Approval before execution"

    OPEN_STATUSES = (Status.OPEN, Status.CLAIMED)

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="review_items")
    call = models.ForeignKey(ToolCall, on_delete=models.CASCADE, related_name="review_items")
    kind = models.CharField(max_length=12, choices=Kind.choices, default=Kind.ESCALATION)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.OPEN)
    reason = models.CharField(max_length=32, help_text="The call's reason when the item was opened.")
    priority = models.PositiveSmallIntegerField(default=2, help_text="0 is the most urgent.")
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="review_items"
    )
    claimed_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    approval_expires_at = models.DateTimeField(null=True, blank=True)
    resolution = models.CharField(max_length=20, blank=True)
    resolution_reason = models.TextField(blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    resolved_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["call"], condition=models.Q(status__in=["open", "claimed"]), name="reviewitem_one_open_per_call"
            ),
        ]
        indexes = [
            # queue page: open items by priority, then age
            models.Index(
                fields=["project", "priority", "created_at"],
                name="reviewitem_open_queue",
                condition=models.Q(status__in=["open", "claimed"]),
            ),
        ]

    def __str__(self) -> str:
        return f"review #{self.pk} {self.reason}"
