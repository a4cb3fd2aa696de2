"""Normalise a proposed tool call from each provider's wire format into one shape.

Formats (see ``shared/cases/README.md``):

- ``openai``: Chat Completions ``tool_calls[]`` item ``{"id", "type": "function",
  "function": {"name", "arguments": "<JSON string>"}}``; an assistant message with exactly
  one ``tool_calls`` item is accepted too.
- ``openai_responses``: Responses API item ``{"type": "function_call", "call_id", "name",
  "arguments": "<JSON string>"}``.
- ``anthropic``: Messages API content block ``{"type": "tool_use", "id", "name", "input": {}}``.
- ``gemini``: a part ``{"functionCall": {"name", "args": {}}}``, or a candidate/response
  wrapper whose content holds exactly one such part.
- ``mcp``: JSON-RPC 2.0 request ``{"jsonrpc": "2.0", "id", "method": "tools/call",
  "params": {"name", "arguments": {}}}`` (MCP spec 2025-06-18, "Calling Tools").
- ``bedrock`` (v2): a Converse ``toolUse`` block ``{"toolUseId", "name", "input": {}}`` (or
  ``{"toolUse": {...}}``).
- ``ollama`` (v2): a ``tool_calls[]`` item ``{"function": {"name", "arguments": {}}}``.
- ``plain``: ``{"tool": name, "arguments": object-or-JSON-string}``.

For ``mcp``, ``bedrock``, ``anthropic``, ``gemini`` and ``ollama`` the arguments are an object
on the wire: a string there is ``invalid_json``, never parsed (MCP servers refuse it;
TAXONOMY v2). Calls of ``openai``, ``openai_responses``, ``anthropic`` and ``bedrock`` carry
the provider's call ID; one without is flagged (``missing_call_id``).

``split_turn`` splits a whole model response (a ``turn`` event) into its calls, in order;
calls the provider executed itself (Anthropic ``server_tool_use`` / ``mcp_tool_use`` with
their ``*_tool_result`` blocks, Responses hosted tools such as ``web_search_call``) come
back with ``executed_by = "provider"`` and their result. A single call sent in an envelope
that holds several is flagged (``Proposal.turn_calls``, ``envelope_calls``): the runtime
must send a ``turn``.

Pure: no Django, no I/O. Never raises on any input: output that is not a recognisable
call comes back with ``malformed`` set, which classifies as ``malformed_call``.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, replace
from typing import Any

FORMATS = ("openai", "openai_responses", "anthropic", "gemini", "bedrock", "ollama", "mcp", "plain")
#: Formats whose arguments are a JSON object on the wire (a string there is invalid_json).
OBJECT_ARGUMENT_FORMATS = frozenset({"mcp", "bedrock", "anthropic", "gemini", "ollama"})
#: Formats whose calls carry the provider's call ID (one without is missing_call_id).
CALL_ID_FORMATS = frozenset({"openai", "openai_responses", "anthropic", "bedrock"})
#: Formats a ``turn`` event may use.
TURN_FORMATS = ("openai", "openai_responses", "anthropic", "gemini", "bedrock", "ollama")

_NO_VALUE = object()

#: What PostgreSQL's jsonb (and UTF-8) cannot hold: U+0000 and UTF-16 surrogates left unpaired
#: by a JSON ``\u`` escape (RFC 8259 §8.2 allows them; Unicode text cannot carry them).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class NotFinite(ValueError):
    """A JSON number beyond the range of a double (``1e400``): Python would read infinity."""


def finite_float(text: str) -> float:
    """``parse_float`` for ``json.loads``: the number, or ``NotFinite``."""
    value = float(text)
    if math.isinf(value):
        raise NotFinite(f"the number {text[:40]} is too large (beyond the range of a double)")
    return value


def too_many_digits(exc: ValueError) -> bool:
    """Whether ``exc`` is Python's refusal of an integer of more digits than it converts
    (``sys.get_int_max_str_digits()``)."""
    return "integer string conversion" in str(exc)


def number_problem(exc: ValueError) -> str:
    """What a ``ValueError`` of strict JSON number reading (``no_constants``,
    ``finite_float``, the digit limit) says, in words for the sender."""
    if too_many_digits(exc):
        return f"an integer of more than {sys.get_int_max_str_digits():,} digits cannot be read"
    return str(exc)


def no_constants(name: str):
    """``parse_constant`` for ``json.loads``: NaN and Infinity are not JSON (RFC 8259 §6)."""
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


class TooLarge:
    """Stands, in what ``loads(..., too_large=[])`` returns, for a number that cannot be read:
    beyond the range of a double, or an integer of more digits than Python converts
    (``sys.get_int_max_str_digits()``, 4,300 by default)."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return f"TooLarge({self.text[:40]!r})"

    @property
    def problem(self) -> str:
        return (
            f"the number {self.text[:40]}{'…' if len(self.text) > 40 else ''} is too large to read"
        )


