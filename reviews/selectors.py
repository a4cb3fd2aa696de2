"""Reads for the review queue. Every function takes the project; nothing crosses projects."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import cached_property
from urllib.parse import urlencode

from django.contrib.auth import get_user_model
from django.db.models import (
    BooleanField,
    Count,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from callgate import search
from callgate import selectors as core_selectors
from callgate.models import Agent, CallEvent, Membership, ToolCall
from callgate.search import Term
from reviews.models import ClosedItemCount, ReviewItem

#: Age filter values → minimum age.
AGE_CHOICES = {"15m": timedelta(minutes=15), "1h": timedelta(hours=1), "24h": timedelta(hours=24)}
ASSIGNEE_CHOICES = ("anyone", "me", "unassigned")
STATUS_CHOICES = ("open", "claimed", "resolved", "expired", "settled", "all")
PAGE_SIZE = 50
#: How long the item page polls for the result of "Reconcile now".
RECONCILE_PATIENCE = timedelta(seconds=90)


@dataclass(frozen=True)
class QueueFilters:
    """The queue's filter bar, parsed from the query string (unknown values are ignored).
    ``q`` is a search query (``callgate.search``; ``search_q`` says what its terms mean
    here); ``search_error`` says why the ``q`` asked for was malformed (it is then empty)."""

    tool: str = ""
    reason: str = ""
    agent: str = ""
    age: str = ""
    assignee: str = "anyone"
    status: str = "open"
    q: str = ""
    search_error: str = ""

    NAMES = ("tool", "reason", "agent", "age", "assignee", "status", "q")

    @classmethod
    def from_query(cls, query) -> QueueFilters:
        values = {name: (query.get(name) or "").strip()[:128] for name in cls.NAMES}
        if values["age"] not in AGE_CHOICES:
            values["age"] = ""
        if values["assignee"] not in ASSIGNEE_CHOICES:
            values["assignee"] = "anyone"
        if values["status"] not in STATUS_CHOICES:
            values["status"] = "open"
        values["q"] = (query.get("q") or "").strip()
        try:
            search.query_parse(values["q"], choices=core_selectors.SEARCH_CHOICES)
        except search.QueryError as exc:
            values["q"] = ""
            values["search_error"] = f"Search term {exc.term!r}: {exc.message}."
        return cls(**values)

    @cached_property
    def terms(self) -> list[Term]:
        """The terms of ``q`` (``from_query`` has checked it; raises ``QueryError`` if not)."""
        return search.query_parse(self.q, choices=core_selectors.SEARCH_CHOICES)

    def as_dict(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in self.NAMES}

    def query(self, **changes) -> str:
        """The query string of these filters with ``changes`` (defaults left out)."""
        values = {**self.as_dict(), **changes}
        defaults = QueueFilters().as_dict()
        return urlencode({k: v for k, v in values.items() if v and v != defaults[k]})

    @cached_property
    def query_string(self) -> str:
        """``query()``, built once: a page links it from its pager, its poll and every row."""
        return self.query()

    @cached_property
    def active(self) -> list[tuple[str, str, str]]:
        """(name, value, query string without it) of each non-default filter: the clear chips."""
        defaults = QueueFilters().as_dict()
        return [
            (k, v, self.query(**{k: defaults[k]}))
            for k, v in self.as_dict().items()
            if v != defaults[k]
        ]


def _status_q(status: str) -> Q:

    if status == "open":
        return Q(status__in=ReviewItem.OPEN_STATUSES)
    if status == "all":
        return Q()
    return Q(status=status)


def item_q(name: str, value: str, *, project, user, now) -> Q:
    """The ``ReviewItem`` condition of the queue filter ``name`` (one of
    ``QueueFilters.NAMES`` but ``q``) set to ``value``: the one definition the filter bar,
    bulk "all matching" and the search's item keys share. ``assignee`` takes ``anyone``,
    ``me``, ``unassigned`` (lapsed claims count as unassigned) or a username (the holder
    of a live claim)."""
    if name == "status":
        return _status_q(value)
    if name == "tool":
        return Q(tool_name=value)
    if name == "reason":
        return Q(reason=value)
    if name == "agent":
        # the agent's id from a subquery that is not correlated (run once, an InitPlan), so
        # the open items are read by the (project, agent, queue order) index; the join on
        # the name read every matching item and joined each to its call before sorting
        # (0, no agent's id, when no agent has the name: so that a negated term holds)
        agent = Agent.objects.filter(project=project, name=value).values("pk")[:1]
        return Q(agent_id=Coalesce(Subquery(agent), Value(0)))
    if name == "age":
        return Q(created_at__lte=now - AGE_CHOICES[value])
    if name == "assignee":
        live = Q(status=ReviewItem.Status.CLAIMED, lease_expires_at__gt=now, assignee__isnull=False)
        if value == "anyone":
            return Q()
        if value == "me":
            return live & Q(assignee=user)
        if value == "unassigned":
            return ~live
        return live & Q(assignee__username=value)
    raise ValueError(f"no queue filter {name!r}")


#: The search keys that narrow review items by their own columns (``item_q``); the others
#: narrow them by their calls (``callgate.selectors.search_q``).
SEARCH_ITEM_KEYS = {"tool": "tool", "agent": "agent", "reason": "reason", "assignee": "assignee"}


def search_q(term: Term, *, project, user, now) -> Q:
    """The ``ReviewItem`` condition of one search term: ``is:open``/``is:claimed`` is the
    status filter's, ``tool:``, ``agent:``, ``reason:`` and ``assignee:`` the filter bar's
    (``item_q``); every other key and free text are the calls list's
    (``callgate.selectors.search_q``), over the item's call."""
    if term.key == "is":
        condition = item_q("status", term.value, project=project, user=user, now=now)
    elif term.key in SEARCH_ITEM_KEYS:
        condition = item_q(
            SEARCH_ITEM_KEYS[term.key], term.value, project=project, user=user, now=now
        )
    else:
        calls = ToolCall.objects.filter(project=project).filter(
            core_selectors.search_q(replace(term, negated=False))
        )
        condition = Q(call__in=calls.values("pk"))
    return ~condition if term.negated else condition


