"""OpenTelemetry traces in: ``POST /api/otlp/v1/traces`` (OTLP/HTTP) mapped to callgate's
wire events, which then take the same inbox and classifier as ``POST /api/v1/events``.

Sources of the rules:

- OTLP specification, "OTLP/HTTP": binary protobuf (``application/x-protobuf``) and JSON
  (``application/json``: trace and span IDs as hex, enums as integers, 64-bit integers as
  strings), optional ``Content-Encoding: gzip``; the answer is an
  ``ExportTraceServiceResponse`` in the request's encoding, with ``partial_success`` when
  some spans were rejected; failures carry a ``google.rpc.Status``; 429/503 with
  ``Retry-After`` are retryable.
- OpenTelemetry GenAI semantic conventions: ``chat`` spans (``gen_ai.operation.name``) whose
  ``gen_ai.output.messages`` hold ``tool_call`` parts, and ``execute_tool`` spans with
  ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.call.arguments``,
  ``gen_ai.tool.call.result``, ``error.type``; ``gen_ai.conversation.id``. MCP client spans:
  ``mcp.method.name = tools/call`` with ``rpc.jsonrpc.error_code`` / ``..error_message``.
- OpenInference semantic conventions: ``openinference.span.kind`` ``LLM`` spans with
  ``llm.output_messages.N.message.tool_calls.M.tool_call.{id,function.name,function.arguments}``
  and ``TOOL`` spans with ``tool.name``, ``input.value`` (the arguments; ``tool.parameters``
  is the tool's parameter schema, not the call's arguments), ``output.value``.

The mapping (``spans_to_events``) is pure; ``traces_receive`` stores what it maps. A model span's tool calls become a ``turn``
(``tool_calls_events``); a tool span becomes the attempt of its call, found by its tool-call ID
within the trace, else by tool name and canonical arguments. Every event ID derives from the
trace and span IDs (``uuid5``): a re-sent export adds nothing. Exporters send spans in
batches as they end, so a tool span may arrive without its model span: it then brings its
own proposal, which ``traces_receive`` drops when the call is already known (stored, or
waiting in the inbox), so that a call is proposed once whichever span comes first.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status
from pydantic import ValidationError

from callgate.inbox import events_receive
from callgate.models import InboxEvent, ToolCall
from callgate.schemas import EARLIEST, EVENT_ADAPTER, error_list
from callgate.tasks import drain_inbox_enqueue
from callgate_sdk.wire import MAX_JSON_DEPTH, canonical_json, derive_operation_id, json_depth

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
#: Largest body accepted as sent (compressed or not), bytes: larger is 413.
MAX_BODY_BYTES = 5 * 1024 * 1024
#: Largest body after decompression, bytes: larger is 413 (a gzip bomb stops here).
MAX_DECODED_BYTES = 20 * 1024 * 1024
#: Most spans in one export request: more is 413. The SDKs' batch processors send 512.
MAX_SPANS = 5_000
#: Error messages listed in ``partial_success.error_message`` (the count says how many in all).
MAX_MESSAGES = 5
#: Namespace of the event IDs derived from trace and span IDs (uuid5).
EVENT_NAMESPACE = uuid.UUID("5d0c3a57-6a8e-4f37-9a43-0b7e1f7c2a11")
#: What a successful tool span whose result was not recorded (content capture is opt-in in
#: the GenAI conventions) reports as its result: not empty, so it is not ``empty_result``.
NOT_RECORDED = {"note": "the span did not record the tool's result"}
#: A request ID or conversation ID given as a span attribute by the agent's code.
REQUEST_ID_ATTRIBUTE = "callgate.request_id"
MODEL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
#: An HTTP error status as ``error.type`` or ``http.response.status_code`` text ("429").
HTTP_ERROR = re.compile(r"[45][0-9]{2}", re.ASCII)
OPENINFERENCE_TOOL_CALL = re.compile(
    r"llm\.output_messages\.(\d+)\.message\.tool_calls\.(\d+)\.tool_call\."
    r"(id|function\.name|function\.arguments)"
)


class OtlpError(Exception):
    """A request refused as a whole: ``status`` is the HTTP status (400, 413, 415)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