def loads(text: str | bytes, *, too_large: list[TooLarge] | None = None) -> Any:
    """``json.loads`` that refuses NaN, Infinity and out-of-range numbers (``ValueError``) and
    replaces what cannot be stored (U+0000, unpaired surrogates) by U+FFFD, keys included.

    Given a ``too_large`` list, a number too large to read comes back as a ``TooLarge`` in its
    place instead, also appended to the list (``too_large_path`` finds where), so a batch can
    refuse the one item holding it. Only a text that has one is parsed a second time."""
    try:
        value = json.loads(text, parse_constant=no_constants, parse_float=finite_float)
    except ValueError as exc:
        if too_large is None or not (isinstance(exc, NotFinite) or too_many_digits(exc)):
            if too_many_digits(exc):
                raise ValueError(number_problem(exc)) from None
            raise

        def mark(number: str) -> TooLarge:
            too_large.append(TooLarge(number))
            return too_large[-1]

        def read_float(number: str) -> float | TooLarge:
            value = float(number)
            return mark(number) if math.isinf(value) else value

        def read_int(number: str) -> int | TooLarge:
            try:
                return int(number)
            except ValueError:  # more digits than Python converts
                return mark(number)

        value = json.loads(
            text, parse_constant=no_constants, parse_float=read_float, parse_int=read_int
        )
    escaped = b"\\u" in text if isinstance(text, bytes) else "\\u" in text
    return _storable(value) if escaped else value  # only escapes can produce them


def too_large_path(value: Any, path: str = "") -> tuple[str, TooLarge] | None:
    """The JSON path (``result[3].total``; ``""`` for the value itself) and the first
    ``TooLarge`` in ``value``, or None."""
    if isinstance(value, TooLarge):
        return path, value
    children = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in children:
        found = too_large_path(
            child, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key
        )
        if found:
            return found
    return None


def _storable(value: Any) -> Any:
    if isinstance(value, str):
        return _UNSTORABLE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_storable(v) for v in value]
    return value


@dataclass(frozen=True)
class Proposal:
    """One proposed call. ``arguments`` is the parsed JSON value (any type) when
    ``parse_error`` is None; ``raw_arguments`` is the string the provider sent, if any."""

    tool: str | None
    arguments: Any = None
    raw_arguments: str | None = None
    call_id: str | None = None
    parse_error: str | None = None
    malformed: str | None = None
    #: the format's calls carry IDs and this one has none (or an empty one)
    call_id_missing: bool = False
    #: > 1 when a single call was sent in an envelope holding that many calls
    turn_calls: int = 0

    @property
    def arguments_ok(self) -> bool:
        """True when the arguments are a JSON object."""
        return self.parse_error is None and isinstance(self.arguments, dict)


def _malformed(why: str, call_id: Any = None) -> Proposal:
    return Proposal(tool=None, call_id=_str_or_none(call_id), malformed=why)