def _apply(qs: QuerySet, filters: QueueFilters, *, project, user, now) -> QuerySet:

    for name in QueueFilters.NAMES:
        value = getattr(filters, name)
        if not value or name == "q":
            continue
        qs = qs.filter(item_q(name, value, project=project, user=user, now=now))
    return _searched(qs, filters, project=project, user=user, now=now)


def _searched(qs: QuerySet, filters: QueueFilters, *, project, user, now) -> QuerySet:
    """``qs`` narrowed by the terms of the search ``filters.q`` alone."""
    for term in filters.terms:
        qs = qs.filter(search_q(term, project=project, user=user, now=now))
    return qs


def absent_reconciliations() -> QuerySet:
    """Trusted ``reconciled`` CallEvents (not an agent's ``information_only`` report) that
    found nothing in the target AND are newer than every
    ``attempt`` event of their call (by ``received_at``, then id). Only such a look-up proves
    the latest attempt did not happen; one from before a later attempt proves nothing about it.
    Filter by call (``.filter(call=…)`` or ``call=OuterRef("call")``) before use."""
    later_attempt = CallEvent.objects.filter(
        call_id=OuterRef("call_id"), kind=CallEvent.Kind.ATTEMPT
    ).filter(
        Q(received_at__gt=OuterRef("received_at"))
        | Q(received_at=OuterRef("received_at"), pk__gt=OuterRef("pk"))
    )
    return (
        CallEvent.objects.filter(kind=CallEvent.Kind.RECONCILED, body__found=False)
        .exclude(body__has_key="information_only")  # an agent's untrusted report (ingest)
        .filter(~Exists(later_attempt))
    )


#: The queue's order: most urgent first, then oldest (``pk`` breaks ties): the keyset.
QUEUE_ORDER = ("priority", "created_at", "pk")
#: What a queue row shows of an item's call, agent, contract and assignee.
ROW_RELATIONS = ("call", "call__agent", "call__contract", "assignee")
#: The columns a queue row shows (``reviews.views.QueueRow``, ``queue.html#queue-row``):
#: the rest of a call (its arguments and receipt), of its contract (schema, lint findings)
#: and of the item were most of a row's cost, and rows are the only part of the page whose
#: cost grows with it. A test pins the page's query count, whatever its rows.
ROW_FIELDS = (
    *("id", "project_id", "call_id", "kind", "status", "reason", "tool_name", "agent_id"),
    *("priority", "assignee_id", "lease_expires_at", "approval_expires_at", "resolution"),
    *("agent_retries", "created_at"),
    *("call__id", "call__operation_id", "call__tool_name", "call__attempts", "call__reason"),
    *("call__observation", "call__state", "call__agent_id", "call__contract_id"),
    *("call__agent__id", "call__agent__name"),
    *("call__contract__id", "call__contract__max_attempts", "call__contract__effect"),
    *("call__contract__reconcile_method", "assignee__id", "assignee__username"),
)


