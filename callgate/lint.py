"""Contract linter: scores how well a tool contract tells a model what to send.

Pure functions only (no Django, no database). The entry point is ``lint_contract``::

    report = lint_contract(name="create_follow_up", description="...", parameters={...})
    report.score        # int, 0..100 (100 = nothing to improve)
    report.findings     # list[Finding], in schema walk order
    report.as_dict()    # {"score": int, "findings": [{"path", "code", "message"}, ...]}

Paths name the field the finding is about: ``ticket_id``, ``task.title``, ``items[].name``
(array elements), ``contact.anyOf[1]`` (a member of a union), ``$defs.Address.street``,
``meta.*`` (values of a map). Two paths are not fields: ``(description)`` is the tool
description and ``(parameters)`` is the root parameters object.

Scoring: every finding carries the number of points it deducts (``weight``). Each code
has a per-finding weight and a cap on the total it can deduct, so a contract with twenty
undocumented fields loses at most the cap for that problem, not everything; findings past
the cap keep being listed with weight 0. ``score = max(0, 100 - sum(weights))``.
The result depends only on the arguments (dict order included), never on time or state.

The linter never raises on odd but valid JSON Schema: boolean schemas, missing types,
``$ref``, tuple ``items``, non-string values where strings are expected are all tolerated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Finding", "LintReport", "lint_contract", "CODES"]

TOOL_PATH = "(description)"
ROOT_PATH = "(parameters)"
MAX_DEPTH = 40

# code -> (points per finding, maximum points deducted for this code)
CODES: dict[str, tuple[int, int]] = {
    "vague_description": (15, 20),  # the actual weight depends on how vague, see below
    "parameters_not_object": (25, 25),
    "missing_description": (5, 35),
    "missing_enum": (5, 20),
    "missing_format": (5, 20),
    "missing_bounds": (3, 15),
    "missing_type": (3, 15),
    "missing_required": (4, 12),
    "array_without_items": (4, 12),
    "object_without_properties": (4, 12),
    "additional_properties": (1, 3),
}
_VAGUE_WEIGHTS = {"missing": 20, "repeats_name": 15, "generic": 12, "short": 10}
MIN_DESCRIPTION_CHARS = 20


@dataclass(frozen=True)
class Finding:
    """One problem: ``path`` of the field (see module doc), stable ``code`` (a key of
    ``CODES``), plain-words ``message`` for the agent developer, ``weight`` = points
    deducted from the score (0 once the code's cap is reached)."""

    path: str
    code: str
    message: str
    weight: int

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "code": self.code, "message": self.message}


@dataclass(frozen=True)
class LintReport:
    """``score`` 0..100 and the ``findings`` that explain it (empty list = score 100)."""

    score: int
    findings: list[Finding] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"score": self.score, "findings": [f.as_dict() for f in self.findings]}


# --------------------------------------------------------------------------- vocabulary

_STOPWORDS = frozenset(
    "a an the this that these those it its of for to and or in on at with by from into "
    "is are be was can will you your we our my me i as via if".split()
)
_GENERIC_WORDS = frozenset(
    "stuff things thing something anything helper helpers helping utility utilities util "
    "utils handle handles handler handling misc miscellaneous various generic general "
    "tool tools function functions func do does doing did perform performs process "
    "processes manage manages management operation operations action actions work works "
    "run runs execute executes api endpoint method call calls".split()
)
_NAME_ECHO_WORDS = frozenset("tool tools function func api endpoint method call calls".split())
_GENERIC_PHRASE = re.compile(
    r"\b(do(es)?|handles?|some|various|misc(ellaneous)?)\s+(stuff|things)\b"
    r"|\bstuff\b|\bmisc\b|\bhelper\b|\butility\b",
    re.IGNORECASE,
)

