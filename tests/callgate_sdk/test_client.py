"""The sync client (``callgate_sdk.CallgateClient``) against a scripted callgate behind ``httpx.MockTransport``.

These tests pin the SDK's protocol behaviour (what it sends, how it follows each route,
backoff, the breaker, the on-disk buffer) with no database; the end-to-end tests in
``test_e2e.py`` run the SDK against the real in-process callgate and simulator.
"""

from __future__ import annotations

import logging
import threading
import time

import httpx
from pydantic import BaseModel, Field

from callgate_sdk import (
    CallAnswer,
    CallgateClient,
    CallgateError,
    CallgateUnavailable,
    CircuitBreaker,
    EventBuffer,
    RetryPolicy,
    SelfCorrector,
    ToolFailure,
    backoff_delay,
)
from callgate_sdk._protocol import ToolInfo, local_operation_id
from callgate_sdk.providers import normalise
from callgate_sdk.wire import derive_operation_id

from .support import (
    KEY,
    OP,
    OPENAI_CALL,
    FakeCallgate,
    Recorder,
    SdkTestCase,
    answer,
    make_client,
)


class BackoffTests(SdkTestCase):
    def test_it_caps_full_jitter_exponentially(self):
        policy = RetryPolicy(initial_interval=1, backoff_coefficient=2, maximum_interval=5)
        highs = [backoff_delay(n, policy, rand=lambda a, b: b) for n in range(5)]
        assert highs == [1, 2, 4, 5, 5]
        lows = [backoff_delay(n, policy, rand=lambda a, b: a) for n in range(3)]
        assert lows == [0, 0, 0]

    def test_it_draws_within_the_cap(self):
        policy = RetryPolicy(initial_interval=0.5, backoff_coefficient=3, maximum_interval=10)
        for n in range(6):
            assert 0 <= backoff_delay(n, policy) <= min(10, 0.5 * 3**n)


class LocalOperationIdTests(SdkTestCase):
    CASES = [
        ("openai", OPENAI_CALL),
        (
            "openai_responses",
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "create_follow_up",
                "arguments": '{"ticket_id": "T-1"}',
            },
        ),
        (
            "anthropic",
            {
                "type": "tool_use",
                "id": "call_1",
                "name": "create_follow_up",
                "input": {"ticket_id": "T-1"},
            },
        ),
        ("gemini", {"functionCall": {"name": "create_follow_up", "args": {"ticket_id": "T-1"}}}),
        (
            "mcp",
            {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {"name": "create_follow_up", "arguments": {"ticket_id": "T-1"}},
            },
        ),
        ("plain", {"tool": "create_follow_up", "arguments": '{"ticket_id": "T-1"}'}),
    ]

    def test_a_fail_open_operation_id_depends_on_the_call_not_its_provider_format(self):
        ids = {fmt: local_operation_id("r1", normalise(fmt, call)) for fmt, call in self.CASES}
        assert set(ids.values()) == {
            derive_operation_id(
                request_id="r1", tool="create_follow_up", arguments={"ticket_id": "T-1"}
            )
        }, ids
        assert local_operation_id("r2", normalise(*self.CASES[0])) != ids["openai"]

    def test_without_a_request_id_each_call_gets_a_fresh_operation_id(self):
        proposal = normalise(*self.CASES[0])
        assert local_operation_id(None, proposal) != local_operation_id(None, proposal)


class CircuitBreakerTests(SdkTestCase):
    def test_it_opens_after_the_threshold_and_half_opens_after_the_cool_down(self):
        now = [0.0]
        breaker = CircuitBreaker(failure_threshold=2, cooldown=10, clock=lambda: now[0])
        assert breaker.allow()
        breaker.record_failure()
        assert breaker.state == "closed"
        breaker.record_failure()
        assert breaker.state == "open" and not breaker.allow()
        assert breaker.retry_after() == 10
        now[0] = 10
        assert breaker.state == "half_open"
        assert breaker.allow()  # the single trial
        assert not breaker.allow()  # no second trial at once
        breaker.record_failure()
        assert breaker.state == "open"
        now[0] = 25
        assert breaker.allow()
        breaker.record_success()
        assert breaker.state == "closed" and breaker.allow()


