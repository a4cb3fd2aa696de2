"""Reads of the core domain. Callers pass the project; nothing here crosses projects."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypedDict, cast

from django.db.models import Count, F, Prefetch, Q, QuerySet, Sum, Window
from django.db.models.functions import Coalesce, RowNumber

from callgate import metrics, search
from callgate.models import (
    Agent,
    AgentTool,
    ApiKey,
    CallEvent,
    InboxEvent,
    Project,
    SavedView,
    ToolCall,
    ToolContract,
)
from callgate.reports.rollups import rollup_rows
from callgate.search import Term
from callgate.taxonomy import Category
from reviews.models import ReviewItem

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


def open_review_count(*, project: Project) -> int:
    """Open review items in ``project`` (shown beside "Review" in the navigation)."""
    return ReviewItem.objects.filter(project=project, status__in=ReviewItem.OPEN_STATUSES).count()


# --- calls list -------------------------------------------------------------------------

#: rows per page of the calls list
CALLS_PAGE_SIZE = 50
#: the time-range presets of the filter bar: value -> length (see ``metrics.list_since``)
TIME_PRESETS = metrics.WINDOWS


@dataclass(frozen=True)
class CallFilters:
    """What the calls list is narrowed to; every field empty means "all calls".

    ``agent`` is an agent's primary key (the page's select), ``agent_name`` its name (the
    API); ``since``/``until`` are aware datetimes (``until`` exclusive); ``operation`` is an
    operation ID prefix; ``trace_id``, ``request_id`` and ``conversation_id`` match exactly;
    ``search`` holds the terms of a search query (``callgate.search``), each a condition
    on top of the others (``search_q``)."""

    reason: str = ""
    category: str = ""
    route: str = ""
    tool: str = ""
    agent: int | None = None
    agent_name: str = ""
    state: str = ""
    since: datetime | None = None
    until: datetime | None = None
    operation: str = ""
    trace_id: str = ""
    request_id: str = ""
    conversation_id: str = ""
    search: tuple[Term, ...] = ()

    def active(self) -> bool:
        return any(getattr(self, f.name) not in ("", None, ()) for f in fields(self))


#: The ``ToolCall`` lookup of each ``CallFilters`` field (``category`` and ``tool`` have
#: pseudo-values: ``call_q``).
CALL_LOOKUPS = {
    "reason": "reason",
    "category": "category",
    "route": "route",
    "tool": "tool_name",
    "agent": "agent_id",
    "agent_name": "agent__name",
    "state": "state",
    "since": "created_at__gte",
    "until": "created_at__lt",
    "operation": "operation_id__startswith",
    "trace_id": "trace_id",
    "request_id": "request_id",
    "conversation_id": "conversation_id",
}
#: The ``CallFilters`` field each key of the search language narrows (``callgate.search``).
SEARCH_FIELDS = {
    "tool": "tool",
    "agent": "agent_name",
    "reason": "reason",
    "category": "category",
    "route": "route",
    "state": "state",
    "request": "request_id",
    "operation": "operation",
    "conversation": "conversation_id",
    "trace": "trace_id",
}
#: The keys that narrow review items only (the queue takes them; the calls list does not)
SEARCH_ITEM_KEYS = ("is", "assignee")
#: What free text of a search matches: one of these IDs (the operation ID by prefix) ...
SEARCH_TEXT_IDS = ("operation", "request_id", "trace_id", "conversation_id")
#: ... or a piece of the error text the model was told (case-insensitive; on PostgreSQL
#: the trigram index ``toolcall_observation_trgm`` of migration 0024 serves it)
SEARCH_TEXT_LOOKUP = "observation__icontains"
#: The values the search language accepts per key on the calls list (the category filter
#: takes the pseudo-values of ``metrics.CATEGORY_SETS`` too)
SEARCH_CHOICES = {**search.CHOICES, "category": [*Category.values, *metrics.CATEGORY_SETS]}


def call_q(name: str, value) -> Q:
    """The ``ToolCall`` condition of the ``CallFilters`` field ``name`` set to ``value``: the
    one definition the filter bar, the API and the search language share."""
    if name == "category":  # a slug or one of metrics.CATEGORY_SETS
        return metrics.category_q(value)
    if name == "tool":
        return metrics.tool_q(value)
    return Q(**{CALL_LOOKUPS[name]: value})


def search_q(term: Term) -> Q:
    """The ``ToolCall`` condition of one search term (negated with ``-``). Free text matches
    an ID (``SEARCH_TEXT_IDS``) or the error text. Raises ``QueryError`` for the keys that
    are about review items (``is:``, ``assignee:``): the review queue takes those."""
    if term.key in SEARCH_ITEM_KEYS:
        raise search.QueryError(
            str(term), f"{term.key}: narrows review items; search the review queue with it"
        )
    if term.key:
        condition = call_q(SEARCH_FIELDS[term.key], term.value)
    else:
        condition = Q(**{SEARCH_TEXT_LOOKUP: term.value})
        for name in SEARCH_TEXT_IDS:
            condition |= call_q(name, term.value)
    return ~condition if term.negated else condition


def search_parse(query: str) -> tuple[Term, ...]:
    """The terms of a calls-list search (``search.query_parse`` with ``SEARCH_CHOICES``),
    each checked by ``search_q``. Raises ``search.QueryError`` naming a malformed term."""
    terms = tuple(search.query_parse(query, choices=SEARCH_CHOICES))
    for term in terms:
        search_q(term)
    return terms


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Cursor:
    """A position in the calls list: the (created_at, id) of a row. Keyset pagination does
    not count or skip rows, so page 400 costs the same as page 1. Encoded as opaque
    URL-safe text; the time travels as whole microseconds (no float rounding, which would
    skip or repeat rows created within a microsecond of a page boundary)."""

    created_at: datetime
    id: int

    def encode(self) -> str:
        micros = (self.created_at - _EPOCH) // timedelta(microseconds=1)
        return base64.urlsafe_b64encode(f"{micros}.{self.id}".encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, raw: str) -> Cursor | None:
        """The cursor ``raw`` names, or None when it is not one of ours."""
        try:
            text = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode("ascii")
            micros, pk = text.split(".", 1)
            created_at = _EPOCH + timedelta(microseconds=int(micros))
            if not micros.isdigit() or not pk.isdigit() or int(pk) >= 2**63:
                return None
            return cls(created_at=created_at, id=int(pk))
        except (ValueError, OverflowError, UnicodeDecodeError, binascii.Error):
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
    for name in CALL_LOOKUPS:
        value = getattr(filters, name)
        if name not in ignore and value not in ("", None):
            qs = qs.filter(call_q(name, value))
    for term in () if "search" in ignore else filters.search:
        qs = qs.filter(search_q(term))
    return qs


def calls_repeats_answered(*, project: Project, filters: CallFilters) -> int:
    """Repeats answered with the earlier receipt (``metrics.NUMBERS``) over the calls matching
    ``filters``: their ``duplicates_suppressed`` summed, what the calls list of
    ``category=repeated`` shows beside its row count."""
    qs = calls_filtered(project=project, filters=filters)
    return qs.aggregate(n=Coalesce(Sum("duplicates_suppressed"), 0))["n"]


def calls_page(
    *,
    project: Project,
    filters: CallFilters,
    before: Cursor | None = None,
    after: Cursor | None = None,
    size: int = CALLS_PAGE_SIZE,
    detail: bool = False,
) -> CallPage:
    """A page of matching calls, newest first: the ``size`` rows older than ``before``, or
    newer than ``after``, or the newest. One query (plus none per row: agent and contract are
    joined). The page's rows load the list's columns; ``detail`` loads whole rows (the API's
    items have every field of ``GET /api/v1/calls/{operation_id}``)."""
    qs = calls_filtered(project=project, filters=filters).select_related("agent", "contract")
    if not detail:
        qs = qs.only(
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
    project: from the rollups when only tool, agent, reason, route and a time range of
    whole UTC hours (the presets of a day or more: ``since=24h``, the reports' links) are
    filtered (exact as of the last refresh, at most a minute old), else (``since=1h``, the
    past 60 minutes, included) counted over the newest
    ``COUNT_CAP + 1`` matching calls (an index scan stopping there)."""
    used = {f.name for f in fields(filters) if getattr(filters, f.name) not in ("", None, ())}
    hours = all(
        moment is None or moment == metrics.hour_floor(moment)
        for moment in (filters.since, filters.until)
    )
    if used <= ROLLUP_FILTERS | {"since", "until"} and hours:
        rollups = rollup_rows(
            project_id=project.pk,
            since=filters.since,
            until=filters.until,
            tool=None
            if not filters.tool
            else ""
            if filters.tool == metrics.NO_TOOL
            else filters.tool,
            agent_id=filters.agent,
        )
        for name in ("reason", "route"):
            if getattr(filters, name):
                rollups = rollups.filter(**{name: getattr(filters, name)})
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


