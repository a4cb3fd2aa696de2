"""Property tests of the pure parts: the classifier never raises, operation IDs ignore key
order and whitespace, classification is deterministic."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.classification import Attempt, Contract, classify_attempt, classify_proposal
from callgate_sdk.providers import FORMATS, normalise
from callgate_sdk.wire import arguments_digest, derive_operation_id

CONTRACT = Contract(
    name="book_flight",
    effect="write",
    reconcilable=True,
    parameters={
        "type": "object",
        "properties": {
            "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
            "date": {"type": "string", "format": "date"},
            "class": {"type": "string", "enum": ["economy", "business"]},
            "traveller": {
                "type": "object",
                "properties": {"email": {"type": "string", "format": "email"}},
            },
        },
        "required": ["destination", "passengers"],
    },
)
TOOLS = {"book_flight": CONTRACT}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
#: Text as callgate stores it: parsing turns U+0000 and unpaired surrogates into U+FFFD
#: (``callgate_sdk.providers.loads``; tested in test_providers), so IDs are compared over the rest.
storable_text = st.text(
    alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
)
storable_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | storable_text,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(storable_text.map(lambda t: t[:8]), children, max_size=4)
    ),
    max_leaves=20,
)


def classify(format_: str, call) -> tuple:
    proposal = normalise(format_, call)
    digest = arguments_digest(proposal.arguments) if proposal.arguments_ok else ""
    verdict = classify_proposal(
        proposal, tools=TOOLS, existing=None, arguments_digest=digest, reasks_used=0
    )
    return verdict.reason, verdict.route, verdict.observation


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=200), format_=st.sampled_from(FORMATS))
def test_any_byte_string_as_arguments_never_raises(raw, format_):
    text = raw.decode("utf-8", errors="replace")
    calls = {
        "openai": {
            "id": "c",
            "type": "function",
            "function": {"name": "book_flight", "arguments": text},
        },
        "openai_responses": {
            "type": "function_call",
            "call_id": "c",
            "name": "book_flight",
            "arguments": text,
        },
        "anthropic": {"type": "tool_use", "id": "c", "name": "book_flight", "input": text},
        "gemini": {"functionCall": {"name": "book_flight", "args": text}},
        "bedrock": {"toolUseId": "c", "name": "book_flight", "input": text},
        "ollama": {"function": {"name": "book_flight", "arguments": text}},
        "mcp": {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "book_flight", "arguments": text},
        },
        "plain": {"tool": "book_flight", "arguments": text},
    }
    reason, route, _ = classify(format_, calls[format_])
    assert reason is None or route is not None


@settings(max_examples=300, deadline=None)
@given(arguments=json_values, call=json_values, format_=st.sampled_from(FORMATS))
def test_any_json_value_never_raises_and_is_deterministic(arguments, call, format_):
    for candidate in (
        call,
        {"tool": "book_flight", "arguments": arguments},
        {"type": "tool_use", "name": "book_flight", "input": arguments},
    ):
        first = classify(format_, candidate)
        assert classify(format_, candidate) == first


@settings(max_examples=200, deadline=None)
@given(
    arguments=st.dictionaries(storable_text.map(lambda t: t[:10]), storable_values, max_size=6),
    request_id=st.text(min_size=1, max_size=20),
)
def test_key_order_and_whitespace_never_change_a_derived_operation_id(arguments, request_id):
    reordered = dict(reversed(list(arguments.items())))
    compact = json.loads(json.dumps(arguments, separators=(",", ":")))
    spaced = json.loads(json.dumps(reordered, indent=4))
    ids = {
        derive_operation_id(request_id=request_id, tool="book_flight", arguments=a)
        for a in (arguments, compact, spaced)
    }
    assert len(ids) == 1
    via_openai = normalise(
        "openai",
        {
            "id": "c",
            "type": "function",
            "function": {"name": "book_flight", "arguments": json.dumps(reordered, indent=2)},
        },
    )
    if via_openai.arguments_ok:
        assert (
            derive_operation_id(
                request_id=request_id, tool="book_flight", arguments=via_openai.arguments
            )
            in ids
        )


@settings(max_examples=200, deadline=None)
@given(
    sent=st.sampled_from([True, False, None]),
    outcome=st.sampled_from(["success", "error", "timeout", "connection_reset", "circuit_open"]),
    status=st.none() | st.integers(min_value=100, max_value=599),
    error=st.none() | st.text(max_size=50),
    result=json_values,
    attempts=st.integers(min_value=1, max_value=5),
)
def test_attempt_classification_is_total_and_deterministic(
    sent, outcome, status, error, result, attempts
):
    attempt = Attempt(sent=sent, outcome=outcome, http_status=status, error=error, result=result)
    first = classify_attempt(
        attempt, contract=CONTRACT, attempts_used=attempts, deadline_passed=False
    )
    assert first == classify_attempt(
        attempt, contract=CONTRACT, attempts_used=attempts, deadline_passed=False
    )
    assert first.reason is not None
    if first.route.value == "retry":
        assert attempts < CONTRACT.max_attempts


# --- volatile_arguments (TAXONOMY v2; RFC 6901 pointers) ------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    arguments=st.dictionaries(st.text(max_size=5), json_values, max_size=4),
    nonce=json_values,
    other=json_values,
)
def test_volatile_values_never_change_the_operation_id(arguments, nonce, other):
    from callgate_sdk.wire import derive_operation_id

    volatile = ["/meta/nonce", "/id~1key"]
    first = {**arguments, "meta": {"nonce": nonce}, "id/key": nonce}
    second = {**arguments, "meta": {"nonce": other}, "id/key": other}
    derive = lambda a, **k: derive_operation_id(  # noqa: E731
        request_id="r", tool="t", arguments=a, volatile_arguments=volatile, **k
    )
    assert derive(first) == derive(second)
    assert derive(first) != derive(first, ordinal=2)
    assert first["meta"]["nonce"] == nonce  # the arguments themselves are untouched


def test_a_volatile_pointer_names_one_value_not_its_siblings():
    from callgate_sdk.wire import derive_operation_id, pointer_problem

    op = lambda a: derive_operation_id(  # noqa: E731
        request_id="r", tool="t", arguments=a, volatile_arguments=["/nonce"]
    )
    assert op({"a": 1, "nonce": "x"}) == op({"a": 1, "nonce": "y"}) == op({"a": 1})
    assert op({"a": 1, "nonce": "x"}) != op({"a": 2, "nonce": "x"})
    assert pointer_problem("nonce") and pointer_problem("") and pointer_problem("/a/-")
    assert pointer_problem("/a/0/b") is None