def _str_or_none(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    return str(value)[:200]


def _arguments(
    tool: Any, raw: Any, call_id: Any, *, missing_ok: bool = False, object_only: bool = False
) -> Proposal:
    if not isinstance(tool, str) or not tool.strip():
        return _malformed("the call has no tool name", call_id)
    call_id = _str_or_none(call_id)
    if raw is _NO_VALUE or raw is None:
        if missing_ok:
            return Proposal(tool=tool, arguments={}, call_id=call_id)
        return Proposal(tool=tool, call_id=call_id, parse_error="no arguments were sent")
    if isinstance(raw, str) and object_only:
        return Proposal(
            tool=tool,
            raw_arguments=raw,
            call_id=call_id,
            parse_error="the arguments are a string; send them as a JSON object, not as text "
            "holding JSON",
        )
    if isinstance(raw, str):
        try:
            value = loads(raw)
        except (ValueError, RecursionError) as exc:
            return Proposal(
                tool=tool, raw_arguments=raw, call_id=call_id, parse_error=_json_error(exc, raw)
            )
        if not isinstance(value, dict):
            return Proposal(
                tool=tool,
                arguments=value,
                raw_arguments=raw,
                call_id=call_id,
                parse_error=f"the arguments are a JSON {json_type(value)}, not an object",
            )
        return Proposal(tool=tool, arguments=value, raw_arguments=raw, call_id=call_id)
    if isinstance(raw, dict):
        return Proposal(tool=tool, arguments=raw, call_id=call_id)
    return Proposal(
        tool=tool,
        arguments=raw,
        call_id=call_id,
        parse_error=f"the arguments are a JSON {json_type(raw)}, not an object",
    )


def _json_error(exc: Exception, raw: str) -> str:
    stripped = raw.strip()
    if stripped.startswith("```"):
        return "the arguments are wrapped in a markdown code fence"
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    if isinstance(exc, ValueError):
        return str(exc)
    return "the arguments are nested too deeply"


def json_type(value: Any) -> str:
    """The JSON Schema type name of a parsed JSON value (``integer`` apart from ``number``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _openai(call: dict) -> Proposal:
    function = call.get("function")
    if not isinstance(function, dict):
        return _malformed("a Chat Completions tool call needs a 'function' object", call.get("id"))
    return _arguments(function.get("name"), function.get("arguments", _NO_VALUE), call.get("id"))


def _ollama(call: dict) -> Proposal:
    function = call.get("function")
    if not isinstance(function, dict):
        return _malformed("an Ollama tool call needs a 'function' object", call.get("id"))
    return _arguments(
        function.get("name"),
        function.get("arguments", _NO_VALUE),
        call.get("id"),
        missing_ok=True,
        object_only=True,
    )


def _openai_responses(call: dict) -> Proposal:
    if call.get("type") not in (None, "function_call"):
        return _malformed(f"expected a 'function_call' item, got type {call.get('type')!r}")
    return _arguments(call.get("name"), call.get("arguments", _NO_VALUE), call.get("call_id"))


def _anthropic(call: dict) -> Proposal:
    if call.get("type") not in (None, "tool_use"):
        return _malformed(f"expected a 'tool_use' block, got type {call.get('type')!r}")
    return _arguments(
        call.get("name"),
        call.get("input", _NO_VALUE),
        call.get("id"),
        missing_ok=True,
        object_only=True,
    )


def _bedrock(call: dict) -> Proposal:
    if "toolUse" in call:
        call = call["toolUse"]
        if not isinstance(call, dict):
            return _malformed("a Converse 'toolUse' block must be an object")
    return _arguments(
        call.get("name"),
        call.get("input", _NO_VALUE),
        call.get("toolUseId"),
        missing_ok=True,
        object_only=True,
    )


def _gemini(call: dict) -> Proposal:
    function = call.get("functionCall", call if "name" in call else None)
    if not isinstance(function, dict):
        return _malformed("a Gemini call needs a 'functionCall' part")
    return _arguments(
        function.get("name"),
        function.get("args", _NO_VALUE),
        function.get("id"),
        missing_ok=True,
        object_only=True,
    )


def _mcp(call: dict) -> Proposal:
    if call.get("method") != "tools/call":
        return _malformed(
            f"expected a JSON-RPC 'tools/call' request, got method {call.get('method')!r}"
        )
    params = call.get("params")
    if not isinstance(params, dict):
        return _malformed("a tools/call request needs 'params'", call.get("id"))
    return _arguments(
        params.get("name"),
        params.get("arguments", _NO_VALUE),
        call.get("id"),
        missing_ok=True,
        object_only=True,
    )


def _plain(call: dict) -> Proposal:
    return _arguments(
        call.get("tool"), call.get("arguments", _NO_VALUE), call.get("id"), missing_ok=True
    )


_NORMALISERS = {
    "openai": _openai,
    "openai_responses": _openai_responses,
    "anthropic": _anthropic,
    "gemini": _gemini,
    "bedrock": _bedrock,
    "ollama": _ollama,
    "mcp": _mcp,
    "plain": _plain,
}


# --- whole model turns (TAXONOMY v2) ---------------------------------------------------------


@dataclass(frozen=True)
class ProviderResult:
    """What a provider-executed call's result block says, in the terms of an attempt."""

    outcome: str  # success | error
    sent: bool | None = True
    result: Any = None
    error: str | None = None
    http_status: int | None = None
    result_format: str | None = None  # "mcp" for an MCP CallToolResult


#: A provider-executed call whose result is missing from its turn: nothing came back.
RESULT_MISSING = ProviderResult(outcome="error", sent=False)


@dataclass(frozen=True)
class TurnCall:
    """One call of a model turn: the provider's item, its ``Proposal`` and who executes it.
    ``result`` is set for ``executed_by == "provider"`` (``RESULT_MISSING`` when absent)."""

    item: Any
    proposal: Proposal
    executed_by: str = "client"
    result: ProviderResult | None = None


class TurnError(ValueError):
    """A turn's envelope is not the format's model response; ``loc`` names the field."""

    def __init__(self, loc: str, msg: str):
        self.loc, self.msg = loc, msg
        super().__init__(msg)


#: Responses API items the provider executes itself (no separate result item).
RESPONSES_HOSTED = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "code_interpreter_call",
        "image_generation_call",
        "mcp_call",
    }
)
#: Anthropic blocks for calls the provider executes; their result blocks end in _tool_result.
ANTHROPIC_PROVIDER_USES = frozenset({"server_tool_use", "mcp_tool_use"})
#: Anthropic ``*_tool_result_error`` codes that name a cause (others are read as text).
ANTHROPIC_ERROR_STATUS = {"too_many_requests": 429, "unavailable": 503}


