"""Normalising each provider's tool-call format."""

from __future__ import annotations

import pytest

from callgate_sdk.providers import normalise

ARGS = {"city": "Paris"}


@pytest.mark.parametrize(
    "format_, call",
    [
        (
            "openai",
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
        ),
        (
            "openai",
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
        ),
        (
            "openai_responses",
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city":"Paris"}',
            },
        ),
        ("anthropic", {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": ARGS}),
        ("gemini", {"functionCall": {"name": "get_weather", "args": ARGS}}),
        (
            "gemini",
            {
                "candidates": [
                    {
                        "content": {
                            "role": "model",
                            "parts": [{"functionCall": {"name": "get_weather", "args": ARGS}}],
                        }
                    }
                ]
            },
        ),
        (
            "mcp",
            {
                "jsonrpc": "2.0",
                "id": "call_1",
                "method": "tools/call",
                "params": {"name": "get_weather", "arguments": ARGS},
            },
        ),
        ("plain", {"tool": "get_weather", "arguments": ARGS}),
        ("plain", {"tool": "get_weather", "arguments": '{"city": "Paris"}'}),
    ],
)
def test_it_normalises_every_format_to_one_shape(format_, call):
    proposal = normalise(format_, call)
    assert proposal.malformed is None
    assert (proposal.tool, proposal.arguments) == ("get_weather", ARGS)
    assert proposal.arguments_ok


@pytest.mark.parametrize(
    "format_, call, why",
    [
        (
            "openai",
            {"role": "assistant", "content": '{"name": "x"}', "tool_calls": []},
            "text instead",
        ),
        (
            "openai",
            {"id": "c", "type": "function", "function": {"arguments": "{}"}},
            "no tool name",
        ),
        (
            "gemini",
            {"candidates": [{"finishReason": "MALFORMED_FUNCTION_CALL"}]},
            "MALFORMED_FUNCTION_CALL",
        ),
        ("mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, "tools/call"),
        ("plain", "call get_weather for Paris", "text instead"),
        ("klingon", {"tool": "x"}, "unknown format"),
        ("anthropic", [1, 2], "JSON object"),
    ],
)
def test_it_reports_unrecognisable_output_as_malformed(format_, call, why):
    proposal = normalise(format_, call)
    assert proposal.tool is None
    assert why in proposal.malformed


@pytest.mark.parametrize(
    "raw, why",
    [
        ('{"city": "Par', "line 1"),
        ('```json\n{"city": "Paris"}\n```', "code fence"),
        ("[1, 2]", "array"),
        ("{'city': 'Paris'}", "property name"),
        ('{"n": 1e400}', "too large"),
        ('{"n": NaN}', "not JSON"),
    ],
)
def test_it_reports_unparseable_arguments(raw, why):
    proposal = normalise(
        "openai",
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": raw}},
    )
    assert proposal.tool == "get_weather"
    assert not proposal.arguments_ok
    assert why in proposal.parse_error


def test_it_replaces_what_cannot_be_stored_in_parsed_arguments():
    raw = '{"a\\u0000": "x\\u0000y", "b": ["\\ud83d"], "c": "\\ud83d\\ude00"}'
    proposal = normalise(
        "openai", {"id": "c", "type": "function", "function": {"name": "t", "arguments": raw}}
    )
    assert proposal.arguments == {"a\ufffd": "x\ufffdy", "b": ["\ufffd"], "c": "\U0001f600"}
