"""End to end: an agent using the SDK against the real callgate (in-process over
``httpx.WSGITransport``) and the target-system simulator (in-process), with the
reconciliation task running eagerly. Every test asserts the simulator's write log: no
second write, ever.

These are ``TransactionTestCase``s: callgate enqueues reconciliation with
``transaction.on_commit``, which only fires on a real commit.
"""

from __future__ import annotations

import io
import os
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from unittest import mock
from urllib.parse import quote
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import httpx
import pytest
from django.core.management import call_command
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, connection
from django.http import HttpRequest
from django.test import LiveServerTestCase, TransactionTestCase, override_settings

from callgate.auth import api_key_issue
from callgate.models import Agent, CallEvent, Project, ToolCall
from callgate_sdk import CallgateClient
from demo.fleet import (
    TOKEN,
    as_openai,
    callgate_transport,
    contracts,
    follow_up_tool,
    simulator_client,
)
from demo.simulator import SIMULATOR_PATH, MountedTransport, demo_service
from reviews.models import ReviewItem

SIM = "http://sim"
DUE = "2026-12-01T09:00:00Z"


class FakeClock:
    """Virtual time: ``sleep`` advances it and runs the callbacks scheduled for the moment."""

    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []
        self.on_sleep: list = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        while self.on_sleep:
            self.on_sleep.pop(0)()


class FlakyTransport(httpx.BaseTransport):
    """callgate that can be switched off: connection refused while ``down``."""

    def __init__(self, inner: httpx.BaseTransport):
        self.inner = inner
        self.down = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return self.inner.handle_request(request)


class E2ETestCase(TransactionTestCase):
    """A project, an agent with a key, the demo simulator (tickets T-1, T-2 acme; T-3
    globex; T-4 deleted; T-5 closed), an SDK client on virtual time, contracts registered."""

    tools = ("create_follow_up", "lookup_ticket", "get_weather")

    def setUp(self):
        super().setUp()
        # behave like Django's test client: do not close the connection after each request
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        self.addCleanup(request_started.connect, close_old_connections)
        self.addCleanup(request_finished.connect, close_old_connections)
        self.project = Project.objects.create(slug="acme", name="Acme")
        self.agent = Agent.objects.create(project=self.project, name="support-bot")
        self.key = api_key_issue(agent=self.agent).plain
        self.sim = demo_service()
        self.sim_http = simulator_client(self.sim)
        self.addCleanup(self.sim_http.close)
        # callgate's reconcile look-ups reach this test's simulator in-process
        transport = override_settings(
            CALLGATE_RECONCILE_TRANSPORT=lambda: MountedTransport(self.sim)
        )
        transport.enable()
        self.addCleanup(transport.disable)
        self.time = FakeClock()
        self.callgate = FlakyTransport(callgate_transport())
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.buffer_dir = Path(self._tmp.name)
        self.client = self.make_client()
        specs = contracts(SIM + SIMULATOR_PATH)  # look-ups as the server mounts it
        for name in self.tools:
            self.client.register_tool(name, **specs[name])
        self.follow_up = follow_up_tool(self.sim_http)

    def make_client(self, *, key: str | None = None, **kwargs) -> CallgateClient:
        options = dict(
            transport=self.callgate,
            flush_interval=None,
            execute_timeout=None,
            buffer_dir=self.buffer_dir,
            sleep=self.time.sleep,
            clock=self.time.clock,
            wait_limit=60,
            poll_interval=1,
        )
        options.update(kwargs)
        client = CallgateClient("http://localhost", key or self.key, **options)
        self.addCleanup(client.close, flush=False)
        return client

    def propose(self, arguments, *, tool="create_follow_up", call_id="call_1") -> dict:
        return as_openai(tool, arguments, call_id)

    def follow_up_args(self, **changes) -> dict:
        return {"ticket_id": "T-1", "assignee_id": "u-7", "due_at": DUE, **changes}

    def call(self, operation_id: str) -> ToolCall:
        return ToolCall.objects.get(project=self.project, operation_id=operation_id)

    def writes(self) -> list[dict]:
        return list(self.sim.writes)

    def assert_at_most_one_write_per_operation(self):
        ops = [w["operation_id"] for w in self.sim.writes]
        assert len(ops) == len(set(ops)), f"second write: {ops}"


