"""Rollup maintenance: ``CallRollup`` holds, per project, UTC hour (of the call's creation),
tool, agent, reason and route, the number of calls, their attempts and their suppressed
duplicates. Report queries read it instead of scanning ``ToolCall``.

How it stays equal to a direct count
------------------------------------
A call's reason, route, attempts and duplicates change after it was created, so a bucket
(project, hour of ``created_at``) is never "done". Every writer of ``ToolCall`` (the ingest
engine's batch, the services that change a call outside it) marks the buckets of the calls
it changed in ``RollupDirtyBucket`` (``buckets_touch``), in the same transaction.
``refresh_rollups`` (every minute, Celery beat) recomputes each marked bucket *whole*: one
aggregate over the bucket's calls, then delete the bucket's rollup rows and its mark and
insert the new rows, in one transaction. Recomputing the whole bucket (instead of adding
deltas) makes the refresh idempotent: running it twice, or on a bucket nothing changed in,
gives the same rows. No index on ``ToolCall.updated_at`` is needed (it made every call
update rewrite every index: no HOT updates).

Concurrency
-----------
- Two refreshes of the same bucket (two workers, or the task and ``backfill_rollups``) are
  serialised by a transaction-scoped lock on the bucket: ``pg_advisory_xact_lock`` on
  PostgreSQL; on SQLite every write transaction is already exclusive (``transaction_mode
  IMMEDIATE`` in settings). Without it the second delete would not see the first's freshly
  inserted rows (READ COMMITTED) and its insert would hit the unique constraint.
- A mark commits with the change it marks. The refresh deletes the mark before its
  aggregate, in its transaction: a change committed before that is counted; a change still
  open then marks the bucket again (its insert waits for the refresh's delete to commit, or
  was invisible to it) and the next run counts it.
- Readers see either the old or the new rows of a bucket, never a half-written bucket
  (delete and insert commit together).

Coarser rollups
---------------
A 30-day report over hourly cells of every tool × agent × reason would read a number of rows
that grows with the project's traffic. ``RollupCube`` keeps the same counts summed to fewer
dimensions (reason and route; tool, contract, reason and route; agent, reason and route), by
hour, by UTC day and by UTC month. ``rollup_bucket_refresh`` rewrites the hour's cube rows
from the cells it just computed, the day's from the day's 24 hours of cube rows and the
month's from its days, in the same transaction (the day and the month serialised by locks
of their own, taken after the hour's), so the cubes equal ``CallRollup`` whenever it is
committed. ``rollup_rows`` picks for a query the smallest table that has its dimensions
and, for a range, the whole months from month rows, the whole days left from day rows and
the partial days at either end from hour rows: what a query reads grows with neither the
traffic nor (beyond a row set a month) the project's history.

``rollups_as_of`` (the start of the last refresh, in Django's cache) tells how fresh the
rollups are. For anything older (a new installation, an upgrade that added columns, a
purge) run ``manage.py backfill_rollups``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import shared_task
from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Sum
from django.db.models.functions import Coalesce, TruncHour
from django.utils import timezone

from callgate.metrics import OPEN_STATES, hour_floor
from callgate.models import (
    ROLLUP_MEASURES,
    CallEvent,
    CallRollup,
    RollupCube,
    RollupDirtyBucket,
    ToolCall,
)
from callgate.taxonomy import Category

logger = logging.getLogger(__name__)

WATERMARK_KEY = "callgate:rollups:watermark"
#: Start time of the last full ``rollups_rebuild`` (every project, every bucket).
REBUILT_KEY = "callgate:rollups:rebuilt"

Bucket = tuple[int, datetime]  # (project_id, start of the UTC hour)


def day_floor(moment: datetime) -> datetime:
    """The start of the UTC day ``moment`` falls in (aware, UTC)."""
    return hour_floor(moment).replace(hour=0)


def day_ceil(moment: datetime) -> datetime:
    """``moment`` rounded up to a whole UTC day (itself when it is one)."""
    floor = day_floor(moment)
    return floor if floor == moment else floor + timedelta(days=1)


def month_floor(moment: datetime) -> datetime:
    """The start of the UTC month ``moment`` falls in (aware, UTC)."""
    return day_floor(moment).replace(day=1)


def month_ceil(moment: datetime) -> datetime:
    """``moment`` rounded up to a whole UTC month (itself when it is one)."""
    floor = month_floor(moment)
    if floor == moment:
        return floor
    return (floor + timedelta(days=32)).replace(day=1)


def _lock_bucket(
    project_id: int, bucket: datetime, *, day: bool = False, month: bool = False
) -> None:
    """Serialise refreshes of one hour bucket (or, ``day`` / ``month``, of one day's or
    month's cube rows) until the surrounding transaction ends. Hours take keys >= 0, days
    keys in [-2**30, 0), months keys below -2**30."""
    if connection.vendor == "postgresql":
        hours = int(bucket.timestamp()) // 3600
        if month:
            key = -(2**30) - (bucket.year * 12 + bucket.month)
        elif day:
            key = -(hours // 24) - 1
        else:
            key = hours
        with connection.cursor() as cursor:
            # two-int form: (project, hour or -day-1 since the epoch); classid/objid are int4
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, %s)",
                [project_id % 2**31, (key + 2**31) % 2**32 - 2**31],
            )


#: The dimensions each kind of ``RollupCube`` row keeps (besides its bucket).
CUBE_DIMS: dict[str, tuple[str, ...]] = {
    RollupCube.Dims.TOTAL: ("reason", "category", "route"),
    RollupCube.Dims.TOOL: ("tool_name", "contract_id", "reason", "category", "route"),
    RollupCube.Dims.AGENT: ("agent_id", "reason", "category", "route"),
}


def cube_cells(cells: Iterable[dict]) -> list[dict]:
    """``cells`` (dicts with the ``CallRollup`` columns of one bucket) summed per
    ``CUBE_DIMS``: dicts with ``dims``, that kind's dimension columns and every measure."""
    out: dict[tuple, dict] = {}
    for cell in cells:
        for dims, columns in CUBE_DIMS.items():
            key = (dims, *(cell[c] for c in columns))
            row = out.get(key)
            if row is None:
                row = out[key] = {"dims": dims, **{c: cell[c] for c in columns}}
                row.update(dict.fromkeys(ROLLUP_MEASURES, 0))
            for m in ROLLUP_MEASURES:
                row[m] += cell[m] or 0
    return list(out.values())


def _cube_day_refresh(*, project_id: int, day: datetime) -> None:
    """Rewrite the day cube rows of ``(project, day)`` from its hour cube rows: one grouped
    read of at most 24 hours of cube rows, a delete and an insert. In the caller's
    transaction; serialised per day."""
    _lock_bucket(project_id, day, day=True)
    _cube_sum_up(
        project_id=project_id,
        source=RollupCube.Grain.HOUR,
        target=RollupCube.Grain.DAY,
        bucket=day,
        until=day + timedelta(days=1),
    )
    _cube_month_refresh(project_id=project_id, month=month_floor(day))


def _cube_month_refresh(*, project_id: int, month: datetime) -> None:
    """Rewrite the month cube rows of ``(project, month)`` from its day cube rows (at most
    31 days of them), as ``_cube_day_refresh`` does a day's. Serialised per month, after
    the day's lock."""
    _lock_bucket(project_id, month, month=True)
    _cube_sum_up(
        project_id=project_id,
        source=RollupCube.Grain.DAY,
        target=RollupCube.Grain.MONTH,
        bucket=month,
        until=month_ceil(month + timedelta(hours=1)),
    )


def _cube_sum_up(
    *, project_id: int, source: str, target: str, bucket: datetime, until: datetime
) -> None:
    """Replace the ``target``-grain cube rows of ``(project, bucket)`` with the sums of the
    project's ``source``-grain rows in ``[bucket, until)``: one grouped read, a delete and
    an insert."""
    columns = ("dims", "tool_name", "contract_id", "agent_id", "reason", "category", "route")
    rows = (
        RollupCube.objects.filter(
            project_id=project_id, grain=source, bucket__gte=bucket, bucket__lt=until
        )
        .values(*columns)
        .annotate(**{f"sum_{m}": Sum(m) for m in ROLLUP_MEASURES})
        .order_by()
    )
    new = [
        RollupCube(
            project_id=project_id,
            grain=target,
            bucket=bucket,
            **{c: row[c] for c in columns},
            **{m: row[f"sum_{m}"] for m in ROLLUP_MEASURES},
        )
        for row in rows
    ]
    RollupCube.objects.filter(project_id=project_id, grain=target, bucket=bucket).delete()
    RollupCube.objects.bulk_create(new)


def _cube_hour_write(*, project_id: int, bucket: datetime, cells: list[dict]) -> None:
    """Rewrite the hour cube rows of ``(project, bucket)`` from the bucket's cells, then
    its day's (``_cube_day_refresh``). In the caller's transaction, under the hour's lock."""
    RollupCube.objects.filter(
        project_id=project_id, grain=RollupCube.Grain.HOUR, bucket=bucket
    ).delete()
    RollupCube.objects.bulk_create(
        [
            RollupCube(project_id=project_id, grain=RollupCube.Grain.HOUR, bucket=bucket, **row)
            for row in cube_cells(cells)
        ]
    )
    _cube_day_refresh(project_id=project_id, day=day_floor(bucket))


def cubes_rewrite(*, project_id: int) -> int:
    """Rewrite every ``RollupCube`` row of one project from its ``CallRollup`` rows (after a
    bulk load: ``demo.seeding``, a migration's backfill). Returns the rows written."""
    with transaction.atomic():
        RollupCube.objects.filter(project_id=project_id).delete()
        cells: dict[datetime, list[dict]] = {}
        for row in CallRollup.objects.filter(project_id=project_id).values(
            "bucket", *{c for cols in CUBE_DIMS.values() for c in cols}, *ROLLUP_MEASURES
        ):
            cells.setdefault(hour_floor(row["bucket"]), []).append(row)
        hours = [
            RollupCube(project_id=project_id, grain=RollupCube.Grain.HOUR, bucket=b, **row)
            for b, rows in cells.items()
            for row in cube_cells(rows)
        ]
        coarser = []
        for grain, floor in (
            (RollupCube.Grain.DAY, day_floor),
            (RollupCube.Grain.MONTH, month_floor),
        ):
            by_bucket: dict[datetime, list[dict]] = {}
            for b, rows in cells.items():
                by_bucket.setdefault(floor(b), []).extend(rows)
            coarser += [
                RollupCube(project_id=project_id, grain=grain, bucket=d, **row)
                for d, rows in by_bucket.items()
                for row in cube_cells(rows)
            ]
        RollupCube.objects.bulk_create(hours + coarser, batch_size=5000)
    return len(hours) + len(coarser)


#: The grains a range is covered with, coarsest first, and how each rounds a moment.
_GRAINS = (
    (RollupCube.Grain.MONTH, month_floor, month_ceil),
    (RollupCube.Grain.DAY, day_floor, day_ceil),
    (RollupCube.Grain.HOUR, hour_floor, hour_floor),
)
#: The coarsest grain a query grouping by a time period may read.
_COARSEST = {
    None: RollupCube.Grain.MONTH,
    "week": RollupCube.Grain.DAY,  # weeks do not fall on month bounds
    "day": RollupCube.Grain.DAY,
    "hour": RollupCube.Grain.HOUR,
}


def rollup_range_q(since: datetime | None, until: datetime | None, *, period: str | None) -> Q:
    """The cube rows covering ``[since, until)`` (whole UTC hours; None: unbounded) once
    each: month rows for the whole months, day rows for the whole days left at either end,
    hour rows for the rest; never coarser than ``_COARSEST[period]``."""
    names = [g for g, _, _ in _GRAINS]
    grains = _GRAINS[names.index(_COARSEST[period]) :]

    def bounds(grain: str, lo: datetime | None, hi: datetime | None) -> Q:
        q = Q(grain=grain)
        if lo is not None:
            q &= Q(bucket__gte=lo)
        if hi is not None:
            q &= Q(bucket__lt=hi)
        return q

    def cover(lo: datetime | None, hi: datetime | None, levels) -> Q:
        (grain, floor, ceil), *finer = levels
        if not finer:
            return bounds(grain, lo, hi)
        first = ceil(lo) if lo is not None else None
        last = floor(hi) if hi is not None else None
        if first is not None and last is not None and first >= last:
            return cover(lo, hi, finer)
        q = bounds(grain, first, last)
        if lo is not None and first is not None and lo < first:
            q |= cover(lo, first, finer)
        if hi is not None and last is not None and last < hi:
            q |= cover(last, hi, finer)
        return q

    return cover(since, until, grains)


def rollup_rows(
    *,
    project_id: int,
    since: datetime | None = None,
    until: datetime | None = None,
    tool: str | None = None,
    agent_id: int | None = None,
    by: Iterable[str] = (),
    period: str | None = None,
) -> QuerySet:
    """The rollup rows to sum for one project's calls created in ``[since, until)`` (whole
    UTC hours; None: unbounded), of ``tool`` (a tool name, "" for none; None: any) and
    ``agent_id`` (None: any), to be grouped by the columns ``by`` (of ``tool_name``,
    ``contract_id``, ``agent_id``, ``reason``, ``category``, ``route``). ``period`` ("hour",
    "day", "week"): the caller groups by that period of ``bucket`` (no coarser rows are
    read).

    Every row has the ``CallRollup`` columns (``bucket`` the start of its hour or day) and
    each call is counted in exactly one row, so sums over them equal sums over
    ``CallRollup``. The smallest table that keeps the needed dimensions is read: a
    ``RollupCube`` (reasons only, per tool, or per agent; day rows for whole days), or
    ``CallRollup`` itself when both a tool and an agent are needed."""
    by = set(by)
    needs_tool = tool is not None or bool(by & {"tool_name", "contract_id", "contract"})
    needs_agent = agent_id is not None or bool(by & {"agent_id", "agent"})
    qs: QuerySet[Any]
    if needs_tool and needs_agent:
        qs = CallRollup.objects.filter(project_id=project_id)
        if since is not None:
            qs = qs.filter(bucket__gte=since)
        if until is not None:
            qs = qs.filter(bucket__lt=until)
    else:
        dims = (
            RollupCube.Dims.TOOL
            if needs_tool
            else RollupCube.Dims.AGENT
            if needs_agent
            else RollupCube.Dims.TOTAL
        )
        qs = RollupCube.objects.filter(project_id=project_id, dims=dims).filter(
            rollup_range_q(since, until, period=period)
        )
    if tool is not None:
        qs = qs.filter(tool_name=tool)
    if agent_id is not None:
        qs = qs.filter(agent_id=agent_id)
    return qs


#: Calls whose outcome is unknown now, or was once (see ``CallRollup``).
_UNKNOWN_NOW = Q(category__in=[Category.UNKNOWN_OUTCOME, Category.RECONCILIATION])


def rollup_cells(calls: QuerySet[ToolCall]) -> QuerySet:
    """The rollup cells of ``calls``, grouped by creation hour (``bucket``), tool, contract,
    agent, reason, category and route: dicts with every ``CallRollup`` column but the
    project. One aggregate; "ever unknown" probes each call's events by the timeline index."""
    ever_unknown = Exists(
        CallEvent.objects.filter(call_id=OuterRef("pk"), category=Category.UNKNOWN_OUTCOME)
    )
    unknown = _UNKNOWN_NOW | Q(ever_unknown=True)
    return (
        # ``used``: the call's attempts (the cell's ``attempts`` is their sum, a name clash)
        calls.alias(ever_unknown=ever_unknown, used=F("attempts"))
        .annotate(bucket=TruncHour("created_at", tzinfo=UTC))
        # category is a function of the reason (taxonomy), so the groups are the unique cells
        .values("bucket", "tool_name", "contract_id", "agent_id", "reason", "category", "route")
        .annotate(
            calls=Count("id"),
            attempts=Coalesce(Sum("attempts"), 0),
            duplicates_suppressed=Coalesce(Sum("duplicates_suppressed"), 0),
            calls_attempts_0=Count("id", filter=Q(used=0)),
            calls_attempts_1=Count("id", filter=Q(used=1)),
            calls_attempts_2=Count("id", filter=Q(used=2)),
            calls_attempts_3=Count("id", filter=Q(used=3)),
            calls_attempts_4=Count("id", filter=Q(used=4)),
            calls_attempts_5_plus=Count("id", filter=Q(used__gte=5)),
            unknown_calls=Count("id", filter=unknown),
            unknown_decided=Count("id", filter=unknown & Q(decided_at__isnull=False)),
            unknown_open=Count(
                "id", filter=unknown & Q(decided_at__isnull=True, state__in=OPEN_STATES)
            ),
        )
        .order_by()
    )


def bucket_aggregate(*, project_id: int, bucket: datetime) -> list[dict]:
    """The rollup cells of one bucket computed from ``ToolCall`` (``rollup_cells``)."""
    calls = ToolCall.objects.filter(
        project_id=project_id, created_at__gte=bucket, created_at__lt=bucket + timedelta(hours=1)
    )
    return [{k: v for k, v in row.items() if k != "bucket"} for row in rollup_cells(calls)]


def rollup_bucket_refresh(*, project_id: int, bucket: datetime) -> int:
    """Recompute one (project, hour) bucket: delete its rollup rows and insert the fresh
    aggregate, and rewrite its hour's and day's ``RollupCube`` rows, atomically and
    serialised per bucket. Returns the number of ``CallRollup`` rows written."""
    bucket = hour_floor(bucket)
    with transaction.atomic():
        _lock_bucket(project_id, bucket)
        # the mark goes with this transaction; one made after the aggregate's snapshot by a
        # transaction still open waits on this delete and lands after it, for the next run
        RollupDirtyBucket.objects.filter(project_id=project_id, bucket=bucket).delete()
        cells = bucket_aggregate(project_id=project_id, bucket=bucket)
        CallRollup.objects.filter(project_id=project_id, bucket=bucket).delete()
        CallRollup.objects.bulk_create(
            [CallRollup(project_id=project_id, bucket=bucket, **cell) for cell in cells]
        )
        _cube_hour_write(project_id=project_id, bucket=bucket, cells=cells)
    return len(cells)


def buckets_touch(calls: Iterable[ToolCall]) -> None:
    """Mark the (project, creation hour) buckets of ``calls`` for the next refresh: one
    ``INSERT … ON CONFLICT DO NOTHING``. Call it in the transaction that changes the calls
    (every writer of ``ToolCall`` does): the mark commits with the change, or neither does."""
    rows = {(c.project_id, hour_floor(c.created_at)) for c in calls}
    if rows:
        RollupDirtyBucket.objects.bulk_create(
            [RollupDirtyBucket(project_id=pid, bucket=hour) for pid, hour in sorted(rows)],
            ignore_conflicts=True,
        )


def touched_buckets(*, project_id: int | None = None) -> list[Bucket]:
    """The buckets marked by ``buckets_touch`` and not refreshed since, oldest first."""
    rows = RollupDirtyBucket.objects.all()
    if project_id is not None:
        rows = rows.filter(project_id=project_id)
    return [
        (pid, hour_floor(hour))
        for pid, hour in rows.order_by("project_id", "bucket").values_list("project_id", "bucket")
    ]


def rollups_refresh_changed(*, now: datetime | None = None) -> dict:
    """Refresh every bucket marked by ``buckets_touch`` (each in its own transaction, which
    also removes the mark: a mark made meanwhile by another transaction survives for the
    next run) and record this run's start as the rollups' freshness (``rollups_as_of``).
    Returns ``{"buckets": n, "rows": n}``."""
    started = now or timezone.now()
    buckets = touched_buckets()
    rows = sum(rollup_bucket_refresh(project_id=pid, bucket=hour) for pid, hour in buckets)
    previous = cache.get(WATERMARK_KEY)
    if previous is None or previous < started:
        cache.set(WATERMARK_KEY, started, timeout=None)
    return {"buckets": len(buckets), "rows": rows}


def rollups_as_of() -> datetime | None:
    """How fresh the rollups are: the start of the newest successful refresh (the watermark)
    or full rebuild, whichever is later; every call change committed before it is counted.
    None when neither is known (never run, or the cache was flushed)."""
    moments = [m for m in (cache.get(WATERMARK_KEY), cache.get(REBUILT_KEY)) if m is not None]
    return max(moments) if moments else None


def rollups_rebuild(
    *,
    project_id: int | None = None,
    since: datetime | None = None,
    progress: Callable[[int, int, Bucket], None] | None = None,
) -> dict:
    """Recompute every bucket that has calls, rollup rows or hour cube rows (of one project,
    from ``since`` on). Buckets whose calls are gone lose their rows. ``progress(done, total, bucket)`` is
    called after each bucket. Returns ``{"buckets": n, "rows": n}``."""
    started = timezone.now()
    calls = ToolCall.objects.all()
    rollups = CallRollup.objects.all()
    cubes = RollupCube.objects.filter(grain=RollupCube.Grain.HOUR)
    if project_id is not None:
        calls = calls.filter(project_id=project_id)
        rollups = rollups.filter(project_id=project_id)
        cubes = cubes.filter(project_id=project_id)
    if since is not None:
        calls = calls.filter(created_at__gte=hour_floor(since))
        rollups = rollups.filter(bucket__gte=hour_floor(since))
        cubes = cubes.filter(bucket__gte=hour_floor(since))
    buckets: set[Bucket] = {
        (pid, hour_floor(hour))
        for pid, hour in calls.annotate(hour=TruncHour("created_at", tzinfo=UTC))
        .values_list("project_id", "hour")
        .distinct()
        .order_by()
    }
    for rowset in (rollups, cubes):
        buckets |= {
            (pid, hour_floor(b))
            for pid, b in rowset.values_list("project_id", "bucket").distinct().order_by()
        }
    ordered: Iterable[Bucket] = sorted(buckets)
    total = len(buckets)
    rows = 0
    for done, (pid, hour) in enumerate(ordered, start=1):
        rows += rollup_bucket_refresh(project_id=pid, bucket=hour)
        if progress is not None:
            progress(done, total, (pid, hour))
    if project_id is None and since is None:
        previous = cache.get(REBUILT_KEY)
        if previous is None or previous < started:
            cache.set(REBUILT_KEY, started, timeout=None)
    return {"buckets": total, "rows": rows}


@shared_task(name="callgate.rollups.refresh_rollups", ignore_result=True)
def refresh_rollups() -> dict:
    """Celery beat, every minute: recompute the rollup buckets of recently changed calls."""
    result = rollups_refresh_changed()
    logger.info("rollups refreshed: %(buckets)s buckets, %(rows)s rows", result)
    return {"buckets": result["buckets"], "rows": result["rows"]}
