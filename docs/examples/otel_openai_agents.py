"""An OpenAI Agents SDK agent traced to callgate (OpenInference conventions).

    pip install openai-agents openinference-instrumentation-openai-agents \
        opentelemetry-sdk opentelemetry-exporter-otlp-proto-http
    export OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:8000/api/otlp/v1/traces
    export OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer cg_…"
    export OPENAI_API_KEY=sk-…
    python otel_openai_agents.py
"""

from agents import Agent, Runner, function_tool
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

provider = TracerProvider(resource=Resource.create({"service.name": "support-agent"}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # reads the two variables
OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)


@function_tool
def lookup_order(order_id: str) -> dict:
    """Look an order up by its ID."""
    return {"order_id": order_id, "status": "shipped"}


def main(model=None) -> None:
    agent = Agent(
        name="support",
        instructions="Answer questions about orders.",
        tools=[lookup_order],
        **({"model": model} if model else {}),
    )
    print(Runner.run_sync(agent, "Where is order A-1001?").final_output)
    provider.shutdown()  # sends what is still buffered


if __name__ == "__main__":
    main()