def call_by_operation(*, calls, operation_id: str) -> ToolCall | None:
    """The call of ``calls`` (a queryset already scoped to a project, or an agent) named by
    ``operation_id``: its own, or the one it was proposed under before an operator's edit
    gave it a new one (``services.call_arguments_edit``)."""
    return (
        calls.filter(operation_id=operation_id).first()
        or calls.filter(proposed_operation_id=operation_id)
        .exclude(proposed_operation_id="")
        .first()
    )


def call_for_detail(*, project: Project, operation_id: str) -> ToolCall | None:
    """The call with its agent, contract and decider, or None (also for other projects'
    calls); by its operation ID or the one it was proposed under (``call_by_operation``)."""
    return call_by_operation(
        calls=ToolCall.objects.select_related("agent", "contract", "decided_by").filter(
            project=project
        ),
        operation_id=operation_id,
    )


def call_timeline(*, call: ToolCall) -> list[CallEvent]:
    """The call's events in the order callgate received them."""
    return list(
        CallEvent.objects.filter(call=call, project_id=call.project_id).order_by(
            "received_at", "id"
        )
    )


def call_turn(*, events: list[CallEvent]) -> list[CallEvent]:
    """The model turn a call came from (TAXONOMY v2): one proposal event per call of that
    turn, in the turn's order, each with its call and the verdict it got (``reason``,
    ``category``, ``route`` of the event). Empty when the call was proposed alone. ``events``
    is the call's timeline; one query."""
    from callgate.ingest import turn_event_ids

    origin = next(
        (
            e
            for e in events
            if e.kind == CallEvent.Kind.PROPOSED
            and isinstance(e.body, dict)
            and isinstance(e.body.get("turn"), dict)
        ),
        None,
    )
    if origin is None:
        return []
    turn = origin.body["turn"]
    ids = turn_event_ids(turn["event_id"], int(turn["calls"]))
    found = {
        e.event_id: e
        for e in CallEvent.objects.filter(project_id=origin.project_id, event_id__in=ids)
        .select_related("call")
        .only(
            "event_id",
            "reason",
            "category",
            "route",
            "body",
            "call__operation_id",
            "call__tool_name",
            "call__call_id",
            "call__executed_by",
            "call__reason",
            "call__category",
            "call__state",
        )
    }
    return [found[i] for i in ids if i in found]