# --- contracts and the gate ---------------------------------------------------------


class FollowUp(BaseModel):
    ticket_id: str = Field(pattern=r"^T-[0-9]+$", description="Support ticket id, e.g. T-1042")
    assignee_id: str = Field(min_length=1, description="User id of the assignee")


class ContractTests(SdkTestCase):
    def test_it_registers_a_pydantic_model_as_json_schema(self):
        fake = FakeCallgate()
        client = make_client(fake)
        registration = client.register_tool(
            "create_follow_up",
            parameters=FollowUp,
            description="Create a follow-up",
            effect="write",
            idempotent=True,
            reconcilable=True,
            reconcile_url="http://sim/ops/{operation_id}",
            max_attempts=4,
            requires_approval=False,
            retry=RetryPolicy(
                initial_interval=0.5, backoff_coefficient=2, maximum_interval=8, deadline_seconds=60
            ),
        )
        method, path, body = fake.requests[0]
        assert (method, path) == ("PUT", "/api/v1/tools/create_follow_up")
        assert body["parameters"] == FollowUp.model_json_schema()
        assert (
            body["effect"] == "write"
            and body["idempotent"] is True
            and body["reconcilable"] is True
        )
        assert body["reconcile_url"] == "http://sim/ops/{operation_id}"
        assert body["max_attempts"] == 4
        assert body["retry"] == {
            "initial_interval": 0.5,
            "backoff_coefficient": 2.0,
            "maximum_interval": 8.0,
            "deadline_seconds": 60,
        }
        assert registration.version == 1 and registration.lint_score == 90
        assert registration.findings[0].path == "$.x"

    def test_it_sends_the_proposal_to_the_gate(self):
        fake = FakeCallgate()
        fake.gate.append(answer("allow"))
        client = make_client(fake)
        result = client.check("openai", OPENAI_CALL, request_id="req-1", operation_id="op-given")
        assert isinstance(result, CallAnswer) and result.verdict == "allow"
        _, path, body = fake.requests[0]
        assert path == "/api/v1/calls"
        assert body["format"] == "openai" and body["call"] == OPENAI_CALL
        assert body["request_id"] == "req-1" and body["operation_id"] == "op-given"
        assert "event_id" in body and body["occurred_at"].endswith("Z")

    def test_it_raises_unavailable_when_callgate_is_down_and_not_fail_open(self):
        fake = FakeCallgate()
        fake.down = True
        client = make_client(fake)
        with self.assertRaises(CallgateUnavailable):
            client.run("openai", OPENAI_CALL, Recorder(), request_id="r")


# --- run: the routes -------------------------------------------------------------------


