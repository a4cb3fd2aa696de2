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

from callgate.providers import Proposal, json_type, mcp_result_is_error, mcp_result_text
from callgate.taxonomy import (
    PROPOSAL_PRECEDENCE,
    REASK_REASONS,
    Category,
    Reason,
    Route,
    category_of,
    route_of,
)
from callgate.wire import canonical_json

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
MAX_ERROR_CHARS = 300


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
    raise NoSuchResource(ref=uri)


NO_REMOTE_REFS = Registry(retrieve=_refuse_retrieval)


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


def classify_proposal(
    proposal: Proposal,
    *,
    tools: Mapping[str, Contract],
    existing: Existing | None,
    arguments_digest: str,
    reasks_used: int,
) -> Verdict:
    """Classify a proposed call at the gate (precedence of ``TAXONOMY.md``).

    ``tools``: the contracts registered for the agent, by name. ``existing``: the call
    already stored under the proposal's operation ID. ``arguments_digest``: SHA-256 of the
    canonical arguments (empty when they do not parse). ``reasks_used``: re-asks already
    spent for this request and tool. Returns ``ALLOWED`` when the call may execute."""
    if proposal.malformed:
        return verdict(R.MALFORMED_CALL, observe_malformed(proposal.malformed, tools))
    contract = tools.get(proposal.tool or "")
    if contract is None:
        return verdict(R.UNKNOWN_TOOL, observe_unknown_tool(proposal.tool or "", tools))
    if not proposal.arguments_ok:
        result = verdict(
            R.INVALID_JSON,
            observe_invalid_json(contract, proposal.parse_error or "not a JSON object"),
        )
        return _reask_budget(result, contract, reasks_used)
    if (
        existing is not None
        and existing.arguments_digest
        and existing.arguments_digest != arguments_digest
    ):
        return verdict(R.IDEMPOTENCY_MISMATCH, observe_idempotency_mismatch(contract))
    if existing is not None and existing.has_receipt:
        return verdict(R.DUPLICATE_SUPPRESSED, observe_duplicate(contract))
    problems = validate_arguments(
        proposal.arguments, contract.parameters, schema_key=contract.schema_key
    )
    if problems:
        result = verdict(
            problems[0].reason, observe_problems(contract, problems), problems=tuple(problems)
        )
        return _reask_budget(result, contract, reasks_used)
    if contract.requires_approval:
        return verdict(R.APPROVAL_PENDING, observe_approval_pending(contract))
    return ALLOWED


def _reask_budget(result: Verdict, contract: Contract, reasks_used: int) -> Verdict:
    """``reask_exhausted`` replaces a re-ask reason once the budget is spent."""
    if result.reason in REASK_REASONS and reasks_used >= contract.max_reasks:
        return verdict(
            R.REASK_EXHAUSTED,
            f"The arguments for {contract.name} are still not valid after {reasks_used} correction(s); "
            f"stop calling {contract.name} for this request and tell the user what went wrong.\n"
            + result.observation,
            problems=result.problems,
            underlying=result.reason,
        )
    return result


# --- attempts and later events ------------------------------------------------------------

_CONNECT_ERRORS = re.compile(
    r"connection ?refused|ConnectError|name or service not known|nodename nor servname|"
    r"getaddrinfo|DNS|no route to host|network is unreachable",
    re.I,
)
_QUOTA_ERRORS = re.compile(r"rate.?limit|quota|too many requests", re.I)


@dataclass(frozen=True)
class Attempt:
    """One execution as the agent reported it."""

    sent: bool | None
    outcome: str  # success | error | timeout | connection_reset | circuit_open
    http_status: int | None = None
    error: str | None = None
    result: Any = None
    result_count: int | None = None
    result_format: str | None = None


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
    operation_id: str = "",
) -> Verdict:
    """Classify one execution. ``attempts_used`` counts executions including this one."""
    reason = attempt_reason(attempt, contract)
    if reason in (R.OK, R.EMPTY_RESULT):
        return verdict(reason, "")
    result = verdict(
        reason,
        observe_attempt(reason, attempt, contract, operation_id),
        idempotent=contract.idempotent,
    )
    return _retry_budget(result, contract, attempts_used, deadline_passed)