def call_open_review_item(*, call: ToolCall):
    """The call's open or claimed review item, or None."""
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
        for row in rollup_rows(project_id=project.pk, by=("tool_name",))
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


class ContractCalls(TypedDict):
    """What ``contract_versions`` sets on each version."""

    n_calls: int


def contract_versions(
    *, project: Project, name: str
) -> list[WithAnnotations[ToolContract, ContractCalls]]:
    """Every version of one tool's contract, newest first, each with ``n_calls`` (from the
    rollups, as of their last refresh)."""
    versions = cast(  # each version gets its n_calls below
        "list[WithAnnotations[ToolContract, ContractCalls]]",
        list(ToolContract.objects.filter(project=project, name=name).order_by("-version")),
    )
    counts = dict(
        rollup_rows(project_id=project.pk, by=("contract_id",))
        .filter(contract__in=versions)
        .values("contract_id")
        .annotate(n=Sum("calls"))
        .order_by()
        .values_list("contract_id", "n")
    )
    for version in versions:
        version.n_calls = counts.get(version.pk, 0)
    return versions


def contract_as_input(contract: ToolContract) -> dict:
    """``contract`` in the shape ``PUT /api/v1/tools/{name}`` takes (``schemas.ContractIn``):
    what the contract page's "Publish a version" form starts from."""
    return {
        "description": contract.description,
        "effect": contract.effect,
        "idempotent": contract.idempotent,
        "reconcilable": contract.reconcile_method == ToolContract.ReconcileMethod.AGENT,
        "reconcile_url": contract.reconcile_url or None,
        "max_attempts": contract.max_attempts,
        "max_reasks": contract.max_reasks,
        "requires_approval": contract.requires_approval,
        "approval_timeout_seconds": contract.approval_timeout_seconds,
        "retry": {
            "initial_interval": contract.retry_initial_interval,
            "backoff_coefficient": contract.retry_backoff_coefficient,
            "maximum_interval": contract.retry_maximum_interval,
            "deadline_seconds": contract.deadline_seconds,
        },
        "sensitive_fields": contract.sensitive_fields,
        "parameters": contract.parameters,
    }


