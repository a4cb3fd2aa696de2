"""Report queries for managers: pure selectors returning plain dicts and lists.

Counts by category, reason, route, tool, agent and time (retries, unknown outcomes and
contract quality included) read the rollups through ``rollups.rollup_rows``: the smallest
``RollupCube`` that keeps the dimensions a query needs, day rows for the whole days of the
range and hour rows for the partial days at its ends (``CallRollup``'s hourly cells only
when both a tool and an agent are needed), so a 30-day report reads about 30 × (tools,
agents or reasons) rows whatever the traffic. Refused proposals read their own partial
index of events; the review queue's health reads ``reviews`` by its indexes.

Every selector takes ``project`` and a ``ReportFilters`` (see ``report_filters_parse``):
the range ``[since, until)`` in whole UTC hours, a ``granularity`` for time series and
optional ``tool`` / ``agent_id``. Nothing here crosses projects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypedDict

from django.apps import apps
from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce, Trunc
from django.utils import timezone

from callgate import labels, metrics
from callgate.models import Agent, Project, ToolCall, ToolContract
from callgate.reports import tallies
from callgate.reports.rollups import hour_floor, rollup_rows
from callgate.taxonomy import TABLE, Category, Reason, Route
from callgate.timeparse import format_time, parse_time

UTC = UTC
GRANULARITIES = ("hour", "day", "week")
STEP = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(weeks=1)}
#: Most buckets one time series may have (hour over 31 days, day over ~2 years).
MAX_PERIODS = 744
MAX_RANGE = timedelta(days=731)
DEFAULT_RANGE = timedelta(days=7)

#: Categories that mean "nothing went wrong" (``callgate.metrics``).
GOOD_CATEGORIES = metrics.GOOD_CATEGORIES
CATEGORY_ORDER = [c.value for c in Category]
REASON_ORDER = [r.value for r in Reason]


class ReportFilterError(ValueError):
    """A filter value that cannot be used. ``field`` names the query parameter."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class ReportFilters:
    since: datetime  # inclusive, whole UTC hour
    until: datetime  # exclusive, whole UTC hour
    granularity: str = "day"
    tool: str = ""
    agent_id: int | None = None
    agent_name: str = ""
    explicit: dict = field(default_factory=dict)  # the parameters as given (for permalinks)

    @property
    def previous(self) -> tuple[datetime, datetime]:
        """The period of the same length right before ``[since, until)``."""
        return self.since - (self.until - self.since), self.since

    def as_params(self) -> dict[str, str]:
        """The filters as query parameters (ISO times), for links and the API."""
        params = {
            "since": iso(self.since),
            "until": iso(self.until),
            "granularity": self.granularity,
        }
        if self.tool:
            params["tool"] = self.tool
        if self.agent_id is not None:
            params["agent"] = str(self.agent_id)
        return params

    def as_dict(self) -> dict:
        return {
            "since": iso(self.since),
            "until": iso(self.until),
            "granularity": self.granularity,
            "tool": self.tool or None,
            "agent": self.agent_id,
        }


iso = format_time
FILTER_KEYS = ("since", "until", "granularity", "tool", "agent")


def _parse_moment(name: str, raw: str, *, end: bool) -> datetime:
    """``timeparse.parse_time`` (dates and naive times in UTC, the reports' time zone), its
    error as ``ReportFilterError(name, …)``."""
    try:
        return parse_time(raw, end=end)
    except ValueError as exc:
        raise ReportFilterError(name, str(exc)) from None


