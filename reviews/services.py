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

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from callgate import services as core_services
from callgate.celery import enqueue_on_commit
from callgate.escalation import review_audit, webhook_outbox_add
from callgate.lifecycle import IllegalTransition
from callgate.models import Membership, ToolCall, ToolContract
from callgate.prometheus import WEBHOOK_ATTEMPTS
from callgate.reports.tallies import Closed, review_rollups_add
from reviews.models import ReviewAudit, ReviewItem, WebhookOutbox
from reviews.selectors import absent_reconciliations

logger = logging.getLogger(__name__)


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


class ReviewArgumentsRefused(ReviewError):
    """Edited arguments that do not fit the call's contract: ``problems``, each
    ``{"path": "$.a[0]", "msg": "…"}`` (``callgate.services.call_arguments_edit``)."""

    def __init__(self, problems: list[dict]):
        self.problems = problems
        super().__init__(
            "The edited arguments were not saved: "
            + "; ".join(f"{p['path']}: {p['msg']}" for p in problems)
        )


class ReviewConflict(ReviewError):
    """Someone else changed the item first. ``item`` is its current state."""

    def __init__(self, message: str, *, item: ReviewItem):
        super().__init__(message)
        self.item = item


def _lease() -> timedelta:
    return timedelta(seconds=settings.CALLGATE_REVIEW_CLAIM_LEASE)


def _claim_values(assignee, now) -> dict:
    """The item fields of a claim by ``assignee`` (a lease from ``now``), or of an unassign."""
    if assignee is None:
        return dict(
            status=ReviewItem.Status.OPEN, assignee=None, claimed_at=None, lease_expires_at=None
        )
    return dict(
        status=ReviewItem.Status.CLAIMED,
        assignee=assignee,
        claimed_at=now,
        lease_expires_at=now + _lease(),
    )


def _conflict(item: ReviewItem, user, verb: str) -> ReviewConflict:
    fresh = ReviewItem.objects.select_related("assignee", "resolved_by").get(pk=item.pk)
    if (
        fresh.status in ReviewItem.OPEN_STATUSES
        and fresh.lease_active()
        and fresh.assignee_id != user.pk
    ):
        assert fresh.assignee is not None  # lease_active(): an assignee holds the lease
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
        review_audit(
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
        ).update(**_claim_values(None, now), updated_at=now)
        if not won:
            raise _conflict(item, user, "release")
        review_audit(
            item=item,
            actor=user,
            action=ReviewAudit.Action.RELEASE,
            before=ReviewItem.Status.CLAIMED,
            after=ReviewItem.Status.OPEN,
        )
    item.refresh_from_db()
    return item


def no_such_operator(username: str) -> str:
    """The one error for an assignee who is not an operator of this project: whether the
    user exists elsewhere (another tenant) or at all is not told."""
    return f"No operator {username!r} in this project."


def operator_by_username(*, project_id: int, username: str):
    """The user ``username`` when an operator (or more) of the project, else None."""
    membership = (
        Membership.objects.select_related("user")
        .filter(project_id=project_id, user__username=username)
        .first()
    )
    if membership is None or not membership.has_role(Membership.Role.OPERATOR):
        return None
    return membership.user