_CLOSED_SET_TOKENS = frozenset(
    "status type kind mode unit units currency category priority level state sort order "
    "direction format class severity role visibility".split()
)
# A closed-set word followed by one of these is free text or a number, not a choice.
_OPEN_TEXT_TOKENS = frozenset(
    "name names id ids uuid text title description desc message query url uri path note "
    "notes comment comments body content value values string key number count amount "
    "email label".split()
)
_EXAMPLE_HINT = re.compile(
    r"e\.g\.|\bfor example\b|\bsuch as\b|\bexample\b|\blike ['\"`]|ISO[ -]?8601|RFC[ -]?3339"
    r"|YYYY|\bformat\b",
    re.IGNORECASE,
)
_OPTIONS_HINT = re.compile(
    r"\bone of\b"
    r"|\beither\b.{1,60}?\bor\b"
    r"|[\w-]+\s*\|\s*[\w-]+"
    r"|(?<![/\w.:~])[A-Za-z][\w-]{0,19}(?:/[A-Za-z][\w-]{0,19})+(?![/\w.])"
    r"|(['\"`])[\w -]{1,30}\1\s*(?:,|\bor\b)\s*(['\"`])[\w -]{1,30}\2",
    re.IGNORECASE | re.DOTALL,
)
_NOT_OPTIONS = re.compile(r"\band/or\b|\bhttps?://", re.IGNORECASE)
# kind -> (what it looks like + what to add, what the model may send otherwise)
_FORMAT_ADVICE = {
    "date": ('a date: add `"format": "date"` (YYYY-MM-DD)', '"next Tuesday" or 06/07/26'),
    "date-time": (
        'a date-time: add `"format": "date-time"` (RFC 3339)',
        '"tomorrow 9am" without a time zone',
    ),
    "email": ('an email address: add `"format": "email"`', "a person's name"),
    "uuid": ('a UUID: add `"format": "uuid"`', "a made-up short ID"),
    "uri": ('a URL: add `"format": "uri"`', "a bare domain or a page title"),
    "id": (
        "an ID: add a `pattern` or `examples` with the real ID shape",
        "a name or an invented ID",
    ),
}
_BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_COMBINATORS = ("anyOf", "oneOf", "allOf")


# --------------------------------------------------------------------------- helpers


def _tokens(name: Any) -> list[str]:
    """Split ``dueAt``, ``due_at``, ``due-at``, ``DUE_AT`` into ``["due", "at"]``."""
    if not isinstance(name, str):
        return []
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    spaced = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", spaced)
    return [t for t in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if t]


def _singular(word: str) -> str:
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "uses", "xes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us")) and len(word) > 2:
        return word[:-1]
    return word


def _item_name(name: str | None) -> str | None:
    """Name used for the heuristics of an array's elements: ``ticket_ids`` -> ``ticket_id``."""
    toks = _tokens(name)
    if not toks:
        return name
    return "_".join(toks[:-1] + [_singular(toks[-1])])


