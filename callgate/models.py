"""callgate's core domain: tenancy and keys, tool contracts, tool calls and their events.

The review queue lives in ``reviews.models``. State changes of a ``ToolCall`` happen only
in ``callgate.lifecycle`` (the transition table) through ``callgate.services``.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q, Value
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Concat
from django.utils import timezone

from callgate.lifecycle import State
from callgate.taxonomy import Category, Reason, Route


class Project(models.Model):
    """The tenant. Everything else belongs to exactly one project."""

    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=50, unique=True)
    retention_days = models.PositiveIntegerField(
        default=90, help_text="Events older than this many days are purged by the retention job."
    )
    config_version = models.PositiveBigIntegerField(
        default=0,
        db_default=0,
        editable=False,
        help_text="Bumped whenever a tool contract or an agent's registered tools change: the "
        "version stamp of each process's cache of them (callgate.ingest.tools_for).",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        VIEWER = "viewer", "Viewer"
        OPERATOR = "operator", "Operator"
        MANAGER = "manager", "Manager"
        ADMIN = "admin", "Admin"

    RANK = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.MANAGER: 2, Role.ADMIN: 3}

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "project"], name="membership_unique_user_project"
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} as {self.role}"

    def has_role(self, role: str) -> bool:
        """True when this membership's role is ``role`` or a higher one."""
        return self.RANK[self.Role(self.role)] >= self.RANK[self.Role(role)]


class Agent(models.Model):
    """An LLM agent (or agent runtime) that reports tool calls with its API keys."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="agents")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    webhook_url = models.URLField(blank=True, help_text="Review decisions are POSTed here, signed.")
    webhook_secret = models.CharField(
        max_length=128, blank=True, help_text="HMAC-SHA256 key for webhooks."
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="agent_unique_name")
        ]

    def __str__(self) -> str:
        return self.name


class ApiKey(models.Model):
    """An agent's credential. Only a SHA-256 digest and the last four characters are kept."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_keys")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, unique=True)  # public look-up part of the key
    digest = models.CharField(max_length=64)  # hex SHA-256 of the whole key
    last4 = models.CharField(max_length=4)
    can_decide = models.BooleanField(
        default=False,
        help_text="May report decision and approval_expired events: for an agent runtime with its own approval "
        "UI. Without it, only operators decide (in the review queue).",
    )
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"cg_{self.prefix}_…{self.last4}"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class ToolContract(models.Model):
    """One immutable version of a tool's contract (name + version within a project)."""

    class Effect(models.TextChoices):
        READ = "read", "Read"
        WRITE = "write", "Write"

    class ReconcileMethod(models.TextChoices):
        NONE = "none", "None"
        AGENT = "agent", "Reported by the agent"
        HTTP = "http", "HTTP look-up"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="contracts")
    name = models.CharField(max_length=128)
    version = models.PositiveIntegerField()
    label = models.CharField(max_length=64, blank=True, help_text="The agent's own version label.")
    description = models.TextField(blank=True)
    parameters = models.JSONField(help_text="JSON Schema (draft 2020-12) of the arguments.")
    effect = models.CharField(max_length=8, choices=Effect.choices, default=Effect.READ)
    idempotent = models.BooleanField(default=False, help_text="The target dedupes by operation ID.")
    reconcile_method = models.CharField(
        max_length=8, choices=ReconcileMethod.choices, default=ReconcileMethod.NONE
    )
    reconcile_url = models.CharField(
        max_length=500, blank=True, help_text="URL template with {operation_id}."
    )
    max_attempts = models.PositiveIntegerField(default=3)
    max_reasks = models.PositiveIntegerField(default=2)
    retry_initial_interval = models.FloatField(default=1.0)  # seconds
    retry_backoff_coefficient = models.FloatField(default=2.0)
    retry_maximum_interval = models.FloatField(default=60.0)  # seconds
    deadline_seconds = models.PositiveIntegerField(null=True, blank=True)
    requires_approval = models.BooleanField(default=False)
    approval_timeout_seconds = models.PositiveIntegerField(default=15 * 60)
    sensitive_fields = models.JSONField(default=list, blank=True)
    # TAXONOMY v2
    volatile_arguments = models.JSONField(
        default=list,
        blank=True,
        help_text="JSON Pointers (RFC 6901) left out of the operation ID and the duplicate checks.",
    )
    max_identical = models.PositiveIntegerField(
        default=3, help_text="Identical proposals allowed per request before loop_detected."
    )
    not_found_may_hide_forbidden = models.BooleanField(
        default=False, help_text="A 404 of this tool may hide a permission problem (review)."
    )
    result_error_markers = models.BooleanField(
        default=True, help_text="Read error markers (ok: false, failures: [...]) in results."
    )
    digest = models.CharField(max_length=64)  # SHA-256 of the canonical contract body
    lint_score = models.PositiveIntegerField(default=100)
    lint_findings = models.JSONField(default=list, blank=True)
    published_by = models.CharField(
        max_length=200, blank=True, help_text="Who published this version: an agent or a user."
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "-version"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "name", "version"], name="contract_unique_version"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    @property
    def reconcilable(self) -> bool:
        return self.reconcile_method != self.ReconcileMethod.NONE


