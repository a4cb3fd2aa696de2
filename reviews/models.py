"""The review queue: escalated tool calls waiting for a human decision.

- ``ReviewItem``: one call a human must look at (status open → claimed → resolved /
  expired / settled). State changes happen only in ``reviews.services`` as
  compare-and-swap UPDATEs.
- ``ReviewRollup``: closed items counted per hour and day of closing, how they closed and
  how long a human took (log-scale buckets): what the review-health report reads.
- ``ClosedItemCount``: closed items counted per status, tool, agent and reason, of all
  time: what the queue's counts and facets read instead of every closed item.
- ``ReviewAudit``: append-only trail of everything done to an item (who, what, when,
  state before and after, reason). Comments are audit rows with ``action="comment"``.
- ``WebhookOutbox``: one decision to deliver, written in the decision's transaction.
- ``WebhookDelivery``: one attempt to POST a decision to the agent's webhook.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from callgate.models import Agent, Project, Tally, ToolCall


class ReviewItem(models.Model):
    """A call a human must decide on: escalated (route ``review``) or waiting for approval
    before execution. At most one open item per call (a partial unique constraint).

    A claim is a lease: ``lease_expires_at`` is pushed forward by every action of the
    assignee; once it passes, the item counts as unassigned and anyone may claim it
    (``review_leases_lapse`` also returns it to ``open`` periodically)."""

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
    reason = models.CharField(
        max_length=32, help_text="The call's reason when the item was opened."
    )
    # the call's, copied when the item is opened (a call's tool and agent never change): the
    # queue filters and counts by them without joining the calls table
    tool_name = models.CharField(max_length=128, blank=True, help_text="The call's tool name.")
    agent = models.ForeignKey(
        Agent,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        db_index=False,  # read within a project only (an index of every tenant's items by
        # agent lured the planner into reading it whole for one project's counts)
        help_text="The call's agent.",
    )
    priority = models.PositiveSmallIntegerField(default=2, help_text="0 is the most urgent.")
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="review_items",
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
    agent_retries = models.PositiveSmallIntegerField(
        default=0,
        db_default=0,
        help_text=(
            "New attempts the agent reported while the call's outcome was unknown and this "
            "item open: a blind retry, so the write may have run twice (issue 16)."
        ),
    )
    agent_retried_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["call"],
                condition=models.Q(status__in=["open", "claimed"]),
                name="reviewitem_one_open_per_call",
            ),
        ]
        indexes = [
            # queue page and "next item": open items in queue order (the keyset's ID included,
            # or the planner prefers reviewitem_queue_order and filters out the closed items)
            models.Index(
                fields=["project", "priority", "created_at", "id"],
                name="reviewitem_open_queue",
                condition=models.Q(status__in=["open", "claimed"]),
            ),
            # queue page filtered by tool, reason or agent: their open items in queue order
            # (a page reads its 51 rows, not every open item of the tool, reason or agent)
            *[
                models.Index(
                    fields=["project", column, "priority", "created_at", "id"],
                    name=f"reviewitem_open_{name}",
                    condition=models.Q(status__in=["open", "claimed"]),
                )
                for name, column in (
                    ("tool", "tool_name"),
                    ("reason", "reason"),
                    ("agent", "agent"),
                )
            ],
            # queue page in queue order for every other status (resolved, all): keyset pages
            models.Index(
                fields=["project", "priority", "created_at", "id"], name="reviewitem_queue_order"
            ),
            # review_leases_lapse: claimed items whose lease ran out
            models.Index(
                fields=["lease_expires_at"],
                name="reviewitem_claimed_lease",
                condition=models.Q(status="claimed"),
            ),
            # review_items_expire: approval items past their timeout
            models.Index(
                fields=["approval_expires_at"],
                name="reviewitem_approval_due",
                condition=models.Q(status__in=["open", "claimed"], kind="approval"),
            ),
            # progress per assignee: decided today
            models.Index(
                fields=["project", "resolved_by", "resolved_at"], name="reviewitem_resolved_by"
            ),
            # overview's oldest open item, review health's open items by age
            models.Index(
                fields=["project", "created_at", "id"],
                name="reviewitem_open_age",
                condition=models.Q(status__in=["open", "claimed"]),
            ),
            # queue facets: items per status (an index-only count, not a read of every item)
            models.Index(fields=["project", "status"], name="reviewitem_status"),
            # review health report: items closed in a range
            models.Index(fields=["project", "resolved_at"], name="reviewitem_resolved_at"),
        ]

    def __str__(self) -> str:
        return f"review #{self.pk} {self.reason}"

    @property
    def is_open(self) -> bool:
        return self.status in self.OPEN_STATUSES

    def lease_active(self, now=None) -> bool:
        """True while a claim holds: claimed and the lease has not run out."""
        now = now or timezone.now()
        return (
            self.status == self.Status.CLAIMED
            and self.assignee_id is not None
            and self.lease_expires_at is not None
            and self.lease_expires_at > now
        )

    def current_assignee_id(self, now=None) -> int | None:
        """The assignee while the lease holds; None for open or lapsed items."""
        return self.assignee_id if self.lease_active(now) else None


class ReviewRollup(Tally):
    """Closed review items counted per project, UTC hour or day of closing (``resolved_at``),
    status and resolution, per tool, agent or both, and, for a human's decision (status
    ``resolved``), the time from the item's opening to it in log-scale buckets
    (``callgate.reports.tallies.decision_bucket``): what the review-health report reads, so
    that its cost does not grow with the queue's history.

    An item closes once (no way leads from resolved, expired or settled back to open), so
    the rows are kept by adding: every writer that closes items calls
    ``tallies.review_rollups_add`` in the closing transaction. ``review_rollups_rebuild``
    recounts a project's rows from its items (after a bulk load, an upgrade, a purge:
    ``manage.py backfill_rollups``)."""

    status = models.CharField(max_length=12)
    resolution = models.CharField(max_length=20, blank=True)
    decision_bucket = models.SmallIntegerField(
        default=0,
        help_text=(
            "0: not a human's decision; k >= 1: it took 2**((k-1)/8) to 2**(k/8) seconds "
            "(the first bucket from 0)."
        ),
    )
    items = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=[*Tally.KEY, "status", "resolution", "decision_bucket"],
                name="reviewrollup_cell",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.items} {self.status} {self.grain} {self.bucket:%Y-%m-%d %H:00}"


class ClosedItemCount(models.Model):
    """Closed review items of a project counted per status, tool, agent and reason, of all
    time (no time column): what the review queue's match count and filter counts read for
    the closed items, so that their cost grows with the combinations in use, not with the
    queue's history (``reviews.selectors.QueueCounts``). Kept as ``ReviewRollup`` is: added
    to in the closing transaction by ``tallies.review_rollups_add``, recounted with it by
    ``review_rollups_rebuild``."""

    # no index of its own: the unique constraint starts with it
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    status = models.CharField(max_length=12)
    tool_name = models.CharField(max_length=128, blank=True, default="")
    agent_id = models.BigIntegerField(default=0, help_text="The agent's ID; 0: none.")
    reason = models.CharField(max_length=32)
    items = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "status", "tool_name", "agent_id", "reason"],
                name="closeditemcount_cell",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.items} {self.status} {self.tool_name} {self.reason}"


class AuditQuerySet(models.QuerySet):
    """No bulk update or delete: the trail is append-only."""

    def update(self, **kwargs):  # noqa: ARG002
        raise TypeError("ReviewAudit is append-only")

    def delete(self):
        raise TypeError("ReviewAudit is append-only")


class ReviewAudit(models.Model):
    """Append-only: one row per thing done to an item. ``actor`` is None for callgate
    itself (opened, settled, lease lapsed, expired). ``override`` marks an approval that
    skipped the reconciliation guard with a written reason (shown in red)."""

    class Action(models.TextChoices):
        OPENED = "opened", "Opened"
        CLAIM = "claim", "Claimed"
        RELEASE = "release", "Released"
        ASSIGN = "assign", "Assigned"
        LEASE_LAPSED = "lease_lapsed", "Claim lapsed"
        COMMENT = "comment", "Comment"
        RECONCILE = "reconcile", "Reconcile requested"
        EXTEND = "extend", "Approval timeout extended"
        APPROVE = "approve", "Approved"
        EDIT_ARGUMENTS = "edit_arguments", "Arguments edited"
        APPROVE_RETRY = "approve_retry", "Approved retry"
        REJECT = "reject", "Rejected"
        MARK_APPLIED = "mark_applied", "Marked applied"
        MARK_FAILED = "mark_failed", "Marked failed"
        EXPIRED = "expired", "Approval expired"
        SETTLED = "settled", "Settled by a later event"
        AGENT_RETRY = "agent_retry", "Agent retried while the outcome was unknown"
        REASON_CHANGED = "reason_changed", "Reason changed"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    item = models.ForeignKey(ReviewItem, on_delete=models.CASCADE, related_name="audit")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    action = models.CharField(max_length=16, choices=Action.choices)
    state_before = models.CharField(max_length=12, blank=True)
    state_after = models.CharField(max_length=12, blank=True)
    call_state_before = models.CharField(max_length=20, blank=True)
    call_state_after = models.CharField(max_length=20, blank=True)
    reason = models.TextField(blank=True)
    override = models.BooleanField(default=False)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "pk"]
        indexes = [
            # item page and CSV export: an item's trail in order
            models.Index(fields=["item", "created_at"], name="reviewaudit_item"),
            # review health report: overrides in a range (rare: a small partial index)
            models.Index(
                fields=["project", "created_at"],
                name="reviewaudit_override",
                condition=models.Q(override=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} on #{self.item_id}"

    def save(self, *args, **kwargs):
        if self.pk is not None or not self._state.adding:
            raise TypeError("ReviewAudit is append-only: rows cannot be changed")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise TypeError("ReviewAudit is append-only: rows cannot be deleted")

    @property
    def is_comment(self) -> bool:
        return self.action == self.Action.COMMENT


class WebhookOutbox(models.Model):
    """A decision to deliver to the agent's webhook: the transactional outbox. Written in the
    transaction that saves the decision, so a decision is never without its delivery; the
    ``webhook_deliver`` task sends it (Celery's retry with backoff between attempts), and the
    beat sweeper (``sweep_webhooks``) re-sends any row whose next attempt is overdue (a lost
    broker message delays a delivery, never loses it). ``delivery_id`` is the Standard
    Webhooks ``webhook-id``: the same for every attempt, so receivers deduplicate on it."""

    delivery_id = models.UUIDField(unique=True, default=uuid.uuid4)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    item = models.ForeignKey(ReviewItem, null=True, blank=True, on_delete=models.CASCADE)
    call = models.ForeignKey(ToolCall, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    attempts = models.PositiveSmallIntegerField(default=0)
    delivered_at = models.DateTimeField(null=True, blank=True)
    given_up_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        indexes = [
            # the sweeper: undelivered rows by when they are due
            models.Index(
                fields=["next_attempt_at"],
                name="webhookoutbox_due",
                condition=models.Q(delivered_at__isnull=True, given_up_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"webhook {self.delivery_id}"


class WebhookDelivery(models.Model):
    """One attempt to POST a decision to the agent's webhook (see ``reviews.tasks``)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    item = models.ForeignKey(
        ReviewItem, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries"
    )
    call = models.ForeignKey(ToolCall, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+")
    delivery_id = models.UUIDField(help_text="Same for every attempt of one decision.")
    attempt = models.PositiveSmallIntegerField()
    url = models.URLField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    ok = models.BooleanField(default=False)
    duration_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "pk"]
        indexes = [
            # item page: deliveries of the item's decisions
            models.Index(fields=["item", "created_at"], name="webhookdelivery_item"),
        ]

    def __str__(self) -> str:
        return f"webhook {self.delivery_id} attempt {self.attempt}"