def queue_items(*, project, filters: QueueFilters, user, now=None) -> QuerySet:
    """Items matching ``filters`` in queue order (``QUEUE_ORDER``), with the call, agent and
    assignee (``annotate_rows`` adds what a page's rows show)."""

    now = now or timezone.now()
    return (
        _apply(
            ReviewItem.objects.filter(project=project), filters, project=project, user=user, now=now
        )
        .select_related(*ROW_RELATIONS)
        .order_by(*QUEUE_ORDER)
    )


@dataclass(frozen=True)
class QueueCursor:
    """A position in queue order: the (priority, created_at, pk) of an item. Keyset
    pagination neither counts nor skips rows, so the last page costs what the first does."""

    priority: int
    created_at: datetime
    id: int

    @classmethod
    def of(cls, item) -> QueueCursor:
        return cls(item.priority, item.created_at, item.pk)

    def encode(self) -> str:
        return f"{self.priority}.{int(self.created_at.timestamp() * 1_000_000)}.{self.id}"

    @classmethod
    def decode(cls, raw: str | None) -> QueueCursor | None:
        """The cursor ``raw`` names, or None when it is not one of ours."""
        try:
            priority, micros, pk = (raw or "").split(".")
            moment = datetime.fromtimestamp(int(micros) / 1_000_000, tz=UTC)
            return cls(int(priority), moment, int(pk))
        except (ValueError, OverflowError, OSError):
            return None

    def after(self) -> Q:
        """Items after this one in queue order."""
        p, c, pk = self.priority, self.created_at, self.id
        return (
            Q(priority__gt=p)
            | Q(priority=p, created_at__gt=c)
            | Q(priority=p, created_at=c, pk__gt=pk)
        )

    def before(self) -> Q:
        p, c, pk = self.priority, self.created_at, self.id
        return (
            Q(priority__lt=p)
            | Q(priority=p, created_at__lt=c)
            | Q(priority=p, created_at=c, pk__lt=pk)
        )


@dataclass
class QueuePage:
    """One page of the queue. ``next``/``previous`` are cursors of the neighbouring pages
    (None at either end); ``first`` and ``last``: this page is one. How many items match
    is ``QueueCounts.matching``."""

    rows: list
    next: str | None
    previous: str | None

    @property
    def first(self) -> bool:
        return self.previous is None

    @property
    def last(self) -> bool:
        return self.next is None


def queue_page(
    *,
    project,
    filters: QueueFilters,
    user,
    now=None,
    after: QueueCursor | None = None,
    before: QueueCursor | None = None,
    last: bool = False,
    size: int | None = None,
) -> QueuePage:
    """A page of ``queue_items``: the ``size`` items after ``after``, or before ``before``,
    or the last ones (``last``), or the first, each with ``has_absent`` (``annotate_rows``).
    Two queries whatever the page or the project's size: the page's keys over the items
    alone, then those items with the columns of their calls, agents, contracts and assignees
    a row shows (``ROW_FIELDS``), in one; the rows' reconciliations in the other."""
    size = size or PAGE_SIZE
    qs = queue_items(project=project, filters=filters, user=user, now=now)
    backwards = before is not None or last
    if after is not None:
        qs = qs.filter(after.after())
    elif before is not None:
        qs = qs.filter(before.before())
    if backwards:
        qs = qs.reverse()
    # the page's keys first, over the items alone, then their calls, agents and contracts:
    # joined before the limit, every match (an operator's thousand claims) was read whole
    keys = qs.values("pk")[: size + 1]
    page = (
        ReviewItem.objects.filter(pk__in=keys)
        .select_related(*ROW_RELATIONS)
        .only(*ROW_FIELDS)
        .order_by(*QUEUE_ORDER)
    )
    rows = list(page.reverse() if backwards else page)
    if backwards:
        more_before, more_after = len(rows) > size, before is not None
        rows = rows[:size][::-1]
    else:
        more_after, more_before = len(rows) > size, after is not None
        rows = rows[:size]
    annotate_rows(project=project, rows=rows)
    return QueuePage(
        rows=rows,
        next=QueueCursor.of(rows[-1]).encode() if rows and more_after else None,
        previous=QueueCursor.of(rows[0]).encode() if rows and more_before else None,
    )