# --- decoding and encoding ----------------------------------------------------------------


def media_type(content_type: str) -> str:
    """``application/json; charset=utf-8`` → ``application/json``."""
    return content_type.split(";", 1)[0].strip().lower()


def decode_request(body: bytes, *, content_type: str, content_encoding: str = "") -> Any:
    """The ``ExportTraceServiceRequest`` in ``body``. Raises ``OtlpError``: 415 for a media
    type other than protobuf or JSON, or a content encoding other than gzip/deflate/identity;
    413 past ``MAX_DECODED_BYTES`` once decompressed or ``MAX_SPANS`` spans; 400 when the body
    does not decode (truncated protobuf, invalid JSON, a field of the wrong type)."""
    kind = media_type(content_type)
    if kind not in (PROTOBUF, JSON):
        raise OtlpError(
            415,
            f"Content-Type must be {PROTOBUF} or {JSON} (OTLP/HTTP), got {content_type!r}.",
        )
    raw = _decompress(body, content_encoding.strip().lower())
    message = ExportTraceServiceRequest()
    if kind == PROTOBUF:
        try:
            message.ParseFromString(raw)
        except DecodeError as exc:
            raise OtlpError(400, f"The body is not a valid OTLP protobuf message: {exc}") from None
    else:
        try:
            document = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            raise OtlpError(400, f"The body is not valid JSON: {exc}") from None
        except RecursionError:
            raise OtlpError(400, "The body is nested too deeply to read.") from None
        if not isinstance(document, dict):
            raise OtlpError(400, "The body must be a JSON object (ExportTraceServiceRequest).")
        try:
            json_format.ParseDict(_hex_ids_to_base64(document), message, ignore_unknown_fields=True)
        except (json_format.ParseError, TypeError, ValueError, RecursionError) as exc:
            raise OtlpError(400, f"The body is not a valid OTLP/JSON message: {exc}") from None
    count = sum(len(s.spans) for r in message.resource_spans for s in r.scope_spans)
    if count > MAX_SPANS:
        raise OtlpError(
            413, f"The request has {count} spans; the limit is {MAX_SPANS} per request."
        )
    return message


def _decompress(body: bytes, encoding: str) -> bytes:
    if encoding in ("", "identity"):
        if len(body) > MAX_DECODED_BYTES:
            raise OtlpError(413, too_large_message(MAX_DECODED_BYTES))
        return body
    if encoding not in ("gzip", "deflate"):
        raise OtlpError(415, f"Content-Encoding must be gzip or absent, got {encoding!r}.")
    inflater = zlib.decompressobj(wbits=(16 if encoding == "gzip" else 0) + zlib.MAX_WBITS)
    try:
        raw = inflater.decompress(body, MAX_DECODED_BYTES + 1)
    except zlib.error as exc:
        raise OtlpError(400, f"The body is not valid {encoding}: {exc}") from None
    if len(raw) > MAX_DECODED_BYTES:
        raise OtlpError(413, too_large_message(MAX_DECODED_BYTES, decompressed=True))
    if not inflater.eof:
        raise OtlpError(400, f"The {encoding} body is truncated.")
    return raw


def too_large_message(limit: int, *, decompressed: bool = False) -> str:
    what = "decompressed body" if decompressed else "body"
    return f"The {what} is larger than the limit of {limit // (1024 * 1024)} MB ({limit} bytes)."


def _hex_ids_to_base64(document: dict) -> dict:
    """OTLP/JSON writes trace and span IDs as hex; protobuf's JSON mapping reads bytes as
    base64. Rewrites them in place; an ID that is not hex becomes empty (its span is then
    rejected for want of an ID, not the whole request)."""

    def convert(holder: Any, *keys: str) -> None:
        if not isinstance(holder, dict):
            return
        for key in keys:
            value = holder.get(key)
            if isinstance(value, str):
                try:
                    holder[key] = base64.b64encode(bytes.fromhex(value)).decode()
                except ValueError:
                    holder[key] = ""

    for resource in _items(document, "resourceSpans", "resource_spans"):
        for scope in _items(resource, "scopeSpans", "scope_spans"):
            for span in _items(scope, "spans"):
                convert(span, "traceId", "trace_id", "spanId", "span_id")
                convert(span, "parentSpanId", "parent_span_id")
                for link in _items(span, "links"):
                    convert(link, "traceId", "trace_id", "spanId", "span_id")
    return document


