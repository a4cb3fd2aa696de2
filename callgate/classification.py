"""Classification: a pure function from an event and what is known of its call to a
reason, category, route and observation text (``shared/TAXONOMY.md``).

No database, no I/O: the services load what a rule needs (the contract, the existing
call with this operation ID, the re-asks used) into plain values and pass them in, so
every rule can be tested exhaustively. Arguments are validated with ``jsonschema``
(draft 2020-12) and its format checker; contracts are strict about undeclared
properties even when a schema omits ``additionalProperties``.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from itertools import islice
from typing import Any

import re2
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable
from referencing.jsonschema import DRAFT202012

from callgate import causes
from callgate.taxonomy import (
    LOOKUP_ANSWERS,
    PROPOSAL_PRECEDENCE,
    REASK_REASONS,
    Category,
    Reason,
    Route,
    category_of,
    route_of,
)
from callgate_sdk.providers import Proposal, json_type
from callgate_sdk.wire import canonical_json

R = Reason

#: jsonschema keyword -> reason for a failing argument
KEYWORD_REASONS: dict[str, Reason] = {
    "required": R.MISSING_REQUIRED,
    "additionalProperties": R.UNKNOWN_ARGUMENT,
    "unevaluatedProperties": R.UNKNOWN_ARGUMENT,
    "type": R.TYPE_MISMATCH,
    "enum": R.ENUM_VIOLATION,
    "const": R.ENUM_VIOLATION,
}
FORMAT_EXAMPLES = {
    "date": "2026-06-15",
    "date-time": "2026-06-15T09:00:00Z",
    "time": "09:00:00Z",
    "email": "name@example.com",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
    "uri": "https://example.com/path",
}
MAX_VALUE_CHARS = 60


@dataclass(frozen=True)
class Contract:
    """What classification needs of a contract version (``callgate.models.ToolContract``)."""

    name: str
    parameters: dict
    effect: str = "read"
    idempotent: bool = False
    reconcilable: bool = False
    max_attempts: int = 3
    max_reasks: int = 2
    requires_approval: bool = False
    description: str = ""
    volatile_arguments: tuple[str, ...] = ()
    max_identical: int = 3
    not_found_may_hide_forbidden: bool = False
    result_error_markers: bool = True
    #: False for the stand-in of a tool with no registered contract (the gate answered
    #: ``unknown_tool`` and the runtime executed the call anyway)
    registered: bool = True

    @property
    def schema_key(self) -> str:
        """The schema as sorted JSON: the key of the compiled-validator cache."""
        key = self.__dict__.get("_schema_key")
        if key is None:
            key = json.dumps(self.parameters, sort_keys=True)
            object.__setattr__(self, "_schema_key", key)
        return key


@dataclass(frozen=True)
class Existing:
    """The call already stored under this operation ID, if any."""

    arguments_digest: str
    has_receipt: bool


@dataclass(frozen=True)
class Problem:
    """One offending argument: the reason it maps to, its JSON path, and plain words."""

    reason: Reason
    path: str
    message: str


@dataclass(frozen=True)
class Verdict:
    """The outcome of one classification. ``reason`` None means "allowed, nothing known
    yet" (the gate passed a proposal). ``underlying`` keeps the reason a budget replaced."""

    reason: Reason | None
    route: Route
    observation: str = ""
    problems: tuple[Problem, ...] = field(default_factory=tuple)
    underlying: Reason | None = None
    #: how an execution's failure was read (``callgate.causes``), for the call's event
    cause: causes.Cause | None = None

    @property
    def category(self) -> Category | None:
        return category_of(self.reason) if self.reason else None


def verdict(
    reason: Reason, observation: str, *, idempotent: bool = False, **kwargs: Any
) -> Verdict:
    return Verdict(
        reason=reason,
        route=route_of(reason, idempotent=idempotent),
        observation=observation,
        **kwargs,
    )


ALLOWED = Verdict(reason=None, route=Route.PROCEED)


# --- validation ---------------------------------------------------------------------------


DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _refuse_retrieval(uri: str):
    """Contracts are written by agents: a ``$ref`` never makes callgate fetch a URL."""
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # referencing's _attrs.pyi: a dataclass transform mypy cannot read


NO_REMOTE_REFS = Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]  # the same referencing stub gap