def _types(schema: dict) -> set[str]:
    """Declared types (``"string"`` or ``["string", "null"]``), else inferred from keywords."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)}
    inferred = set()
    if any(k in schema for k in ("properties", "patternProperties", "required")):
        inferred.add("object")
    if any(k in schema for k in ("items", "prefixItems")):
        inferred.add("array")
    return inferred


def _has_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _label(path: str) -> str:
    return "The parameters object" if path == ROOT_PATH else f"`{path}`"


def _join(parent: str, child: str) -> str:
    return child if parent == ROOT_PATH else f"{parent}.{child}"


def _closed_set_name(toks: list[str]) -> bool:
    if not toks:
        return False
    if toks[-1] in _CLOSED_SET_TOKENS:
        return True
    return toks[-1] not in _OPEN_TEXT_TOKENS and any(t in _CLOSED_SET_TOKENS for t in toks)


def _format_kind(toks: list[str]) -> str | None:
    """What a string field with these name tokens most likely holds, or None."""
    if not toks:
        return None
    last = toks[-1]
    if last in ("uuid", "guid"):
        return "uuid"
    if last == "id" or (len(toks) == 1 and last in ("id", "ids")):
        return "id"
    if last == "email" or toks[-2:] == ["email", "address"]:
        return "email"
    if last in ("url", "uri", "href"):
        return "uri"
    if last in ("time", "datetime", "timestamp", "deadline") or toks[0] in (
        "datetime",
        "timestamp",
    ):
        return "date-time"
    if last == "at" and len(toks) > 1:
        return "date-time"
    if "date" in toks or last == "dob" or (last == "on" and len(toks) > 1):
        return "date"
    if "due" in toks or "deadline" in toks:
        return "date-time"
    return None


def _lists_options(description: Any) -> bool:
    if not isinstance(description, str) or _NOT_OPTIONS.search(description):
        return False
    return bool(_OPTIONS_HINT.search(description))


# --------------------------------------------------------------------------- walker


class _Linter:
    def __init__(self, parameters: Any) -> None:
        self.findings: list[tuple[str, str, str, int]] = []
        self.root = parameters if isinstance(parameters, dict) else {}
        self._stack: set[int] = set()

    def add(self, path: str, code: str, message: str, weight: int | None = None) -> None:
        self.findings.append((path, code, message, CODES[code][0] if weight is None else weight))

    def resolve(self, ref: Any) -> dict | None:
        """Follow a local ``#/...`` reference (JSON Pointer); None when it leads nowhere."""
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return None
        node: Any = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node if isinstance(node, dict) else None

    def described(self, schema: dict) -> bool:
        if _has_text(schema.get("description")):
            return True
        target = self.resolve(schema.get("$ref"))
        return bool(target is not None and _has_text(target.get("description")))

    # -- one schema node

    def walk(self, schema: Any, path: str, name: str | None, *, is_field: bool, depth: int) -> None:
        """Lint ``schema`` found at ``path``. ``name`` drives the naming heuristics;
        ``is_field`` is true for named properties (they need their own description)."""
        if depth > MAX_DEPTH:
            return
        if schema is True:  # accepts anything: for a field that is an empty schema
            schema = {}
        if not isinstance(schema, dict):
            return  # `false`, or not a schema at all: nothing a model could be told
        if id(schema) in self._stack:
            return  # a cyclic Python structure (cannot come from JSON)
        self._stack.add(id(schema))
        try:
            self._check(schema, path, name, is_field=is_field)
            self._children(schema, path, name, depth=depth)
        finally:
            self._stack.discard(id(schema))

    def _check(self, schema: dict, path: str, name: str | None, *, is_field: bool) -> None:
        label = _label(path)
        types = _types(schema)
        has_ref = "$ref" in schema
        constrained = "enum" in schema or "const" in schema
        union = any(k in schema for k in (*_COMBINATORS, "not", "if"))
        toks = _tokens(name)
        description = schema.get("description")

        if is_field and not self.described(schema):
            self.add(
                path,
                "missing_description",
                f"{label} has no description: the model has to guess what it means.",
            )

        if is_field and not types and not (has_ref or constrained or union):
            self.add(
                path,
                "missing_type",
                f"{label} has no type: say whether it is a string, number, integer, "
                "boolean, object or array, or the model will pick one.",
            )

        if "string" in types and not constrained:
            open_shape = not any(k in schema for k in ("format", "pattern"))
            kind = _format_kind(toks)
            closed_by_name = _closed_set_name(toks) and (
                kind is None or toks[-1] in _CLOSED_SET_TOKENS
            )
            if open_shape and _lists_options(description):
                self.add(
                    path,
                    "missing_enum",
                    f"{label} lists its allowed values in the description only: put them "
                    "in `enum` so the model picks one of them instead of paraphrasing.",
                )
            elif open_shape and closed_by_name:
                self.add(
                    path,
                    "missing_enum",
                    f"{label} looks like a fixed set of values but has no `enum`: list the "
                    "allowed values so the model cannot invent one.",
                )
            elif kind is not None and not self._has_shape_hint(schema):
                advice, risk = _FORMAT_ADVICE[kind]
                extra = "" if kind == "id" else ", a `pattern` or `examples`"
                self.add(
                    path,
                    "missing_format",
                    f"{label} looks like {advice}{extra}; otherwise the model may send {risk}.",
                )

        if types & {"number", "integer"} and not constrained:
            if not any(k in schema for k in _BOUND_KEYS):
                self.add(
                    path,
                    "missing_bounds",
                    f"{label} is a number without bounds: add `minimum`/`maximum` so the "
                    "model cannot send 0, negative or absurdly large values.",
                )

        if "object" in types:
            props = schema.get("properties")
            has_props = isinstance(props, dict) and len(props) > 0
            if has_props and "required" not in schema:
                self.add(
                    path,
                    "missing_required",
                    f"{label} has properties but no `required` list: the model cannot tell "
                    "which fields it must send (use [] if all are optional).",
                )
            map_schema = isinstance(schema.get("additionalProperties"), dict) or isinstance(
                schema.get("patternProperties"), dict
            )
            if (
                path != ROOT_PATH
                and not isinstance(props, dict)
                and not map_schema
                and not (has_ref or union)
            ):
                self.add(
                    path,
                    "object_without_properties",
                    f"{label} is an object without `properties`: the model has to guess "
                    "its keys; declare them (or an `additionalProperties` schema for a map).",
                )
            if schema.get("additionalProperties") is True:
                self.add(
                    path,
                    "additional_properties",
                    f"{label} sets `additionalProperties: true`: callgate rejects unknown "
                    "fields anyway, so this only invites the model to add some; drop it "
                    "or set it to false.",
                )

        if "array" in types and "items" not in schema and "prefixItems" not in schema:
            if not (has_ref or union):
                self.add(
                    path,
                    "array_without_items",
                    f"{label} is an array without `items`: the model does not know what "
                    "each element should look like.",
                )

    @staticmethod
    def _has_shape_hint(schema: dict) -> bool:
        if any(k in schema for k in ("format", "pattern", "examples", "example")):
            return True
        description = schema.get("description")
        return isinstance(description, str) and bool(_EXAMPLE_HINT.search(description))

    def _children(self, schema: dict, path: str, name: str | None, *, depth: int) -> None:
        nxt = depth + 1
        props = schema.get("properties")
        if isinstance(props, dict):
            for key, sub in props.items():
                key = str(key)
                self.walk(sub, _join(path, key), key, is_field=True, depth=nxt)

        pattern_props = schema.get("patternProperties")
        if isinstance(pattern_props, dict):
            for sub in pattern_props.values():
                self.walk(sub, _join(path, "*"), None, is_field=False, depth=nxt)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            self.walk(extra, _join(path, "*"), None, is_field=False, depth=nxt)

        base = "" if path == ROOT_PATH else path
        items = schema.get("items")
        if isinstance(items, dict):
            self.walk(items, f"{base}[]", _item_name(name), is_field=False, depth=nxt)
        elif isinstance(items, list):  # draft-07 tuple form
            for i, sub in enumerate(items):
                self.walk(sub, f"{base}[{i}]", _item_name(name), is_field=False, depth=nxt)
        prefix = schema.get("prefixItems")
        if isinstance(prefix, list):
            for i, sub in enumerate(prefix):
                self.walk(sub, f"{base}[{i}]", _item_name(name), is_field=False, depth=nxt)

        for keyword in _COMBINATORS:
            members = schema.get(keyword)
            if isinstance(members, list):
                for i, sub in enumerate(members):
                    self.walk(sub, _join(path, f"{keyword}[{i}]"), name, is_field=False, depth=nxt)

        for keyword in ("$defs", "definitions"):
            defs = schema.get(keyword)
            if isinstance(defs, dict):
                for key, sub in defs.items():
                    key = str(key)
                    self.walk(sub, _join(path, f"{keyword}.{key}"), key, is_field=False, depth=nxt)


