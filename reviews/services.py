"""Writes of the review queue.

Every state change of a ``ReviewItem`` is a compare-and-swap UPDATE
(``filter(pk=…, status=<expected>).update(…)`` checking the row count) plus a
``ReviewAudit`` row, in one transaction. Two operators acting on one item at once:
exactly one UPDATE matches, the other gets ``ReviewConflict`` (the view answers 409
with the item's current state).

Decisions change the CALL only through the core's ``callgate.services.call_apply_decision``
(and ``call_approval_expired``); webhooks and reconciliation are enqueued on commit.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from callgate import services as core_services
from callgate.lifecycle import IllegalTransition
from callgate.models import Membership, ToolCall, ToolContract
from reviews.models import ReviewAudit, ReviewItem
from reviews.selectors import absent_reconciliations

logger = logging.getLogger(__name__)


#: Lower is more urgent: unknown outcomes of writes and approvals first.
PRIORITY_BY_REASON = {
    "approval_pending": 0,
    "not_reconcilable": 1,
    "reconcile_mismatch": 1,
    "reconciled_absent": 1,
    "outcome_unknown": 1,
    "retry_exhausted": 2,
    "conflict": 2,
    "authentication_failed": 3,
}

#: Decisions an operator can take, and the audit action each records.
DECISIONS = {
    "approve": ReviewAudit.Action.APPROVE,
    "approve_retry": ReviewAudit.Action.APPROVE_RETRY,
    "reject": ReviewAudit.Action.REJECT,
    "mark_applied": ReviewAudit.Action.MARK_APPLIED,
    "mark_failed": ReviewAudit.Action.MARK_FAILED,
}
#: Decisions that need a written reason (they end the call or act on an unknown outcome).
DECISIONS_NEEDING_REASON = {"reject", "mark_failed"}
#: Reasons of a write call whose outcome is unknown: approving a retry needs proof of absence.
UNKNOWN_OUTCOME_REASONS = {
    "outcome_unknown",
    "not_reconcilable",
    "retry_exhausted",
    "reconcile_mismatch",
}
#: Preset rejection reasons (the text becomes the observation the agent reads).
REJECT_PRESETS = [
    "Not allowed for this customer.",
    "Duplicate of an earlier request; do not repeat it.",
    "Arguments look wrong; ask the user to confirm the details.",
    "Out of policy; escalate to a human agent.",
]
#: Longest extension of an approval timeout in one step (seconds).
MAX_EXTEND_SECONDS = 24 * 3600
#: Most items one bulk action touches.
BULK_LIMIT = 1000


class ReviewError(Exception):
    """An action that cannot be done (bad input, guard, wrong kind). The message is for the operator."""


class ReviewConflict(ReviewError):
    """Someone else changed the item first. ``item`` is its current state."""

    def __init__(self, message: str, *, item: ReviewItem):
        super().__init__(message)
        self.item = item


def _lease() -> timedelta:
    return timedelta(seconds=settings.CALLGATE_REVIEW_CLAIM_LEASE)


def _audit(
    *,
    item: ReviewItem,
    actor,
    action: str,
    before: str,
    after: str,
    reason: str = "",
    override: bool = False,
    call_before: str = "",
    call_after: str = "",
    detail: dict | None = None,
) -> ReviewAudit:
    return ReviewAudit.objects.create(
        project_id=item.project_id,
        item=item,
        actor=actor,
        action=action,
        state_before=before,
        state_after=after,
        reason=reason,
        override=override,
        call_state_before=call_before,
        call_state_after=call_after,
        detail=detail or {},
    )


def _conflict(item: ReviewItem, user, verb: str) -> ReviewConflict:
    fresh = ReviewItem.objects.select_related("assignee", "resolved_by").get(pk=item.pk)
    if (
        fresh.status in ReviewItem.OPEN_STATUSES
        and fresh.lease_active()
        and fresh.assignee_id != user.pk
    ):
        who = fresh.assignee.get_username()
        msg = f"Could not {verb}: {who} claimed this item."
    elif fresh.status == ReviewItem.Status.RESOLVED:
        who = fresh.resolved_by.get_username() if fresh.resolved_by else "someone"
        msg = f"Could not {verb}: {who} already decided this item ({fresh.resolution})."
    elif fresh.status in (ReviewItem.Status.EXPIRED, ReviewItem.Status.SETTLED):
        msg = f"Could not {verb}: the item is {fresh.get_status_display().lower()}."
    else:
        msg = f"Could not {verb}: the item changed meanwhile. Here is its current state."
    return ReviewConflict(msg, item=fresh)


def _actionable(user, now) -> Q:
    """Open items, or claimed ones whose claim is the user's own or has lapsed."""
    return Q(status=ReviewItem.Status.OPEN) | Q(status=ReviewItem.Status.CLAIMED) & (
        Q(assignee=user) | Q(assignee__isnull=True) | Q(lease_expires_at__lte=now)
    )


