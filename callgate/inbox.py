"""The inbox: ``POST /api/v1/events`` and the gate store validated envelopes here
(``events_receive``, one statement per batch, duplicates recognised by event ID), and
``inbox_drain`` applies them in arrival order per project under a PostgreSQL advisory lock,
through ``callgate.ingest.events_apply``'s batch engine. ``event_answer`` is what
``GET /api/v1/events/{event_id}`` reads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import F, Q
from django.db.models.fields.json import KT
from django.db.models.functions import JSONObject
from django.utils import timezone

from callgate.ingest import (
    ACCEPTED,
    DECISION_TYPES,
    DUPLICATE,
    TOOL_NAME_LENGTH,
    VERDICT_FOR_ROUTE,
    Outcome,
    bound_cursor,
    call_answer,
    events_apply,
    models_from_rows,
    retry_after,
    turn_event_ids,
)
from callgate.models import Agent, CallEvent, InboxEvent, Project, ToolCall, ToolContract
from callgate.prometheus import QUARANTINED as QUARANTINED_EVENTS
from callgate.schemas import EVENT_ADAPTER, MAX_CLOCK_SKEW
from callgate.taxonomy import Route
from callgate_sdk.providers import envelope_calls, normalise
from callgate_sdk.wire import canonical_json, redact

S = ToolCall.State
logger = logging.getLogger(__name__)


DRAIN_CHUNK = 500
#: First key of the PostgreSQL advisory lock that serialises one project's drain (the
#: second key is the project's ID). Any fixed 32-bit number unused elsewhere.
DRAIN_LOCK_CLASS = 0x63676174  # "cgat"


#: ``inbox_over_limit``'s last answers in this process: project ID -> (monotonic time, limit,
#: answer). Bounded by the number of projects.
_over_limit_memo: dict[int, tuple[float, int, float | None]] = {}


def inbox_over_limit(project: Project) -> float | None:
    """Backpressure: seconds an agent should wait before sending this project more work
    (the ``Retry-After`` of a 429, RFC 9110 §10.2.3), or ``None`` while the project's
    pending inbox holds fewer than ``settings.CALLGATE_INBOX_LIMIT`` events. Work accepted
    past that could not be applied in time: ``POST /api/v1/events``, the gate and the OTLP
    receiver refuse it instead. A limit of 0 turns the check off.

    One probe of the drain index (up to the limit's entries, however long the backlog), at
    most once per ``settings.CALLGATE_INBOX_PROBE_MS`` per project and process: the
    answer in between is the last one, so a flood overshoots the limit by at most that
    long's intake, and a request never pays for reading a long backlog each time."""
    limit = settings.CALLGATE_INBOX_LIMIT
    if not limit:
        return None
    now = time.monotonic()
    memo = _over_limit_memo.get(project.pk)
    fresh = settings.CALLGATE_INBOX_PROBE_MS / 1000
    if memo is not None and memo[1] == limit and now - memo[0] < fresh:
        return memo[2]
    over = (
        InboxEvent.objects.filter(project=project, status=InboxEvent.Status.PENDING)
        .order_by("id")
        .values_list("id", flat=True)[limit - 1 : limit]
        .exists()
    )
    answer = float(settings.CALLGATE_INBOX_RETRY_AFTER) if over else None
    _over_limit_memo[project.pk] = (now, limit, answer)
    return answer


def events_receive(
    *,
    project: Project,
    agent: Agent,
    events: list[Any],
    may_decide: bool = False,
    applied: bool = False,
) -> list[Outcome]:
    """Store validated events (``callgate.schemas`` models) in the inbox; one ``Outcome`` each,
    in order: ``accepted`` (stored; ``inbox_drain`` applies it), ``duplicate`` (the same
    content under an ``event_id`` that was applied before, is pending, or came earlier in
    this batch; one the rules rejected is taken again), ``conflict`` (that ``event_id`` was
    used for other content: ``CONFLICT``, its error naming ``event_id``; nothing is stored)
    or ``rejected``. "The same content" is the validated event, key order aside (what
    ``_same_body`` and the rows' ``digest`` compare).

    Rules checked here, at the door: who may decide (``decision`` and ``approval_expired``
    events are rejected unless ``may_decide``, the key's ``can_decide``) and clock skew
    (``occurred_at`` at most ``schemas.MAX_CLOCK_SKEW`` ahead). Everything else the rules say
    happens when the event is applied. One insert whatever the batch size (``_inbox_insert``)."""
    outcomes: list[Outcome | None] = [None] * len(events)
    fresh: dict[str, int] = {}  # canonical event ID → its position in rows
    positions: dict[str, int] = {}  # canonical event ID → index in events
    rows: list[tuple[str, str]] = []
    repeats: list[tuple[int, str, str]] = []  # (index, event ID, body) of later copies
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
        if event.type == "proposed" and (count := envelope_calls(event.format, event.call)) > 1:
            outcomes[index] = Outcome(
                status="rejected",
                errors=[
                    {
                        "loc": "call",
                        "msg": (
                            f"holds {count} tool calls: send a whole model response as one 'turn' "
                            'event ({"type": "turn", "format", "response"}), not as a proposed call'
                        ),
                    }
                ],
            )
            continue
        event_id = str(event.event_id)
        try:
            body = event.model_dump_json()
        except (
            ValueError
        ) as exc:  # pydantic's serialisation errors; the door should have caught them
            outcomes[index] = Outcome(
                status="rejected", errors=[{"loc": "", "msg": f"cannot be stored: {exc}"[:500]}]
            )
            continue
        if event_id in fresh:  # earlier in this batch: compared once the insert is done
            repeats.append((index, event_id, body))
            continue
        fresh[event_id] = len(rows)
        positions[event_id] = index
        rows.append((event_id, body))
    if rows:
        stored = _inbox_insert(
            project=project, agent=agent, rows=rows, may_decide=may_decide, applied=applied
        )
        # each copy of an event ID this batch did not store is compared with the stored row;
        # a repeat of one it stored, with the copy it stored
        seen = [(positions[event_id], event_id, body) for event_id, body in rows]
        seen = [row for row in seen if row[1] not in stored]
        for index, event_id, body in repeats:
            if event_id in stored:
                first = rows[fresh[event_id]][1]
                outcomes[index] = DUPLICATE if _same_body(first, body) else CONFLICT
            else:
                seen.append((index, event_id, body))
        conflicting = _conflicting(project=project, rows=seen) if seen else set()
        for index, _, _ in seen:
            outcomes[index] = CONFLICT if index in conflicting else DUPLICATE
        for event_id in stored:
            outcomes[positions[event_id]] = ACCEPTED
    return outcomes  # type: ignore[return-value]


#: The outcome of an event whose ``event_id`` was used before for other content: a client
#: that re-uses IDs would otherwise get the first event's result without a word.
CONFLICT = Outcome(
    status="conflict",
    errors=[
        {
            "loc": "event_id",
            "msg": (
                "already used for an event with other content; an event_id names one event: "
                "send this event with a new event_id (re-send the first one unchanged to "
                "read its result)"
            ),
        }
    ],
)


def _normal_text(body: str) -> str:
    """An event's stored JSON text with its keys sorted at every level: the same for the
    same content whatever the order the client wrote its keys in."""
    return json.dumps(json.loads(body), sort_keys=True, separators=(",", ":"))


def _same_body(first: str, second: str) -> bool:
    """Whether two events' JSON texts (``model_dump_json``) hold the same content."""
    return first == second or _normal_text(first) == _normal_text(second)


def _python_digest(body: str) -> str:
    """The ``InboxEvent.digest`` of an event's JSON text where the database does not compute
    it (SQLite, the embedded default); PostgreSQL uses ``md5`` of the ``jsonb`` text, whose
    keys it keeps in its own fixed order."""
    return hashlib.md5(_normal_text(body).encode(), usedforsecurity=False).hexdigest()


#: Tries of one batch's inbox insert when PostgreSQL picks it as a deadlock's victim.
INSERT_ATTEMPTS = 5
#: seconds: the base of the full-jitter backoff between those tries
INSERT_BACKOFF = 0.02


def _inbox_insert(
    *,
    project: Project,
    agent: Agent,
    rows: list[tuple[str, str]],
    may_decide: bool = False,
    applied: bool = False,
) -> set[str]:
    """Insert ``(event ID, event as JSON)`` rows, in order, unless the event ID is in the
    inbox already (pending, or applied: kept until retention); returns the event IDs
    stored (canonical text). A re-sent event whose first copy the rules rejected is taken
    again, at the end of the queue (the call it needed may exist by now): only then, a delete
    and a second insert.

    Hand-written SQL: the ORM's ``bulk_create(ignore_conflicts=True)`` cannot say which rows
    it skipped, and this is the ingest hot path.

    Two batches holding the same event IDs in different orders can deadlock on each other's
    rows (PostgreSQL aborts one, ``DeadlockDetected``); the aborted one is tried again after
    a full-jitter backoff, up to ``INSERT_ATTEMPTS`` times, and then finds the other's rows
    stored (duplicates)."""
    if connection.in_atomic_block:  # the gate's transaction: its caller tries it again whole
        return _insert_or_take_again(
            project=project, agent=agent, rows=rows, may_decide=may_decide, applied=applied
        )
    for attempt in range(1, INSERT_ATTEMPTS + 1):
        try:
            with transaction.atomic():
                return _insert_or_take_again(
                    project=project, agent=agent, rows=rows, may_decide=may_decide, applied=applied
                )
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
            # full-jitter backoff, so that the batch that won finishes before this one goes
            # again (an immediate retry can meet it half-way once more)
            time.sleep(random.uniform(0, INSERT_BACKOFF * 2**attempt))
    raise AssertionError("unreachable")


def _insert_or_take_again(
    *,
    project: Project,
    agent: Agent,
    rows: list[tuple[str, str]],
    may_decide: bool,
    applied: bool,
) -> set[str]:
    """``_insert_rows``, then the re-sent events whose first copy was rejected, again."""
    stored = _insert_rows(
        project=project, agent=agent, rows=rows, may_decide=may_decide, applied=applied
    )
    if len(stored) < len(rows):
        skipped = [event_id for event_id, _ in rows if event_id not in stored]
        rejected = InboxEvent.objects.filter(
            project=project, status=InboxEvent.Status.REJECTED, event_id__in=skipped
        )
        retry = {str(event_id) for event_id in rejected.values_list("event_id", flat=True)}
        if retry:
            rejected.delete()
            stored |= _insert_rows(
                project=project,
                agent=agent,
                rows=[r for r in rows if r[0] in retry],
                may_decide=may_decide,
                applied=applied,
            )
    return stored


def _conflicting(*, project: Project, rows: list[tuple[int, str, str]]) -> set[int]:
    """Of ``rows`` (``(index, event ID, event as JSON)``, each ID in the inbox already), the
    indexes of those whose content differs from the stored row's: its ``digest`` differs.
    One query. Rows stored before digests existed (empty ``digest``) never conflict: nothing
    tells them apart."""
    table = InboxEvent._meta.db_table
    if connection.vendor == "postgresql":
        document = "[" + ",".join(body for _, _, body in rows) + "]"
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT e.n FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS e(body, n) "
                f"JOIN {table} i ON i.project_id = %s "
                f"AND i.event_id = (e.body ->> 'event_id')::uuid "
                f"WHERE i.digest <> '' AND i.digest <> md5(e.body::text)",
                [document, project.pk],
            )
            return {rows[n - 1][0] for (n,) in cursor.fetchall()}
    digests = {
        str(event_id): digest
        for event_id, digest in InboxEvent.objects.filter(
            project=project, event_id__in={event_id for _, event_id, _ in rows}
        ).values_list("event_id", "digest")
    }
    return {
        index
        for index, event_id, body in rows
        if digests.get(event_id) and digests[event_id] != _python_digest(body)
    }


