"""Calls that arrived as OpenTelemetry spans, in the browser: the call page links its trace,
and the link lists the trace's calls with a removable chip."""

from __future__ import annotations

from rest_framework.test import APIClient

from callgate.models import ToolCall
from callgate.taxonomy import Reason
from tests.browser_support import BrowserTestCase
from tests.callgate.otlp_support import (
    genai_turn,
    protobuf_body,
    record,
    register_contracts,
    trace_id_of,
)


class OtlpCallsBrowserTests(BrowserTestCase):
    def test_the_call_page_links_its_trace_to_the_traces_calls(self):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.key}")
        register_contracts(client)
        spans = record(genai_turn)
        other = record(genai_turn)  # another trace, left out of the filtered list
        for body in (protobuf_body(spans), protobuf_body(other)):
            response = client.generic(
                "POST", "/api/otlp/v1/traces", body, content_type="application/x-protobuf"
            )
            assert response.status_code == 200, response.content
        trace_id = trace_id_of(spans)
        call = ToolCall.objects.get(trace_id=trace_id, tool_name="send_email")

        self.login("alice", next_path=f"/p/acme/calls/{call.operation_id}/")
        link = self.page.get_by_role("link", name=trace_id)  # the trace is the request too
        link.wait_for()
        self.screenshot("otlp-call-detail")
        with self.page.expect_navigation(wait_until="load"):
            link.click()
        assert self.page.locator("#call-rows tr[data-row]").count() == 2
        assert self.page.get_by_text(trace_id).first.is_visible()
        self.screenshot("otlp-calls-of-trace", full_page=False)
        # narrowing further from the bar keeps the trace
        self.page.select_option("select[name=category]", "transient")
        self.page.wait_for_url("**category=transient**")
        assert f"trace_id={trace_id}" in self.page.url
        self.page.wait_for_function(
            "document.querySelectorAll('#call-rows tr[data-row]').length == 1"
        )
        assert self.page.locator("#call-rows .badge").all_inner_texts() == [
            Reason.RATE_LIMITED.label
        ]
        self.assert_no_console_errors()
