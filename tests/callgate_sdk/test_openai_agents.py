"""The OpenAI Agents SDK adapter with the real ``openai-agents`` package, its own scripted
model (``agents.testing.ScriptedModel``: no network) and a live callgate: a re-asked bad
call, a duplicate write answered with the receipt, a parallel turn, an approval decided by an
operator in callgate's review queue, and a timed-out write that never runs twice."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Annotated

from agents import Agent, RunConfig, Runner, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call
from django.db import connection
from django.http import HttpRequest
from django.test import LiveServerTestCase
from pydantic import Field

from callgate.auth import api_key_issue
from callgate.models import Agent as CallgateAgent
from callgate.models import Membership, Project, ToolCall
from callgate.taxonomy import Reason
from callgate_sdk import AsyncCallgateClient, current_operation_id, request_context
from callgate_sdk.integrations.openai_agents import CallgateGate
from reviews.models import ReviewItem
from reviews.services import review_item_decide
from tests.factories import PASSWORD, make_user

from .live import OwnPorts

GOOD = {"ticket_id": "T-1042", "note": "call back tomorrow"}
BAD = {"ticket_id": "1042", "note": "call back tomorrow"}


def tool_outputs(model: ScriptedModel, call_index: int) -> dict[str, str]:
    """The tool outputs (by call ID) the model was given on its ``call_index``-th call."""
    items = model.calls[call_index].input
    return {
        item["call_id"]: item["output"]
        for item in items
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


class OpenAIAgentsTests(OwnPorts, LiveServerTestCase):
    def setUp(self):
        super().setUp()
        set_tracing_disabled(True)
        self.project = Project.objects.create(slug="acme", name="Acme")
        agent = CallgateAgent.objects.create(project=self.project, name="support-bot")
        self.key = api_key_issue(agent=agent).plain
        self.operator = make_user("ana")
        Membership.objects.create(
            user=self.operator, project=self.project, role=Membership.Role.OPERATOR
        )
        self.executed: list[tuple[str, dict, str | None]] = []

    def make_client(self, **options) -> AsyncCallgateClient:
        defaults = dict(flush_interval=None, execute_timeout=5, poll_interval=0.05, wait_limit=2)
        defaults.update(options)
        return AsyncCallgateClient(self.live_server_url, self.key, **defaults)

    def tools(self, gate: CallgateGate, *, slow: float = 0.0):
        executed = self.executed

        async def add_note(
            ticket_id: Annotated[str, Field(pattern=r"^T-[0-9]+$")], note: str
        ) -> dict:
            """Add a note to a support ticket.

            Args:
                ticket_id: Ticket id, e.g. T-1042.
                note: The note's text.
            """
            executed.append(("add_note", {"ticket_id": ticket_id}, current_operation_id()))
            await asyncio.sleep(slow)
            return {"note_id": f"N-{len(executed)}", "ticket_id": ticket_id}

        async def lookup_ticket(ticket_id: str) -> dict:
            """Look a support ticket up.

            Args:
                ticket_id: Ticket id, e.g. T-1042.
            """
            executed.append(("lookup_ticket", {"ticket_id": ticket_id}, current_operation_id()))
            await asyncio.sleep(0.05)
            return {"ticket_id": ticket_id, "status": "open"}

        async def issue_refund(order_id: str, amount_cents: int) -> dict:
            """Refund an order.

            Args:
                order_id: Order id.
                amount_cents: Amount in cents.
            """
            executed.append(("issue_refund", {"order_id": order_id}, current_operation_id()))
            return {"refund_id": "R-1"}

        return [
            gate.function_tool(add_note, effect="write", idempotent=True),
            gate.function_tool(lookup_ticket, effect="read"),
            gate.function_tool(issue_refund, effect="write", requires_approval=True),
        ]

    def run_agent(self, model: ScriptedModel, client: AsyncCallgateClient, **gate_options):
        async def main():
            try:
                gate = CallgateGate(client, **gate_options)
                agent = Agent(
                    name="support", instructions="Help.", model=model, tools=self.tools(gate)
                )
                with request_context("req-1"):
                    return await Runner.run(
                        agent, "Note on T-1042", run_config=RunConfig(tracing_disabled=True)
                    )
            finally:
                await client.aclose()

        return asyncio.run(main())

    def test_a_bad_call_is_re_asked_a_duplicate_gets_the_receipt_a_parallel_turn_runs_once_each(
        self,
    ):
        model = ScriptedModel(
            [
                [function_call("add_note", BAD, call_id="c1")],
                [function_call("add_note", GOOD, call_id="c2")],
                [
                    function_call("add_note", GOOD, call_id="c3"),  # the model repeats itself
                    function_call("lookup_ticket", {"ticket_id": "T-1"}, call_id="c4"),
                    function_call("lookup_ticket", {"ticket_id": "T-2"}, call_id="c5"),
                ],
                [assistant_message("Done.")],
            ]
        )
        result = self.run_agent(model, self.make_client())
        assert result.final_output == "Done."
        # the re-ask: the function never ran, the model read callgate's observation
        reask = tool_outputs(model, 1)["c1"]
        assert "ticket_id" in reask and "T-" in reask, reask
        # one execution for the write (the repeat got the receipt) and one per lookup
        assert sorted(name for name, _, _ in self.executed) == [
            "add_note",
            "lookup_ticket",
            "lookup_ticket",
        ]
        outputs = tool_outputs(model, 3)
        assert json.loads(outputs["c3"]) == json.loads(outputs["c2"])
        assert json.loads(outputs["c2"])["note_id"] == "N-1"
        # each ran under its own operation ID, the one callgate stored
        calls = {c.operation_id: c for c in ToolCall.objects.filter(project=self.project)}
        for _, _, op in self.executed:
            assert calls[op].state == ToolCall.State.SUCCEEDED and calls[op].attempts == 1
        note = calls[self.executed[0][2]]
        assert note.request_id == "req-1"
        rejected = [c for c in calls.values() if c.state == ToolCall.State.REJECTED]
        assert [c.tool_name for c in rejected] == ["add_note"]
        # the calls page shows the re-asked call and the duplicate answered with the receipt
        page = self.page_text(f"/p/{self.project.slug}/calls/")
        assert (
            f"{Reason(rejected[0].reason).label} add_note support-bot {rejected[0].operation_id[:10]}…"
            in page
        )
        assert (
            f"{Reason.OK.label} add_note support-bot {note.operation_id[:10]}… Succeeded 1/3"
            in page
        )
        # the repeat is on the call's page: answered with the receipt, not executed again
        detail = self.page_text(f"/p/{self.project.slug}/calls/{note.operation_id}/")
        assert f"Proposed · Agent {Reason.DUPLICATE_SUPPRESSED.label}" in detail
        assert "Attempts 1 of 3 · 1 duplicate suppressed" in detail

    def test_an_approval_is_decided_by_an_operator_in_callgate(self):
        model = ScriptedModel(
            [
                [
                    function_call(
                        "issue_refund", {"order_id": "O-7", "amount_cents": 1200}, call_id="c1"
                    )
                ],
                [assistant_message("Refunded.")],
            ]
        )
        decided = []

        async def sleep_and_decide(seconds: float) -> None:
            if not decided:
                decided.append(await asyncio.to_thread(self.approve_waiting_call))
            await asyncio.sleep(seconds)

        result = self.run_agent(model, self.make_client(sleep=sleep_and_decide), approval_wait=5)
        assert result.final_output == "Refunded." and decided == ["approve"]
        assert [name for name, _, _ in self.executed] == ["issue_refund"]
        assert json.loads(tool_outputs(model, 1)["c1"]) == {"refund_id": "R-1"}
        call = ToolCall.objects.get(project=self.project, tool_name="issue_refund")
        assert call.state == ToolCall.State.SUCCEEDED
        item = ReviewItem.objects.get(call=call)
        assert item.resolved_by == self.operator and item.resolution == "approve"
        page = self.page_text(f"/p/{self.project.slug}/calls/{call.operation_id}/")
        assert Reason.APPROVAL_GRANTED.label in page
        assert "Decision · Operator Approved → Allowed Decision: Approved" in page

    def approve_waiting_call(self) -> str:
        """The operator approves in callgate's review queue (in a worker thread: its own
        database connection, closed after)."""
        try:
            item = ReviewItem.objects.get(
                call__project=self.project, call__tool_name="issue_refund"
            )
            review_item_decide(item=item, user=self.operator, decision="approve")
            return "approve"
        finally:
            connection.close()

    def test_a_timed_out_write_is_not_executed_twice(self):
        model = ScriptedModel(
            [
                [function_call("add_note", GOOD, call_id="c1")],
                [function_call("add_note", GOOD, call_id="c2")],  # "it timed out: try again"
                [assistant_message("I could not confirm the note.")],
            ]
        )
        client = self.make_client(execute_timeout=0.2, wait_limit=0.3)

        async def main():
            try:
                gate = CallgateGate(client)
                agent = Agent(
                    name="support",
                    instructions="Help.",
                    model=model,
                    tools=self.tools(gate, slow=2.0),
                )
                with request_context("req-1"):
                    return await Runner.run(
                        agent, "Note on T-1042", run_config=RunConfig(tracing_disabled=True)
                    )
            finally:
                await client.aclose()

        result = asyncio.run(main())
        assert result.final_output == "I could not confirm the note."
        assert [name for name, _, _ in self.executed] == ["add_note"]  # once, never again
        [call] = ToolCall.objects.filter(project=self.project, tool_name="add_note")
        assert call.state in (ToolCall.State.IN_REVIEW, ToolCall.State.RECONCILING), call.state
        assert call.attempts == 1
        first, second = tool_outputs(model, 1)["c1"], tool_outputs(model, 2)["c2"]
        assert first and second and "N-" not in second

    # ---------------------------------------------------------------- the calls page

    def page_text(self, path: str) -> str:
        """The page's text as an operator sees it (tags dropped, white space collapsed)."""
        from django.test import Client

        browser = Client()
        assert browser.login(request=HttpRequest(), username="ana", password=PASSWORD)  # axes
        response = browser.get(path)
        assert response.status_code == 200, response.status_code
        return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode()))