def _insert_rows(
    *,
    project: Project,
    agent: Agent,
    rows: list[tuple[str, str]],
    may_decide: bool,
    applied: bool = False,
) -> set[str]:
    """One insert, ``ON CONFLICT (project, event_id) DO NOTHING``; returns the event IDs
    stored, as canonical text (``str(uuid)``). The conflict alone decides what was seen:
    applied events keep their inbox row (``applied``) until retention, so the unique index
    is the only structure the statement reads, whatever the planner believes about the
    project's size (a probe of applied ``CallEvent`` IDs once switched, for a new tenant
    without statistics, to reading the project's events: 18.8 s for 500 events).
    PostgreSQL: one statement over the events as one JSON array (``jsonb_array_elements``;
    ``model_dump_json`` writes the event ID in canonical form), its text short and fixed
    whatever the batch size. Elsewhere (SQLite, the embedded default): one multi-row
    ``VALUES`` insert. ``applied``: stored as applied already, the body cut to its type (the
    gate, which applies the event in the same transaction; its digest is of the whole
    event)."""
    meta = InboxEvent._meta
    received_at = meta.get_field("received_at").get_db_prep_value(timezone.now(), connection)
    status = InboxEvent.Status.APPLIED if applied else InboxEvent.Status.PENDING
    event_id_field = meta.get_field("event_id")
    columns = (
        "project_id, agent_id, event_id, body, received_at, status, errors, may_decide, digest"
    )
    with bound_cursor() as cursor:
        if connection.vendor == "postgresql":
            # The events travel as one JSON array (one escaped string, not 2 × N parameters);
            # the IDs come back as text, cheaper to read than UUID objects.
            document = "[" + ",".join(body for _, body in rows) + "]"
            stored_body = "jsonb_build_object('type', e.body -> 'type')" if applied else "e.body"
            cursor.execute(
                f"INSERT INTO {meta.db_table} ({columns}) "
                f"SELECT %s, %s, (e.body ->> 'event_id')::uuid, {stored_body}, %s, %s, '[]'::jsonb, %s, "
                f"md5(e.body::text) "
                f"FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS e(body, n) "
                f"ORDER BY e.n ON CONFLICT (project_id, event_id) DO NOTHING RETURNING event_id::text",
                [
                    project.pk,
                    agent.pk,
                    received_at,
                    status,
                    may_decide,
                    document,
                ],
            )
            return {value for (value,) in cursor.fetchall()}
        params: list[Any] = []
        for event_id, body in rows:
            params += [
                project.pk,
                agent.pk,
                event_id_field.get_db_prep_value(event_id, connection),
                json.dumps({"type": json.loads(body)["type"]}) if applied else body,
                received_at,
                status,
                "[]",
                may_decide,
                _python_digest(body),
            ]
        values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(rows))
        cursor.execute(
            f"INSERT INTO {meta.db_table} ({columns}) VALUES {values} "
            f"ON CONFLICT (project_id, event_id) DO NOTHING RETURNING event_id",
            params,
        )
        return {str(event_id_field.to_python(value)) for (value,) in cursor.fetchall()}


