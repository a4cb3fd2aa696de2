"""Ingest benchmark (PostgreSQL): events per second through ``POST /api/v1/events``.

Usage:  DATABASE_URL=postgres://postgres@127.0.0.1:5432/callgate_bench python bench/ingest.py [--clients 1,3]

Measures, in one run against the same database, each figure the median of ``--rounds``
interleaved rounds:
  1. events/s through the WSGI application, called as gunicorn calls it (middleware, URL
     routing, key auth, pydantic validation, the inbox insert with duplicate detection, the
     drain task enqueued, the JSON answer), in batches of up to 500 realistic mixed events
     (proposals in several provider formats, successes, empty results, errors, timeouts,
     argument errors, hallucinated tools), from 1 and from 3 concurrent clients (forked
     processes, like gunicorn's workers; docker-compose runs 3);
  2. a raw psycopg ``COPY`` of the same rows into a scratch table, from as many streams;
  3. events/s applying the inbox (``inbox_drain``: classification, lifecycle, bulk writes),
     for the mixed batches and in the SDK's flow (proposals create calls, later attempts
     update them: ``--sdk-calls``, ``--only-sdk-flow`` for that line alone),
     what a Celery worker does after the requests; checked to leave every event applied;
  4. the gate check (``POST /api/v1/calls``) median and p99 latency;
  5. spans/s through the OTLP receiver (``POST /api/otlp/v1/traces``, protobuf in requests of
     512 spans, as the SDKs' batch processor sends them): agent turns made by the real
     ``opentelemetry-sdk`` (a ``chat`` span proposing two tool calls, two ``execute_tool``
     spans, one failing), against the same events (what the receiver maps them to) through
     ``POST /api/v1/events`` in the same run.
Prints ingest/COPY per client count and best against best. Target: ratio >= 0.25.
Celery uses the in-memory broker here, so the drain tasks the requests enqueue wait
unconsumed and step 3 times the apply on its own.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import secrets
import statistics
import sys
import time
import uuid
import warnings
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "callgate.settings")
# as in production: DEBUG off (with it on, Django logs every query and formats its parameters)
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
os.environ["CELERY_BROKER_URL"] = (
    "memory://"  # enqueue, don't apply in the request (step 2 times that)
)
os.environ["CELERY_RESULT_BACKEND"] = "cache+memory://"

import django  # noqa: E402

# whitenoise looks for collected static files, which an API benchmark never serves
warnings.filterwarnings("ignore", message="No directory at", module="django.core.handlers.base")

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402

from bench.support import call  # noqa: E402
from callgate.auth import api_key_issue  # noqa: E402
from callgate.inbox import events_receive, inbox_drain  # noqa: E402
from callgate.models import Agent, CallEvent, InboxEvent, Project, ToolCall  # noqa: E402
from callgate.schemas import EVENT_ADAPTER  # noqa: E402

BATCH = 500
TOOLS = {
    "get_weather": {
        "description": "Weather for a city on a date",
        "effect": "read",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "description": "City name"},
                "date": {"type": "string", "format": "date", "description": "ISO date"},
            },
            "required": ["city"],
        },
    },
    "create_follow_up": {
        "description": "Create a follow-up task on a support ticket",
        "effect": "write",
        "idempotent": True,
        "reconcilable": True,
        "parameters": {
            "type": "object",
            "properties": {
                "ticket_id": {
                    "type": "string",
                    "pattern": "^T-[0-9]+$",
                    "description": "Ticket id",
                },
                "assignee_id": {"type": "string", "description": "Assignee"},
                "due_at": {"type": "string", "format": "date-time", "description": "Due time"},
            },
            "required": ["ticket_id", "assignee_id", "due_at"],
        },
    },
}


def now() -> str:
    return datetime.now(UTC).isoformat()


def envelope(type_: str, **fields) -> dict:
    return {"event_id": str(uuid.uuid4()), "occurred_at": now(), "type": type_, **fields}


def call_events(i: int, rng: random.Random) -> list[dict]:
    """One call's events: a proposal in some provider format, then (usually) an attempt."""
    request_id, call_id = f"bench-{uuid.uuid4().hex[:12]}", f"c{i}"
    kind = rng.random()
    if kind < 0.55:
        args = {"city": rng.choice(["Oslo", "Paris", "Lima", "Pune"]), "date": "2026-06-15"}
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps(args)},
        }
        events = [
            envelope("proposed", format="openai", call=call, request_id=request_id, call_id=call_id)
        ]
        outcome = rng.random()
        if outcome < 0.7:
            events.append(
                envelope(
                    "attempt",
                    request_id=request_id,
                    call_id=call_id,
                    sent=True,
                    outcome="success",
                    result={"temperature": rng.randint(-10, 30)},
                )
            )
        elif outcome < 0.8:
            events.append(
                envelope(
                    "attempt",
                    request_id=request_id,
                    call_id=call_id,
                    sent=True,
                    outcome="success",
                    result=[],
                )
            )
        else:
            events.append(
                envelope(
                    "attempt",
                    request_id=request_id,
                    call_id=call_id,
                    sent=True,
                    outcome="error",
                    http_status=503,
                    error="Service Unavailable",
                )
            )
        return events
    if kind < 0.8:
        args = {"ticket_id": f"T-{i}", "assignee_id": "agent-7", "due_at": "2026-12-01T09:00:00Z"}
        call = {"type": "tool_use", "id": call_id, "name": "create_follow_up", "input": args}
        events = [
            envelope(
                "proposed", format="anthropic", call=call, request_id=request_id, call_id=call_id
            )
        ]
        if rng.random() < 0.85:
            events.append(
                envelope(
                    "attempt",
                    request_id=request_id,
                    call_id=call_id,
                    sent=True,
                    outcome="success",
                    result={"follow_up_id": f"F-{i}"},
                )
            )
        else:
            events.append(
                envelope(
                    "attempt",
                    request_id=request_id,
                    call_id=call_id,
                    sent=True,
                    outcome="timeout",
                    error="ReadTimeout",
                )
            )
        return events
    if kind < 0.9:  # argument error
        call = {"functionCall": {"name": "get_weather", "args": {"city": 42, "date": "tomorrow"}}}
        return [envelope("proposed", format="gemini", call=call, request_id=request_id)]
    call = {"tool": "send_email", "arguments": {"to": "x@example.com"}}  # hallucinated tool
    return [envelope("proposed", format="plain", call=call, request_id=request_id)]


