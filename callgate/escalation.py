"""Escalation: the review items that the call lifecycle opens and settles.

When a call's route is ``review`` (or it waits for approval) it gets one open
``reviews.ReviewItem``; when a later event settles the call (a late receipt, a
reconciliation, an expiry) its open items close. ``ingest.events_apply`` calls this module
in bulk for a batch. Operators' work on the items (claims, decisions) is ``reviews``'s; this
module only uses ``reviews.models``, so the core never imports the review app's services.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from callgate.celery import enqueue_on_commit
from callgate.models import ToolCall
from callgate.reports.tallies import Closed, review_rollups_add
from reviews.models import ReviewAudit, ReviewItem, WebhookOutbox

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


def review_audit(
    *,
    item: ReviewItem,
    actor=None,
    action: str,
    before: str,
    after: str,
    reason: str = "",
    override: bool = False,
    call_before: str = "",
    call_after: str = "",
    detail: dict | None = None,
) -> ReviewAudit:
    """One row of a review item's audit trail (``actor`` None: callgate itself)."""
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


def webhook_outbox_add(*, item: ReviewItem, call: ToolCall) -> None:
    """In the current transaction: add the call's decision to the webhook outbox (if its
    agent has a webhook); on commit, ask a worker to deliver it (``reviews.tasks.
    webhook_deliver``). A broker that cannot be reached loses nothing and fails nothing:
    ``reviews.tasks.sweep_webhooks`` delivers the row later."""
    if call.agent.webhook_url:
        row = WebhookOutbox.objects.create(project_id=call.project_id, item=item, call=call)
        enqueue_on_commit("reviews.tasks.webhook_deliver", str(row.delivery_id))


def _new_item(call: ToolCall, kind: str) -> ReviewItem:
    """An unsaved open item for ``call``: its reason, the reason's priority, its tool name
    and agent (copied, so the queue never joins the calls table), and for an approval the
    call's approval timeout."""
    return ReviewItem(
        project_id=call.project_id,
        call=call,
        kind=kind,
        reason=call.reason,
        tool_name=call.tool_name,
        agent_id=call.agent_id,
        priority=PRIORITY_BY_REASON.get(call.reason, 2),
        approval_expires_at=call.approval_expires_at if kind == ReviewItem.Kind.APPROVAL else None,
    )


def review_item_open(*, call: ToolCall, kind: str = ReviewItem.Kind.ESCALATION) -> ReviewItem:
    """Open an item for ``call`` unless one is open already (at most one per call). A new
    item is announced on commit (``reviews.tasks.review_items_notify``: Slack, email)."""
    return _open_one(call=call, kind=kind)