class RunTests(SdkTestCase):
    def test_it_executes_an_allowed_call_once_and_reports_the_attempt(self):
        fake = FakeCallgate()
        fake.gate.append(answer("allow"))
        fake.event_answers.append(
            answer("allow", state="succeeded", reason="ok", route="proceed", attempts=1)
        )
        execute = Recorder({"id": "F-1"})
        client = make_client(fake)
        result = client.run("openai", OPENAI_CALL, execute, request_id="req-1")
        assert result.status == "succeeded" and result.ok
        assert result.result == {"id": "F-1"} and result.executions == 1
        assert execute.calls == [({"ticket_id": "T-1"}, OP)]
        [attempt] = fake.attempts()
        assert (
            attempt["operation_id"] == OP
            and attempt["outcome"] == "success"
            and attempt["sent"] is True
        )
        assert attempt["result"] == {"id": "F-1"} and attempt["request_id"] == "req-1"
        assert attempt["call_id"] == "call_1" and attempt["attempt"] == 1
        assert len(client.buffer) == 0

    def test_it_retries_under_the_same_operation_id_with_full_jitter_backoff(self):
        fake = FakeCallgate()
        fake.gate.append(answer("allow"))
        fake.event_answers.extend(
            [
                answer(
                    "retry", state="retry_wait", reason="unavailable", route="retry", attempts=1
                ),
                answer(
                    "retry", state="retry_wait", reason="unavailable", route="retry", attempts=2
                ),
                answer("allow", state="succeeded", reason="ok", route="proceed", attempts=3),
            ]
        )
        sleeps: list[float] = []
        client = make_client(fake, sleeps=sleeps)
        client.tools["create_follow_up"] = client.tools.get("create_follow_up") or ToolInfo(
            retry=RetryPolicy(initial_interval=1, backoff_coefficient=3, maximum_interval=2)
        )
        failure = ToolFailure("Service Unavailable", sent=True, http_status=503)
        execute = Recorder(failure, failure, {"id": "F-1"})
        result = client.run("openai", OPENAI_CALL, execute, request_id="r")
        assert result.status == "succeeded" and result.executions == 3
        assert {op for _, op in execute.calls} == {OP}
        assert sleeps == [1, 2]  # min(max_interval, initial * coef ** n), jitter drawn at the top
        assert [a["attempt"] for a in fake.attempts()] == [1, 2, 3]
        assert [a["http_status"] for a in fake.attempts()] == [503, 503, None]

    def test_it_waits_for_reconciliation_and_returns_the_receipt_without_retrying(self):
        fake = FakeCallgate()
        fake.gate.append(answer("allow"))
        fake.event_answers.append(
            answer(
                "reconcile",
                state="reconciling",
                reason="outcome_unknown",
                route="reconcile",
                attempts=1,
            )
        )
        fake.polls.extend(
            [
                answer(
                    "reconcile",
                    state="reconciling",
                    reason="outcome_unknown",
                    route="reconcile",
                    attempts=1,
                ),
                answer(
                    "return_receipt",
                    state="succeeded",
                    reason="reconciled_applied",
                    route="return_receipt",
                    receipt={"id": "F-9"},
                    attempts=1,
                ),
            ]
        )
        sleeps: list[float] = []
        execute = Recorder(ToolFailure("ReadTimeout", sent=True, outcome="timeout"))
        client = make_client(fake, sleeps=sleeps, poll_interval=1, max_poll_interval=3)
        result = client.run("openai", OPENAI_CALL, execute, request_id="r")
        assert result.status == "receipt" and result.result == {"id": "F-9"}
        assert result.reason == "reconciled_applied"
        assert len(execute.calls) == 1
        assert sleeps == [1, 2]  # polling backs off
        assert [r[1] for r in fake.requests if r[0] == "GET" and "/calls/" in r[1]] == [
            f"/api/v1/calls/{OP}"
        ] * 2

    def test_it_retries_once_under_the_same_operation_id_when_reconciliation_found_nothing(self):
        fake = FakeCallgate()
        fake.gate.append(answer("allow"))
        fake.event_answers.extend(
            [
                answer(
                    "reconcile",
                    state="reconciling",
                    reason="outcome_unknown",
                    route="reconcile",
                    attempts=1,
                ),
                answer("allow", state="succeeded", reason="ok", route="proceed", attempts=2),
            ]
        )
        fake.polls.append(
            answer(
                "retry", state="retry_wait", reason="reconciled_absent", route="retry", attempts=1
            )
        )
        execute = Recorder(ToolFailure("ReadTimeout", sent=True, outcome="timeout"), {"id": "F-2"})
        client = make_client(fake)
        result = client.run("openai", OPENAI_CALL, execute, request_id="r")
        assert result.status == "succeeded" and result.result == {"id": "F-2"}
        assert [op for _, op in execute.calls] == [OP, OP]

    def test_it_stops_when_the_wait_limit_passes(self):
        fake = FakeCallgate()
        fake.gate.append(
            answer("review", state="in_review", reason="not_reconcilable", route="review")
        )
        fake.polls.extend([answer("review", state="in_review", route="review")] * 10)
        now = [0.0]
        client = make_client(
            fake,
            clock=lambda: now[0],
            poll_interval=2,
            max_poll_interval=2,
            sleep=lambda s: now.__setitem__(0, now[0] + s),
        )
        execute = Recorder()
        result = client.run("openai", OPENAI_CALL, execute, request_id="r", wait_limit=5)
        assert result.status == "waiting" and result.executions == 0
        assert now[0] == 5

    def test_it_executes_after_an_approval_and_not_after_a_rejection(self):
        fake = FakeCallgate()
        fake.gate.append(
            answer(
                "pending_approval",
                state="pending_approval",
                reason="approval_pending",
                route="review",
            )
        )
        fake.polls.append(answer("allow", state="allowed", decision={"decision": "approve"}))
        fake.event_answers.append(answer("allow", state="succeeded", reason="ok", route="proceed"))
        execute = Recorder({"payout_id": "P-1"})
        result = make_client(fake).run("openai", OPENAI_CALL, execute, request_id="r")
        assert result.status == "succeeded" and len(execute.calls) == 1

        fake.gate.append(answer("pending_approval", state="pending_approval", route="review"))
        fake.polls.append(
            answer(
                "deny",
                state="rejected",
                reason="approval_rejected",
                route="deny",
                observation="rejected: amount too high",
            )
        )
        execute = Recorder()
        result = make_client(fake).run("openai", OPENAI_CALL, execute, request_id="r2")
        assert result.status == "denied" and result.observation == "rejected: amount too high"
        assert execute.calls == []

    def test_it_never_executes_an_approval_whose_edit_moved_a_hidden_value(self):
        fake = FakeCallgate()
        fake.gate.append(answer("pending_approval", state="pending_approval", route="review"))
        moved = {"payments": [{"to": "ben", "card_number": "•••"}]}  # ann's entry removed
        fake.polls.append(
            answer(
                "allow",
                state="allowed",
                decision={"decision": "approve", "arguments": moved},
            )
        )
        execute = Recorder()
        proposed = {
            "payments": [
                {"to": "ann", "card_number": "4111-ANN"},
                {"to": "ben", "card_number": "4222-BEN"},
            ]
        }
        call = {"tool": "pay_many", "arguments": proposed}
        result = make_client(fake).run("plain", call, execute, request_id="r")
        assert result.status == "stopped" and execute.calls == []
        assert "$.payments" in result.observation and "hidden value" in result.observation

    def test_it_returns_the_observation_without_executing(self):
        for verdict, status in [("reask", "reask"), ("deny", "denied"), ("stop", "stopped")]:
            with self.subTest(verdict):
                fake = FakeCallgate()
                fake.gate.append(
                    answer(verdict, state="rejected", observation="create_follow_up: $.due_at …")
                )
                execute = Recorder()
                result = make_client(fake).run("openai", OPENAI_CALL, execute, request_id="r")
                assert (
                    result.status == status and result.observation == "create_follow_up: $.due_at …"
                )
                assert execute.calls == []

    def test_it_returns_the_stored_receipt_without_executing(self):
        fake = FakeCallgate()
        fake.gate.append(
            answer(
                "return_receipt",
                state="succeeded",
                reason="duplicate_suppressed",
                route="return_receipt",
                receipt={"id": "F-1"},
            )
        )
        execute = Recorder()
        result = make_client(fake).run("openai", OPENAI_CALL, execute, request_id="r")
        assert result.status == "receipt" and result.result == {"id": "F-1"} and execute.calls == []

    def test_it_reports_a_timeout_as_unknown_sent(self):
        fake = FakeCallgate()
        fake.gate.append(answer("allow"))
        fake.event_answers.append(answer("reconcile", state="reconciling", route="reconcile"))
        fake.polls.append(answer("return_receipt", state="succeeded", receipt={"id": "F-1"}))
        release = threading.Event()

        def slow(arguments, operation_id):
            release.wait(5)
            return {"id": "late"}

        client = make_client(fake)
        result = client.run("openai", OPENAI_CALL, slow, request_id="r", timeout=0.05)
        release.set()
        [attempt] = fake.attempts()
        assert attempt["outcome"] == "timeout" and attempt["sent"] is None
        assert result.status == "receipt"

    def test_it_reports_an_exception_in_the_tool_as_a_tool_error(self):
        fake = FakeCallgate()
        fake.gate.append(answer("allow"))
        fake.event_answers.append(
            answer("reask", state="failed", reason="tool_error", observation="fix it")
        )
        result = make_client(fake).run(
            "openai", OPENAI_CALL, Recorder(ZeroDivisionError("boom")), request_id="r"
        )
        [attempt] = fake.attempts()
        assert attempt["outcome"] == "error" and attempt["error"] == "ZeroDivisionError: boom"
        assert result.status == "reask"


