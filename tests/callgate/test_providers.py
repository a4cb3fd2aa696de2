"""Normalising each provider's tool-call format."""

from __future__ import annotations

import pytest

from callgate_sdk.providers import (
    RESULT_MISSING,
    TurnError,
    envelope_calls,
    normalise,
    split_turn,
)

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


# --- TAXONOMY v2: bedrock, ollama, string arguments, turns ---------------------------------


def test_bedrock_and_ollama_calls_normalise_to_one_shape():
    bedrock = normalise("bedrock", {"toolUseId": "t1", "name": "f", "input": {"a": 1}})
    wrapped = normalise("bedrock", {"toolUse": {"toolUseId": "t1", "name": "f", "input": {"a": 1}}})
    ollama = normalise("ollama", {"function": {"name": "f", "arguments": {"a": 1}}})
    assert bedrock == wrapped
    assert (bedrock.tool, bedrock.arguments, bedrock.call_id) == ("f", {"a": 1}, "t1")
    assert (ollama.tool, ollama.arguments, ollama.call_id_missing) == ("f", {"a": 1}, False)


@pytest.mark.parametrize(
    "format_,call",
    [
        ("mcp", {"method": "tools/call", "params": {"name": "f", "arguments": '{"a": 1}'}}),
        ("anthropic", {"type": "tool_use", "id": "x", "name": "f", "input": '{"a": 1}'}),
        ("bedrock", {"toolUseId": "x", "name": "f", "input": '{"a": 1}'}),
        ("gemini", {"functionCall": {"name": "f", "args": '{"a": 1}'}}),
        ("ollama", {"function": {"name": "f", "arguments": '{"a": 1}'}}),
    ],
)
def test_a_string_where_an_object_of_arguments_belongs_is_never_parsed(format_, call):
    proposal = normalise(format_, call)
    assert not proposal.arguments_ok and "string" in proposal.parse_error


def test_plain_and_openai_still_parse_a_json_string():
    assert normalise("plain", {"tool": "f", "arguments": '{"a": 1}'}).arguments == {"a": 1}


@pytest.mark.parametrize(
    "format_,call",
    [
        ("openai", {"type": "function", "function": {"name": "f", "arguments": "{}"}}),
        ("openai", {"id": None, "type": "function", "function": {"name": "f", "arguments": "{}"}}),
        (
            "openai_responses",
            {"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"},
        ),
        ("anthropic", {"type": "tool_use", "id": "", "name": "f", "input": {}}),
        ("bedrock", {"name": "f", "input": {}}),
    ],
)
def test_a_call_without_its_id_is_flagged_in_formats_with_ids(format_, call):
    assert normalise(format_, call).call_id_missing


def test_gemini_ollama_mcp_and_plain_calls_need_no_id():
    assert not normalise("gemini", {"functionCall": {"name": "f", "args": {}}}).call_id_missing
    assert not normalise("plain", {"tool": "f", "arguments": {}}).call_id_missing


def test_split_turn_keeps_order_skips_text_and_pairs_provider_results():
    calls = split_turn(
        "anthropic",
        {
            "content": [
                {"type": "text", "text": "hi"},
                {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {"q": "x"}},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
                {"type": "web_search_tool_result", "tool_use_id": "s1", "content": []},
                {"type": "server_tool_use", "id": "s2", "name": "web_fetch", "input": {}},
            ]
        },
    )
    assert [(c.proposal.call_id, c.executed_by) for c in calls] == [
        ("s1", "provider"),
        ("t1", "client"),
        ("s2", "provider"),
    ]
    assert calls[0].result.outcome == "success" and calls[0].result.result == []
    assert calls[2].result == RESULT_MISSING


def test_split_turn_reads_responses_hosted_tools_by_status():
    calls = split_turn(
        "openai_responses",
        {
            "output": [
                {"type": "reasoning", "id": "r"},
                {"type": "web_search_call", "id": "w1", "status": "completed"},
                {"type": "web_search_call", "id": "w2", "status": "failed"},
                {"type": "file_search_call", "id": "w3", "status": "in_progress"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            ]
        },
    )
    assert [c.result.outcome if c.result else None for c in calls] == [
        "success",
        "error",
        "error",
        None,
    ]
    assert calls[2].result == RESULT_MISSING


def test_split_turn_refuses_an_envelope_that_is_not_a_response():
    with pytest.raises(TurnError) as caught:
        split_turn("openai", {"tool_calls": "nope"})
    assert caught.value.loc == "response.tool_calls"


def test_envelope_calls_counts_only_whole_responses():
    message = {"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}}] * 2}
    assert envelope_calls("openai", message) == 2
    assert envelope_calls("openai", {"id": "a", "function": {"name": "f", "arguments": "{}"}}) == 0
    assert normalise("openai", message).turn_calls == 2


def test_split_turn_takes_whole_answers_and_bare_item_lists():
    item = {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    completion = {"choices": [{"message": {"role": "assistant", "tool_calls": [item, item]}}]}
    assert len(split_turn("openai", completion)) == 2
    assert envelope_calls("openai", completion) == 2
    assert [c.proposal.tool for c in split_turn("openai", [item])] == ["f"]
    assert len(split_turn("gemini", [{"functionCall": {"name": "f", "args": {}}}])) == 1
    converse = {
        "output": {
            "message": {"content": [{"toolUse": {"toolUseId": "t", "name": "f", "input": {}}}]}
        }
    }
    assert split_turn("bedrock", converse)[0].proposal.call_id == "t"


@pytest.mark.parametrize(
    "content,status,error",
    [
        (
            {"type": "web_search_tool_result_error", "error_code": "too_many_requests"},
            429,
            "too_many_requests",
        ),
        (
            {"type": "web_fetch_tool_error", "error_code": "url_not_accessible"},
            None,
            "url not accessible",
        ),
        (
            {"type": "code_execution_tool_result_error", "error_code": "unavailable"},
            503,
            "unavailable",
        ),
    ],
)
def test_anthropic_server_tool_errors_name_their_cause(content, status, error):
    [call] = split_turn(
        "anthropic",
        {
            "content": [
                {"type": "server_tool_use", "id": "s", "name": "web_fetch", "input": {}},
                {"type": "web_fetch_tool_result", "tool_use_id": "s", "content": content},
            ]
        },
    )
    assert (call.result.outcome, call.result.http_status, call.result.error) == (
        "error",
        status,
        error,
    )
