"""Contract linter (callgate/lint.py): pure function, no database."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callgate.lint import CODES, Finding, LintReport, lint_contract
from tests.factories import CASES_FILE, load_cases

GOOD_DESCRIPTION = (
    "Create a follow-up task on a support ticket and return its id. Use it when the "
    "customer is promised a call back."
)
GOOD_PARAMETERS = {
    "type": "object",
    "properties": {
        "ticket_id": {
            "type": "string",
            "pattern": "^T-[0-9]+$",
            "description": "Support ticket id, e.g. T-1042",
        },
        "due_at": {
            "type": "string",
            "format": "date-time",
            "description": "When the follow-up is due, RFC 3339",
        },
        "priority": {
            "type": "string",
            "enum": ["low", "normal", "high"],
            "description": "How urgent the follow-up is",
        },
        "duration_minutes": {
            "type": "integer",
            "minimum": 5,
            "maximum": 240,
            "description": "Planned length of the call",
        },
        "task": {
            "type": "object",
            "description": "The task to create",
            "properties": {
                "title": {"type": "string", "description": "Short title shown in the queue"},
                "tags": {
                    "type": "array",
                    "description": "Free-form labels",
                    "items": {"type": "string", "minLength": 1},
                },
            },
            "required": ["title"],
            "additionalProperties": False,
        },
    },
    "required": ["ticket_id", "due_at"],
}


def lint_params(properties: dict, **extra) -> LintReport:
    """Lint a contract with a good tool description and the given root properties."""
    params = {"type": "object", "properties": properties, "required": [], **extra}
    return lint_contract(name="create_follow_up", description=GOOD_DESCRIPTION, parameters=params)


def codes_at(report: LintReport, path: str) -> set[str]:
    return {f.code for f in report.findings if f.path == path}


def load_case_tools() -> list[dict]:
    cases = load_cases()
    if not cases:
        pytest.skip(f"{CASES_FILE} is missing (the shared test vectors)")
    return [tool for case in cases for tool in case.get("tools", [])]


# ---------------------------------------------------------------- good and bad contracts


def test_it_scores_a_well_described_schema_high_without_findings():
    report = lint_contract(
        name="create_follow_up", description=GOOD_DESCRIPTION, parameters=GOOD_PARAMETERS
    )
    assert report.findings == []
    assert report.score >= 90
    assert report.as_dict() == {"score": 100, "findings": []}


def test_it_scores_a_do_stuff_contract_low():
    report = lint_contract(
        name="do_stuff",
        description="does stuff",
        parameters={
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "type": {"type": "string"},
                "date": {"type": "string"},
                "n": {"type": "number"},
                "data": {"type": "object"},
                "list": {"type": "array"},
                "x": {},
            },
            "additionalProperties": True,
        },
    )
    assert report.score < 40
    codes = {f.code for f in report.findings}
    assert {
        "vague_description",
        "missing_description",
        "missing_enum",
        "missing_format",
        "missing_bounds",
        "missing_required",
        "object_without_properties",
        "array_without_items",
        "additional_properties",
        "missing_type",
    } <= codes


def test_it_computes_the_score_from_the_finding_weights():
    report = lint_params({"a": {"type": "string"}, "b": {"type": "integer"}})
    assert report.score == 100 - sum(f.weight for f in report.findings)
    assert report.score == 100 - 5 - 5 - 3


def test_it_caps_each_problem_so_large_schemas_stay_comparable():
    report = lint_params({f"field{i}": {"type": "boolean"} for i in range(30)})
    missing = [f for f in report.findings if f.code == "missing_description"]
    assert len(missing) == 30  # every field is still listed
    assert sum(f.weight for f in missing) == CODES["missing_description"][1]
    assert report.score == 100 - CODES["missing_description"][1]


def test_it_serialises_findings_to_json_ready_dicts():
    report = lint_params({"ticket_id": {"type": "string", "pattern": "^T-[0-9]+$"}})
    data = report.as_dict()
    assert data == {
        "score": 95,
        "findings": [
            {
                "path": "ticket_id",
                "code": "missing_description",
                "message": "`ticket_id` has no description: the model has to guess what it means.",
            }
        ],
    }
    assert json.loads(json.dumps(data)) == data
    finding = report.findings[0]
    assert isinstance(finding, Finding)
    assert finding.weight == 5
    with pytest.raises(AttributeError):
        finding.code = "other"  # frozen


# ---------------------------------------------------------------- one rule at a time


def test_it_reports_a_field_without_description():
    report = lint_params({"ticket_id": {"type": "string", "pattern": "^T-[0-9]+$"}})
    (finding,) = report.findings
    assert finding.code == "missing_description"
    assert finding.path == "ticket_id"
    assert "`ticket_id` has no description" in finding.message


def test_it_counts_a_described_ref_target_as_description():
    report = lint_params(
        {"owner": {"$ref": "#/$defs/Person"}},
        **{
            "$defs": {
                "Person": {
                    "type": "object",
                    "description": "A person",
                    "properties": {},
                    "required": [],
                }
            }
        },
    )
    assert "missing_description" not in codes_at(report, "owner")


@pytest.mark.parametrize(
    "name", ["status", "ticket_type", "sortOrder", "sort_by", "currency", "priority", "unit"]
)
def test_it_suggests_enum_for_closed_set_names(name):
    report = lint_params({name: {"type": "string", "description": "What to use"}})
    (finding,) = report.findings
    assert finding.code == "missing_enum"
    assert finding.path == name
    assert f"`{name}`" in finding.message and "`enum`" in finding.message


@pytest.mark.parametrize(
    "description",
    [
        "Sort direction, one of asc, desc",
        "Either 'fast' or 'cheap'",
        "Shipping speed: ground | air | sea",
        "Output as json/csv/xml",
        "Colour, 'red', 'green' or 'blue'",
    ],
)
def test_it_suggests_enum_when_the_description_lists_options(description):
    report = lint_params({"shipping": {"type": "string", "description": description}})
    (finding,) = report.findings
    assert finding.code == "missing_enum"
    assert "`shipping`" in finding.message


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "description": "Ticket status", "enum": ["open", "closed"]},
        {"type": "string", "description": "Ticket status", "const": "open"},
        {"anyOf": [{"type": "string", "enum": ["a", "b"]}], "description": "Ticket status"},
    ],
)
def test_it_accepts_closed_sets_with_enum_or_const(schema):
    assert lint_params({"status": schema}).findings == []


@pytest.mark.parametrize(
    "description",
    ["Path of the file, e.g. /tmp/a.txt", "Full page address like https://a.b/c/d", "Any text"],
)
def test_it_does_not_mistake_paths_and_urls_for_options(description):
    report = lint_params({"location": {"type": "string", "description": description}})
    assert report.findings == []


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("due_at", "date-time"),
        ("created_on", "date"),
        ("start_date", "date"),
        ("deadline", "date-time"),
        ("contact_email", "email"),
        ("request_uuid", "uuid"),
        ("callback_url", "uri"),
        ("ticket_id", "pattern"),
        ("ticketId", "pattern"),
        ("id", "pattern"),
    ],
)
def test_it_asks_for_a_format_on_dates_and_ids(name, expected):
    report = lint_params({name: {"type": "string", "description": "The value"}})
    (finding,) = report.findings
    assert finding.code == "missing_format"
    assert finding.path == name
    assert f"`{name}`" in finding.message and expected in finding.message


@pytest.mark.parametrize(
    "extra",
    [
        {"format": "date-time"},
        {"pattern": "^[0-9]{4}-"},
        {"examples": ["2026-01-01T09:00:00Z"]},
        {"description": "RFC 3339 timestamp"},
        {"description": "When it is due, e.g. 2026-01-01T09:00:00Z"},
    ],
)
def test_it_accepts_a_format_pattern_or_example(extra):
    schema = {"type": "string", "description": "When it is due", **extra}
    assert lint_params({"due_at": schema}).findings == []


def test_it_reports_numbers_without_bounds():
    report = lint_params(
        {
            "quantity": {"type": "integer", "description": "How many"},
            "ratio": {"type": ["number", "null"], "description": "Share"},
            "limit": {"type": "integer", "description": "Max rows", "minimum": 1},
            "price": {"type": "number", "description": "Price", "exclusiveMinimum": 0},
        }
    )
    assert [(f.path, f.code) for f in report.findings] == [
        ("quantity", "missing_bounds"),
        ("ratio", "missing_bounds"),
    ]
    assert "`quantity` is a number without bounds" in report.findings[0].message


@pytest.mark.parametrize(
    ("description", "kind"),
    [
        ("", "no description"),
        ("   ", "no description"),
        ("read_email tool", "only repeats the name"),
        ("Read email", "only repeats the name"),
        ("does stuff", "generic"),
        ("A helper that handles things for you", "generic"),
        ("Utility function", "generic"),
        ("Fetch inbox", "very short"),
    ],
)
def test_it_reports_a_vague_tool_description(description, kind):
    report = lint_contract(
        name="read_email",
        description=description,
        parameters={"type": "object", "properties": {}, "required": []},
    )
    (finding,) = report.findings
    assert finding.code == "vague_description"
    assert finding.path == "(description)"
    assert kind in finding.message
    assert report.score <= 90


def test_it_accepts_a_specific_tool_description_with_generic_words():
    report = lint_contract(
        name="issue_refund",
        description="Handles refunds: returns money for a paid order to the original card.",
        parameters={"type": "object", "properties": {}, "required": []},
    )
    assert report.findings == []


def test_it_reports_an_object_without_required_list():
    report = lint_contract(
        name="create_follow_up",
        description=GOOD_DESCRIPTION,
        parameters={
            "type": "object",
            "properties": {"note": {"type": "string", "description": "Text"}},
        },
    )
    (finding,) = report.findings
    assert (finding.path, finding.code) == ("(parameters)", "missing_required")
    assert "`required`" in finding.message


def test_it_reports_an_array_without_items():
    report = lint_params({"tags": {"type": "array", "description": "Labels"}})
    (finding,) = report.findings
    assert (finding.path, finding.code) == ("tags", "array_without_items")
    assert "`tags` is an array without `items`" in finding.message


def test_it_notes_additional_properties_true():
    report = lint_params(
        {"note": {"type": "string", "description": "Text"}}, additionalProperties=True
    )
    (finding,) = report.findings
    assert (finding.path, finding.code) == ("(parameters)", "additional_properties")
    assert finding.weight == 1


def test_it_reports_a_nested_object_without_properties():
    report = lint_params({"meta": {"type": "object", "description": "Extra data"}})
    (finding,) = report.findings
    assert (finding.path, finding.code) == ("meta", "object_without_properties")
    assert "`meta`" in finding.message


def test_it_accepts_a_map_with_an_additional_properties_schema():
    report = lint_params(
        {
            "labels": {
                "type": "object",
                "description": "Label name to value",
                "additionalProperties": {"type": "string", "maxLength": 50},
            }
        }
    )
    assert report.findings == []


def test_it_accepts_a_tool_without_arguments():
    for params in ({}, {"type": "object"}, {"type": "object", "properties": {}}):
        report = lint_contract(name="list_sites", description=GOOD_DESCRIPTION, parameters=params)
        assert report.findings == []
        assert report.score == 100


def test_it_reports_parameters_that_are_not_an_object():
    for params in ({"type": "string"}, None, [], True, "x"):
        report = lint_contract(name="t", description=GOOD_DESCRIPTION, parameters=params)
        assert [f.code for f in report.findings] == ["parameters_not_object"]
        assert report.findings[0].path == "(parameters)"


# ---------------------------------------------------------------- nesting and paths


def test_it_walks_nested_objects_arrays_unions_and_defs():
    report = lint_params(
        {
            "task": {
                "type": "object",
                "description": "The task",
                "properties": {"title": {"type": "string"}},
                "required": ["title"],
            },
            "items": {
                "type": "array",
                "description": "Line items",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "qty": {"type": "integer", "description": "Quantity"},
                    },
                    "required": ["name"],
                },
            },
            "contact": {
                "description": "Who to call",
                "oneOf": [
                    {"type": "object", "properties": {"email": {"type": "string"}}, "required": []},
                    {"type": "string", "description": "Phone number", "maxLength": 20},
                ],
            },
            "pair": {
                "type": "array",
                "description": "Two values",
                "prefixItems": [{"type": "string"}, {"type": "number"}],
            },
            "address": {"$ref": "#/$defs/Address", "description": "Postal address"},
        },
        **{
            "$defs": {
                "Address": {
                    "type": "object",
                    "properties": {"street": {"type": "string"}},
                    "required": ["street"],
                }
            }
        },
    )
    found = {(f.path, f.code) for f in report.findings}
    assert found == {
        ("task.title", "missing_description"),
        ("items[].name", "missing_description"),
        ("items[].qty", "missing_bounds"),
        ("contact.oneOf[0].email", "missing_description"),
        ("contact.oneOf[0].email", "missing_format"),
        ("pair[1]", "missing_bounds"),
        ("$defs.Address.street", "missing_description"),
    }
    for f in report.findings:
        if f.code == "missing_description":
            assert f"`{f.path}`" in f.message


def test_it_uses_the_singular_of_an_array_name_for_its_elements():
    report = lint_params(
        {
            "ticket_ids": {"type": "array", "description": "Tickets", "items": {"type": "string"}},
            "statuses": {"type": "array", "description": "Filter", "items": {"type": "string"}},
        }
    )
    assert [(f.path, f.code) for f in report.findings] == [
        ("ticket_ids[]", "missing_format"),
        ("statuses[]", "missing_enum"),
    ]


def test_it_tolerates_odd_but_valid_schemas():
    cyclic: dict = {"type": "object", "properties": {}}
    cyclic["properties"]["self"] = cyclic
    odd_params = [
        {"type": "object", "properties": {"a": True, "b": False, "c": {"$ref": "#/nowhere"}}},
        {"type": "object", "properties": {"a": {"type": ["string", 3, None]}}, "required": "a"},
        {"properties": {"a": {"items": [True, {"type": "integer"}], "description": 5}}},
        {"type": "object", "properties": {1: {"type": "string"}}, "$defs": {"X": True}},
        {"anyOf": [True, False, None, {"type": "object"}], "allOf": "nope", "items": 3},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/~1x"}}, "$defs": []},
        cyclic,
    ]
    for params in odd_params:
        report = lint_contract(name="odd", description=GOOD_DESCRIPTION, parameters=params)
        assert 0 <= report.score <= 100
        json.dumps(report.as_dict())
    report = lint_contract(name=None, description=None, parameters={})  # type: ignore[arg-type]
    assert report.findings[0].code == "vague_description"


def test_it_stops_at_a_very_deep_schema():
    schema: dict = {"type": "string"}
    for _ in range(500):
        schema = {"type": "object", "properties": {"a": schema}, "required": []}
    report = lint_contract(name="deep", description=GOOD_DESCRIPTION, parameters=schema)
    assert 0 <= report.score <= 100


# ---------------------------------------------------------------- generated schemas

_KEYWORDS = st.sampled_from(
    [
        "type",
        "properties",
        "items",
        "prefixItems",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "$defs",
        "definitions",
        "$ref",
        "required",
        "enum",
        "const",
        "description",
        "format",
        "pattern",
        "examples",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "additionalProperties",
        "patternProperties",
        "title",
        "default",
    ]
)
_NAMES = st.sampled_from(
    [
        "status",
        "due_at",
        "ticket_id",
        "userId",
        "email",
        "url",
        "sort_by",
        "count",
        "name",
        "x",
        "",
        "ids",
        "created_on",
        "date",
        "tags",
        "order",
        "priority_level",
        "UUID",
    ]
)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(allow_nan=True),
    st.sampled_from(
        [
            "string",
            "integer",
            "number",
            "object",
            "array",
            "boolean",
            "null",
            "#/$defs/x",
            "#/properties/a",
            "one of a, b",
            "either x or y",
            "a|b",
            "e.g. 12",
            "does stuff",
            "",
        ]
    ),
    st.text(max_size=20),
)
_SCHEMAS = st.recursive(
    _SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(_KEYWORDS, _NAMES), children, max_size=6),
        st.fixed_dictionaries(
            {"type": st.sampled_from(["object", "array", "string"])},
            optional={
                "properties": st.dictionaries(_NAMES, children, max_size=4),
                "items": children,
                "anyOf": st.lists(children, max_size=3),
                "description": st.text(max_size=30),
            },
        ),
    ),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.one_of(_NAMES, st.text(max_size=20)),
    description=st.one_of(st.text(max_size=60), st.sampled_from(["read_email tool", "helper"])),
    parameters=_SCHEMAS,
)
def test_it_never_raises_and_is_deterministic_on_generated_schemas(name, description, parameters):
    snapshot = copy.deepcopy(parameters)
    report = lint_contract(name=name, description=description, parameters=parameters)
    assert isinstance(report, LintReport)
    assert 0 <= report.score <= 100
    assert report.score == max(0, 100 - sum(f.weight for f in report.findings))
    assert all(f.code in CODES and f.weight >= 0 and f.message for f in report.findings)
    json.dumps(report.as_dict())
    again = lint_contract(name=name, description=description, parameters=copy.deepcopy(snapshot))
    assert again == report


# ---------------------------------------------------------------- shared cases


def test_it_lints_every_tool_of_the_shared_cases():
    tools = load_case_tools()
    assert tools
    for tool in tools:
        report = lint_contract(
            name=tool["name"],
            description=tool.get("description", ""),
            parameters=tool.get("parameters"),
        )
        assert 0 <= report.score <= 100
        assert report == lint_contract(
            name=tool["name"],
            description=tool.get("description", ""),
            parameters=tool.get("parameters"),
        )


def test_it_flags_the_read_email_tool_description_of_the_shared_cases():
    (tool,) = {
        json.dumps(t, sort_keys=True): t for t in load_case_tools() if t["name"] == "read_email"
    }.values()
    assert tool["description"] == "read_email tool"
    report = lint_contract(
        name=tool["name"], description=tool["description"], parameters=tool["parameters"]
    )
    vague = [f for f in report.findings if f.code == "vague_description"]
    assert len(vague) == 1
    assert vague[0].path == "(description)"
    assert "read_email" in vague[0].message