def _items(holder: Any, *keys: str) -> list:
    if not isinstance(holder, dict):
        return []
    for key in keys:
        value = holder.get(key)
        if isinstance(value, list):
            return value
    return []


def encode_response(*, json_encoding: bool, rejected: int, message: str) -> bytes:
    """An ``ExportTraceServiceResponse``; ``partial_success`` only when spans were rejected
    or there is a message (the specification leaves it unset on full success)."""
    response = ExportTraceServiceResponse()
    if rejected or message:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    return _encode(response, json_encoding)


#: gRPC status codes of ``google.rpc.Status`` for the HTTP statuses this receiver answers.
GRPC_CODE = {400: 3, 401: 16, 403: 7, 404: 5, 413: 3, 415: 3, 429: 8, 503: 14}


def encode_status(*, json_encoding: bool, http_status: int, message: str) -> bytes:
    """The body of a failed request: a ``google.rpc.Status`` (OTLP/HTTP "Failures")."""
    return _encode(
        status_pb2.Status(code=GRPC_CODE.get(http_status, 2), message=message), json_encoding
    )


def _encode(message: Any, json_encoding: bool) -> bytes:
    if json_encoding:
        return json_format.MessageToJson(message, indent=None).encode()
    return message.SerializeToString()


# --- spans ---------------------------------------------------------------------------------


class SpanRejected(Exception):
    """A span that cannot be used; the message names the span and the attribute."""


