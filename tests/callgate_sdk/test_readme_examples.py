"""The README's "Use callgate from your agent" examples run as written (the blocks after
``<!-- example: NAME -->``), against a live callgate, with fake models and in-test tools in
place of the names an agent supplies (``model``, ``tickets``, ``add_note``, ...)."""

from __future__ import annotations

import ast
import asyncio
import os
import re
import tempfile
from pathlib import Path

from agents import set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call
from django.test import LiveServerTestCase
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from callgate.auth import api_key_issue
from callgate.models import Agent, Project, ToolCall
from callgate_sdk import current_operation_id

from .live import OwnPorts
from .support import graph_of

README = Path(__file__).resolve().parents[2] / "README.md"
NOTE = {"ticket_id": "T-1042", "note": "call back tomorrow"}


def example(name: str) -> str:
    text = README.read_text()
    found = re.search(rf"<!-- example: {re.escape(name)} -->\n```python\n(.*?)\n```", text, re.S)
    assert found, f"README has no example {name!r}"
    return found.group(1)


def run_example(source: str, namespace: dict) -> None:
    """Run the example (on an event loop when it awaits), then close the clients it made:
    an open keep-alive connection would keep a live-server thread and its database
    connection alive."""
    code = compile(source, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    outcome = eval(code, namespace)  # a coroutine when the example awaits
    if asyncio.iscoroutine(outcome):

        async def run_and_close():
            await outcome
            await namespace["gate"].client.aclose()

        asyncio.run(run_and_close())
    else:
        namespace["client"].close()


class ReadmeExampleTests(OwnPorts, LiveServerTestCase):
    def setUp(self):
        super().setUp()
        set_tracing_disabled(True)
        self.project = Project.objects.create(slug="acme", name="Acme")
        agent = Agent.objects.create(project=self.project, name="support-bot")
        self.executed: list[str | None] = []
        self.namespace = {
            "CALLGATE_URL": self.live_server_url,
            "API_KEY": api_key_issue(agent=agent).plain,
            "request_id": "req-readme",
        }
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        cwd = os.getcwd()
        os.chdir(tmp.name)  # the examples' buffer_dir is relative
        self.addCleanup(os.chdir, cwd)

    def assert_one_note(self) -> None:
        assert len(self.executed) == 1 and self.executed[0] is not None
        call = ToolCall.objects.get(project=self.project, tool_name="add_note")
        assert call.operation_id == self.executed[0] and call.request_id == "req-readme"
        assert call.state == ToolCall.State.SUCCEEDED and call.attempts == 1

    def test_the_decorator_example(self):
        executed, told = self.executed, []

        class Tickets:
            def add_note(self, ticket_id: str, note: str) -> dict:
                executed.append(current_operation_id())
                return {"note_id": "N-1"}

        self.namespace.update(tickets=Tickets(), tell_the_model=told.append)
        source = example("decorator")
        run_example(source, self.namespace)
        assert self.namespace["receipt"] == {"note_id": "N-1"} and told == []
        self.assert_one_note()
        # the same call again, under the same request: the receipt, no second execution
        run_example(source, self.namespace)
        assert self.namespace["receipt"] == {"note_id": "N-1"} and len(executed) == 1

    def test_the_openai_agents_example(self):
        executed = self.executed

        async def add_note(ticket_id: str, note: str) -> dict:
            """Add a note to a support ticket."""
            executed.append(current_operation_id())
            return {"note_id": "N-1"}

        model = ScriptedModel(
            [[function_call("add_note", NOTE, call_id="c1")], [assistant_message("Noted.")]]
        )
        self.namespace.update(model=model, add_note=add_note)
        run_example(example("openai-agents"), self.namespace)
        assert self.namespace["result"].final_output == "Noted."
        self.assert_one_note()

    def test_the_langchain_example(self):
        executed = self.executed

        @tool
        def add_note(ticket_id: str, note: str) -> dict:
            """Add a note to a support ticket."""
            executed.append(current_operation_id())
            return {"note_id": "N-1"}

        model = FakeMessagesListChatModel(
            responses=[
                AIMessage(content="", tool_calls=[{"name": "add_note", "args": NOTE, "id": "c1"}]),
                AIMessage(content="Noted."),
            ]
        )
        self.namespace.update(model=model, add_note_tool=add_note, build_agent_graph=graph_of)
        run_example(example("langchain"), self.namespace)
        assert self.namespace["state"]["messages"][-1].content == "Noted."
        self.assert_one_note()