# --- called by the core lifecycle ----------------------------------------------------------


def review_item_open(*, call: ToolCall, kind: str = ReviewItem.Kind.ESCALATION) -> ReviewItem:
    """Open an item for ``call`` unless one is open already (at most one per call)."""
    return _open_one(call=call, kind=kind)


def _open_one(*, call: ToolCall, kind: str) -> ReviewItem:
    existing = ReviewItem.objects.filter(call=call, status__in=ReviewItem.OPEN_STATUSES).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            item = ReviewItem.objects.create(
                project_id=call.project_id,
                call=call,
                kind=kind,
                reason=call.reason,
                priority=PRIORITY_BY_REASON.get(call.reason, 2),
                approval_expires_at=call.approval_expires_at
                if kind == ReviewItem.Kind.APPROVAL
                else None,
            )
            _audit(
                item=item,
                actor=None,
                action=ReviewAudit.Action.OPENED,
                before="",
                after=item.status,
                reason=call.reason,
                call_after=call.state,
            )
            return item
    except IntegrityError:  # a concurrent request opened it first
        return ReviewItem.objects.get(call=call, status__in=ReviewItem.OPEN_STATUSES)


def review_items_settle(*, call: ToolCall, note: str) -> int:
    """Close the call's open items because a later event settled the call."""
    return review_items_settle_bulk(calls=[call], note_by_call={call.pk: note})


def _settled_status(call: ToolCall) -> str:
    """An approval that ran out is ``expired`` (whoever noticed first); anything else ``settled``."""
    return (
        ReviewItem.Status.EXPIRED
        if call.reason == "approval_expired"
        else ReviewItem.Status.SETTLED
    )


def review_items_open_bulk(*, calls: list[tuple[ToolCall, str]]) -> list[ReviewItem]:
    """``review_item_open`` for many calls at once (the ingest engine's batch save):
    ``calls`` is ``[(call, kind), …]``. Two queries plus the inserts; falls back to one
    call at a time if a concurrent request opened one of them first."""
    if not calls:
        return []
    existing = {
        i.call_id: i
        for i in ReviewItem.objects.filter(
            call__in=[c for c, _ in calls], status__in=ReviewItem.OPEN_STATUSES
        )
    }
    new = [
        ReviewItem(
            project_id=call.project_id,
            call=call,
            kind=kind,
            reason=call.reason,
            priority=PRIORITY_BY_REASON.get(call.reason, 2),
            approval_expires_at=call.approval_expires_at
            if kind == ReviewItem.Kind.APPROVAL
            else None,
        )
        for call, kind in calls
        if call.pk not in existing
    ]
    if not new:
        return list(existing.values())
    try:
        with transaction.atomic():
            created = ReviewItem.objects.bulk_create(new)
            ReviewAudit.objects.bulk_create(
                [
                    ReviewAudit(
                        project_id=i.project_id,
                        item=i,
                        action=ReviewAudit.Action.OPENED,
                        state_after=i.status,
                        reason=i.reason,
                        call_state_after=i.call.state,
                    )
                    for i in created
                ]
            )
    except IntegrityError:  # someone opened one meanwhile: do it one by one
        created = [
            _open_one(call=call, kind=kind) for call, kind in calls if call.pk not in existing
        ]
    return list(existing.values()) + created