#: Drains a row may die with (a worker killed, or stopped at its time limit, while applying
#: it) before it is quarantined. A row tried before is applied on its own, so one poison
#: event never takes the rows beside it into quarantine.
QUARANTINE_AFTER = 3
#: Seconds a drainer waits for another drainer of the same project before giving up (the
#: rows stay pending for that drainer, or the next one). Another project never waits.
DRAIN_LOCK_WAIT = 2.0


class DrainBusy(Exception):
    """Another drainer held the project's drain lock for ``DRAIN_LOCK_WAIT`` seconds;
    ``processed`` rows were applied before that."""

    processed = 0


def inbox_drain(
    project_id: int, *, lock_wait: float = DRAIN_LOCK_WAIT, time_budget: float | None = None
) -> int:
    """Apply the project's pending inbox events received so far (up to the newest pending row
    when called), in arrival order, ``DRAIN_CHUNK`` per transaction; returns how many rows it
    processed (applied, rejected or quarantined). Bounded: rows received after the call are
    left to the drain their own request enqueued, so a gate check never waits for events sent
    after it.

    One drainer per project at a time, per chunk (a PostgreSQL advisory lock; a per-project
    process lock elsewhere): a second drainer waits at most ``lock_wait`` seconds for it, then
    raises ``DrainBusy`` (its ``processed`` says how many rows it applied before; the rest
    stay pending for a later drain: the task tries again, the sweep picks them up).
    Before a chunk is applied its rows' ``attempts`` are counted in a committed transaction,
    so a drain that dies with them leaves them counted: such rows are then applied one at a
    time, and one counted ``QUARANTINE_AFTER`` times is quarantined instead of applied.

    ``time_budget`` (seconds) stops it after the chunk that used the budget up, so a worker
    turns to other projects' work in between (the drain task enqueues itself again)."""
    bound = (
        InboxEvent.objects.filter(project_id=project_id, status=InboxEvent.Status.PENDING)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    processed = 0
    deadline = time.monotonic() + time_budget if time_budget is not None else None
    try:
        while bound is not None:
            done = _drain_chunk(project_id, bound=bound, lock_wait=lock_wait)
            if not done:
                break
            processed += done
            if deadline is not None and time.monotonic() > deadline:
                break
    except DrainBusy as busy:
        busy.processed = processed
        raise
    return processed


_local_locks_guard = threading.Lock()
_local_locks: dict[int, threading.Lock] = {}


@contextmanager
def _drain_lock(project_id: int, *, wait: float) -> Iterator[None]:
    """Hold the project's drain lock (PostgreSQL: a session-level advisory lock, released on
    exit or when the connection dies; elsewhere a process lock) across the transactions of
    one chunk. Raises ``DrainBusy`` when it is not free within ``wait`` seconds."""
    if connection.vendor == "postgresql":
        deadline, pause = time.monotonic() + wait, 0.01
        with connection.cursor() as cursor:
            while True:
                cursor.execute(
                    "SELECT pg_try_advisory_lock(%s, %s)", [DRAIN_LOCK_CLASS, project_id]
                )
                if cursor.fetchone()[0]:
                    break
                if time.monotonic() + pause > deadline:
                    raise DrainBusy(project_id)
                time.sleep(pause)
                pause = min(pause * 2, 0.2)
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [DRAIN_LOCK_CLASS, project_id])
        return
    with _local_locks_guard:
        lock = _local_locks.setdefault(project_id, threading.Lock())
    if not lock.acquire(timeout=wait):
        raise DrainBusy(project_id)
    try:
        yield
    finally:
        lock.release()


