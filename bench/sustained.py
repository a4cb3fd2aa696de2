"""Sustained ingest (PostgreSQL, Redis, real Celery workers): does applying keep up?

Usage:  DATABASE_URL=postgres://postgres@127.0.0.1:5432/callgate_bench \\
        CELERY_BROKER_URL=redis://127.0.0.1:6379/5 \\
        python bench/sustained.py [--seconds 60] [--clients 3] [--workers 2] [--projects 1]
                                  [--flow both]

For each flow, ``--clients`` processes (forked, like gunicorn's workers) send batches of 500
events to ``POST /api/v1/events`` through the WSGI application for ``--seconds`` while
``--workers`` Celery worker processes (``celery -A callgate worker``, the broker above)
apply them, as in production (each request enqueues its project's drain task). The clients
send to ``--projects`` tenants (client k to project k mod N): one project's events are applied
in arrival order, by one drainer at a time; several projects', by the workers in parallel.
Flows:

  - ``new``: proposals, each creating its call;
  - ``attempts``: successful attempts naming calls the gate allowed earlier by operation ID
    (the SDK's flow: gate first, attempt later; the calls are inserted beforehand).

A client answered 429 (backpressure) waits a second and goes on. Prints per flow:
events received/s, applied/s over the window, the inbox lag (oldest pending event's age) at
the end, and how long the workers took to finish the backlog after the clients stopped.
Target (issue 18): applied >= 10,000 events/s in each flow with the lag under 5 s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import secrets
import sys
import time
import uuid
import warnings
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "callgate.settings")
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
if not os.environ.get("CELERY_BROKER_URL", "").startswith("redis://"):
    sys.exit("bench/sustained.py needs a Redis broker: set CELERY_BROKER_URL=redis://…")

import django  # noqa: E402

warnings.filterwarnings("ignore", message="No directory at", module="django.core.handlers.base")
django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402

from bench.support import call, celery_worker  # noqa: E402
from callgate.auth import api_key_issue  # noqa: E402
from callgate.inbox import inbox_lag_seconds  # noqa: E402
from callgate.models import Agent, CallEvent, InboxEvent, Project, ToolCall  # noqa: E402

BATCH = 500
WEATHER = {
    "description": "Weather for a city on a date",
    "effect": "read",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "minLength": 1, "description": "City"}},
        "required": ["city"],
    },
}


def envelope(type_: str, **fields) -> dict:
    return {
        "event_id": str(uuid.uuid4()),
        "occurred_at": datetime.now(UTC).isoformat(),
        "type": type_,
        **fields,
    }


def allowed_calls(project: Project, agent: Agent, count: int) -> list[str]:
    """``count`` calls as the gate leaves an allowed proposal; their operation IDs."""
    contract = project.contracts.get(name="get_weather")
    now = datetime.now(UTC)
    rows = [
        ToolCall(
            project=project,
            agent=agent,
            operation_id=f"op_sustained_{uuid.uuid4().hex}",
            request_id=f"sustained-{i}",
            provider_format="plain",
            tool_name="get_weather",
            contract=contract,
            arguments={"city": f"City {i}"},
            state=ToolCall.State.ALLOWED,
            route="proceed",
            created_at=now,
            updated_at=now,
        )
        for i in range(count)
    ]
    ToolCall.objects.bulk_create(rows, batch_size=5_000)
    return [row.operation_id for row in rows]


def client(key: str, seconds: float, flow: str, operations: list[str], sent, refused) -> None:
    """Send batches for ``seconds``; count accepted events and 429 answers."""
    connection.ensure_connection()
    deadline = time.monotonic() + seconds
    position = 0
    while time.monotonic() < deadline:
        if flow == "new":
            batch = [
                envelope(
                    "proposed",
                    format="plain",
                    request_id=f"new-{uuid.uuid4().hex[:12]}",
                    call={"tool": "get_weather", "arguments": {"city": "Oslo"}},
                )
                for _ in range(BATCH)
            ]
        else:
            chunk = operations[position : position + BATCH]
            if not chunk:
                break
            position += BATCH
            batch = [
                envelope("attempt", operation_id=op, sent=True, outcome="success", result={"t": 1})
                for op in chunk
            ]
        code, content = call("POST", "/api/v1/events", json.dumps(batch).encode(), key)
        if code == 429:
            with refused.get_lock():
                refused.value += 1
            time.sleep(1)  # about Retry-After (the limit's default is 5 s; workers catch up)
            continue
        assert code in (200, 207), content[:300]
        with sent.get_lock():
            sent.value += json.loads(content)["accepted"]
    connections.close_all()


def tenant(flow: str, options) -> tuple[Project, str, list[str]]:
    """A project with its agent's key and the weather contract; for the attempts flow, the
    operation IDs of its share of ``options.calls`` allowed calls."""
    project = Project.objects.create(slug=f"sustained-{uuid.uuid4().hex[:8]}", name="sustained")
    agent = Agent.objects.create(project=project, name="sustained-agent")
    key = api_key_issue(agent=agent).plain
    code, content = call("PUT", "/api/v1/tools/get_weather", json.dumps(WEATHER).encode(), key)
    assert code == 201, content[:300]
    calls = options.calls // options.projects
    operations = allowed_calls(project, agent, calls) if flow == "attempts" else []
    return project, key, operations


def run_flow(flow: str, options) -> None:
    tenants = [tenant(flow, options) for _ in range(options.projects)]
    projects = [project for project, _, _ in tenants]
    # client k sends to project k mod --projects, a share of that project's operations
    shares = []
    for j, (_, key, operations) in enumerate(tenants):
        senders = len(range(j, options.clients, options.projects))
        shares += [(key, operations[i::senders]) for i in range(senders)]
    sent, refused = multiprocessing.Value("q", 0), multiprocessing.Value("q", 0)
    applied_before = CallEvent.objects.filter(project__in=projects).count()
    connections.close_all()
    context = multiprocessing.get_context("fork")
    processes = [
        context.Process(target=client, args=(key, options.seconds, flow, share, sent, refused))
        for key, share in shares
    ]
    started = time.monotonic()
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    window = time.monotonic() - started
    applied = CallEvent.objects.filter(project__in=projects).count() - applied_before
    lag = max(inbox_lag_seconds(project) for project in projects)
    backlog = InboxEvent.objects.filter(project__in=projects, status="pending")
    pending = backlog.count()
    catch_up = time.monotonic()
    while backlog.exists():
        if time.monotonic() - catch_up > options.catch_up:
            break
        time.sleep(0.5)
    caught_up = time.monotonic() - catch_up
    print(
        f"{flow:>8}: received {sent.value / window:,.0f} events/s ({sent.value:,} in {window:.0f} s, "
        f"{refused.value} answers 429); applied {applied / window:,.0f} events/s in the window; "
        f"at the end {pending:,} pending, inbox lag {lag:.1f} s; backlog applied "
        f"{caught_up:.1f} s after the clients stopped"
        + (" (gave up)" if pending and caught_up >= options.catch_up else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--projects",
        type=int,
        default=1,
        help="tenants the clients send to, 1 to --clients (client k to project k mod N)",
    )
    parser.add_argument("--flow", choices=["new", "attempts", "both"], default="both")
    parser.add_argument(
        "--calls",
        type=int,
        default=300_000,
        help="allowed calls the attempts flow names, split among the projects",
    )
    parser.add_argument(
        "--catch-up", type=float, default=300, help="seconds to wait for the backlog at the end"
    )
    options = parser.parse_args()
    if not 1 <= options.projects <= options.clients:
        parser.error("--projects: from 1 to --clients (each project needs a client)")
    if connection.vendor != "postgresql":
        sys.exit("bench/sustained.py needs PostgreSQL: set DATABASE_URL=postgres://…")
    settings.ALLOWED_HOSTS = ["*"]
    call_command("migrate", verbosity=0)
    worker = celery_worker(options.workers)
    try:
        time.sleep(5)  # the workers connect to the broker
        print(
            f"{options.clients} clients for {options.seconds:.0f} s to {options.projects} "
            f"project(s), {options.workers} Celery worker processes; "
            "target: applied >= 10,000 events/s, lag < 5 s"
        )
        for flow in ("new", "attempts") if options.flow == "both" else (options.flow,):
            run_flow(flow, options)
    finally:
        worker.terminate()
        worker.wait(30)


if __name__ == "__main__":
    main()