# --------------------------------------------------------------------------- tool level


def _description_vagueness(name: str, description: str) -> tuple[str, str] | None:
    """(kind, message) when the tool description does not tell the model enough."""
    text = description.strip()
    quoted = text if len(text) <= 60 else text[:57] + "..."
    advice = "say what it does, what it returns and when to use it."
    if not text:
        return "missing", (
            f"The tool has no description: the model has to guess from the name "
            f"`{name}` when to call it and what it does; {advice}"
        )
    name_toks = set(_tokens(name))
    desc_toks = _tokens(text)
    meaningful = [t for t in desc_toks if t not in _STOPWORDS]
    if name_toks and all(t in name_toks or t in _NAME_ECHO_WORDS for t in meaningful):
        return "repeats_name", (
            f'The tool description "{quoted}" only repeats the name `{name}`: {advice}'
        )
    content = [
        t for t in meaningful if t not in _GENERIC_WORDS and t not in name_toks and len(t) > 1
    ]
    generic = _GENERIC_PHRASE.search(text)
    if generic or (len(content) < 2 and any(t in _GENERIC_WORDS for t in desc_toks)):
        word = generic.group(0) if generic else next(t for t in desc_toks if t in _GENERIC_WORDS)
        which = "" if word.lower() == text.lower() else f' ("{word}")'
        return "generic", f'The tool description "{quoted}" is generic{which}: {advice}'
    if len(text) < MIN_DESCRIPTION_CHARS:
        return "short", (
            f'The tool description "{quoted}" is very short ({len(text)} characters): {advice}'
        )
    return None


# --------------------------------------------------------------------------- entry point


def lint_contract(*, name: str, description: str, parameters: dict) -> LintReport:
    """Score one tool contract version.

    ``name``: tool name; ``description``: tool description shown to the model;
    ``parameters``: the JSON Schema of the arguments (normally ``{"type": "object", ...}``).
    Returns a ``LintReport`` (score 0..100, findings in walk order: tool description first,
    then the schema depth-first). Never raises for any input, including non-dict
    ``parameters`` or non-string ``name``/``description``.
    """
    name = name if isinstance(name, str) else ""
    description = description if isinstance(description, str) else ""
    linter = _Linter(parameters)

    vague = _description_vagueness(name, description)
    if vague is not None:
        kind, message = vague
        linter.add(TOOL_PATH, "vague_description", message, _VAGUE_WEIGHTS[kind])

    if parameters is True or parameters is False or not isinstance(parameters, (dict, bool)):
        linter.add(
            ROOT_PATH,
            "parameters_not_object",
            "The parameters are not a JSON Schema object: declare "
            '`{"type": "object", "properties": {...}}` so the model knows '
            "what to send.",
        )
    else:
        root_types = _types(parameters)
        if root_types and "object" not in root_types:
            linter.add(
                ROOT_PATH,
                "parameters_not_object",
                "The parameters schema is not of type object: providers expect "
                '`{"type": "object", "properties": {...}}` with one key per argument.',
            )
        linter.walk(parameters, ROOT_PATH, None, is_field=False, depth=0)

    findings: list[Finding] = []
    spent: dict[str, int] = {}
    for path, code, message, weight in linter.findings:
        cap = CODES[code][1]
        used = spent.get(code, 0)
        points = max(0, min(weight, cap - used))
        spent[code] = used + points
        findings.append(Finding(path=path, code=code, message=message, weight=points))
    score = max(0, 100 - sum(f.weight for f in findings))
    return LintReport(score=score, findings=findings)
