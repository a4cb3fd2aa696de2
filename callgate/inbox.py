"""The inbox: ``POST /api/v1/events`` and the gate store validated envelopes here
(``events_receive``, one statement per batch, duplicates recognised by event ID), and
``inbox_drain`` applies them in arrival order per project under a PostgreSQL advisory lock,
through ``callgate.ingest.events_apply``'s batch engine. ``event_answer`` is what
``GET /api/v1/events/{event_id}`` reads.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import OperationalError, connection, transaction
from django.db.models.fields.json import KT
from django.db.models.functions import JSONObject
from django.utils import timezone

from callgate.ingest import (
    ACCEPTED,
    DECISION_TYPES,
    DUPLICATE,
    VERDICT_FOR_ROUTE,
    Outcome,
    call_answer,
    events_apply,
    retry_after,
)
from callgate.models import Agent, CallEvent, InboxEvent, Project, ToolCall, ToolContract
from callgate.schemas import EVENT_ADAPTER, MAX_CLOCK_SKEW
from callgate.taxonomy import Route
from callgate.wire import redact

S = ToolCall.State
logger = logging.getLogger(__name__)


DRAIN_CHUNK = 500
#: First key of the PostgreSQL advisory lock that serialises one project's drain (the
#: second key is the project's ID). Any fixed 32-bit number unused elsewhere.
DRAIN_LOCK_CLASS = 0x63676174  # "cgat"


def events_receive(
    *, project: Project, agent: Agent, events: list[Any], may_decide: bool = False
) -> list[Outcome]:
    """Store validated events (``callgate.schemas`` models) in the inbox; one ``Outcome`` each,
    in order: ``accepted`` (stored; ``inbox_drain`` applies it), ``duplicate`` (its
    ``event_id`` was applied before, is pending, or came earlier in this batch; one the rules
    rejected is taken again) or ``rejected``.

    Rules checked here, at the door: who may decide (``decision`` and ``approval_expired``
    events are rejected unless ``may_decide``, the key's ``can_decide``) and clock skew
    (``occurred_at`` at most ``schemas.MAX_CLOCK_SKEW`` ahead). Everything else the rules say
    happens when the event is applied. One insert whatever the batch size (``_inbox_insert``)."""
    outcomes: list[Outcome | None] = [None] * len(events)
    fresh: dict[str, int] = {}  # canonical event ID → index
    rows: list[tuple[str, str]] = []
    horizon = time.time() + MAX_CLOCK_SKEW.total_seconds()  # Unix seconds: cheaper than datetimes
    for index, event in enumerate(events):
        if event.type in DECISION_TYPES and not may_decide:
            outcomes[index] = Outcome(
                status="rejected",
                errors=[
                    {
                        "loc": "type",
                        "msg": (
                            f"this API key may not report {event.type!r} events: operators decide in the review queue "
                            "(keys with can_decide are for runtimes with their own approval UI)"
                        ),
                    }
                ],
            )
            continue
        if event.occurred_at.timestamp() > horizon:
            outcomes[index] = Outcome(
                status="rejected",
                errors=[
                    {
                        "loc": "occurred_at",
                        "msg": ("lies more than a day in the future; check the agent's clock"),
                    }
                ],
            )
            continue
        event_id = str(event.event_id)
        if event_id in fresh:
            outcomes[index] = DUPLICATE
            continue
        try:
            body = event.model_dump_json()
        except (
            ValueError
        ) as exc:  # pydantic's serialisation errors; the door should have caught them
            outcomes[index] = Outcome(
                status="rejected", errors=[{"loc": "", "msg": f"cannot be stored: {exc}"[:500]}]
            )
            continue
        fresh[event_id] = index
        rows.append((event_id, body))
    if rows:
        stored = _inbox_insert(project=project, agent=agent, rows=rows)
        for event_id, index in fresh.items():
            outcomes[index] = ACCEPTED if event_id in stored else DUPLICATE
    return outcomes  # type: ignore[return-value]


#: Tries of one batch's inbox insert when PostgreSQL picks it as a deadlock's victim.
INSERT_ATTEMPTS = 3


def _inbox_insert(*, project: Project, agent: Agent, rows: list[tuple[str, str]]) -> set[str]:
    """Insert ``(event ID, event as JSON)`` rows, in order, unless the event ID is in the
    inbox already (pending, or applied: kept until retention); returns the event IDs
    stored (canonical text). A re-sent event whose first copy the rules rejected is taken
    again, at the end of the queue (the call it needed may exist by now): only then, a delete
    and a second insert.

    Hand-written SQL: the ORM's ``bulk_create(ignore_conflicts=True)`` cannot say which rows
    it skipped, and this is the ingest hot path.

    Two batches holding the same event IDs in different orders can deadlock on each other's
    rows (PostgreSQL aborts one, ``DeadlockDetected``); the aborted one is tried again, up to
    ``INSERT_ATTEMPTS`` times, and then finds the other's rows stored (duplicates)."""
    for attempt in range(1, INSERT_ATTEMPTS + 1):
        try:
            with transaction.atomic():
                stored = _insert_rows(project=project, agent=agent, rows=rows)
                if len(stored) < len(rows):
                    skipped = [event_id for event_id, _ in rows if event_id not in stored]
                    rejected = InboxEvent.objects.filter(
                        project=project, status=InboxEvent.Status.REJECTED, event_id__in=skipped
                    )
                    retry = {
                        str(event_id) for event_id in rejected.values_list("event_id", flat=True)
                    }
                    if retry:
                        rejected.delete()
                        stored |= _insert_rows(
                            project=project, agent=agent, rows=[r for r in rows if r[0] in retry]
                        )
                return stored
        except OperationalError as exc:
            if (
                not isinstance(exc.__cause__, psycopg.errors.DeadlockDetected)
                or attempt == INSERT_ATTEMPTS
            ):
                raise
            logger.info(
                "inbox insert for project %s deadlocked with another batch; attempt %d",
                project.pk,
                attempt,
            )
    raise AssertionError("unreachable")


def _insert_rows(*, project: Project, agent: Agent, rows: list[tuple[str, str]]) -> set[str]:
    """One insert, ``ON CONFLICT (project, event_id) DO NOTHING``; returns the event IDs
    stored, as canonical text (``str(uuid)``). The conflict alone decides what was seen:
    applied events keep their inbox row (``applied``) until retention, so the unique index
    is the only structure the statement reads, whatever the planner believes about the
    project's size (a probe of applied ``CallEvent`` IDs once switched, for a new tenant
    without statistics, to reading the project's events: 18.8 s for 500 events).
    PostgreSQL: one statement over the events as one JSON array (``jsonb_array_elements``;
    ``model_dump_json`` writes the event ID in canonical form), its text short and fixed
    whatever the batch size. Elsewhere (SQLite, the embedded default): one multi-row
    ``VALUES`` insert."""
    meta = InboxEvent._meta
    received_at = meta.get_field("received_at").get_db_prep_value(timezone.now(), connection)
    event_id_field = meta.get_field("event_id")
    columns = "project_id, agent_id, event_id, body, received_at, status, errors"
    with _bound_cursor() as cursor:
        if connection.vendor == "postgresql":
            # The events travel as one JSON array (one escaped string, not 2 × N parameters);
            # the IDs come back as text, cheaper to read than UUID objects. "Applied before" is
            # a scalar subquery on purpose: one probe of the unique (project, event_id) index
            # per event. As NOT EXISTS the planner chose a hash anti-join that read all of the
            # project's events for every batch (ingest slowed as the project grew).
            document = "[" + ",".join(body for _, body in rows) + "]"
            cursor.execute(
                f"INSERT INTO {meta.db_table} ({columns}) "
                f"SELECT %s, %s, (e.body ->> 'event_id')::uuid, e.body, %s, %s, '[]'::jsonb "
                f"FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS e(body, n) "
                f"ORDER BY e.n ON CONFLICT (project_id, event_id) DO NOTHING RETURNING event_id::text",
                [project.pk, agent.pk, received_at, InboxEvent.Status.PENDING, document],
            )
            return {value for (value,) in cursor.fetchall()}
        params: list[Any] = []
        for event_id, body in rows:
            params += [
                project.pk,
                agent.pk,
                event_id_field.get_db_prep_value(event_id, connection),
                body,
                received_at,
                InboxEvent.Status.PENDING,
                "[]",
            ]
        values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(rows))
        cursor.execute(
            f"INSERT INTO {meta.db_table} ({columns}) VALUES {values} "
            f"ON CONFLICT (project_id, event_id) DO NOTHING RETURNING event_id",
            params,
        )
        return {str(event_id_field.to_python(value)) for (value,) in cursor.fetchall()}


