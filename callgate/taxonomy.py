"""The diagnostic taxonomy of ``shared/TAXONOMY.md`` (v2): 39 reasons, 12 categories, 8 routes.

The slugs are stable API values: never rename one. Each reason belongs to exactly one
category and implies one route (``reconciled_absent`` is the only reason whose route
depends on the contract: ``retry`` when the target is idempotent, else ``review``).
"""

from __future__ import annotations

from enum import EnumMeta, StrEnum
from typing import Self


class ChoicesType(EnumMeta):
    """The class-level ``choices``, ``values`` and ``labels`` of Django's ``TextChoices``,
    without importing Django, so that this module and the classifier stay pure."""

    @property
    def choices(cls) -> list[tuple[str, str]]:
        return [(member.value, member.label) for member in cls]  # type: ignore[var-annotated]

    @property
    def values(cls) -> list[str]:
        return [member.value for member in cls]  # type: ignore[var-annotated]

    @property
    def labels(cls) -> list[str]:
        return [member.label for member in cls]  # type: ignore[var-annotated]


class Choices(StrEnum, metaclass=ChoicesType):
    """A string enum whose members compare equal to their slug and carry a human ``label``
    (``NAME = "slug", "Label"``; without a label, the slug in words). Model fields take
    ``choices=Reason.choices`` as with ``django.db.models.TextChoices``."""

    _label: str

    def __new__(cls, value: str, label: str | None = None) -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member._label = label or value.replace("_", " ").capitalize()
        return member

    @property
    def label(self) -> str:
        return self._label

    def __str__(self) -> str:
        return self.value


class Route(Choices):
    PROCEED = "proceed", "Proceed"
    REASK = "reask", "Re-ask the model"
    DENY = "deny", "Deny"
    RETRY = "retry", "Retry with backoff"
    RECONCILE = "reconcile", "Reconcile"
    RETURN_RECEIPT = "return_receipt", "Return the receipt"
    REVIEW = "review", "Human review"
    STOP = "stop", "Stop"


class Category(Choices):
    OK = "ok", "OK"
    EMPTY_RESULT = "empty_result", "Empty result"
    ARGUMENT_ERROR = "argument_error", "Argument error"
    HALLUCINATION = "hallucination", "Hallucination"
    DENIED = "denied", "Denied"
    TRANSIENT = "transient", "Transient"
    UNKNOWN_OUTCOME = "unknown_outcome", "Unknown outcome"
    TOOL_ERROR = "tool_error", "Tool error"
    DUPLICATE = "duplicate", "Duplicate"
    EXHAUSTED = "exhausted", "Exhausted"
    RECONCILIATION = "reconciliation", "Reconciliation"
    APPROVAL = "approval", "Approval"


