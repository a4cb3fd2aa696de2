"""Tallies: rollups kept by adding. Two things are counted once, when they are written,
because they never change after: a review item's closing (``reviews.ReviewRollup``) and a
refused proposal (``RefusalRollup``). The reports read these cells instead of the items
and events, so their cost does not grow with the project's history.

Cells
-----
Each thing counts in eight cells (``Tally``): per UTC hour and per UTC day of its moment,
each for the four ``dims`` (total, per tool, per agent, per tool and agent)
(``tally_counts``). ``tally_add`` adds counts with ``INSERT … ON CONFLICT DO UPDATE``, the
cells in key order so that two transactions adding to the same cells lock them in the same
order; the ingest batch adds its refusals inside ``ingest.batch_write``'s one statement on
PostgreSQL instead (``refusal_counts`` gives it the cells). ``tally_rows`` reads a range:
day cells for its whole UTC days and hour cells for the hours left at either end
(``callgate.reports.rollups.rollup_range_q``), of the dims the filters need: a 30-day report
reads about 30 days × (occupied keys) cells, whatever the volume.
``review_rollups_rebuild`` and ``refusal_rollups_rebuild`` recount a project's cells from
the items or the events (after a bulk load, an upgrade that brought a table, a purge):
``manage.py backfill_rollups``, safe while things are added: every addition holds the
project's ``tally_lock`` shared, a rebuild exclusively (it waits for the additions in
flight, which it then reads, and holds back new ones, which it does not).

A cell is the last thing a transaction locks (the review services add after the call
they change, as the ingest batch does after its calls and items): no lock cycle.

Review items
------------
An item closes once: resolved by a human, expired, or settled by a later event, and no way
leads back to open. Every writer that closes items (``reviews.services.review_item_decide``
and ``review_items_expire``, ``callgate.escalation.review_items_settle_bulk``) calls
``review_rollups_add`` in the transaction that closes them: the counts commit with the
closing, or neither does. A cell of human decisions holds the time from the item's opening
to the decision as a log-scale bucket, ``PER_DOUBLING`` buckets a doubling
(``decision_bucket``); the review report's median and p90 are the nearest-rank
percentile's bucket, read as its geometric middle (``bucket_seconds``): within
2**(1/16) - 1 = 4.4 % of the exact nearest-rank value, as for a Prometheus histogram or
HdrHistogram (decisions under 2**(1/8) s share the first bucket and read as about a
second). The same additions count each item in ``reviews.ClosedItemCount`` (status, tool,
agent and reason, of all time, no time cells): the queue's counts of closed items.

Refused proposals
-----------------
A proposal refused without touching the call it named (TAXONOMY v2 "Sticky refusals":
``taxonomy.REFUSALS`` on the proposal event of an existing call, ``is_refused_proposal``)
is counted by the event's receipt, reason, and its call's tool and agent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import cast

from django.db import connection, models, transaction
from django.db.models import Count, Field, Q, QuerySet, Sum

from callgate.metrics import hour_floor
from callgate.models import CallEvent, Project, RefusalRollup, Tally
from callgate.reports.rollups import day_floor, rollup_range_q, rollups_rebuild
from callgate.taxonomy import REFUSALS
from reviews.models import ClosedItemCount, ReviewItem, ReviewRollup

#: Cells per statement of ``tally_add`` (at most a dozen parameters each: under SQLite's
#: limit of 32,766).
_CHUNK = 500


#: First key of the transaction-scoped PostgreSQL advisory lock on one project's cells of a
#: table (the second key is the project's ID): every addition holds it shared, a rebuild
#: exclusively. Any fixed 32-bit numbers unused elsewhere ("cgtr", "cgtf"); the two tables
#: of closed review items share one (added to together, rebuilt together).
LOCK_CLASS: dict[type[models.Model], int] = {
    ReviewRollup: 0x63677472,
    ClosedItemCount: 0x63677472,
    RefusalRollup: 0x63677466,
}


def tally_lock(model: type[models.Model], project_id: int, *, shared: bool) -> None:
    """Hold ``model``'s lock on the project's cells until the transaction ends: ``shared``
    to add to them (additions do not wait for each other), else to rebuild them (waits for
    the additions in flight to commit, and holds new ones back). PostgreSQL only: SQLite
    runs one write transaction at a time."""
    if connection.vendor != "postgresql":
        return
    function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}(%s, %s)", [LOCK_CLASS[model], project_id])


def tally_counts(things: Iterable[tuple[int, str, int | None, datetime, tuple]]) -> dict:
    """The cells ``things`` count in, with how many each: ``things`` are ``(project ID, tool
    name, agent ID, moment, the table's own key)``; each counts in eight cells, its UTC hour
    and its UTC day, each for the four dims. Returns ``{(project ID, dims, tool, agent,
    grain, bucket, *own key): n}``."""
    out: dict[tuple, int] = {}
    for project_id, tool_name, agent_id, at, own in things:
        agent = agent_id or 0
        for grain, floor in ((Tally.Grain.HOUR, hour_floor), (Tally.Grain.DAY, day_floor)):
            bucket = floor(at)
            for dims, tool, agent_kept in (
                (Tally.Dims.TOTAL.value, "", 0),
                (Tally.Dims.TOOL.value, tool_name, 0),
                (Tally.Dims.AGENT.value, "", agent),
                (Tally.Dims.TOOL_AGENT.value, tool_name, agent),
            ):
                cell = (project_id, dims, tool, agent_kept, grain.value, bucket, *own)
                out[cell] = out.get(cell, 0) + 1
    return out


def _key_fields(model: type[models.Model]) -> list[Field]:
    """The fields of ``model``'s cell key (its unique constraint's, in order)."""
    [constraint] = model._meta.constraints
    names = cast(models.UniqueConstraint, constraint).fields
    return [cast(Field, model._meta.get_field(name)) for name in names]


def tally_key_columns(model: type[models.Model]) -> list[str]:
    """The columns of ``model``'s cell key, in order."""
    return [cast(str, f.column) for f in _key_fields(model)]