def review_items_settle_bulk(*, calls: list[ToolCall], note_by_call: dict[int, str]) -> int:
    """``review_items_settle`` for many calls (the ingest engine's batch save); the note of
    each call is ``note_by_call[call.pk]``. The open items are locked, closed and audited.
    Returns how many were closed."""
    if not calls:
        return 0
    by_pk = {c.pk: c for c in calls}
    now = timezone.now()
    with transaction.atomic():
        items = list(
            ReviewItem.objects.select_for_update()
            .filter(call_id__in=by_pk, status__in=ReviewItem.OPEN_STATUSES)
            .only("pk", "project_id", "call_id", "status")
        )
        groups: dict[tuple[str, str], list[int]] = {}
        for item in items:
            call = by_pk[item.call_id]
            groups.setdefault((_settled_status(call), note_by_call.get(call.pk, "")), []).append(
                item.pk
            )
        closed = 0
        for (status, note), pks in groups.items():
            closed += ReviewItem.objects.filter(
                pk__in=pks, status__in=ReviewItem.OPEN_STATUSES
            ).update(
                status=status,
                resolution=status,
                resolution_reason=note,
                resolved_at=now,
                updated_at=now,
                assignee=None,
                lease_expires_at=None,
            )
        for item in items:  # an expired approval: tell the agent, as review_items_expire does
            if _settled_status(by_pk[item.call_id]) == ReviewItem.Status.EXPIRED:
                _enqueue_webhook(item=item, call=by_pk[item.call_id])
        ReviewAudit.objects.bulk_create(
            [
                ReviewAudit(
                    project_id=i.project_id,
                    item_id=i.pk,
                    action=ReviewAudit.Action.SETTLED
                    if _settled_status(by_pk[i.call_id]) == ReviewItem.Status.SETTLED
                    else ReviewAudit.Action.EXPIRED,
                    state_before=i.status,
                    state_after=_settled_status(by_pk[i.call_id]),
                    reason=note_by_call.get(i.call_id, ""),
                    call_state_after=by_pk[i.call_id].state,
                )
                for i in items
            ]
        )
    return closed


# --- claims ---------------------------------------------------------------------------------


def review_item_claim(*, item: ReviewItem, user) -> ReviewItem:
    """Claim ``item`` for ``user`` (or renew the user's own lease). A lapsed claim of
    someone else can be taken over. Raises ReviewConflict when another live claim or a
    decision got there first."""
    now = timezone.now()
    with transaction.atomic():
        won = (
            ReviewItem.objects.filter(pk=item.pk)
            .filter(_actionable(user, now))
            .update(
                status=ReviewItem.Status.CLAIMED,
                assignee=user,
                claimed_at=now,
                lease_expires_at=now + _lease(),
                updated_at=now,
            )
        )
        if not won:
            raise _conflict(item, user, "claim")
        _audit(
            item=item,
            actor=user,
            action=ReviewAudit.Action.CLAIM,
            before=item.status,
            after=ReviewItem.Status.CLAIMED,
            detail={"previous_assignee": item.assignee_id}
            if item.assignee_id not in (None, user.pk)
            else None,
        )
    item.refresh_from_db()
    return item


def review_item_release(*, item: ReviewItem, user) -> ReviewItem:
    """Give up the user's claim (back to open). Raises ReviewConflict if it is not theirs."""
    now = timezone.now()
    with transaction.atomic():
        won = ReviewItem.objects.filter(
            pk=item.pk, status=ReviewItem.Status.CLAIMED, assignee=user
        ).update(
            status=ReviewItem.Status.OPEN,
            assignee=None,
            claimed_at=None,
            lease_expires_at=None,
            updated_at=now,
        )
        if not won:
            raise _conflict(item, user, "release")
        _audit(
            item=item,
            actor=user,
            action=ReviewAudit.Action.RELEASE,
            before=ReviewItem.Status.CLAIMED,
            after=ReviewItem.Status.OPEN,
        )
    item.refresh_from_db()
    return item