def sdk_flow_rates(project: Project, agent: Agent, calls: int) -> tuple[float, float]:
    """Apply rates (events/s, ``inbox_drain`` in one process) in the SDK's flow: first
    ``calls`` proposals, each creating its call (what the gate applies), then one successful
    attempt per call naming it by operation ID (reported later, so it updates a call that
    exists). Returns (proposals/s, attempts/s)."""
    tag = uuid.uuid4().hex[:8]
    proposals = [
        envelope(
            "proposed",
            format="plain",
            request_id=f"sdk-{tag}-{i}",
            call={"tool": "get_weather", "arguments": {"city": f"City {i}", "date": "2026-06-15"}},
        )
        for i in range(calls)
    ]

    def timed_apply(events: list[dict]) -> float:
        for start in range(0, len(events), BATCH):
            events_receive(
                project=project,
                agent=agent,
                events=[EVENT_ADAPTER.validate_python(e) for e in events[start : start + BATCH]],
            )
        started = time.perf_counter()
        processed = inbox_drain(project.pk)
        elapsed = time.perf_counter() - started
        assert processed == len(events), (processed, len(events))
        return len(events) / elapsed

    created = timed_apply(proposals)
    operations = dict(
        ToolCall.objects.filter(project=project, request_id__startswith=f"sdk-{tag}-").values_list(
            "request_id", "operation_id"
        )
    )
    attempts = [
        envelope(
            "attempt",
            operation_id=operations[f"sdk-{tag}-{i}"],
            sent=True,
            outcome="success",
            result={"temperature": i % 30},
        )
        for i in range(calls)
    ]
    updated = timed_apply(attempts)
    assert (
        not ToolCall.objects.filter(project=project, request_id__startswith=f"sdk-{tag}-")
        .exclude(reason="ok")
        .exists()
    )
    return created, updated