def report_filters_parse(
    params: Mapping[str, str], *, project: Project, now: datetime | None = None
) -> ReportFilters:
    """Parse ``since``, ``until`` (ISO date or date-time, UTC unless an offset is given;
    a date as ``until`` means the end of that day), ``granularity`` (hour/day/week),
    ``tool`` (a tool name) and ``agent`` (an agent id of ``project``). Defaults: the last
    7 days up to the end of the current hour, by day. The range is widened to whole hours.

    Moments must fall in the years ``MIN_YEAR`` – ``MAX_YEAR``; no value may contain a NUL
    character (the database cannot hold one).

    Raises ``ReportFilterError(field, message)`` for a value that cannot be used."""
    now = now or timezone.now()
    for key in FILTER_KEYS:
        if "\x00" in (params.get(key) or ""):
            raise ReportFilterError(key, "must not contain NUL characters")
    explicit = {
        k: params.get(k, "")
        for k in ("since", "until", "granularity", "tool", "agent")
        if params.get(k)
    }
    until = _parse_moment("until", params["until"], end=True) if params.get("until") else now
    until = metrics.hour_ceil(until)
    since = (
        _parse_moment("since", params["since"], end=False)
        if params.get("since")
        else until - DEFAULT_RANGE
    )
    since = hour_floor(since)
    if since >= until:
        raise ReportFilterError("since", "must be before until")
    if until - since > MAX_RANGE:
        raise ReportFilterError("since", f"the range may span at most {MAX_RANGE.days} days")
    granularity = (params.get("granularity") or "").strip() or (
        "hour" if until - since <= timedelta(days=2) else "day"
    )
    if granularity not in GRANULARITIES:
        raise ReportFilterError(
            "granularity", f"must be one of {', '.join(GRANULARITIES)}, got {granularity!r}"
        )
    if (until - since) / STEP[granularity] > MAX_PERIODS:
        raise ReportFilterError(
            "granularity",
            f"{granularity} gives more than {MAX_PERIODS} periods for this range; pick a coarser one",
        )
    tool = (params.get("tool") or "").strip()
    if len(tool) > 128:
        raise ReportFilterError("tool", "at most 128 characters")
    agent_id = None
    agent_name = ""
    raw_agent = (params.get("agent") or "").strip()
    if raw_agent:
        if not raw_agent.isdigit():
            raise ReportFilterError("agent", f"must be an agent id (a number), got {raw_agent!r}")
        agent = Agent.objects.filter(project=project, pk=int(raw_agent)).only("id", "name").first()
        if agent is None:
            raise ReportFilterError("agent", f"no agent {raw_agent} in this project")
        agent_id, agent_name = agent.pk, agent.name
    return ReportFilters(
        since=since,
        until=until,
        granularity=granularity,
        tool=tool,
        agent_id=agent_id,
        agent_name=agent_name,
        explicit=explicit,
    )


# --- helpers --------------------------------------------------------------------------


def _rollups(
    project: Project,
    f: ReportFilters,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    by: tuple[str, ...] = (),
    period: str | None = None,
):
    """The rollup rows of ``project`` in ``[since, until)`` (default: the filters' range)
    with the filters' tool and agent, for a query grouping by the columns ``by`` (and by
    ``period`` of the bucket, if given): ``rollups.rollup_rows``."""
    return rollup_rows(
        project_id=project.pk,
        since=since or f.since,
        until=until or f.until,
        tool=f.tool or None,
        agent_id=f.agent_id,
        by=by,
        period=period,
    )


def _calls(project: Project, f: ReportFilters):
    qs = ToolCall.objects.filter(project=project, created_at__gte=f.since, created_at__lt=f.until)
    if f.tool:
        qs = qs.filter(tool_name=f.tool)
    if f.agent_id is not None:
        qs = qs.filter(agent_id=f.agent_id)
    return qs


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _period_floor(moment: datetime, granularity: str) -> datetime:
    moment = hour_floor(moment)
    if granularity == "hour":
        return moment
    day = moment.replace(hour=0)
    if granularity == "day":
        return day
    return day - timedelta(days=day.weekday())  # ISO weeks start on Monday


def periods(f: ReportFilters) -> list[tuple[datetime, datetime]]:
    """The time-series periods covering ``[since, until)``, clipped to it:
    ``[(start, end), …]``; the first and last may be partial."""
    out = []
    start = _period_floor(f.since, f.granularity)
    while start < f.until:
        end = start + STEP[f.granularity]
        out.append((max(start, f.since), min(end, f.until)))
        start = end
    return out


def _category_sort(category: str) -> int:
    return CATEGORY_ORDER.index(category) if category in CATEGORY_ORDER else len(CATEGORY_ORDER)


# --- reports reading rollups ------------------------------------------------------------


class CategorySeries(TypedDict):
    """One category's row of ``report_categories``."""

    category: str
    label: str
    counts: list[int]
    total: int