@dataclass
class SpanView:
    """One span, its IDs as hex and its attributes as Python values."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    failed: bool
    status_message: str
    start: datetime
    end: datetime

    def text(self, key: str) -> str | None:
        """A string attribute, ``None`` when absent; raises ``SpanRejected`` for another type."""
        value = self.attributes.get(key)
        if value is None or isinstance(value, str):
            return value
        raise SpanRejected(
            f"span {self.span_id}: attribute {key} must be a string, got {_type_name(value)}"
        )


def _type_name(value: Any) -> str:
    return {bool: "bool", int: "int", float: "double", list: "array", dict: "kvlist"}.get(
        type(value), type(value).__name__
    )


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind) if kind else None


def _attributes(pairs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def _time(nanos: int) -> datetime | None:
    """A span's Unix nanoseconds as a time; ``None`` for 0, before 2000 or past year 9999."""
    if not nanos:
        return None
    try:
        moment = datetime.fromtimestamp(nanos / 1e9, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return moment if moment > EARLIEST else None


#: What ``_json_text`` answers for a text that is not JSON (or nested past ``MAX_JSON_DEPTH``).
NOT_JSON = object()


def _json_text(text: str) -> Any:
    """The JSON value in an attribute's text, or ``NOT_JSON``."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return NOT_JSON
    return value if json_depth(value) <= MAX_JSON_DEPTH else NOT_JSON


def span_view(span: Any) -> SpanView:
    """A protobuf ``Span`` as a ``SpanView``; raises ``SpanRejected`` without valid IDs
    (16-byte trace ID and 8-byte span ID, not all zeros, as the specification requires)."""
    if len(span.trace_id) != 16 or not any(span.trace_id):
        raise SpanRejected(f"span {span.name!r} has no valid trace ID (16 bytes, not all zero)")
    if len(span.span_id) != 8 or not any(span.span_id):
        raise SpanRejected(f"span {span.name!r} has no valid span ID (8 bytes, not all zero)")
    start = _time(span.start_time_unix_nano)
    end = _time(span.end_time_unix_nano) or start or datetime.now(UTC)
    return SpanView(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(),
        name=span.name,
        attributes=_attributes(span.attributes),
        events=[(event.name, _attributes(event.attributes)) for event in span.events],
        failed=span.status.code == Status.STATUS_CODE_ERROR,
        status_message=span.status.message,
        start=start or end,
        end=end,
    )


@dataclass
class ToolCallSeen:
    """A tool call a model span proposed."""

    call_id: str | None
    tool: str
    arguments: Any  # a JSON string, or a structured value


@dataclass
class Mapped:
    """What ``spans_to_events`` made of a request: validated events, each with the span it
    came from (``(trace ID, span ID)``), in the order to apply them; and the spans rejected."""

    events: list[tuple[tuple[str, str], Any]] = field(default_factory=list)
    rejected: dict[tuple[str, str] | int, str] = field(default_factory=dict)
    spans: int = 0


def spans_to_events(request: Any) -> Mapped:
    """Map every span of an ``ExportTraceServiceRequest`` to wire events (``callgate.schemas``
    models, validated): the model spans' tool calls are proposed, the tool spans become
    attempts. Spans that are neither are accepted and ignored. A span that cannot be used
    (no IDs, an attribute of the wrong type, an event that does not validate) is in
    ``rejected`` with a message; the others are mapped whatever it holds."""
    mapped = Mapped()
    views: list[SpanView] = []
    position = 0
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                position += 1
                try:
                    views.append(span_view(span))
                except SpanRejected as exc:
                    mapped.rejected[position] = str(exc)
    mapped.spans = position
    by_trace: dict[str, list[SpanView]] = {}
    for view in views:
        by_trace.setdefault(view.trace_id, []).append(view)
    for spans in by_trace.values():
        _map_trace(spans, mapped)
    return mapped


def _map_trace(spans: list[SpanView], mapped: Mapped) -> None:
    """One trace's spans: proposals first (in span end order), then attempts."""
    request_id, conversation_id = _request_ids(spans, mapped)
    envelope = {"request_id": request_id, "trace_id": spans[0].trace_id}
    if conversation_id:
        envelope["conversation_id"] = conversation_id
    proposals: list[tuple[SpanView, dict]] = []
    attempts: list[tuple[SpanView, dict]] = []
    proposed: list[ToolCallSeen] = []
    tool_spans: list[tuple[SpanView, ToolSpan]] = []
    for span in sorted(spans, key=lambda s: s.end):
        try:
            calls = model_tool_calls(span)
            tool = tool_span(span) if not calls else None
        except SpanRejected as exc:
            mapped.rejected[(span.trace_id, span.span_id)] = str(exc)
            continue
        proposed += calls
        if calls:
            proposals += [
                (span, body)
                for body in tool_calls_events(calls=calls, request_id=request_id, span=span)
            ]
        elif tool is not None:
            tool_spans.append((span, tool))
    proposed_ids = {call.call_id for call in proposed if call.call_id}
    by_arguments: dict[tuple[str, bytes | str], ToolCallSeen] = {}  # filled when needed
    for span, tool in _without_mcp_children(tool_spans):
        call = None
        if tool.call_id is None:
            if not by_arguments:
                for seen in reversed(proposed):  # the first proposal of equal calls wins
                    by_arguments[(seen.tool, _arguments_key(seen.arguments))] = seen
            call = by_arguments.get((tool.name, _arguments_key(tool.arguments)))
            tool.call_id = call.call_id if call else None
        if (tool.call_id and tool.call_id not in proposed_ids) or (
            not tool.call_id and call is None
        ):
            # the model span is not in this request: the tool span brings the proposal
            seen = ToolCallSeen(call_id=tool.call_id, tool=tool.name, arguments=tool.arguments)
            proposals.append(
                (span, _proposed_event(seen, request_id=request_id, occurred_at=span.start))
            )
        attempts.append((span, _attempt_event(span, tool, request_id=request_id)))
    for span, body in proposals + attempts:
        key = (span.trace_id, span.span_id)
        if key in mapped.rejected:
            continue
        if json_depth(body) > MAX_JSON_DEPTH:
            mapped.rejected[key] = (
                f"span {span.span_id}: a value is nested deeper than {MAX_JSON_DEPTH} levels"
            )
            continue
        try:
            event = EVENT_ADAPTER.validate_python({**envelope, **body})
        except ValidationError as exc:
            first = error_list(exc)[0]
            mapped.rejected[key] = f"span {span.span_id}: {first['loc']}: {first['msg']}"
            continue
        mapped.events.append((key, event))


def _without_mcp_children(
    tool_spans: list[tuple[SpanView, ToolSpan]],
) -> list[tuple[SpanView, ToolSpan]]:
    """The tool spans less the MCP client spans inside another tool span of the request:
    such a span describes the same execution, so it only gives its JSON-RPC error to its
    parent's attempt."""
    by_span = {span.span_id: tool for span, tool in tool_spans}
    kept = []
    for span, tool in tool_spans:
        parent = by_span.get(span.parent_span_id)
        if tool.mcp and parent is not None:
            parent.jsonrpc = parent.jsonrpc or tool.jsonrpc
        else:
            kept.append((span, tool))
    return kept


def _request_ids(spans: list[SpanView], mapped: Mapped) -> tuple[str, str | None]:
    """The trace's request ID (``callgate.request_id``, else ``gen_ai.conversation.id``,
    else the trace ID) and conversation ID, from the first span that names them."""
    request_id = conversation_id = None
    for span in spans:
        try:
            request_id = request_id or span.text(REQUEST_ID_ATTRIBUTE)
            conversation_id = conversation_id or span.text("gen_ai.conversation.id")
        except SpanRejected as exc:
            mapped.rejected[(span.trace_id, span.span_id)] = str(exc)
    return request_id or conversation_id or spans[0].trace_id, conversation_id


def _arguments_key(arguments: Any) -> bytes | str:
    """Tool arguments compared by their canonical JSON (a string that is not JSON: itself)."""
    if isinstance(arguments, str):
        parsed = _json_text(arguments)
        if parsed is NOT_JSON:
            return arguments
        arguments = parsed
    try:
        return canonical_json(arguments)
    except (TypeError, ValueError):
        return repr(arguments)


# --- model spans: the proposed tool calls -------------------------------------------------


def model_tool_calls(span: SpanView) -> list[ToolCallSeen]:
    """The tool calls a model span proposed (GenAI ``gen_ai.output.messages``, OpenInference
    ``llm.output_messages.*``), in order; ``[]`` for any other span."""
    operation = span.text("gen_ai.operation.name")
    if operation == "execute_tool":
        return []
    raw = span.attributes.get("gen_ai.output.messages")
    if raw is not None and (operation in MODEL_OPERATIONS or operation is None):
        return _genai_tool_calls(span, raw)
    if span.text("openinference.span.kind") == "LLM":
        return _openinference_tool_calls(span)
    return []


def _genai_tool_calls(span: SpanView, raw: Any) -> list[ToolCallSeen]:
    if isinstance(raw, str):
        raw = _json_text(raw)
        if raw is NOT_JSON:
            raise SpanRejected(f"span {span.span_id}: gen_ai.output.messages is not valid JSON")
    if not isinstance(raw, list):
        raise SpanRejected(
            f"span {span.span_id}: gen_ai.output.messages must be an array of messages"
        )
    calls = []
    for message in raw:
        if not isinstance(message, dict):
            continue
        for part in message.get("parts") or []:  # the semantic conventions' shape
            if isinstance(part, dict) and part.get("type") == "tool_call":
                calls.append(_seen(span, part.get("id"), part.get("name"), part.get("arguments")))
        for item in message.get("tool_calls") or []:  # Chat Completions' shape, also seen
            function = item.get("function") if isinstance(item, dict) else None
            if isinstance(function, dict):
                calls.append(
                    _seen(span, item.get("id"), function.get("name"), function.get("arguments"))
                )
    return calls


def _openinference_tool_calls(span: SpanView) -> list[ToolCallSeen]:
    found: dict[tuple[int, int], dict[str, Any]] = {}
    for key, value in span.attributes.items():
        match = OPENINFERENCE_TOOL_CALL.fullmatch(key)
        if match:
            slot = found.setdefault((int(match.group(1)), int(match.group(2))), {})
            slot[match.group(3)] = value
    return [
        _seen(span, item.get("id"), item.get("function.name"), item.get("function.arguments"))
        for _, item in sorted(found.items())
    ]


def _seen(span: SpanView, call_id: Any, name: Any, arguments: Any) -> ToolCallSeen:
    if not isinstance(name, str) or not name:
        raise SpanRejected(f"span {span.span_id}: a tool call has no tool name")
    if call_id is not None and not isinstance(call_id, str):
        raise SpanRejected(
            f"span {span.span_id}: a tool call's id must be a string, got {_type_name(call_id)}"
        )
    return ToolCallSeen(call_id=call_id or None, tool=name, arguments=arguments)


def tool_calls_events(*, calls: list[ToolCallSeen], request_id: str, span: SpanView) -> list[dict]:
    """The events that propose a model span's tool calls: one ``turn`` (TAXONOMY "Whole model
    turns": the turn-level rules apply) in Chat Completions' shape when every call has its
    ID. A call the span recorded without an ID is not the model's fault (``missing_call_id``
    would blame it), so such spans propose each call on its own (``_proposed_event``)."""
    if not all(call.call_id for call in calls):
        return [
            _proposed_event(call, request_id=request_id, occurred_at=span.end) for call in calls
        ]
    return [
        {
            "type": "turn",
            "format": "openai",
            "event_id": str(uuid.uuid5(EVENT_NAMESPACE, f"{span.trace_id}/{span.span_id}/turn")),
            "occurred_at": span.end,
            "response": {
                "role": "assistant",
                "tool_calls": [_openai_call(call) for call in calls],
            },
        }
    ]


def _openai_call(call: ToolCallSeen) -> dict:
    """A Chat Completions ``tool_calls[]`` item (its ``arguments`` a JSON string)."""
    arguments = call.arguments
    text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.tool, "arguments": text},
    }