def _items(response: Any, key: str, loc: str) -> list:
    if not isinstance(response, dict):
        raise TurnError(
            loc, f"expected the model's response as a JSON object, got {json_type(response)}"
        )
    items = response.get(key)
    if items is None:
        return []
    if not isinstance(items, list):
        raise TurnError(f"{loc}.{key}", f"expected an array, got {json_type(items)}")
    return items


def _turn_openai(response: Any) -> list[TurnCall]:
    if isinstance(response, dict) and isinstance(response.get("choices"), list):
        choices = response["choices"]  # the whole Chat Completions answer
        if len(choices) != 1 or not isinstance(choices[0], dict):
            raise TurnError(
                "response.choices", "expected exactly one choice (send each as its own turn)"
            )
        response = choices[0].get("message")
    items = _items(response, "tool_calls", "response")
    return [TurnCall(item, normalise("openai", item)) for item in items]


def _turn_ollama(response: Any) -> list[TurnCall]:
    if isinstance(response, dict) and isinstance(response.get("message"), dict):
        response = response["message"]  # the /api/chat answer around the message
    items = _items(response, "tool_calls", "response")
    return [TurnCall(item, normalise("ollama", item)) for item in items]


def _turn_responses(response: Any) -> list[TurnCall]:
    out = []
    for item in _items(response, "output", "response"):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "function_call":
            out.append(TurnCall(item, normalise("openai_responses", item)))
        elif kind in RESPONSES_HOSTED:
            out.append(_hosted_call(item, kind))
    return out


def _hosted_call(item: dict, kind: str) -> TurnCall:
    """A Responses hosted tool item: ``completed`` is a success, ``failed`` a failure whose
    text is the item's ``error``, any other status (in progress, incomplete) ``unavailable``."""
    arguments = {
        k: v
        for k, v in item.items()
        if k not in ("type", "id", "status", "output", "error", "results")
    }
    tool = (
        item.get("name")
        if kind == "mcp_call" and isinstance(item.get("name"), str)
        else kind.removesuffix("_call")
    )
    proposal = Proposal(tool=tool, arguments=arguments, call_id=_str_or_none(item.get("id")))
    status = item.get("status")
    error = item.get("error")
    if error or status == "failed":
        text = (
            error
            if isinstance(error, str)
            else (error.get("message") if isinstance(error, dict) else None)
        )
        result = ProviderResult(outcome="error", error=str(text) if text else None)
    elif status == "completed" or (kind == "mcp_call" and status is None and "output" in item):
        result = ProviderResult(outcome="success", result=item.get("output", item))
    else:
        result = RESULT_MISSING
    return TurnCall(item, proposal, executed_by="provider", result=result)