def report_categories(*, project: Project, f: ReportFilters) -> dict:
    """Calls per category per period.

    Returns ``{"periods": [{"since", "until"}], "categories": [category…],
    "series": [{"category", "label", "counts": [int per period], "total"}], "totals": [int per period],
    "total": int, "not_ok": int, "unclassified": int}`` (categories with no calls are left out;
    blank category is ""; ``not_ok`` and ``unclassified`` as defined in ``callgate.metrics``)."""
    spans = periods(f)
    index = {start: i for i, (start, _) in enumerate(spans)}
    rows = (
        _rollups(project, f, period=f.granularity)
        .annotate(period=Trunc("bucket", f.granularity, tzinfo=UTC))
        .values("period", "category")
        .annotate(calls=Sum("calls"))
        .order_by()
    )
    counts: dict[str, list[int]] = {}
    for row in rows:
        period = max(row["period"].astimezone(UTC), f.since)
        i = index.get(period)
        if i is None:  # SQLite week truncation quirks: fall back to a search
            i = next(k for k, (s, e) in enumerate(spans) if s <= period < e)
        counts.setdefault(row["category"], [0] * len(spans))[i] += row["calls"]
    categories = sorted(counts, key=_category_sort)
    series: list[CategorySeries] = [
        {
            "category": c,
            "label": labels.label(c, "category"),
            "counts": counts[c],
            "total": sum(counts[c]),
        }
        for c in categories
    ]
    totals = [sum(counts[c][i] for c in categories) for i in range(len(spans))]
    return {
        "periods": [{"since": iso(s), "until": iso(e)} for s, e in spans],
        "categories": categories,
        "series": series,
        "totals": totals,
        "total": sum(totals),
        "not_ok": sum(s["total"] for s in series if metrics.is_not_ok(s["category"])),
        "unclassified": sum(s["total"] for s in series if s["category"] == metrics.UNCLASSIFIED),
    }


def refused_proposals(
    project: Project,
    f: ReportFilters,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
) -> dict[str, int]:
    """Proposals refused without touching the call they named (TAXONOMY v2: a loop, a sticky
    refusal, a duplicate or mismatch under an existing operation ID), by reason, received in
    the period (default: the filters'), of the filters' tool and agent: counted beside the
    calls so that loops and repeated refusals stay visible. From ``RefusalRollup``
    (``tallies.refused_by_reason``: added to in the batch that stores the event)."""
    return tallies.refused_by_reason(
        project_id=project.pk,
        since=since or f.since,
        until=until or f.until,
        tool=f.tool,
        agent_id=f.agent_id,
    )


def report_reasons(*, project: Project, f: ReportFilters) -> dict:
    """Calls per reason, with its share and the change against the previous period of the
    same length, and the proposals refused with that reason without a call of their own
    (``refused_proposals``). Returns ``{"total", "previous_total", "refused_total",
    "previous": {"since", "until"}, "rows": [{"reason", "category", "calls", "share",
    "previous_calls", "change", "change_ratio", "refused"}]}`` ordered by calls, most first
    (``change_ratio`` None when the previous period had none)."""
    current = dict(
        _rollups(project, f)
        .values("reason")
        .annotate(n=Sum("calls"))
        .values_list("reason", "n")
        .order_by()
    )
    prev_since, prev_until = f.previous
    previous = dict(
        _rollups(project, f, since=prev_since, until=prev_until)
        .values("reason")
        .annotate(n=Sum("calls"))
        .values_list("reason", "n")
        .order_by()
    )
    refused = refused_proposals(project, f)
    total = sum(current.values())
    rows = []
    for reason in set(current) | set(previous) | set(refused):
        n, p = current.get(reason, 0), previous.get(reason, 0)
        category = TABLE[Reason(reason)][0].value if reason in REASON_ORDER else ""
        rows.append(
            {
                "reason": reason,
                "category": category,
                "calls": n,
                "share": _share(n, total),
                "previous_calls": p,
                "change": n - p,
                "change_ratio": round((n - p) / p, 4) if p else None,
                "refused": refused.get(reason, 0),
            }
        )
    rows.sort(key=lambda r: (-r["calls"], -r["previous_calls"], -r["refused"], r["reason"]))
    return {
        "total": total,
        "previous_total": sum(previous.values()),
        "refused_total": sum(refused.values()),
        "previous": {"since": iso(prev_since), "until": iso(prev_until)},
        "rows": rows,
    }