class AgentTool(models.Model):
    """A tool name an agent registered: the set that ``unknown_tool`` checks against. The
    agent that created the tool is its ``owner`` and may publish changed versions; an agent
    that registered the identical contract afterwards only uses it."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="tools")
    name = models.CharField(max_length=128)
    owner = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["agent", "name"], name="agenttool_unique")]

    def __str__(self) -> str:
        return f"{self.name} ({self.agent_id})"


class ToolCall(models.Model):
    """One operation: everything callgate knows about one tool call, keyed by operation ID."""

    State = State  # the states of callgate.lifecycle

    # No single-column indexes on project, agent or decider: the indexes below start with
    # project or agent, and a decider is only looked up when a user is deleted (a scan).
    # Every index is written on every insert, and on updates that are not HOT.
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="calls", db_index=False
    )
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="calls", db_index=False)
    operation_id = models.CharField(max_length=200)
    request_id = models.CharField(max_length=200, blank=True)
    conversation_id = models.CharField(max_length=200, blank=True)
    trace_id = models.CharField(max_length=200, blank=True)
    call_id = models.CharField(max_length=200, blank=True, help_text="The provider's tool-call ID.")
    actor = models.CharField(
        max_length=200, blank=True, help_text="The end user the agent acts for."
    )
    provider_format = models.CharField(max_length=20, blank=True)
    executed_by = models.CharField(
        max_length=10,
        default="client",
        help_text="client (the agent's runtime runs it) or provider (the model's provider ran "
        "it, e.g. Anthropic server tools): never gated.",
    )
    tool_name = models.CharField(max_length=128, blank=True)
    contract = models.ForeignKey(
        ToolContract, null=True, blank=True, on_delete=models.PROTECT, related_name="calls"
    )
    arguments = models.JSONField(null=True, blank=True)  # redacted before storage
    arguments_digest = models.CharField(
        max_length=64, blank=True
    )  # of the canonical, unredacted arguments

    state = models.CharField(max_length=20, choices=State.choices)
    reason = models.CharField(max_length=32, choices=Reason.choices, blank=True)
    category = models.CharField(max_length=20, choices=Category.choices, blank=True)
    route = models.CharField(max_length=20, choices=Route.choices, blank=True)
    observation = models.TextField(blank=True)

    attempts = models.PositiveIntegerField(default=0)
    duplicates_suppressed = models.PositiveIntegerField(default=0)
    receipt = models.JSONField(null=True, blank=True)
    receipt_at = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)
    approval_expires_at = models.DateTimeField(null=True, blank=True)
    reconcile_requested_at = models.DateTimeField(null=True, blank=True)

    decision = models.CharField(max_length=20, blank=True)
    decision_reason = models.TextField(blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_arguments = models.JSONField(
        null=True,
        blank=True,
        help_text="The arguments an operator approved with edits (redacted, as stored); "
        "null when the decision kept the agent's.",
    )
    proposed_operation_id = models.CharField(
        max_length=200,
        blank=True,
        help_text="The operation ID the agent proposed the call under, when an operator's "
        "edit of the arguments gave the call a new one.",
    )
    proposed_arguments_digest = models.CharField(
        max_length=64,
        blank=True,
        help_text="The digest of the arguments the agent proposed under "
        "proposed_operation_id: a repeat of that proposal is this call.",
    )

    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # pattern operators: also serves the calls list's operation-ID prefix search
            # (LIKE 'prefix%'), which a default-collation index cannot
            models.UniqueConstraint(
                fields=["project", "operation_id"],
                name="toolcall_unique_operation",
                opclasses=["int8_ops", "varchar_pattern_ops"],
            ),
        ]
        indexes = [
            # calls list: newest first within a project (also: the capped counts)
            models.Index(fields=["project", "-created_at"], name="toolcall_project_recent"),
            # calls list filtered by reason (and by category: a set of reasons)
            models.Index(
                fields=["project", "reason", "-created_at"], name="toolcall_project_reason"
            ),
            # calls list filtered by state
            models.Index(fields=["project", "state", "-created_at"], name="toolcall_project_state"),
            # calls list filtered by tool
            models.Index(
                fields=["project", "tool_name", "-created_at"], name="toolcall_project_tool"
            ),
            # calls list filtered by agent (an agent is in one project); deleting an agent
            models.Index(fields=["agent", "-created_at"], name="toolcall_agent_recent"),
            # a later event naming its call by call_id within request_id
            models.Index(fields=["project", "request_id", "call_id"], name="toolcall_request_call"),
            # GET /api/v1/calls?trace_id=… and the calls page's trace filter (OpenTelemetry)
            models.Index(fields=["project", "trace_id"], name="toolcall_project_trace"),
            # an agent still waiting under the operation ID it proposed, after an operator's
            # edit of the arguments renamed the call (GET /api/v1/calls/{operation_id})
            models.Index(
                fields=["project", "proposed_operation_id"],
                condition=~models.Q(proposed_operation_id=""),
                name="toolcall_proposed_operation",
            ),
            # the search's free text and conversation: (the request ID, trace ID and operation
            # ID have theirs above); the error text's trigram index (PostgreSQL only) is made
            # by migration 0024, as SQLite has no GIN
            models.Index(
                fields=["project", "conversation_id"], name="toolcall_project_conversation"
            ),
            # sweeps over every project, each reading only the calls it is about
            models.Index(
                fields=["reconcile_requested_at"],
                condition=models.Q(state="reconciling"),
                name="toolcall_reconciling",
            ),
            models.Index(
                fields=["deadline"],
                condition=models.Q(state="retry_wait"),
                name="toolcall_retry_due",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name or '?'} {self.operation_id}"


class CallEvent(models.Model):
    """Append-only: what the agent reported, and what callgate or an operator decided."""

    class Kind(models.TextChoices):
        PROPOSED = "proposed", "Proposed"
        ATTEMPT = "attempt", "Attempt"
        DENIED = "denied", "Denied"
        RECONCILED = "reconciled", "Reconciled"
        RECEIPT = "receipt", "Receipt"
        DECISION = "decision", "Decision"
        APPROVAL_EXPIRED = "approval_expired", "Approval expired"
        DEADLINE_PASSED = "deadline_passed", "Deadline passed"

    class Source(models.TextChoices):
        AGENT = "agent", "Agent"
        CALLGATE = "callgate", "callgate"
        OPERATOR = "operator", "Operator"

    # No single-column indexes: the indexes below start with each (one less index to write
    # per event), and a lone project index lured the planner into reading all of a project's
    # events to find one event ID.
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="events", db_index=False
    )
    call = models.ForeignKey(
        ToolCall, on_delete=models.CASCADE, related_name="events", db_index=False
    )
    event_id = models.UUIDField(default=uuid.uuid4)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.AGENT)
    body = models.JSONField()  # redacted
    occurred_at = models.DateTimeField()
    received_at = models.DateTimeField(default=timezone.now)
    reason = models.CharField(max_length=32, choices=Reason.choices, blank=True)
    category = models.CharField(max_length=20, choices=Category.choices, blank=True)
    route = models.CharField(max_length=20, choices=Route.choices, blank=True)
    observation = models.TextField(blank=True)
    cause = models.CharField(
        max_length=300,
        blank=True,
        help_text="What the classifier read the failure's cause from, e.g. "
        "'rate limit read from the result body'.",
    )
    failed_items = models.JSONField(
        null=True, blank=True, help_text="A partial failure's failed items: [{item, error}]."
    )
    state_before = models.CharField(max_length=20, blank=True)
    state_after = models.CharField(max_length=20, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "event_id"], name="callevent_unique_event_id"
            ),
        ]
        indexes = [
            # call timeline
            models.Index(fields=["call", "received_at"], name="callevent_timeline"),
            # retention purge
            models.Index(fields=["project", "received_at"], name="callevent_retention"),
            # reports: proposals that named an existing call (the refused ones without a
            # call of their own, about 1% of proposals), by time; reason for index-only counts
            models.Index(
                fields=["project", "received_at", "reason"],
                name="callevent_reproposed",
                condition=models.Q(kind="proposed") & ~models.Q(state_before=""),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.event_id}"


def _project_key(json_key: str) -> Concat:
    """``"<project ID>:<the body's json_key>"``, the expression of ``InboxEvent``'s keys."""
    return Concat(
        Cast("project_id", models.TextField()),
        Value(":", output_field=models.TextField()),
        KT(f"body__{json_key}"),
    )