def review_item_assign(*, item: ReviewItem, user, assignee) -> ReviewItem:
    """Assign an open (or lapsed, or own) item to ``assignee``, an operator of the item's
    project; ``assignee=None`` unassigns. Raises ReviewError for a non-operator."""
    if assignee is not None:
        membership = Membership.objects.filter(user=assignee, project_id=item.project_id).first()
        if membership is None or not membership.has_role(Membership.Role.OPERATOR):
            raise ReviewError("Items can only be assigned to operators of this project.")
    now = timezone.now()
    with transaction.atomic():
        if assignee is None:
            values = dict(
                status=ReviewItem.Status.OPEN, assignee=None, claimed_at=None, lease_expires_at=None
            )
        else:
            values = dict(
                status=ReviewItem.Status.CLAIMED,
                assignee=assignee,
                claimed_at=now,
                lease_expires_at=now + _lease(),
            )
        won = (
            ReviewItem.objects.filter(pk=item.pk)
            .filter(_actionable(user, now))
            .update(updated_at=now, **values)
        )
        if not won:
            raise _conflict(item, user, "assign")
        _audit(
            item=item,
            actor=user,
            action=ReviewAudit.Action.ASSIGN,
            before=item.status,
            after=values["status"],
            detail={"assignee": assignee.get_username() if assignee else None},
        )
    item.refresh_from_db()
    return item


def review_leases_lapse(*, now=None) -> int:
    """Return claimed items whose lease ran out to ``open`` (periodic). Returns how many."""
    now = now or timezone.now()
    lapsed = 0
    for item in ReviewItem.objects.filter(
        status=ReviewItem.Status.CLAIMED, lease_expires_at__lte=now
    )[:BULK_LIMIT]:
        with transaction.atomic():
            won = ReviewItem.objects.filter(
                pk=item.pk, status=ReviewItem.Status.CLAIMED, lease_expires_at__lte=now
            ).update(
                status=ReviewItem.Status.OPEN,
                assignee=None,
                claimed_at=None,
                lease_expires_at=None,
                updated_at=now,
            )
            if won:
                lapsed += 1
                _audit(
                    item=item,
                    actor=None,
                    action=ReviewAudit.Action.LEASE_LAPSED,
                    before=ReviewItem.Status.CLAIMED,
                    after=ReviewItem.Status.OPEN,
                    detail={"assignee": item.assignee_id},
                )
    return lapsed


def _touch_lease(item: ReviewItem, user, now) -> None:
    """Activity by the assignee keeps the claim alive."""
    ReviewItem.objects.filter(pk=item.pk, status=ReviewItem.Status.CLAIMED, assignee=user).update(
        lease_expires_at=now + _lease(), updated_at=now
    )


# --- comments, reconciliation, approval timeout ------------------------------------------------


def review_item_comment(*, item: ReviewItem, user, text: str) -> ReviewAudit:
    """Add a comment (an audit row). Works on closed items too. Raises ReviewError when empty."""
    text = (text or "").strip()
    if not text:
        raise ReviewError("Write a comment first.")
    if len(text) > 5000:
        raise ReviewError("Comments are limited to 5,000 characters.")
    now = timezone.now()
    with transaction.atomic():
        _touch_lease(item, user, now)
        return _audit(
            item=item,
            actor=user,
            action=ReviewAudit.Action.COMMENT,
            before=item.status,
            after=item.status,
            reason=text,
        )


def reconcile_unavailable_reason(call: ToolCall) -> str:
    """Why "Reconcile now" cannot run for ``call`` ("" when it can)."""
    contract = call.contract
    if contract is None:
        return "No contract for this tool, so callgate cannot look the operation up."
    if contract.reconcile_method != ToolContract.ReconcileMethod.HTTP:
        return (
            f"{contract} has no HTTP reconcile method; check the target yourself, then mark applied or failed."
            if contract.reconcile_method == ToolContract.ReconcileMethod.NONE
            else f"{contract} is reconciled by the agent; wait for its report or check the target yourself."
        )
    return ""


def review_item_reconcile(*, item: ReviewItem, user) -> ReviewAudit:
    """Ask the core to look the operation up in the target now (``callgate.tasks.reconcile_call``,
    enqueued on commit). Raises ReviewError when the contract has no HTTP reconcile method
    or the item is closed. The returned audit row's ``created_at`` marks the request: the
    item page polls until a ``reconciled`` CallEvent newer than it appears."""
    if not item.is_open:
        raise ReviewError("This item is closed.")
    why = reconcile_unavailable_reason(item.call)
    if why:
        raise ReviewError(why)
    now = timezone.now()
    call_pk = item.call_id
    with transaction.atomic():
        _touch_lease(item, user, now)
        row = _audit(
            item=item,
            actor=user,
            action=ReviewAudit.Action.RECONCILE,
            before=item.status,
            after=item.status,
            call_before=item.call.state,
            call_after=item.call.state,
        )
        transaction.on_commit(lambda: _enqueue_reconcile(call_pk))
    return row