class Reason(Choices):
    OK = "ok", "OK"
    EMPTY_RESULT = "empty_result", "Empty result"
    MALFORMED_CALL = "malformed_call", "Malformed call"
    INVALID_JSON = "invalid_json", "Invalid JSON arguments"
    MISSING_REQUIRED = "missing_required", "Missing required argument"
    TYPE_MISMATCH = "type_mismatch", "Wrong argument type"
    ENUM_VIOLATION = "enum_violation", "Value not allowed"
    CONSTRAINT_VIOLATION = "constraint_violation", "Argument out of bounds"
    DUPLICATE_CALL_ID = "duplicate_call_id", "Duplicate call ID"  # v2
    MISSING_CALL_ID = "missing_call_id", "Missing call ID"  # v2
    UNKNOWN_TOOL = "unknown_tool", "Unknown tool"
    UNKNOWN_ARGUMENT = "unknown_argument", "Unknown argument"
    REFERENCE_NOT_FOUND = "reference_not_found", "Reference not found"
    PERMISSION_DENIED = "permission_denied", "Permission denied"
    NOT_FOUND_OR_FORBIDDEN = "not_found_or_forbidden", "Not found or forbidden"  # v2
    AUTHENTICATION_FAILED = "authentication_failed", "Authentication failed"
    RATE_LIMITED = "rate_limited", "Rate limited"
    UNAVAILABLE = "unavailable", "Target unavailable"
    CIRCUIT_OPEN = "circuit_open", "Circuit open"
    READ_FAILURE = "read_failure", "Read failed"
    OUTCOME_UNKNOWN = "outcome_unknown", "Outcome unknown"
    NOT_RECONCILABLE = "not_reconcilable", "Outcome unknown, no look-up"
    TOOL_ERROR = "tool_error", "Tool error"
    PARTIAL_FAILURE = "partial_failure", "Partly failed"  # v2
    CONTRACT_DRIFT = "contract_drift", "Contract drift"  # v2
    CONFLICT = "conflict", "Conflict"
    DUPLICATE_SUPPRESSED = "duplicate_suppressed", "Duplicate answered with receipt"
    DUPLICATE_IN_FLIGHT = "duplicate_in_flight", "Duplicate while in flight"  # v2
    IDEMPOTENCY_MISMATCH = "idempotency_mismatch", "Operation ID reused with other arguments"
    RETRY_EXHAUSTED = "retry_exhausted", "Retries exhausted"
    REASK_EXHAUSTED = "reask_exhausted", "Re-asks exhausted"
    LOOP_DETECTED = "loop_detected", "Loop detected"  # v2
    RECONCILED_APPLIED = "reconciled_applied", "Reconciled: it happened"
    RECONCILED_ABSENT = "reconciled_absent", "Reconciled: it did not happen"
    RECONCILE_MISMATCH = "reconcile_mismatch", "Reconciled: different arguments"
    APPROVAL_PENDING = "approval_pending", "Waiting for approval"
    APPROVAL_GRANTED = "approval_granted", "Approved"  # v2
    APPROVAL_REJECTED = "approval_rejected", "Approval rejected"
    APPROVAL_EXPIRED = "approval_expired", "Approval expired"


R, C, T = Reason, Category, Route

#: reason -> (category, route). ``reconciled_absent`` lists its non-idempotent route.
TABLE: dict[Reason, tuple[Category, Route]] = {
    R.OK: (C.OK, T.PROCEED),
    R.EMPTY_RESULT: (C.EMPTY_RESULT, T.PROCEED),
    R.MALFORMED_CALL: (C.ARGUMENT_ERROR, T.REASK),
    R.INVALID_JSON: (C.ARGUMENT_ERROR, T.REASK),
    R.MISSING_REQUIRED: (C.ARGUMENT_ERROR, T.REASK),
    R.TYPE_MISMATCH: (C.ARGUMENT_ERROR, T.REASK),
    R.ENUM_VIOLATION: (C.ARGUMENT_ERROR, T.REASK),
    R.CONSTRAINT_VIOLATION: (C.ARGUMENT_ERROR, T.REASK),
    R.DUPLICATE_CALL_ID: (C.ARGUMENT_ERROR, T.REASK),
    R.MISSING_CALL_ID: (C.ARGUMENT_ERROR, T.REASK),
    R.UNKNOWN_TOOL: (C.HALLUCINATION, T.REASK),
    R.UNKNOWN_ARGUMENT: (C.HALLUCINATION, T.REASK),
    R.REFERENCE_NOT_FOUND: (C.HALLUCINATION, T.REASK),
    R.PERMISSION_DENIED: (C.DENIED, T.DENY),
    R.NOT_FOUND_OR_FORBIDDEN: (C.DENIED, T.REVIEW),
    R.AUTHENTICATION_FAILED: (C.DENIED, T.REVIEW),
    R.RATE_LIMITED: (C.TRANSIENT, T.RETRY),
    R.UNAVAILABLE: (C.TRANSIENT, T.RETRY),
    R.CIRCUIT_OPEN: (C.TRANSIENT, T.RETRY),
    R.READ_FAILURE: (C.TRANSIENT, T.RETRY),
    R.OUTCOME_UNKNOWN: (C.UNKNOWN_OUTCOME, T.RECONCILE),
    R.NOT_RECONCILABLE: (C.UNKNOWN_OUTCOME, T.REVIEW),
    R.TOOL_ERROR: (C.TOOL_ERROR, T.REASK),
    R.PARTIAL_FAILURE: (C.TOOL_ERROR, T.REASK),
    R.CONTRACT_DRIFT: (C.TOOL_ERROR, T.REVIEW),
    R.CONFLICT: (C.TOOL_ERROR, T.REVIEW),
    R.DUPLICATE_SUPPRESSED: (C.DUPLICATE, T.RETURN_RECEIPT),
    R.DUPLICATE_IN_FLIGHT: (C.DUPLICATE, T.DENY),
    R.IDEMPOTENCY_MISMATCH: (C.DUPLICATE, T.DENY),
    R.RETRY_EXHAUSTED: (C.EXHAUSTED, T.REVIEW),
    R.REASK_EXHAUSTED: (C.EXHAUSTED, T.STOP),
    R.LOOP_DETECTED: (C.EXHAUSTED, T.STOP),
    R.RECONCILED_APPLIED: (C.RECONCILIATION, T.RETURN_RECEIPT),
    R.RECONCILED_ABSENT: (C.RECONCILIATION, T.REVIEW),
    R.RECONCILE_MISMATCH: (C.RECONCILIATION, T.REVIEW),
    R.APPROVAL_PENDING: (C.APPROVAL, T.REVIEW),
    R.APPROVAL_GRANTED: (C.APPROVAL, T.PROCEED),
    R.APPROVAL_REJECTED: (C.APPROVAL, T.DENY),
    R.APPROVAL_EXPIRED: (C.APPROVAL, T.STOP),
}

