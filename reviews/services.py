"""Writes of the review queue. Every state change is a compare-and-swap UPDATE plus an
audit row (see ``reviews.models``)."""
from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from callgate.models import ToolCall
from reviews.models import ReviewItem

#: Lower is more urgent: unknown outcomes of writes and approvals first.
PRIORITY_BY_REASON = {
    "approval_pending": 0,
    "not_reconcilable": 1,
    "reconcile_mismatch": 1,
    "reconciled_absent": 1,
    "retry_exhausted": 2,
    "conflict": 2,
    "authentication_failed": 3,
}


def review_item_open(*, call: ToolCall, kind: str = ReviewItem.Kind.ESCALATION) -> ReviewItem:
    """Open an item for ``call`` unless one is open already (at most one per call)."""
    existing = ReviewItem.objects.filter(call=call, status__in=ReviewItem.OPEN_STATUSES).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            return ReviewItem.objects.create(
                project_id=call.project_id,
                call=call,
                kind=kind,
                reason=call.reason,
                priority=PRIORITY_BY_REASON.get(call.reason, 2),
                approval_expires_at=call.approval_expires_at if kind == ReviewItem.Kind.APPROVAL else None,
            )
    except IntegrityError:  # a concurrent request opened it first
        return ReviewItem.objects.get(call=call, status__in=ReviewItem.OPEN_STATUSES)


def review_items_settle(*, call: ToolCall, note: str) -> int:
    """Close the call's open items because a later event settled the call. Returns how many."""
    now = timezone.now()
    return ReviewItem.objects.filter(call=call, status__in=ReviewItem.OPEN_STATUSES).update(
        status=ReviewItem.Status.SETTLED, resolution="settled", resolution_reason=note,
        resolved_at=now, updated_at=now,
    )