def tally_add(model: type[models.Model], count: str, counts: dict[tuple, int]) -> None:
    """Add ``counts`` (``{cell key: n}``, the key's values in the order of ``model``'s unique
    constraint, project ID first: ``tally_counts``' cells for a ``Tally``) to ``model``'s
    cells, column ``count``, under the projects' shared ``tally_lock``: ``INSERT … ON
    CONFLICT DO UPDATE`` adding to what is there (PostgreSQL and SQLite alike), the cells in
    key order. Call it in the transaction that writes what it counts, after that
    transaction's other locks (a cell is the last thing it locks: no lock cycle)."""
    cells = sorted(counts.items())
    if not cells:
        return
    for project_id in sorted({cell[0] for cell, _ in cells}):
        tally_lock(model, project_id, shared=True)
    table = connection.ops.quote_name(model._meta.db_table)
    fields = _key_fields(model)
    columns = ", ".join(connection.ops.quote_name(cast(str, f.column)) for f in fields)
    target = connection.ops.quote_name(count)
    # a Tally's bucket goes in as its column's value (ClosedItemCount has no datetime)
    moments = [i for i, f in enumerate(fields) if isinstance(f, models.DateTimeField)]
    row = "(" + ", ".join(["%s"] * (len(fields) + 1)) + ")"
    with connection.cursor() as cursor:
        for start in range(0, len(cells), _CHUNK):
            chunk = cells[start : start + _CHUNK]
            params: list = []
            for cell, n in chunk:
                values = list(cell)
                for i in moments:
                    values[i] = fields[i].get_db_prep_value(cell[i], connection)
                params += [*values, n]
            cursor.execute(
                f"INSERT INTO {table} ({columns}, {target}) VALUES {', '.join([row] * len(chunk))} "
                f"ON CONFLICT ({columns}) DO UPDATE SET {target} = {table}.{target} + excluded.{target}",
                params,
            )


def tally_rows(
    model: type[Tally],
    *,
    project_id: int,
    since: datetime,
    until: datetime,
    tool: str = "",
    agent_id: int | None = None,
) -> QuerySet:
    """The cells of ``model`` that count, once each, the project's things of ``[since,
    until)`` (whole UTC hours), of ``tool`` and ``agent_id`` when given: the dims they
    need, day cells for the whole days and hour cells for the rest."""
    return _cells_of(model, project_id, tool, agent_id).filter(
        rollup_range_q(since, until, period="day")
    )


def _cells_of(model: type[Tally], project_id: int, tool: str, agent_id: int | None) -> QuerySet:
    """The project's cells of the dims that keep ``tool`` and ``agent_id`` (when given)."""
    dims = (
        Tally.Dims.TOOL_AGENT
        if tool and agent_id is not None
        else Tally.Dims.TOOL
        if tool
        else Tally.Dims.AGENT
        if agent_id is not None
        else Tally.Dims.TOTAL
    )
    return model.objects.filter(  # type: ignore[attr-defined]
        project_id=project_id, dims=dims, tool_name=tool, agent_id=agent_id or 0
    )


def _rebuild(
    model: type[models.Model], measure: str, project_id: int, count: Callable[[], dict[tuple, int]]
) -> int:
    """Replace ``model``'s cells of the project with ``count()`` (column ``measure``), in one
    transaction (readers see the old cells or the new), safe while things are added: the
    project's ``tally_lock`` held exclusively first (an addition in flight commits before,
    and is in what ``count`` reads; a later one waits, and is not). Returns the cells
    written."""
    fields = [f.attname for f in _key_fields(model)]
    with transaction.atomic():
        tally_lock(model, project_id, shared=False)
        model.objects.filter(project_id=project_id).delete()  # type: ignore[attr-defined]
        rows = [
            model(**dict(zip(fields, cell, strict=True)), **{measure: n})
            for cell, n in count().items()
        ]
        model.objects.bulk_create(rows, batch_size=5000)  # type: ignore[attr-defined]
    return len(rows)


