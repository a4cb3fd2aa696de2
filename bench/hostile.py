"""Hostile-tenant benchmark (PostgreSQL): the defences of issue 16 in one run.

Usage:  DATABASE_URL=postgres://postgres@127.0.0.1:5432/callgate_bench python bench/hostile.py

Through the WSGI application (as gunicorn calls it), prints:
  1. the poison contract (a 2.9 KB ``$ref`` graph doubling at each of 40 levels) refused at
     registration: status and milliseconds;
  2. fairness: tenant A floods its inbox (``--flood`` events in batches of 500) while tenant B
     reports one event every 50 ms; two worker threads run the real ``drain_inbox`` task
     from one FIFO queue that the API enqueues to, as two Celery worker processes would
     (one queued drain per project; a run of at most ``DRAIN_TASK_SECONDS`` queues itself
     again behind the others; a retry after ``DrainBusy`` goes back in the queue).
     Prints B's latency from POST to applied (median, p99, max; target: max < 1 s) and how
     long A's backlog took;
  3. backpressure: with ``CALLGATE_INBOX_LIMIT`` reached for A, the gate's answers to A
     (429 with Retry-After, median and max ms) and to B (200).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import secrets
import statistics
import sys
import threading
import time
import uuid
import warnings
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "callgate.settings")
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
os.environ["CELERY_BROKER_URL"] = "memory://"  # the bench's own queue runs the drains
os.environ["CELERY_RESULT_BACKEND"] = "cache+memory://"
os.environ.setdefault("CACHE_URL", "")

import django  # noqa: E402

warnings.filterwarnings("ignore", message="No directory at", module="django.core.handlers.base")
django.setup()

import logging  # noqa: E402

import httpx  # noqa: E402
from celery.exceptions import Retry  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402

from callgate import tasks as callgate_tasks  # noqa: E402
from callgate.auth import api_key_issue  # noqa: E402
from callgate.inbox import event_answer  # noqa: E402
from callgate.models import Agent, InboxEvent, Project, ToolCall  # noqa: E402
from callgate.wsgi import application  # noqa: E402

WEATHER = {
    "description": "Weather for a city on a date",
    "effect": "read",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "minLength": 1, "description": "City"}},
        "required": ["city"],
    },
}


def doubling_graph(levels: int = 40) -> dict:
    defs = {
        f"a{i}": {"anyOf": [{"$ref": f"#/$defs/a{i + 1}"}, {"$ref": f"#/$defs/a{i + 1}"}]}
        for i in range(levels)
    }
    defs[f"a{levels}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/a0"}}, "$defs": defs}


def proposal(i: int) -> dict:
    return {
        "event_id": str(uuid.uuid4()),
        "occurred_at": datetime.now(UTC).isoformat(),
        "type": "proposed",
        "format": "plain",
        "request_id": f"r-{uuid.uuid4().hex[:10]}",
        "call": {"tool": "get_weather", "arguments": {"city": f"City {i}"}},
    }


def client(key: str) -> httpx.Client:
    return httpx.Client(
        transport=httpx.WSGITransport(app=application),
        base_url="http://localhost",
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )


def tenant(slug: str) -> tuple[Project, str]:
    project = Project.objects.create(slug=f"{slug}-{uuid.uuid4().hex[:6]}", name=slug)
    key = api_key_issue(agent=Agent.objects.create(project=project, name=f"{slug}-bot")).plain
    with client(key) as http:
        assert http.put("/api/v1/tools/get_weather", json=WEATHER).status_code == 201
    return project, key


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def poison(key: str) -> None:
    body = {"description": "poison", "effect": "read", "parameters": doubling_graph()}
    started = time.perf_counter()
    with client(key) as http:
        response = http.put("/api/v1/tools/poison", json=body)
    elapsed = time.perf_counter() - started
    size = len(json.dumps(body["parameters"]))
    print(f"1. poison contract ({size:,} bytes): HTTP {response.status_code} in {ms(elapsed)}")
    print(f"   {response.json()['errors'][0]['msg'][:150]}")


def fairness(a: Project, a_key: str, b: Project, b_key: str, flood: int) -> None:
    tasks: queue.Queue = queue.Queue()  # the broker: FIFO, as Celery's default queue
    stop = threading.Event()
    b_latency: list[float] = []
    a_done = threading.Event()
    callgate_tasks.drain_inbox.delay = tasks.put  # what POST /api/v1/events enqueues

    def worker() -> None:  # one Celery worker process, running the real task
        while not stop.is_set():
            try:
                project_id = tasks.get(timeout=0.05)
            except queue.Empty:
                continue
            try:
                callgate_tasks.drain_inbox.run(project_id)
            except Retry:  # the task's retry (DrainBusy): queued again after its countdown
                threading.Timer(callgate_tasks.DRAIN_RETRY_DELAY, tasks.put, [project_id]).start()
        connections.close_all()

    def flooder() -> None:
        with client(a_key) as http:
            for start in range(0, flood, 500):
                batch = [proposal(i) for i in range(start, min(flood, start + 500))]
                assert http.post("/api/v1/events", json=batch).status_code == 200
        connections.close_all()

    def b_reporter() -> None:
        with client(b_key) as http:
            while not a_done.is_set():
                event = proposal(0)
                started = time.perf_counter()
                assert http.post("/api/v1/events", json=event).status_code == 200
                while (event_answer(b, uuid.UUID(event["event_id"])) or {}).get(
                    "status"
                ) != "applied":
                    time.sleep(0.005)
                b_latency.append(time.perf_counter() - started)
                time.sleep(0.05)
        connections.close_all()

    workers = [threading.Thread(target=worker) for _ in range(2)]
    for thread in workers:
        thread.start()
    started = time.perf_counter()
    flood_thread = threading.Thread(target=flooder)
    reporter = threading.Thread(target=b_reporter)
    flood_thread.start()
    reporter.start()
    flood_thread.join()
    while InboxEvent.objects.filter(project=a, status="pending").exists():
        time.sleep(0.05)
    a_elapsed = time.perf_counter() - started
    a_done.set()
    reporter.join()
    stop.set()
    for thread in workers:
        thread.join()
    b_latency.sort()
    p99 = b_latency[min(len(b_latency) - 1, int(len(b_latency) * 0.99))]
    print(
        f"2. tenant A: {flood:,} events posted and applied in {a_elapsed:.1f} s "
        f"({flood / a_elapsed:,.0f}/s), two workers"
    )
    print(
        f"   tenant B meanwhile: {len(b_latency)} events, POST to applied median "
        f"{ms(statistics.median(b_latency))}, p99 {ms(p99)}, max {ms(b_latency[-1])} "
        f"({'within' if b_latency[-1] < 1 else 'NOT within'} a second)"
    )


def backpressure(a: Project, a_key: str, b_key: str, checks: int) -> None:
    limit = settings.CALLGATE_INBOX_LIMIT
    with client(a_key) as http:
        while InboxEvent.objects.filter(project=a, status="pending").count() < limit:
            batch = [proposal(i) for i in range(500)]
            http.post("/api/v1/events", json=batch)
        gate = {"format": "plain", "call": {"tool": "get_weather", "arguments": {"city": "Oslo"}}}
        answers, times = [], []
        for _ in range(checks):
            started = time.perf_counter()
            response = http.post("/api/v1/calls", json=gate)
            times.append(time.perf_counter() - started)
            answers.append((response.status_code, response.headers.get("Retry-After")))
    with client(b_key) as http:
        other = http.post("/api/v1/calls", json=gate).status_code
    codes = sorted(set(answers))
    print(
        f"3. gate for A with {limit:,} events pending: {codes} "
        f"(status, Retry-After) in median {ms(statistics.median(times))}, max {ms(max(times))}; "
        f"gate for B: HTTP {other}"
    )


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("django.request").setLevel(logging.ERROR)  # the 4xx the bench provokes
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flood", type=int, default=20_000, help="events tenant A posts")
    parser.add_argument("--limit", type=int, default=5_000, help="CALLGATE_INBOX_LIMIT for step 3")
    parser.add_argument("--gate-checks", type=int, default=50)
    options = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("bench/hostile.py needs PostgreSQL: set DATABASE_URL=postgres://…")
    settings.ALLOWED_HOSTS = ["*"]
    settings.CALLGATE_INBOX_LIMIT = 0  # step 2 measures fairness, not backpressure
    settings.CALLGATE_THROTTLE_KEY = settings.CALLGATE_THROTTLE_PROJECT = "1000000/min"
    call_command("migrate", verbosity=0)
    (a, a_key), (b, b_key) = tenant("flood"), tenant("quiet")
    try:
        poison(a_key)
        fairness(a, a_key, b, b_key, options.flood)
        settings.CALLGATE_INBOX_LIMIT = options.limit
        backpressure(a, a_key, b_key, options.gate_checks)
    finally:
        ToolCall.objects.filter(project__in=[a, b]).delete()
        Project.objects.filter(pk__in=[a.pk, b.pk]).delete()


if __name__ == "__main__":
    main()