def _enqueue_reconcile(call_pk: int) -> None:
    from callgate.tasks import reconcile_call

    reconcile_call.delay(call_pk, manual=True)


def review_item_extend(*, item: ReviewItem, user, seconds: int) -> ReviewItem:
    """Push an open approval item's timeout ``seconds`` later (from the later of now and the
    current expiry), on the item and the call. Raises ReviewError for a bad request,
    ReviewConflict when the item closed meanwhile."""
    if item.kind != ReviewItem.Kind.APPROVAL:
        raise ReviewError("Only approval requests have a timeout.")
    if not 0 < seconds <= MAX_EXTEND_SECONDS:
        raise ReviewError(f"Extend by 1 second to {MAX_EXTEND_SECONDS // 3600} hours.")
    now = timezone.now()
    base = max(now, item.approval_expires_at or now)
    new_expiry = base + timedelta(seconds=seconds)
    with transaction.atomic():
        won = (
            ReviewItem.objects.filter(pk=item.pk, approval_expires_at=item.approval_expires_at)
            .filter(_actionable(user, now))
            .update(approval_expires_at=new_expiry, updated_at=now)
        )
        if not won:
            raise _conflict(item, user, "extend the timeout")
        core_services.call_approval_extend(call=item.call, expires_at=new_expiry)
        _touch_lease(item, user, now)
        _audit(
            item=item,
            actor=user,
            action=ReviewAudit.Action.EXTEND,
            before=item.status,
            after=item.status,
            detail={
                "from": item.approval_expires_at.isoformat() if item.approval_expires_at else None,
                "to": new_expiry.isoformat(),
                "seconds": seconds,
            },
        )
    item.refresh_from_db()
    return item


def review_items_expire(*, now=None) -> int:
    """End approval items whose timeout passed (periodic): item ``expired``, the call through
    ``call_approval_expired`` (never an approval), the agent told by webhook. Returns how many."""
    now = now or timezone.now()
    due = ReviewItem.objects.filter(
        kind=ReviewItem.Kind.APPROVAL,
        status__in=ReviewItem.OPEN_STATUSES,
        approval_expires_at__lte=now,
    ).select_related("call")[:BULK_LIMIT]
    expired = 0
    for item in due:
        try:
            with transaction.atomic():
                won = ReviewItem.objects.filter(
                    pk=item.pk, status__in=ReviewItem.OPEN_STATUSES, approval_expires_at__lte=now
                ).update(
                    status=ReviewItem.Status.EXPIRED,
                    resolution="expired",
                    resolved_at=now,
                    updated_at=now,
                    assignee=None,
                    lease_expires_at=None,
                )
                if not won:
                    continue
                call_before = item.call.state
                call = core_services.call_approval_expired(call=item.call)
                _audit(
                    item=item,
                    actor=None,
                    action=ReviewAudit.Action.EXPIRED,
                    before=item.status,
                    after=ReviewItem.Status.EXPIRED,
                    call_before=call_before,
                    call_after=call.state,
                    reason="No decision before the approval timeout.",
                )
                _enqueue_webhook(item=item, call=call)
                expired += 1
        except IllegalTransition:
            logger.warning(
                "approval of call %s could not expire: call state %s", item.call_id, item.call.state
            )
    return expired


# --- decisions ---------------------------------------------------------------------------------


def reconciled_absent(call: ToolCall) -> bool:
    """True when a reconciliation of ``call`` found nothing in the target AFTER the call's
    latest ``attempt`` (by received_at, then id): a look-up from before a later attempt says
    nothing about that attempt (see ``selectors.absent_reconciliations``)."""
    return absent_reconciliations().filter(call=call).exists()


def approve_retry_guard(call: ToolCall, *, absent: bool | None = None) -> str:
    """Why approving a retry needs an override ("" when it does not): a WRITE whose
    outcome is unknown may already have happened; retrying it blindly could do it twice.
    ``absent`` (whether a reconciliation found nothing) saves the query when known."""
    is_write = call.contract is None or call.contract.effect == ToolContract.Effect.WRITE
    if not (is_write and call.reason in UNKNOWN_OUTCOME_REASONS):
        return ""
    if not (reconciled_absent(call) if absent is None else absent):
        return "Approve retry needs a reconciliation that found nothing, or an override reason."
    return ""