def counts_rebuild(
    *,
    project_id: int | None = None,
    since: datetime | None = None,
    progress: Callable[[int, int, tuple], None] | None = None,
) -> dict[str, int]:
    """Recount everything counted of one project (or of every one) from what is there:
    the call rollups (``rollups.rollups_rebuild``, from ``since`` on, ``progress`` after
    each bucket), the review tallies and the refused proposals' (whole). What ``manage.py
    backfill_rollups`` and a deletion in the admin run: additions cannot follow a row
    deleted (an agent deleted takes its calls and their events with it). Returns
    ``{"buckets", "rows", "review_cells", "refusal_cells"}``."""
    result = rollups_rebuild(project_id=project_id, since=since, progress=progress)
    projects = Project.objects.order_by("pk").values_list("pk", flat=True)
    if project_id is not None:
        projects = projects.filter(pk=project_id)
    return {
        **result,
        "review_cells": sum(review_rollups_rebuild(project_id=pk) for pk in projects),
        "refusal_cells": sum(refusal_rollups_rebuild(project_id=pk) for pk in projects),
    }


# --- review items -------------------------------------------------------------------------

#: Histogram buckets per doubling of the time to decision.
PER_DOUBLING = 8


def decision_bucket(seconds: float) -> int:
    """The histogram bucket of a decision that took ``seconds`` (>= 0): 1 for
    [0, 2**(1/8)) s, k for [2**((k-1)/8), 2**(k/8)) s."""
    if seconds < 2 ** (1 / PER_DOUBLING):
        return 1
    # the bound itself opens the next bucket (log2 of 2**(2/8) comes out a hair under 2/8)
    return math.floor(PER_DOUBLING * math.log2(seconds) + 1e-9) + 1


def bucket_seconds(bucket: int) -> float:
    """What a bucket reads as, in seconds: its geometric middle, 2**((k - 1/2)/8)."""
    return 2 ** ((bucket - 0.5) / PER_DOUBLING)


def histogram_percentile(counts: dict[int, int], q: float) -> float | None:
    """The nearest-rank ``q`` percentile (0 < q <= 1) of a histogram ``{bucket: items}``,
    in seconds (``bucket_seconds`` of the bucket holding the rank); None when empty."""
    total = sum(counts.values())
    if not total:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for bucket in sorted(counts):
        seen += counts[bucket]
        if seen >= rank:
            return bucket_seconds(bucket)
    raise AssertionError("unreachable: the ranks add up to the total")


@dataclass(frozen=True)
class Closed:
    """A closed item as the rollups count it."""

    project_id: int
    tool_name: str
    agent_id: int | None
    reason: str
    status: str
    resolution: str
    created_at: datetime
    resolved_at: datetime

    @classmethod
    def of(cls, item: ReviewItem, *, status: str, resolution: str, at: datetime) -> Closed:
        """``item`` as it is about to close: ``status``, ``resolution`` at ``at``."""
        return cls(
            project_id=item.project_id,
            tool_name=item.tool_name,
            agent_id=item.agent_id,
            reason=item.reason,
            status=status,
            resolution=resolution,
            created_at=item.created_at,
            resolved_at=at,
        )


def _review_counts(items: Iterable[Closed]) -> dict[tuple, int]:
    """The ``ReviewRollup`` cells ``items`` count in, with how many of them each."""
    return tally_counts(
        (
            item.project_id,
            item.tool_name,
            item.agent_id,
            item.resolved_at,
            (item.status, item.resolution, decision_bucket(took) if human else 0),
        )
        for item in items
        for human in [item.status == ReviewItem.Status.RESOLVED]
        for took in [max(0.0, (item.resolved_at - item.created_at).total_seconds())]
    )


def _closed_counts(items: Iterable[Closed]) -> dict[tuple, int]:
    """The ``ClosedItemCount`` cells ``items`` count in, with how many of them each."""
    out: dict[tuple, int] = {}
    for item in items:
        cell = (item.project_id, item.status, item.tool_name, item.agent_id or 0, item.reason)
        out[cell] = out.get(cell, 0) + 1
    return out


def review_rollups_add(items: Iterable[Closed]) -> None:
    """Count ``items``, just closed, in their ``ReviewRollup`` and ``ClosedItemCount``
    cells. Call it in the transaction that closes the items."""
    closed = list(items)
    tally_add(ReviewRollup, "items", _review_counts(closed))
    tally_add(ClosedItemCount, "items", _closed_counts(closed))