class ReportNowTests(SdkTestCase):
    def test_it_polls_the_event_until_callgate_has_applied_it(self):
        fake = FakeCallgate()
        fake.event_answers.append(
            answer("retry", state="retry_wait", reason="unavailable", route="retry")
        )
        fake.pending_reads = 3
        now = [0.0]
        sleeps: list[float] = []
        client = make_client(
            fake,
            answer_timeout=10,
            clock=lambda: now[0],
            sleep=lambda s: (sleeps.append(s), now.__setitem__(0, now[0] + s)),
        )
        got = client.report_now(
            client.event("attempt", operation_id=OP, sent=True, outcome="error", http_status=503)
        )
        assert got is not None and got.verdict == "retry" and got.reason == "unavailable"
        assert sleeps == [0.05, 0.1, 0.2]
        assert [m for m, p, _ in fake.requests if p.startswith("/api/v1/events/")] == ["GET"] * 4

    def test_it_gives_up_after_the_answer_timeout_and_decides_locally(self):
        fake = FakeCallgate()
        now = [0.0]
        client = make_client(
            fake,
            answer_timeout=1,
            clock=lambda: now[0],
            sleep=lambda s: now.__setitem__(0, now[0] + s),
        )
        assert (
            client.report_now(
                client.event("attempt", operation_id=OP, sent=True, outcome="success")
            )
            is None
        )
        assert now[0] == 1.0
        assert len(client.buffer) == 0  # stored by callgate: nothing to re-send

    def test_it_raises_when_callgate_rejects_the_event_on_applying_it(self):
        fake = FakeCallgate()
        original = fake.handle

        def rejecting(request: httpx.Request) -> httpx.Response:
            response = original(request)
            if request.method == "GET" and request.url.path.startswith("/api/v1/events/"):
                return httpx.Response(
                    200,
                    json={
                        **response.json(),
                        "status": "rejected",
                        "errors": [
                            {
                                "loc": "operation_id",
                                "msg": "no call with operation_id 'op-1' in this project",
                            }
                        ],
                    },
                )
            return response

        fake.handle = rejecting
        client = make_client(fake)
        with self.assertRaises(CallgateError) as raised:
            client.report_now(
                client.event("attempt", operation_id=OP, sent=True, outcome="success")
            )
        assert raised.exception.errors[0]["loc"] == "operation_id"


