"""Gate benchmark (PostgreSQL): what one ``POST /api/v1/calls`` costs, against a bare view.

Usage:  DATABASE_URL=postgres://postgres@127.0.0.1:5432/callgate_bench \\
        python bench/gate.py [--sizes 10000,1000000] [--checks 500] [--backlog 20000]

For each size N, the project ``bench-<N>`` built by ``manage.py seed_scale`` (reused when it
already holds N calls). Through the WSGI application, as gunicorn calls it (middleware, key
authentication, routing), interleaved check by check so that the machine's load falls on
all alike:

  - a bare DRF view with the API's key authentication doing one indexed SELECT (a call by
    operation ID): the floor any API view pays;
  - the gate, a new allowed proposal per check (a tool and arguments the project's contract
    accepts, a fresh request ID);
  - the gate again while ``--backlog`` events of other requests wait in the project's inbox
    (received, not applied: the workers are behind).

Prints per size: p50 and p99 of each, the ratios gate/bare (target <= 3) and
gate-with-backlog/gate (target <= 1.5), and per gate check the SQL statements and the
transactions committed (a statement outside ``atomic`` commits on its own; target 5 and 1).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import time
import uuid
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "callgate.settings")
os.environ.setdefault("DEBUG", "false")  # as in production
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
os.environ["CELERY_BROKER_URL"] = "memory://"
os.environ["CELERY_RESULT_BACKEND"] = "cache+memory://"

import django  # noqa: E402

warnings.filterwarnings("ignore", message="No directory at", module="django.core.handlers.base")
django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.urls import clear_url_caches, path  # noqa: E402
from rest_framework.response import Response  # noqa: E402
from rest_framework.views import APIView  # noqa: E402

from bench.support import call  # noqa: E402
from callgate import urls  # noqa: E402
from callgate.auth import api_key_issue  # noqa: E402
from callgate.inbox import events_receive  # noqa: E402
from callgate.models import Agent, InboxEvent, Project, ToolCall  # noqa: E402
from callgate.schemas import EVENT_ADAPTER  # noqa: E402
from demo.seeding import seed_scale  # noqa: E402


class BareView(APIView):
    """One indexed SELECT behind the API's key authentication and throttles (the API's
    defaults): the floor of an API view."""

    def get(self, request, operation_id: str):
        row = (
            ToolCall.objects.filter(project=request.user.project, operation_id=operation_id)
            .values("state")
            .first()
        )
        return Response(row or {})


urls.urlpatterns.append(path("bench/bare/<str:operation_id>", BareView.as_view()))
clear_url_caches()


class Counter:
    """Counts the SQL statements and the commits of the default connection: a statement run
    outside ``atomic`` is its own transaction; an outermost ``atomic`` commits once."""

    def __init__(self) -> None:
        self.statements = self.commits = 0

    def __call__(self, execute, sql, params, many, context):
        self.statements += 1
        if not connection.in_atomic_block and not sql.lstrip().upper().startswith(
            ("SAVEPOINT", "RELEASE")
        ):
            self.commits += 1
        return execute(sql, params, many, context)

    def __enter__(self) -> Counter:
        self._commit = connection.commit

        def commit() -> None:
            self.commits += 1
            self._commit()

        connection.commit = commit  # type: ignore[method-assign]
        self._wrapper = connection.execute_wrapper(self)
        self._wrapper.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._wrapper.__exit__(*exc)
        connection.commit = self._commit  # type: ignore[method-assign]


def clean_up(project: Project) -> None:
    """Remove what a run adds: the gate checks' calls and the backlog (as rows, unapplied)."""
    ToolCall.objects.filter(project=project, request_id__startswith="bench-").delete()
    ToolCall.objects.filter(project=project, request_id__startswith="backlog-").delete()
    InboxEvent.objects.filter(project=project).exclude(status="applied").delete()