def _drain_chunk(project_id: int, *, bound: int, lock_wait: float = DRAIN_LOCK_WAIT) -> int:
    """Apply up to ``DRAIN_CHUNK`` pending rows with ``id <= bound``, holding the project's
    drain lock: their ``attempts`` counted in one transaction, then applied in another (a
    drainer that cannot get the lock counts nothing); how many were processed. A fixed
    number of queries per chunk and per run of one agent's rows. A rejected row keeps its
    body with obvious secrets and the project's sensitive fields redacted (``redact``), like
    a stored ``CallEvent``."""
    with _drain_lock(project_id, wait=lock_wait):
        return _drain_chunk_locked(project_id, bound=bound)


def _drain_chunk_locked(project_id: int, *, bound: int) -> int:
    with transaction.atomic():
        head = list(
            InboxEvent.objects.filter(
                project_id=project_id, status=InboxEvent.Status.PENDING, id__lte=bound
            )
            .order_by("id")
            .values_list("id", "attempts")[:DRAIN_CHUNK]
        )
        if not head:
            return 0
        first_id, first_attempts = head[0]
        if first_attempts >= QUARANTINE_AFTER:
            _quarantine(first_id)
            return 1
        if first_attempts:  # a drain died with it: alone, so a poison row is found
            ids = [first_id]
        else:  # the untried rows up to the first one tried before
            ids = []
            for row_id, attempts in head:
                if attempts:
                    break
                ids.append(row_id)
        InboxEvent.objects.filter(pk__in=ids).update(attempts=F("attempts") + 1)
    with transaction.atomic():
        rows = list(
            InboxEvent.objects.select_for_update()
            .filter(pk__in=ids, status=InboxEvent.Status.PENDING)
            .order_by("id")
        )
        if not rows:
            return len(ids)  # another drainer (or a gate check) took them meanwhile
        _apply_locked(Project.objects.get(pk=project_id), rows)
        return len(rows)