class AgentScenarioTests(E2ETestCase):
    def test_it_writes_a_follow_up_on_a_normal_ticket_once(self):
        result = self.client.run(
            "openai", self.propose(self.follow_up_args()), self.follow_up, request_id="req-1"
        )
        assert result.status == "succeeded" and result.executions == 1
        assert result.result["id"] == "F-1"
        [write] = self.writes()
        assert (
            write["operation_id"] == result.operation_id
            and write["request"] == self.follow_up_args()
        )
        call = self.call(result.operation_id)
        assert (call.state, call.reason, call.attempts) == ("succeeded", "ok", 1)

    def test_it_denies_another_tenants_ticket_without_revealing_it(self):
        result = self.client.run(
            "openai",
            self.propose(self.follow_up_args(ticket_id="T-3")),
            self.follow_up,
            request_id="req-2",
        )
        assert result.status == "denied" and result.reason == "permission_denied"
        assert "globex" not in result.observation.lower()
        assert self.writes() == []
        assert self.call(result.operation_id).reason == "permission_denied"

    def test_it_reasks_for_a_deleted_ticket(self):
        result = self.client.run(
            "openai",
            self.propose(self.follow_up_args(ticket_id="T-4")),
            self.follow_up,
            request_id="req-3",
        )
        assert result.status == "reask" and result.reason == "reference_not_found"
        assert result.executions == 1 and self.writes() == []

    def test_it_stops_a_bad_date_at_the_gate(self):
        executed = []
        result = self.client.run(
            "openai",
            self.propose(self.follow_up_args(due_at="next tuesday")),
            lambda a, op: executed.append(op),
            request_id="req-4",
        )
        assert result.status == "reask" and result.reason == "constraint_violation"
        assert "due_at" in result.observation
        assert executed == [] and self.writes() == []

    def test_it_stops_an_extra_field_at_the_gate(self):
        executed = []
        result = self.client.run(
            "openai",
            self.propose(self.follow_up_args(priority="high")),
            lambda a, op: executed.append(op),
            request_id="req-5",
        )
        assert result.status == "reask" and result.reason == "unknown_argument"
        assert "priority" in result.observation
        assert executed == [] and self.writes() == []

    def test_it_returns_the_receipt_for_the_same_proposal_twice(self):
        first = self.client.run(
            "openai", self.propose(self.follow_up_args()), self.follow_up, request_id="req-6"
        )
        second = self.client.run(
            "openai", self.propose(self.follow_up_args()), self.follow_up, request_id="req-6"
        )
        assert first.status == "succeeded"
        assert second.status == "receipt" and second.executions == 0
        assert second.operation_id == first.operation_id
        assert second.result == first.result
        assert len(self.writes()) == 1
        assert self.call(first.operation_id).duplicates_suppressed == 1

    def test_it_retries_a_failure_before_send_and_succeeds(self):
        self.sim.fail_next("connect_error")
        result = self.client.run(
            "openai", self.propose(self.follow_up_args()), self.follow_up, request_id="req-7"
        )
        assert result.status == "succeeded" and result.executions == 2
        assert len(self.time.sleeps) == 1 and 0 <= self.time.sleeps[0] <= 0.5
        [write] = self.writes()
        assert write["operation_id"] == result.operation_id
        call = self.call(result.operation_id)
        assert (call.state, call.reason, call.attempts) == ("succeeded", "ok", 2)
        attempts = call.events.filter(kind="attempt").order_by("received_at", "pk")
        reasons = list(attempts.values_list("reason", flat=True))
        assert reasons == ["unavailable", "ok"]

    def test_it_reconciles_a_timeout_after_send_as_applied_without_retrying(self):
        self.sim.fail_next("timeout_after_write")
        result = self.client.run(
            "openai", self.propose(self.follow_up_args()), self.follow_up, request_id="req-8"
        )
        assert result.status == "receipt" and result.reason == "reconciled_applied"
        assert result.executions == 1
        [write] = self.writes()
        assert result.result == write["receipt"]
        call = self.call(result.operation_id)
        assert (call.state, call.reason) == ("succeeded", "reconciled_applied")

    def test_it_retries_once_under_the_same_operation_id_when_the_write_did_not_happen(self):
        self.sim.fail_next("timeout_no_write")
        executed: list[str] = []

        def execute(arguments, operation_id):
            executed.append(operation_id)
            return self.follow_up(arguments, operation_id)

        result = self.client.run(
            "openai", self.propose(self.follow_up_args()), execute, request_id="req-9"
        )
        assert result.status == "succeeded"
        assert executed == [result.operation_id, result.operation_id]
        [write] = self.writes()
        assert write["operation_id"] == result.operation_id
        call = self.call(result.operation_id)
        assert call.state == "succeeded" and call.attempts == 2
        assert call.events.filter(kind="reconciled", reason="reconciled_absent").exists()

    def test_it_settles_a_timed_out_write_on_a_late_confirmation(self):
        # the write is applied but the look-up cannot tell (the target's look-up is down)
        self.sim.fail_next("timeout_after_write")
        self.sim.fail_next("unavailable", count=10, on="lookup")
        confirmations = []
        # only a trusted source settles a call callgate reconciles itself (issue 16): the
        # runtime's key with can_decide, not the agent's own
        (self.buffer_dir / "runtime").mkdir()
        runtime = self.make_client(
            key=api_key_issue(agent=self.agent, can_decide=True).plain,
            buffer_dir=self.buffer_dir / "runtime",
        )

        def target_confirms_late():
            op = ToolCall.objects.get(project=self.project).operation_id
            receipt = self.sim.operation("acme", op)["receipt"]
            confirmations.append(
                runtime.report_now(runtime.event("receipt", operation_id=op, result=receipt))
            )

        self.time.on_sleep.append(target_confirms_late)
        result = self.client.run(
            "openai", self.propose(self.follow_up_args()), self.follow_up, request_id="req-10"
        )
        assert confirmations and confirmations[0].reason == "reconciled_applied"
        assert result.status == "receipt" and result.reason == "reconciled_applied"
        assert result.executions == 1
        [write] = self.writes()
        assert result.result == write["receipt"]
        call = self.call(result.operation_id)
        assert (call.state, call.reason) == ("succeeded", "reconciled_applied")
        assert not ReviewItem.objects.filter(call=call, status__in=["open", "claimed"]).exists()

    def test_it_does_not_write_again_when_the_confirmation_is_only_late_in_the_look_up(self):
        # written, but invisible to the first look-up: reconciled absent, retried under the
        # same operation ID, and the target dedupes it (no second write)
        self.sim.fail_next("late_confirmation", after_lookups=1)
        result = self.client.run(
            "openai", self.propose(self.follow_up_args()), self.follow_up, request_id="req-11"
        )
        assert result.ok
        [write] = self.writes()
        assert write["operation_id"] == result.operation_id
        self.assert_at_most_one_write_per_operation()

    def test_it_sends_a_state_conflict_to_review_and_waits(self):
        result = self.client.run(
            "openai",
            self.propose(self.follow_up_args(ticket_id="T-5")),
            self.follow_up,
            request_id="req-12",
            wait_limit=10,
        )
        assert result.status == "waiting" and result.reason == "conflict"
        assert result.executions == 1 and self.writes() == []
        call = self.call(result.operation_id)
        assert call.state == "in_review"
        assert ReviewItem.objects.filter(call=call, status="open").count() == 1


