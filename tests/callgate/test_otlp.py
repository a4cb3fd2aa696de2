"""``POST /api/otlp/v1/traces``: the real OpenTelemetry SDK and OTLP/HTTP exporter as clients,
then ``GET /api/v1/calls?trace_id=…`` to read the classified calls back."""

from __future__ import annotations

import gzip
import json
from unittest import mock

from django.test import LiveServerTestCase, override_settings
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace.export import SpanExportResult
from rest_framework.test import APIClient

from callgate.auth import api_key_issue
from callgate.inbox import inbox_drain
from callgate.models import Agent, CallEvent, InboxEvent, Project, ToolCall
from tests.callgate.otlp_support import (
    EMAIL,
    LOOKUP,
    genai_turn,
    json_body,
    openinference_turn,
    protobuf_body,
    record,
    register_contracts,
    trace_id_of,
)
from tests.factories import BaseTestCase

URL = "/api/otlp/v1/traces"
EXPECTED = {("lookup_order", "ok"), ("send_email", "rate_limited")}


def _calls(client, trace_id: str) -> list[dict]:
    response = client.get("/api/v1/calls", {"trace_id": trace_id})
    assert response.status_code == 200, response.content
    return response.json()["items"]


def _summary(items: list[dict]) -> set[tuple[str, str]]:
    return {(item["tool"], item["reason"]) for item in items}


class ExporterTests(LiveServerTestCase):
    """The unmodified ``OTLPSpanExporter`` against a live callgate."""

    def setUp(self):
        project = Project.objects.create(slug="acme", name="Acme")
        agent = Agent.objects.create(project=project, name="support-bot")
        self.key = api_key_issue(agent=agent).plain
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.key}")
        register_contracts(self.client)

    def exporter(self, **kwargs) -> OTLPSpanExporter:
        return OTLPSpanExporter(
            endpoint=f"{self.live_server_url}{URL}",
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=10,
            **kwargs,
        )

    def test_an_exported_turn_lists_two_calls_ok_and_rate_limited(self):
        spans = record(genai_turn)
        exporter = self.exporter()
        self.assertEqual(exporter.export(spans), SpanExportResult.SUCCESS)
        items = _calls(self.client, trace_id_of(spans))
        self.assertEqual(_summary(items), EXPECTED)
        self.assertEqual({item["call_id"] for item in items}, {LOOKUP["id"], EMAIL["id"]})
        self.assertTrue(all(item["trace_id"] == trace_id_of(spans) for item in items))
        self.assertTrue(all(item["request_id"] == trace_id_of(spans) for item in items))

    def test_spans_exported_one_by_one_as_they_end_give_the_same_calls(self):
        # SimpleSpanProcessor: one export request per span, the model's proposal first
        spans = record(genai_turn, processor_exporter=self.exporter(compression=Compression.Gzip))
        self.assertEqual(_summary(_calls(self.client, trace_id_of(spans))), EXPECTED)

    def test_a_bad_key_fails_the_export(self):
        exporter = OTLPSpanExporter(
            endpoint=f"{self.live_server_url}{URL}",
            headers={"Authorization": "Bearer cg_00000000_" + "x" * 43},
            timeout=10,
        )
        self.assertEqual(exporter.export(record(genai_turn)), SpanExportResult.FAILURE)
        self.assertEqual(ToolCall.objects.count(), 0)


