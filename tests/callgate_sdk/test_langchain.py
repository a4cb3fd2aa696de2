"""The LangChain adapter with the real langchain-core and LangGraph: a ``ToolNode`` of gated
tools driven by langchain-core's fake chat model (``FakeMessagesListChatModel``: scripted
tool calls, no network), against the in-process callgate: a re-asked bad call, a duplicate
write answered with the receipt, a parallel turn, an approval decided by an operator; and the
callback handler reporting a tool that is not gated."""

from __future__ import annotations

import re
import threading
from typing import Annotated

import httpx
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, connection
from django.http import HttpRequest
from django.test import Client, TransactionTestCase
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import Field

from callgate.auth import api_key_issue
from callgate.models import Agent, Membership, Project, ToolCall
from callgate.taxonomy import Reason
from callgate_sdk import CallgateClient, current_operation_id, request_context
from callgate_sdk.integrations.langchain import CallgateCallbackHandler, gate_tool
from demo.fleet import callgate_transport
from reviews.models import ReviewItem
from reviews.services import review_item_decide
from tests.factories import PASSWORD, make_user

from .support import graph_of

GOOD = {"ticket_id": "T-1042", "note": "call back tomorrow"}
BAD = {"ticket_id": "1042", "note": "call back tomorrow"}


def ask(*calls: tuple[str, dict, str]) -> AIMessage:
    return AIMessage(
        content="",
        tool_calls=[{"name": name, "args": args, "id": id_} for name, args, id_ in calls],
    )


class ThreadClosingTransport(httpx.BaseTransport):
    """The in-process callgate; a request served in a worker thread (ToolNode runs parallel
    calls in a thread pool) closes that thread's database connection after it."""

    def __init__(self, inner: httpx.BaseTransport):
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = self.inner.handle_request(request)
            response.read()
            return response
        finally:
            if threading.current_thread() is not threading.main_thread():
                connection.close()


