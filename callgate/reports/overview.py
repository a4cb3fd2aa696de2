"""The project's front page: the numbers of the last 24 hours, read from the same report
selectors (and so the same rollups, window and definitions, ``callgate.metrics``) as the
reports, so each number equals the report's and the calls list it links to."""

from __future__ import annotations

from datetime import datetime, timedelta

from callgate import metrics
from callgate.inbox import inbox_lag_seconds
from callgate.models import Project
from callgate.reports import selectors as reports
from callgate.reports.selectors import ReportFilters
from callgate.selectors import open_review_count
from callgate.taxonomy import Category

#: the overview's window (``metrics.window``)
OVERVIEW_WINDOW = timedelta(hours=24)


def overview_filters(*, now: datetime | None = None) -> ReportFilters:
    """The overview's window as report filters: 24 whole UTC hours ending with the current
    one (``metrics.window``), by hour."""
    since, until = metrics.window(OVERVIEW_WINDOW, now=now)
    return ReportFilters(since=since, until=until, granularity="hour")


def project_overview(*, project: Project, now: datetime | None = None) -> dict:
    """Counts of the last 24 hours. Returns ``{"filters": ReportFilters, "total", "not_ok",
    "unknown_outcome", "refused", "unclassified", "by_category": [(Category | None, n)],
    "open_reviews", "agents", "contracts"}``; ``by_category`` lists every category with
    calls, in taxonomy order, then unclassified calls as ``(None, n)``."""
    f = overview_filters(now=now)
    data = reports.report_categories(project=project, f=f)
    totals = {s["category"]: s["total"] for s in data["series"]}
    routes = {r["route"]: r["calls"] for r in reports.report_routes(project=project, f=f)["rows"]}
    by_category: list[tuple[Category | None, int]] = [
        (c, totals[c.value]) for c in Category if totals.get(c.value)
    ]
    if totals.get(metrics.UNCLASSIFIED):
        by_category.append((None, totals[metrics.UNCLASSIFIED]))
    return {
        "filters": f,
        "total": data["total"],
        "not_ok": data["not_ok"],
        "unknown_outcome": totals.get(Category.UNKNOWN_OUTCOME.value, 0),
        "refused": routes.get(metrics.REFUSED_ROUTE, 0),
        "unclassified": data["unclassified"],
        "by_category": by_category,
        "open_reviews": open_review_count(project=project),
        "agents": project.agents.count(),
        "contracts": project.contracts.values("name").distinct().count(),
    }


#: the trend window of the overview's sparklines and "rising" reasons
TREND_WINDOW = timedelta(days=7)
#: approvals expiring within this are "about to expire"
EXPIRY_HORIZON = timedelta(minutes=15)
#: reasons listed as new or rising
RISING_SHOWN = 5


def trend_filters(*, now: datetime | None = None) -> ReportFilters:
    """7 × 24 whole UTC hours ending with the current one (``metrics.window``), by day."""
    since, until = metrics.window(TREND_WINDOW, now=now)
    return ReportFilters(since=since, until=until, granularity="day")


def category_trends(*, project: Project, now: datetime | None = None) -> dict:
    """Per category with calls in the last 7 days or the 7 before: ``{"filters",
    "previous": (since, until), "rows": [{"category", "counts": [int per day], "total",
    "previous", "change", "change_ratio"}]}`` in taxonomy order (unclassified last)."""
    f = trend_filters(now=now)
    current = reports.report_categories(project=project, f=f)
    prev_since, prev_until = f.previous
    before = reports.report_categories(
        project=project,
        f=ReportFilters(since=prev_since, until=prev_until, granularity="day"),
    )
    previous = {s["category"]: s["total"] for s in before["series"]}
    series = {s["category"]: s for s in current["series"]}
    n = len(current["periods"])
    rows = []
    for category in sorted(set(series) | set(previous), key=reports._category_sort):
        s = series.get(category, {"counts": [0] * n, "total": 0})
        p = previous.get(category, 0)
        rows.append(
            {
                "category": category,
                "counts": s["counts"],
                "total": s["total"],
                "previous": p,
                "change": s["total"] - p,
                "change_ratio": round((s["total"] - p) / p, 4) if p else None,
            }
        )
    return {"filters": f, "previous": (prev_since, prev_until), "rows": rows}


def rising_reasons(*, project: Project, now: datetime | None = None) -> list[dict]:
    """The not-ok reasons new in the last 7 days (none in the 7 before) or rising fastest,
    at most ``RISING_SHOWN``: rows of ``report_reasons`` plus ``"new": bool``, new ones
    first, then by growth."""
    data = reports.report_reasons(project=project, f=trend_filters(now=now))
    rows = [
        {**r, "new": r["previous_calls"] == 0}
        for r in data["rows"]
        if r["calls"] and r["change"] > 0 and metrics.is_not_ok(r["category"])
    ]
    rows.sort(key=lambda r: (not r["new"], -(r["change_ratio"] or 0), -r["change"]))
    return rows[:RISING_SHOWN]


def attention(*, project: Project, now: datetime | None = None) -> dict:
    """What waits for someone now: ``{"oldest_review": ReviewItem | None, "expiring":
    [ReviewItem] (open approvals expiring within ``EXPIRY_HORIZON``, soonest first),
    "inbox_oldest": datetime | None (the oldest pending ``InboxEvent``'s arrival),
    "inbox_pending": int}``."""
    from django.utils import timezone

    from callgate.models import InboxEvent
    from reviews.models import ReviewItem

    now = now or timezone.now()
    open_items = ReviewItem.objects.filter(
        project=project, status__in=ReviewItem.OPEN_STATUSES
    ).select_related("call")
    pending = InboxEvent.objects.filter(project=project, status=InboxEvent.Status.PENDING)
    return {
        "oldest_review": open_items.order_by("created_at", "pk").first(),
        "expiring": list(
            open_items.filter(
                kind=ReviewItem.Kind.APPROVAL,
                approval_expires_at__isnull=False,
                approval_expires_at__lte=now + EXPIRY_HORIZON,
            ).order_by("approval_expires_at")[:5]
        ),
        "inbox_lag_seconds": inbox_lag_seconds(project, now=now),
        "inbox_pending": pending.count(),
    }