class InboxEvent(models.Model):
    """An event ``POST /api/v1/events`` accepted and stored, waiting to be applied.

    Ingest only validates the envelope (pydantic) and stores it here with one statement per
    batch; ``callgate.inbox.inbox_drain`` applies pending rows in ``id`` order per project
    (Celery task, enqueued after the insert; a beat sweep picks up anything left) and marks
    them ``applied``, their body cut to its type: an applied event lives on as its
    ``CallEvent``, and its row here until retention, so that a re-sent event ID meets the
    unique index and ``ON CONFLICT`` alone recognises it. An event the rules refuse (unknown
    call, a transition its call's state does not allow) stays here as ``rejected`` with
    ``errors``, until retention removes it. ``GET /api/v1/events/{event_id}`` reads both."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        REJECTED = "rejected", "Rejected"
        #: a drain died with it ``inbox.QUARANTINE_AFTER`` times (a worker killed or over its
        #: time limit): set aside for an administrator, never tried again
        QUARANTINED = "quarantined", "Quarantined"
        APPLIED = "applied", "Applied"

    # No database-level foreign keys: each would cost a referential check per inserted row on
    # the ingest hot path (measured: about 15 µs of 35 per event). Both IDs come from the API
    # key that authenticated the request, and deleting a project or agent still deletes its
    # rows (Django's collector cascades). No single-column indexes either (about 2 µs per
    # event): the project's rows are found through the two indexes below, which start with
    # it, and an agent's only when the agent is deleted (a scan of the small inbox).
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="+", db_constraint=False, db_index=False
    )
    agent = models.ForeignKey(
        Agent, on_delete=models.CASCADE, related_name="+", db_constraint=False, db_index=False
    )
    event_id = models.UUIDField()
    body = models.JSONField(help_text="The envelope as received (validated; not yet redacted).")
    received_at = models.DateTimeField(default=timezone.now)
    status = models.CharField(max_length=11, choices=Status.choices, default=Status.PENDING)
    errors = models.JSONField(default=list, blank=True)
    may_decide = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Sent with a can_decide key: its reconciled and receipt events may settle calls.",
    )
    attempts = models.PositiveSmallIntegerField(
        default=0,
        db_default=0,
        help_text="Drains that took this row; one that died leaves it counted (quarantine).",
    )
    digest = models.CharField(
        max_length=32,
        blank=True,
        default="",
        db_default="",
        help_text=(
            "MD5 of the event's content, key order aside (PostgreSQL: of the jsonb text); a "
            "re-sent event_id with another digest is a conflict (409), not a duplicate. Kept "
            "when the row is applied; empty for rows stored before it existed (no conflict "
            "can be told for them)."
        ),
    )
    # "<project ID>:<request ID>" and "<project ID>:<operation ID>" of a pending row (NULL
    # once applied: the body is cut to its type): the keys of the two partial indexes through
    # which the gate finds its request's earlier events (``inbox.settle_pending``). One
    # column each, the project inside, so that no index offers the planner a scan of "the
    # project's pending rows" to pick when its statistics say there are few.
    request_key = models.GeneratedField(
        expression=_project_key("request_id"),
        output_field=models.TextField(null=True),
        db_persist=True,
    )
    operation_key = models.GeneratedField(
        expression=_project_key("operation_id"),
        output_field=models.TextField(null=True),
        db_persist=True,
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "event_id"], name="inboxevent_unique_event_id"
            ),
        ]
        indexes = [
            # inbox_drain: a project's pending rows in arrival order
            models.Index(fields=["project", "status", "id"], name="inboxevent_drain"),
            # settle_pending (the gate): the pending rows of one request or one operation,
            # whatever the project's backlog (NOT NULL: so that no other query, such as a
            # count of a project's pending rows, can take a whole scan of them for its own)
            models.Index(
                fields=["request_key"],
                condition=Q(status="pending", request_key__isnull=False),
                name="inboxevent_pending_request",
            ),
            models.Index(
                fields=["operation_key"],
                condition=Q(status="pending", operation_key__isnull=False),
                name="inboxevent_pending_operation",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_id} ({self.status})"


class RollupDirtyBucket(models.Model):
    """A (project, creation hour) whose calls changed since its rollup rows were computed:
    written by every writer of ``ToolCall`` in the same transaction as the change
    (``callgate.reports.rollups.buckets_touch``), removed by the refresh in the transaction
    that recomputes the bucket. The watermark of what the rollups lack, without an index on
    ``ToolCall.updated_at`` (which made no call update HOT)."""

    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="+", db_constraint=False, db_index=False
    )
    bucket = models.DateTimeField(help_text="Start of the UTC hour the calls were created in.")
    touched_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "bucket"], name="rollupdirty_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.project_id} {self.bucket:%Y-%m-%d %H}h"


class RequestBudget(models.Model):
    """What one request knows of one tool: re-asks used (the contract's ``max_reasks``
    budget), identical proposals by canonical-arguments digest (``max_identical``,
    ``loop_detected``) and sticky refusals by digest (TAXONOMY v2 "Sticky refusals")."""

    # no index of its own: requestbudget_unique starts with it
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    request_id = models.CharField(max_length=200)
    tool_name = models.CharField(max_length=128)
    reasks_used = models.PositiveIntegerField(default=0)
    proposals = models.JSONField(
        default=dict, blank=True, help_text="digest of the canonical arguments -> proposals"
    )
    refusals = models.JSONField(
        default=dict,
        blank=True,
        help_text="digest of the canonical arguments -> {reason, observation} of a sticky refusal",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "request_id", "tool_name"], name="requestbudget_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.request_id}/{self.tool_name}: {self.reasks_used}"


class RollupMeasures(models.Model):
    """The counts a rollup cell holds, ``CallRollup`` and ``RollupCube`` alike."""

    calls = models.PositiveIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0)
    duplicates_suppressed = models.PositiveIntegerField(default=0)
    calls_attempts_0 = models.PositiveIntegerField(default=0)
    calls_attempts_1 = models.PositiveIntegerField(default=0)
    calls_attempts_2 = models.PositiveIntegerField(default=0)
    calls_attempts_3 = models.PositiveIntegerField(default=0)
    calls_attempts_4 = models.PositiveIntegerField(default=0)
    calls_attempts_5_plus = models.PositiveIntegerField(default=0)
    unknown_calls = models.PositiveIntegerField(default=0)
    unknown_decided = models.PositiveIntegerField(default=0)
    unknown_open = models.PositiveIntegerField(default=0)

    class Meta:
        abstract = True


#: The names of those counts.
ROLLUP_MEASURES = tuple(f.name for f in RollupMeasures._meta.fields)


class CallRollup(RollupMeasures):
    """Pre-aggregated call counts per project, hour, tool, contract version, agent, reason
    and route: what the reports read. Maintained by ``callgate.reports.rollups``; equal to a
    direct count over ``ToolCall`` grouped the same way (by the call's creation hour and
    current reason).

    Besides the counts, each cell holds what the reliability and contract reports need,
    so that none of them reads ``ToolCall``: the calls by attempts used (0 … 4, 5 and more)
    and the calls whose outcome was ever unknown (a ``CallEvent`` classified
    ``unknown_outcome``, or a current reason of that category or of reconciliation), with
    how many of those a human decided and how many are still open."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    bucket = models.DateTimeField(help_text="Start of the UTC hour the calls were created in.")
    tool_name = models.CharField(max_length=128, blank=True)
    contract = models.ForeignKey(
        ToolContract, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+")
    reason = models.CharField(max_length=32, blank=True)
    category = models.CharField(max_length=20, blank=True)
    route = models.CharField(max_length=20, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "bucket", "tool_name", "contract", "agent", "reason", "route"],
                name="callrollup_unique_cell",
                nulls_distinct=False,
            ),
        ]
        indexes = [
            # report queries: one project over a time range
            models.Index(fields=["project", "bucket"], name="callrollup_project_bucket"),
        ]

    def __str__(self) -> str:
        return f"{self.bucket:%Y-%m-%d %H}h {self.tool_name} {self.reason}: {self.calls}"


