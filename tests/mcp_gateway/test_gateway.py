"""The MCP gateway end to end: a real MCP client → the gateway (real Streamable HTTP) → a
real upstream MCP server (a stdio subprocess), with callgate's gate in between."""

from __future__ import annotations

import json
import threading
import time

import anyio
import httpx
import pytest
from django.db import connection
from django.test import TransactionTestCase

from callgate.models import CallEvent, ToolCall, ToolContract
from callgate.services import call_apply_decision
from mcp_gateway.models import Upstream
from reviews.models import ReviewItem
from reviews.services import review_item_decide
from tests.factories import BaseTestCase
from tests.mcp_gateway.support import (
    HttpUpstream,
    RunningGateway,
    UpstreamLog,
    mcp_client,
    run,
    upstream_command,
)

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the gateway's threads need a shared database"
)


def text_of(result) -> str:
    return " ".join(part.text for part in result.content if part.type == "text")


class GatewayTestCase(TransactionTestCase):
    upstream_env: dict[str, str] = {}
    timeout = 10.0
    overrides: dict = {}

    def setUp(self):
        BaseTestCase.setUpTestData.__func__(type(self))
        self.log = UpstreamLog()
        command = upstream_command(UPSTREAM_LOG=self.log.path, **self.upstream_env)
        self.gateway = RunningGateway(
            project=self.project,
            upstreams={"desk": command},
            timeout=self.timeout,
            overrides=self.overrides,
        )

    def tearDown(self):
        self.gateway.stop()
        self.log.remove()

    def session(self, key=None, **kwargs):
        return mcp_client(self.gateway.url, key or self.key, **kwargs)


class GatewayToolsTests(GatewayTestCase):
    def test_tools_list_is_the_upstream_tools_registered_as_contracts(self):
        async def body():
            async with self.session() as session:
                return (await session.list_tools()).tools

        tools = {t.name: t for t in run(body)}
        self.assertEqual(
            set(tools),
            {"lookup_order", "create_ticket", "refund", "slow_write", "crash", "transfer"},
        )
        self.assertIn("order_id", tools["lookup_order"].inputSchema["properties"])
        contracts = {c.name: c for c in ToolContract.objects.filter(project=self.project)}
        self.assertEqual(contracts["lookup_order"].effect, "read")
        self.assertEqual(contracts["create_ticket"].effect, "write")
        self.assertFalse(contracts["create_ticket"].requires_approval)
        self.assertTrue(contracts["refund"].requires_approval)
        self.assertEqual(contracts["refund"].parameters["required"], ["order_id", "amount_cents"])

    def test_a_key_is_required_and_must_be_of_the_project(self):
        for headers in ({}, {"Authorization": f"Bearer {self.other_key}"}):
            response = httpx.post(
                self.gateway.url,
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={"Accept": "application/json, text/event-stream", **headers},
            )
            self.assertEqual(response.status_code, 401, headers)


class GatewayGateTests(GatewayTestCase):
    def test_a_bad_argument_is_an_error_result_naming_the_field_and_never_sent(self):
        async def body():
            async with self.session() as session:
                return await session.call_tool(
                    "create_ticket", {"subject": "Broken", "priority": "high"}
                )

        result = run(body)
        self.assertTrue(result.isError)
        self.assertIn("priority", text_of(result))
        self.assertEqual(self.log.calls("create_ticket"), [])
        call = ToolCall.objects.get(project=self.project, tool_name="create_ticket")
        self.assertEqual(call.route, "reask")
        self.assertEqual(call.attempts, 0)

    def test_the_same_write_twice_in_one_request_reaches_upstream_once(self):
        async def body():
            async with self.session() as session:
                args = {"subject": "Printer on fire", "priority": 3}
                first = await session.call_tool("create_ticket", args)
                second = await session.call_tool("create_ticket", args)
                return first, second

        first, second = run(body)
        self.assertFalse(first.isError)
        self.assertFalse(second.isError)
        self.assertEqual(json.loads(text_of(first))["subject"], "Printer on fire")
        self.assertEqual(text_of(second), text_of(first))
        self.assertEqual(second.meta["callgate/reason"], "duplicate_suppressed")
        sent = self.log.calls("create_ticket")
        self.assertEqual(len(sent), 1)
        call = ToolCall.objects.get(project=self.project, tool_name="create_ticket")
        self.assertEqual(sent[0]["operation_id"], call.operation_id)
        self.assertEqual(
            (call.state, call.attempts, call.duplicates_suppressed), ("succeeded", 1, 1)
        )

    def test_a_request_id_in_meta_spans_sessions_and_the_session_is_recorded(self):
        async def body():
            results = []
            for _ in range(2):
                async with self.session(name="claude-desktop") as session:
                    results.append(
                        await session.call_tool(
                            "lookup_order", {"order_id": "A-1"}, meta={"request_id": "req-42"}
                        )
                    )
            return results

        first, second = run(body)
        self.assertEqual(json.loads(text_of(first)), {"order_id": "A-1", "status": "shipped"})
        self.assertEqual(text_of(second), text_of(first))
        self.assertEqual(len(self.log.calls("lookup_order")), 1)
        call = ToolCall.objects.get(project=self.project, tool_name="lookup_order")
        self.assertEqual((call.request_id, call.provider_format), ("req-42", "mcp"))
        proposed = CallEvent.objects.filter(call=call, kind="proposed").first()
        meta = proposed.body["call"]["params"]["_meta"]
        self.assertEqual(meta["callgate/client"]["name"], "claude-desktop")
        self.assertTrue(meta["callgate/session_id"])