def _bound_cursor():
    """A cursor for the ingest insert. PostgreSQL: psycopg 3's own ``Cursor``, which sends
    parameters apart from the SQL text (server-side binding), inside Django's wrapper (its
    query log and execute wrappers see it as any query). Django's default cursor quotes them
    into the text, which costs about 4 of 45 µs per event here: the batch's JSON document is
    one ~200 kB parameter. Elsewhere: Django's cursor."""
    if connection.vendor != "postgresql":
        return connection.cursor()
    connection.ensure_connection()
    cursor = psycopg.Cursor(connection.connection)
    return (
        connection.make_debug_cursor(cursor)
        if connection.queries_logged
        else connection.make_cursor(cursor)
    )


def inbox_drain(project_id: int) -> int:
    """Apply the project's pending inbox events received so far (up to the newest pending row
    when called), in arrival order, ``DRAIN_CHUNK`` per transaction; returns how many rows it
    processed (applied or rejected). Bounded: rows received after the call are left to the
    drain their own request enqueued, so a gate check never waits for events sent after it.

    One drainer per project at a time, per chunk (a PostgreSQL advisory lock; a per-project
    process lock elsewhere): a second drainer waits at most one chunk, then continues with
    whatever is still pending up to its own bound (often nothing: the first took it)."""
    bound = (
        InboxEvent.objects.filter(project_id=project_id, status=InboxEvent.Status.PENDING)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    processed = 0
    while bound is not None:
        done = _drain_chunk(project_id, bound=bound)
        if not done:
            break
        processed += done
    return processed


_local_locks_guard = threading.Lock()
_local_locks: dict[int, threading.Lock] = {}


@contextmanager
def _drain_lock(project_id: int) -> Iterator[None]:
    """Inside a transaction: hold the project's drain lock until the transaction ends."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [DRAIN_LOCK_CLASS, project_id])
        yield  # released when the transaction ends
        return
    with _local_locks_guard:
        lock = _local_locks.setdefault(project_id, threading.Lock())
    with lock:
        yield


def _drain_chunk(project_id: int, *, bound: int) -> int:
    """Apply up to ``DRAIN_CHUNK`` pending rows with ``id <= bound`` in one transaction; how
    many were processed. A fixed number of queries per chunk and per run of one agent's rows.
    A rejected row keeps its body with obvious secrets and the project's sensitive fields
    redacted (``redact``), like a stored ``CallEvent``."""
    with transaction.atomic(), _drain_lock(project_id):
        rows = list(
            InboxEvent.objects.filter(
                project_id=project_id, status=InboxEvent.Status.PENDING, id__lte=bound
            ).order_by("id")[:DRAIN_CHUNK]
        )
        if not rows:
            return 0
        project = Project.objects.get(pk=project_id)
        agents = Agent.objects.in_bulk({row.agent_id for row in rows})
        done, rejected = [], []
        start = 0
        while start < len(rows):  # runs of consecutive rows from one agent, in order
            end = start
            while end < len(rows) and rows[end].agent_id == rows[start].agent_id:
                end += 1
            for row, outcome in zip(
                rows[start:end],
                _apply_rows(project, agents[rows[start].agent_id], rows[start:end]),
                strict=False,
            ):
                if outcome.status == "rejected":
                    row.status, row.errors = InboxEvent.Status.REJECTED, outcome.errors
                    rejected.append(row)
                else:
                    done.append(row.pk)
            start = end
        # applied rows stay (their event ID is what the next insert's ON CONFLICT sees), with
        # the body cut to its type: the applied, redacted copy is the CallEvent
        InboxEvent.objects.filter(pk__in=done).update(
            status=InboxEvent.Status.APPLIED, body=JSONObject(type=KT("body__type"))
        )
        if rejected:
            sensitive = {
                name
                for names in ToolContract.objects.filter(project_id=project_id).values_list(
                    "sensitive_fields", flat=True
                )
                for name in names or ()
            }
            for row in rejected:
                row.body = redact(row.body, sensitive)
            InboxEvent.objects.bulk_update(rejected, ["status", "errors", "body"])
        return len(rows)


#: What an inbox row that cannot be applied says (a bug, logged with its stack trace).
APPLY_FAILED = "callgate could not apply this event (an internal error, logged for the operators)"


def _apply_rows(project: Project, agent: Agent, rows: list[InboxEvent]) -> list[Outcome]:
    """``events_apply`` over the rows' events; a row whose body no longer validates, or a
    batch that fails unexpectedly, never blocks the rows behind it."""
    outcomes: list[Outcome | None] = [None] * len(rows)
    events, positions = [], []
    for position, row in enumerate(rows):
        try:
            events.append(EVENT_ADAPTER.validate_python(row.body))
            positions.append(position)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            outcomes[position] = Outcome(
                status="rejected", errors=[{"loc": "", "msg": str(exc)[:2000]}]
            )
    try:
        applied = events_apply(project=project, agent=agent, events=events)
    except Exception:
        logger.exception(
            "applying %d inbox events of project %s failed; applying them one by one",
            len(events),
            project.pk,
        )
        applied = []
        for event in events:
            try:
                applied.append(events_apply(project=project, agent=agent, events=[event])[0])
            except Exception:
                logger.exception(
                    "inbox event %s of project %s cannot be applied", event.event_id, project.pk
                )
                applied.append(
                    Outcome(status="rejected", errors=[{"loc": "", "msg": APPLY_FAILED}])
                )
    for position, outcome in zip(positions, applied, strict=True):
        outcomes[position] = outcome
    return outcomes  # type: ignore[return-value]


def inbox_lag_seconds(project: Project) -> float:
    """Inbox lag: how long the project's oldest pending event has waited to be applied, in
    seconds (0.0 when nothing is pending). Rejected rows do not count: they wait for nobody.
    One probe of the ``(project, status, id)`` index: the oldest pending row is the first."""
    oldest = (
        InboxEvent.objects.filter(project=project, status=InboxEvent.Status.PENDING)
        .order_by("id")
        .values_list("received_at", flat=True)
        .first()
    )
    if oldest is None:
        return 0.0
    return max((timezone.now() - oldest).total_seconds(), 0.0)


def event_answer(project: Project, event_id: uuid.UUID) -> dict | None:
    """Where one received event stands, or ``None`` when this project never received it:
    ``{"event_id", "status", "errors", "answer"}`` with status ``pending`` (in the inbox),
    ``rejected`` (refused by the rules when applied; ``errors`` say why) or ``applied``
    (``answer``: the ``CallAnswer`` as this event left the call: its reason, category, route,
    verdict, observation and the state it moved the call to; attempts, receipt and decision
    are the call's now; ``GET /api/v1/calls/{operation_id}`` has where the call stands now)."""
    event = (
        CallEvent.objects.select_related("call__contract")
        .filter(project=project, event_id=event_id)
        .first()
    )
    if event is not None:
        answer = call_answer(event.call)
        if event.route:
            answer.update(
                state=event.state_after or answer["state"],
                reason=event.reason or None,
                category=event.category or None,
                route=event.route,
                observation=event.observation,
                verdict="pending_approval"
                if event.state_after == S.PENDING_APPROVAL
                else VERDICT_FOR_ROUTE[Route(event.route)],
                retry_after=retry_after(event.call.contract, event.call.attempts)
                if event.route == Route.RETRY
                else None,
            )
        return {
            "event_id": str(event_id),
            "status": "applied",
            "kind": event.kind,
            "errors": [],
            "answer": answer,
        }
    row = (
        InboxEvent.objects.filter(project=project, event_id=event_id)
        .only("status", "errors", "body")
        .first()
    )
    if row is None:
        return None
    return {
        "event_id": str(event_id),
        "status": row.status,
        "kind": row.body.get("type"),
        "errors": row.errors,
        "answer": None,
    }