def _apply_locked(
    project: Project,
    rows: list[InboxEvent],
    *,
    known: Agent | None = None,
    own: Any = None,
    savepoint: bool = True,
) -> list[Outcome]:
    """Apply pending inbox ``rows`` (locked ``FOR UPDATE`` by the caller's transaction, in
    ``id`` order) through ``events_apply``, in runs of consecutive rows from one agent's key,
    then ``own`` (the gate's event from ``known``, whose row the caller stored as applied in
    this transaction), and mark each row ``applied`` (body cut to its type) or ``rejected``
    (with ``errors``, its body redacted); returns their outcomes, in order (``own``'s last).
    ``known``: an agent the caller has loaded already. The row locks are what keeps a drain
    and a gate check from applying the same row twice: whoever locks a row first applies it;
    the other finds it applied. ``savepoint``: False in the gate's transaction, which goes
    again whole if applying fails (``event_settle``)."""
    project_id = project.pk
    agents = {known.pk: known} if known else {}
    if missing := {row.agent_id for row in rows} - set(agents):
        agents.update(Agent.objects.in_bulk(missing))
    entries: list[tuple[int, bool, InboxEvent | Any]] = [
        (row.agent_id, row.may_decide, row) for row in rows
    ]
    if own is not None:
        assert known is not None, "the gate's own event comes with its agent"
        entries.append((known.pk, False, own))
    outcomes: list[Outcome] = []
    done, rejected = [], []
    start = 0
    while start < len(entries):  # runs of consecutive rows from one agent's key, in order
        end = start
        while end < len(entries) and entries[end][:2] == entries[start][:2]:
            end += 1
        agent_id, may_decide, _ = entries[start]
        run = [entry for _, _, entry in entries[start:end]]
        for entry, outcome in zip(
            run,
            _apply_rows(project, agents[agent_id], run, may_decide=may_decide, savepoint=savepoint),
            strict=True,
        ):
            outcomes.append(outcome)
            if not isinstance(entry, InboxEvent):  # own: stored as applied
                if outcome.status == "rejected":
                    row = InboxEvent.objects.get(project=project, event_id=entry.event_id)
                    row.body = json.loads(entry.model_dump_json())
                    row.status, row.errors = InboxEvent.Status.REJECTED, outcome.errors
                    rejected.append(row)
            elif outcome.status == "rejected":
                entry.status, entry.errors = InboxEvent.Status.REJECTED, outcome.errors
                rejected.append(entry)
            else:
                done.append(entry.pk)
        start = end
    # applied rows stay (their event ID is what the next insert's ON CONFLICT sees), with
    # the body cut to its type: the applied, redacted copy is the CallEvent
    if done:
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
    return outcomes


def _quarantine(row_id: int) -> None:
    logger.error(
        "inbox row %s quarantined: %d drains died while applying it", row_id, QUARANTINE_AFTER
    )
    QUARANTINED_EVENTS.inc()
    InboxEvent.objects.filter(pk=row_id).update(
        status=InboxEvent.Status.QUARANTINED, errors=[{"loc": "", "msg": QUARANTINED}]
    )


#: What a quarantined inbox row says.
QUARANTINED = (
    f"callgate could not apply this event: {QUARANTINE_AFTER} attempts stopped while applying it "
    "(set aside for the operators; it will not be tried again)"
)

#: What an inbox row that cannot be applied says (a bug, logged with its stack trace).
APPLY_FAILED = "callgate could not apply this event (an internal error, logged for the operators)"


def _apply_rows(
    project: Project,
    agent: Agent,
    entries: list[InboxEvent | Any],
    *,
    may_decide: bool,
    savepoint: bool = True,
) -> list[Outcome]:
    """``events_apply`` over the events of ``entries`` (inbox rows, whose bodies are
    validated here, or events already validated); a row whose body no longer validates, or
    a batch that fails unexpectedly, never blocks the rows behind it (without ``savepoint``
    a failure is raised: the caller's transaction goes again whole)."""
    outcomes: list[Outcome | None] = [None] * len(entries)
    events, positions = [], []
    for position, entry in enumerate(entries):
        if not isinstance(entry, InboxEvent):
            events.append(entry)
            positions.append(position)
            continue
        try:
            events.append(EVENT_ADAPTER.validate_python(entry.body))
            positions.append(position)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            outcomes[position] = Outcome(
                status="rejected", errors=[{"loc": "", "msg": str(exc)[:2000]}]
            )
    try:
        applied = events_apply(
            project=project,
            agent=agent,
            events=events,
            may_decide=may_decide,
            deduplicated=True,
            savepoint=savepoint,
        )
    except Exception:
        if not savepoint:
            raise
        logger.exception(
            "applying %d inbox events of project %s failed; applying them one by one",
            len(events),
            project.pk,
        )
        applied = []
        for event in events:
            try:
                applied.append(
                    events_apply(
                        project=project,
                        agent=agent,
                        events=[event],
                        may_decide=may_decide,
                        deduplicated=True,
                    )[0]
                )
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