def annotate_rows(*, project, rows: list) -> None:
    """``has_absent`` on each of a page's rows (a reconciliation proved the latest attempt
    absent; what the one-key approve needs), in one query over those rows only. As a
    correlated subquery in the page's query, it was planned as a hashed scan of every
    tenant's events. (How many open items share a row's tool and reason is
    ``QueueCounts.similar``.)"""
    if not rows:
        return
    absent = set(
        absent_reconciliations()
        .filter(call_id__in=[i.call_id for i in rows])
        .values_list("call_id", flat=True)
    )
    for item in rows:
        item.has_absent = item.call_id in absent


@dataclass(frozen=True)
class QueueCounts:
    """The project's review items grouped by everything the queue's filters test (tool,
    reason, agent, status, whether a claim is live and whose, the age thresholds), read
    once for a page: how many items match the filters (``matching``) and the count of every
    filter value with the other filters kept (``facets``), summed here from the groups.

    ``groups``: ``{"tool_name", "reason", "agent_id", "status", "live", "mine", "age_15m",
    "age_1h", "age_24h", "n"}`` dicts; ``n`` may be negative (a correction, below), a sum
    never is. Two statements, neither of which grows with the queue's history (``read``)."""

    filters: QueueFilters
    groups: list[dict]
    names: dict[int, str]

    @classmethod
    def read(cls, *, project, filters: QueueFilters, user, now=None) -> QueueCounts:
        """Group the project's items in one statement (one snapshot: an item closing
        meanwhile is counted open or closed, never both), a ``UNION ALL`` of

        - the open and claimed items, over their partial index (as many as the backlog);
        - the closed ones from ``ClosedItemCount`` (one row per status, tool, agent and
          reason in use), each counted as older than every age threshold and without a
          live claim (a closed item has none);
        - the closed items opened less than the longest threshold (24 h) ago, over the
          ``resolved_at`` index (an item closes after it opens, so they closed in that
          window too), twice: each moves from "older than every threshold" (``-n``) to
          the thresholds it has passed (``n``);

        and the agents' names in a second. With a search (``filters.q``) the groups are of
        the items it finds, the closed ones counted from the items themselves (their calls
        are what a search term may test, and ``ClosedItemCount`` has none): a read of the
        search's matches, as the calls list's capped counts are."""
        now = now or timezone.now()
        live = Q(status=ReviewItem.Status.CLAIMED, lease_expires_at__gt=now, assignee__isnull=False)
        ages = {f"age_{k}": Q(created_at__lte=now - d) for k, d in AGE_CHOICES.items()}

        def flag(q: Q) -> ExpressionWrapper:
            return ExpressionWrapper(q, output_field=BooleanField())

        aged = {k: flag(q) for k, q in ages.items()}

        def part(qs: QuerySet, n, **flags) -> QuerySet:
            """``qs`` as the union's columns: the keys, the flags in one order, ``n``."""
            order = ("live", "mine", *ages)
            return qs.values("tool_name", "reason", "agent_id", "status").annotate(
                **{k: flags[k] for k in order}, n=n
            )

        unclaimed = {"live": Value(False), "mine": Value(False)}
        old = {k: Value(True) for k in ages}
        items = ReviewItem.objects.filter(project=project).order_by()
        opened = part(
            _searched(items, filters, project=project, user=user, now=now).filter(
                status__in=ReviewItem.OPEN_STATUSES
            ),
            Count("*"),
            live=flag(live),
            mine=flag(live & Q(assignee=user)),
            **aged,
        )
        if filters.q:  # the search's items, counted (``ClosedItemCount`` has no calls)
            closed = _searched(items, filters, project=project, user=user, now=now)
            union = opened.union(
                part(
                    closed.exclude(status__in=ReviewItem.OPEN_STATUSES),
                    Count("*"),
                    **unclaimed,
                    **aged,
                ),
                all=True,
            )
        else:
            since = now - max(AGE_CHOICES.values())
            young = items.filter(resolved_at__gt=since, created_at__gt=since).exclude(
                status__in=ReviewItem.OPEN_STATUSES
            )
            union = opened.union(
                part(
                    ClosedItemCount.objects.filter(project=project), F("items"), **unclaimed, **old
                ),
                part(young, Count("*"), **unclaimed, **aged),
                part(young, Value(0) - Count("*"), **unclaimed, **old),
                all=True,
            )
        groups = [{**g, "agent_id": g["agent_id"] or None} for g in union if g["n"]]
        names = dict(Agent.objects.filter(project=project).values_list("pk", "name"))
        return cls(filters=filters, groups=groups, names=names)

    def _keep(self, g: dict, skip: str) -> bool:
        """Does group ``g`` pass every filter but ``skip`` (``_apply``'s conditions)?"""
        f = self.filters
        if skip != "status" and f.status != "all":
            wanted = ReviewItem.OPEN_STATUSES if f.status == "open" else (f.status,)
            if g["status"] not in wanted:
                return False
        if skip != "tool" and f.tool and g["tool_name"] != f.tool:
            return False
        if skip != "reason" and f.reason and g["reason"] != f.reason:
            return False
        if skip != "agent" and f.agent and self.names.get(g["agent_id"]) != f.agent:
            return False
        if skip != "age" and f.age and not g[f"age_{f.age}"]:
            return False
        if skip != "assignee":
            if f.assignee == "me" and not g["mine"]:
                return False
            if f.assignee == "unassigned" and g["live"]:
                return False
        return True

    def _sums(self, skip: str, key) -> dict:
        """``{key(g): items}`` over the groups that pass every filter but ``skip``."""
        out: dict = {}
        for g in self.groups:
            if self._keep(g, skip):
                out[key(g)] = out.get(key(g), 0) + g["n"]
        return {k: n for k, n in out.items() if n}

    def similar(self) -> dict[tuple[str, str], int]:
        """Open items (open or claimed, whatever the filters) per ``(tool name, reason)``:
        the queue row's "3 similar" is its pair's count less the row itself."""
        out: dict[tuple[str, str], int] = {}
        for g in self.groups:
            if g["status"] in ReviewItem.OPEN_STATUSES:
                key = (g["tool_name"], g["reason"])
                out[key] = out.get(key, 0) + g["n"]
        return out

    @cached_property
    def matching(self) -> int:
        """Items matching every filter (exact: no cap)."""
        return sum(g["n"] for g in self.groups if self._keep(g, ""))

    def facets(self) -> dict[str, list[tuple[str, int]]]:
        """Counts per value of each filter, with the other filters applied (what clicking
        it gives): ``{"tool": [(tool name, n)], "reason": [(reason, n)], "agent": [(agent
        name, n)], "status": [(status, n)] (``open`` counts claimed items too, ``all``
        every item), "assignee": [(anyone|me|unassigned, n)], "age": [(15m|1h|24h, n)]}``;
        tool, reason and agent list at most 50 values, most items first."""

        def top(skip: str, key) -> list[tuple[str, int]]:
            return sorted(self._sums(skip, key).items(), key=lambda kv: (-kv[1], kv[0]))[:50]

        statuses = self._sums("status", lambda g: g["status"])
        by_assignee = [g for g in self.groups if self._keep(g, "assignee")]
        by_age = [g for g in self.groups if self._keep(g, "age")]
        return {
            "tool": top("tool", lambda g: g["tool_name"]),
            "reason": top("reason", lambda g: g["reason"]),
            "agent": [
                (name, n)
                for name, n in top("agent", lambda g: self.names.get(g["agent_id"], ""))
                if name
            ],
            "status": [
                ("open", sum(statuses.get(s, 0) for s in ReviewItem.OPEN_STATUSES)),
                *[(s, statuses.get(s, 0)) for s in ("claimed", "resolved", "expired", "settled")],
                ("all", sum(statuses.values())),
            ],
            "assignee": [
                ("anyone", sum(g["n"] for g in by_assignee)),
                ("me", sum(g["n"] for g in by_assignee if g["mine"])),
                ("unassigned", sum(g["n"] for g in by_assignee if not g["live"])),
            ],
            "age": [(k, sum(g["n"] for g in by_age if g[f"age_{k}"])) for k in AGE_CHOICES],
        }


