"""Reads of the core domain. Callers pass the project; nothing here crosses projects."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta

from django.db.models import Count, F, Prefetch, Q, QuerySet, Sum, Window
from django.db.models.functions import Coalesce, RowNumber
from django.utils import timezone

from callgate.models import (
    Agent,
    AgentTool,
    ApiKey,
    CallEvent,
    CallRollup,
    InboxEvent,
    Project,
    ToolCall,
    ToolContract,
)
from callgate.reports.rollups import hour_floor
from callgate.taxonomy import TABLE, Category

#: category → the reasons of that category (the taxonomy's table)
REASONS_OF_CATEGORY: dict[str, list[str]] = {}
for _reason, (_category, _route) in TABLE.items():
    REASONS_OF_CATEGORY.setdefault(_category.value, []).append(_reason.value)


def project_overview(*, project: Project) -> dict:
    """Counts of the last 24 hours: calls, calls per category, calls waiting for someone;
    and the inbox lag (seconds the oldest pending event has waited, ``inbox_lag_seconds``)."""
    since = timezone.now() - timedelta(hours=24)
    calls = ToolCall.objects.filter(project=project, created_at__gte=since)
    totals = calls.aggregate(
        total=Count("id"),
        failed=Count("id", filter=~Q(category__in=[Category.OK, Category.EMPTY_RESULT, ""])),
    )
    by_category = {
        row["category"]: row["n"] for row in calls.values("category").annotate(n=Count("id"))
    }
    from callgate.inbox import inbox_lag_seconds
    from reviews.selectors import open_item_count

    return {
        "open_reviews": open_item_count(project=project),
        "inbox_lag_seconds": inbox_lag_seconds(project),
        "since": since,
        "total": totals["total"],
        "failed": totals["failed"],
        "by_category": [(c, by_category.get(c.value, 0)) for c in Category],
        "agents": project.agents.count(),
        "contracts": project.contracts.values("name").distinct().count(),
    }


# --- calls list -------------------------------------------------------------------------

#: rows per page of the calls list
CALLS_PAGE_SIZE = 50
#: the time-range presets of the filter bar: value -> length
TIME_PRESETS = {
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}


@dataclass(frozen=True)
class CallFilters:
    """What the calls list is narrowed to; every field empty means "all calls".

    ``agent`` is an agent's primary key; ``since``/``until`` are aware datetimes (``until``
    exclusive); ``q`` is an operation ID prefix."""

    reason: str = ""
    category: str = ""
    route: str = ""
    tool: str = ""
    agent: int | None = None
    state: str = ""
    since: datetime | None = None
    until: datetime | None = None
    q: str = ""

    def active(self) -> bool:
        return any(getattr(self, f.name) not in ("", None) for f in fields(self))


@dataclass(frozen=True)
class Cursor:
    """A position in the calls list: the (created_at, id) of a row. Keyset pagination does
    not count or skip rows, so page 400 costs the same as page 1."""

    created_at: datetime
    id: int

    def encode(self) -> str:
        return f"{int(self.created_at.timestamp() * 1_000_000)}.{self.id}"

    @classmethod
    def decode(cls, raw: str) -> Cursor | None:
        """The cursor ``raw`` names, or None when it is not one of ours."""
        try:
            micros, pk = raw.split(".", 1)
            created_at = datetime.fromtimestamp(int(micros) / 1_000_000, tz=UTC)
            return cls(created_at=created_at, id=int(pk))
        except (ValueError, OverflowError, OSError):
            return None


@dataclass
class CallPage:
    """One page of the calls list, newest first. ``older``/``newer`` are cursors for the
    neighbouring pages (None at either end)."""

    rows: list[ToolCall]
    older: str | None
    newer: str | None


def calls_filtered(
    *, project: Project, filters: CallFilters, ignore: tuple[str, ...] = ()
) -> QuerySet[ToolCall]:
    """The project's calls matching ``filters`` (leaving out the filters named in ``ignore``).
    Unordered; callers order and slice."""
    qs = ToolCall.objects.filter(project=project)
    lookups = {
        "reason": "reason",
        "category": "category",
        "route": "route",
        "tool": "tool_name",
        "agent": "agent_id",
        "state": "state",
        "since": "created_at__gte",
        "until": "created_at__lt",
        "q": "operation_id__startswith",
    }
    for name, lookup in lookups.items():
        value = getattr(filters, name)
        if name not in ignore and value not in ("", None):
            if name == "category":  # a function of the reason: the reason index serves it
                qs = qs.filter(reason__in=REASONS_OF_CATEGORY.get(value, [value]))
            else:
                qs = qs.filter(**{lookup: value})
    return qs


def calls_page(
    *,
    project: Project,
    filters: CallFilters,
    before: Cursor | None = None,
    after: Cursor | None = None,
    size: int = CALLS_PAGE_SIZE,
) -> CallPage:
    """A page of matching calls, newest first: the ``size`` rows older than ``before``, or
    newer than ``after``, or the newest. One query (plus none per row: agent is joined)."""
    qs = (
        calls_filtered(project=project, filters=filters)
        .select_related("agent", "contract")
        .only(
            "id",
            "operation_id",
            "tool_name",
            "state",
            "reason",
            "category",
            "route",
            "attempts",
            "created_at",
            "updated_at",
            "agent__id",
            "agent__name",
            "contract__id",
            "contract__max_attempts",
        )
    )
    if after is not None:
        qs = qs.filter(
            Q(created_at__gt=after.created_at) | Q(created_at=after.created_at, id__gt=after.id)
        )
        rows = list(qs.order_by("created_at", "id")[: size + 1])
        has_more_newer = len(rows) > size
        rows = rows[:size][::-1]
        has_more_older = True
    else:
        if before is not None:
            qs = qs.filter(
                Q(created_at__lt=before.created_at)
                | Q(created_at=before.created_at, id__lt=before.id)
            )
        rows = list(qs.order_by("-created_at", "-id")[: size + 1])
        has_more_older = len(rows) > size
        rows = rows[:size]
        has_more_newer = before is not None
    older = Cursor(rows[-1].created_at, rows[-1].id).encode() if rows and has_more_older else None
    newer = Cursor(rows[0].created_at, rows[0].id).encode() if rows and has_more_newer else None
    return CallPage(rows=rows, older=older, newer=newer)


#: Filters the rollups can answer (``CallRollup`` has these columns); the category filter
#: is ignored by the counts anyway.
ROLLUP_FILTERS = {"reason", "category", "route", "tool", "agent"}
#: A count over calls themselves stops after this many rows ("10,000+").
COUNT_CAP = 10_000


@dataclass(frozen=True)
class CategoryCounts:
    """Matching calls per category. ``capped``: more than ``COUNT_CAP`` calls match and
    the counts are those of the newest ``COUNT_CAP + 1`` (lower bounds, shown with "+")."""

    counts: dict[str, int]
    capped: bool = False


def calls_category_counts(*, project: Project, filters: CallFilters) -> CategoryCounts:
    """Matching calls per category, ignoring the category filter itself (so the bar shows
    what picking another category would give). One query whose cost does not grow with the
    project: from the rollups when only tool, agent, reason and route are filtered (exact as
    of the last refresh, at most a minute old), else counted over the newest
    ``COUNT_CAP + 1`` matching calls (an index scan stopping there)."""
    used = {f.name for f in fields(filters) if getattr(filters, f.name) not in ("", None)}
    if used <= ROLLUP_FILTERS:
        rollups = CallRollup.objects.filter(project=project)
        for name, column in (
            ("reason", "reason"),
            ("route", "route"),
            ("tool", "tool_name"),
            ("agent", "agent_id"),
        ):
            if getattr(filters, name) not in ("", None):
                rollups = rollups.filter(**{column: getattr(filters, name)})
        rows = rollups.order_by().values("category").annotate(n=Sum("calls"))
        return CategoryCounts(counts={r["category"]: r["n"] for r in rows if r["n"]})
    newest = (
        calls_filtered(project=project, filters=filters, ignore=("category",))
        .order_by("-created_at")
        .values_list("category", flat=True)[: COUNT_CAP + 1]
    )
    counts: dict[str, int] = {}
    for category in newest:
        counts[category] = counts.get(category, 0) + 1
    return CategoryCounts(counts=counts, capped=sum(counts.values()) > COUNT_CAP)


def call_filter_choices(*, project: Project) -> dict:
    """Options of the filter bar's selects: the project's agents and tool names."""
    return {
        "agents": list(
            Agent.objects.filter(project=project).order_by("name").values_list("id", "name")
        ),
        "tools": list(
            ToolContract.objects.filter(project=project)
            .order_by("name")
            .values_list("name", flat=True)
            .distinct()
        ),
    }


# --- one call ---------------------------------------------------------------------------


def call_for_detail(*, project: Project, operation_id: str) -> ToolCall | None:
    """The call with its agent, contract and decider, or None (also for other projects' calls)."""
    return (
        ToolCall.objects.select_related("agent", "contract", "decided_by")
        .filter(project=project, operation_id=operation_id)
        .first()
    )


def call_timeline(*, call: ToolCall) -> list[CallEvent]:
    """The call's events in the order callgate received them."""
    return list(
        CallEvent.objects.filter(call=call, project_id=call.project_id).order_by(
            "received_at", "id"
        )
    )


def call_open_review_item(*, call: ToolCall):
    """The call's open or claimed review item, or None."""
    from reviews.models import ReviewItem

    return (
        ReviewItem.objects.filter(
            call=call, status__in=[ReviewItem.Status.OPEN, ReviewItem.Status.CLAIMED]
        )
        .select_related("assignee")
        .first()
    )


# --- contracts ---------------------------------------------------------------------------


def contracts_latest(*, project: Project) -> list[dict]:
    """One entry per tool name: ``{"contract": latest ToolContract, "versions": int,
    "calls": int, "argument_errors": int, "hallucinations": int, "bad_rate": float | None}``
    where ``bad_rate`` is the share (0..1) of calls that were argument errors or
    hallucinations. Two queries; the counts from the rollups (as of their last refresh)."""
    latest = (
        ToolContract.objects.filter(project=project)
        .annotate(
            versions=Window(expression=Count("id"), partition_by=[F("name")]),
            rank=Window(
                expression=RowNumber(), partition_by=[F("name")], order_by=F("version").desc()
            ),
        )
        .order_by("name", "-version")
    )
    contracts = [c for c in latest if c.rank == 1]
    stats = {
        row["tool_name"]: row
        for row in CallRollup.objects.filter(project=project)
        .order_by()
        .values("tool_name")
        .annotate(
            n=Sum("calls"),
            argument_errors=Coalesce(Sum("calls", filter=Q(category=Category.ARGUMENT_ERROR)), 0),
            hallucinations=Coalesce(Sum("calls", filter=Q(category=Category.HALLUCINATION)), 0),
        )
    }
    out = []
    for contract in contracts:
        row = stats.get(contract.name, {"n": 0, "argument_errors": 0, "hallucinations": 0})
        bad = row["argument_errors"] + row["hallucinations"]
        out.append(
            {
                "contract": contract,
                "versions": contract.versions,
                "calls": row["n"],
                "argument_errors": row["argument_errors"],
                "hallucinations": row["hallucinations"],
                "bad_rate": bad / row["n"] if row["n"] else None,
            }
        )
    return out


def contract_versions(*, project: Project, name: str) -> list[ToolContract]:
    """Every version of one tool's contract, newest first, each with ``n_calls`` (from the
    rollups, as of their last refresh)."""
    versions = list(ToolContract.objects.filter(project=project, name=name).order_by("-version"))
    counts = dict(
        CallRollup.objects.filter(project=project, contract__in=versions)
        .values("contract_id")
        .annotate(n=Sum("calls"))
        .order_by()
        .values_list("contract_id", "n")
    )
    for version in versions:
        version.n_calls = counts.get(version.pk, 0)
    return versions


# --- agents ------------------------------------------------------------------------------


#: Refused events listed per agent on the agents page (the newest).
REFUSED_SHOWN = 10


def agents_with_keys(*, project: Project) -> list[Agent]:
    """The project's agents with ``api_keys`` (newest first) and ``tools`` prefetched and
    ``calls_24h`` (calls created since the start of the UTC hour 24 hours ago, from the
    rollups: as of their last refresh, and a read of at most 25 hours of rollup rows); from the inbox, ``pending_events`` (received, not applied yet),
    ``refused_count`` and ``refused`` (the newest ``REFUSED_SHOWN`` events the rules refused
    when applying them, kept until retention). Six queries."""
    since = hour_floor(timezone.now() - timedelta(hours=24))
    recent = dict(
        CallRollup.objects.filter(project=project, bucket__gte=since)
        .values("agent_id")
        .annotate(n=Sum("calls"))
        .order_by()
        .values_list("agent_id", "n")
    )
    agents = list(
        Agent.objects.filter(project=project)
        .prefetch_related(
            Prefetch("api_keys", queryset=ApiKey.objects.order_by("revoked_at", "-created_at")),
            Prefetch("tools", queryset=AgentTool.objects.order_by("name")),
        )
        .order_by("name")
    )
    counts = {
        (row["agent_id"], row["status"]): row["n"]
        for row in InboxEvent.objects.filter(
            project=project, status__in=[InboxEvent.Status.PENDING, InboxEvent.Status.REJECTED]
        )
        .values("agent_id", "status")
        .annotate(n=Count("id"))
        .order_by()
    }
    refused = (
        InboxEvent.objects.filter(project=project, status=InboxEvent.Status.REJECTED)
        .annotate(rank=Window(RowNumber(), partition_by=[F("agent_id")], order_by=F("id").desc()))
        .filter(rank__lte=REFUSED_SHOWN)
        .order_by("-id")
    )
    by_agent: dict[int, list[InboxEvent]] = {}
    for row in refused:
        by_agent.setdefault(row.agent_id, []).append(row)
    for agent in agents:
        agent.calls_24h = recent.get(agent.pk, 0)
        agent.pending_events = counts.get((agent.pk, InboxEvent.Status.PENDING), 0)
        agent.refused_count = counts.get((agent.pk, InboxEvent.Status.REJECTED), 0)
        agent.refused = by_agent.get(agent.pk, [])
    return agents
