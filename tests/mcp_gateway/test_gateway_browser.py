"""An approval through the MCP gateway: a real MCP client calls a destructive tool, the
gateway holds the call (sending progress notifications) until an operator approves it in the
review queue in Chromium, then sends it upstream exactly once."""

from __future__ import annotations

import threading
import time

from callgate.models import ToolCall
from reviews.models import ReviewItem
from tests.browser_support import BrowserTestCase
from tests.mcp_gateway.support import RunningGateway, UpstreamLog, mcp_client, run, upstream_command


class GatewayApprovalBrowserTests(BrowserTestCase):
    def setUp(self):
        super().setUp()
        self.log = UpstreamLog()
        self.gateway = RunningGateway(
            project=self.project, upstreams={"desk": upstream_command(UPSTREAM_LOG=self.log.path)}
        )

    def tearDown(self):
        self.gateway.stop()
        self.log.remove()
        super().tearDown()

    def call_in_background(self, outcome: dict) -> threading.Thread:
        async def body():
            progress: list[str] = []

            async def on_progress(done, total, message):
                progress.append(message or "")

            async with mcp_client(self.gateway.url, self.key) as session:
                outcome["result"] = await session.call_tool(
                    "refund",
                    {"order_id": "A-7", "amount_cents": 1250},
                    progress_callback=on_progress,
                )
            outcome["progress"] = progress

        thread = threading.Thread(target=run, args=(body,), daemon=True)
        thread.start()
        return thread

    def wait_for_call(self, state: str) -> ToolCall:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            call = ToolCall.objects.filter(project=self.project, tool_name="refund").first()
            if call is not None and call.state == state:
                return call
            time.sleep(0.2)
        raise AssertionError(f"the refund never reached {state!r}")

    def test_an_approval_waits_for_the_operator_then_runs_once(self):
        outcome: dict = {}
        thread = self.call_in_background(outcome)
        call = self.wait_for_call("pending_approval")
        time.sleep(1.5)  # the gateway holds it: nothing went upstream
        self.assertEqual(self.log.calls("refund"), [])
        self.assertNotIn("result", outcome)

        item = ReviewItem.objects.get(call=call)
        self.login("alice")
        self.visit(f"/p/{self.project.slug}/review/{item.pk}/")
        self.page.keyboard.press("c")
        self.page.get_by_text("Claimed. The claim lapses").wait_for()
        self.screenshot("mcp-gateway-approval-claimed")
        self.page.locator(".itemhead").get_by_role("button", name="Approve").click()
        self.page.get_by_text("Approved: the agent may execute the call.").wait_for()

        thread.join(timeout=30)
        result = outcome["result"]
        self.assertFalse(result.isError, result)
        self.assertIn("R-A-7", result.content[0].text)
        self.assertTrue(any("approval" in message for message in outcome["progress"]))
        sent = self.log.calls("refund")
        self.assertEqual(len(sent), 1)
        call.refresh_from_db()
        self.assertEqual((call.state, call.attempts, call.decided_by), ("succeeded", 1, self.alice))
        self.assertEqual(sent[0]["operation_id"], call.operation_id)
        self.visit(f"/p/{self.project.slug}/calls/")
        self.page.locator("tbody").get_by_text("refund").first.wait_for()
        self.screenshot("mcp-gateway-calls")
        self.visit(f"/p/{self.project.slug}/gateway/")
        card = self.page.locator("section.card", has_text="desk")
        card.get_by_text("Up", exact=True).wait_for()
        self.assertIn("required", card.locator("tr", has_text="refund").inner_text())
        self.screenshot("mcp-gateway-page")
        self.assert_no_console_errors()