class ReceiverTests(BaseTestCase):
    def setUp(self):
        self.client_a = self.api()
        register_contracts(self.client_a)

    def post(self, body: bytes, *, content_type="application/x-protobuf", key=None, **headers):
        client = self.api(key) if key else self.client_a
        return client.generic("POST", URL, body, content_type=content_type, **headers)

    def partial(self, response, *, json_encoding=False):
        message = ExportTraceServiceResponse()
        if json_encoding:
            json_format.Parse(response.content, message)
        else:
            message.ParseFromString(response.content)
        return message.partial_success

    def status_of(self, response, *, json_encoding=False):
        message = status_pb2.Status()
        if json_encoding:
            json_format.Parse(response.content, message)
        else:
            message.ParseFromString(response.content)
        return message

    # --- the same trace, every encoding ---------------------------------------------------

    def test_protobuf_answers_an_empty_response_and_classifies_both_calls(self):
        spans = record(genai_turn)
        response = self.post(protobuf_body(spans))
        self.assertEqual(response.status_code, 200, response.content)
        self.assertEqual(response["Content-Type"], "application/x-protobuf")
        self.assertFalse(
            ExportTraceServiceResponse.FromString(response.content).HasField("partial_success")
        )
        self.assertEqual(_summary(_calls(self.client_a, trace_id_of(spans))), EXPECTED)

    def test_otlp_json_plain_and_gzip_give_the_same_calls(self):
        for compress in (False, True):
            with self.subTest(gzip=compress):
                spans = record(genai_turn)
                headers = {"HTTP_CONTENT_ENCODING": "gzip"} if compress else {}
                response = self.post(
                    json_body(spans, compress=compress), content_type="application/json", **headers
                )
                self.assertEqual(response.status_code, 200, response.content)
                self.assertEqual(response["Content-Type"], "application/json")
                self.assertEqual(json.loads(response.content), {})
                self.assertEqual(_summary(_calls(self.client_a, trace_id_of(spans))), EXPECTED)

    def test_a_resent_export_adds_nothing(self):
        spans = record(genai_turn)
        self.post(protobuf_body(spans))
        before = (ToolCall.objects.count(), CallEvent.objects.count())
        for body, content_type in (
            (protobuf_body(spans), "application/x-protobuf"),
            (json_body(spans), "application/json"),
        ):
            response = self.post(body, content_type=content_type)
            self.assertEqual(response.status_code, 200)
        self.assertEqual((ToolCall.objects.count(), CallEvent.objects.count()), before)
        self.assertEqual(before, (2, 4))  # two proposals, two attempts

    def test_an_openinference_trace_gives_the_same_calls(self):
        spans = record(openinference_turn)
        response = self.post(protobuf_body(spans))
        self.assertEqual(response.status_code, 200, response.content)
        items = _calls(self.client_a, trace_id_of(spans))
        self.assertEqual(_summary(items), EXPECTED)
        self.assertEqual({item["call_id"] for item in items}, {LOOKUP["id"], EMAIL["id"]})

    def test_an_openinference_trace_without_tool_call_ids_matches_by_name_and_arguments(self):
        spans = record(lambda tracer: openinference_turn(tracer, ids=False))
        self.assertEqual(self.post(protobuf_body(spans)).status_code, 200)
        items = _calls(self.client_a, trace_id_of(spans))
        self.assertEqual(_summary(items), EXPECTED)
        self.assertEqual({item["call_id"] for item in items}, {None})
        self.post(protobuf_body(spans))  # re-sent: nothing new
        self.assertEqual(CallEvent.objects.count(), 4)

    def test_tool_spans_without_their_model_span_still_become_calls(self):
        spans = record(lambda tracer: genai_turn(tracer, chat=False))
        self.post(protobuf_body(spans))
        self.assertEqual(_summary(_calls(self.client_a, trace_id_of(spans))), EXPECTED)
        # the model span arriving later proposes the same calls: stored once
        calls_before = (ToolCall.objects.count(), CallEvent.objects.count())
        chat_only = record(lambda tracer: genai_turn(tracer, tools=False))
        request = ExportTraceServiceRequest.FromString(protobuf_body(chat_only))
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    span.trace_id = bytes.fromhex(trace_id_of(spans))
        self.assertEqual(self.post(request.SerializeToString()).status_code, 200)
        self.assertEqual((ToolCall.objects.count(), CallEvent.objects.count()), calls_before)

    def test_tool_spans_arriving_while_their_turn_waits_in_the_inbox_propose_nothing(self):
        spans = record(genai_turn)
        chat = [s for s in spans if s.name.startswith(("chat", "invoke"))]
        tools = [s for s in spans if s.name.startswith("execute_tool")]
        with mock.patch("callgate.otlp.drain_inbox_enqueue"):  # the worker is behind
            self.post(protobuf_body(chat))
            self.post(protobuf_body(tools))
        self.assertEqual(InboxEvent.objects.filter(status="pending").count(), 3)  # turn, 2 attempts
        inbox_drain(self.project.pk)
        self.assertEqual(_summary(_calls(self.client_a, trace_id_of(spans))), EXPECTED)
        self.assertEqual(CallEvent.objects.filter(kind="proposed").count(), 2)

    def test_a_tool_without_a_contract_still_becomes_a_call(self):
        def unknown(tracer):
            with tracer.start_as_current_span("execute_tool refund") as span:
                span.set_attribute("gen_ai.operation.name", "execute_tool")
                span.set_attribute("gen_ai.tool.name", "refund_everything")
                span.set_attribute("gen_ai.tool.call.id", "call_x")
                span.set_attribute("gen_ai.tool.call.arguments", "{}")

        spans = record(unknown)
        response = self.post(protobuf_body(spans))
        self.assertEqual(response.status_code, 200)
        [item] = _calls(self.client_a, trace_id_of(spans))
        self.assertEqual(item["tool"], "refund_everything")
        # the gate would have refused it; the attempt the runtime made anyway is recorded
        proposal = CallEvent.objects.get(kind="proposed", call__operation_id=item["operation_id"])
        self.assertEqual(proposal.reason, "unknown_tool")
        self.assertEqual(CallEvent.objects.filter(kind="attempt").count(), 1)

    def test_conversation_id_is_the_request_id_when_given(self):
        def turn(tracer):
            genai_turn(tracer)

        spans = record(turn)
        request = ExportTraceServiceRequest.FromString(protobuf_body(spans))
        chat = next(
            s
            for r in request.resource_spans
            for sc in r.scope_spans
            for s in sc.spans
            if s.name.startswith("chat")
        )
        attribute = chat.attributes.add(key="gen_ai.conversation.id")
        attribute.value.string_value = "conv-42"
        self.post(request.SerializeToString())
        items = _calls(self.client_a, trace_id_of(spans))
        self.assertEqual(
            {(i["request_id"], i["conversation_id"]) for i in items}, {("conv-42", "conv-42")}
        )
        self.assertEqual(_summary(items), EXPECTED)

    def test_an_mcp_client_span_reports_its_json_rpc_error(self):
        def mcp(tracer):
            with tracer.start_as_current_span("tools/call lookup_order") as span:
                span.set_attribute("mcp.method.name", "tools/call")
                span.set_attribute("gen_ai.tool.name", "lookup_order")
                span.set_attribute("gen_ai.tool.call.arguments", json.dumps(LOOKUP["arguments"]))
                span.set_attribute("rpc.jsonrpc.error_code", -32601)
                span.set_attribute("rpc.jsonrpc.error_message", "Method not found")

        spans = record(mcp)
        self.assertEqual(self.post(protobuf_body(spans)).status_code, 200)
        [item] = _calls(self.client_a, trace_id_of(spans))
        attempt = CallEvent.objects.get(kind="attempt", call__operation_id=item["operation_id"])
        self.assertEqual(
            attempt.body["jsonrpc_error"],
            {"code": -32601, "message": "Method not found", "data": None},
        )
        self.assertIn("MCP error -32601: Method not found", attempt.body["error"])
        # a valid call the server does not know: the contract no longer describes it
        self.assertEqual(item["reason"], "contract_drift")

    def test_an_mcp_span_inside_an_execute_tool_span_adds_its_error_to_that_attempt(self):
        def nested(tracer):
            with tracer.start_as_current_span("execute_tool lookup_order") as outer:
                outer.set_attribute("gen_ai.operation.name", "execute_tool")
                outer.set_attribute("gen_ai.tool.name", "lookup_order")
                outer.set_attribute("gen_ai.tool.call.id", "call_nested")
                outer.set_attribute("gen_ai.tool.call.arguments", json.dumps(LOOKUP["arguments"]))
                with tracer.start_as_current_span("tools/call lookup_order") as span:
                    span.set_attribute("mcp.method.name", "tools/call")
                    span.set_attribute("gen_ai.tool.name", "lookup_order")
                    span.set_attribute("rpc.jsonrpc.error_code", "-32603")
                    span.set_attribute("rpc.jsonrpc.error_message", "upstream rate limit")

        spans = record(nested)
        self.assertEqual(self.post(protobuf_body(spans)).status_code, 200)
        [item] = _calls(self.client_a, trace_id_of(spans))
        [attempt] = CallEvent.objects.filter(kind="attempt")
        self.assertEqual(attempt.body["jsonrpc_error"]["code"], -32603)
        self.assertEqual(item["call_id"], "call_nested")
        # -32603 wrapping an upstream rate limit is rate_limited (TAXONOMY, step 2)
        self.assertEqual(item["reason"], "rate_limited")

    # --- bad input ------------------------------------------------------------------------

    def test_a_truncated_protobuf_is_a_400_with_a_status(self):
        body = protobuf_body(record(genai_turn))
        response = self.post(body[: len(body) // 2])
        self.assertEqual(response.status_code, 400)
        self.assertIn("not a valid OTLP protobuf", self.status_of(response).message)
        self.assertEqual(ToolCall.objects.count(), 0)

    def test_invalid_json_and_a_field_of_the_wrong_type_are_400(self):
        for body in (b"{not json", json.dumps({"resourceSpans": "nope"}).encode()):
            response = self.post(body, content_type="application/json")
            self.assertEqual(response.status_code, 400, body)
            self.assertTrue(self.status_of(response, json_encoding=True).message)

    def test_another_content_type_is_a_415(self):
        response = self.post(b"<spans/>", content_type="application/xml")
        self.assertEqual(response.status_code, 415)
        self.assertIn("application/x-protobuf", self.status_of(response).message)

    def test_an_unknown_content_encoding_is_a_415(self):
        response = self.post(protobuf_body(record(genai_turn)), HTTP_CONTENT_ENCODING="br")
        self.assertEqual(response.status_code, 415)

    def test_spans_without_trace_ids_are_rejected_and_counted_the_rest_is_kept(self):
        spans = record(genai_turn)
        request = ExportTraceServiceRequest.FromString(protobuf_body(spans))
        scope = request.resource_spans[0].scope_spans[0]
        broken = scope.spans.add()
        broken.CopyFrom(scope.spans[0])
        broken.trace_id = b""
        broken.name = "no trace"
        response = self.post(request.SerializeToString())
        self.assertEqual(response.status_code, 200)
        partial = self.partial(response)
        self.assertEqual(partial.rejected_spans, 1)
        self.assertIn("no valid trace ID", partial.error_message)
        self.assertEqual(_summary(_calls(self.client_a, trace_id_of(spans))), EXPECTED)

    def test_otlp_json_with_an_id_that_is_not_hex_rejects_that_span_only(self):
        spans = record(genai_turn)
        document = json.loads(json_body(spans))
        document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = "zz-not-hex"
        response = self.post(json.dumps(document).encode(), content_type="application/json")
        self.assertEqual(response.status_code, 200)
        partial = json.loads(response.content)["partialSuccess"]
        self.assertEqual(partial["rejectedSpans"], "1")

    def test_attributes_of_the_wrong_type_reject_their_span_only(self):
        spans = record(genai_turn)
        request = ExportTraceServiceRequest.FromString(protobuf_body(spans))
        for span in request.resource_spans[0].scope_spans[0].spans:
            if span.name == "execute_tool send_email":
                for attribute in span.attributes:
                    if attribute.key == "gen_ai.tool.name":
                        attribute.value.int_value = 7
        response = self.post(request.SerializeToString())
        self.assertEqual(response.status_code, 200)
        partial = self.partial(response)
        self.assertEqual(partial.rejected_spans, 1)
        self.assertIn("gen_ai.tool.name must be a string, got int", partial.error_message)
        items = _calls(self.client_a, trace_id_of(spans))
        # both proposals and the good attempt are kept
        self.assertEqual(
            {(i["tool"], i["reason"]) for i in items},
            {("lookup_order", "ok"), ("send_email", None)},
        )

    def test_mangled_bodies_are_400_or_partial_success_never_a_500(self):
        spans = record(genai_turn)
        cases = []
        body = protobuf_body(spans)
        for offset in range(1, len(body), 11):
            cases.append((body[:offset], "application/x-protobuf"))
            flipped = bytearray(body)
            flipped[offset] ^= 0xFF
            cases.append((bytes(flipped), "application/x-protobuf"))
        text = json_body(spans)
        cases += [(text[:offset], "application/json") for offset in range(1, len(text), 97)]
        for raw, content_type in cases:
            response = self.post(raw, content_type=content_type)
            self.assertIn(response.status_code, (200, 400), (raw, response.content))
            if response.status_code == 200:
                self.partial(response, json_encoding=content_type == "application/json")

    def test_spans_ending_far_in_the_future_are_rejected_one_by_one(self):
        spans = record(genai_turn)
        request = ExportTraceServiceRequest.FromString(protobuf_body(spans))
        for span in request.resource_spans[0].scope_spans[0].spans:
            if span.name == "execute_tool lookup_order":
                span.end_time_unix_nano = 2**64 - 1  # the largest time OTLP can say (2554)
            if span.name == "execute_tool send_email":
                span.start_time_unix_nano = span.end_time_unix_nano = 7_000_000_000 * 10**9
        response = self.post(request.SerializeToString())
        self.assertEqual(response.status_code, 200)
        partial = self.partial(response)
        self.assertEqual(partial.rejected_spans, 2, partial.error_message)
        self.assertIn("occurred_at lies more than a day in the future", partial.error_message)
        items = _calls(self.client_a, trace_id_of(spans))  # the turn is kept
        self.assertEqual(
            {(i["tool"], i["state"]) for i in items},
            {("lookup_order", "allowed"), ("send_email", "allowed")},
        )

    def test_a_10_mb_body_is_a_413(self):
        response = self.post(b"\x0a" + b"x" * (10 * 1024 * 1024))
        self.assertEqual(response.status_code, 413)
        self.assertIn("limit of 5 MB", self.status_of(response).message)

    def test_a_gzip_bomb_is_a_413(self):
        body = gzip.compress(b"\x00" * (30 * 1024 * 1024))
        response = self.post(body, HTTP_CONTENT_ENCODING="gzip")
        self.assertEqual(response.status_code, 413)
        self.assertIn("decompressed", self.status_of(response).message)

    def test_without_a_valid_key_it_is_a_401(self):
        body = protobuf_body(record(genai_turn))
        response = self.client.generic("POST", URL, body, content_type="application/x-protobuf")
        self.assertEqual(response.status_code, 401)
        response = self.post(body, key="cg_00000000_" + "y" * 43)
        self.assertEqual(response.status_code, 401)
        self.assertIn("Unknown or revoked API key", self.status_of(response).message)
        self.assertEqual(ToolCall.objects.count(), 0)

    def test_another_projects_key_stores_in_its_own_project_and_reads_only_its_own(self):
        spans = record(genai_turn)
        self.post(protobuf_body(spans))
        other = self.api(self.other_key)
        self.assertEqual(_calls(other, trace_id_of(spans)), [])
        self.post(protobuf_body(spans), key=self.other_key)  # no contracts there: unknown_tool
        theirs = _calls(other, trace_id_of(spans))
        self.assertEqual({i["tool"] for i in theirs}, {"lookup_order", "send_email"})
        self.assertEqual(
            set(
                CallEvent.objects.filter(project=self.other_project, kind="proposed").values_list(
                    "reason", flat=True
                )
            ),
            {"unknown_tool"},
        )
        self.assertEqual(_summary(_calls(self.client_a, trace_id_of(spans))), EXPECTED)

    @override_settings(CALLGATE_INBOX_LIMIT=2, CALLGATE_INBOX_RETRY_AFTER=7)
    def test_an_inbox_over_its_limit_answers_429_with_retry_after(self):
        for n in range(2):
            InboxEvent.objects.create(
                project=self.project,
                agent=self.agent,
                event_id=f"00000000-0000-4000-8000-00000000000{n}",
                body={},
            )
        response = self.post(protobuf_body(record(genai_turn)))
        self.assertEqual(response.status_code, 429)
        self.assertEqual(response["Retry-After"], "7")
        self.assertIn("CALLGATE_INBOX_LIMIT", self.status_of(response).message)
        self.assertEqual(ToolCall.objects.count(), 0)