class Tally(models.Model):
    """A cell of a rollup kept by adding (``callgate.reports.tallies``): what it counts
    happened in ``bucket`` (the start of a UTC hour or day, ``grain``), for the tool and
    agent ``dims`` keeps (``total`` neither, ``tool``, ``agent``, ``tool_agent`` both; a
    column not kept holds "" or 0, as does a thing without a tool or an agent)."""

    class Grain(models.TextChoices):
        HOUR = "hour", "Hour"
        DAY = "day", "Day"

    class Dims(models.TextChoices):
        TOTAL = "total", "Total"
        TOOL = "tool", "Per tool"
        AGENT = "agent", "Per agent"
        TOOL_AGENT = "tool_agent", "Per tool and agent"

    # no index of its own: the unique constraint starts with it
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    dims = models.CharField(max_length=10, choices=Dims.choices)
    tool_name = models.CharField(max_length=128, blank=True, default="")
    agent_id = models.BigIntegerField(default=0, help_text="The agent's ID; 0: none or not kept.")
    grain = models.CharField(max_length=4, choices=Grain.choices)
    bucket = models.DateTimeField(help_text="Start of the UTC hour or day (``grain``).")

    #: The unique constraint's leading columns (the reads' order: project, dims, tool,
    #: agent, then a range of each grain's buckets); a subclass's own key columns follow.
    KEY = ("project", "dims", "tool_name", "agent_id", "grain", "bucket")

    class Meta:
        abstract = True


