"""The lifecycle of a ``ToolCall``: its states and the one transition table. Pure: no Django.

Each event kind is allowed in some states only; ``next_state`` raises ``IllegalTransition``
for any other pair. Where an event may legitimately arrive late or out of order (a
receipt after a timeout, a reconciliation of a call an operator already settled) the
table allows it and says what it does. The state after an event follows from the route
of the classification (``STATE_FOR_ROUTE``) with the exceptions spelled out below.
"""

from __future__ import annotations

from callgate.classification import Verdict
from callgate.taxonomy import Choices, Reason, Route


class State(Choices):
    """Where a ``ToolCall`` stands (``ToolCall.state``)."""

    PENDING_APPROVAL = "pending_approval", "Waiting for approval"
    ALLOWED = "allowed", "Allowed"
    RETRY_WAIT = "retry_wait", "Waiting to retry"
    RECONCILING = "reconciling", "Reconciling"
    IN_REVIEW = "in_review", "In review"
    SUCCEEDED = "succeeded", "Succeeded"
    REJECTED = "rejected", "Refused before it ran"  # at the gate, or an approval rejected
    FAILED = "failed", "Failed"


S = State


class IllegalTransition(Exception):
    """An event that the call's state does not allow (e.g. an attempt before approval)."""

    def __init__(self, state: str, kind: str, detail: str = ""):
        self.state, self.kind = state, kind
        super().__init__(detail or f"a {kind!r} event is not allowed while the call is {state!r}")


#: state -> event kinds it accepts. ``None`` is "no call yet".
ALLOWED_EVENTS: dict[str | None, frozenset[str]] = {
    None: frozenset({"proposed"}),
    S.ALLOWED: frozenset({"proposed", "attempt", "denied", "receipt"}),
    # callgate's own events: the deadline sweep, and a look-up that could not tell
    S.RETRY_WAIT: frozenset(
        {"proposed", "attempt", "denied", "receipt", "decision", "deadline_passed"}
    ),
    S.RECONCILING: frozenset(
        {"proposed", "attempt", "reconciled", "reconcile_failed", "receipt", "decision"}
    ),
    S.IN_REVIEW: frozenset(
        {"proposed", "attempt", "reconciled", "reconcile_failed", "receipt", "decision"}
    ),
    S.PENDING_APPROVAL: frozenset({"proposed", "decision", "approval_expired"}),
    # settled states: a re-proposal is a duplicate; late receipts and look-ups are recorded
    S.SUCCEEDED: frozenset({"proposed", "receipt", "reconciled", "attempt"}),
    # refused at the gate, but the runtime may have run it anyway (an unknown tool whose server
    # then answers -32601): the attempt is recorded and classified (TAXONOMY v2 contract_drift)
    S.REJECTED: frozenset({"proposed", "attempt"}),
    S.FAILED: frozenset({"proposed", "receipt", "reconciled"}),
}

#: decisions an operator may take per state
ALLOWED_DECISIONS: dict[str, frozenset[str]] = {
    S.PENDING_APPROVAL: frozenset({"approve", "reject"}),
    S.IN_REVIEW: frozenset({"approve_retry", "reject", "mark_applied", "mark_failed"}),
    S.RECONCILING: frozenset({"approve_retry", "reject", "mark_applied", "mark_failed"}),
    S.RETRY_WAIT: frozenset({"reject", "mark_applied", "mark_failed"}),
    S.REJECTED: frozenset(),
}

STATE_FOR_ROUTE: dict[Route, str] = {
    Route.PROCEED: S.SUCCEEDED,
    Route.REASK: S.FAILED,
    Route.DENY: S.FAILED,
    Route.RETRY: S.RETRY_WAIT,
    Route.RECONCILE: S.RECONCILING,
    Route.RETURN_RECEIPT: S.SUCCEEDED,
    Route.REVIEW: S.IN_REVIEW,
    Route.STOP: S.FAILED,
}


def check(state: str | None, kind: str, *, decision: str | None = None) -> None:
    """Raise ``IllegalTransition`` unless an event of ``kind`` may arrive in ``state``."""
    if kind not in ALLOWED_EVENTS.get(state, frozenset()):
        raise IllegalTransition(state or "new", kind)
    if kind == "decision" and decision not in ALLOWED_DECISIONS.get(state or "", frozenset()):
        raise IllegalTransition(
            state or "new",
            kind,
            f"the decision {decision!r} is not allowed while the call is {state!r}",
        )


def next_state(state: str | None, kind: str, result: Verdict, *, executed: bool) -> str:
    """The state after an event classified as ``result``.

    ``executed``: whether any attempt of the call has been reported (a re-ask before any
    execution leaves the call ``rejected`` at the gate; after one it has ``failed``)."""
    if result.reason in (None, Reason.APPROVAL_GRANTED):  # allowed at the gate, or approved
        return S.ALLOWED
    if (
        result.reason in (Reason.DUPLICATE_SUPPRESSED, Reason.IDEMPOTENCY_MISMATCH)
        and state is not None
    ):
        return state  # the stored call is untouched; the new proposal is answered, not run
    if result.reason == Reason.APPROVAL_PENDING:
        return S.PENDING_APPROVAL
    target = STATE_FOR_ROUTE[result.route]
    if target == S.FAILED and not executed and kind in ("proposed", "decision", "denied"):
        return S.REJECTED
    return target