def _proposed_event(call: ToolCallSeen, *, request_id: str, occurred_at: datetime) -> dict:
    """A ``proposed`` event for one call: Chat Completions' shape when it has an ID, else
    plain with the operation ID its attempt names (``_operation_id``). Its event ID derives
    from the trace's request and the call ID, or the operation ID."""
    if call.call_id:
        body = {"format": "openai", "call": _openai_call(call), "call_id": call.call_id}
        identity = f"call:{call.call_id}"
    else:
        operation_id = _operation_id(call, request_id)
        body = {
            "format": "plain",
            "call": {"tool": call.tool, "arguments": call.arguments},
            "operation_id": operation_id,
        }
        identity = f"op:{operation_id}"
    return {
        "type": "proposed",
        "event_id": str(uuid.uuid5(EVENT_NAMESPACE, f"{request_id}/proposed/{identity}")),
        "occurred_at": occurred_at,
        **body,
    }


def _operation_id(call: ToolCallSeen, request_id: str) -> str:
    """The operation ID of an ID-less call, given on its proposal and its attempts alike:
    ``wire.derive_operation_id`` of the trace's request, the tool and the arguments."""
    key = _arguments_key(call.arguments)
    if isinstance(key, bytes):
        return derive_operation_id(request_id=request_id, tool=call.tool, canonical=key)
    return derive_operation_id(request_id=request_id, tool=call.tool, raw_arguments=key)