class ProjectNotifications(models.Model):
    """Where a project's review items are announced outside the dashboard (issue 31): a
    Slack incoming webhook (an interactive message with Approve / Reject) and email
    addresses (a message with signed decision links). Managers set it on the Notifications
    page; operators also opt in to the emails themselves (``EmailSubscription``)."""

    project = models.OneToOneField(
        Project, on_delete=models.CASCADE, related_name="review_notifications"
    )
    slack_webhook_url = models.URLField(
        blank=True,
        help_text="A Slack incoming webhook (https://hooks.slack.com/services/…): each new "
        "review item is posted there with Approve / Reject.",
    )
    emails = models.CharField(
        max_length=500,
        blank=True,
        help_text="Comma-separated addresses told of each new review item. An address of "
        "an operator of the project gets decision links; any other only the item's link.",
    )

    def __str__(self) -> str:
        return f"notifications of {self.project}"

    def email_list(self) -> list[str]:
        return [e.strip() for e in self.emails.split(",") if e.strip()]


class SlackIdentity(models.Model):
    """A Slack user (workspace ``team_id`` + ``slack_user_id``) linked to a callgate user:
    a click on a Slack message's Approve or Reject decides as that user. Made only with
    proof that the Slack user is the clicker: a ``SlackLinkRequest`` link, which callgate
    sends to that Slack user alone, opened by the logged-in callgate user; one callgate user
    per Slack user."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_identities"
    )
    team_id = models.CharField(max_length=32, help_text="Slack workspace ID, e.g. T0123ABCD.")
    slack_user_id = models.CharField(max_length=32, help_text="Slack member ID, e.g. U0123ABCD.")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # an interaction's user is looked up by both
            models.UniqueConstraint(
                fields=["team_id", "slack_user_id"], name="slackidentity_unique_slack_user"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.team_id}/{self.slack_user_id} → {self.user}"


class SlackLinkRequest(models.Model):
    """A one-time link offered to a Slack member who clicked a callgate message before
    linking: Slack signed the click, so ``team_id`` and ``slack_user_id`` are proven; the
    link (signed ``nonce``, ``reviews.notifications.slack_link_create``) went to that member
    alone, and links that member to the callgate user who opens it and confirms.
    ``used_at``/``used_by`` are set in the linking transaction, so it links at most once."""

    nonce = models.CharField(max_length=32, unique=True)
    team_id = models.CharField(max_length=32)
    slack_user_id = models.CharField(max_length=32)
    created_at = models.DateTimeField(default=timezone.now)
    used_at = models.DateTimeField(null=True, blank=True)
    used_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return f"link request for {self.team_id}/{self.slack_user_id}"


class EmailSubscription(models.Model):
    """An operator who asked for an email, with decision links, for each new review item
    of a project."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # the notifier reads a project's subscribers; the page one user's rows
            models.UniqueConstraint(fields=["project", "user"], name="emailsubscription_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.user} subscribed to {self.project}"


class DecisionLink(models.Model):
    """One signed decision link of a notification email: who may decide what on which
    item. The link carries only ``nonce`` (signed, ``reviews.email_links``); ``used_at`` is
    set in the decision's transaction, so a link decides at most once."""

    nonce = models.CharField(max_length=32, unique=True)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    item = models.ForeignKey(ReviewItem, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    decision = models.CharField(max_length=20)
    created_at = models.DateTimeField(default=timezone.now)
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.decision} link for #{self.item_id}"