def _turn_anthropic(response: Any) -> list[TurnCall]:
    blocks = [b for b in _items(response, "content", "response") if isinstance(b, dict)]
    results = {
        b.get("tool_use_id"): b
        for b in blocks
        if str(b.get("type", "")).endswith("_tool_result") and b.get("tool_use_id")
    }
    out = []
    for block in blocks:
        kind = block.get("type")
        if kind == "tool_use":
            out.append(TurnCall(block, normalise("anthropic", block)))
        elif kind in ANTHROPIC_PROVIDER_USES:
            proposal = _arguments(
                block.get("name"), block.get("input", _NO_VALUE), block.get("id"), missing_ok=True
            )
            found = results.get(block.get("id"))
            out.append(
                TurnCall(
                    block,
                    proposal,
                    executed_by="provider",
                    result=_anthropic_result(found) if found is not None else RESULT_MISSING,
                )
            )
    return out


def _anthropic_result(block: dict) -> ProviderResult:
    """An Anthropic ``*_tool_result`` block as an attempt: a ``*_tool_result_error`` content
    is a failure whose ``error_code`` names its cause (TAXONOMY v2); an ``mcp_tool_result``
    is an MCP ``CallToolResult``."""
    content = block.get("content")
    if isinstance(content, dict) and (
        str(content.get("type", "")).endswith("_error") or "error_code" in content
    ):  # web_search_tool_result_error, code_execution_tool_result_error, web_fetch_tool_error…
        code = str(content.get("error_code") or "")
        status = ANTHROPIC_ERROR_STATUS.get(code)
        return ProviderResult(
            outcome="error",
            http_status=status,
            error=code.replace("_", " ") if status is None else code,
        )
    if block.get("type") == "mcp_tool_result":
        return ProviderResult(
            outcome="success",
            result={
                "content": content if isinstance(content, list) else [],
                "isError": block.get("is_error") is True,
            },
            result_format="mcp",
        )
    if block.get("is_error") is True:
        return ProviderResult(outcome="error", error=str(content)[:2000] if content else None)
    return ProviderResult(outcome="success", result=content)


def _turn_gemini(response: Any) -> list[TurnCall]:
    if isinstance(response, dict) and "candidates" in response:
        candidates = response.get("candidates")
        if not isinstance(candidates, list) or len(candidates) != 1:
            raise TurnError(
                "response.candidates", "expected exactly one candidate (send each as its own turn)"
            )
        response = candidates[0]
    content = response.get("content") if isinstance(response, dict) else None
    if content is None and isinstance(response, dict) and "parts" in response:
        content = response
    if content is None:
        return []
    parts = _items(content, "parts", "response.content")
    return [
        TurnCall(part, normalise("gemini", part))
        for part in parts
        if isinstance(part, dict) and "functionCall" in part
    ]


def _turn_bedrock(response: Any) -> list[TurnCall]:
    if isinstance(response, dict) and isinstance(response.get("output"), dict):
        response = response["output"].get("message", response)  # the Converse answer
    blocks = _items(response, "content", "response")
    return [
        TurnCall(block, normalise("bedrock", block))
        for block in blocks
        if isinstance(block, dict) and "toolUse" in block
    ]


#: Where each format's response keeps its items (a turn sent as a bare list of them).
_LIST_KEYS = {
    "openai": "tool_calls",
    "ollama": "tool_calls",
    "openai_responses": "output",
    "anthropic": "content",
    "bedrock": "content",
    "gemini": "parts",
}

_TURN_SPLITTERS = {
    "openai": _turn_openai,
    "openai_responses": _turn_responses,
    "anthropic": _turn_anthropic,
    "gemini": _turn_gemini,
    "bedrock": _turn_bedrock,
    "ollama": _turn_ollama,
}


