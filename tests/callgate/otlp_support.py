"""Traces for the OTLP tests, made by the real ``opentelemetry-sdk`` (spans recorded in
memory) and encoded by the exporter's own encoder: an agent turn in which the model proposes
two tool calls and the runtime executes them, one succeeding and one failing with
``error.type = 429``. The same turn in the GenAI and in the OpenInference conventions.
"""

from __future__ import annotations

import base64
import gzip
import json

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

LOOKUP = {"name": "lookup_order", "arguments": {"order_id": "A-1001"}, "id": "call_lookup"}
EMAIL = {"name": "send_email", "arguments": {"to": "ann@example.com"}, "id": "call_email"}

CONTRACTS = {
    "lookup_order": {
        "description": "Look an order up by its ID.",
        "effect": "read",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string", "description": "The order's ID."}},
            "required": ["order_id"],
        },
    },
    "send_email": {
        "description": "Send an email to a customer.",
        "effect": "write",
        "idempotent": True,
        "parameters": {
            "type": "object",
            "properties": {"to": {"type": "string", "description": "The address."}},
            "required": ["to"],
        },
    },
}


def register_contracts(client) -> None:
    for name, body in CONTRACTS.items():
        response = client.put(f"/api/v1/tools/{name}", body, format="json")
        assert response.status_code in (200, 201), response.content


def record(build, processor_exporter=None) -> list:
    """Run ``build(tracer)`` under a fresh tracer provider; the finished spans, in end order.
    With ``processor_exporter``, spans also go through a ``SimpleSpanProcessor`` to it."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "support-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    if processor_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(processor_exporter))
    build(provider.get_tracer("tests.otlp"))
    provider.shutdown()
    return list(memory.get_finished_spans())


def genai_turn(tracer, *, chat: bool = True, tools: bool = True) -> None:
    """A GenAI-conventions turn: ``invoke_agent`` > ``chat`` (two tool calls), two
    ``execute_tool`` spans; ``send_email`` fails with ``error.type = 429``."""
    with tracer.start_as_current_span("invoke_agent support") as agent:
        agent.set_attribute("gen_ai.operation.name", "invoke_agent")
        if chat:
            with tracer.start_as_current_span("chat gpt-4o") as span:
                span.set_attribute("gen_ai.operation.name", "chat")
                span.set_attribute("gen_ai.request.model", "gpt-4o")
                parts = [
                    {
                        "type": "tool_call",
                        "id": c["id"],
                        "name": c["name"],
                        "arguments": c["arguments"],
                    }
                    for c in (LOOKUP, EMAIL)
                ]
                span.set_attribute(
                    "gen_ai.output.messages",
                    json.dumps(
                        [{"role": "assistant", "parts": parts, "finish_reason": "tool_call"}]
                    ),
                )
        if tools:
            with tracer.start_as_current_span("execute_tool lookup_order") as span:
                span.set_attribute("gen_ai.operation.name", "execute_tool")
                span.set_attribute("gen_ai.tool.name", "lookup_order")
                span.set_attribute("gen_ai.tool.call.id", LOOKUP["id"])
                span.set_attribute("gen_ai.tool.call.arguments", json.dumps(LOOKUP["arguments"]))
                span.set_attribute("gen_ai.tool.call.result", json.dumps({"status": "shipped"}))
            with tracer.start_as_current_span("execute_tool send_email") as span:
                span.set_attribute("gen_ai.operation.name", "execute_tool")
                span.set_attribute("gen_ai.tool.name", "send_email")
                span.set_attribute("gen_ai.tool.call.id", EMAIL["id"])
                span.set_attribute("gen_ai.tool.call.arguments", json.dumps(EMAIL["arguments"]))
                span.set_attribute("error.type", "429")
                span.set_status(Status(StatusCode.ERROR, "Too Many Requests"))


def openinference_turn(tracer, *, ids: bool = True) -> None:
    """The same turn in the OpenInference conventions: an ``LLM`` span whose output message
    holds the two tool calls (with their IDs unless ``ids`` is false), and two ``TOOL`` spans
    (no tool-call IDs: matched by name and arguments); the failing one records the exception."""
    with tracer.start_as_current_span("Agent") as agent:
        agent.set_attribute("openinference.span.kind", "AGENT")
        with tracer.start_as_current_span("ChatCompletion") as span:
            span.set_attribute("openinference.span.kind", "LLM")
            span.set_attribute("llm.output_messages.0.message.role", "assistant")
            for index, call in enumerate((LOOKUP, EMAIL)):
                prefix = f"llm.output_messages.0.message.tool_calls.{index}.tool_call"
                if ids:
                    span.set_attribute(f"{prefix}.id", call["id"])
                span.set_attribute(f"{prefix}.function.name", call["name"])
                span.set_attribute(f"{prefix}.function.arguments", json.dumps(call["arguments"]))
        with tracer.start_as_current_span("lookup_order") as span:
            span.set_attribute("openinference.span.kind", "TOOL")
            span.set_attribute("tool.name", "lookup_order")
            span.set_attribute("input.value", json.dumps(LOOKUP["arguments"]))
            span.set_attribute("output.value", json.dumps({"status": "shipped"}))
        with tracer.start_as_current_span("send_email") as span:
            span.set_attribute("openinference.span.kind", "TOOL")
            span.set_attribute("tool.name", "send_email")
            span.set_attribute("input.value", json.dumps(EMAIL["arguments"]))
            try:
                raise RuntimeError("HTTP 429 Too Many Requests")
            except RuntimeError as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, str(exc)))


def protobuf_body(spans: list) -> bytes:
    """The ``ExportTraceServiceRequest`` bytes the OTLP/HTTP exporter would send."""
    return encode_spans(spans).SerializeToString()


def json_body(spans: list, *, compress: bool = False) -> bytes:
    """The same request as OTLP/JSON: protobuf's JSON mapping with hex trace and span IDs."""
    document = json_format.MessageToDict(encode_spans(spans))
    for resource in document.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    raw = json.dumps(document).encode()
    return gzip.compress(raw) if compress else raw


def trace_id_of(spans: list) -> str:
    return f"{spans[0].context.trace_id:032x}"
