"""Regular expressions in contracts run in RE2 (linear time): a catastrophic pattern cannot
stall the classifier, and patterns RE2 cannot run are refused at registration."""

from __future__ import annotations

import pytest

from callgate.classification import Contract, classify_proposal, schema_problems
from callgate.taxonomy import Category, Reason, Route
from callgate_sdk.providers import normalise

#: Nested quantifiers: Python's backtracking ``re`` takes about 2**n steps on n letters
#: followed by a mismatch, which at 40 letters never finishes.
CATASTROPHIC = "^(a+)+$"
EVIL = "a" * 40 + "!"


def verdict(parameters: dict, arguments: dict):
    contract = Contract(name="t", parameters=parameters, effect="read")
    proposal = normalise("plain", {"tool": "t", "arguments": arguments})
    return classify_proposal(
        proposal, tools={"t": contract}, existing=None, arguments_digest="x", reasks_used=0
    )


@pytest.mark.timeout(60)  # with backtracking this would hang, not fail
def test_a_catastrophic_pattern_is_matched_in_linear_time():
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": CATASTROPHIC}},
    }
    failed = verdict(parameters, {"code": EVIL})
    assert failed.category == Category.ARGUMENT_ERROR
    assert "$.code" in failed.observation and CATASTROPHIC in failed.observation
    assert verdict(parameters, {"code": "aaaa"}).route == Route.PROCEED


@pytest.mark.timeout(60)
def test_pattern_properties_and_additional_properties_match_keys_in_linear_time():
    parameters = {
        "type": "object",
        "patternProperties": {CATASTROPHIC: {"type": "integer"}},
        "additionalProperties": False,
    }
    unknown = verdict(parameters, {EVIL: 1})
    assert unknown.reason == Reason.UNKNOWN_ARGUMENT
    assert EVIL in unknown.observation
    wrong_type = verdict(parameters, {"aaa": "three"})
    assert wrong_type.category == Category.ARGUMENT_ERROR and "$.aaa" in wrong_type.observation


@pytest.mark.parametrize(
    "parameters, needle",
    [
        (
            {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(?=x)x$"}}},
            "/properties/a",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string", "pattern": r"^(a)\1$"}}},
            "/properties/a",
        ),
        ({"type": "object", "patternProperties": {"(?<!x)y": {}}}, "(root)"),
        ({"type": "object", "$defs": {"d": {"type": "string", "pattern": "(?!no)"}}}, "/$defs/d"),
    ],
)
def test_patterns_re2_cannot_run_are_refused_naming_where(parameters, needle):
    problem = schema_problems(parameters)
    assert problem is not None and needle in problem and "linear time" in problem


@pytest.mark.parametrize(
    "parameters",
    [
        {"type": "object", "patternProperties": {"^x": {}}, "unevaluatedProperties": False},
        {
            "type": "object",
            "allOf": [{"patternProperties": {CATASTROPHIC: {}}}],
            "unevaluatedProperties": False,
        },
        {
            "type": "object",
            "$defs": {"p": {"patternProperties": {"^x": {}}}},
            "$ref": "#/$defs/p",
            "unevaluatedProperties": False,
        },
    ],
)
def test_pattern_properties_anywhere_with_unevaluated_properties_are_refused(parameters):
    problem = schema_problems(parameters)
    assert problem is not None and "unevaluatedProperties" in problem


def test_a_property_named_pattern_is_not_taken_for_a_regex():
    parameters = {
        "type": "object",
        "properties": {"pattern": {"type": "string", "description": "(?=x)"}},
    }
    assert schema_problems(parameters) is None