class CircuitOpenRunTests(SdkTestCase):
    def test_it_reports_circuit_open_without_executing(self):
        fake = FakeCallgate()
        fake.gate.append(answer("allow"))
        fake.event_answers.append(answer("stop", state="failed", reason="retry_exhausted"))
        client = make_client(fake, breaker_threshold=1, breaker_cooldown=60)
        client.breaker("create_follow_up").record_failure()
        execute = Recorder()
        result = client.run("openai", OPENAI_CALL, execute, request_id="r")
        [attempt] = fake.attempts()
        assert attempt["outcome"] == "circuit_open" and attempt["sent"] is False
        assert execute.calls == [] and result.status == "stopped"

    def test_it_opens_the_breaker_on_repeated_unavailability(self):
        fake = FakeCallgate()
        fake.gate.append(answer("allow"))
        fake.event_answers.extend(
            [answer("retry", state="retry_wait")] * 2 + [answer("stop", state="failed")]
        )
        client = make_client(fake, breaker_threshold=2, breaker_cooldown=60)
        failure = ToolFailure("connection refused", sent=False)
        execute = Recorder(failure, failure)
        client.run("openai", OPENAI_CALL, execute, request_id="r")
        assert [a["outcome"] for a in fake.attempts()] == ["error", "error", "circuit_open"]
        assert len(execute.calls) == 2
        assert client.breaker("create_follow_up").state == "open"