def _grouped_by_category(
    project: Project, f: ReportFilters, key: str
) -> tuple[list[dict], list[str]]:
    rows = (
        _rollups(project, f, by=(key,))
        .values(key, "category")
        .annotate(calls=Sum("calls"), attempts=Sum("attempts"), dups=Sum("duplicates_suppressed"))
        .order_by()
    )
    groups: dict = {}
    seen: set[str] = set()
    for row in rows:
        g = groups.setdefault(
            row[key],
            {
                "key": row[key],
                "calls": 0,
                "attempts": 0,
                "repeats_answered": 0,
                "not_ok": 0,
                "by_category": {},
            },
        )
        g["calls"] += row["calls"]
        g["attempts"] += row["attempts"]
        g["repeats_answered"] += row["dups"]
        if metrics.is_not_ok(row["category"]):
            g["not_ok"] += row["calls"]
        g["by_category"][row["category"]] = g["by_category"].get(row["category"], 0) + row["calls"]
        seen.add(row["category"])
    out = sorted(groups.values(), key=lambda g: (-g["calls"], str(g["key"])))
    for g in out:
        g["not_ok_share"] = _share(g["not_ok"], g["calls"])
    return out, sorted(seen, key=_category_sort)


def report_tools(*, project: Project, f: ReportFilters) -> dict:
    """Calls per tool name. Returns ``{"categories": [category…], "rows": [{"tool", "calls",
    "not_ok", "not_ok_share", "attempts", "repeats_answered", "by_category": {category: n}}]}``
    (``metrics.NUMBERS``: ``repeats_answered`` sums the calls' ``duplicates_suppressed``)."""
    groups, categories = _grouped_by_category(project, f, "tool_name")
    for g in groups:
        g["tool"] = g.pop("key")
    return {"categories": categories, "rows": groups}


def report_agents(*, project: Project, f: ReportFilters) -> dict:
    """Calls per agent. Returns ``{"categories": [...], "rows": [{"agent_id", "agent", "calls",
    "not_ok", "not_ok_share", "attempts", "repeats_answered", "by_category"}]}``."""
    groups, categories = _grouped_by_category(project, f, "agent_id")
    names = dict(
        Agent.objects.filter(project=project, pk__in=[g["key"] for g in groups]).values_list(
            "id", "name"
        )
    )
    for g in groups:
        g["agent_id"] = g.pop("key")
        g["agent"] = names.get(g["agent_id"], f"#{g['agent_id']}")
    return {"categories": categories, "rows": groups}


def report_routes(*, project: Project, f: ReportFilters) -> dict:
    """Calls per route. Returns ``{"total", "rows": [{"route", "label", "calls", "share"}]}``
    in the taxonomy's route order."""
    counts = dict(
        _rollups(project, f)
        .values("route")
        .annotate(n=Sum("calls"))
        .values_list("route", "n")
        .order_by()
    )
    total = sum(counts.values())
    order = [r.value for r in Route]
    rows = [
        {"route": r, "label": labels.label(r, "route"), "calls": n, "share": _share(n, total)}
        for r, n in sorted(
            counts.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)
        )
    ]
    return {"total": total, "rows": rows}