class GatewayRefusalTests(GatewayTestCase):
    overrides = {"refund": {"approval_timeout_seconds": 10}}

    def test_a_hallucinated_tool_is_an_error_result_listing_the_real_ones(self):
        async def body():
            async with self.session() as session:
                return await session.call_tool("delete_everything", {})

        result = run(body)
        self.assertTrue(result.isError)
        self.assertIn("create_ticket", text_of(result))
        self.assertEqual(result.meta["callgate/reason"], "unknown_tool")

    def test_an_approval_nobody_gives_expires_and_is_never_sent(self):
        async def body():
            async with self.session() as session:
                return await session.call_tool("refund", {"order_id": "A-9", "amount_cents": 5})

        result = run(body)
        self.assertTrue(result.isError)
        call = ToolCall.objects.get(project=self.project, tool_name="refund")
        self.assertEqual(call.reason, "approval_expired")
        self.assertEqual(result.meta["callgate/reason"], "approval_expired")
        self.assertEqual(self.log.calls("refund"), [])


class GatewayUpstreamErrorTests(GatewayTestCase):
    def test_a_json_rpc_error_is_reported_as_the_attempt_and_answered_as_is_error(self):
        async def body():
            async with self.session() as session:
                args = {"account": "ACC-1", "amount_cents": -5}
                return await session.call_tool("transfer", args)

        result = run(body)
        self.assertTrue(result.isError)
        self.assertEqual(len(self.log.calls("transfer")), 1)
        call = ToolCall.objects.get(project=self.project, tool_name="transfer")
        attempt = CallEvent.objects.get(call=call, kind="attempt")
        self.assertEqual(attempt.body["outcome"], "error")
        self.assertTrue(attempt.body["sent"])
        self.assertEqual(attempt.body["error"], "MCP error -32602: amount_cents must be positive")
        self.assertNotEqual(call.state, "succeeded")
        self.assertEqual(result.meta["callgate/reason"], call.reason)
        upstream = Upstream.objects.get(project=self.project, name="desk")
        self.assertIn("-32602", upstream.last_error)