def batches(total: int, rng: random.Random) -> list[list[dict]]:
    """About ``total`` events in batches of at most ``BATCH``; a call's events share a batch,
    so concurrent clients never send an attempt before its proposal."""
    out: list[list[dict]] = [[]]
    count = i = 0
    while count < total:
        events = call_events(i, rng)
        if len(out[-1]) + len(events) > BATCH:
            out.append([])
        out[-1].extend(events)
        count += len(events)
        i += 1
    return out


def in_parallel(clients: int, work: list, task) -> float:
    """Run ``task(share)`` in ``clients`` processes (forked, each with its own database
    connection, as gunicorn runs its workers), ``work`` dealt out round-robin; returns the wall
    time in seconds from the moment all are connected and ready. One client runs in-process."""
    if clients == 1:
        connection.ensure_connection()
        started = time.perf_counter()
        task(work)
        return time.perf_counter() - started
    context = multiprocessing.get_context("fork")
    ready = context.Barrier(clients + 1)

    def run(share: list) -> None:
        connection.ensure_connection()
        ready.wait()
        task(share)
        connections.close_all()

    connections.close_all()  # a forked child must not share the parent's connection
    processes = [context.Process(target=run, args=(work[k::clients],)) for k in range(clients)]
    for process in processes:
        process.start()
    ready.wait()
    started = time.perf_counter()
    for process in processes:
        process.join()
    elapsed = time.perf_counter() - started
    failed = [process.exitcode for process in processes if process.exitcode]
    if failed:
        sys.exit(f"a client process failed (exit codes {failed})")
    return elapsed


def raw_copy_rate(rows: list[dict], *, clients: int) -> float:
    """Rows/s for a raw psycopg COPY of the same events into a scratch table (logged: the
    durability the inbox gives an accepted event), in ``clients`` concurrent streams."""
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_scratch")
        cursor.execute(
            "CREATE TABLE bench_scratch (event_id uuid, kind text, occurred_at timestamptz, body jsonb)"
        )
    connection.close()

    def copy(share: list[dict]) -> None:
        connection.ensure_connection()
        raw = connection.connection  # psycopg 3 connection
        with raw.cursor() as cursor:
            with cursor.copy(
                "COPY bench_scratch (event_id, kind, occurred_at, body) FROM STDIN"
            ) as stream:
                for row in share:
                    stream.write_row(
                        (row["event_id"], row["type"], row["occurred_at"], json.dumps(row))
                    )
        raw.commit()

    elapsed = in_parallel(clients, rows, copy)
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE bench_scratch")
    return len(rows) / elapsed


#: Spans per OTLP export request: the batch span processor's default max_export_batch_size.
OTLP_BATCH = 512