# --- tool spans: the attempts ---------------------------------------------------------------


@dataclass
class ToolSpan:
    """What a tool span says about one execution."""

    name: str
    call_id: str | None
    arguments: Any
    result: Any
    has_result: bool
    jsonrpc: tuple[int, str] | None = None
    mcp: bool = False  # an MCP client span (not an execute_tool span)


def tool_span(span: SpanView) -> ToolSpan | None:
    """The execution a tool span describes (GenAI ``execute_tool``, OpenInference ``TOOL``,
    an MCP client ``tools/call``), or ``None`` for any other span."""
    operation = span.text("gen_ai.operation.name")
    mcp = span.text("mcp.method.name") == "tools/call"
    if operation == "execute_tool" or mcp:
        name = span.text("gen_ai.tool.name")
        if not name and operation == "execute_tool" and span.name.startswith("execute_tool "):
            name = span.name.removeprefix("execute_tool ").strip()
        arguments = span.attributes.get("gen_ai.tool.call.arguments")
        result_key = "gen_ai.tool.call.result"
        call_id = span.text("gen_ai.tool.call.id")
    elif span.text("openinference.span.kind") == "TOOL":
        name = span.text("tool.name")
        # input.value holds the arguments; tool.parameters is the tool's parameter schema
        arguments = span.attributes.get("input.value")
        result_key = "output.value"
        call_id = span.text("tool_call.id")
    else:
        return None
    if not name:
        raise SpanRejected(f"span {span.span_id}: a tool span needs the tool's name")
    result = span.attributes.get(result_key)
    if isinstance(result, str) and (parsed := _json_text(result)) is not NOT_JSON:
        result = parsed
    return ToolSpan(
        name=name,
        call_id=call_id or None,
        arguments=arguments if arguments is not None else {},
        result=result,
        has_result=result_key in span.attributes,
        jsonrpc=_jsonrpc_error(span) if mcp else None,
        mcp=mcp and operation != "execute_tool",
    )