class CallgateDownTests(E2ETestCase):
    def test_it_buffers_events_on_disk_and_delivers_them_once_later(self):
        # the gate answers, then callgate goes down before the attempt is reported
        answers = []

        def execute(arguments, operation_id):
            self.callgate.down = True
            answers.append(operation_id)
            return self.follow_up(arguments, operation_id)

        result = self.client.run(
            "openai", self.propose(self.follow_up_args()), execute, request_id="req-20"
        )
        assert result.status == "succeeded" and result.answer is None  # decided locally
        assert len(self.client.buffer) == 1

        # a whole run while callgate is down (fail open): proposal and attempt are buffered
        offline = self.make_client(fail_open=True)
        result2 = offline.run(
            "openai",
            self.propose(self.follow_up_args(ticket_id="T-2"), call_id="call_2"),
            self.follow_up,
            request_id="req-21",
        )
        assert result2.status == "succeeded"
        assert len(offline.buffer) == 3  # same directory: 1 + proposed + attempt
        assert offline.flush() == 0

        # callgate is back: a new client (a restarted agent) delivers everything
        self.callgate.down = False
        restarted = self.make_client()
        assert restarted.flush() == 3
        assert len(restarted.buffer) == 0
        assert restarted.flush() == 0
        first, second = self.call(result.operation_id), self.call(result2.operation_id)
        assert (first.state, first.reason, first.attempts) == ("succeeded", "ok", 1)
        assert (second.state, second.reason, second.attempts) == ("succeeded", "ok", 1)
        assert CallEvent.objects.filter(call=first, kind="attempt").count() == 1
        assert CallEvent.objects.filter(call=second).values_list("kind", flat=True).count() == 2
        assert len(self.writes()) == 2
        self.assert_at_most_one_write_per_operation()

    def test_it_re_sends_a_batch_whose_answer_was_lost_without_doubling_it(self):
        client = self.make_client(fail_open=True)
        self.callgate.down = True
        client.run(
            "openai", self.propose(self.follow_up_args()), self.follow_up, request_id="req-22"
        )
        self.callgate.down = False
        events = client.buffer.peek(10)
        inner = self.callgate.inner

        class LoseAnswer(httpx.BaseTransport):
            def handle_request(self, request):
                inner.handle_request(request).read()
                raise httpx.ReadTimeout("answer lost", request=request)

        self.callgate.inner = LoseAnswer()
        assert client.flush() == 0 and len(client.buffer) == 2
        self.callgate.inner = inner
        assert client.flush() == 2
        assert CallEvent.objects.filter(event_id__in=[e["event_id"] for e in events]).count() == 2


