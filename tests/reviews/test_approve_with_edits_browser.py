"""Approve with edits in a real browser (system Chromium via Playwright), at desktop
(1440 px) and phone (390 px) widths: open the form, see a validation error by JSON path,
refuse text that is not strict JSON (NaN), fix it, approve."""

from __future__ import annotations

import json

from callgate.models import ToolCall
from reviews.models import ReviewAudit
from tests.browser_support import BrowserTestCase
from tests.reviews.fixtures import REFUND_PROPOSED as PROPOSED
from tests.reviews.fixtures import make_refund_approval


class ApproveWithEditsBrowserTests(BrowserTestCase):
    viewport = {"width": 1440, "height": 900}

    def test_it_edits_shows_a_problem_by_path_then_approves_at_1440_and_390_px(self):
        for width, height in ((1440, 900), (390, 844)):
            with self.subTest(width=width):
                item = make_refund_approval(self.project, self.agent)
                self.page.set_viewport_size({"width": width, "height": height})
                self.login("alice")
                self.visit(f"/p/{self.project.slug}/review/{item.pk}/")
                if width > 1000:  # the keyboard on a desktop, a tap on a phone
                    self.page.keyboard.press("w")
                else:
                    self.page.get_by_role("link", name="Approve with edits…").click()
                box = self.page.get_by_label("Arguments (JSON)")
                box.wait_for()
                assert json.loads(box.input_value()) == PROPOSED  # pre-filled
                box.fill(json.dumps({**PROPOSED, "amount": 9000}, indent=2, ensure_ascii=False))
                self.page.get_by_role("button", name="Approve with edits").click()
                problems = self.page.locator("#edit-problems")
                problems.wait_for()
                assert "$.amount" in problems.inner_text()
                assert '"amount": 9000' in box.input_value()  # what was typed is kept
                self.screenshot(f"approve-with-edits-problem-{width}")
                # not strict JSON (NaN): a 422 naming it, never a 500
                box.fill(json.dumps(PROPOSED, indent=2, ensure_ascii=False).replace("120", "NaN"))
                self.page.get_by_role("button", name="Approve with edits").click()
                self.page.locator("#edit-problems", has_text="NaN is not JSON").wait_for()
                self.screenshot(f"approve-with-edits-nan-{width}")
                form = self.page.locator("form.edit-arguments").bounding_box()
                assert form is not None and form["x"] >= 0 and form["x"] + form["width"] <= width
                box.fill(json.dumps({**PROPOSED, "amount": 80}, indent=2, ensure_ascii=False))
                self.page.get_by_role("button", name="Approve with edits").click()
                self.page.get_by_text("Approved with your edits").wait_for()
                self.screenshot(f"approve-with-edits-done-{width}")
                call = ToolCall.objects.get(pk=item.call_id)
                assert call.state == ToolCall.State.ALLOWED and call.arguments["amount"] == 80
                assert item.audit.filter(action=ReviewAudit.Action.EDIT_ARGUMENTS).count() == 1
                self.page.context.clear_cookies()
        # the refused edit's 422 is the answer this test asked for; nothing else may fail
        assert [e for e in self.console_errors if "status of 422" not in e] == []