def _answer_as_left(event: CallEvent) -> dict:
    """The ``CallAnswer`` as ``event`` left its call: its reason, category, route, verdict,
    observation and the state it moved the call to; attempts, receipt and decision are the
    call's now."""
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
    return answer


def proposal_reused(project: Project, event: Any) -> bool:
    """True when ``event`` (a gate proposal) re-uses the event ID of an applied proposal of
    another tool or other arguments: a different call under an old event ID, which would
    otherwise get the first call's verdict without a word (the gate answers 409)."""
    stored = (
        CallEvent.objects.select_related("call")
        .filter(project=project, event_id=event.event_id, kind=CallEvent.Kind.PROPOSED)
        .first()
    )
    if stored is None:
        return False
    proposal = normalise(event.format, event.call)
    digest = (
        hashlib.sha256(canonical_json(proposal.arguments)).hexdigest()
        if proposal.arguments_ok
        else ""
    )
    call = stored.call
    return (proposal.tool or "")[:TOOL_NAME_LENGTH] != call.tool_name or (
        bool(digest and call.arguments_digest) and digest != call.arguments_digest
    )


def inbox_lag_seconds(project: Project, *, now: datetime | None = None) -> float:
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
    return max(((now or timezone.now()) - oldest).total_seconds(), 0.0)


def event_answer(
    project: Project, event_id: uuid.UUID, *, agent: Agent | None = None
) -> dict | None:
    """Where one received event stands, or ``None`` when this project never received it
    (with ``agent``: when that agent never sent it; another agent's event, its answer and
    receipt included, is no agent's to read):
    ``{"event_id", "status", "errors", "answer"}`` with status ``pending`` (in the inbox),
    ``rejected`` (refused by the rules when applied; ``errors`` say why) or ``applied``
    (``answer``: the ``CallAnswer`` as this event left the call: its reason, category, route,
    verdict, observation and the state it moved the call to; attempts, receipt and decision
    are the call's now; ``GET /api/v1/calls/{operation_id}`` has where the call stands now).
    For a ``turn`` event (kind ``turn``): ``calls``, one such answer per call of the turn, in
    order, and ``answer`` is the first's."""
    for _ in range(2):  # a drain may apply the row between the two look-ups: look again
        found = _event_answer_once(project, event_id, agent)
        if found is not None:
            return found
    return None