def _jsonrpc_error(span: SpanView) -> tuple[int, str] | None:
    code = span.attributes.get("rpc.jsonrpc.error_code")
    if isinstance(code, str) and re.fullmatch(r"-?\d{1,9}", code):
        code = int(code)
    if code is None:
        return None
    if type(code) is not int:
        raise SpanRejected(
            f"span {span.span_id}: attribute rpc.jsonrpc.error_code must be an int, "
            f"got {_type_name(code)}"
        )
    return code, span.text("rpc.jsonrpc.error_message") or ""


def jsonrpc_error_fields(code: int, message: str) -> tuple[dict, str]:
    """How an MCP server's JSON-RPC error travels on an attempt: its ``jsonrpc_error``
    field (TAXONOMY "Reading the cause of a failure", step 2) and the failure's text, which
    names the code as an MCP client says it ("MCP error -32601: Method not found")."""
    return {"jsonrpc_error": {"code": code, "message": message}}, (
        f"MCP error {code}: {message}".rstrip(": ")
    )


def _attempt_event(span: SpanView, tool: ToolSpan, *, request_id: str) -> dict:
    """The ``attempt`` a tool span reports: its status, ``error.type`` (an HTTP status when
    it is one), exception events and status message give the failure to read."""
    error_type = span.text("error.type")
    http_status = span.attributes.get("http.response.status_code")
    if isinstance(http_status, str) and HTTP_ERROR.fullmatch(http_status):
        http_status = int(http_status)
    if type(http_status) is not int or not 400 <= http_status <= 599:
        http_status = None
    named_status = bool(error_type and HTTP_ERROR.fullmatch(error_type))
    if named_status:
        assert error_type is not None  # named_status: error_type names an HTTP status
        http_status = http_status or int(error_type)
    failed = span.failed or bool(error_type) or tool.jsonrpc is not None
    texts: list[str] = []
    extra: dict = {}
    if tool.jsonrpc is not None:
        extra, text = jsonrpc_error_fields(*tool.jsonrpc)
        texts.append(text)
    for name, attributes in span.events:
        if name == "exception":
            kind, message = attributes.get("exception.type"), attributes.get("exception.message")
            texts.append(": ".join(str(p) for p in (kind, message) if p))
    texts.append(span.status_message)
    if error_type and not named_status and error_type != "_OTHER":
        texts.append(error_type)
    error = "; ".join(dict.fromkeys(t for t in texts if t)) or None
    body: dict[str, Any] = {
        "type": "attempt",
        "event_id": str(uuid.uuid5(EVENT_NAMESPACE, f"{span.trace_id}/{span.span_id}/attempt")),
        "occurred_at": span.end,
        "sent": True if (not failed or http_status) else None,
        "outcome": "error" if failed else "success",
        "http_status": http_status,
        "error": (error or "the span's status is ERROR") if failed else None,
        **extra,
    }
    if not failed:
        body["result"] = tool.result if tool.has_result else NOT_RECORDED
    if tool.call_id:
        body["call_id"] = tool.call_id
    else:
        seen = ToolCallSeen(call_id=None, tool=tool.name, arguments=tool.arguments)
        body["operation_id"] = _operation_id(seen, request_id)
    return body