def report_duplicates(*, project: Project, f: ReportFilters) -> dict:
    """The two duplicate numbers of ``metrics.NUMBERS`` per period and per tool: repeats
    answered with the earlier receipt (the calls' ``duplicates_suppressed`` summed) and
    duplicate calls (category ``duplicate``). Returns ``{"repeats_answered",
    "duplicate_calls", "periods": [{"since", "until", "repeats_answered"}], "rows": [{"tool",
    "repeats_answered", "duplicate_calls"}]}``."""
    spans = periods(f)
    repeats = [0] * len(spans)
    rows = (
        _rollups(project, f, period=f.granularity)
        .filter(duplicates_suppressed__gt=0)
        .values("bucket")
        .annotate(n=Sum("duplicates_suppressed"))
        .order_by()
    )
    for row in rows:
        b = row["bucket"].astimezone(UTC)
        i = next(k for k, (s, e) in enumerate(spans) if s <= b < e)
        repeats[i] += row["n"]
    per_tool = (
        _rollups(project, f, by=("tool_name",))
        .values("tool_name")
        .annotate(
            repeats=Sum("duplicates_suppressed"),
            calls=Coalesce(Sum("calls", filter=Q(category=Category.DUPLICATE)), 0),
        )
        .filter(Q(repeats__gt=0) | Q(calls__gt=0))
        .order_by("-repeats", "tool_name")
    )
    return {
        "repeats_answered": sum(repeats),
        "duplicate_calls": sum(r["calls"] for r in per_tool),
        "periods": [
            {"since": iso(s), "until": iso(e), "repeats_answered": n}
            for (s, e), n in zip(spans, repeats, strict=True)
        ],
        "rows": [
            {
                "tool": r["tool_name"],
                "repeats_answered": r["repeats"],
                "duplicate_calls": r["calls"],
            }
            for r in per_tool
        ],
    }


# --- reports reading calls directly ------------------------------------------------------


#: The rollup columns of calls by attempts used, and their labels.
ATTEMPT_COLUMNS = {
    "0": "calls_attempts_0",
    "1": "calls_attempts_1",
    "2": "calls_attempts_2",
    "3": "calls_attempts_3",
    "4": "calls_attempts_4",
    "5+": "calls_attempts_5_plus",
}


def report_retries(*, project: Project, f: ReportFilters) -> dict:
    """Calls that met a retryable failure: now transient (waiting to retry), ended
    ``retry_exhausted``, or used more than one attempt. Outcome of those calls and the
    attempts they used. Returns ``{"total", "succeeded", "succeeded_share", "retrying",
    "exhausted", "other", "outcomes": [{"outcome", "calls"}], "attempts": [{"attempts", "calls"}]}``
    (``attempts`` "5+" groups five and more). From the rollups' calls-by-attempts columns:
    one grouped query over the range's rollup rows."""
    rows = (
        _rollups(project, f)
        .values("category", "reason")
        .annotate(**{label: Sum(column) for label, column in ATTEMPT_COLUMNS.items()})
        .order_by()
    )
    attempts: dict[str, int] = {}
    total = succeeded = retrying = exhausted = 0
    for row in rows:
        whole_cell = (
            row["category"] == Category.TRANSIENT or row["reason"] == Reason.RETRY_EXHAUSTED
        )
        counted = {
            label: row[label] or 0
            for label in ATTEMPT_COLUMNS
            if whole_cell or label not in ("0", "1")
        }
        n = sum(counted.values())
        if not n:
            continue
        for label, calls in counted.items():
            if calls:
                attempts[label] = attempts.get(label, 0) + calls
        total += n
        if row["category"] in GOOD_CATEGORIES or row["reason"] == Reason.RECONCILED_APPLIED:
            succeeded += n
        if row["category"] == Category.TRANSIENT:
            retrying += n
        if row["reason"] == Reason.RETRY_EXHAUSTED:
            exhausted += n
    other = total - succeeded - retrying - exhausted
    return {
        "total": total,
        "succeeded": succeeded,
        "succeeded_share": _share(succeeded, total),
        "retrying": retrying,
        "exhausted": exhausted,
        "other": other,
        "outcomes": [
            {"outcome": "succeeded", "calls": succeeded},
            {"outcome": "still_retrying", "calls": retrying},
            {"outcome": "retry_exhausted", "calls": exhausted},
            {"outcome": "other", "calls": other},
        ],
        "attempts": [
            {"attempts": k, "calls": attempts[k]} for k in ATTEMPT_COLUMNS if k in attempts
        ],
    }