def project_of_size(calls: int) -> Project:
    slug = f"bench-{calls}"
    project = Project.objects.filter(slug=slug).first()
    if project is not None:  # what an earlier run left
        clean_up(project)
    have = ToolCall.objects.filter(project=project).count() if project else 0
    if have != calls:
        if project is not None:
            raise SystemExit(f"{slug} holds {have} calls, not {calls}: drop it or use --sizes")
        started = time.monotonic()
        print(f"seeding {slug} ({calls} calls)…", file=sys.stderr, flush=True)
        project = seed_scale(slug=slug, calls=calls).project
        print(f"  seeded in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return project


def proposal(project: Project) -> tuple[Agent, dict]:
    """An agent of the project and a proposal its contracts allow (an ok call's tool and
    arguments, from an agent that made it)."""
    sample = (
        ToolCall.objects.filter(project=project, reason="ok", tool_name__gt="")
        .select_related("agent")
        .order_by("-pk")
        .first()
    )
    if sample is None:
        raise SystemExit(f"{project.slug} has no allowed call to copy")
    return sample.agent, {
        "format": "plain",
        "call": {"tool": sample.tool_name, "arguments": sample.arguments},
    }


def backlog_events(count: int) -> list:
    """``count`` proposals of other requests, as ``POST /api/v1/events`` would store them."""
    return [
        EVENT_ADAPTER.validate_python(
            {
                "type": "proposed",
                "event_id": str(uuid.uuid4()),
                "occurred_at": "2026-11-30T12:00:00Z",
                "request_id": f"backlog-{i // 4}",
                "format": "plain",
                "call": {"tool": "not_registered", "arguments": {"n": i}},
            }
        )
        for i in range(count)
    ]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def measure(project: Project, checks: int, backlog: int) -> dict:
    agent, body = proposal(project)
    key = api_key_issue(agent=agent).plain
    operation_id = ToolCall.objects.filter(project=project).order_by("-pk").first().operation_id

    def gate() -> float:
        payload = json.dumps({**body, "request_id": f"bench-{uuid.uuid4().hex}"}).encode()
        started = time.perf_counter()
        code, content = call("POST", "/api/v1/calls", payload, key)
        elapsed = (time.perf_counter() - started) * 1000
        assert code == 200 and json.loads(content)["verdict"] == "allow", content[:300]
        return elapsed

    def bare() -> float:
        started = time.perf_counter()
        code, content = call("GET", f"/bench/bare/{operation_id}", b"", key)
        elapsed = (time.perf_counter() - started) * 1000
        assert code == 200, content[:300]
        return elapsed

    for _ in range(20):  # warm-up: imports, caches, plans
        gate(), bare()
    with Counter() as counted:
        gate()
    idle, floor = [], []
    for _ in range(checks):
        idle.append(gate())
        floor.append(bare())
    events_receive(project=project, agent=agent, events=backlog_events(backlog))
    pending = InboxEvent.objects.filter(project=project, status="pending").count()
    busy = [gate() for _ in range(checks)]
    clean_up(project)
    return {
        "bare": floor,
        "gate": idle,
        "busy": busy,
        "pending": pending,
        "statements": counted.statements,
        "commits": counted.commits,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", type=lambda t: [int(n) for n in t.split(",")], default=[10_000, 1_000_000]
    )
    parser.add_argument("--checks", type=int, default=500)
    parser.add_argument("--backlog", type=int, default=20_000)
    options = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("bench/gate.py needs PostgreSQL: set DATABASE_URL=postgres://…")
    settings.ALLOWED_HOSTS = ["*"]
    # the backlog is below the backpressure limit (at it, the gate answers 429 at once)
    settings.CALLGATE_INBOX_LIMIT = max(settings.CALLGATE_INBOX_LIMIT, options.backlog + 1_000)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    print(
        f"gate check (POST /api/v1/calls), {options.checks} checks per line; "
        f"targets: gate/bare <= 3, with backlog/idle <= 1.5, 5 statements, 1 commit"
    )
    for size in options.sizes:
        project = project_of_size(size)
        m = measure(project, options.checks, options.backlog)
        bare, gate, busy = (statistics.median(m[k]) for k in ("bare", "gate", "busy"))
        print(
            f"{size:>9,} calls: bare view p50 {bare:.2f} ms (p99 {pct(m['bare'], 0.99):.2f}); "
            f"gate p50 {gate:.2f} ms (p99 {pct(m['gate'], 0.99):.2f}), gate/bare {gate / bare:.2f}; "
            f"with {m['pending']:,} pending p50 {busy:.2f} ms (p99 {pct(m['busy'], 0.99):.2f}), "
            f"ratio {busy / gate:.2f}; per check {m['statements']} statements, "
            f"{m['commits']} commits"
        )


if __name__ == "__main__":
    main()
