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
- ``plain``: ``{"tool": name, "arguments": object-or-JSON-string}``.

Pure: no Django, no I/O. Never raises on any input: output that is not a recognisable
call comes back with ``malformed`` set, which classifies as ``malformed_call``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

FORMATS = ("openai", "openai_responses", "anthropic", "gemini", "mcp", "plain")

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
        if too_large is None or not (
            isinstance(exc, NotFinite) or "integer string conversion" in str(exc)
        ):
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
    needle = b"\\u" if isinstance(text, bytes) else "\\u"
    return _storable(value) if needle in text else value  # only escapes can produce them


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


def _arguments(tool: Any, raw: Any, call_id: Any, *, missing_ok: bool = False) -> Proposal:
    if not isinstance(tool, str) or not tool.strip():
        return _malformed("the call has no tool name", call_id)
    call_id = _str_or_none(call_id)
    if raw is _NO_VALUE or raw is None:
        if missing_ok:
            return Proposal(tool=tool, arguments={}, call_id=call_id)
        return Proposal(tool=tool, call_id=call_id, parse_error="no arguments were sent")
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
    if "tool_calls" in call or call.get("role") == "assistant":
        items = call.get("tool_calls") or []
        if not isinstance(items, list) or len(items) != 1 or not isinstance(items[0], dict):
            if call.get("content"):
                return _malformed("the model wrote text instead of a structured tool call")
            return _malformed(
                f"expected exactly one tool call, got {len(items) if isinstance(items, list) else 0}"
            )
        call = items[0]
    function = call.get("function")
    if not isinstance(function, dict):
        return _malformed("a Chat Completions tool call needs a 'function' object", call.get("id"))
    return _arguments(function.get("name"), function.get("arguments", _NO_VALUE), call.get("id"))


def _openai_responses(call: dict) -> Proposal:
    if call.get("type") not in (None, "function_call"):
        return _malformed(f"expected a 'function_call' item, got type {call.get('type')!r}")
    return _arguments(
        call.get("name"), call.get("arguments", _NO_VALUE), call.get("call_id") or call.get("id")
    )


def _anthropic(call: dict) -> Proposal:
    if call.get("type") not in (None, "tool_use"):
        return _malformed(f"expected a 'tool_use' block, got type {call.get('type')!r}")
    return _arguments(
        call.get("name"), call.get("input", _NO_VALUE), call.get("id"), missing_ok=True
    )


def _gemini(call: dict) -> Proposal:
    if "candidates" in call:
        candidates = call.get("candidates")
        if (
            not isinstance(candidates, list)
            or len(candidates) != 1
            or not isinstance(candidates[0], dict)
        ):
            return _malformed("expected exactly one Gemini candidate")
        candidate = candidates[0]
        content = candidate.get("content")
        if not isinstance(content, dict):
            finish = candidate.get("finishReason")
            return _malformed(
                f"the candidate has no content (finishReason {finish})"
                if finish
                else "the candidate has no content"
            )
        call = content
    if "parts" in call:
        parts = [p for p in call.get("parts") or [] if isinstance(p, dict) and "functionCall" in p]
        if len(parts) != 1:
            return _malformed(f"expected exactly one functionCall part, got {len(parts)}")
        call = parts[0]
    function = call.get("functionCall", call if "name" in call else None)
    if not isinstance(function, dict):
        return _malformed("a Gemini call needs a 'functionCall' part")
    return _arguments(
        function.get("name"), function.get("args", _NO_VALUE), function.get("id"), missing_ok=True
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
        params.get("name"), params.get("arguments", _NO_VALUE), call.get("id"), missing_ok=True
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
    "mcp": _mcp,
    "plain": _plain,
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
        return normaliser(call)
    except (AttributeError, TypeError, ValueError) as exc:  # odd shapes deep inside
        return _malformed(f"unrecognisable {format} call ({type(exc).__name__})")


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