def report_unknown_outcomes(*, project: Project, f: ReportFilters) -> dict:
    """Calls whose write had an unknown outcome (now or earlier: ``metrics.unknown_ever_q``), and
    how each was settled: by a human (a decision was recorded), by reconciliation or a later
    event (finished without a decision), or still open. Returns ``{"total",
    "by_reconciliation", "by_human", "open", "rows": [{"reason", "category", "by_reconciliation",
    "by_human", "open", "calls"}]}``. From the rollups' unknown-outcome columns: one grouped
    query over this project's rollup rows of the range (no other tenant's rows are read)."""
    rows = (
        _rollups(project, f)
        .filter(unknown_calls__gt=0)
        .values("reason", "category")
        .annotate(
            calls_n=Sum("unknown_calls"), by_human=Sum("unknown_decided"), open=Sum("unknown_open")
        )
        .order_by("-calls_n", "reason")
    )
    out = []
    for r in rows:
        out.append(
            {
                "reason": r["reason"],
                "category": r["category"],
                "calls": r["calls_n"],
                "by_human": r["by_human"],
                "open": r["open"],
                "by_reconciliation": r["calls_n"] - r["by_human"] - r["open"],
            }
        )
    return {
        "total": sum(r["calls"] for r in out),
        "by_reconciliation": sum(r["by_reconciliation"] for r in out),
        "by_human": sum(r["by_human"] for r in out),
        "open": sum(r["open"] for r in out),
        "rows": out,
    }


def report_contracts(*, project: Project, f: ReportFilters) -> dict:
    """Contract quality: each tool version's lint score beside the share of its calls (in the
    range) that were argument errors or hallucinations. Returns ``{"rows": [{"tool", "version",
    "contract_id", "lint_score", "lint_findings", "calls", "argument_errors",
    "argument_error_rate", "hallucinations", "hallucination_rate"}]}`` (versions without
    calls in the range included when no tool filter hides them; rates None without calls).
    Counts from the rollups (cells per contract version)."""
    per_contract = {
        r["contract_id"]: r
        for r in _rollups(project, f, by=("contract_id",))
        .filter(contract__isnull=False)
        .values("contract_id")
        .annotate(
            calls_n=Sum("calls"),
            argument_errors=Coalesce(Sum("calls", filter=Q(category=Category.ARGUMENT_ERROR)), 0),
            hallucinations=Coalesce(Sum("calls", filter=Q(category=Category.HALLUCINATION)), 0),
        )
        .order_by()
    }
    contracts = ToolContract.objects.filter(project=project)
    if f.tool:
        contracts = contracts.filter(name=f.tool)
    if f.agent_id is not None:  # only versions the agent called
        contracts = contracts.filter(pk__in=list(per_contract))
    rows = []
    for c in contracts.only("id", "name", "version", "lint_score", "lint_findings").order_by(
        "name", "-version"
    ):
        stats = per_contract.get(c.pk, {"calls_n": 0, "argument_errors": 0, "hallucinations": 0})
        rows.append(
            {
                "tool": c.name,
                "version": c.version,
                "contract_id": c.pk,
                "lint_score": c.lint_score,
                "lint_findings": len(c.lint_findings or []),
                "calls": stats["calls_n"],
                "argument_errors": stats["argument_errors"],
                "argument_error_rate": _share(stats["argument_errors"], stats["calls_n"]),
                "hallucinations": stats["hallucinations"],
                "hallucination_rate": _share(stats["hallucinations"], stats["calls_n"]),
            }
        )
    return {"rows": rows}


AGE_BUCKETS = [
    ("under_15m", "< 15 min", timedelta(minutes=15)),
    ("15m_1h", "15 min – 1 h", timedelta(hours=1)),
    ("1h_4h", "1 – 4 h", timedelta(hours=4)),
    ("4h_24h", "4 – 24 h", timedelta(hours=24)),
    ("over_24h", "> 24 h", None),
]