def review_item_assign(*, item: ReviewItem, user, assignee) -> ReviewItem:
    """Assign an open (or lapsed, or own) item to ``assignee``, an operator of the item's
    project; ``assignee=None`` unassigns. Raises ReviewError for a non-operator."""
    if assignee is not None:
        if (
            operator_by_username(project_id=item.project_id, username=assignee.get_username())
            is None
        ):
            raise ReviewError(no_such_operator(assignee.get_username()))
    now = timezone.now()
    with transaction.atomic():
        values = _claim_values(assignee, now)
        won = (
            ReviewItem.objects.filter(pk=item.pk)
            .filter(_actionable(user, now))
            .update(updated_at=now, **values)
        )
        if not won:
            raise _conflict(item, user, "assign")
        review_audit(
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
            ).update(**_claim_values(None, now), updated_at=now)
            if won:
                lapsed += 1
                review_audit(
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
        return review_audit(
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
        row = review_audit(
            item=item,
            actor=user,
            action=ReviewAudit.Action.RECONCILE,
            before=item.status,
            after=item.status,
            call_before=item.call.state,
            call_after=item.call.state,
        )
        enqueue_on_commit("callgate.tasks.reconcile_call", call_pk, manual=True)
    return row


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
        review_audit(
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
                review_audit(
                    item=item,
                    actor=None,
                    action=ReviewAudit.Action.EXPIRED,
                    before=item.status,
                    after=ReviewItem.Status.EXPIRED,
                    call_before=call_before,
                    call_after=call.state,
                    reason="No decision before the approval timeout.",
                )
                webhook_outbox_add(item=item, call=call)
                # the tallies last, after the call (review_item_decide says why)
                review_rollups_add(
                    [
                        Closed.of(
                            item, status=ReviewItem.Status.EXPIRED, resolution="expired", at=now
                        )
                    ]
                )
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


#: Reasons whose escalation a retry can fix: the failure was transient, or a look-up
#: proved the write absent.
RETRY_FIXES = {"retry_exhausted", "reconciled_absent"}
#: Words in an observation that rule a retry out (classification's "Do not retry …").
NO_RETRY_WORDS = "do not retry"


def primary_action(item: ReviewItem, *, reconcile_why: str = "") -> tuple[str, str]:
    """The item page's main button and why (shared/UI.md: the primary action follows the
    route): ``("approve" | "approve_retry" | "reconcile" | "mark_applied" | "reject" | "",
    explanation)``. An approval request: approve. An escalation: approve retry only when a
    retry can fix the reason (``RETRY_FIXES``) and the observation does not say "do not
    retry"; an unknown outcome not yet looked up: reconcile (when possible); a look-up that
    found the write: mark applied; anything the observation rules a retry out for: reject."""
    call = item.call
    if not item.is_open:
        return "", ""
    if item.kind == ReviewItem.Kind.APPROVAL:
        return "approve", "The agent waits for a decision before executing the call."
    reason = call.reason or item.reason
    no_retry = NO_RETRY_WORDS in (call.observation or "").lower()
    if reason == "reconciled_applied":
        return "mark_applied", "A look-up found the write in the target."
    if reason == "reconcile_mismatch":
        return "", "A look-up found the operation with other arguments: check the target."
    if reason in ("outcome_unknown", "not_reconcilable") or (
        reason == "retry_exhausted" and approve_retry_guard(call)
    ):
        if not reconcile_why:
            return "reconcile", "The outcome is unknown: look the operation up before deciding."
        return "", "The outcome is unknown and callgate cannot look it up: check the target."
    if reason in RETRY_FIXES and not no_retry:
        return "approve_retry", "A retry can fix this."
    if no_retry:
        return "reject", "The observation says not to retry: reject with a reason for the agent."
    return "", ""


#: Why the queue's one-key approve retry is off for an item whose observation rules it out.
QUEUE_NO_RETRY = (
    "The observation says not to retry: open it (Enter) to reject or decide with the details."
)
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
    if NO_RETRY_WORDS in (item.call.observation or "").lower():
        return "approve_retry", QUEUE_NO_RETRY
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


#: Decisions that let the call run, so an operator may edit its arguments first.
DECISIONS_WITH_EDITS = {"approve", "approve_retry"}


def review_item_decide(
    *,
    item: ReviewItem,
    user,
    decision: str,
    reason: str = "",
    override: bool = False,
    via: str = "",
    arguments: dict | None = None,
) -> ReviewItem:
    """Decide ``item``: close it (compare-and-swap on its open status) and change its call
    through ``call_apply_decision``, in one transaction; then tell the agent's webhook.
    ``via`` names where the decision came from outside the browser (``"slack"``,
    ``"email"``): kept in the audit row's ``detail``.

    ``override=True`` with a written ``reason`` approves a retry despite the unknown-outcome
    guard (audited as an override). ``arguments`` (approve and approve retry only: "approve
    with edits") replaces the call's arguments first, in the same transaction, by
    ``callgate.services.call_arguments_edit`` (validated against the contract; the operation
    ID follows the canonical arguments, see there); the change, from → to, is its own
    ``edit_arguments`` audit row, and the agent reads the arguments in the decision (the
    call's answer, the webhook). Raises ReviewArgumentsRefused (the problems by JSON path),
    ReviewError (bad input, guard, illegal for the call's state; for all three nothing is
    changed) or ReviewConflict (someone else acted first: checked before the arguments)."""
    if decision not in DECISIONS:
        raise ReviewError(f"Unknown decision {decision!r}.")
    if arguments is not None and decision not in DECISIONS_WITH_EDITS:
        raise ReviewError("Only an approval can change the arguments.")
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
            call = (
                ToolCall.objects.select_for_update(of=("self",))
                .select_related("contract")
                .get(pk=item.call_id)
            )
            call_before = call.state
            if arguments is not None:
                _arguments_edit(item=item, call=call, user=user, arguments=arguments)
            call = core_services.call_apply_decision(
                call=call, decision=decision, reason=reason, user=user
            )
            review_audit(
                item=item,
                actor=user,
                action=DECISIONS[decision],
                before=item.status,
                after=ReviewItem.Status.RESOLVED,
                reason=reason,
                override=used_override,
                call_before=call_before,
                call_after=call.state,
                detail={"via": via} if via else None,
            )
            webhook_outbox_add(item=item, call=call)
            # the tallies last: a transaction takes the call before the cells, as ingest does
            # (an ingest batch locks its calls, then settles their items: no lock cycle)
            review_rollups_add(
                [Closed.of(item, status=ReviewItem.Status.RESOLVED, resolution=decision, at=now)]
            )
    except IllegalTransition as exc:
        raise ReviewError(
            f"The call's state does not allow this any more ({exc}). Reload to see it."
        ) from exc
    item.refresh_from_db()
    return item


def _arguments_edit(*, item: ReviewItem, call: ToolCall, user, arguments: dict) -> None:
    """The edit of an approval with edits, inside its transaction, audited from → to."""
    try:
        call, change = core_services.call_arguments_edit(call=call, arguments=arguments)
    except core_services.ArgumentsRefused as exc:
        raise ReviewArgumentsRefused(exc.problems) from exc
    if change is None:
        return
    ops = change["operation_id"]
    summary = "; ".join(
        f"{c['path']}: {_shown(c['from'])} → {_shown(c['to'])}" for c in change["arguments"]
    )
    if ops["from"] != ops["to"]:
        summary += f"; operation ID {ops['from']} → {ops['to']}"
    review_audit(
        item=item,
        actor=user,
        action=ReviewAudit.Action.EDIT_ARGUMENTS,
        before=item.status,
        after=item.status,
        reason=summary[:5000],
        call_before=call.state,
        call_after=call.state,
        detail=change,
    )


def _shown(value) -> str:
    """A JSON value in an audit sentence ("—" for none)."""
    return "—" if value is None else json.dumps(value, ensure_ascii=False)[:200]


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
    values = _claim_values(assignee, now)
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


@dataclass(frozen=True)
class WebhookAttempt:
    """What one ``webhook_attempt`` did: ``outcome`` is ``delivered``, ``failed`` (tried
    again after ``retry_in`` seconds), ``given_up``, or ``skipped`` (delivered before, given
    up, or being sent by another worker right now)."""

    outcome: str
    retry_in: float | None = None


def webhook_attempt(*, delivery_id: str) -> WebhookAttempt:
    """Send one outbox row's decision once, holding the row (``SELECT … FOR UPDATE SKIP
    LOCKED``, so two workers never send it at once), log the attempt as a
    ``WebhookDelivery`` and schedule the next one: full-jitter exponential backoff,
    ``uniform(0, WEBHOOK_BACKOFF_BASE * 2**(attempt - 1))`` seconds, at most
    ``WEBHOOK_MAX_ATTEMPTS`` attempts. Never raises for what the receiver does."""
    import random

    import httpx

    from reviews import webhooks
    from reviews.models import WebhookDelivery

    with transaction.atomic():
        row = (
            WebhookOutbox.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("call__agent", "call__decided_by")
            .filter(delivery_id=delivery_id, delivered_at=None, given_up_at=None)
            .first()
        )
        if row is None:
            return WebhookAttempt("skipped")
        call, agent = row.call, row.call.agent
        if not agent.webhook_url:
            row.given_up_at, row.last_error = timezone.now(), "the agent has no webhook URL now"
            row.save(update_fields=["given_up_at", "last_error"])
            return WebhookAttempt("given_up")
        payload = webhooks.webhook_payload(
            call=call, item_pk=row.item_id, delivery_id=str(row.delivery_id)
        )
        started = time.monotonic()
        status_code, error = None, ""
        try:
            response = webhooks.webhook_post(
                url=agent.webhook_url, secret=agent.webhook_secret, payload=payload
            )
            status_code = response.status_code
            if not 200 <= status_code < 300:
                error = f"HTTP {status_code}"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:1000]
        now = timezone.now()
        row.attempts += 1
        WebhookDelivery.objects.create(
            project_id=row.project_id,
            item_id=row.item_id,
            call=call,
            agent=agent,
            delivery_id=row.delivery_id,
            attempt=row.attempts,
            url=agent.webhook_url,
            status_code=status_code,
            error=error,
            ok=not error,
            duration_ms=int((time.monotonic() - started) * 1000),
        )
        row.last_error = error
        if not error:
            row.delivered_at, outcome, retry_in = now, "delivered", None
        elif row.attempts >= webhooks.WEBHOOK_MAX_ATTEMPTS:
            row.given_up_at, outcome, retry_in = now, "given_up", None
            logger.warning("webhook %s given up after %d attempts", delivery_id, row.attempts)
        else:
            retry_in = random.uniform(0, webhooks.WEBHOOK_BACKOFF_BASE * 2 ** (row.attempts - 1))
            row.next_attempt_at, outcome = now + timedelta(seconds=retry_in), "failed"
        row.save()
        WEBHOOK_ATTEMPTS.labels(outcome).inc()
        return WebhookAttempt(outcome, retry_in)


def webhook_outbox_overdue(*, grace: timedelta, limit: int) -> list[str]:
    """Delivery IDs of undelivered outbox rows whose next attempt is more than ``grace``
    overdue (the task that should have sent them was lost), oldest first."""
    due = timezone.now() - grace
    return [
        str(delivery_id)
        for delivery_id in WebhookOutbox.objects.filter(
            delivered_at=None, given_up_at=None, next_attempt_at__lt=due
        )
        .order_by("next_attempt_at")
        .values_list("delivery_id", flat=True)[:limit]
    ]