# --- agents ------------------------------------------------------------------------------


#: Refused events listed per agent on the agents page (the newest).
REFUSED_SHOWN = 10


class AgentActivity(TypedDict):
    """What ``agents_with_keys`` sets on each agent."""

    calls_24h: int
    pending_events: int
    refused_count: int
    refused: list[InboxEvent]


def agents_with_keys(*, project: Project) -> list[WithAnnotations[Agent, AgentActivity]]:
    """The project's agents with ``api_keys`` (newest first) and ``tools`` prefetched and
    ``calls_24h`` (calls of the last 24 whole UTC hours, this one so far, from the
    rollups: as of their last refresh, a read of 24 hours of rollup rows); from the inbox,
    ``pending_events`` (received, not applied yet),
    ``refused_count`` and ``refused`` (the newest ``REFUSED_SHOWN`` events the rules refused
    when applying them, kept until retention). Five queries. "24 hours" is the window of
    ``metrics.window`` (whole hours), as on the overview and the calls list's ``since=24h``."""
    since = metrics.window(TIME_PRESETS["24h"])[0]
    recent = dict(
        rollup_rows(project_id=project.pk, since=since, by=("agent_id",))
        .values("agent_id")
        .annotate(n=Sum("calls"))
        .order_by()
        .values_list("agent_id", "n")
    )
    agents = cast(  # each agent gets its activity below
        "list[WithAnnotations[Agent, AgentActivity]]",
        list(
            Agent.objects.filter(project=project)
            .prefetch_related(
                Prefetch("api_keys", queryset=ApiKey.objects.order_by("revoked_at", "-created_at")),
                Prefetch("tools", queryset=AgentTool.objects.order_by("name")),
            )
            .order_by("name")
        ),
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


# --- saved views -------------------------------------------------------------------------


def saved_views(*, user, project: Project, page: str) -> list[SavedView]:
    """The user's saved views of ``page`` (``SavedView.Page``) in ``project``, by name."""
    return list(SavedView.objects.filter(user=user, project=project, page=page).order_by("name"))


def saved_view_for(*, user, project: Project, pk: int) -> SavedView | None:
    """The user's saved view ``pk`` in ``project``, or None (another user's too: a 404)."""
    return SavedView.objects.filter(user=user, project=project, pk=pk).first()