def queue_progress(*, project, now=None) -> list[dict]:
    """Per operator of the project: items claimed now (live lease) and decided today (UTC day)."""

    now = now or timezone.now()
    start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    User = get_user_model()
    users = (
        User.objects.filter(
            memberships__project=project,
            memberships__role__in=[
                Membership.Role.OPERATOR,
                Membership.Role.MANAGER,
                Membership.Role.ADMIN,
            ],
        )
        .annotate(
            claimed=Count(
                "review_items",
                distinct=True,
                filter=Q(
                    review_items__project=project,
                    review_items__status=ReviewItem.Status.CLAIMED,
                    review_items__lease_expires_at__gt=now,
                ),
            ),
        )
        .order_by("username")
    )
    decided = dict(
        ReviewItem.objects.filter(
            project=project, resolved_at__gte=start, resolved_by__isnull=False
        )
        .values_list("resolved_by")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return [{"user": u, "claimed": u.claimed, "decided_today": decided.get(u.pk, 0)} for u in users]


def item_for_project(*, project, pk: int):
    """The item with its call, or None when it is not in ``project`` (the view 404s)."""

    return (
        ReviewItem.objects.filter(project=project, pk=pk)
        .select_related(
            "call", "call__agent", "call__contract", "call__decided_by", "assignee", "resolved_by"
        )
        .first()
    )


def item_timeline(*, item) -> list[dict]:
    """Every CallEvent of the item's call and every audit row of the item, in time order:
    ``{"at": datetime, "kind": "event"|"audit", "obj": …}``."""
    events = CallEvent.objects.filter(call_id=item.call_id).order_by("received_at", "pk")
    audit = item.audit.select_related("actor").all()
    rows = [{"at": e.received_at, "kind": "event", "obj": e} for e in events]
    rows += [
        {"at": a.created_at, "kind": "audit", "obj": a} for a in audit if a.action != "comment"
    ]
    return sorted(rows, key=lambda r: r["at"])


def item_reconciliations(*, item) -> list:
    """The call's ``reconciled`` events, newest first."""
    return list(
        CallEvent.objects.filter(call_id=item.call_id, kind=CallEvent.Kind.RECONCILED).order_by(
            "-received_at"
        )
    )


def reconcile_progress(*, item) -> dict | None:
    """The latest "Reconcile now" of the item and whether its result arrived:
    ``{"requested_at", "by", "done": bool, "event": CallEvent|None, "stale": bool}`` (``stale``:
    no result after ``RECONCILE_PATIENCE``, the page stops polling); None if never requested."""
    request = (
        item.audit.filter(action="reconcile")
        .select_related("actor")
        .order_by("-created_at", "-pk")
        .first()
    )
    if request is None:
        return None
    event = (
        CallEvent.objects.filter(
            call_id=item.call_id,
            kind=CallEvent.Kind.RECONCILED,
            received_at__gte=request.created_at,
        )
        .order_by("received_at")
        .first()
    )
    stale = event is None and timezone.now() - request.created_at > RECONCILE_PATIENCE
    return {
        "requested_at": request.created_at,
        "by": request.actor,
        "done": event is not None,
        "event": event,
        "stale": stale,
    }


def item_neighbours(*, item, user) -> dict:
    """The next open item in queue order after ``item`` (for "decide and go to the next")."""
    qs = queue_items(project=item.project, filters=QueueFilters(), user=user).exclude(pk=item.pk)
    nxt = qs.filter(
        Q(priority__gt=item.priority) | Q(priority=item.priority, created_at__gte=item.created_at)
    ).first()
    return {"next": nxt or qs.first()}


def operators(*, project) -> QuerySet:
    """Users who can be assigned items of ``project``."""
    return (
        get_user_model()
        .objects.filter(
            memberships__project=project,
            memberships__role__in=[
                Membership.Role.OPERATOR,
                Membership.Role.MANAGER,
                Membership.Role.ADMIN,
            ],
        )
        .order_by("username")
    )


def audit_rows(*, item) -> QuerySet:
    return item.audit.select_related("actor").order_by("created_at", "pk")


def call_arguments_display(call: ToolCall) -> tuple[str, list[str]]:
    """Pretty JSON of the (already redacted) arguments and the paths of redacted values."""
    import json

    redacted: list[str] = []

    def walk(value, path):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else k)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]")
        elif value == "•••":
            redacted.append(path)

    walk(call.arguments, "")
    if call.arguments is None:
        return "", []
    return json.dumps(call.arguments, indent=2, ensure_ascii=False, sort_keys=True), redacted