class DemoFleetTests(TransactionTestCase):
    """``manage.py demo``: the scripted fleet makes every reason of the taxonomy happen."""

    def setUp(self):
        super().setUp()
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        self.addCleanup(request_started.connect, close_old_connections)
        self.addCleanup(request_finished.connect, close_old_connections)

    def test_it_produces_every_reason_and_leaves_work_in_the_review_queue(self):
        from callgate.models import CallRollup
        from callgate.taxonomy import Reason

        sim = demo_service()
        out = io.StringIO()
        with (
            mock.patch("demo.fleet.default_service", return_value=sim),
            override_settings(CALLGATE_RECONCILE_TRANSPORT=lambda: MountedTransport(sim)),
        ):
            call_command("demo", "--seed", "1", "--calls", "1", stdout=out)
        text = out.getvalue()
        assert "operator login: operator / " in text and "manager login:  manager / " in text
        project = Project.objects.get(slug="demo")
        reasons = set(ToolCall.objects.filter(project=project).values_list("reason", flat=True))
        reasons |= set(CallEvent.objects.filter(project=project).values_list("reason", flat=True))
        assert set(Reason.values) <= reasons, sorted(set(Reason.values) - reasons)
        assert ReviewItem.objects.filter(call__project=project, status="open").count() >= 5
        assert CallRollup.objects.filter(project=project).exists()
        self.assertTrue(
            self.client.login(
                request=HttpRequest(),
                username="operator",
                password=text.split("operator / ")[1].split()[0],
            )
        )
        self.assert_no_second_write(sim)

    @staticmethod
    def assert_no_second_write(sim):
        ops = [w["operation_id"] for w in sim.writes]
        assert len(ops) == len(set(ops)), f"second write: {ops}"


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class HangFirstLookup:
    """WSGI middleware: the first operation look-up blocks until ``release`` (so the worker
    is killed in the middle of it); later look-ups go through."""

    def __init__(self, app):
        self.app = app
        self.started = threading.Event()
        self.release = threading.Event()
        self.lookups = 0

    def __call__(self, environ, start_response):
        if "/operations/" in environ.get("PATH_INFO", ""):
            self.lookups += 1
            if self.lookups == 1:
                self.started.set()
                self.release.wait(30)
        return self.app(environ, start_response)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _database_url() -> str | None:
    """A URL of the test database for another process (None for in-memory SQLite)."""
    cfg = connection.settings_dict
    if connection.vendor == "postgresql":
        auth = cfg["USER"] or ""
        if cfg.get("PASSWORD"):
            auth += f":{quote(cfg['PASSWORD'], safe='')}"
        return f"postgres://{auth}@{cfg['HOST'] or '127.0.0.1'}:{cfg['PORT'] or 5432}/{cfg['NAME']}"
    if connection.vendor == "sqlite" and not connection.is_in_memory_db():
        return f"sqlite:///{cfg['NAME']}"
    return None