def review_rollups_rebuild(*, project_id: int) -> int:
    """Recount every ``ReviewRollup`` and ``ClosedItemCount`` cell of one project from its
    closed items, in one transaction (``_rebuild``: safe while items close). Returns the
    cells written."""
    closed = (
        ReviewItem.objects.filter(project_id=project_id, resolved_at__isnull=False)
        .exclude(status__in=ReviewItem.OPEN_STATUSES)
        .values_list(
            "tool_name", "agent_id", "reason", "status", "resolution", "created_at", "resolved_at"
        )
    )

    per_cell = (
        ReviewItem.objects.filter(project_id=project_id)
        .exclude(status__in=ReviewItem.OPEN_STATUSES)
        .values_list("status", "tool_name", "agent_id", "reason")
        .annotate(n=Count("*"))
        .order_by()
    )
    with transaction.atomic():
        return _rebuild(
            ReviewRollup,
            "items",
            project_id,
            lambda: _review_counts(
                Closed(project_id, tool, agent, reason, status, resolution, created, resolved)
                for tool, agent, reason, status, resolution, created, resolved in closed.iterator(
                    chunk_size=5000
                )
                if resolved is not None  # the filter's; for the type checker
            ),
        ) + _rebuild(
            ClosedItemCount,
            "items",
            project_id,
            lambda: {
                (project_id, status, tool, agent or 0, reason): n
                for status, tool, agent, reason, n in per_cell
            },
        )


def decided_cells(
    *,
    project_id: int,
    since: datetime,
    until: datetime,
    tool: str = "",
    agent_id: int | None = None,
) -> list[tuple[str, str, int, int]]:
    """The project's items closed in ``[since, until)`` (whole UTC hours), of ``tool`` and
    ``agent_id`` when given, as ``(status, resolution, decision_bucket, items)``: one
    grouped read (``tally_rows``)."""
    rows = (
        tally_rows(
            ReviewRollup,
            project_id=project_id,
            since=since,
            until=until,
            tool=tool,
            agent_id=agent_id,
        )
        .values("status", "resolution", "decision_bucket")
        .annotate(n=Sum("items"))
        .order_by()
        .values_list("status", "resolution", "decision_bucket", "n")
    )
    return list(rows)


# --- refused proposals --------------------------------------------------------------------

_REFUSALS = sorted(r.value for r in REFUSALS)
#: ``is_refused_proposal`` as a filter of ``CallEvent``.
REFUSED_PROPOSAL = Q(kind=CallEvent.Kind.PROPOSED, reason__in=_REFUSALS) & ~Q(state_before="")


def is_refused_proposal(event: CallEvent) -> bool:
    """A proposal refused without touching the call it named: a proposal event of an
    existing call (a state before it) whose reason is one of ``taxonomy.REFUSALS``."""
    return (
        event.kind == CallEvent.Kind.PROPOSED
        and event.reason in REFUSALS
        and bool(event.state_before)
    )


def refusal_counts(events: Iterable[CallEvent]) -> dict[tuple, int]:
    """The ``RefusalRollup`` cells the refused proposals among ``events`` (each with its
    ``call``) count in, with how many each."""
    return tally_counts(
        (e.project_id, e.call.tool_name, e.call.agent_id, e.received_at, (e.reason,))
        for e in events
        if is_refused_proposal(e)
    )


def refusal_rollups_rebuild(*, project_id: int) -> int:
    """Recount every ``RefusalRollup`` cell of one project from its events (``_rebuild``:
    safe while events arrive; ``batch_write`` takes the shared lock in its statement).
    Returns the cells written."""
    refused = (
        CallEvent.objects.filter(REFUSED_PROPOSAL, project_id=project_id)
        .values_list("call__tool_name", "call__agent_id", "reason", "received_at")
        .order_by()
    )

    return _rebuild(
        RefusalRollup,
        "proposals",
        project_id,
        lambda: tally_counts(
            (project_id, tool, agent, received, (reason,))
            for tool, agent, reason, received in refused.iterator(chunk_size=5000)
        ),
    )


def refused_by_reason(
    *,
    project_id: int,
    since: datetime,
    until: datetime,
    tool: str = "",
    agent_id: int | None = None,
) -> dict[str, int]:
    """The project's refused proposals received in ``[since, until)`` (whole UTC hours), of
    ``tool`` and ``agent_id`` when given, by reason: one grouped read (``tally_rows``)."""
    rows = (
        tally_rows(
            RefusalRollup,
            project_id=project_id,
            since=since,
            until=until,
            tool=tool,
            agent_id=agent_id,
        )
        .values("reason")
        .annotate(n=Sum("proposals"))
        .order_by()
        .values_list("reason", "n")
    )
    return {reason: n for reason, n in rows if n}
