"""Fault run (issue 16): kill -9 the Celery worker, the broker and the web server under load;
is any event or decision webhook lost?

Usage:  DATABASE_URL=postgres://postgres@127.0.0.1:5432/cg_faults \\
        python bench/faults.py [--events-per-phase 5000] [--phase-seconds 30] [--down 5]
                               [--clients 3] [--batch 100] [--review-share 0.05]
                               [--operators 2] [--settle 240]

A production-like deployment of its own, every piece a child process of this script:

  - a private ``redis-server`` (``/usr/bin/redis-server``, append-only file as in
    ``docker-compose.yml``) on a free port, in a temporary directory: the broker, the
    result backend and Django's cache (throttles, drain marks), as in compose; the system
    Redis is never touched;
  - gunicorn with 3 workers (``-c python:callgate.gunicorn callgate.wsgi``, ``DEBUG=false``)
    on a free port;
  - one Celery worker for every queue (``callgate.queues``) and Celery beat, whose
    production schedule sweeps the inbox every 10 s and the webhook outbox every 30 s
    (rows more than a minute overdue);
  - a webhook receiver (a thread here) that verifies each delivery's Standard Webhooks
    signature, records its ``webhook-id`` and answers 204.

The database (created when missing, then migrated) gets a new project, an agent whose key
reports the events and whose ``webhook_url`` is the receiver, and ``--operators`` operators.
The receiver listens on 127.0.0.1, which the webhook guard refuses; the script allows it
the way a test or development set-up does, with ``CALLGATE_OUTBOUND_ALLOW`` naming the
loopback address. Sessions and CSRF cookies are not ``Secure`` (plain HTTP, no TLS proxy).

Three phases, one fault each: the Celery worker, the broker, the web server (gunicorn's
master and workers) are killed with SIGKILL a third into the phase and started again
``--down`` seconds later (redis-server on the same port and directory). Through every phase
``--clients`` threads post ``--events-per-phase`` events in batches of ``--batch`` to
``POST /api/v1/events`` at an even pace over ``--phase-seconds``: per call a proposal and its
attempt; a ``--review-share`` of the calls are writes whose attempt timed out (outcome
unknown, not reconcilable: a review item). A client re-sends a batch with the same event IDs
on a connection error, a 5xx or a 429 (after ``Retry-After``), as the SDK does. Meanwhile
the operators log in and reject every open review item through the item page's decide
action (htmx, as the browser does), re-sending on a connection error or 5xx.

The children are supervised as compose's ``restart: unless-stopped`` does: one that exits
by itself is started again and counted (``crashed``). This is not hypothetical: with Celery
and kombu 5.7 on redis-py 8, the worker sometimes dies when its broker goes away
("Unrecoverable error: AttributeError … 'hostname'" while restoring unacknowledged
messages; celery/celery#10205), and without a restart nothing is applied after that.

At the end it waits (up to ``--settle`` seconds) for the inbox to drain, every item to be
decided and every outbox row to be delivered, then prints per phase and in total: events
accepted by the API (unique event IDs answered 2xx), applied (with a ``CallEvent``),
applied twice, lost (accepted, not applied: pending, rejected or quarantined), API 5xx and
429 answers (503 with Retry-After while the broker is down: the key stamps, the failed-key
limiter and the throttles read the cache, on the same Redis as in compose; nothing is stored
and clients send again); decisions saved, deliveries received (unique ``webhook-id``s), missing,
received twice (allowed: receivers deduplicate, but counted), bad signatures, operator 5xx,
children that crashed; and the run time. Targets: 0 lost, 0 applied twice, 0 missing deliveries, 0 operator 5xx.
Every child process and the temporary directory go at the end, on Ctrl-C or an error too
(``--keep`` keeps the directory and its logs).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (chosen before Django's settings
    read the environment that names them)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


REDIS_PORT, WEB_PORT, RECEIVER_PORT = free_port(), free_port(), free_port()
TMP = Path(tempfile.mkdtemp(prefix="callgate-faults-"))
os.environ.update(
    {
        "DJANGO_SETTINGS_MODULE": "callgate.settings",
        "DEBUG": "false",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "CELERY_BROKER_URL": f"redis://127.0.0.1:{REDIS_PORT}/0",
        "CELERY_RESULT_BACKEND": "",
        "CACHE_URL": f"redis://127.0.0.1:{REDIS_PORT}/1",
        "CALLGATE_QUEUE_PREFIX": "",
        "ALLOWED_HOSTS": "127.0.0.1",
        # the outbound guard refuses loopback addresses unless they are allowed
        "CALLGATE_OUTBOUND_ALLOW": "127.0.0.1/32",
        "SESSION_COOKIE_SECURE": "false",
        "CSRF_COOKIE_SECURE": "false",
        "BEHIND_TLS_PROXY": "false",
        "LOG_LEVEL": "WARNING",
        # the children (gunicorn, Celery) import this checkout's callgate
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
)
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cg_faults")

import django  # noqa: E402

warnings.filterwarnings("ignore", message="No directory at", module="django.core.handlers.base")
django.setup()

import httpx  # noqa: E402
import psycopg  # noqa: E402
import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402
from django.db.models import Count  # noqa: E402
from django.db.models.functions import Mod  # noqa: E402
from standardwebhooks.webhooks import Webhook  # noqa: E402

from bench.support import BIN, celery_beat, celery_worker  # noqa: E402
from callgate import services  # noqa: E402
from callgate.auth import api_key_issue  # noqa: E402
from callgate.models import Agent, CallEvent, InboxEvent, Membership  # noqa: E402
from reviews.models import ReviewItem, WebhookOutbox  # noqa: E402

PHASES = ("worker", "broker", "web")
#: the child process each phase kills
CHILD = {"worker": "worker", "broker": "redis", "web": "web"}
SETTLE = "settle"
PASSWORD = secrets.token_urlsafe(16)
WEATHER = {
    "description": "Weather for a city",
    "effect": "read",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "minLength": 1, "description": "City"}},
        "required": ["city"],
    },
}
TRANSFER = {
    "description": "Transfer money between accounts",
    "effect": "write",
    "parameters": {
        "type": "object",
        "properties": {"amount": {"type": "number", "description": "Amount in EUR"}},
        "required": ["amount"],
    },
}


@dataclass
class Tally:
    """What one phase saw from the outside."""

    acked: set[str] = field(default_factory=set)  # event IDs answered 2xx
    api_5xx: int = 0
    api_429: int = 0
    api_errors: int = 0  # connection errors and timeouts
    rejected: int = 0  # events the API answered "rejected" or "conflict"
    decided: set[int] = field(default_factory=set)  # review items the operators decided
    operator_5xx: int = 0
    operator_errors: int = 0
    crashes: int = 0  # children that exited by themselves (restarted)


TALLY = {name: Tally() for name in (*PHASES, SETTLE)}
LOCK = threading.Lock()
NOW = {"phase": PHASES[0]}


# --- child processes ---------------------------------------------------------------------------


class Children:
    """The processes this run started, each in its own process group (killed as a group),
    supervised as compose's ``restart: unless-stopped`` does: one that exits by itself (not
    killed by the run) is started again, and counted."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, IO[bytes]] = {}
        self.lock = threading.RLock()
        self.stopping = threading.Event()

    def supervise(self) -> None:
        while not self.stopping.wait(1):
            with self.lock:
                for name, proc in list(self.procs.items()):
                    if proc.poll() is None or self.stopping.is_set():
                        continue
                    self.kill(name)  # what is left of its group (a pool's children)
                    last = [
                        line
                        for line in (TMP / f"{name}.log").read_text().splitlines()
                        if "CRITICAL" in line or "Unrecoverable" in line
                    ][-1:]
                    print(
                        f"  {name} exited by itself ({proc.returncode}) in phase "
                        f"{NOW['phase']}: restarted. {' '.join(last)[:200]}",
                        flush=True,
                    )
                    TALLY[NOW["phase"]].crashes += 1
                    self.start(name)

    def log(self, name: str) -> IO[bytes]:
        if name not in self.logs:
            self.logs[name] = (TMP / f"{name}.log").open("ab")
        return self.logs[name]

    def start(self, name: str) -> None:
        with self.lock:
            self._start(name)

    def _start(self, name: str) -> None:
        env = os.environ.copy()
        if name == "redis":
            proc = subprocess.Popen(
                [
                    "/usr/bin/redis-server",
                    "--port",
                    str(REDIS_PORT),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(TMP),
                    "--appendonly",
                    "yes",
                    "--save",
                    "",
                ],
                stdout=self.log(name),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        elif name == "web":
            # gunicorn's workers' metrics (callgate/gunicorn.py), as compose's web service
            env["PROMETHEUS_MULTIPROC_DIR"] = str(TMP / "prometheus")
            proc = subprocess.Popen(
                [
                    str(BIN / "gunicorn"),
                    "-c",
                    "python:callgate.gunicorn",
                    "callgate.wsgi",
                    "--bind",
                    f"127.0.0.1:{WEB_PORT}",
                    "--workers",
                    "3",
                    "--timeout",
                    "60",
                    "--logger-class",
                    "callgate.logmask.GunicornLogger",
                ],
                cwd=ROOT,
                env=env,
                stdout=self.log(name),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        elif name == "worker":
            proc = celery_worker(2, env=env, log=self.log(name), own_group=True)
        else:
            proc = celery_beat(TMP / "beat-schedule", env=env, log=self.log(name))
        self.procs[name] = proc
        self.wait_ready(name)

    def wait_ready(self, name: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited with {self.procs[name].returncode}; see logs")
            try:
                if name == "redis":
                    redis.Redis(port=REDIS_PORT, socket_timeout=1).ping()
                    return
                if name == "web":
                    if httpx.get(f"http://127.0.0.1:{WEB_PORT}/health/", timeout=2).is_success:
                        return
                else:
                    return  # workers and beat connect by themselves (and retry)
            except (redis.RedisError, httpx.HTTPError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{name} not ready after {timeout:.0f} s")

    def kill(self, name: str) -> None:
        """SIGKILL to the process and everything it forked (its group: gunicorn's workers,
        Celery's pool)."""
        with self.lock:
            proc = self.procs.pop(name)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()

    def stop_all(self) -> None:
        self.stopping.set()
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for name, proc in list(self.procs.items()):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill(name)
        self.procs.clear()
        for log in self.logs.values():
            log.close()


# --- the webhook receiver ----------------------------------------------------------------------


class Receiver(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, secret: str) -> None:
        super().__init__(("127.0.0.1", RECEIVER_PORT), _Hook)
        self.webhook = Webhook(secret.encode())
        self.received: collections.Counter[str] = collections.Counter()
        self.bad_signatures = 0


class _Hook(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            self.server.webhook.verify(body, headers)
        except Exception:
            with LOCK:
                self.server.bad_signatures += 1
        with LOCK:
            self.server.received[headers.get("webhook-id", "")] += 1
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


# --- load --------------------------------------------------------------------------------------


def envelope(type_: str, **fields) -> dict:
    return {
        "event_id": str(uuid.uuid4()),
        "occurred_at": datetime.now(UTC).isoformat(),
        "type": type_,
        **fields,
    }


def phase_batches(phase: str, events: int, batch: int, review_share: float) -> list[list[dict]]:
    """Per call its proposal and its attempt, in one batch; ``review_share`` of the calls are
    transfers whose attempt timed out after it was sent (a review item)."""
    items: list[dict] = []
    for n in range(events // 2):
        request_id, call_id = f"{phase}-{n}", f"c{n}"
        ids = {"request_id": request_id, "call_id": call_id}
        if random.random() < review_share:
            call = {"tool": "transfer", "arguments": {"amount": n}}
            attempt = {"sent": True, "outcome": "timeout", "error": "read timed out"}
        else:
            call = {"tool": "get_weather", "arguments": {"city": f"City {n}"}}
            attempt = {"sent": True, "outcome": "success", "result": {"temp": 21}}
        items.append(envelope("proposed", format="plain", call=call, **ids))
        items.append(envelope("attempt", **ids, **attempt))
    # a call's two events stay together (an even batch size)
    size = batch + batch % 2
    return [items[i : i + size] for i in range(0, len(items), size)]


def client(key: str, work: list[tuple[float, list[dict]]], tally: Tally, take) -> None:
    """Send each batch when it is due; again, with the same event IDs, until a 2xx."""
    with httpx.Client(
        base_url=f"http://127.0.0.1:{WEB_PORT}",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    ) as http:
        while (job := take()) is not None:
            due, batch = work[job]
            time.sleep(max(0.0, due - time.monotonic()))
            while True:
                try:
                    response = http.post("/api/v1/events", json=batch)
                except httpx.HTTPError:
                    with LOCK:
                        tally.api_errors += 1
                    time.sleep(0.5)
                    continue
                if response.status_code == 429:
                    with LOCK:
                        tally.api_429 += 1
                    time.sleep(float(response.headers.get("Retry-After", 1)))
                    continue
                if response.status_code >= 500:
                    with LOCK:
                        tally.api_5xx += 1
                    time.sleep(0.5)
                    continue
                assert response.status_code in (200, 207), response.text[:300]
                results = response.json()["results"]
                with LOCK:
                    for result in results:
                        if result["status"] in ("accepted", "duplicate"):
                            tally.acked.add(result["event_id"])
                        else:
                            tally.rejected += 1
                break


def operator(number: int, of: int, username: str, project_slug: str, stop: threading.Event):
    """Reject the open review items whose pk is ``number`` modulo ``of`` through the item
    page's decide action (htmx), until ``stop``."""
    base = f"http://127.0.0.1:{WEB_PORT}"
    with httpx.Client(base_url=base, timeout=30) as http:
        http.get("/login/")
        login = http.post(
            "/login/",
            data={
                "username": username,
                "password": PASSWORD,
                "csrfmiddlewaretoken": http.cookies["csrftoken"],
            },
        )
        assert login.status_code == 302, f"operator login: {login.status_code}"
        while not stop.is_set():
            items = list(
                ReviewItem.objects.filter(project__slug=project_slug, status="open")
                .annotate(share=Mod("id", of))
                .filter(share=number)
                .order_by("pk")
                .values_list("pk", flat=True)[:20]
            )
            if not items:
                stop.wait(0.5)
                continue
            for pk in items:
                decide(http, project_slug, pk, stop)
    connection.close()


def decide(http: httpx.Client, project_slug: str, pk: int, stop: threading.Event) -> None:
    while not stop.is_set():
        tally = TALLY[NOW["phase"]]
        try:
            response = http.post(
                f"/p/{project_slug}/review/{pk}/decide/",
                data={"decision": "reject", "reason": "fault run: not retried"},
                headers={"HX-Request": "true", "X-CSRFToken": http.cookies["csrftoken"]},
            )
        except httpx.HTTPError:
            with LOCK:
                tally.operator_errors += 1
            time.sleep(0.5)
            continue
        if response.status_code >= 500:
            with LOCK:
                tally.operator_5xx += 1
            time.sleep(0.5)
            continue
        # 409/422: decided already (the answer to an earlier try was lost with the server)
        assert response.status_code in (200, 409, 422), f"decide {pk}: {response.status_code}"
        if response.status_code == 200:
            with LOCK:
                tally.decided.add(pk)
        return


def run_phase(phase: str, project, key: str, children: Children, options) -> None:
    NOW["phase"] = phase
    batches = phase_batches(phase, options.events_per_phase, options.batch, options.review_share)
    start = time.monotonic()
    step = options.phase_seconds / max(1, len(batches))
    work = [(start + i * step, batch) for i, batch in enumerate(batches)]
    jobs = iter(range(len(work)))
    guard = threading.Lock()

    def take() -> int | None:
        with guard:
            return next(jobs, None)

    threads = [
        threading.Thread(target=client, args=(key, work, TALLY[phase], take), daemon=True)
        for _ in range(options.clients)
    ]
    for thread in threads:
        thread.start()
    time.sleep(options.phase_seconds / 3)
    children.kill(CHILD[phase])
    pending = InboxEvent.objects.filter(project=project, status="pending").count()
    undelivered = WebhookOutbox.objects.filter(project=project, delivered_at=None).count()
    print(
        f"  {phase}: killed at {time.monotonic() - start:.0f} s ({pending} events pending in "
        f"the inbox, {undelivered} deliveries in the outbox)",
        flush=True,
    )
    time.sleep(options.down)
    children.start(CHILD[phase])
    print(f"  {phase}: back at {time.monotonic() - start:.0f} s", flush=True)
    for thread in threads:
        thread.join()
    connection.close()
    print(f"  {phase}: all batches accepted at {time.monotonic() - start:.0f} s", flush=True)


# --- set-up and figures ------------------------------------------------------------------------


def ensure_database() -> None:
    name = settings.DATABASES["default"]["NAME"]
    params = {k: settings.DATABASES["default"][k] for k in ("HOST", "PORT", "USER", "PASSWORD")}
    with psycopg.connect(
        host=params["HOST"],
        port=params["PORT"] or 5432,
        user=params["USER"],
        password=params["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
    ) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            admin.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", verbosity=0)
    # DEBUG off serves hashed static files from the manifest, as the Dockerfile builds them
    call_command("collectstatic", interactive=False, verbosity=0)


def settled(project, receiver: Receiver) -> bool:
    if InboxEvent.objects.filter(project=project, status="pending").exists():
        return False
    if ReviewItem.objects.filter(project=project, status__in=ReviewItem.OPEN_STATUSES).exists():
        return False
    expected = {
        str(d)
        for d in WebhookOutbox.objects.filter(project=project).values_list("delivery_id", flat=True)
    }
    with LOCK:
        return expected <= set(receiver.received)


def report(project, receiver: Receiver, seconds: float) -> bool:
    """Print the figures per phase and in total; True when every target is met."""
    rows: dict[str, dict[str, int]] = {}
    for phase in PHASES:
        tally = TALLY[phase]
        ids = list(tally.acked)
        per_event = list(
            CallEvent.objects.filter(project=project, event_id__in=ids)
            .values("event_id")
            .annotate(n=Count("id"))
        )
        of_phase = {"project": project, "call__request_id__startswith": f"{phase}-"}
        outbox = {
            str(d)
            for d in WebhookOutbox.objects.filter(**of_phase).values_list("delivery_id", flat=True)
        }
        with LOCK:
            delivered = {d for d in outbox if receiver.received[d]}
            twice = sum(receiver.received[d] - 1 for d in delivered)
        rows[phase] = {
            "accepted": len(ids),
            "applied": len(per_event),
            "twice": sum(1 for row in per_event if row["n"] > 1),
            "lost": len(ids) - len(per_event),
            "api 5xx": tally.api_5xx,
            "429": tally.api_429,
            "decided": ReviewItem.objects.filter(**of_phase, status="resolved").count(),
            "delivered": len(delivered),
            "missing": len(outbox - delivered),
            "dup": twice,
            "op 5xx": tally.operator_5xx,
            "crashed": tally.crashes,
        }
    # operators' answers after the last phase (the settling): their own row, no events
    rows[SETTLE] = dict.fromkeys(rows[PHASES[0]], 0) | {
        "op 5xx": TALLY[SETTLE].operator_5xx,
        "crashed": TALLY[SETTLE].crashes,
    }
    total = collections.Counter[str]()
    for row in rows.values():
        total.update(row)
    rows["total"] = dict(total)
    widths = {name: max(len(name), 6) for name in rows["total"]}
    print(f"{'phase':<8}" + "".join(f" {name:>{widths[name]}}" for name in widths))
    for phase, row in rows.items():
        print(f"{phase:<8}" + "".join(f" {row[name]:>{widths[name]}}" for name in widths))
    not_applied = collections.Counter(
        InboxEvent.objects.filter(project=project)
        .exclude(status="applied")
        .values_list("status", flat=True)
    )
    outbox = {
        str(d)
        for d in WebhookOutbox.objects.filter(project=project).values_list("delivery_id", flat=True)
    }
    answered = set().union(*(t.decided for t in TALLY.values()))
    unsaved = answered - set(
        ReviewItem.objects.filter(project=project, status="resolved").values_list("pk", flat=True)
    )
    with LOCK:
        unknown = len(set(receiver.received) - outbox)
        bad = receiver.bad_signatures
    print(
        f"inbox rows not applied: {dict(not_applied) or 0}; decisions answered 200 and not "
        f"saved: {len(unsaved)}; deliveries of no decision: {unknown}; bad signatures: {bad}; "
        f"API rejected/conflict answers: {sum(t.rejected for t in TALLY.values())}; "
        f"connection errors (retried): API {sum(t.api_errors for t in TALLY.values())}, "
        f"operators {sum(t.operator_errors for t in TALLY.values())}; run {seconds:.0f} s"
    )
    ok = not (
        total["lost"] or total["twice"] or total["missing"] or total["op 5xx"] or unsaved or bad
    )
    print(
        "targets (0 lost, 0 applied twice, 0 missing deliveries, 0 operator 5xx):",
        "met" if ok else "NOT met",
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events-per-phase", type=int, default=5000)
    parser.add_argument("--phase-seconds", type=float, default=30)
    parser.add_argument("--down", type=float, default=5, help="seconds a killed piece stays down")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--review-share", type=float, default=0.05)
    parser.add_argument("--operators", type=int, default=2)
    parser.add_argument("--settle", type=float, default=240, help="seconds to wait at the end")
    parser.add_argument("--keep", action="store_true", help=f"keep {TMP} (logs)")
    options = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    children = Children()
    receiver: Receiver | None = None
    stop = threading.Event()
    try:
        ensure_database()
        project, _ = services.project_create(
            slug=f"faults-{uuid.uuid4().hex[:8]}", name="fault run"
        )
        secret = secrets.token_urlsafe(24)
        agent = Agent.objects.create(
            project=project,
            name="faults-agent",
            webhook_url=f"http://127.0.0.1:{RECEIVER_PORT}/hook",
            webhook_secret=secret,
        )
        key = api_key_issue(agent=agent).plain
        operators = [f"{project.slug}-op{n}" for n in range(options.operators)]
        for username in operators:
            services.membership_set(
                project_slug=project.slug,
                username=username,
                role=Membership.Role.OPERATOR,
                password=PASSWORD,
            )
        receiver = Receiver(secret)
        threading.Thread(target=receiver.serve_forever, daemon=True).start()
        for name in ("redis", "web", "worker", "beat"):
            children.start(name)
        threading.Thread(target=children.supervise, daemon=True).start()
        for tool, contract in (("get_weather", WEATHER), ("transfer", TRANSFER)):
            answer = httpx.put(
                f"http://127.0.0.1:{WEB_PORT}/api/v1/tools/{tool}",
                json=contract,
                headers={"Authorization": f"Bearer {key}"},
            )
            assert answer.status_code in (200, 201), answer.text[:300]
        connections.close_all()
        print(
            f"project {project.slug}: {len(PHASES)} phases of {options.events_per_phase:,} "
            f"events over {options.phase_seconds:.0f} s, {options.clients} clients, "
            f"{options.operators} operators; each fault down {options.down:.0f} s",
            flush=True,
        )
        operator_threads = [
            threading.Thread(
                target=operator, args=(n, options.operators, name, project.slug, stop), daemon=True
            )
            for n, name in enumerate(operators)
        ]
        for thread in operator_threads:
            thread.start()
        for phase in PHASES:
            run_phase(phase, project, key, children, options)
        NOW["phase"] = SETTLE
        settle_start = time.monotonic()
        while time.monotonic() - settle_start < options.settle:
            if settled(project, receiver):
                break
            time.sleep(1)
        print(f"  settled in {time.monotonic() - settle_start:.0f} s", flush=True)
        stop.set()
        for thread in operator_threads:
            thread.join(35)
        return 0 if report(project, receiver, time.monotonic() - started) else 1
    finally:
        stop.set()
        if receiver is not None:
            receiver.shutdown()
            receiver.server_close()
        children.stop_all()
        if options.keep:
            print(f"logs kept in {TMP}")
        else:
            shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