class RefusalRollup(Tally):
    """Refused proposals counted per project, UTC hour or day of receipt and reason, per
    tool, agent or both: a proposal refused without touching the call it named (TAXONOMY
    v2: ``taxonomy.REFUSALS`` on the proposal event of an existing call), what the reasons
    report counts beside the calls. An event never changes, so ``ingest.batch_write`` adds
    a batch's refusals in its one statement; ``tallies.refusal_rollups_rebuild`` recounts
    a project's from its events (``manage.py backfill_rollups``)."""

    reason = models.CharField(max_length=32)
    proposals = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=[*Tally.KEY, "reason"], name="refusalrollup_cell")
        ]

    def __str__(self) -> str:
        return f"{self.proposals} {self.reason} {self.grain} {self.bucket:%Y-%m-%d %H:00}"


class RollupCube(RollupMeasures):
    """``CallRollup`` summed to fewer dimensions, by hour, UTC day and UTC month: what a
    report reads so that a 30-day report reads about 30 days × (tools or agents or reasons) rows,
    whatever the number of calls (the hourly cells of every tool × agent × reason grow with
    the project's traffic; these do not, once every combination occurs).

    ``dims`` says which dimensions a row keeps (the others are blank / NULL):

    - ``total``: reason, category, route;
    - ``tool``: tool name and contract version, reason, category, route;
    - ``agent``: agent, reason, category, route.

    ``grain`` ``hour``: ``bucket`` is the start of a UTC hour (the sum of that hour's
    ``CallRollup`` rows); ``day``: the start of a UTC day (the sum of its 24 hours);
    ``month``: the start of a UTC month (the sum of its days). Kept
    equal to ``CallRollup`` by ``callgate.reports.rollups`` (rewritten in the transaction
    that rewrites an hour's ``CallRollup`` rows)."""

    class Grain(models.TextChoices):
        HOUR = "hour", "Hour"
        DAY = "day", "Day"
        MONTH = "month", "Month"

    class Dims(models.TextChoices):
        TOTAL = "total", "Reason and route"
        TOOL = "tool", "Tool, contract, reason and route"
        AGENT = "agent", "Agent, reason and route"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    grain = models.CharField(max_length=5, choices=Grain.choices)
    dims = models.CharField(max_length=5, choices=Dims.choices)
    bucket = models.DateTimeField(help_text="Start of the UTC hour or day (``grain``).")
    tool_name = models.CharField(max_length=128, blank=True)
    contract = models.ForeignKey(
        ToolContract, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    agent = models.ForeignKey(
        Agent, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    reason = models.CharField(max_length=32, blank=True)
    category = models.CharField(max_length=20, blank=True)
    route = models.CharField(max_length=20, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=[
                    "project",
                    "dims",
                    "grain",
                    "bucket",
                    "tool_name",
                    "contract",
                    "agent",
                    "reason",
                    "route",
                ],
                name="rollupcube_unique_cell",
                nulls_distinct=False,
            ),
        ]
        # the unique index's leading (project, dims, grain, bucket) serves the reports'
        # range reads: no other index

    def __str__(self) -> str:
        return f"{self.dims}/{self.grain} {self.bucket:%Y-%m-%d %H}h {self.reason}: {self.calls}"


class SavedView(models.Model):
    """A user's named filters and search of the calls list or the review queue: the page's
    query string, opened again from its "Saved views" menu. Only its owner sees it."""

    class Page(models.TextChoices):
        CALLS = "calls", "Calls"
        QUEUE = "queue", "Review queue"

    #: the longest name and query string taken
    NAME_MAX = 80
    QUERY_MAX = 2000

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="saved_views",
        db_index=False,
    )
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="saved_views")
    page = models.CharField(max_length=10, choices=Page.choices)
    name = models.CharField(max_length=NAME_MAX)
    query = models.CharField(max_length=QUERY_MAX, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # one view per name on a page; also serves a page's menu (a user's views of
            # one page of one project, by name)
            models.UniqueConstraint(
                fields=["user", "project", "page", "name"], name="savedview_unique_name"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.page}: {self.name}"
