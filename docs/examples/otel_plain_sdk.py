"""One agent turn reported to callgate as OpenTelemetry spans (GenAI semantic conventions).

export OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:8000/api/otlp/v1/traces
export OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer cg_…"
python otel_plain_sdk.py
"""

import json

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode

provider = TracerProvider(resource=Resource.create({"service.name": "support-agent"}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # reads the two variables
tracer = provider.get_tracer("support-agent")


def lookup_order(order_id: str) -> dict:
    return {"order_id": order_id, "status": "shipped"}


def run_tool(call: dict) -> None:
    """Run one tool call of the model's answer inside its execute_tool span."""
    with tracer.start_as_current_span(f"execute_tool {call['name']}") as span:
        span.set_attribute("gen_ai.operation.name", "execute_tool")
        span.set_attribute("gen_ai.tool.name", call["name"])
        span.set_attribute("gen_ai.tool.call.id", call["id"])
        span.set_attribute("gen_ai.tool.call.arguments", json.dumps(call["arguments"]))
        try:
            result = lookup_order(**call["arguments"])
        except Exception as exc:  # callgate reads the cause from error.type and the status
            span.set_attribute("error.type", type(exc).__name__)
            span.set_status(Status(StatusCode.ERROR, str(exc)))
            return
        span.set_attribute("gen_ai.tool.call.result", json.dumps(result))


def main() -> None:
    with tracer.start_as_current_span("invoke_agent support"):
        # the model's answer (from your LLM client): one call of lookup_order
        calls = [{"id": "call_1", "name": "lookup_order", "arguments": {"order_id": "A-1001"}}]
        with tracer.start_as_current_span("chat gpt-4o") as span:
            span.set_attribute("gen_ai.operation.name", "chat")
            parts = [{"type": "tool_call", **call} for call in calls]
            messages = [{"role": "assistant", "parts": parts, "finish_reason": "tool_call"}]
            span.set_attribute("gen_ai.output.messages", json.dumps(messages))
        for call in calls:
            run_tool(call)
    provider.shutdown()  # sends what is still buffered


if __name__ == "__main__":
    main()