def otlp_requests(turns: int, seed: int) -> list[bytes]:
    """``turns`` agent turns as OTLP protobuf requests of ``OTLP_BATCH`` spans, recorded by
    the real SDK and encoded by the exporter's encoder: per turn an ``invoke_agent`` span
    holding a ``chat`` span that proposes ``get_weather`` and ``create_follow_up`` and their
    two ``execute_tool`` spans (the write fails with ``error.type`` 429 one turn in four).
    Four spans a turn, so requests of 512 never split a trace."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Status, StatusCode

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("bench")
    rng = random.Random(seed)
    for turn in range(turns):
        calls = [
            ("get_weather", {"city": rng.choice(["Oslo", "Lima", "Pune"]), "date": "2026-06-15"}),
            (
                "create_follow_up",
                {"ticket_id": f"T-{turn}", "assignee_id": "u7", "due_at": "2026-06-16T09:00:00Z"},
            ),
        ]
        with tracer.start_as_current_span("invoke_agent bench"):
            with tracer.start_as_current_span("chat gpt-4o") as span:
                span.set_attribute("gen_ai.operation.name", "chat")
                parts = [
                    {"type": "tool_call", "id": f"call_{turn}_{k}", "name": name, "arguments": args}
                    for k, (name, args) in enumerate(calls)
                ]
                span.set_attribute(
                    "gen_ai.output.messages", json.dumps([{"role": "assistant", "parts": parts}])
                )
            for k, (name, args) in enumerate(calls):
                with tracer.start_as_current_span(f"execute_tool {name}") as span:
                    span.set_attribute("gen_ai.operation.name", "execute_tool")
                    span.set_attribute("gen_ai.tool.name", name)
                    span.set_attribute("gen_ai.tool.call.id", f"call_{turn}_{k}")
                    span.set_attribute("gen_ai.tool.call.arguments", json.dumps(args))
                    if k == 1 and turn % 4 == 0:
                        span.set_attribute("error.type", "429")
                        span.set_status(Status(StatusCode.ERROR, "Too Many Requests"))
                    else:
                        span.set_attribute("gen_ai.tool.call.result", json.dumps({"ok": True}))
    spans = list(memory.get_finished_spans())
    provider.shutdown()
    return [
        encode_spans(spans[start : start + OTLP_BATCH]).SerializeToString()
        for start in range(0, len(spans), OTLP_BATCH)
    ]


def otlp_rates(
    project: Project, key: str, *, turns: int, seed: int
) -> tuple[int, int, float, float]:
    """(spans, events, seconds through the OTLP receiver, seconds for the same events through
    ``POST /api/v1/events``), one client; each followed by a drain (not timed) that must
    leave every event applied. The /events run gets fresh event IDs and request IDs."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    from callgate.otlp import spans_to_events

    requests = otlp_requests(turns, seed)
    bodies, spans, events = [], 0, 0
    for raw in requests:  # the events the receiver makes of each request, as /events bodies
        mapped = spans_to_events(ExportTraceServiceRequest.FromString(raw))
        spans += mapped.spans
        batch = []
        for _, event in mapped.events:
            body = json.loads(event.model_dump_json())
            body["event_id"] = str(uuid.uuid4())
            body["request_id"] = "events-" + body["request_id"]
            batch.append(body)
        events += len(batch)
        bodies.append(json.dumps(batch).encode())

    def timed(path: str, payloads: list[bytes], content_type: str) -> float:
        before = CallEvent.objects.filter(project=project).count()
        started = time.perf_counter()
        for payload in payloads:
            code, content = call("POST", path, payload, key, content_type)
            assert code == 200, content[:300]
        elapsed = time.perf_counter() - started
        inbox_drain(project.pk)
        applied = CallEvent.objects.filter(project=project).count() - before
        assert applied == 2 * turns * 2, (path, applied)  # two calls' proposals and attempts
        return elapsed

    otlp_seconds = timed("/api/otlp/v1/traces", requests, "application/x-protobuf")
    events_seconds = timed("/api/v1/events", bodies, "application/json")
    return spans, events, otlp_seconds, events_seconds