class SelfCorrectorTests(SdkTestCase):
    def test_it_hands_the_observation_back_until_the_call_is_valid(self):
        fake = FakeCallgate()
        fake.gate.extend(
            [
                answer(
                    "reask",
                    state="rejected",
                    reason="type_mismatch",
                    observation="num must be an integer",
                ),
                answer("allow"),
            ]
        )
        fake.event_answers.append(answer("allow", state="succeeded", reason="ok"))
        seen: list[str] = []

        def model_fn(observation):
            seen.append(observation)
            return "plain", {"tool": "create_follow_up", "arguments": {"ticket_id": "T-1"}}

        corrector = SelfCorrector(make_client(fake), model_fn, max_reasks=2)
        result = corrector.run("openai", OPENAI_CALL, Recorder({"id": "F-1"}), request_id="r")
        assert result.status == "succeeded" and corrector.reasks == 1
        assert seen == ["num must be an integer"]

    def test_it_stops_at_route_stop(self):
        fake = FakeCallgate()
        fake.gate.extend(
            [
                answer("reask", state="rejected", observation="bad 1"),
                answer("reask", state="rejected", observation="bad 2"),
                answer("stop", state="rejected", reason="reask_exhausted", observation="giving up"),
            ]
        )
        corrector = SelfCorrector(
            make_client(fake), lambda obs: ("plain", {"tool": "x", "arguments": {}}), max_reasks=5
        )
        result = corrector.run("openai", OPENAI_CALL, Recorder(), request_id="r")
        assert (
            result.status == "stopped"
            and result.reason == "reask_exhausted"
            and corrector.reasks == 2
        )
        assert fake.requests[-1][2]["format"] == "plain"

    def test_it_stops_at_its_own_budget(self):
        fake = FakeCallgate()
        fake.gate.extend([answer("reask", state="rejected", observation="bad")] * 3)
        corrector = SelfCorrector(make_client(fake), lambda obs: OPENAI_CALL, max_reasks=1)
        result = corrector.run("openai", OPENAI_CALL, Recorder(), request_id="r")
        assert result.status == "reask" and corrector.reasks == 1


# --- reporting: batches, the on-disk buffer ----------------------------------------------


class BufferTests(SdkTestCase):
    def test_it_keeps_events_on_disk_while_callgate_is_down_and_sends_them_later_once(self):
        fake = FakeCallgate()
        fake.down = True
        client = make_client(fake, self.tmp, batch_size=2)
        events = [
            client.event("attempt", operation_id=f"op-{i}", sent=True, outcome="success")
            for i in range(5)
        ]
        for event in events:
            client.report(event)
        assert client.flush() == 0
        assert len(client.buffer) == 5
        client.close()
        # a new process (new client, same directory) delivers them
        fake.down = False
        client2 = make_client(fake, self.tmp, batch_size=2)
        assert client2.flush() == 5
        assert set(fake.events) == {e["event_id"] for e in events}
        assert fake.event_posts == 3  # batches of 2, 2, 1
        assert len(client2.buffer) == 0
        client2.close()
        assert len(EventBuffer(self.tmp)) == 0  # the file on disk is empty too

    def test_it_re_sends_safely_when_the_answer_was_lost(self):
        fake = FakeCallgate()
        lose_next = [True]
        inner = fake.handle

        def lossy(request):
            response = inner(request)
            if lose_next[0] and request.url.path == "/api/v1/events":
                lose_next[0] = False
                raise httpx.ReadTimeout("answer lost", request=request)
            return response

        client = CallgateClient(
            "http://callgate.test",
            KEY,
            transport=httpx.MockTransport(lossy),
            flush_interval=None,
            buffer_dir=self.tmp,
        )
        event = client.event("attempt", operation_id="op-1", sent=True, outcome="success")
        client.report(event)
        assert client.flush() == 0 and len(client.buffer) == 1
        assert client.flush() == 1 and len(client.buffer) == 0
        assert list(fake.events) == [event["event_id"]]  # stored once

    def test_it_drops_rejected_items_of_a_partial_answer(self):
        fake = FakeCallgate()
        client = make_client(fake)
        good = client.event("attempt", operation_id="op-1", sent=True, outcome="success")
        bad = client.event("attempt", operation_id="op-2", sent=True, outcome="success")
        fake.reject_ids.add(bad["event_id"])
        client.report(good)
        client.report(bad)
        with self.assertLogs("callgate_sdk", logging.ERROR) as logs:
            assert client.flush() == 1
        assert len(client.buffer) == 0
        assert bad["event_id"] in "\n".join(logs.output)
        assert fake.event_posts == 1  # not retried forever

    def test_it_keeps_events_on_5xx(self):
        fake = FakeCallgate()
        fake.status_override = 503
        client = make_client(fake)
        client.report(client.event("attempt", operation_id="op-1", sent=True, outcome="success"))
        assert client.flush() == 0 and len(client.buffer) == 1
        fake.status_override = None
        assert client.flush() == 1

    def test_it_drops_the_oldest_events_with_a_warning_when_full(self):
        buffer = EventBuffer(self.tmp, max_bytes=400)
        events = [{"event_id": f"e{i}", "pad": "x" * 80} for i in range(8)]
        with self.assertLogs("callgate_sdk", logging.WARNING) as logs:
            for event in events:
                buffer.append([event])
        kept = [e["event_id"] for e in buffer.peek(100)]
        assert kept == [f"e{i}" for i in range(8)][-len(kept) :]
        assert buffer.size_bytes() <= 400 and buffer.dropped == 8 - len(kept)
        assert "dropped" in "\n".join(logs.output)

    def test_it_flushes_in_the_background(self):
        fake = FakeCallgate()
        client = make_client(fake, self.tmp, flush_interval=0.05, batch_size=10)
        try:
            event = client.event("attempt", operation_id="op-1", sent=True, outcome="success")
            client.report(event)
            deadline = time.monotonic() + 5
            while event["event_id"] not in fake.events and time.monotonic() < deadline:
                time.sleep(0.01)
            assert event["event_id"] in fake.events
        finally:
            client.close()

    def test_it_keeps_event_order_behind_buffered_events(self):
        fake = FakeCallgate()
        fake.gate.append(answer("allow"))
        client = make_client(fake, self.tmp, fail_open=True)
        fake.down = True
        earlier = client.event("attempt", operation_id="op-0", sent=True, outcome="success")
        client.report(earlier)
        fake.down = False
        # the flush before the synchronous report sends the earlier event first
        fake.event_answers.append(answer("allow", state="succeeded"))
        client.run("openai", OPENAI_CALL, Recorder({"id": 1}), request_id="r")
        posted = [
            e["event_id"] for _, p, body in fake.requests if p == "/api/v1/events" for e in body
        ]
        assert posted[0] == earlier["event_id"]