def attempt_reason(attempt: Attempt, contract: Contract) -> Reason:
    """The reason one attempt maps to (before budgets)."""
    status = attempt.http_status
    if attempt.outcome == "success":
        if attempt.result_format == "mcp" and mcp_result_is_error(attempt.result):
            return R.TOOL_ERROR
        if status is not None and status >= 400:
            return _status_reason(status, attempt, contract)
        result = attempt.result
        if attempt.result_format == "mcp" and isinstance(result, dict) and "content" in result:
            result = result.get("structuredContent") or result.get("content")
        return R.EMPTY_RESULT if is_empty_result(result, attempt.result_count) else R.OK
    if attempt.outcome == "circuit_open":
        return R.CIRCUIT_OPEN
    if attempt.sent is False:
        if status == 429 or _QUOTA_ERRORS.search(attempt.error or ""):
            return R.RATE_LIMITED
        return R.UNAVAILABLE
    if attempt.outcome in ("timeout", "connection_reset"):
        return _unknown_outcome(contract)
    if status is not None:
        return _status_reason(status, attempt, contract)
    error = attempt.error or ""
    if _CONNECT_ERRORS.search(error):
        return R.UNAVAILABLE
    if _QUOTA_ERRORS.search(error):
        return R.RATE_LIMITED
    return R.TOOL_ERROR  # an exception in the tool's own code


def _status_reason(status: int, attempt: Attempt, contract: Contract) -> Reason:
    if status == 401:
        return R.AUTHENTICATION_FAILED
    if status == 403:
        return R.PERMISSION_DENIED
    if status in (404, 410):
        return R.REFERENCE_NOT_FOUND
    if status == 409:
        return R.CONFLICT
    if status == 429:
        return R.RATE_LIMITED
    if status == 503:
        return R.UNAVAILABLE
    if 400 <= status < 500:
        return R.TOOL_ERROR
    if status >= 500:
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
    why = (
        "its deadline has passed"
        if deadline_passed
        else f"all {contract.max_attempts} attempts are used"
    )
    return verdict(
        R.RETRY_EXHAUSTED,
        f"{contract.name} could not be completed: {why} (last failure: {result.reason}). "
        "Do not call it again; an operator will review it.",
        underlying=result.reason,
    )


def classify_reconciled(
    *, found: bool, matches: bool, contract: Contract, attempts_used: int, deadline_passed: bool
) -> Verdict:
    """A look-up of the operation in the target system found it applied, absent or different."""
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

    ``approve`` of an approval lets the call execute (``ALLOWED``); ``reject`` of an approval
    is ``approval_rejected`` with the operator's reason as the observation; ``approve_retry``
    sends the call back to ``retry``; ``mark_applied`` is ``reconciled_applied``; ``reject`` and
    ``mark_failed`` of an escalated call keep its reason with route ``stop``."""
    text = (reason or "").strip()
    said = f" Reason: {text}{'' if text.endswith(('.', '!', '?')) else '.'}" if text else ""
    if decision == "approve":
        return ALLOWED
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
        f"This operation ID of {contract.name} was already used with different arguments; it was not executed. "
        "A different call needs a new operation ID."
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


def sanitise_error(error: str | None) -> str:
    """The target's error message without stack traces or file paths, shortened."""
    if not error:
        return ""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("Traceback", 'File "', "at ", "^"))]
    text = lines[-1] if lines else ""
    text = re.sub(r"(/[\w.\-]+){2,}", "…", text)
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def observe_attempt(
    reason: Reason, attempt: Attempt, contract: Contract, operation_id: str = ""
) -> str:
    name = contract.name
    status = f" (HTTP {attempt.http_status})" if attempt.http_status else ""
    error = sanitise_error(
        mcp_result_text(attempt.result)
        if attempt.result_format == "mcp" and not attempt.error
        else attempt.error
    )
    said = f": {error}" if error else ""
    op = f" (operation {operation_id})" if operation_id else ""
    if reason == R.PERMISSION_DENIED:
        return observe_permission_denied(name)
    if reason == R.AUTHENTICATION_FAILED:
        return (
            f"The target rejected the credentials used for {name}{status}. This is a configuration problem; "
            "retrying cannot help. An operator will review it."
        )
    if reason == R.REFERENCE_NOT_FOUND:
        return (
            f"{name} failed: the target found nothing for an entity your arguments refer to{status}{said}. "
            "Check the identifiers you used (do not invent them) and call it again with existing ones."
        )
    if reason in (R.RATE_LIMITED, R.UNAVAILABLE, R.CIRCUIT_OPEN, R.READ_FAILURE):
        return (
            f"{name} failed with a temporary error ({reason.replace('_', ' ')}{status}). It will be retried "
            "under the same operation ID after a backoff; do not change the arguments."
        )
    if reason == R.OUTCOME_UNKNOWN:
        return (
            f"The outcome of {name} is unknown{status}: the request may have been applied{op}. Do not call it "
            "again; the target system is being checked for this operation first."
        )
    if reason == R.NOT_RECONCILABLE:
        return (
            f"The outcome of {name} is unknown{status} and cannot be looked up in the target. Do not call it "
            "again; an operator will review it."
        )
    if reason == R.CONFLICT:
        return (
            f"{name} hit a conflict in the target{status}: the object changed while the call ran. Do not retry; "
            "an operator will review it."
        )
    return f"{name} failed{status}{said}. Correct the arguments if that helps, then call it again."
