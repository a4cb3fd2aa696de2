"""Reads for the review queue."""
from __future__ import annotations


def open_item_count(*, project) -> int:
    """Open review items in ``project`` (shown beside "Review" in the navigation)."""
    from reviews.models import ReviewItem

    return ReviewItem.objects.filter(project=project, status__in=ReviewItem.OPEN_STATUSES).count()