#: Reasons the model can fix by proposing again; they spend the re-ask budget.
REASK_REASONS = frozenset(r for r, (_, route) in TABLE.items() if route == T.REASK)

#: Sticky refusals (TAXONOMY v2): within one request, the same tool and canonical
#: arguments get the same refusal again, at the gate, without execution.
STICKY_REASONS = frozenset({R.PERMISSION_DENIED, R.APPROVAL_REJECTED, R.APPROVAL_EXPIRED})

#: The reasons a look-up of the operation in its target answers (TAXONOMY "reconcile": the
#: outcome of a write is unknown): a reconciliation result (``reconciled_applied``,
#: ``reconciled_absent``, ``reconcile_mismatch``) replaces them, and a newer look-up replaces
#: an older one's. Every other failure is the target's own answer (409 conflict, 403, 401,
#: 422, …) or a refusal before execution: a look-up that finds nothing, or another record,
#: tells nothing new about it, so that reason stands (``classification.classify_reconciled``).
LOOKUP_ANSWERS = frozenset(
    {
        R.OUTCOME_UNKNOWN,
        R.NOT_RECONCILABLE,
        R.RETRY_EXHAUSTED,
        R.RECONCILED_APPLIED,
        R.RECONCILED_ABSENT,
        R.RECONCILE_MISMATCH,
    }
)

#: Reasons that refuse a proposal without touching a call that already exists under its
#: operation ID: the refusal lives on its own event (TAXONOMY v2 "Sticky refusals"), and the
#: reports count such refused proposals beside the calls.
REFUSALS = frozenset(
    {
        R.IDEMPOTENCY_MISMATCH,
        R.DUPLICATE_SUPPRESSED,
        R.DUPLICATE_IN_FLIGHT,
        R.LOOP_DETECTED,
        *STICKY_REASONS,
    }
)

#: Precedence when several rules match one proposal (first wins). A sticky refusal
#: (``STICKY_REASONS``) stands between ``loop_detected`` and ``idempotency_mismatch``.
PROPOSAL_PRECEDENCE: tuple[Reason, ...] = (
    R.MALFORMED_CALL,
    R.UNKNOWN_TOOL,
    R.INVALID_JSON,
    R.MISSING_CALL_ID,
    R.DUPLICATE_CALL_ID,
    R.LOOP_DETECTED,
    R.IDEMPOTENCY_MISMATCH,
    R.DUPLICATE_IN_FLIGHT,
    R.DUPLICATE_SUPPRESSED,
    R.UNKNOWN_ARGUMENT,
    R.MISSING_REQUIRED,
    R.TYPE_MISMATCH,
    R.ENUM_VIOLATION,
    R.CONSTRAINT_VIOLATION,
)


def category_of(reason: Reason | str) -> Category:
    return TABLE[Reason(reason)][0]


def route_of(reason: Reason | str, *, idempotent: bool = False) -> Route:
    """The route a reason implies; ``reconciled_absent`` retries only on idempotent targets."""
    reason = Reason(reason)
    if reason == R.RECONCILED_ABSENT and idempotent:
        return T.RETRY
    return TABLE[reason][1]
