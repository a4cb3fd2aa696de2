"""The async client, gated tools (``@client.tool``), the cause read from an exception and the
SQLite buffer across processes, against the scripted callgate of ``test_client``."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
from typing import Annotated

import httpx
from pydantic import Field

from callgate_sdk import (
    AsyncCallgateClient,
    CallNotAllowed,
    EventBuffer,
    ToolFailure,
    failure_cause,
    request_context,
)
from callgate_sdk.tools import parse_docstring
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


def make_async_client(fake: FakeCallgate, **kwargs) -> AsyncCallgateClient:
    async def no_sleep(seconds: float) -> None:
        return None

    defaults = dict(
        transport=fake.transport(),
        flush_interval=None,
        execute_timeout=None,
        rand=lambda a, b: b,
        answer_timeout=0,
        sleep=no_sleep,
    )
    defaults.update(kwargs)
    return AsyncCallgateClient("http://callgate.test", KEY, **defaults)


def script_success(fake: FakeCallgate) -> None:
    fake.gate.append(answer("allow"))
    fake.event_answers.append(
        answer("allow", state="succeeded", reason="ok", route="proceed", attempts=1)
    )


def comparable(requests: list) -> list:
    """Requests without what is fresh on every run (event IDs, times)."""
    volatile = {"event_id", "occurred_at"}
    out = []
    for method, path, body in requests:
        if path.startswith("/api/v1/events/"):
            path = "/api/v1/events/{id}"
        if isinstance(body, list):
            body = [{k: v for k, v in e.items() if k not in volatile} for e in body]
        elif isinstance(body, dict):
            body = {k: v for k, v in body.items() if k not in volatile}
        out.append((method, path, body))
    return out


class AsyncClientTests(SdkTestCase):
    def test_it_sends_what_the_sync_client_sends(self):
        sync_fake, async_fake = FakeCallgate(), FakeCallgate()
        script_success(sync_fake)
        script_success(async_fake)
        sync_result = make_client(sync_fake).run(
            "openai", OPENAI_CALL, Recorder({"id": "F-1"}), request_id="req-1"
        )

        async def main():
            client = make_async_client(async_fake)
            try:
                return await client.run(
                    "openai", OPENAI_CALL, Recorder({"id": "F-1"}), request_id="req-1"
                )
            finally:
                await client.aclose()

        async_result = asyncio.run(main())
        assert async_result.model_dump() == sync_result.model_dump()
        assert async_result.status == "succeeded" and async_result.executions == 1
        assert comparable(async_fake.requests) == comparable(sync_fake.requests)
        assert [p for _, p, _ in async_fake.requests] == [
            "/api/v1/calls",
            "/api/v1/events",
            "/api/v1/events/{id}".replace("{id}", async_fake.attempts()[0]["event_id"]),
        ]

    def test_a_timed_out_coroutine_is_cancelled_and_reported_once_as_unknown(self):
        fake = FakeCallgate()
        fake.gate.append(answer("allow"))
        fake.event_answers.append(
            answer("reconcile", state="outcome_unknown", reason="timeout", route="reconcile")
        )
        fake.polls.extend([answer("reconcile", state="outcome_unknown", route="reconcile")] * 5)
        runs, cancelled = [], []

        async def slow_write(arguments: dict, operation_id: str):
            runs.append(operation_id)
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                cancelled.append(operation_id)
                raise

        async def main():
            client = make_async_client(fake, execute_timeout=0.05)
            try:
                return await client.run(
                    "openai", OPENAI_CALL, slow_write, request_id="r", wait_limit=0
                )
            finally:
                await client.aclose()

        started = time.monotonic()
        result = asyncio.run(main())
        assert time.monotonic() - started < 2
        assert result.status == "waiting" and result.executions == 1
        assert runs == [OP] and cancelled == [OP]
        [attempt] = fake.attempts()
        assert attempt["outcome"] == "timeout" and attempt["sent"] is None
        assert attempt["error"] == "timed out after 0.05s"

    def test_events_stay_buffered_while_callgate_is_down_and_flush_later(self):
        fake = FakeCallgate()
        fake.down = True

        async def main():
            client = make_async_client(fake, buffer_dir=self.tmp)
            event = client.event("attempt", operation_id="op-1", sent=True, outcome="success")
            assert await client.report_now(event) is None
            assert len(client.buffer) == 1
            fake.down = False
            assert await client.flush() == 1
            await client.aclose()
            return event

        event = asyncio.run(main())
        assert list(fake.events) == [event["event_id"]]


class FollowUpTool:
    """Builds the gated tool of a test on a client, recording its executions."""

    def __init__(self, client, result=None, raises=None):
        self.calls: list[dict] = []

        @client.tool(
            effect="write",
            idempotent=True,
            reconcile="https://tickets.example/ops/{operation_id}",
            max_attempts=2,
        )
        def create_follow_up(
            ticket_id: Annotated[str, Field(pattern=r"^T-[0-9]+$")],
            operation_id: str,
            priority: int = 3,
        ) -> dict:
            """Create a follow-up task on a support ticket.

            Args:
                ticket_id: Support ticket id, e.g. T-1042.
                priority: 1 (urgent) to 5,
                    3 by default.
            """
            self.calls.append(
                {"ticket_id": ticket_id, "priority": priority, "operation_id": operation_id}
            )
            if raises is not None:
                raise raises
            return result if result is not None else {"id": "F-1"}

        self.tool = create_follow_up


class GatedToolTests(SdkTestCase):
    def test_it_registers_the_contract_from_the_signature_and_docstring_once(self):
        fake = FakeCallgate()
        script_success(fake)
        fake.gate.append(answer("return_receipt", state="succeeded", receipt={"id": "F-1"}))
        client = make_client(fake)
        tool = FollowUpTool(client).tool
        with request_context("req-1"):
            tool("T-1")
            tool("T-1")
        puts = [body for method, path, body in fake.requests if method == "PUT"]
        assert len(puts) == 1
        [contract] = puts
        assert contract["description"] == "Create a follow-up task on a support ticket."
        assert contract["effect"] == "write" and contract["idempotent"] is True
        assert contract["reconcilable"] is True
        assert contract["reconcile_url"] == "https://tickets.example/ops/{operation_id}"
        assert contract["max_attempts"] == 2
        schema = contract["parameters"]
        assert set(schema["properties"]) == {"ticket_id", "priority"}  # not operation_id
        assert schema["required"] == ["ticket_id"]
        assert schema["additionalProperties"] is False
        assert schema["properties"]["ticket_id"]["pattern"] == "^T-[0-9]+$"
        assert schema["properties"]["ticket_id"]["description"] == "Support ticket id, e.g. T-1042."
        assert schema["properties"]["priority"] == {
            "default": 3,
            "description": "1 (urgent) to 5, 3 by default.",
            "title": "Priority",
            "type": "integer",
        }

    def test_it_gates_executes_once_under_the_operation_id_and_reports(self):
        fake = FakeCallgate()
        script_success(fake)
        client = make_client(fake)
        follow_up = FollowUpTool(client)
        with request_context("req-1", conversation_id="conv-1"):
            assert follow_up.tool("T-1", priority=2) == {"id": "F-1"}
        [gate] = [body for _, path, body in fake.requests if path == "/api/v1/calls"]
        assert gate["format"] == "plain"
        assert gate["call"] == {
            "tool": "create_follow_up",
            "arguments": {"ticket_id": "T-1", "priority": 2},
        }
        assert gate["request_id"] == "req-1" and gate["conversation_id"] == "conv-1"
        assert follow_up.calls == [{"ticket_id": "T-1", "priority": 2, "operation_id": OP}]
        [attempt] = fake.attempts()
        assert attempt["outcome"] == "success" and attempt["result"] == {"id": "F-1"}
        assert attempt["operation_id"] == OP and attempt["request_id"] == "req-1"

    def test_a_duplicate_returns_the_receipt_without_executing(self):
        fake = FakeCallgate()
        fake.gate.append(
            answer(
                "return_receipt",
                state="succeeded",
                reason="duplicate_suppressed",
                route="return_receipt",
                receipt={"id": "F-0"},
            )
        )
        follow_up = FollowUpTool(make_client(fake))
        assert follow_up.tool("T-1") == {"id": "F-0"}
        assert follow_up.calls == []

    def test_a_refusal_raises_with_the_observation_without_executing(self):
        for verdict, status in [("reask", "reask"), ("deny", "denied"), ("stop", "stopped")]:
            with self.subTest(verdict):
                fake = FakeCallgate()
                fake.gate.append(
                    answer(verdict, state="rejected", reason="schema_violation", observation="$.x")
                )
                follow_up = FollowUpTool(make_client(fake))
                with self.assertRaises(CallNotAllowed) as raised:
                    follow_up.tool("nope")
                assert raised.exception.status == status
                assert raised.exception.observation == "$.x"
                assert raised.exception.reason == "schema_violation"
                assert follow_up.calls == []

    def test_it_waits_for_an_approval_then_executes(self):
        fake = FakeCallgate()
        fake.gate.append(answer("pending_approval", state="pending_approval", route="review"))
        fake.polls.extend(
            [
                answer("pending_approval", state="pending_approval", route="review"),
                answer("allow", state="allowed", decision={"decision": "approve"}),
            ]
        )
        fake.event_answers.append(answer("allow", state="succeeded", route="proceed"))
        sleeps: list[float] = []
        follow_up = FollowUpTool(make_client(fake, sleeps=sleeps, poll_interval=1))
        assert follow_up.tool("T-1") == {"id": "F-1"}
        assert len(follow_up.calls) == 1 and sleeps == [1, 2]

    def test_a_pending_approval_past_the_wait_limit_raises_without_executing(self):
        fake = FakeCallgate()
        fake.gate.append(answer("pending_approval", state="pending_approval", route="review"))
        follow_up = FollowUpTool(make_client(fake, wait_limit=0))
        with self.assertRaises(CallNotAllowed) as raised:
            follow_up.tool("T-1")
        assert raised.exception.status == "waiting" and follow_up.calls == []

    def test_it_reports_the_cause_read_from_the_exception(self):
        request = httpx.Request("POST", "https://tickets.example/follow-ups")
        cases = [
            (httpx.ConnectError("refused", request=request), "error", False, None),
            (httpx.ReadTimeout("slow", request=request), "timeout", None, None),
            (TimeoutError("slow"), "timeout", None, None),
            (ConnectionResetError("reset"), "connection_reset", None, None),
            (
                httpx.HTTPStatusError(
                    "409", request=request, response=httpx.Response(409, request=request)
                ),
                "error",
                True,
                409,
            ),
            (KeyError("due_at"), "error", True, None),
            (ToolFailure("gone", sent=False, http_status=503), "error", False, 503),
        ]
        for exc, outcome, sent, status in cases:
            with self.subTest(type(exc).__name__):
                fake = FakeCallgate()
                fake.gate.append(answer("allow"))
                fake.event_answers.append(answer("stop", state="failed", observation="gave up"))
                follow_up = FollowUpTool(make_client(fake), raises=exc)
                with self.assertRaises(CallNotAllowed):
                    follow_up.tool("T-1")
                [attempt] = fake.attempts()
                assert (attempt["outcome"], attempt["sent"], attempt["http_status"]) == (
                    outcome,
                    sent,
                    status,
                )
                assert failure_cause(exc)[:3] == (outcome, sent, status)

    def test_async_functions_and_the_async_client(self):
        fake = FakeCallgate()
        script_success(fake)
        script_success(fake)
        script_success(fake)
        executed = []

        async def main():
            client = make_async_client(fake)
            sync_client = make_client(fake)

            @client.tool(effect="read")
            async def lookup(ticket_id: str) -> dict:
                """Look a ticket up."""
                await asyncio.sleep(0)
                executed.append(("async", ticket_id))
                return {"ticket": ticket_id}

            @client.tool(effect="read")
            def lookup_sync(ticket_id: str) -> dict:
                """Look a ticket up (blocking)."""
                executed.append(("sync", ticket_id))
                return {"ticket": ticket_id}

            @sync_client.tool(effect="read")
            async def lookup_on_sync_client(ticket_id: str) -> dict:
                """Look a ticket up on the sync client."""
                executed.append(("async-on-sync", ticket_id))
                return {"ticket": ticket_id}

            with request_context("req-a"):
                results = [
                    await lookup("T-1"),
                    await lookup_sync("T-2"),
                    await lookup_on_sync_client("T-3"),
                ]
            await client.aclose()
            return results

        assert asyncio.run(main()) == [{"ticket": "T-1"}, {"ticket": "T-2"}, {"ticket": "T-3"}]
        assert executed == [("async", "T-1"), ("sync", "T-2"), ("async-on-sync", "T-3")]
        gates = [body for _, path, body in fake.requests if path == "/api/v1/calls"]
        assert [g["request_id"] for g in gates] == ["req-a"] * 3

    def test_a_signature_with_varargs_is_refused(self):
        client = make_client(FakeCallgate())
        with self.assertRaises(TypeError):

            @client.tool
            def bad(*tickets: str) -> None:
                """Nope."""

    def test_the_docstring_parser_reads_google_style(self):
        summary, params = parse_docstring(
            """Refund an order.

            Longer text.

            Args:
                order_id (str): The order.
                amount: In cents,
                    at most the order's total.

            Returns:
                The refund.
            """
        )
        assert summary == "Refund an order.\n\nLonger text."
        assert params == {
            "order_id": "The order.",
            "amount": "In cents, at most the order's total.",
        }


def _append_many(directory: str, start: int, count: int) -> None:
    buffer = EventBuffer(directory)
    for i in range(start, start + count):
        buffer.append([{"event_id": f"e{i}", "type": "attempt"}])
    buffer.close()


class SqliteBufferTests(SdkTestCase):
    def test_processes_appending_at_once_lose_nothing(self):
        context = multiprocessing.get_context("spawn")
        workers = [
            context.Process(target=_append_many, args=(str(self.tmp), n * 200, 200))
            for n in range(3)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
            assert worker.exitcode == 0
        buffer = EventBuffer(self.tmp)
        assert len(buffer) == 600
        rows = buffer.rows(1000)
        assert {e["event_id"] for _, e in rows} == {f"e{i}" for i in range(600)}
        for n in range(3):  # each process's events in its order
            mine = [
                e["event_id"] for _, e in rows if 200 * n <= int(e["event_id"][1:]) < 200 * (n + 1)
            ]
            assert mine == [f"e{i}" for i in range(200 * n, 200 * (n + 1))]
        buffer.remove([seq for seq, _ in rows[:100]])
        assert len(buffer) == 500 and len(EventBuffer(self.tmp)) == 500
        assert buffer.peek(1) == [rows[100][1]]

    def test_its_counts_follow_appends_and_removals(self):
        buffer = EventBuffer(self.tmp)
        buffer.append([{"event_id": "e1", "pad": "x"}, {"event_id": "e2", "pad": "yy"}])
        size = len('{"event_id":"e1","pad":"x"}') + len('{"event_id":"e2","pad":"yy"}')
        assert len(buffer) == 2 and buffer.size_bytes() == size
        [(first, _), (second, _)] = buffer.rows(10)
        buffer.remove([first, 12345])
        assert len(buffer) == 1 and buffer.size_bytes() == len('{"event_id":"e2","pad":"yy"}')
        buffer.remove([second])
        assert len(buffer) == 0 and buffer.size_bytes() == 0

    def test_fail_open_executes_under_the_operation_id_callgate_derives(self):
        fake = FakeCallgate()
        fake.down = True
        client = make_client(fake, fail_open=True)
        follow_up = FollowUpTool(client)
        with request_context("req-9"):
            assert follow_up.tool("T-1") == {"id": "F-1"}
        op = derive_operation_id(
            request_id="req-9", tool="create_follow_up", arguments={"ticket_id": "T-1"}
        )
        assert [c["operation_id"] for c in follow_up.calls] == [op]
        assert [e["type"] for e in client.buffer.peek(10)] == ["proposed", "attempt"]
        fake.down = False
        assert client.flush() == 2


class OfflineTests(SdkTestCase):
    def test_report_now_stops_trying_an_unreachable_callgate_for_a_while(self):
        fake = FakeCallgate()
        fake.down = True
        tries = []
        now = [0.0]

        def counting(request):
            tries.append(request.url.path)
            return fake.handle(request)

        client = make_client(
            fake, self.tmp, transport=httpx.MockTransport(counting), clock=lambda: now[0]
        )
        events = [client.event("attempt", operation_id=f"op-{i}") for i in range(50)]
        for event in events[:25]:
            assert client.report_now(event) is None
        assert tries == ["/api/v1/events"]  # once; then 1 s (rand -> its top) without trying
        now[0] = 1.0
        fake.down = False
        for event in events[25:]:
            client.report_now(event)
        assert len(client.buffer) == 0 and set(fake.events) == {e["event_id"] for e in events}
        posted = [
            e["event_id"] for _, p, body in fake.requests if p == "/api/v1/events" for e in body
        ]
        assert posted[:25] == [e["event_id"] for e in events[:25]]  # in order, before the rest


class ContractFieldTests(SdkTestCase):
    def test_contract_fields_the_client_does_not_name_are_sent_as_they_are(self):
        fake = FakeCallgate()
        client = make_client(fake)
        client.register_tool(
            "add_note", parameters={"type": "object"}, volatile_arguments=["/nonce"]
        )
        [(_, _, body)] = fake.requests
        assert body["volatile_arguments"] == ["/nonce"] and body["effect"] == "read"

    def test_a_whole_turn_is_checked_in_one_round_trip(self):
        seen = []

        def gate(request: httpx.Request) -> httpx.Response:
            seen.append(json.loads(request.content))
            return httpx.Response(
                200, json={"calls": [answer("allow", call_id="c1"), answer("reask", call_id="c2")]}
            )

        turn = {"role": "assistant", "tool_calls": [OPENAI_CALL, {**OPENAI_CALL, "id": "c2"}]}
        client = make_client(FakeCallgate(), transport=httpx.MockTransport(gate))
        with request_context("req-t"):
            answers = client.check_turn("openai", turn)
        assert [(a.verdict, a.model_extra["call_id"]) for a in answers] == [
            ("allow", "c1"),
            ("reask", "c2"),
        ]
        [body] = seen
        assert body["turn"] == turn and body["request_id"] == "req-t" and "call" not in body