#: Why the queue's one-key approve of an approval request is off until the operator claimed it.
QUEUE_APPROVE_NEEDS_CLAIM = (
    "Claim it first (c), or open it (Enter) to check the arguments: "
    "approving lets the agent execute the call."
)


def queue_approve_action(item: ReviewItem, *, user=None) -> tuple[str, str]:
    """The queue's one-key approve for a row: (decision, why it is unavailable or "").
    Approving an approval request from the list is a blind write, so it needs the row to be
    claimed by ``user`` (a live lease) first. Uses ``item.has_absent`` (set by
    ``reviews.selectors.annotate_rows`` for a page) instead of a query per row."""
    if not item.is_open:
        return "", "closed"
    if item.kind == ReviewItem.Kind.APPROVAL:
        mine = user is not None and item.lease_active() and item.assignee_id == user.pk
        return "approve", "" if mine else QUEUE_APPROVE_NEEDS_CLAIM
    return "approve_retry", approve_retry_guard(item.call, absent=getattr(item, "has_absent", None))


def allowed_decisions(item: ReviewItem) -> dict[str, str]:
    """Each decision → "" if it can be taken, else why not (shown on the disabled button)."""
    if not item.is_open:
        why = f"The item is {item.get_status_display().lower()}."
        return {d: why for d in DECISIONS}
    state = item.call.state
    if item.kind == ReviewItem.Kind.APPROVAL:
        why_not = "Only for escalated calls; this one waits for approval."
        return {
            "approve": "" if state == ToolCall.State.PENDING_APPROVAL else f"The call is {state}.",
            "reject": "",
            "approve_retry": why_not,
            "mark_applied": why_not,
            "mark_failed": why_not,
        }
    return {
        "approve": "Only for calls waiting for approval before execution.",
        "approve_retry": approve_retry_guard(item.call),
        "reject": "",
        "mark_applied": "",
        "mark_failed": "",
    }


def review_item_decide(
    *, item: ReviewItem, user, decision: str, reason: str = "", override: bool = False
) -> ReviewItem:
    """Decide ``item``: close it (compare-and-swap on its open status) and change its call
    through ``call_apply_decision``, in one transaction; then tell the agent's webhook.

    ``override=True`` with a written ``reason`` approves a retry despite the unknown-outcome
    guard (audited as an override). Raises ReviewError (bad input, guard, illegal for the
    call's state: nothing is changed) or ReviewConflict (someone else acted first)."""
    if decision not in DECISIONS:
        raise ReviewError(f"Unknown decision {decision!r}.")
    reason = (reason or "").strip()
    if decision in DECISIONS_NEEDING_REASON and not reason:
        raise ReviewError("Give a reason: it becomes the observation the agent reads.")
    why_not = allowed_decisions(item).get(decision, "")
    used_override = False
    if (
        why_not
        and decision == "approve_retry"
        and item.is_open
        and why_not == approve_retry_guard(item.call)
    ):
        if not override:
            raise ReviewError(why_not)
        if not reason:
            raise ReviewError("An override needs a written reason.")
        used_override = True
    elif why_not and item.is_open:
        raise ReviewError(why_not)
    now = timezone.now()
    try:
        with transaction.atomic():
            won = (
                ReviewItem.objects.filter(pk=item.pk)
                .filter(_actionable(user, now))
                .update(
                    status=ReviewItem.Status.RESOLVED,
                    resolution=decision,
                    resolution_reason=reason,
                    resolved_by=user,
                    resolved_at=now,
                    updated_at=now,
                    lease_expires_at=None,
                )
            )
            if not won:
                raise _conflict(item, user, decision.replace("_", " "))
            call = ToolCall.objects.select_for_update().get(pk=item.call_id)
            call_before = call.state
            call = core_services.call_apply_decision(
                call=call, decision=decision, reason=reason, user=user
            )
            _audit(
                item=item,
                actor=user,
                action=DECISIONS[decision],
                before=item.status,
                after=ReviewItem.Status.RESOLVED,
                reason=reason,
                override=used_override,
                call_before=call_before,
                call_after=call.state,
            )
            _enqueue_webhook(item=item, call=call)
    except IllegalTransition as exc:
        raise ReviewError(
            f"The call's state does not allow this any more ({exc}). Reload to see it."
        ) from exc
    item.refresh_from_db()
    return item