def partial_message(mapped_rejected: dict, refused: list[str], total: int) -> str:
    """``partial_success.error_message``: how many spans were rejected and the first reasons."""
    reasons = list(mapped_rejected.values()) + refused
    if not reasons:
        return ""
    shown = "; ".join(reason[:300] for reason in reasons[:MAX_MESSAGES])
    more = f" (and {len(reasons) - MAX_MESSAGES} more)" if len(reasons) > MAX_MESSAGES else ""
    return f"{len(reasons)} of {total} spans rejected: {shown}{more}"


# --- receiving ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    """The answer to one export: how many spans were rejected, and why."""

    rejected: int
    message: str


def traces_receive(*, project: Any, agent: Any, request: Any) -> Received:
    """Map an ``ExportTraceServiceRequest`` (``spans_to_events``) and store its events in
    the inbox (``callgate.inbox.events_receive``, the path of ``POST /api/v1/events``), then
    enqueue the drain. A span is rejected when it cannot be mapped or the inbox refuses one of
    its events (clock skew, or an event ID already used for other content); every other
    span's events are stored, whatever the rejected ones held. Re-sent spans derive the same
    event IDs, so they are duplicates."""
    mapped = spans_to_events(request)
    mapped.events = _without_known_proposals(project, mapped.events)
    refused: list[str] = []
    rejected = set(mapped.rejected)
    if mapped.events:
        outcomes = events_receive(
            project=project, agent=agent, events=[event for _, event in mapped.events]
        )
        for (key, _), outcome in zip(mapped.events, outcomes, strict=True):
            if outcome.status in ("rejected", "conflict") and key not in rejected:
                rejected.add(key)
                error = outcome.errors[0] if outcome.errors else {"loc": "", "msg": "refused"}
                refused.append(f"span {key[1]}: {error['loc']} {error['msg']}".strip())
        if any(outcome.status == "accepted" for outcome in outcomes):
            drain_inbox_enqueue(project.pk)
    return Received(
        rejected=len(rejected),
        message=partial_message(mapped.rejected, refused, mapped.spans),
    )


def _call_keys(event: Any) -> set[tuple[str, str]]:
    """The calls a proposal or turn names: ``(request ID, call ID)``, or ``("", operation
    ID)`` for a call without an ID; empty for any other event."""
    if event.type == "proposed":
        if event.call_id:
            return {(event.request_id or "", event.call_id)}
        return {("", event.operation_id)} if event.operation_id else set()
    if event.type == "turn" and isinstance(event.response, dict):
        items = event.response.get("tool_calls") or []
        return {
            (event.request_id or "", item["id"])
            for item in items
            if isinstance(item, dict) and isinstance(item.get("id"), str)
        }
    return set()


def _without_known_proposals(project: Any, events: list) -> list:
    """``events`` without the proposals and turns whose every call callgate knows already:
    a ``ToolCall`` with that request and call ID (or operation ID), or a proposal or turn
    pending in the inbox that names it. Three queries, only when there are proposals."""
    wanted = {key for _, event in events for key in _call_keys(event)}
    if not wanted:
        return events
    requests = {event.request_id for _, event in events if _call_keys(event)}
    call_ids = {c for r, c in wanted if r}
    known = set(
        ToolCall.objects.filter(project=project, request_id__in=requests, call_id__in=call_ids)
        .values_list("request_id", "call_id")
        .order_by()
    )
    operations = {c for r, c in wanted if not r}
    if operations:
        known |= {
            ("", op)
            for op in ToolCall.objects.filter(
                project=project, operation_id__in=operations
            ).values_list("operation_id", flat=True)
        }
    pending = InboxEvent.objects.filter(
        project=project,
        status=InboxEvent.Status.PENDING,
        body__type__in=["proposed", "turn"],
        body__request_id__in=requests,
    ).values_list("body", flat=True)
    for body in pending:
        try:
            known |= _call_keys(EVENT_ADAPTER.validate_python(body))
        except ValidationError:
            continue
    return [
        (key, event)
        for key, event in events
        if not (_call_keys(event) and _call_keys(event) <= known)
    ]
