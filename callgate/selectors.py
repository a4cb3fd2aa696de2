"""Reads of the core domain. Callers pass the project; nothing here crosses projects."""
from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, Q
from django.utils import timezone

from callgate.models import Project, ToolCall
from callgate.taxonomy import Category


def project_overview(*, project: Project) -> dict:
    """Counts of the last 24 hours: calls, calls per category, calls waiting for someone."""
    since = timezone.now() - timedelta(hours=24)
    calls = ToolCall.objects.filter(project=project, created_at__gte=since)
    totals = calls.aggregate(
        total=Count("id"),
        failed=Count("id", filter=~Q(category__in=[Category.OK, Category.EMPTY_RESULT, ""])),
    )
    by_category = {row["category"]: row["n"] for row in calls.values("category").annotate(n=Count("id"))}
    return {
        "since": since,
        "total": totals["total"],
        "failed": totals["failed"],
        "by_category": [(c, by_category.get(c.value, 0)) for c in Category],
        "agents": project.agents.count(),
        "contracts": project.contracts.values("name").distinct().count(),
    }