@pytest.mark.worker
@pytest.mark.skipif(
    not os.environ.get("CELERY_BROKER_URL"), reason="needs CELERY_BROKER_URL (Redis)"
)
class WorkerKilledDuringReconciliationTests(LiveServerTestCase):
    """A real Celery worker (prefork, one process) on Redis is killed (SIGKILL) while it
    looks an operation up; the task is delivered again (``acks_late`` +
    ``task_reject_on_worker_lost``) and the call ends reconciled as applied, with one write."""

    def setUp(self):
        super().setUp()
        database_url = _database_url()
        if database_url is None:
            self.skipTest("the worker process cannot reach an in-memory SQLite test database")
        from callgate import queues
        from callgate.celery import app

        # queues of our own (callgate.queues under a prefix), so that no other worker on the
        # same Redis takes the tasks
        self.prefix = f"e2e-{uuid.uuid4().hex[:8]}-"
        self.queue = queues.queue_name(queues.DEFAULT, self.prefix)
        old = (app.conf.task_always_eager, app.conf.task_default_queue, app.conf.task_routes)

        def route(eager, default_queue, routes):
            app.conf.task_always_eager = eager
            app.conf.task_default_queue, app.conf.task_routes = default_queue, routes
            app.amqp.flush_routes()
            app.amqp.router = app.amqp.Router()

        route(False, self.queue, queues.task_routes(self.prefix))
        self.addCleanup(route, *old)
        eager = override_settings(CELERY_TASK_ALWAYS_EAGER=False)
        eager.enable()
        self.addCleanup(eager.disable)

        # the target, over real HTTP
        self.sim = demo_service()
        self.hang = HangFirstLookup(self.sim)
        self.sim_server = make_server(
            "127.0.0.1",
            0,
            self.hang,
            server_class=_ThreadingWSGIServer,
            handler_class=_QuietHandler,
        )
        threading.Thread(target=self.sim_server.serve_forever, daemon=True).start()
        self.addCleanup(self.sim_server.server_close)
        self.addCleanup(self.sim_server.shutdown)
        self.addCleanup(self.hang.release.set)
        self.sim_url = f"http://127.0.0.1:{self.sim_server.server_port}"

        # the worker: a separate process on the test database
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "DEBUG": "true",
            "CALLGATE_QUEUE_PREFIX": self.prefix,
            "CALLGATE_RECONCILE_AUTH_HEADER": f"Authorization: Bearer {TOKEN}",
            "CALLGATE_RECONCILE_AUTH_ORIGINS": self.sim_url,
            "CALLGATE_RECONCILE_TIMEOUT": "20",
        }
        self.worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "callgate",
                "worker",
                "--pool=prefork",
                "--concurrency=1",
                "-Q",
                ",".join(queues.queue_names(self.prefix)),
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
                "-l",
                "WARNING",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.addCleanup(self._stop_worker)
        from callgate.tasks import ping

        assert ping.apply_async(queue=self.queue).get(timeout=90) == "pong"

        self.project = Project.objects.create(slug="acme", name="Acme")
        self.agent = Agent.objects.create(project=self.project, name="support-bot")
        self.key = api_key_issue(agent=self.agent).plain

    def _stop_worker(self):
        if self.worker.poll() is None:
            self.worker.terminate()
            try:
                self.worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait(timeout=10)

    def test_it_reconciles_after_the_worker_died(self):
        client = CallgateClient(
            self.live_server_url,
            self.key,
            flush_interval=None,
            execute_timeout=None,
            wait_limit=0,
            sleep=lambda s: None,
            timeout=60,
        )
        self.addCleanup(client.close, flush=False)
        client.register_tool("create_follow_up", **contracts(self.sim_url)["create_follow_up"])
        sim_http = httpx.Client(base_url=self.sim_url, timeout=10)
        self.addCleanup(sim_http.close)
        self.sim.fail_next("timeout_after_write")  # over HTTP: written, then 504
        args = {"ticket_id": "T-1", "assignee_id": "u-7", "due_at": DUE}
        result = client.run(
            "openai",
            as_openai("create_follow_up", args, "call_1"),
            follow_up_tool(sim_http),
            request_id="req-worker",
        )
        assert result.status == "waiting" and result.reason == "outcome_unknown"
        op = result.operation_id

        # the worker is in the middle of the look-up: kill its pool process
        assert self.hang.started.wait(60), "the worker never looked the operation up"
        children = _children(self.worker.pid)
        assert len(children) == 1
        os.kill(children[0], signal.SIGKILL)
        self.hang.release.set()

        deadline = time.monotonic() + 90
        answer = client.get_call(op)
        while answer.state == "reconciling" and time.monotonic() < deadline:
            time.sleep(0.5)
            answer = client.get_call(op)
        assert (answer.state, answer.reason) == ("succeeded", "reconciled_applied")
        assert self.hang.lookups >= 2  # the task ran again after its worker died
        assert _children(self.worker.pid) and children[0] not in _children(self.worker.pid)
        assert len(self.sim.writes) == 1

        again = client.run(
            "openai",
            as_openai("create_follow_up", args, "call_2"),
            follow_up_tool(sim_http),
            request_id="req-worker",
        )
        assert again.status == "receipt" and again.executions == 0
        assert len(self.sim.writes) == 1
