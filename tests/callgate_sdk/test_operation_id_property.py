"""Property: for every generated call, the operation ID the SDK derives on its own (what a
``fail_open`` client executes under while callgate is down) is the one callgate's gate
answers with, whatever the provider format, key order, whitespace or argument values, and
without the values of the contract's volatile arguments (TAXONOMY v2)."""

from __future__ import annotations

import json
import string

from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.django import TestCase

from callgate.auth import api_key_issue
from callgate.models import Agent, Project
from callgate_sdk import CallgateClient
from callgate_sdk._protocol import local_operation_id
from callgate_sdk.providers import normalise
from demo.fleet import callgate_transport

#: what jsonb stores unchanged (U+0000 and unpaired surrogates are replaced on the way in;
#: tests/callgate/test_providers.py pins that)
text = st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(text.map(lambda t: t[:8]), children, max_size=3)
    ),
    max_leaves=12,
)
arguments = st.dictionaries(text.map(lambda t: t[:10]), values, max_size=5)
tools = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True)
request_ids = st.text(
    alphabet=string.ascii_letters + string.digits + "-_:.", min_size=1, max_size=40
)


def as_format(format_: str, tool: str, args: dict, indent: int | None, call_id: str):
    """The call in a provider's format; JSON-string arguments written with ``indent``."""
    encoded = json.dumps(dict(reversed(list(args.items()))), indent=indent)
    return {
        "openai": {
            "id": call_id,
            "type": "function",
            "function": {"name": tool, "arguments": encoded},
        },
        "openai_responses": {
            "type": "function_call",
            "call_id": call_id,
            "name": tool,
            "arguments": encoded,
        },
        "anthropic": {"type": "tool_use", "id": call_id, "name": tool, "input": args},
        "gemini": {"functionCall": {"name": tool, "args": args}},
        "mcp": {
            "jsonrpc": "2.0",
            "id": call_id,
            "method": "tools/call",
            "params": {"name": tool, "arguments": args},
        },
        "plain": {"tool": tool, "arguments": encoded},
    }[format_]


class OperationIdPropertyTests(TestCase):
    def setUp(self):
        super().setUp()
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        self.addCleanup(request_started.connect, close_old_connections)
        self.addCleanup(request_finished.connect, close_old_connections)
        # hypothesis runs setUp for each example, inside the test's transaction
        project, _ = Project.objects.get_or_create(slug="acme", defaults={"name": "Acme"})
        agent, _ = Agent.objects.get_or_create(project=project, name="bot")
        self.client_ = CallgateClient(
            "http://localhost",
            api_key_issue(agent=agent).plain,
            transport=callgate_transport(),
            flush_interval=None,
        )
        self.addCleanup(self.client_.close, flush=False)

    @settings(max_examples=120, deadline=None)
    @given(
        format_=st.sampled_from(
            ["openai", "openai_responses", "anthropic", "gemini", "mcp", "plain"]
        ),
        tool=tools,
        args=arguments,
        request_id=request_ids,
        indent=st.sampled_from([None, 0, 2]),
        call_id=st.from_regex(r"call_[a-zA-Z0-9]{1,12}", fullmatch=True),
    )
    def test_the_sdk_derives_the_operation_id_the_gate_answers(
        self, format_, tool, args, request_id, indent, call_id
    ):
        call = as_format(format_, tool, args, indent, call_id)
        answer = self.client_.check(format_, call, request_id=request_id)
        assert answer.operation_id == local_operation_id(request_id, normalise(format_, call))

    @settings(max_examples=40, deadline=None)
    @given(raw=text.filter(lambda t: t.strip()), request_id=request_ids, tool=tools)
    def test_so_it_does_for_arguments_that_do_not_parse(self, raw, request_id, tool):
        call = {"tool": tool, "arguments": "{" + raw}
        answer = self.client_.check("plain", call, request_id=request_id)
        assert answer.operation_id == local_operation_id(request_id, normalise("plain", call))

    @settings(max_examples=60, deadline=None)
    @given(
        tool=tools,
        args=arguments.filter(bool),
        request_id=request_ids,
        data=st.data(),
    )
    def test_so_it_does_without_the_contracts_volatile_arguments(
        self, tool, args, request_id, data
    ):
        # "-" aside: a contract may not name it (wire.pointer_problem: past an array's end)
        usable = sorted(key for key in args if key != "-")
        keys = (
            data.draw(st.lists(st.sampled_from(usable), unique=True, max_size=3)) if usable else []
        )
        pointers = ["/" + key.replace("~", "~0").replace("/", "~1") for key in keys]
        self.client_.register_tool(
            tool, parameters={"type": "object"}, effect="write", volatile_arguments=pointers
        )
        call = {"tool": tool, "arguments": args}
        answer = self.client_.check("plain", call, request_id=request_id)
        local = local_operation_id(request_id, normalise("plain", call), pointers)
        assert answer.operation_id == local
        changed = {**args, **{key: "another value" for key in keys}}
        again = self.client_.check(
            "plain", {"tool": tool, "arguments": changed}, request_id=request_id
        )
        assert again.operation_id == answer.operation_id  # volatile values never change it