class GatewayApprovalTests(GatewayTestCase):
    def test_a_rejected_approval_is_an_error_result_and_never_sent(self):
        outcome = {}

        async def body():
            async with self.session() as session:
                outcome["result"] = await session.call_tool(
                    "refund", {"order_id": "A-8", "amount_cents": 900}
                )

        thread = threading.Thread(target=run, args=(body,), daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        call = None
        while time.monotonic() < deadline and call is None:
            call = ToolCall.objects.filter(
                project=self.project, tool_name="refund", state="pending_approval"
            ).first()
            time.sleep(0.2)
        self.assertIsNotNone(call, "the refund never waited for approval")
        call_apply_decision(call=call, decision="reject", reason="Not this one", user=self.alice)
        thread.join(timeout=30)
        result = outcome["result"]
        self.assertTrue(result.isError)
        self.assertEqual(result.meta["callgate/state"], "rejected")
        self.assertEqual(self.log.calls("refund"), [])

    def test_an_approval_with_edits_sends_the_edited_arguments_under_the_new_operation(self):
        outcome = {}

        async def body():
            async with self.session() as session:
                outcome["result"] = await session.call_tool(
                    "refund", {"order_id": "A-7", "amount_cents": 900}
                )

        thread = threading.Thread(target=run, args=(body,), daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        item = None
        while time.monotonic() < deadline and item is None:
            item = (
                ReviewItem.objects.select_related("call__contract")
                .filter(project=self.project, call__tool_name="refund", status="open")
                .first()
            )
            time.sleep(0.2)
        self.assertIsNotNone(item, "the refund never waited for approval")
        proposed_op = item.call.operation_id
        review_item_decide(
            item=item,
            user=self.alice,
            decision="approve",
            arguments={"order_id": "A-7", "amount_cents": 500},
        )
        thread.join(timeout=30)
        result = outcome["result"]
        self.assertFalse(result.isError, text_of(result))
        call = ToolCall.objects.get(pk=item.call_id)
        self.assertEqual(call.proposed_operation_id, proposed_op)
        sent = self.log.calls("refund")
        self.assertEqual(len(sent), 1)
        self.assertEqual(sent[0]["arguments"], {"order_id": "A-7", "amount_cents": 500})
        self.assertEqual(result.meta["callgate/operation_id"], call.operation_id)
        self.assertEqual(call.state, "succeeded")


class GatewayTimeoutTests(GatewayTestCase):
    upstream_env = {"UPSTREAM_SLOW": "6"}
    timeout = 1.0

    def test_a_write_that_hangs_past_the_timeout_is_unknown_and_not_sent_again(self):
        async def body():
            async with self.session() as session:
                first = await session.call_tool("slow_write", {"note": "n1"})
                second = await session.call_tool("slow_write", {"note": "n1"})
                return first, second

        first, second = run(body)
        self.assertTrue(first.isError)
        self.assertTrue(second.isError)
        call = ToolCall.objects.get(project=self.project, tool_name="slow_write")
        # the outcome is unknown and the contract has no look-up: an operator reviews it
        self.assertEqual((call.reason, call.state), ("not_reconcilable", "in_review"))
        self.assertEqual(call.attempts, 1)
        self.assertEqual(len(self.log.calls("slow_write")), 1)
        attempt = CallEvent.objects.get(call=call, kind="attempt")
        self.assertEqual(attempt.body["outcome"], "timeout")


class GatewayStdioCrashTests(GatewayTestCase):
    upstream_env = {"UPSTREAM_SLOW": "4", "UPSTREAM_CRASH_AFTER": "0.5"}

    def test_a_crash_answers_every_pending_call_and_the_upstream_is_started_again(self):
        async def body():
            results = {}
            async with self.session() as session:

                async def call(tool, args):
                    results[tool] = await session.call_tool(tool, args)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(call, "slow_write", {"note": "pending"})
                    await anyio.sleep(0.2)
                    tg.start_soon(call, "crash", {"note": "boom"})
                results["again"] = await session.call_tool("crash", {"note": "boom"})
                results["after"] = await session.call_tool("lookup_order", {"order_id": "B-2"})
            return results

        results = run(body)
        for tool in ("slow_write", "crash", "again"):
            self.assertTrue(results[tool].isError, tool)
        self.assertFalse(results["after"].isError, results["after"])
        calls = {c.tool_name: c for c in ToolCall.objects.filter(project=self.project)}
        for tool in ("slow_write", "crash"):
            call = calls[tool]
            self.assertEqual((call.state, call.attempts), ("in_review", 1), tool)
            attempt = CallEvent.objects.get(call=call, kind="attempt")
            self.assertEqual(attempt.body["outcome"], "connection_reset")
            self.assertIsNone(attempt.body["sent"])
        self.assertEqual(calls["lookup_order"].state, "succeeded")
        # nothing was sent twice; the read went to a new process
        self.assertEqual(len(self.log.calls("slow_write")), 1)
        self.assertEqual(len(self.log.calls("crash")), 1)
        [read] = self.log.calls("lookup_order")
        self.assertNotEqual(read["pid"], self.log.calls("crash")[0]["pid"])
        # the gateway page's health: up again, with the crash as the last error
        upstream = Upstream.objects.get(project=self.project, name="desk")
        self.assertEqual(upstream.status, "up")
        self.assertIn("closed", upstream.last_error.lower())


class GatewayHttpUpstreamTests(TransactionTestCase):
    def setUp(self):
        BaseTestCase.setUpTestData.__func__(type(self))
        self.log = UpstreamLog()
        self.upstream = HttpUpstream(self.log)
        self.upstream.start()
        self.gateway = RunningGateway(
            project=self.project, upstreams={"shop": self.upstream.url}, timeout=5
        )

    def tearDown(self):
        self.gateway.stop()
        self.upstream.stop()
        self.log.remove()

    def test_an_upstream_that_goes_away_and_comes_back(self):
        async def body():
            results = {}
            async with mcp_client(self.gateway.url, self.key) as session:
                results["before"] = await session.call_tool("lookup_order", {"order_id": "C-1"})
                await anyio.to_thread.run_sync(self.upstream.stop)
                results["down"] = await session.call_tool(
                    "create_ticket", {"subject": "While down", "priority": 1}
                )
                await anyio.to_thread.run_sync(self.upstream.start)
                results["after"] = await session.call_tool("lookup_order", {"order_id": "C-2"})
            return results

        results = run(body)
        self.assertFalse(results["before"].isError)
        self.assertTrue(results["down"].isError)
        self.assertFalse(results["after"].isError, results["after"])
        self.assertEqual(self.log.calls("create_ticket"), [])
        down = ToolCall.objects.get(project=self.project, tool_name="create_ticket")
        # a refused connection is known never to have been sent: retried up to the contract's
        # attempts, each reported as not sent, then escalated; never an unknown outcome
        attempts = list(down.events.filter(kind="attempt").values_list("body", flat=True))
        self.assertEqual(len(attempts), down.attempts)
        self.assertGreaterEqual(len(attempts), 2)
        self.assertTrue(all(a["sent"] is False for a in attempts), attempts)
        self.assertEqual((down.state, down.reason), ("in_review", "retry_exhausted"))
        self.assertEqual(len(self.log.calls("lookup_order")), 2)


class GatewayDisconnectTests(GatewayTestCase):
    upstream_env = {"UPSTREAM_SLOW": "2"}

    def test_a_client_that_hangs_up_mid_call_still_gets_its_attempt_reported(self):
        async def body():
            async with self.session() as session:
                with anyio.move_on_after(0.7):
                    await session.call_tool("slow_write", {"note": "left early"})

        run(body)
        deadline = time.monotonic() + 15
        call = None
        while time.monotonic() < deadline:
            call = ToolCall.objects.filter(project=self.project, tool_name="slow_write").first()
            if call is not None and call.attempts:
                break
            time.sleep(0.2)
        self.assertEqual((call.state, call.attempts), ("succeeded", 1))
        self.assertEqual(len(self.log.calls("slow_write")), 1)

    def test_the_same_write_twice_at_once_reaches_upstream_once(self):
        async def body():
            results = []
            async with self.session() as session:

                async def call():
                    results.append(await session.call_tool("slow_write", {"note": "twice"}))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(call)
                    tg.start_soon(call)
            return results

        results = run(body)
        self.assertEqual([r.isError for r in results], [False, False])
        self.assertEqual(len(self.log.calls("slow_write")), 1)
        reasons = sorted(r.meta["callgate/reason"] for r in results)
        self.assertEqual(reasons, ["duplicate_suppressed", "ok"])


class GatewayTwoUpstreamsTests(TransactionTestCase):
    def setUp(self):
        BaseTestCase.setUpTestData.__func__(type(self))
        self.logs = {"desk": UpstreamLog(), "shop": UpstreamLog()}
        self.gateway = RunningGateway(
            project=self.project,
            upstreams={
                name: upstream_command(UPSTREAM_LOG=log.path) for name, log in self.logs.items()
            },
        )

    def tearDown(self):
        self.gateway.stop()
        for log in self.logs.values():
            log.remove()

    def test_clashing_tools_are_prefixed_and_go_to_their_own_upstream(self):
        async def body():
            async with mcp_client(self.gateway.url, self.key) as session:
                names = {t.name for t in (await session.list_tools()).tools}
                result = await session.call_tool(
                    "shop__create_ticket", {"subject": "Only the shop", "priority": 1}
                )
                return names, result

        names, result = run(body)
        self.assertIn("desk__create_ticket", names)
        self.assertIn("shop__create_ticket", names)
        self.assertNotIn("create_ticket", names)
        self.assertFalse(result.isError, result)
        self.assertEqual(len(self.logs["shop"].calls("create_ticket")), 1)
        self.assertEqual(self.logs["desk"].calls(), [])
        call = ToolCall.objects.get(project=self.project, tool_name="shop__create_ticket")
        self.assertEqual(call.state, "succeeded")