class FailOpenTests(SdkTestCase):
    def test_it_executes_unchecked_and_buffers_the_proposal_and_attempt(self):
        fake = FakeCallgate()
        fake.down = True
        client = make_client(fake, self.tmp, fail_open=True)
        execute = Recorder({"id": "F-1"})
        result = client.run("openai", OPENAI_CALL, execute, request_id="req-9")
        assert result.status == "succeeded" and result.answer is None
        op = derive_operation_id(
            request_id="req-9", tool="create_follow_up", arguments={"ticket_id": "T-1"}
        )
        assert execute.calls == [({"ticket_id": "T-1"}, op)]
        buffered = client.buffer.peek(10)
        assert [e["type"] for e in buffered] == ["proposed", "attempt"]
        assert {e["operation_id"] for e in buffered} == {op}
        fake.down = False
        assert client.flush() == 2

    def test_it_never_retries_a_write_with_an_unknown_outcome(self):
        fake = FakeCallgate()
        fake.down = True
        client = make_client(fake, self.tmp, fail_open=True)
        execute = Recorder(
            ToolFailure("ReadTimeout", sent=True, outcome="timeout"), {"id": "never"}
        )
        result = client.run("openai", OPENAI_CALL, execute, request_id="r")
        assert result.status == "outcome_unknown" and len(execute.calls) == 1

    def test_it_retries_a_failure_before_send_locally(self):
        fake = FakeCallgate()
        fake.down = True
        sleeps: list[float] = []
        client = make_client(fake, self.tmp, fail_open=True, sleeps=sleeps)
        execute = Recorder(ToolFailure("refused", sent=False), {"id": "F-1"})
        result = client.run("openai", OPENAI_CALL, execute, request_id="r")
        assert result.status == "succeeded" and len(execute.calls) == 2
        assert len(sleeps) == 1
        assert len({op for _, op in execute.calls}) == 1
