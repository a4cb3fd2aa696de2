"""Review rollups: closed review items counted in ``ReviewRollup`` cells, what the review
health report reads (``decided_cells``) instead of the items themselves.

Kept by adding
--------------
An item closes once: resolved by a human, expired, or settled by a later event, and no way
leads back to open. So a cell never has to be recomputed; every writer that closes items
(``reviews.services.review_item_decide`` and ``review_items_expire``,
``callgate.escalation.review_items_settle_bulk``) calls ``review_rollups_add`` in the
transaction that closes them: the counts commit with the closing, or neither does. Each
closed item is added to eight cells: per UTC hour and per UTC day of ``resolved_at``, each
for the four ``dims`` (total, per tool, per agent, per tool and agent).
``review_rollups_rebuild`` recomputes a project's cells from its items (after a bulk load,
an upgrade that brought the table, a purge of items): ``manage.py backfill_rollups``.

Time to decision from a histogram
---------------------------------
A cell of human decisions holds the time from the item's opening to the decision as a
log-scale bucket, ``PER_DOUBLING`` buckets a doubling (``decision_bucket``). The report's
median and p90 are the nearest-rank percentile's bucket, read as its geometric middle
(``bucket_seconds``): within 2**(1/16) - 1 = 4.4 % of the exact nearest-rank value, as
for a Prometheus histogram or HdrHistogram (decisions under 2**(1/8) s share the first
bucket and read as about a second).

What a read costs
-----------------
A range is covered by day cells for its whole UTC days and hour cells for the hours left
at either end (``callgate.reports.rollups.rollup_range_q``): a 30-day report reads about
30 days × (resolutions × occupied buckets) cells, whatever the number of items.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.db.models import Sum

from callgate.metrics import hour_floor
from callgate.reports.rollups import day_floor, rollup_range_q
from reviews.models import ReviewItem, ReviewRollup

#: Histogram buckets per doubling of the time to decision.
PER_DOUBLING = 8
#: Cells per statement of ``review_rollups_add`` (ten parameters each: under SQLite's limit).
_CHUNK = 500


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
            status=status,
            resolution=resolution,
            created_at=item.created_at,
            resolved_at=at,
        )


Cell = tuple[int, str, str, int, str, datetime, str, str, int]
#: ``ReviewRollup``'s columns in ``Cell`` order (its unique constraint's), then the count.
_COLUMNS = (
    "project_id",
    "dims",
    "tool_name",
    "agent_id",
    "grain",
    "bucket",
    "status",
    "resolution",
    "decision_bucket",
)


def _cells(items: Iterable[Closed]) -> dict[Cell, int]:
    """The cells ``items`` count in, with how many of them each: eight a closed item (hour
    and day, times the four dims)."""
    out: dict[Cell, int] = {}
    for item in items:
        human = item.status == ReviewItem.Status.RESOLVED
        took = max(0.0, (item.resolved_at - item.created_at).total_seconds())
        decision = decision_bucket(took) if human else 0
        agent = item.agent_id or 0
        kept = (
            (ReviewRollup.Dims.TOTAL, "", 0),
            (ReviewRollup.Dims.TOOL, item.tool_name, 0),
            (ReviewRollup.Dims.AGENT, "", agent),
            (ReviewRollup.Dims.TOOL_AGENT, item.tool_name, agent),
        )
        for grain, floor in (
            (ReviewRollup.Grain.HOUR, hour_floor),
            (ReviewRollup.Grain.DAY, day_floor),
        ):
            bucket = floor(item.resolved_at)
            for dims, tool, agent_id in kept:
                cell = (
                    item.project_id,
                    str(dims),
                    tool,
                    agent_id,
                    str(grain),
                    bucket,
                    item.status,
                    item.resolution,
                    decision,
                )
                out[cell] = out.get(cell, 0) + 1
    return out


def review_rollups_add(items: Iterable[Closed]) -> None:
    """Count ``items``, just closed, in their cells: ``INSERT … ON CONFLICT DO UPDATE``
    adding to the counts (PostgreSQL and SQLite alike), the cells in key order so that two
    transactions adding to the same cells lock them in the same order. Call it in the
    transaction that closes the items."""
    cells = sorted(_cells(items).items())
    if not cells:
        return
    table = connection.ops.quote_name(ReviewRollup._meta.db_table)
    columns = ", ".join(_COLUMNS)
    bucket_field = ReviewRollup._meta.get_field("bucket")
    with connection.cursor() as cursor:
        for start in range(0, len(cells), _CHUNK):
            chunk = cells[start : start + _CHUNK]
            params: list = []
            for cell, items_n in chunk:
                values = list(cell)
                values[5] = bucket_field.get_db_prep_value(cell[5], connection)
                params += [*values, items_n]
            rows = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(chunk))
            cursor.execute(
                f"INSERT INTO {table} ({columns}, items) VALUES {rows} "
                f"ON CONFLICT ({columns}) DO UPDATE SET items = {table}.items + excluded.items",
                params,
            )


def review_rollups_rebuild(*, project_id: int) -> int:
    """Recompute every ``ReviewRollup`` cell of one project from its closed items, in one
    transaction (readers see the old cells or the new), safe while items close: the
    project's open items stay locked until it commits. Returns the cells written."""
    closed = (
        ReviewItem.objects.filter(project_id=project_id, resolved_at__isnull=False)
        .exclude(status__in=ReviewItem.OPEN_STATUSES)
        .values_list("tool_name", "agent_id", "status", "resolution", "created_at", "resolved_at")
    )
    with transaction.atomic():
        # the open items locked first: an item closing now waits, one closed meanwhile (its
        # cells added, or its transaction still open: the lock waits for it) is counted by
        # the read below, after the delete (READ COMMITTED: each statement sees what had
        # committed when it began)
        list(
            ReviewItem.objects.select_for_update()
            .filter(project_id=project_id, status__in=ReviewItem.OPEN_STATUSES)
            .values_list("pk", flat=True)
        )
        ReviewRollup.objects.filter(project_id=project_id).delete()
        cells = _cells(
            Closed(project_id, tool, agent, status, resolution, created, resolved)
            for tool, agent, status, resolution, created, resolved in closed.iterator(
                chunk_size=5000
            )
            if resolved is not None  # the filter's; for the type checker
        )
        ReviewRollup.objects.bulk_create(
            (
                ReviewRollup(**dict(zip(_COLUMNS, cell, strict=True)), items=n)
                for cell, n in cells.items()
            ),
            batch_size=5000,
        )
    return len(cells)


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
    grouped read of day cells for the whole days and hour cells for the rest."""
    dims = (
        ReviewRollup.Dims.TOOL_AGENT
        if tool and agent_id is not None
        else ReviewRollup.Dims.TOOL
        if tool
        else ReviewRollup.Dims.AGENT
        if agent_id is not None
        else ReviewRollup.Dims.TOTAL
    )
    rows = (
        ReviewRollup.objects.filter(
            project_id=project_id, dims=dims, tool_name=tool, agent_id=agent_id or 0
        )
        .filter(rollup_range_q(since, until, period="day"))
        .values("status", "resolution", "decision_bucket")
        .annotate(n=Sum("items"))
        .order_by()
        .values_list("status", "resolution", "decision_bucket", "n")
    )
    return list(rows)
