"""Ingest benchmark (PostgreSQL): events per second through ``POST /api/v1/events``.

Usage:  DATABASE_URL=postgres://postgres@127.0.0.1:5432/callgate_bench python bench/ingest.py [--events 20000]

Measures, in one run against the same database:
  1. events/s through the real API view (in-process WSGI: URL routing, key auth, pydantic
     validation, the inbox insert with duplicate detection, the drain task enqueued) in
     batches of 500 realistic mixed events (proposals in several provider formats,
     successes, empty results, errors, timeouts, argument errors, hallucinated tools);
  2. events/s applying that inbox (``inbox_drain``: classification, lifecycle, bulk writes),
     what a Celery worker does after the requests; checked to leave every event applied;
  3. a raw psycopg ``COPY`` of the same number of rows into a scratch table;
  4. the gate check (``POST /api/v1/calls``) median and p99 latency.
Prints the figures and the ratio ingest/COPY. Target: ratio >= 0.25. Celery uses the
in-memory broker here, so the drain tasks the requests enqueue wait unconsumed and step 2
times the apply on its own.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "callgate.settings")
os.environ.setdefault("DEBUG", "true")
os.environ["CELERY_BROKER_URL"] = "memory://"  # enqueue, don't apply in the request (step 2 times that)
os.environ["CELERY_RESULT_BACKEND"] = "cache+memory://"

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402

import callgate.wsgi  # noqa: E402,F401  (the server's start-up, including its gc.freeze())
from callgate.auth import api_key_issue  # noqa: E402
from callgate.ingest import inbox_drain  # noqa: E402
from callgate.models import Agent, CallEvent, InboxEvent, Project, ToolCall  # noqa: E402

BATCH = 500
TOOLS = {
    "get_weather": {
        "description": "Weather for a city on a date", "effect": "read",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "description": "City name"},
            "date": {"type": "string", "format": "date", "description": "ISO date"}}, "required": ["city"]},
    },
    "create_follow_up": {
        "description": "Create a follow-up task on a support ticket", "effect": "write", "idempotent": True,
        "reconcilable": True,
        "parameters": {"type": "object", "properties": {
            "ticket_id": {"type": "string", "pattern": "^T-[0-9]+$", "description": "Ticket id"},
            "assignee_id": {"type": "string", "description": "Assignee"},
            "due_at": {"type": "string", "format": "date-time", "description": "Due time"}},
            "required": ["ticket_id", "assignee_id", "due_at"]},
    },
}


def now() -> str:
    return datetime.now(timezone.utc).isoformat()


def envelope(type_: str, **fields) -> dict:
    return {"event_id": str(uuid.uuid4()), "occurred_at": now(), "type": type_, **fields}


def call_events(i: int, rng: random.Random) -> list[dict]:
    """One call's events: a proposal in some provider format, then (usually) an attempt."""
    request_id, call_id = f"bench-{uuid.uuid4().hex[:12]}", f"c{i}"
    kind = rng.random()
    if kind < 0.55:
        args = {"city": rng.choice(["Oslo", "Paris", "Lima", "Pune"]), "date": "2026-06-15"}
        call = {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(args)}}
        events = [envelope("proposed", format="openai", call=call, request_id=request_id, call_id=call_id)]
        outcome = rng.random()
        if outcome < 0.7:
            events.append(envelope("attempt", request_id=request_id, call_id=call_id, sent=True, outcome="success",
                                   result={"temperature": rng.randint(-10, 30)}))
        elif outcome < 0.8:
            events.append(envelope("attempt", request_id=request_id, call_id=call_id, sent=True, outcome="success",
                                   result=[]))
        else:
            events.append(envelope("attempt", request_id=request_id, call_id=call_id, sent=True, outcome="error",
                                   http_status=503, error="Service Unavailable"))
        return events
    if kind < 0.8:
        args = {"ticket_id": f"T-{i}", "assignee_id": "agent-7", "due_at": "2026-12-01T09:00:00Z"}
        call = {"type": "tool_use", "id": call_id, "name": "create_follow_up", "input": args}
        events = [envelope("proposed", format="anthropic", call=call, request_id=request_id, call_id=call_id)]
        if rng.random() < 0.85:
            events.append(envelope("attempt", request_id=request_id, call_id=call_id, sent=True, outcome="success",
                                   result={"follow_up_id": f"F-{i}"}))
        else:
            events.append(envelope("attempt", request_id=request_id, call_id=call_id, sent=True, outcome="timeout",
                                   error="ReadTimeout"))
        return events
    if kind < 0.9:  # argument error
        call = {"functionCall": {"name": "get_weather", "args": {"city": 42, "date": "tomorrow"}}}
        return [envelope("proposed", format="gemini", call=call, request_id=request_id)]
    call = {"tool": "send_email", "arguments": {"to": "x@example.com"}}  # hallucinated tool
    return [envelope("proposed", format="plain", call=call, request_id=request_id)]