def _event_answer_once(project: Project, event_id: uuid.UUID, agent: Agent | None) -> dict | None:
    mine = Q(call__agent=agent) if agent is not None else Q()
    event = (
        CallEvent.objects.select_related("call__contract")
        .filter(mine, project=project, event_id=event_id)
        .first()
    )
    if event is not None:
        turn = _turn_of(event)
        if turn is None:
            return _applied(event_id, [event])
        ids = turn_event_ids(turn["event_id"], int(turn["calls"]))
        parts = {
            part.event_id: part
            for part in CallEvent.objects.select_related("call__contract").filter(
                project=project, event_id__in=ids
            )
        }
        return _applied(event_id, [event] + [parts[i] for i in ids[1:] if i in parts])
    row = (
        InboxEvent.objects.filter(
            Q(agent=agent) if agent is not None else Q(), project=project, event_id=event_id
        )
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


def _turn_of(event: CallEvent) -> dict | None:
    """The ``turn`` note of a call event recorded for one call of a whole turn, else None."""
    turn = event.body.get("turn") if isinstance(event.body, dict) else None
    return turn if isinstance(turn, dict) and event.kind == "proposed" else None


def _applied(event_id: uuid.UUID, recorded: list[CallEvent]) -> dict:
    """``event_answer``'s dict for an applied event stored as ``recorded`` (its call events,
    the first one's ID being the event's; one per call of a turn, in order)."""
    first = recorded[0]
    found: dict[str, Any] = {
        "event_id": str(event_id),
        "status": "applied",
        "kind": first.kind,
        "errors": [],
        "answer": _answer_as_left(first),
        "cause": first.cause or None,
        "failed_items": first.failed_items,
    }
    if _turn_of(first) is not None:
        calls = [_answer_as_left(part) for part in recorded]
        found.update(kind="turn", calls=calls, answer=calls[0])
    return found


def _same_request_locked(project: Project, event: Any, *, own: bool = True) -> list[InboxEvent]:
    """The project's inbox rows of ``event`` itself and the pending ones of its request (by
    ``request_id``, or naming one of the request's calls by operation ID) and of its
    ``operation_id``, in arrival order, locked (``settle_pending``, which skips the event's
    own row unless it is pending). ``own``: whether to look for the event's own row. Raises
    Django's ``OperationalError`` (from psycopg's ``LockNotAvailable``) when another
    transaction holds one of them (PostgreSQL: ``FOR UPDATE NOWAIT``).

    PostgreSQL: one statement through ``ingest.bound_cursor`` (its few texts prepared once per
    connection). The IDs come from one index look-up per branch (the event ID's unique
    index; the partial indexes of pending rows by ``request_key`` and ``operation_key``, the
    request's operation IDs an ``ARRAY(SELECT …)`` evaluated once), then the rows by primary
    key. No branch names the project's pending rows as such, so no plan reads them, whatever
    the planner's statistics say of the backlog. Elsewhere: the request's operation IDs
    first, then one query."""
    operations = [event.operation_id] if event.operation_id else []
    prefix = f"{project.pk}:"  # the keys' form (InboxEvent.request_key, operation_key)
    if connection.vendor == "postgresql":
        table, calls = InboxEvent._meta.db_table, ToolCall._meta.db_table
        pending = f"SELECT id FROM {table} WHERE status = 'pending' AND "
        branches, params = [], []
        if own:
            branches.append(f"SELECT id FROM {table} WHERE project_id = %s AND event_id = %s")
            params += [project.pk, event.event_id]
        keys = [prefix + operation for operation in operations]
        if event.request_id:
            branches.append(pending + "request_key = %s")
            params.append(prefix + event.request_id)
            branches.append(
                pending + f"operation_key = ANY(ARRAY(SELECT %s || operation_id FROM {calls} "
                "WHERE project_id = %s AND request_id = %s) || %s::text[])"
            )
            params += [prefix, project.pk, event.request_id, keys]
        elif keys:
            branches.append(pending + "operation_key = ANY(%s::text[])")
            params.append(keys)
        if not branches:
            return []
        # an array evaluated once, then rows by primary key: no join, and no condition on
        # the status here (a partial index's full scan would serve it)
        columns = ", ".join(f'"{f.column}"' for f in InboxEvent._meta.concrete_fields)
        with bound_cursor() as cursor:
            cursor.execute(
                f"SELECT {columns} FROM {table} WHERE id = ANY(ARRAY({' UNION ALL '.join(branches)})) "
                "ORDER BY id FOR UPDATE NOWAIT",
                params,
            )
            return models_from_rows(InboxEvent, cursor.fetchall())
    # by the generated keys, not the body's JSON: SQLite's JSON1 reads an ``__in`` list of a
    # key's text as JSON ("malformed JSON")
    same = Q(event_id=event.event_id) if own else Q(pk__in=[])
    if event.request_id:
        same |= Q(request_key=prefix + event.request_id)
        operations += ToolCall.objects.filter(
            project=project, request_id=event.request_id
        ).values_list("operation_id", flat=True)
    if operations:
        same |= Q(operation_key__in=sorted({prefix + operation for operation in operations}))
    return list(
        InboxEvent.objects.filter(same, project=project, status=InboxEvent.Status.PENDING)
        .order_by("id")
        .select_for_update()
    )


class EventRefused(Exception):
    """``event_settle`` could not apply the event. ``kind``: ``invalid`` (refused at the door,
    the request's fault), ``reused`` (its ``event_id`` was used for another kind of event, or
    for a proposal of another tool or other arguments), ``busy`` (another drain held the
    project's inbox past ``DRAIN_LOCK_WAIT``: send it again, same ``event_id``), ``refused``
    (the rules refused it when it was applied) or ``internal`` (callgate's bug).
    ``errors`` are ``[{"loc", "msg"}]``."""

    def __init__(self, kind: str, errors: list[dict]):
        self.kind, self.errors = kind, errors
        super().__init__(errors[0]["msg"] if errors else kind)


def event_settle(*, project: Project, agent: Agent, event: Any) -> dict:
    """Receive one event and apply it at once, in one transaction (one commit): stored in
    the inbox as applied (the path of ``POST /api/v1/events``, its unique index deciding
    what was seen before), applied after the earlier events of its request
    (``settle_pending``) and answered from what was recorded. Returns ``event_answer``'s dict
    for it (status ``applied``: ``answer``, and ``calls`` for a turn); a re-sent event (same
    ``event_id``) finds its first answer. Raises ``EventRefused``: ``busy`` (nothing stored)
    when a drain held its request's earlier rows for ``DRAIN_LOCK_WAIT`` seconds,
    ``internal`` (nothing stored, logged) when applying it failed. The gate
    (``POST /api/v1/calls``) and the MCP gateway's attempts use it.

    Ordering (README, "What the gate guarantees"): before the event is applied, the project's
    pending events of the same request (its ``request_id``, or naming one of its calls by
    operation ID) or the same operation (``operation_id``) received before it are applied, in
    arrival order; events of other requests stay for the drain, so a backlog elsewhere in the
    project never delays the answer. A drain applying one of those rows, or a concurrent
    request creating the same call first, makes the whole transaction go again (after a
    full-jitter pause for the drain, until ``DRAIN_LOCK_WAIT`` has passed)."""
    deadline, pause, raced = time.monotonic() + DRAIN_LOCK_WAIT, 0.01, False
    while True:
        try:
            found = _settle_once(project=project, agent=agent, event=event)
            break
        except DrainBusy:  # rolled back: nothing of this event was stored
            left = deadline - time.monotonic()
            if left <= 0:
                raise EventRefused(
                    "busy",
                    [{"loc": "event_id", "msg": "its request's earlier events are being applied"}],
                ) from None
            time.sleep(min(left, random.uniform(pause / 2, pause)))  # the last try at the deadline
            pause = min(pause * 2, 0.2)
        except IntegrityError:  # another request created the same call first: it is found now
            if raced:
                raise
            raced = True
        except EventRefused:
            raise
        except Exception:
            logger.exception("event %s of project %s cannot be applied", event.event_id, project.pk)
            raise EventRefused("internal", [{"loc": "", "msg": APPLY_FAILED}]) from None
    if found["kind"] != event.type:
        raise EventRefused("reused", [{"loc": "event_id", "msg": "already used"}])
    if found["status"] == "pending":
        raise EventRefused("busy", [{"loc": "event_id", "msg": "still waiting in the inbox"}])
    if found["status"] != "applied":
        failed = any(e["msg"] == APPLY_FAILED for e in found["errors"])
        raise EventRefused("internal" if failed else "refused", found["errors"])
    return found


def _settle_once(*, project: Project, agent: Agent, event: Any) -> dict:
    lock = (
        nullcontext()
        if connection.vendor == "postgresql"
        else _drain_lock(project.pk, wait=DRAIN_LOCK_WAIT)  # SQLite: the project's process lock
    )
    with lock, transaction.atomic():
        [received] = events_receive(project=project, agent=agent, events=[event], applied=True)
        if received.status == "rejected":
            raise EventRefused("invalid", received.errors)
        if received.status == "conflict":
            if event.type not in ("proposed", "turn"):
                raise EventRefused("reused", received.errors)
            # the gate fills in occurred_at when the agent sent none, so a re-sent check
            # differs in it: a check is the same when it names the same tool and arguments
            received = DUPLICATE
        if received.status == "accepted":  # stored as applied: applied now
            outcome = settle_pending(project, event, agent=agent, stored=True)
            assert outcome is not None
            if outcome.status == "rejected":  # its row says so now; answered below
                return {"kind": event.type, "status": "rejected", "errors": outcome.errors}
            return _applied(event.event_id, list(outcome.recorded))
        if event.type == "proposed" and proposal_reused(project, event):
            raise EventRefused(
                "reused",
                [{"loc": "event_id", "msg": "already used for another tool or other arguments"}],
            )
        # sent before: its row may still be pending (POST /events), else its first answer
        outcome = settle_pending(project, event, agent=agent)
        if outcome is not None and outcome.recorded:
            return _applied(event.event_id, list(outcome.recorded))
        found = event_answer(project, event.event_id, agent=agent)
    if found is None:
        raise EventRefused("reused", [{"loc": "event_id", "msg": "already used"}])
    return found


def settle_pending(
    project: Project, event: Any, *, agent: Agent, stored: bool = False
) -> Outcome | None:
    """In the caller's transaction: apply the project's pending rows of ``event``'s request
    (by ``request_id``, or naming one of its calls by operation ID) or operation received
    before it (``event_settle``'s ordering), then ``event`` itself: from memory when
    ``stored`` (the caller stored its row as applied), else its row if still pending.
    Returns the event's ``Outcome``, or None when its row was not pending (applied already,
    by a drain). ``agent``: the agent that sent it.

    The rows are locked ``FOR UPDATE NOWAIT`` (PostgreSQL): a drain holding one of them
    raises ``DrainBusy`` at once, and the caller's transaction, spoiled, is to be rolled back
    and tried again; a drain and a gate check never apply a row twice, nor wait on each
    other. Found through two partial indexes on pending rows (``inboxevent_pending_request``
    / ``_operation``): the cost does not grow with the project's backlog."""
    try:
        rows = _same_request_locked(project, event, own=not stored)
    except OperationalError as exc:
        if isinstance(exc.__cause__, psycopg.errors.LockNotAvailable):
            raise DrainBusy(project.pk) from exc
        raise
    rows = [row for row in rows if row.status == InboxEvent.Status.PENDING]
    if stored:
        return _apply_locked(project, rows, known=agent, own=event, savepoint=False)[-1]
    own = [i for i, row in enumerate(rows) if str(row.event_id) == str(event.event_id)]
    if not own:
        return None  # applied already (by a drain) or never stored
    return _apply_locked(project, rows[: own[0] + 1], known=agent, savepoint=False)[-1]
