"""The README's "Send OpenTelemetry traces" examples (``docs/examples/otel_*.py``), run as
they are against a live callgate, configured only by the two ``OTEL_EXPORTER_OTLP_*``
variables. The OpenAI Agents SDK runs with a fake model (no network)."""

from __future__ import annotations

import json
import os
import runpy
from pathlib import Path
from unittest import mock

from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from django.test import LiveServerTestCase
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from rest_framework.test import APIClient

from callgate.auth import api_key_issue
from callgate.models import Agent, Project
from tests.callgate.otlp_support import register_contracts

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"


class FakeModel(Model):
    """A model that first calls ``lookup_order``, then answers in text."""

    def __init__(self):
        self.turns = 0

    async def get_response(self, *args, **kwargs) -> ModelResponse:
        self.turns += 1
        if self.turns == 1:
            output = [
                ResponseFunctionToolCall(
                    type="function_call",
                    id="fc_1",
                    call_id="call_1",
                    name="lookup_order",
                    arguments=json.dumps({"order_id": "A-1001"}),
                )
            ]
        else:
            text = ResponseOutputText(type="output_text", text="It has shipped.", annotations=[])
            output = [
                ResponseOutputMessage(
                    id="msg_1", type="message", role="assistant", status="completed", content=[text]
                )
            ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError


class ExampleTests(LiveServerTestCase):
    def setUp(self):
        project = Project.objects.create(slug="acme", name="Acme")
        agent = Agent.objects.create(project=project, name="support-bot")
        self.key = api_key_issue(agent=agent).plain
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.key}")
        register_contracts(self.client)

    def load(self, name: str) -> dict:
        env = {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{self.live_server_url}/api/otlp/v1/traces",
            "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer {self.key}",
        }
        with mock.patch.dict(os.environ, env):
            return runpy.run_path(str(EXAMPLES / name), run_name="example")

    def calls(self) -> list[dict]:
        return self.client.get("/api/v1/calls").json()["items"]

    def test_the_plain_sdk_example_reports_a_classified_call(self):
        self.load("otel_plain_sdk.py")["main"]()
        [call] = self.calls()
        self.assertEqual(
            (call["tool"], call["reason"], call["call_id"]), ("lookup_order", "ok", "call_1")
        )
        self.assertRegex(call["trace_id"], r"^[0-9a-f]{32}$")

    def test_the_openai_agents_example_reports_a_classified_call(self):
        example = self.load("otel_openai_agents.py")
        try:
            with mock.patch("sys.stdout"):
                example["main"](model=FakeModel())
        finally:
            OpenAIAgentsInstrumentor().uninstrument()
        [call] = self.calls()
        self.assertEqual((call["tool"], call["reason"]), ("lookup_order", "ok"))
        self.assertEqual(call["receipt"], {"order_id": "A-1001", "status": "shipped"})

    def test_the_readme_shows_the_examples_as_they_are(self):
        readme = (ROOT / "README.md").read_text()
        for name in ("otel_plain_sdk.py", "otel_openai_agents.py"):
            body = (EXAMPLES / name).read_text()
            code = body[body.index('"""\n\n') + 5 :]  # the README says the docstring in prose
            self.assertIn(code, readme, name)