def _walk(schema: Any) -> Iterable[tuple[str, dict]]:
    """``(where, object)`` for every JSON object inside ``schema``, without recursion."""
    stack = [(schema, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            yield where or "(root)", node
            stack.extend((value, f"{where}/{key}") for key, value in node.items())
        elif isinstance(node, list):
            stack.extend((value, f"{where}/{index}") for index, value in enumerate(node))


# --- regular expressions: RE2, linear time ---------------------------------------------------
#
# Contracts come from agents and arguments from models, so a schema's ``pattern`` must not
# be able to stall a worker (catastrophic backtracking, "ReDoS"). jsonschema matches with
# Python's backtracking ``re``; callgate's validator runs ``pattern``, ``patternProperties``
# and the ``additionalProperties`` that depends on them with RE2 (google-re2), whose time is
# linear in the input. RE2 has no backreferences or look-around: such patterns are refused
# when the contract is registered.

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


@lru_cache(maxsize=2048)
def _regex(pattern: str):
    """The compiled RE2 pattern; raises ``re2.error`` for syntax RE2 does not run."""
    return re2.compile(pattern, _RE2_OPTIONS)


def _regex_problem(pattern: Any) -> str | None:
    if not isinstance(pattern, str):
        return None  # check_schema reports the type
    try:
        _regex(pattern)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        return (
            f"{pattern!r} is not a regular expression callgate can run in linear time ({reason}; "
            "RE2 syntax: no backreferences or look-around)"
        )
    return None


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not _regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator, pattern_properties, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        for key, value in instance.items():
            if _regex(pattern).search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator, additional, instance, schema):
    """jsonschema's ``additionalProperties`` with the ``patternProperties`` matched by RE2."""
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = [_regex(p) for p in schema.get("patternProperties", {})]
    extras = [
        key
        for key in instance
        if key not in properties and not any(p.search(key) for p in patterns)
    ]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if patterns:
            joined = ", ".join(repr(each) for each in sorted(extras))
            regexes = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(
                f"{joined} {'does' if len(extras) == 1 else 'do'} not match any of the "
                f"regexes: {regexes}"
            )
        else:
            yield ValidationError(
                f"Additional properties are not allowed "
                f"({', '.join(repr(e) for e in sorted(extras))} "
                f"{'was' if len(extras) == 1 else 'were'} unexpected)"
            )


def _required(validator, required, instance, schema):
    """jsonschema's ``required`` with the missing property in the error's path, so each
    missing property is one error and one problem (was: every error listed them all)."""
    if not validator.is_type(instance, "object"):
        return
    for name in required:
        if name not in instance:
            yield ValidationError(f"{name!r} is a required property", path=[name])


def _unique_items(validator, unique, instance, schema):
    """``uniqueItems`` in linear time: items compared by their RFC 8785 canonical JSON (JSON
    Schema equality: ``1`` equals ``1.0``, ``true`` does not equal ``1``, key order is
    irrelevant). jsonschema compares unhashable items pairwise (4,000 objects: 33 s)."""
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[bytes] = set()
    for item in instance:
        key = canonical_json(item)
        if key in seen:
            yield ValidationError(f"{_show(item)} appears more than once; items must be unique")
            return
        seen.add(key)


def _multiple_of(validator, divisor, instance, schema):
    """jsonschema's ``multipleOf``, exact (decimal fractions) where its float division
    overflows: an integer beyond the double range against a fractional divisor."""
    try:
        yield from list(_JSONSCHEMA_MULTIPLE_OF(validator, divisor, instance, schema))
    except OverflowError:
        if Fraction(instance) % Fraction(repr(divisor)) != 0:
            yield ValidationError(f"{_show(instance)} is not a multiple of {divisor}")


_JSONSCHEMA_MULTIPLE_OF = Draft202012Validator.VALIDATORS["multipleOf"]


# --- the work of one validation: bounded ----------------------------------------------------

#: Keyword evaluations one validation may spend (a keyword applied to one value counts one);
#: past it the arguments are refused (``constraint_violation``) instead of holding a worker.
MAX_VALIDATION_STEPS = 30_000
#: Errors collected from one validation; the observation lists the most telling of them.
MAX_VALIDATION_ERRORS = 50


class ValidationBudgetExceeded(Exception):
    """A validation spent ``MAX_VALIDATION_STEPS``."""


class _Steps(threading.local):
    left = MAX_VALIDATION_STEPS


_steps = _Steps()


def _counted(keyword_function):
    def keyword(validator, value, instance, schema):
        _steps.left -= 1
        if _steps.left < 0:
            raise ValidationBudgetExceeded
        return keyword_function(validator, value, instance, schema)

    return keyword


Validator = validators.extend(
    Draft202012Validator,
    {
        keyword: _counted(function)
        for keyword, function in {
            **Draft202012Validator.VALIDATORS,
            "pattern": _pattern,
            "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties,
            "required": _required,
            "uniqueItems": _unique_items,
            "multipleOf": _multiple_of,
        }.items()
    },
)


def _refs(schema: Any) -> list[tuple[str, str]]:
    """``(where, $ref)`` of every reference in ``schema``."""
    return [
        (where, node["$ref"]) for where, node in _walk(schema) if isinstance(node.get("$ref"), str)
    ]


# --- the complexity budget of a contract (checked when it is registered) -------------------

#: A contract's schema as compact JSON, in bytes.
MAX_SCHEMA_BYTES = 64 * 1024
#: JSON objects (subschemas and the like) in a contract's schema.
MAX_SCHEMA_NODES = 2_000
#: Subschemas a validation could visit with every ``$ref`` replaced by its target (a
#: recursive reference counts once: its cost is bounded by the arguments' depth). The
#: 40-level ``a0 -> anyOf[a1, a1]`` graph is 2**40 here from 2.9 KB of schema.
MAX_REF_EXPANSION = 10_000
#: Entries one keyword may hold in one subschema.
MAX_KEYWORD_ENTRIES = {
    "properties": 512,
    "patternProperties": 64,
    "required": 512,
    "enum": 2_000,
    "anyOf": 64,
    "oneOf": 64,
    "allOf": 64,
    "prefixItems": 256,
    "$defs": 512,
}


def _budget_problem(schema: dict) -> str | None:
    """Why ``schema`` is over the size budget (bytes, objects, keyword entries), or None."""
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_SCHEMA_BYTES:
        return f"the schema is {size:,} bytes; the limit is {MAX_SCHEMA_BYTES:,}"
    nodes = 0
    for where, node in _walk(schema):
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            return f"the schema has more than {MAX_SCHEMA_NODES:,} objects (at {where})"
        for keyword, limit in MAX_KEYWORD_ENTRIES.items():
            value = node.get(keyword)
            if isinstance(value, (list, dict)) and len(value) > limit:
                return f"{keyword} at {where} has {len(value):,} entries; the limit is {limit:,}"
    return None


def _ref_expansion_problem(schema: dict, resolver) -> str | None:
    """Why ``schema`` expands past ``MAX_REF_EXPANSION`` subschemas with its ``$ref``s
    followed, naming the first (innermost) subschema over it; None when it does not.
    Without recursion: a post-order walk, each object's expanded size computed once."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # on the current path: a reference back to one is recursion
    stack: list[tuple[Any, str, bool]] = [(schema, "", False)]
    while stack:
        node, where, children_done = stack.pop()
        key = id(node)
        if children_done:
            children = _expansion_children(node, resolver)
            size = (1 if isinstance(node, dict) else 0) + sum(
                sizes.get(id(child), 0) for child, _ in children
            )
            sizes[key] = size
            open_.discard(key)
            if size > MAX_REF_EXPANSION:
                return (
                    f"the subschema at {where or '(root)'} expands to more than "
                    f"{MAX_REF_EXPANSION:,} subschemas when its $refs are followed; "
                    "share fewer references or flatten the schema"
                )
            continue
        if key in sizes or key in open_:
            continue
        open_.add(key)
        stack.append((node, where, True))
        for child, child_where in _expansion_children(node, resolver):
            if id(child) not in sizes and id(child) not in open_:
                stack.append((child, f"{where}/{child_where}", False))
    return None


def _expansion_children(node: Any, resolver) -> list[tuple[Any, str]]:
    """The objects and arrays inside ``node``, and the target of its ``$ref``."""
    if isinstance(node, list):
        pairs = [(value, str(index)) for index, value in enumerate(node)]
    elif isinstance(node, dict):
        pairs = list((value, str(key)) for key, value in node.items())
        ref = node.get("$ref")
        if isinstance(ref, str):
            try:
                pairs.append((resolver.lookup(ref).contents, f"$ref({ref})"))
            except Unresolvable:
                pass
    else:
        return []
    return [(value, where) for value, where in pairs if isinstance(value, (dict, list))]


def schema_problems(schema: dict) -> str | None:
    """None when ``schema`` is a valid draft 2020-12 JSON Schema of an object whose every
    ``$ref`` is local and resolves and whose every regular expression runs in RE2, within
    the complexity budget (``MAX_SCHEMA_BYTES``, ``MAX_SCHEMA_NODES``,
    ``MAX_KEYWORD_ENTRIES``, ``MAX_REF_EXPANSION``), else why not."""
    if not isinstance(schema, dict):
        return "parameters must be a JSON Schema object"
    if problem := _budget_problem(schema):
        return f"over the complexity budget: {problem}"
    if schema.get("$schema", DIALECT).rstrip("#") != DIALECT:
        return f"$schema must be {DIALECT} (draft 2020-12) or left out"
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        return f"invalid JSON Schema at {where}: {exc.message}"
    if schema.get("type", "object") != "object":
        return "parameters must describe an object (type: object)"
    pattern_properties, unevaluated = None, None
    for where, node in _walk(schema):
        for pattern in ([node["pattern"]] if isinstance(node.get("pattern"), str) else []) + (
            list(node["patternProperties"])
            if isinstance(node.get("patternProperties"), dict)
            else []
        ):
            if problem := _regex_problem(pattern):
                return f"pattern at {where}: {problem}"
        if isinstance(node.get("patternProperties"), dict):
            pattern_properties = pattern_properties or where
        if "unevaluatedProperties" in node:
            unevaluated = unevaluated or where
    if pattern_properties and unevaluated:
        # jsonschema evaluates unevaluatedProperties through every subschema (allOf, $ref, …)
        # and would match those patterns with Python's backtracking re
        return (
            f"patternProperties (at {pattern_properties}) cannot be used in a schema with "
            f"unevaluatedProperties (at {unevaluated}); use additionalProperties"
        )
    resolver = NO_REMOTE_REFS.with_resource(
        "urn:callgate:contract", DRAFT202012.create_resource(schema)
    ).resolver(base_uri="urn:callgate:contract")
    for where, ref in _refs(schema):
        if not ref.startswith("#"):
            return (
                f"$ref at {where} must be local (#/…): callgate never fetches schemas, got {ref!r}"
            )
        try:
            resolver.lookup(ref)
        except Unresolvable:
            return f"$ref at {where} points to nothing: {ref!r}"
    if problem := _ref_expansion_problem(schema, resolver):
        return f"over the complexity budget: {problem}"
    return None


def _strict(schema: Any, *, in_all_of: bool = False) -> Any:
    """A copy of ``schema`` in which every object schema with ``properties`` rejects
    undeclared properties (except inside ``allOf``, where that would reject siblings)."""
    if isinstance(schema, list):
        return [_strict(s, in_all_of=in_all_of) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"):
            out[key] = (
                {k: _strict(v) for k, v in value.items()} if isinstance(value, dict) else value
            )
        elif key == "allOf":
            out[key] = _strict(value, in_all_of=True)
        elif key in (
            "items",
            "prefixItems",
            "anyOf",
            "oneOf",
            "not",
            "if",
            "then",
            "else",
            "contains",
            "additionalProperties",
            "unevaluatedProperties",
        ):
            out[key] = _strict(value, in_all_of=in_all_of)
        else:
            out[key] = value
    if (
        not in_all_of
        and "properties" in out
        and "additionalProperties" not in out
        and "unevaluatedProperties" not in out
        and "patternProperties" not in out
    ):
        out["additionalProperties"] = False
    return out


@lru_cache(maxsize=512)
def _validator(schema_json: str) -> Draft202012Validator:
    schema = _strict(json.loads(schema_json))
    return Validator(
        schema, format_checker=Draft202012Validator.FORMAT_CHECKER, registry=NO_REMOTE_REFS
    )


def json_path(parts: Iterable[Any]) -> str:
    """``$.a.b[0]`` for the path parts of a jsonschema error."""
    out = "$"
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


def _describe(schema: Any) -> str:
    """A short hint of what a property expects: type, enum, format with an example."""
    if not isinstance(schema, dict):
        return ""
    bits = []
    if "enum" in schema:
        bits.append("one of " + ", ".join(_show(v) for v in schema["enum"]))
    elif "type" in schema:
        bits.append(
            schema["type"] if isinstance(schema["type"], str) else " or ".join(schema["type"])
        )
    if "format" in schema:
        example = FORMAT_EXAMPLES.get(schema["format"])
        bits.append(f"format {schema['format']}" + (f", e.g. {example}" if example else ""))
    if schema.get("description"):
        bits.append(str(schema["description"])[:120])
    return "; ".join(bits)


def _own_path_length(error: ValidationError) -> int:
    """Path parts an error adds for itself: ``required`` names the missing property."""
    return 1 if error.validator == "required" else 0


def _problems_from(error: ValidationError) -> list[Problem]:
    keyword = error.validator
    path = json_path(error.absolute_path)
    if keyword in ("anyOf", "oneOf") and error.context:
        # The value matched no alternative: report the alternatives' most telling failure.
        subs = [e for e in error.context if len(e.relative_path) == _own_path_length(e)]
        non_type = [e for e in subs if e.validator != "type"]
        chosen = non_type or subs or list(error.context)
        problems = _problems_from(min(chosen, key=lambda e: _precedence(_reason_of(e))))
        allowed = _alternatives(error.validator_value)
        if allowed:
            problems = [
                Problem(p.reason, p.path, f"{p.message.split(';')[0]}; expected {allowed}")
                for p in problems
            ]
        return problems
    if keyword == "required":  # one error per missing property, named by its path
        properties = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        name = error.path[-1] if error.path else None
        return [
            Problem(
                R.MISSING_REQUIRED,
                path,
                "required argument is missing"
                + (f" (expected {d})" if (d := _describe(properties.get(name))) else ""),
            )
        ]
    if keyword in ("additionalProperties", "unevaluatedProperties"):
        declared = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        extras = [k for k in (error.instance or {}) if k not in declared]
        accepted = ", ".join(declared) or "none"
        return [
            Problem(
                R.UNKNOWN_ARGUMENT,
                json_path([*error.absolute_path, name]),
                f"unknown argument: the tool does not declare it (accepted: {accepted})",
            )
            for name in extras
        ]
    if keyword == "type":
        expected = (
            error.validator_value
            if isinstance(error.validator_value, str)
            else " or ".join(error.validator_value)
        )
        return [
            Problem(
                R.TYPE_MISMATCH,
                path,
                f"expected {expected}, got {json_type(error.instance)} {_show(error.instance)}",
            )
        ]
    if keyword == "enum":
        return [
            Problem(
                R.ENUM_VIOLATION,
                path,
                f"{_show(error.instance)} is not allowed; expected one of "
                + ", ".join(_show(v) for v in error.validator_value),
            )
        ]
    if keyword == "const":
        return [
            Problem(
                R.ENUM_VIOLATION,
                path,
                f"{_show(error.instance)} is not allowed; expected {_show(error.validator_value)}",
            )
        ]
    if keyword == "format":
        example = FORMAT_EXAMPLES.get(error.validator_value)
        return [
            Problem(
                R.CONSTRAINT_VIOLATION,
                path,
                f"{_show(error.instance)} is not a valid {error.validator_value}"
                + (f"; expected e.g. {example}" if example else ""),
            )
        ]
    return [
        Problem(
            R.CONSTRAINT_VIOLATION,
            path,
            f"{_show(error.instance)} violates {keyword} {_show(error.validator_value)}",
        )
    ]


def _alternatives(options: Any) -> str:
    values: list[str] = []
    for option in options if isinstance(options, list) else []:
        if isinstance(option, dict) and "enum" in option:
            values.extend(_show(v) for v in option["enum"])
        elif isinstance(option, dict) and "const" in option:
            values.append(_show(option["const"]))
    return "one of " + ", ".join(values) if values else ""


def _reason_of(error: ValidationError) -> Reason:
    if error.validator in ("anyOf", "oneOf") and error.context:
        return min((_reason_of(e) for e in error.context), key=_precedence)
    return KEYWORD_REASONS.get(error.validator, R.CONSTRAINT_VIOLATION)


def _precedence(reason: Reason) -> int:
    return (
        PROPOSAL_PRECEDENCE.index(reason)
        if reason in PROPOSAL_PRECEDENCE
        else len(PROPOSAL_PRECEDENCE)
    )


def validate_arguments(
    arguments: dict, parameters: dict, *, schema_key: str | None = None
) -> list[Problem]:
    """Every problem of ``arguments`` against the contract's schema, in precedence order.
    An unusable schema is reported as a constraint problem, never raised."""
    try:
        validator = _validator(schema_key or json.dumps(parameters, sort_keys=True))
        _steps.left = MAX_VALIDATION_STEPS
        errors = list(islice(validator.iter_errors(arguments), MAX_VALIDATION_ERRORS))
    except ValidationBudgetExceeded:
        return [
            Problem(
                R.CONSTRAINT_VIOLATION,
                "$",
                f"the arguments are too costly to check against the tool's schema (more than "
                f"{MAX_VALIDATION_STEPS:,} checks); send fewer or smaller values",
            )
        ]
    except (
        SchemaError,
        Unresolvable,
        TypeError,
        ValueError,
        OverflowError,
        RecursionError,
        re2.error,
    ) as exc:
        return [
            Problem(
                R.CONSTRAINT_VIOLATION,
                "$",
                f"the tool's schema cannot be applied ({type(exc).__name__})",
            )
        ]
    problems = [p for error in errors for p in _problems_from(error)]
    unique = list(dict.fromkeys(problems))
    return sorted(unique, key=lambda p: (_precedence(p.reason), p.path))


# --- proposals ----------------------------------------------------------------------------


#: The re-ask budget of a tool with no contract (``unknown_tool`` included; TAXONOMY v2).
NO_CONTRACT_REASKS = 2


@dataclass(frozen=True)
class Context:
    """What the request and the model turn know of a proposal (TAXONOMY v2): how many times
    this tool was proposed with these canonical arguments in this request, this one included
    (``identical``), a sticky refusal of the same tool and arguments in this request, and the
    turn-level findings (``duplicate_call_id``: an earlier call of the turn had this call ID;
    ``in_flight``: an earlier call of the turn has the same tool and canonical arguments)."""

    identical: int = 1
    sticky: Verdict | None = None
    duplicate_call_id: bool = False
    in_flight: bool = False


NO_CONTEXT = Context()


def classify_proposal(
    proposal: Proposal,
    *,
    tools: Mapping[str, Contract],
    existing: Existing | None,
    arguments_digest: str,
    reasks_used: int,
    context: Context = NO_CONTEXT,
) -> Verdict:
    """Classify a proposed call at the gate (the precedence of ``TAXONOMY.md`` v2).

    ``tools``: the contracts registered for the agent, by name. ``existing``: the call
    already stored under the proposal's operation ID. ``arguments_digest``: SHA-256 of the
    canonical arguments without the contract's volatile ones (empty when they do not parse).
    ``reasks_used``: re-asks already spent for this request and tool. ``context``: the
    request's and the turn's findings (``Context``). Returns ``ALLOWED`` when the call may
    execute. Every reason routed ``reask`` passes through the re-ask budget (no contract:
    ``NO_CONTRACT_REASKS``)."""
    if proposal.malformed:
        return verdict(R.MALFORMED_CALL, observe_malformed(proposal.malformed, tools))
    contract = tools.get(proposal.tool or "")
    if contract is None:
        name = proposal.tool or ""
        result = verdict(R.UNKNOWN_TOOL, observe_unknown_tool(name, tools))
        return _reask_budget(result, name, NO_CONTRACT_REASKS, reasks_used)
    budget = (contract.name, contract.max_reasks, reasks_used)
    if not proposal.arguments_ok:
        result = verdict(
            R.INVALID_JSON,
            observe_invalid_json(contract, proposal.parse_error or "not a JSON object"),
        )
        return _reask_budget(result, *budget)
    if proposal.call_id_missing:
        return _reask_budget(verdict(R.MISSING_CALL_ID, observe_missing_call_id(contract)), *budget)
    if context.duplicate_call_id:
        return _reask_budget(
            verdict(R.DUPLICATE_CALL_ID, observe_duplicate_call_id(contract)), *budget
        )
    if context.identical > contract.max_identical:
        return verdict(R.LOOP_DETECTED, observe_loop(contract, context.identical))
    if context.sticky is not None:
        return context.sticky
    if (
        existing is not None
        and existing.arguments_digest
        and existing.arguments_digest != arguments_digest
    ):
        return verdict(R.IDEMPOTENCY_MISMATCH, observe_idempotency_mismatch(contract))
    if context.in_flight and contract.effect == "write":
        return verdict(R.DUPLICATE_IN_FLIGHT, observe_in_flight(contract))
    if existing is not None and existing.has_receipt:
        return verdict(R.DUPLICATE_SUPPRESSED, observe_duplicate(contract))
    problems = validate_arguments(
        proposal.arguments, contract.parameters, schema_key=contract.schema_key
    )
    if problems:
        result = verdict(
            problems[0].reason, observe_problems(contract, problems), problems=tuple(problems)
        )
        return _reask_budget(result, *budget)
    if contract.requires_approval:
        return verdict(R.APPROVAL_PENDING, observe_approval_pending(contract))
    return ALLOWED


def _reask_budget(result: Verdict, name: str, max_reasks: int, reasks_used: int) -> Verdict:
    """``reask_exhausted`` replaces a re-ask reason once the request's budget for the tool is
    spent (TAXONOMY "Precedence"). Its observation never invites another call."""
    if result.reason not in REASK_REASONS or reasks_used < max_reasks:
        return result
    found = [f"- {p.path}: {p.message}" for p in result.problems]
    return verdict(
        R.REASK_EXHAUSTED,
        f"{name} was not executed: {EXHAUSTED_CAUSE.get(result.reason, 'it failed again')} "
        f"(already re-asked {reasks_used} time(s) in this request). Stop calling {name} for "
        "this request and tell the user what went wrong."
        + ("\n" + "\n".join(found) if found else ""),
        problems=result.problems,
        underlying=result.reason,
    )


#: How a ``reask_exhausted`` observation names the cause it replaced.
EXHAUSTED_CAUSE = {
    R.UNKNOWN_TOOL: "no tool of that name is registered",
    R.INVALID_JSON: "its arguments are still not a valid JSON object",
    R.MISSING_CALL_ID: "the call still carries no identifier",
    R.DUPLICATE_CALL_ID: "the calls of one response still could not be told apart",
    R.UNKNOWN_ARGUMENT: "its arguments are still not valid",
    R.MISSING_REQUIRED: "its arguments are still not valid",
    R.TYPE_MISMATCH: "its arguments are still not valid",
    R.ENUM_VIOLATION: "its arguments are still not valid",
    R.CONSTRAINT_VIOLATION: "its arguments are still not valid",
    R.TOOL_ERROR: "the tool still reports an error",
    R.PARTIAL_FAILURE: "some of its items still fail",
    R.REFERENCE_NOT_FOUND: "the target still finds nothing for what the arguments refer to",
}


def spend_reask(result: Verdict, *, name: str, max_reasks: int, reasks_used: int) -> Verdict:
    """An execution outcome routed ``reask`` (``tool_error``, ``partial_failure``,
    ``reference_not_found``) through the request's re-ask budget, like a gate problem. The
    call ran: its observation says it failed again, keeps the first sentence of the cause
    that was read (when that sentence invites nothing) and never invites another call."""
    if result.reason not in REASK_REASONS or reasks_used < max_reasks:
        return result
    first = result.observation.split("\n")[0].split(". ")[0].strip().rstrip(".")
    cause = (
        f" {first}." if first and not re.search(r"again|retry|correct|change", first, re.I) else ""
    )
    return verdict(
        R.REASK_EXHAUSTED,
        f"{name} failed again (already re-asked {reasks_used} time(s) in this request): "
        f"{EXHAUSTED_CAUSE.get(result.reason, 'it still fails')}.{cause} Stop calling {name} "
        "for this request and tell the user what went wrong.",
        underlying=result.reason,
    )


# --- attempts and later events ------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """One execution as the agent reported it (``AttemptEvent``). ``jsonrpc_error`` is an MCP
    server's JSON-RPC error object ``{"code", "message", "data"?}``."""

    sent: bool | None
    outcome: str  # success | error | timeout | connection_reset | circuit_open
    http_status: int | None = None
    error: str | None = None
    result: Any = None
    result_count: int | None = None
    result_format: str | None = None
    jsonrpc_error: Mapping[str, Any] | None = None


def is_empty_result(result: Any, result_count: int | None) -> bool:
    if result_count == 0:
        return True
    return result is None or result == [] or result == {} or result == ""


def classify_attempt(
    attempt: Attempt,
    *,
    contract: Contract,
    attempts_used: int,
    deadline_passed: bool,
    tool_names: Iterable[str] = (),
    gate_passed: bool = True,
) -> Verdict:
    """Classify one execution. ``attempts_used`` counts executions including this one;
    ``tool_names`` are the agent's registered tools (named when a call without a contract
    turns out to be an unknown tool); ``gate_passed`` is False when the gate refused the call
    and the runtime executed it anyway (its server's -32602 then confirms bad arguments). The verdict's ``cause`` tells how the failure's cause
    was read (``callgate.causes``); ``retry_exhausted`` replaces a retryable reason once the
    attempts or the deadline run out (the re-ask budget is the caller's: ``spend_reask``)."""
    cause = attempt_cause(attempt, contract)
    if cause is None:
        result = attempt.result
        if attempt.result_format == "mcp" and isinstance(result, dict) and "content" in result:
            result = result.get("structuredContent") or result.get("content")
        return verdict(
            R.EMPTY_RESULT if is_empty_result(result, attempt.result_count) else R.OK, ""
        )
    reason = cause_reason(cause, contract, gate_passed=gate_passed)
    result = verdict(
        reason,
        observe_attempt(reason, cause, contract, tool_names),
        idempotent=contract.idempotent,
        cause=cause,
    )
    return _retry_budget(result, contract, attempts_used, deadline_passed)


def attempt_cause(attempt: Attempt, contract: Contract) -> causes.Cause | None:
    """How ``attempt`` failed (``callgate.causes``), or None when it succeeded and its result
    reports no failure (with the contract's ``result_error_markers``)."""
    mcp = attempt.result_format == "mcp"
    status = attempt.http_status
    if attempt.outcome == "success" and not attempt.jsonrpc_error:
        found = causes.read_result(attempt.result, mcp=mcp, markers=contract.result_error_markers)
        if found is not None or status is None or status < 400:
            return found
    rpc = attempt.jsonrpc_error or {}
    code = rpc.get("code") if isinstance(rpc.get("code"), int) else None
    if code is not None and 400 <= code <= 599 and (status is None or status < 400):
        status, code = code, None  # a server that puts the HTTP status in the JSON-RPC code
    texts = [attempt.error or ""]
    if isinstance(rpc.get("message"), str):
        texts.append(rpc["message"])
    if rpc.get("data") is not None:
        data = rpc["data"]
        texts.append(data if isinstance(data, str) else json.dumps(data, default=str))
    if not any(texts) and attempt.result is not None:  # an error result that tells its cause
        embedded = causes.read_result(attempt.result, mcp=mcp, markers=True)
        if embedded is not None and embedded.text:
            texts.append(embedded.text)
    source = (
        "the error text"
        if attempt.error
        else "the JSON-RPC error message"
        if len(texts) > 1 and rpc
        else "the result"
    )
    return causes.read_failure(
        causes.Failure(
            outcome=attempt.outcome,
            sent=attempt.sent,
            http_status=status,
            code=code,
            text="\n".join(t for t in texts if t),
            source=source,
        )
    )


def cause_reason(cause: causes.Cause, contract: Contract, *, gate_passed: bool = True) -> Reason:
    """The reason a cause maps to for this contract (TAXONOMY v2): timeouts, resets and
    server errors by the tool's effect and reconcilability, a 404 by what its text says of
    access and ``not_found_may_hide_forbidden``, JSON-RPC -32601/-32602 by whether the call
    had a contract and passed the gate's validation (``contract_drift``)."""
    kind = cause.kind
    if kind == causes.CIRCUIT_OPEN:
        return R.CIRCUIT_OPEN
    if kind == causes.NOT_SENT:
        return R.RATE_LIMITED if cause.status == 429 else R.UNAVAILABLE
    if kind in (causes.TIMEOUT, causes.RESET):
        return _unknown_outcome(contract)
    if kind == causes.REFUSED_VALID_CALL:
        if cause.code == -32601:  # method not found
            return R.CONTRACT_DRIFT if contract.registered else R.UNKNOWN_TOOL
        return R.CONTRACT_DRIFT if contract.registered and gate_passed else R.TOOL_ERROR
    if kind == causes.PARTIAL:
        return R.PARTIAL_FAILURE
    if kind == causes.STATUS and cause.status is not None:
        return _status_reason(cause, contract)
    return R.TOOL_ERROR  # the envelope refused, or an error of the tool's own


#: HTTP statuses with a reason of their own; any other 4xx is ``tool_error``, any other 5xx
#: an unknown outcome (by effect)
STATUS_REASONS = {
    401: R.AUTHENTICATION_FAILED,
    403: R.PERMISSION_DENIED,
    404: R.REFERENCE_NOT_FOUND,
    410: R.REFERENCE_NOT_FOUND,
    409: R.CONFLICT,
    429: R.RATE_LIMITED,
    503: R.UNAVAILABLE,
}


def _status_reason(cause: causes.Cause, contract: Contract) -> Reason:
    status = cause.status or 0
    if status == 404 and (contract.not_found_may_hide_forbidden or cause.speaks_of_access):
        return R.NOT_FOUND_OR_FORBIDDEN
    if status in STATUS_REASONS:
        return STATUS_REASONS[status]
    if status == 408 or status >= 500:  # 408 Request Timeout: a timeout like any other
        return _unknown_outcome(contract)
    return R.TOOL_ERROR


def _unknown_outcome(contract: Contract) -> Reason:
    if contract.effect != "write":
        return R.READ_FAILURE
    return R.OUTCOME_UNKNOWN if contract.reconcilable else R.NOT_RECONCILABLE


def _retry_budget(
    result: Verdict, contract: Contract, attempts_used: int, deadline_passed: bool
) -> Verdict:
    """``retry_exhausted`` replaces a retryable reason once attempts or deadline run out."""
    if result.route != Route.RETRY:
        return result
    if attempts_used < contract.max_attempts and not deadline_passed:
        return result
    assert result.reason is not None  # a retry route comes from a reason (``verdict``)
    why = (
        "its deadline has passed"
        if deadline_passed
        else f"all {contract.max_attempts} attempts are used"
    )
    return verdict(
        R.RETRY_EXHAUSTED,
        f"{contract.name} could not be completed: {why} (last failure: "
        f"{result.reason.replace('_', ' ')}). Do not call it again; an operator will review it.",
        underlying=result.reason,
        cause=result.cause,
    )


def classify_reconciled(
    *,
    found: bool,
    matches: bool,
    contract: Contract,
    attempts_used: int,
    deadline_passed: bool,
    current: Verdict | None = None,
) -> Verdict:
    """A look-up of the operation in the target system found it applied, absent or different.

    ``current`` is the call's verdict before the look-up. Which reason wins: a look-up that
    found the write applied with the requested arguments is ``reconciled_applied`` whatever
    the call said before (the effect is in the target; TAXONOMY: a later event can change a
    call's reason). Otherwise the look-up answers only a reason of ``LOOKUP_ANSWERS`` (the
    outcome was unknown): for any other failure (a 409 ``conflict``, ``permission_denied``,
    ``tool_error``, …) the target already said what happened, and "not found" or "another
    record" never weakens it into a retry: ``current`` is returned unchanged (issue 31)."""
    if current is not None and current.reason is not None and current.reason not in LOOKUP_ANSWERS:
        if not (found and matches):
            return current
    if found and matches:
        return verdict(
            R.RECONCILED_APPLIED,
            f"{contract.name} was applied (confirmed with the target system). "
            "Use its receipt; do not call it again.",
        )
    if found:
        return verdict(
            R.RECONCILE_MISMATCH,
            f"The target holds a record for this operation of {contract.name}, but with other "
            "content than requested. Do not retry; an operator will review it.",
        )
    if contract.idempotent:
        result = verdict(
            R.RECONCILED_ABSENT,
            f"The earlier attempt of {contract.name} did not reach the target; it is safe to "
            "retry under the same operation ID.",
            idempotent=True,
        )
        return _retry_budget(result, contract, attempts_used, deadline_passed)
    return verdict(
        R.RECONCILED_ABSENT,
        f"The earlier attempt of {contract.name} left no trace in the target, but the target does not "
        "deduplicate by operation ID; an operator decides whether to retry. Do not call it again.",
    )


def classify_receipt(*, contract_name: str) -> Verdict:
    """A late confirmation from the target: the write happened."""
    return verdict(
        R.RECONCILED_APPLIED,
        f"{contract_name} was applied (the target confirmed it late). Use its receipt; do not call it again.",
    )


def classify_denied(*, contract_name: str) -> Verdict:
    """The agent's runtime refused the actor. The runtime's reason is not repeated: it may
    name resources the actor must not see."""
    return verdict(R.PERMISSION_DENIED, observe_permission_denied(contract_name))


def classify_decision(
    *,
    decision: str,
    reason: str,
    contract_name: str,
    current: Reason | None,
    idempotent: bool = False,
) -> Verdict:
    """An operator's decision (TAXONOMY "Human decisions").

    ``approve`` of an approval lets the call execute (``approval_granted``, route ``proceed``,
    until its first attempt's classification replaces it); ``reject`` of an approval
    is ``approval_rejected`` with the operator's reason as the observation; ``approve_retry``
    sends the call back to ``retry``; ``mark_applied`` is ``reconciled_applied``; ``reject`` and
    ``mark_failed`` of an escalated call keep its reason with route ``stop``."""
    text = (reason or "").strip()
    said = f" Reason: {text}{'' if text.endswith(('.', '!', '?')) else '.'}" if text else ""
    if decision == "approve":
        return verdict(
            R.APPROVAL_GRANTED,
            f"An operator approved the call to {contract_name}; it may run.{said}",
        )
    if decision == "reject" and current in (R.APPROVAL_PENDING, None):
        return verdict(
            R.APPROVAL_REJECTED,
            f"An operator rejected the call to {contract_name}; it was not executed.{said} "
            "Do not retry it; tell the user.",
        )
    if decision == "mark_applied":
        return verdict(
            R.RECONCILED_APPLIED,
            f"An operator confirmed that {contract_name} was applied. Do not call it again.",
        )
    if decision == "approve_retry":
        return Verdict(
            reason=current,
            route=Route.RETRY,
            observation=f"An operator approved a retry of {contract_name} under the same operation ID.{said}",
        )
    if decision in ("reject", "mark_failed"):
        return Verdict(
            reason=current,
            route=Route.STOP,
            observation=f"An operator ended the call to {contract_name} without success.{said} "
            "Do not retry it; tell the user.",
        )
    raise ValueError(f"unknown decision {decision!r}")


def classify_approval_expired(*, contract_name: str) -> Verdict:
    return verdict(
        R.APPROVAL_EXPIRED,
        f"Nobody approved the call to {contract_name} before the approval timeout; it was not executed. "
        "Tell the user it needs approval.",
    )


def classify_deadline_passed(*, contract_name: str) -> Verdict:
    """A call still waiting to retry when its retry deadline passed: ``retry_exhausted``."""
    return verdict(
        R.RETRY_EXHAUSTED,
        f"{contract_name} could not be completed before its deadline. Do not call it again; "
        "an operator will review it.",
    )


# --- observation texts --------------------------------------------------------------------


def observe_malformed(why: str, tools: Mapping[str, Any]) -> str:
    names = ", ".join(sorted(tools)) or "none registered"
    return (
        f"Your output is not a recognisable tool call: {why}. To call a tool, emit one structured tool call "
        f"with the tool's name and a JSON object of arguments. Valid tools: {names}."
    )


def observe_unknown_tool(name: str, tools: Mapping[str, Any]) -> str:
    names = ", ".join(sorted(tools)) or "none registered"
    return (
        f"There is no tool named {_show(name)}. Valid tools: {names}. "
        "Call one of these by its exact name, or answer without a tool."
    )


def observe_invalid_json(contract: Contract, why: str) -> str:
    return (
        f"The arguments for {contract.name} are not a valid JSON object ({why}). Send the arguments as one "
        f"JSON object with double-quoted keys, no code fences and no trailing commas. {_expected(contract)}"
    )


def _expected(contract: Contract) -> str:
    properties = (
        contract.parameters.get("properties", {}) if isinstance(contract.parameters, dict) else {}
    )
    if not isinstance(properties, dict) or not properties:
        return ""
    required = set(contract.parameters.get("required", []) or [])
    parts = [
        f"{name}{'' if name in required else ' (optional)'}"
        + (f": {d}" if (d := _describe(s)) else "")
        for name, s in properties.items()
    ]
    return f"{contract.name} takes: " + "; ".join(parts) + "."


def observe_problems(contract: Contract, problems: list[Problem]) -> str:
    lines = [
        f"The call to {contract.name} was not executed: its arguments do not match the tool's schema."
    ]
    lines += [f"- {p.path}: {p.message}" for p in problems]
    lines.append(f"Fix every listed argument and call {contract.name} again.")
    return "\n".join(lines)


def observe_idempotency_mismatch(contract: Contract) -> str:
    return (
        f"This call to {contract.name} repeats an operation that was already made with other "
        "arguments, so it was not executed. Do not send it again; tell the user that this "
        "change needs a new request."
    )


def observe_missing_call_id(contract: Contract) -> str:
    return (
        f"The call to {contract.name} was not executed: it carried no identifier, so its result "
        f"could not be matched to it. Emit the call to {contract.name} once more as one complete "
        "structured tool call."
    )


def observe_duplicate_call_id(contract: Contract) -> str:
    return (
        f"The call to {contract.name} was not executed: it had the same identifier as an earlier "
        "call of the same response, so their results could not be told apart. The earlier call "
        f"is handled; emit this call to {contract.name} once more in your next response."
    )


def observe_in_flight(contract: Contract) -> str:
    return (
        f"This call to {contract.name} repeats an earlier call of the same response with the "
        "same arguments: it is the same action and runs only once. It was not executed; use "
        "the result of the first call."
    )


def observe_loop(contract: Contract, identical: int) -> str:
    return (
        f"{contract.name} was proposed {identical} times with the same arguments in this "
        f"request; it was not executed again. Stop calling {contract.name} with these "
        "arguments and tell the user what happened."
    )


def observe_duplicate(contract: Contract) -> str:
    return (
        f"This call to {contract.name} already succeeded; its stored receipt is returned and nothing was "
        "executed again. Do not call it again."
    )


def observe_approval_pending(contract: Contract) -> str:
    return f"{contract.name} needs a human approval before it runs. Wait for the decision; do not call it again."


def observe_permission_denied(contract_name: str) -> str:
    return (
        f"The call to {contract_name} was refused: the user you act for is not allowed to do this. "
        "Do not retry and do not try to reach the same resource another way; tell the user they lack permission."
    )


def observe_attempt(
    reason: Reason, cause: causes.Cause, contract: Contract, tool_names: Iterable[str] = ()
) -> str:
    """The observation for a failed execution (TAXONOMY v2 "Observation text"): it agrees
    with the route, names the cause that was read, advises changing the arguments only when
    the cause is about them, never names operation or call IDs, and quotes the target's text
    cut to ``causes.QUOTE_CHARS`` without markup or control characters. A refusal
    (``permission_denied``, ``not_found_or_forbidden``) quotes nothing of the target."""
    name = contract.name
    what = cause_words(cause)
    # a 2xx named in the target's text is no cause, and a failure is never "HTTP 200"; the
    # operation ID (which targets may echo as the idempotency key) belongs to the runtime
    quote = _OPERATION_ID.sub("…", _SUCCESS_STATUS.sub("…", causes.quote_target(cause.text)))
    said = f' The target said: "{quote}".' if quote else ""
    if reason == R.PERMISSION_DENIED:
        return observe_permission_denied(name)
    if reason == R.UNKNOWN_TOOL:
        return observe_unknown_tool(name, dict.fromkeys(tool_names))
    if reason == R.PARTIAL_FAILURE:
        return observe_partial_failure(name, cause)
    text = OBSERVATIONS.get(reason)
    if text is None:  # tool_error
        if cause.kind == causes.ENVELOPE:
            text = (
                "The server of {name} could not read the request{detail}.{said} This is not "
                "about your arguments; send the call to {name} once more, or answer without it."
            )
        elif about_arguments(cause):
            text = (
                "{name} refused the arguments{detail}.{said} Change the arguments to fix this, "
                "then call {name} again."
            )
        else:
            text = (
                "{name} reported an error{detail}.{said} If the error is about your arguments, "
                "change them and call {name} again; otherwise do not repeat the same call."
            )
    return text.format(name=name, what=what, detail=cause_detail(cause), said=said)


_OPERATION_ID = re.compile(r"\bop_[0-9a-f]{16,}\b")
_SUCCESS_STATUS = re.compile(r"(?i)\b(?:HTTP(?:/[\d.]+)?|status(?:[\s_-]?code)?)[\s:=]{0,3}2\d\d\b")

#: Observations by reason ({name}: the tool, {what}: the cause read in words, {detail}: the
#: HTTP status or JSON-RPC code named, in brackets, {said}: the target's text quoted). Retried
#: reasons need no new call from the model; refusals and unknown outcomes never invite one.
OBSERVATIONS: dict[Reason, str] = {
    R.RATE_LIMITED: (
        "{name} was rate limited by the target{detail}, so the call did not go through. It "
        "will be retried with the same arguments after a backoff; they need no change."
    ),
    R.UNAVAILABLE: (
        "{name} could not be carried out: {what}{detail}, so nothing was done. It will be "
        "retried with the same arguments after a backoff; they need no change."
    ),
    R.CIRCUIT_OPEN: (
        "{name} was not sent: {what} after repeated failures of its target. It will be retried "
        "with the same arguments after a backoff; they need no change."
    ),
    R.READ_FAILURE: (
        "{name} failed with a temporary error: {what}{detail}. It is safe to repeat and will be "
        "retried with the same arguments after a backoff; they need no change."
    ),
    R.OUTCOME_UNKNOWN: (
        "The outcome of {name} is unknown ({what}{detail}): the request may have reached the "
        "target, so the change may have been applied. Do not call {name} again; the target is "
        "being checked for this change first."
    ),
    R.NOT_RECONCILABLE: (
        "The outcome of {name} is unknown ({what}{detail}): the request may have reached the "
        "target, so the change may have been applied, and it cannot be looked up there. Do "
        "not call {name} again; an operator will review it."
    ),
    R.AUTHENTICATION_FAILED: (
        "The target refused the credential used for {name}{detail}. This is a configuration "
        "problem that neither other arguments nor a retry can solve; an operator will review "
        "it. Do not call {name} again; tell the user."
    ),
    R.NOT_FOUND_OR_FORBIDDEN: (
        "{name} was answered 'not found', but the target may hide a resource that this "
        "credential is not allowed to see, so your identifiers are not necessarily wrong. An "
        "operator will check the credential's access. Do not call {name} again for now; tell "
        "the user it is being checked."
    ),
    R.REFERENCE_NOT_FOUND: (
        "{name} failed: the target found nothing for something your arguments refer to"
        "{detail}.{said} Check the identifiers you used (do not invent them) and call {name} "
        "again with existing ones, or ask the user."
    ),
    R.CONFLICT: (
        "{name} hit a conflict in the target{detail}: the object changed while the call ran."
        "{said} Do not retry; an operator will review it."
    ),
    R.CONTRACT_DRIFT: (
        "The server of {name} refused a call that matches the tool's registered contract"
        "{detail}.{said} The contract no longer describes the server, so a different call "
        "cannot solve this; an operator will review it. Do not call {name} again for this "
        "request."
    ),
}

#: A failure whose cause is about the arguments: the target refused them as invalid.
_ABOUT_ARGUMENTS = re.compile(
    r"(?i)validat|invalid\s+(?:argument|param|value|input|field|format|type)|must\s+be\b|"
    r"\bis\s+required|required\s+(?:field|param|argument|property)|\bexpected\b|unprocessable|"
    r"bad\s+request|malformed|unknown\s+(?:field|param|argument|property)"
)


def about_arguments(cause: causes.Cause) -> bool:
    """True when the cause is about the arguments: HTTP 400 or 422, JSON-RPC -32602 of a call
    without a contract, or a text that speaks of validation."""
    return (
        cause.status in (400, 422)
        or cause.kind == causes.REFUSED_VALID_CALL
        or bool(_ABOUT_ARGUMENTS.search(cause.text))
    )


def cause_words(cause: causes.Cause) -> str:
    """The kind of failure that was read, in a few plain words for an observation."""
    kind = cause.kind
    if kind == causes.NOT_SENT:
        return "the target could not be reached before the request was sent"
    if kind == causes.CIRCUIT_OPEN:
        return "the circuit breaker is open"
    if kind == causes.TIMEOUT or cause.status == 408:
        return "it timed out"
    if kind == causes.RESET:
        return "the connection broke before the answer arrived"
    if cause.status == 503:
        return "the service is unavailable"
    if cause.status and cause.status >= 500:
        return "the server failed"
    return "the tool failed"


def cause_detail(cause: causes.Cause) -> str:
    """The HTTP status and JSON-RPC code that were named, in brackets (or nothing): an HTTP
    status only when one was named, so always 4xx or 5xx, never an operation ID."""
    named = []
    if cause.status_named and cause.status:
        named.append(f"HTTP {cause.status}")
    if cause.code is not None:
        name = causes.JSONRPC_NAMES.get(cause.code)
        named.append(f"JSON-RPC {cause.code}" + (f" {name}" if name else ""))
    return f" ({', '.join(named)})" if named else ""


def observe_partial_failure(name: str, cause: causes.Cause) -> str:
    """Names the failed items (at most 20) and says the others are done (TAXONOMY v2)."""
    shown = [
        f'"{causes.quote_target(item.item, 100)}"'
        + (f" ({causes.quote_target(item.error, 120)})" if item.error else "")
        for item in cause.failed_items[:20]
    ]
    more = cause.failed_count - len(shown)
    if shown:
        listed = ", ".join(shown) + (f" and {more} more" if more > 0 else "")
    else:
        listed = "the result does not name them"
    return (
        f"{name} partly failed: {cause.failed_count} item(s) failed: {listed}. The other items "
        f"succeeded and are done: do not send them again. If you call {name} again, send only "
        "the failed items, changed so that their errors do not recur."
    )
