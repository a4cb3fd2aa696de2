"""Fixtures shared by the SDK tests: a scripted callgate (``FakeCallgate``) and clients
onto it, and the smallest LangGraph agent."""

from __future__ import annotations

import json
import tempfile
from collections import deque
from pathlib import Path

import httpx
from django.test import SimpleTestCase
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from callgate_sdk import (
    CallgateClient,
)

KEY = "cg_0123abcd_" + "x" * 43
OP = "op-1"


def answer(verdict: str, state: str = "allowed", **fields) -> dict:
    base = {
        "operation_id": OP,
        "verdict": verdict,
        "state": state,
        "reason": None,
        "category": None,
        "route": None,
        "observation": "",
        "receipt": None,
        "attempts": 0,
        "max_attempts": 3,
        "retry_after": None,
        "decision": None,
    }
    return {**base, **fields}


class FakeCallgate:
    """A scripted callgate: queues of answers for the gate, attempts and polls; records requests."""

    def __init__(self):
        self.down = False
        self.gate: deque[dict] = deque()
        self.event_answers: deque[dict] = deque()  # answers for accepted attempts, in order
        self.applied: dict[
            str, dict
        ] = {}  # event_id -> its answer, read by GET /api/v1/events/{id}
        self.pending_reads = 0  # GET /api/v1/events/{id} answers "pending" this many times first
        self.polls: deque[dict] = deque()
        self.requests: list[tuple[str, str, object]] = []
        self.events: dict[str, dict] = {}  # stored once per event_id
        self.event_posts = 0
        self.reject_ids: set[str] = set()
        self.status_override: int | None = None

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if self.status_override:
            return httpx.Response(self.status_override, json={"error": "boom"})
        assert request.headers["Authorization"] == f"Bearer {KEY}"
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, body))
        path = request.url.path
        if request.method == "PUT" and path.startswith("/api/v1/tools/"):
            return httpx.Response(
                201,
                json={
                    "name": path.rsplit("/", 1)[1],
                    "version": 1,
                    "created": True,
                    "lint": {"score": 90, "findings": [{"path": "$.x", "message": "m"}]},
                },
            )
        if request.method == "POST" and path == "/api/v1/calls":
            return httpx.Response(200, json=self.gate.popleft())
        if request.method == "GET" and path.startswith("/api/v1/calls/"):
            return httpx.Response(200, json=self.polls.popleft())
        if request.method == "GET" and path.startswith("/api/v1/events/"):
            event_id = path.rsplit("/", 1)[1]
            if event_id not in self.events:
                return httpx.Response(404, json={"error": "Not found.", "errors": []})
            if self.pending_reads or event_id not in self.applied:
                self.pending_reads = max(0, self.pending_reads - 1)
                return httpx.Response(
                    200,
                    json={
                        "event_id": event_id,
                        "status": "pending",
                        "kind": "attempt",
                        "errors": [],
                        "answer": None,
                    },
                )
            return httpx.Response(
                200,
                json={
                    "event_id": event_id,
                    "status": "applied",
                    "kind": "attempt",
                    "errors": [],
                    "answer": self.applied[event_id],
                },
            )
        if request.method == "POST" and path == "/api/v1/events":
            self.event_posts += 1
            results, partial = [], False
            for index, event in enumerate(body if isinstance(body, list) else [body]):
                if event["event_id"] in self.reject_ids:
                    partial = True
                    results.append(
                        {
                            "index": index,
                            "event_id": event["event_id"],
                            "status": "rejected",
                            "errors": [{"loc": "type", "msg": "bad"}],
                        }
                    )
                    continue
                status = "duplicate" if event["event_id"] in self.events else "accepted"
                self.events.setdefault(event["event_id"], event)
                if event["type"] == "attempt" and self.event_answers and status == "accepted":
                    self.applied[event["event_id"]] = self.event_answers.popleft()
                results.append(
                    {"index": index, "event_id": event["event_id"], "status": status, "errors": []}
                )
            return httpx.Response(207 if partial else 200, json={"results": results})
        return httpx.Response(404, json={"error": "no route"})

    def attempts(self) -> list[dict]:
        return [e for e in self.events.values() if e["type"] == "attempt"]


OPENAI_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "create_follow_up", "arguments": json.dumps({"ticket_id": "T-1"})},
}


class Recorder:
    """An execute callable: runs a script of results/exceptions and records its calls."""

    def __init__(self, *script):
        self.script = list(script)
        self.calls: list[tuple[dict, str]] = []

    def __call__(self, arguments: dict, operation_id: str):
        self.calls.append((arguments, operation_id))
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step


class SdkTestCase(SimpleTestCase):
    """No database: the SDK never touches one. ``self.tmp`` is a fresh buffer directory."""

    def setUp(self):
        super().setUp()
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)


def make_client(fake: FakeCallgate, buffer_dir: Path | None = None, **kwargs) -> CallgateClient:
    sleeps = kwargs.pop("sleeps", None)
    defaults = dict(
        transport=fake.transport(),
        flush_interval=None,
        execute_timeout=None,
        buffer_dir=buffer_dir,
        rand=lambda a, b: b,
        answer_timeout=0,
        sleep=(sleeps.append if sleeps is not None else (lambda s: None)),
    )
    defaults.update(kwargs)
    return CallgateClient("http://callgate.test", KEY, **defaults)


# --- pure helpers -----------------------------------------------------------------


def graph_of(model, tools):
    """The smallest tool-calling agent: the model, then a ToolNode (``tools``, or a list of
    tools), until no tool call."""

    def agent(state: MessagesState):
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools if isinstance(tools, ToolNode) else ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()