class LangChainTests(TransactionTestCase):
    def setUp(self):
        super().setUp()
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        self.addCleanup(request_started.connect, close_old_connections)
        self.addCleanup(request_finished.connect, close_old_connections)
        self.project = Project.objects.create(slug="acme", name="Acme")
        agent = Agent.objects.create(project=self.project, name="support-bot")
        self.key = api_key_issue(agent=agent).plain
        self.operator = make_user("ana")
        Membership.objects.create(
            user=self.operator, project=self.project, role=Membership.Role.OPERATOR
        )
        self.executed: list[tuple[str, str | None]] = []

    def make_client(self, **options) -> CallgateClient:
        defaults = dict(
            transport=ThreadClosingTransport(callgate_transport()),
            flush_interval=None,
            execute_timeout=None,
            poll_interval=0.01,
            wait_limit=2,
        )
        defaults.update(options)
        client = CallgateClient("http://localhost", self.key, **defaults)
        self.addCleanup(client.close, flush=False)
        return client

    def tools(self):
        executed = self.executed

        @tool
        def add_note(ticket_id: Annotated[str, Field(pattern=r"^T-[0-9]+$")], note: str) -> dict:
            """Add a note to a support ticket (ticket_id like T-1042)."""
            executed.append(("add_note", current_operation_id()))
            return {"note_id": f"N-{len(executed)}", "ticket_id": ticket_id}

        @tool
        def lookup_ticket(ticket_id: str) -> dict:
            """Look a support ticket up by its id (like T-1042)."""
            executed.append(("lookup_ticket", current_operation_id()))
            return {"ticket_id": ticket_id, "status": "open"}

        @tool
        def issue_refund(order_id: str, amount_cents: int) -> dict:
            """Refund an order (amount in cents)."""
            executed.append(("issue_refund", current_operation_id()))
            return {"refund_id": "R-1"}

        return add_note, lookup_ticket, issue_refund

    def page_text(self, path: str) -> str:
        browser = Client()
        assert browser.login(request=HttpRequest(), username="ana", password=PASSWORD)  # axes
        response = browser.get(path)
        assert response.status_code == 200, response.status_code
        return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode()))

    def test_a_tool_node_gets_gated_calls(self):
        client = self.make_client()
        add_note, lookup_ticket, _ = self.tools()
        tools = [
            gate_tool(client, add_note, effect="write", idempotent=True),
            gate_tool(client, lookup_ticket, effect="read"),
        ]
        model = FakeMessagesListChatModel(
            responses=[
                ask(("add_note", BAD, "c1")),
                ask(("add_note", GOOD, "c2")),
                ask(
                    ("add_note", GOOD, "c3"),
                    ("lookup_ticket", {"ticket_id": "T-1"}, "c4"),
                    ("lookup_ticket", {"ticket_id": "T-2"}, "c5"),
                ),
                AIMessage(content="Done."),
            ]
        )
        with request_context("req-1"):
            state = graph_of(model, tools).invoke({"messages": [HumanMessage("Note T-1042")]})
        assert state["messages"][-1].content == "Done."
        results = {m.tool_call_id: m for m in state["messages"] if isinstance(m, ToolMessage)}
        # the bad call: not run; the model reads callgate's observation
        assert results["c1"].status == "error"
        assert '"1042" violates pattern' in results["c1"].content, results["c1"].content
        # the write ran once; the repeat got the receipt; each lookup ran once
        assert sorted(name for name, _ in self.executed) == [
            "add_note",
            "lookup_ticket",
            "lookup_ticket",
        ]
        assert results["c2"].status == "success" and results["c3"].status == "success"
        assert '"note_id": "N-1"' in results["c3"].content.replace("'", '"')
        calls = {c.operation_id: c for c in ToolCall.objects.filter(project=self.project)}
        for _, op in self.executed:
            assert calls[op].state == ToolCall.State.SUCCEEDED and calls[op].attempts == 1
        note = calls[next(op for name, op in self.executed if name == "add_note")]
        assert note.request_id == "req-1"
        [rejected] = [c for c in calls.values() if c.state == ToolCall.State.REJECTED]
        page = self.page_text(f"/p/{self.project.slug}/calls/")
        assert (
            f"{Reason(rejected.reason).label} add_note support-bot {rejected.operation_id[:10]}…"
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

    def test_an_approval_is_decided_by_an_operator(self):
        decided: list[str] = []

        def sleep_and_decide(seconds: float) -> None:
            if not decided:
                item = ReviewItem.objects.get(call__tool_name="issue_refund")
                review_item_decide(item=item, user=self.operator, decision="approve")
                decided.append("approve")

        client = self.make_client(sleep=sleep_and_decide)
        *_, issue_refund = self.tools()
        gated = gate_tool(client, issue_refund, effect="write", requires_approval=True)
        model = FakeMessagesListChatModel(
            responses=[
                ask(("issue_refund", {"order_id": "O-7", "amount_cents": 1200}, "c1")),
                AIMessage(content="Refunded."),
            ]
        )
        with request_context("req-2"):
            state = graph_of(model, [gated]).invoke({"messages": [HumanMessage("Refund O-7")]})
        assert state["messages"][-1].content == "Refunded." and decided == ["approve"]
        assert [name for name, _ in self.executed] == ["issue_refund"]
        call = ToolCall.objects.get(project=self.project, tool_name="issue_refund")
        assert call.state == ToolCall.State.SUCCEEDED
        page = self.page_text(f"/p/{self.project.slug}/calls/{call.operation_id}/")
        assert "Decision · Operator Approved → Allowed Decision: Approved" in page

    def test_the_callback_handler_reports_tools_that_are_not_gated(self):
        client = self.make_client()
        _, lookup_ticket, _ = self.tools()

        @tool
        def broken(ticket_id: str) -> str:
            """Always fails."""
            raise ConnectionRefusedError("tickets API down")

        for observed in (lookup_ticket, broken):  # contracts, so callgate classifies the calls
            client.register_tool(
                observed.name,
                parameters=observed.tool_call_schema,
                description=observed.description,
                effect="read",
            )
        handler = CallgateCallbackHandler(client)
        gated = gate_tool(client, lookup_ticket, effect="read")
        with request_context("req-3"):
            assert lookup_ticket.invoke({"ticket_id": "T-9"}, {"callbacks": [handler]})
            try:
                broken.invoke({"ticket_id": "T-9"}, {"callbacks": [handler]})
            except ConnectionRefusedError:
                pass
            gated.invoke({"ticket_id": "T-8"}, {"callbacks": [handler]})  # reports itself
        client.flush()  # what the gated call's report did not send before its own event
        assert len(client.buffer) == 0
        calls = {c.tool_name: c for c in ToolCall.objects.filter(project=self.project)}
        assert set(calls) == {"lookup_ticket", "broken"}
        assert ToolCall.objects.filter(project=self.project, tool_name="lookup_ticket").count() == 2
        assert calls["broken"].state != ToolCall.State.SUCCEEDED
        assert calls["broken"].request_id == "req-3"
        last = calls["broken"].events.order_by("id").last()
        assert last.kind == "attempt", (last.kind, last.body)
        assert last.body["outcome"] == "error" and last.body["sent"] is False, last.body
