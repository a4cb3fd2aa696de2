"""The project's front page: the numbers of the last 24 hours, read from the same report
selectors (and so the same rollups, window and definitions, ``callgate.metrics``) as the
reports, so each number equals the report's and the calls list it links to."""

from __future__ import annotations

from datetime import datetime, timedelta

from callgate import metrics
from callgate.models import Project
from callgate.reports import selectors as reports
from callgate.reports.selectors import ReportFilters
from callgate.taxonomy import Category

#: the overview's window (``metrics.window``)
OVERVIEW_WINDOW = timedelta(hours=24)


def overview_filters(*, now: datetime | None = None) -> ReportFilters:
    """The overview's window as report filters: the last 24 whole UTC hours, by hour."""
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
    from reviews.selectors import open_item_count

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
        "open_reviews": open_item_count(project=project),
        "agents": project.agents.count(),
        "contracts": project.contracts.values("name").distinct().count(),
    }