def batches(total: int, rng: random.Random) -> list[list[dict]]:
    events: list[dict] = []
    i = 0
    while len(events) < total:
        events.extend(call_events(i, rng))
        i += 1
    events = events[:total]
    return [events[k:k + BATCH] for k in range(0, len(events), BATCH)]


def raw_copy_rate(rows: list[dict], *, logged: bool) -> float:
    """Rows/s for a raw psycopg COPY of the same events into a scratch table: ``logged`` (WAL,
    the durability the inbox gives an accepted event) or ``UNLOGGED`` (no WAL: a crash loses it)."""
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_scratch")
        cursor.execute(f"CREATE {'' if logged else 'UNLOGGED '}TABLE bench_scratch "
                       "(event_id uuid, kind text, occurred_at timestamptz, body jsonb)")
    raw = connection.connection  # psycopg 3 connection
    started = time.perf_counter()
    with raw.cursor() as cursor:
        with cursor.copy("COPY bench_scratch (event_id, kind, occurred_at, body) FROM STDIN") as copy:
            for row in rows:
                copy.write_row((row["event_id"], row["type"], row["occurred_at"], json.dumps(row)))
    raw.commit()
    elapsed = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE bench_scratch")
    return len(rows) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--gate-checks", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=7)
    options = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("bench/ingest.py needs PostgreSQL: set DATABASE_URL=postgres://…")
    settings.ALLOWED_HOSTS = ["*"]
    call_command("migrate", verbosity=0)
    project = Project.objects.create(slug=f"bench-{uuid.uuid4().hex[:8]}", name="bench")
    agent = Agent.objects.create(project=project, name="bench-agent")
    key = api_key_issue(agent=agent).plain
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    for name, body in TOOLS.items():
        assert client.put(f"/api/v1/tools/{name}", json.dumps(body), content_type="application/json").status_code == 201

    rng = random.Random(options.seed)
    work = batches(options.events, rng)
    # warm-up (imports, caches)
    client.post("/api/v1/events", json.dumps(batches(BATCH, random.Random(1))[0]), content_type="application/json")
    inbox_drain(project.pk)
    warm_events = CallEvent.objects.filter(project=project).count()
    bodies = [json.dumps(b) for b in work]
    started = time.perf_counter()
    for body in bodies:
        response = client.post("/api/v1/events", body, content_type="application/json")
        assert response.status_code in (200, 207), response.content[:300]
    ingest_elapsed = time.perf_counter() - started
    ingest_rate = options.events / ingest_elapsed

    started = time.perf_counter()
    processed = inbox_drain(project.pk)
    apply_rate = processed / (time.perf_counter() - started)
    applied = CallEvent.objects.filter(project=project).count() - warm_events
    refused = InboxEvent.objects.filter(project=project, status=InboxEvent.Status.REJECTED).count()
    assert processed == options.events and applied + refused == options.events, (processed, applied, refused)

    rows = [e for b in work for e in b]
    copy_rate = raw_copy_rate(rows, logged=True)
    unlogged_rate = raw_copy_rate(rows, logged=False)

    latencies = []
    for i in range(options.gate_checks):
        body = json.dumps({"format": "plain", "request_id": f"gate-{i}",
                           "call": {"tool": "get_weather", "arguments": {"city": "Oslo", "date": "2026-06-15"}}})
        t0 = time.perf_counter()
        response = client.post("/api/v1/calls", body, content_type="application/json")
        latencies.append((time.perf_counter() - t0) * 1000)
        assert response.status_code == 200
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[int(len(latencies) * 0.99) - 1]

    print(f"events:            {options.events:,} in batches of {BATCH}")
    print(f"ingest (API):      {ingest_rate:,.0f} events/s (stored in the inbox, answered per item)")
    print(f"apply (drain):     {apply_rate:,.0f} events/s ({applied:,} applied, {refused:,} refused by the rules)")
    print(f"raw COPY:          {copy_rate:,.0f} rows/s into a logged table (the inbox's durability)")
    print(f"ratio ingest/COPY: {ingest_rate / copy_rate:.3f}  (target >= 0.25)")
    print(f"raw COPY UNLOGGED: {unlogged_rate:,.0f} rows/s (no WAL; for reference: "
          f"ratio {ingest_rate / unlogged_rate:.3f})")
    print(f"gate check:        median {p50:.2f} ms, p99 {p99:.2f} ms over {options.gate_checks:,} checks")
    ToolCall.objects.filter(project=project).delete()
    Project.objects.filter(pk=project.pk).delete()


if __name__ == "__main__":
    main()