def report_review(*, project: Project, f: ReportFilters, now: datetime | None = None) -> dict:
    """Health of the review queue. Open items by age (now, whatever the range), time from an
    item's opening to a human's decision (items resolved in the range, in seconds: median and
    p90 by nearest rank over log-scale buckets, within 4.4 % of the exact value; None
    without any), decisions by type (including items settled by a later event or expired)
    and overrides (approvals that skipped the reconciliation guard). The closed items are
    counted from ``ReviewRollup`` (``callgate.reports.tallies``: kept in the closing transaction, so
    exact at once), the open ones over their partial index.
    Returns ``{"available": bool, "open_total", "open_by_age": [{"bucket", "label", "items"}],
    "decided": int (closed in the range), "human_decided": int (of those, decided by a human),
    "median_seconds", "p90_seconds", "decisions": [{"resolution", "items"}],
    "overrides": int | None}``; ``available`` is False (and the rest empty) when the
    reviews app is not installed."""
    empty = {
        "available": False,
        "open_total": 0,
        "open_by_age": [],
        "decided": 0,
        "human_decided": 0,
        "median_seconds": None,
        "p90_seconds": None,
        "decisions": [],
        "overrides": None,
    }
    try:
        ReviewItem = apps.get_model("reviews", "ReviewItem")
    except LookupError:
        return empty
    now = now or timezone.now()
    items = ReviewItem.objects.filter(project=project)
    if f.tool:
        items = items.filter(tool_name=f.tool)
    if f.agent_id is not None:
        items = items.filter(agent_id=f.agent_id)
    # open items by age: one aggregate over the open items' partial index
    open_items = items.filter(status__in=["open", "claimed"])
    ranges = {}
    lower = timedelta(0)
    for key, _label, upper in AGE_BUCKETS:
        q = Q(created_at__lte=now - lower)
        if upper is not None:
            q &= Q(created_at__gt=now - upper)
        ranges[key] = Count("id", filter=q)
        lower = upper or lower
    ages = open_items.aggregate(total=Count("id"), **ranges)
    by_age = [{"bucket": key, "label": label, "items": ages[key]} for key, label, _ in AGE_BUCKETS]
    by_resolution: dict[str, int] = {}
    # time to decision counts human decisions only: an item settled by a later event or an
    # approval that ran out closes with no one deciding (often at once, which read as "0 s")
    human: dict[int, int] = {}
    for status, resolution, bucket, n in tallies.decided_cells(
        project_id=project.pk, since=f.since, until=f.until, tool=f.tool, agent_id=f.agent_id
    ):
        by_resolution[resolution] = by_resolution.get(resolution, 0) + n
        if status == ReviewItem.Status.RESOLVED:
            human[bucket] = human.get(bucket, 0) + n
    decisions = [
        {"resolution": r or "none", "items": n}
        for r, n in sorted(by_resolution.items(), key=lambda rn: (-rn[1], rn[0]))
        if n
    ]
    overrides = None
    try:
        ReviewAudit = apps.get_model("reviews", "ReviewAudit")
    except LookupError:
        ReviewAudit = None
    if ReviewAudit is not None and any(
        fl.name == "override" for fl in ReviewAudit._meta.get_fields()
    ):
        audits = ReviewAudit.objects.filter(
            project=project, override=True, created_at__gte=f.since, created_at__lt=f.until
        )
        if f.tool or f.agent_id is not None:
            # overrides are rare: their items, then which of those have the tool and agent
            # (a join let the planner read every tenant's items to match a handful)
            ids = list(audits.values_list("item_id", flat=True))
            kept = set(items.filter(pk__in=set(ids)).values_list("pk", flat=True))
            overrides = sum(1 for i in ids if i in kept)
        else:
            overrides = audits.count()
    return {
        "available": True,
        "open_total": ages["total"],
        "open_by_age": by_age,
        "decided": sum(d["items"] for d in decisions),
        "human_decided": sum(human.values()),
        "median_seconds": tallies.histogram_percentile(human, 0.5),
        "p90_seconds": tallies.histogram_percentile(human, 0.9),
        "decisions": decisions,
        "overrides": overrides,
    }


def direct_counts(
    *, project: Project, since: datetime, until: datetime
) -> dict[tuple, tuple[int, int, int]]:
    """For checks: ``{(hour, tool, agent_id, reason, route): (calls, attempts, duplicates)}``
    counted directly over ``ToolCall`` (what the rollups must equal)."""
    out: dict[tuple, tuple[int, int, int]] = {}
    for c in ToolCall.objects.filter(
        project=project, created_at__gte=since, created_at__lt=until
    ).only(
        "created_at",
        "tool_name",
        "agent_id",
        "reason",
        "route",
        "attempts",
        "duplicates_suppressed",
    ):
        key = (hour_floor(c.created_at), c.tool_name, c.agent_id, c.reason, c.route)
        n, a, d = out.get(key, (0, 0, 0))
        out[key] = (n + 1, a + c.attempts, d + c.duplicates_suppressed)
    return out