def split_turn(format: str, response: Any) -> list[TurnCall]:
    """The calls of one model response, in order (text, reasoning and result items are
    skipped; a provider-executed call carries its result). Raises ``TurnError`` when the
    envelope is not the format's response shape."""
    splitter = _TURN_SPLITTERS.get(format)
    if splitter is None:
        raise TurnError("format", f"a turn's format must be one of {', '.join(TURN_FORMATS)}")
    if isinstance(response, list):  # the items alone, without their message
        response = {_LIST_KEYS[format]: response}
    calls = splitter(response)
    return [_flag_id(format, c) for c in calls]


def _flag_id(format: str, turn_call: TurnCall) -> TurnCall:
    if (
        turn_call.executed_by == "client"
        and format in CALL_ID_FORMATS
        and not turn_call.proposal.malformed
        and not turn_call.proposal.call_id
    ):
        return TurnCall(turn_call.item, replace(turn_call.proposal, call_id_missing=True))
    return turn_call


#: The key that marks a whole response sent where one call belongs, per format.
_ENVELOPE_KEYS = {
    "openai": ("tool_calls", "role", "choices"),
    "ollama": ("tool_calls", "message", "role"),
    "openai_responses": ("output",),
    "anthropic": ("content", "role"),
    "bedrock": ("content", "output", "role"),
    "gemini": ("candidates", "content", "parts"),
}


def normalise(format: str, call: Any) -> Proposal:
    """The ``Proposal`` for a provider's call object. Never raises."""
    normaliser = _NORMALISERS.get(format)
    if normaliser is None:
        return _malformed(f"unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    if isinstance(call, str):
        return _malformed("the model wrote text instead of a structured tool call")
    if not isinstance(call, dict):
        return _malformed(f"expected a JSON object for the call, got {json_type(call)}")
    try:
        if any(key in call for key in _ENVELOPE_KEYS.get(format, ())):
            return _from_envelope(format, call)
        proposal = normaliser(call)
    except (AttributeError, TypeError, ValueError) as exc:  # odd shapes deep inside
        return _malformed(f"unrecognisable {format} call ({type(exc).__name__})")
    if format in CALL_ID_FORMATS and not proposal.malformed and not proposal.call_id:
        proposal = replace(proposal, call_id_missing=True)
    return proposal


def envelope_calls(format: str, call: Any) -> int:
    """How many tool calls a ``proposed`` event's ``call`` holds when it is a whole model
    response (an integration error when above 1: the runtime must send a ``turn``); 0 when it
    is not a response envelope. Cheap for an ordinary call (a few key look-ups)."""
    if not isinstance(call, dict) or not any(k in call for k in _ENVELOPE_KEYS.get(format, ())):
        return 0
    try:
        return len(split_turn(format, call))
    except (TurnError, AttributeError, TypeError, ValueError):
        return 0


def _from_envelope(format: str, call: dict) -> Proposal:
    """A whole response sent as one call: its one tool call, or flagged when it holds
    several (``turn_calls``), malformed when none."""
    try:
        calls = split_turn(format, call)
    except TurnError as exc:
        return _malformed(exc.msg)
    if len(calls) == 1 and calls[0].executed_by == "client":
        return calls[0].proposal
    if len(calls) > 1:
        return Proposal(
            tool=None, malformed=f"the call holds {len(calls)} tool calls", turn_calls=len(calls)
        )
    if call.get("content") and isinstance(call.get("content"), str):
        return _malformed("the model wrote text instead of a structured tool call")
    candidate = (call.get("candidates") or [None])[0] if format == "gemini" else None
    if isinstance(candidate, dict) and not candidate.get("content"):
        finish = candidate.get("finishReason")
        return _malformed(
            f"the candidate has no content (finishReason {finish})"
            if finish
            else "the candidate has no content"
        )
    return _malformed("expected exactly one tool call, got 0")


def mcp_result_is_error(result: Any) -> bool:
    """True for an MCP ``CallToolResult`` with ``isError: true``."""
    return isinstance(result, dict) and result.get("isError") is True


def mcp_result_text(result: Any) -> str:
    """The text content of an MCP ``CallToolResult`` (joined text parts)."""
    if not isinstance(result, dict) or not isinstance(result.get("content"), list):
        return ""
    return " ".join(
        str(part.get("text", ""))
        for part in result["content"]
        if isinstance(part, dict) and part.get("type") == "text"
    ).strip()