def sdk_flow(project: Project, agent: Agent, calls: int) -> None:
    created, updated = sdk_flow_rates(project, agent, calls)
    print(
        f"apply, SDK flow:   {created:,.0f} events/s creating calls (proposals), "
        f"{updated:,.0f} events/s updating them (attempts by operation ID); {calls:,} calls"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=10_000, help="events per round")
    parser.add_argument(
        "--clients",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 3],
        help="concurrent clients to measure, e.g. 1,3 (processes, like gunicorn's workers; "
        "docker-compose runs 3), for ingest and COPY alike",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="ingest and COPY measured this many times, interleaved",
    )
    parser.add_argument("--gate-checks", type=int, default=1_000)
    parser.add_argument(
        "--sdk-calls", type=int, default=5_000, help="calls for the SDK-flow apply line"
    )
    parser.add_argument(
        "--only-sdk-flow", action="store_true", help="print the SDK-flow apply line alone"
    )
    parser.add_argument(
        "--otlp-turns", type=int, default=1_000, help="agent turns (4 spans each) for the OTLP line"
    )
    parser.add_argument("--seed", type=int, default=7)
    options = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("bench/ingest.py needs PostgreSQL: set DATABASE_URL=postgres://…")
    settings.ALLOWED_HOSTS = ["*"]
    call_command("migrate", verbosity=0)
    project = Project.objects.create(slug=f"bench-{uuid.uuid4().hex[:8]}", name="bench")
    agent = Agent.objects.create(project=project, name="bench-agent")
    key = api_key_issue(agent=agent).plain
    for name, body in TOOLS.items():
        code, content = call("PUT", f"/api/v1/tools/{name}", json.dumps(body).encode(), key)
        assert code == 201, content[:300]

    if options.only_sdk_flow:
        sdk_flow(project, agent, options.sdk_calls)
        return

    rng = random.Random(options.seed)
    # warm-up (imports, caches, query plans)
    for warm in batches(2 * BATCH, random.Random(1)):
        call("POST", "/api/v1/events", json.dumps(warm).encode(), key)
    inbox_drain(project.pk)
    connection.close()

    def ingest(bodies: list[bytes]) -> None:
        for body in bodies:
            code, content = call("POST", "/api/v1/events", body, key)
            assert code in (200, 207), content[:300]

    ingest_rates: dict[int, list[float]] = {n: [] for n in options.clients}
    copy_rates: dict[int, list[float]] = {n: [] for n in options.clients}
    apply_rates: list[float] = []
    for _ in range(options.rounds):  # interleaved, so a busy moment on the machine hits both
        for clients in options.clients:
            work = batches(options.events, rng)
            total = sum(len(b) for b in work)
            before = CallEvent.objects.filter(project=project).count()
            connection.close()
            elapsed = in_parallel(clients, [json.dumps(b).encode() for b in work], ingest)
            ingest_rates[clients].append(total / elapsed)

            started = time.perf_counter()
            processed = inbox_drain(project.pk)
            apply_rates.append(processed / (time.perf_counter() - started))
            applied = CallEvent.objects.filter(project=project).count() - before
            refused = InboxEvent.objects.filter(
                project=project, status=InboxEvent.Status.REJECTED
            ).count()
            assert processed == total and applied == total and not refused, (
                total,
                processed,
                applied,
                refused,
            )

            copy_rates[clients].append(raw_copy_rate([e for b in work for e in b], clients=clients))

    latencies = []
    for i in range(options.gate_checks):
        body = json.dumps(
            {
                "format": "plain",
                "request_id": f"gate-{i}",
                "call": {
                    "tool": "get_weather",
                    "arguments": {"city": "Oslo", "date": "2026-06-15"},
                },
            }
        )
        t0 = time.perf_counter()
        code, content = call("POST", "/api/v1/calls", body.encode(), key)
        latencies.append((time.perf_counter() - t0) * 1000)
        assert code == 200, content[:300]
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[int(len(latencies) * 0.99) - 1]

    def each(rates: list[float]) -> str:
        return ", ".join(f"{rate:,.0f}" for rate in rates)

    print(
        f"events:  {total:,} per round in batches of up to {BATCH}, {options.rounds} rounds "
        f"(medians; each round in brackets). Target: ingest/COPY >= 0.25"
    )
    best_ingest = best_copy = 0.0
    for clients in options.clients:
        ingest_rate, copy_rate = (
            statistics.median(ingest_rates[clients]),
            statistics.median(copy_rates[clients]),
        )
        best_ingest, best_copy = max(best_ingest, ingest_rate), max(best_copy, copy_rate)
        print(
            f"{clients} client{'s' if clients > 1 else ' '}: ingest (API) {ingest_rate:,.0f} events/s "
            f"[{each(ingest_rates[clients])}]; raw COPY {copy_rate:,.0f} rows/s [{each(copy_rates[clients])}]; "
            f"ratio {ingest_rate / copy_rate:.3f}"
        )
    print(
        f"best against best: ingest {best_ingest:,.0f} events/s / COPY {best_copy:,.0f} rows/s = "
        f"{best_ingest / best_copy:.3f}"
    )
    print(
        f"apply (drain):     {statistics.median(apply_rates):,.0f} events/s [{each(apply_rates)}] "
        f"(classified, recorded on their calls; one process)"
    )
    sdk_flow(project, agent, options.sdk_calls)
    print(
        f"gate check:        median {p50:.2f} ms, p99 {p99:.2f} ms over {options.gate_checks:,} checks"
    )
    spans, events, otlp_seconds, events_seconds = otlp_rates(
        project, key, turns=options.otlp_turns, seed=options.seed
    )
    print(
        f"OTLP receiver:     {spans / otlp_seconds:,.0f} spans/s ({events / otlp_seconds:,.0f} events/s) "
        f"through /api/otlp/v1/traces; the same {events:,} events through /api/v1/events "
        f"{events / events_seconds:,.0f} events/s; OTLP/events time ratio "
        f"{otlp_seconds / events_seconds:.2f} ({spans:,} spans, one client)"
    )
    ToolCall.objects.filter(project=project).delete()
    Project.objects.filter(pk=project.pk).delete()


if __name__ == "__main__":
    main()