def _open_one(*, call: ToolCall, kind: str) -> ReviewItem:
    existing = ReviewItem.objects.filter(call=call, status__in=ReviewItem.OPEN_STATUSES).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            item = _new_item(call, kind)
            item.save()
            review_audit(
                item=item,
                action=ReviewAudit.Action.OPENED,
                before="",
                after=item.status,
                reason=call.reason,
                call_after=call.state,
            )
            enqueue_on_commit("reviews.tasks.review_items_notify", [item.pk])
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
    call at a time if a concurrent request opened one of them first. A call that has an
    open item already gets its new reason onto it (``_reasons_follow``)."""
    if not calls:
        return []
    existing = {
        i.call_id: i
        for i in ReviewItem.objects.filter(
            call__in=[c for c, _ in calls], status__in=ReviewItem.OPEN_STATUSES
        )
    }
    _reasons_follow(items=existing, calls=[c for c, _ in calls if c.pk in existing])
    new = [_new_item(call, kind) for call, kind in calls if call.pk not in existing]
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
            enqueue_on_commit("reviews.tasks.review_items_notify", [i.pk for i in created])
    except IntegrityError:  # someone opened one meanwhile: do it one by one
        created = [
            _open_one(call=call, kind=kind) for call, kind in calls if call.pk not in existing
        ]
    return list(existing.values()) + created


def _reasons_follow(*, items: dict[int, ReviewItem], calls: list[ToolCall]) -> None:
    """An open item whose call's reason changed while it stays in review (a reconciliation,
    a later event) takes the new reason and its priority; each change is a
    ``reason_changed`` audit row saying from → to (``detail``: ``{"from", "to"}``).
    Compare-and-swap on the item's open status and old reason: an item an operator closed,
    or a concurrent batch changed, meanwhile is left alone."""
    now = timezone.now()
    audits = []
    for call in calls:
        item = items[call.pk]
        before = item.reason
        if not call.reason or call.reason == before:
            continue
        changed = ReviewItem.objects.filter(
            pk=item.pk, status__in=ReviewItem.OPEN_STATUSES, reason=before
        ).update(
            reason=call.reason,
            priority=PRIORITY_BY_REASON.get(call.reason, 2),
            updated_at=now,
        )
        if not changed:
            continue
        item.reason = call.reason
        audits.append(
            ReviewAudit(
                project_id=item.project_id,
                item=item,
                action=ReviewAudit.Action.REASON_CHANGED,
                state_before=item.status,
                state_after=item.status,
                reason=f"{before} → {call.reason}",
                call_state_after=call.state,
                detail={"from": before, "to": call.reason},
            )
        )
    ReviewAudit.objects.bulk_create(audits)


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
            .only(
                "pk",
                "project_id",
                "call_id",
                "status",
                "reason",
                "tool_name",
                "agent",
                "created_at",
            )
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
        review_rollups_add(
            Closed.of(i, status=status, resolution=status, at=now)
            for i in items
            for status in [_settled_status(by_pk[i.call_id])]
        )
        for item in items:  # an expired approval: tell the agent, as review_items_expire does
            if _settled_status(by_pk[item.call_id]) == ReviewItem.Status.EXPIRED:
                webhook_outbox_add(item=item, call=by_pk[item.call_id])
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


#: The audit trail's words for an agent's blind retry (``review_items_note_retries``).
AGENT_RETRY_NOTE = (
    "The agent retried this write (attempt {attempt}, {outcome}{sent}) while its first "
    "outcome was still unknown: it may have run twice. Check the target before deciding."
)


def review_items_note_retries(*, retries: list[tuple[ToolCall, dict]]) -> int:
    """Flag the open items of calls whose agent reported a new attempt while the call's
    outcome was unknown (a blind retry): each item counts it (``agent_retries``, with the
    time in ``agent_retried_at``) and its audit trail gets an ``agent_retry`` row whose
    ``detail`` is the retry's ``{"event_id", "attempt", "outcome", "sent"}``. ``retries`` is
    ``[(call, detail), …]`` in order (a call may retry more than once in a batch); the items
    stay open: only an operator's decision, or a trusted settlement, closes them. Called by
    ``ingest.events_apply`` after it opened the items. Returns how many retries were noted."""
    if not retries:
        return 0
    now = timezone.now()
    with transaction.atomic():
        items = {
            item.call_id: item
            for item in ReviewItem.objects.select_for_update().filter(
                call_id__in={call.pk for call, _ in retries},
                status__in=ReviewItem.OPEN_STATUSES,
            )
        }
        counts: dict[int, int] = {}
        audits = []
        for call, detail in retries:
            item = items.get(call.pk)
            if item is None:  # pragma: no cover - the batch opened one for every such call
                continue
            counts[item.pk] = counts.get(item.pk, 0) + 1
            audits.append(
                ReviewAudit(
                    project_id=item.project_id,
                    item=item,
                    action=ReviewAudit.Action.AGENT_RETRY,
                    state_before=item.status,
                    state_after=item.status,
                    reason=AGENT_RETRY_NOTE.format(
                        attempt=detail["attempt"],
                        outcome=detail["outcome"],
                        sent="" if detail["sent"] is not False else ", not sent, says the agent",
                    ),
                    call_state_before=detail["state_before"],
                    call_state_after=call.state,
                    detail={k: v for k, v in detail.items() if k != "state_before"},
                )
            )
        for pk, count in counts.items():
            ReviewItem.objects.filter(pk=pk).update(
                agent_retries=F("agent_retries") + count, agent_retried_at=now, updated_at=now
            )
        ReviewAudit.objects.bulk_create(audits)
    return len(audits)