# --- bulk ----------------------------------------------------------------------------------------


@dataclass
class BulkResult:
    done: int = 0
    conflicts: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.done + self.conflicts + len(self.errors)


def review_items_bulk(
    *, project, user, action: str, items, reason: str = "", assignee=None
) -> BulkResult:
    """Apply ``action`` ("reject", "assign", "claim") to ``items`` (a queryset the caller
    built at execution time: explicit ids or a re-applied filter), at most BULK_LIMIT.
    Conflicts (items someone else holds or decided) are counted, not fatal.

    Claims and assignments are set-based: one locking read of the actionable items, one
    UPDATE, one insert of the audit rows, whatever the number of items. Rejections change
    each call through the core's decision path, one item at a time."""
    if action not in {"reject", "assign", "claim"}:
        raise ReviewError(f"Unknown bulk action {action!r}.")
    if action == "reject" and not (reason or "").strip():
        raise ReviewError("Give a reason for the rejection.")
    if action == "assign" and assignee is not None:
        membership = Membership.objects.filter(user=assignee, project=project).first()
        if membership is None or not membership.has_role(Membership.Role.OPERATOR):
            raise ReviewError("Items can only be assigned to operators of this project.")
    chosen = items.filter(project=project)
    if action in ("claim", "assign"):
        return _bulk_take(
            project=project,
            user=user,
            ids=list(chosen.values_list("pk", flat=True)[:BULK_LIMIT]),
            assignee=user if action == "claim" else assignee,
            action=action,
        )
    result = BulkResult()
    for item in chosen.select_related("call", "call__contract")[:BULK_LIMIT]:
        try:
            review_item_decide(item=item, user=user, decision="reject", reason=reason)
            result.done += 1
        except ReviewConflict:
            result.conflicts += 1
        except ReviewError as exc:
            result.errors.append(f"#{item.pk}: {exc}")
    return result


def _bulk_take(*, project, user, ids: list[int], assignee, action: str) -> BulkResult:
    """Claim (``assignee`` is the user) or assign (``assignee`` another operator, or None
    to unassign) the items ``ids`` that are actionable for ``user`` now, in one transaction:
    lock them, one UPDATE, one audit insert. The others are conflicts."""
    now = timezone.now()
    if assignee is None:
        values = dict(
            status=ReviewItem.Status.OPEN, assignee=None, claimed_at=None, lease_expires_at=None
        )
    else:
        values = dict(
            status=ReviewItem.Status.CLAIMED,
            assignee=assignee,
            claimed_at=now,
            lease_expires_at=now + _lease(),
        )
    with transaction.atomic():
        taken = list(
            ReviewItem.objects.select_for_update()
            .filter(pk__in=ids, project=project)
            .filter(_actionable(user, now))
            .order_by("pk")
            .values_list("pk", "status", "assignee_id")
        )
        ReviewItem.objects.filter(pk__in=[pk for pk, _s, _a in taken]).update(
            updated_at=now, **values
        )
        audit_action = ReviewAudit.Action.CLAIM if action == "claim" else ReviewAudit.Action.ASSIGN
        ReviewAudit.objects.bulk_create(
            [
                ReviewAudit(
                    project_id=project.pk,
                    item_id=pk,
                    actor=user,
                    action=audit_action,
                    state_before=status,
                    state_after=values["status"],
                    detail=(
                        {"previous_assignee": previous} if previous not in (None, user.pk) else {}
                    )
                    if action == "claim"
                    else {"assignee": assignee.get_username() if assignee else None},
                )
                for pk, status, previous in taken
            ]
        )
    return BulkResult(done=len(taken), conflicts=len(ids) - len(taken))


# --- webhooks ------------------------------------------------------------------------------------


def _enqueue_webhook(*, item: ReviewItem, call: ToolCall) -> None:
    """On commit, deliver the call's decision to its agent's webhook (if it has one)."""
    agent = call.agent
    if not agent.webhook_url:
        return
    delivery_id = str(uuid.uuid4())
    item_pk, call_pk = item.pk, call.pk

    def send() -> None:
        from reviews.tasks import webhook_deliver

        webhook_deliver.delay(call_pk, item_pk, delivery_id)

    transaction.on_commit(send)
