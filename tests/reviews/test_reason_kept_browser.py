"""A 409 stays a 409 after "Reconcile now", in a real browser at 1440 and 390 px (issue 31)."""

from __future__ import annotations

from unittest import mock

import httpx
from django.test import override_settings
from rest_framework.test import APIClient

from callgate import reconcile
from demo.simulator import SimulatorService, simulator_transport
from reviews.models import ReviewItem
from tests.browser_support import BrowserTestCase
from tests.factories import make_event
from tests.reviews.fixtures import CLOSED_409, SIM_ARGS, SIM_TOKEN, follow_up_contract


@override_settings(CALLGATE_RECONCILE_AUTH_HEADER=f"Authorization: Bearer {SIM_TOKEN}")
class ConflictAfterReconcileBrowserTests(BrowserTestCase):
    viewport = {"width": 1440, "height": 900}

    def test_reconcile_now_leaves_a_409_for_rejection(self):
        service = SimulatorService({"acme": SIM_TOKEN})
        service.add_ticket("acme")
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {self.key}")
        contract = follow_up_contract()
        assert api.put("/api/v1/tools/create_follow_up", contract, format="json").status_code in (
            200,
            201,
        )
        envelopes = [
            make_event(
                "proposed",
                format="plain",
                call={"tool": "create_follow_up", "arguments": SIM_ARGS},
                operation_id="op-409",
            ),
            make_event("attempt", operation_id="op-409", **CLOSED_409),
        ]
        assert api.post("/api/v1/events", envelopes, format="json").status_code == 200
        item = ReviewItem.objects.get(call__operation_id="op-409")

        self.login("alice")
        self.visit(f"/p/acme/review/{item.pk}/")
        header = self.page.locator(".itemhead")
        with mock.patch.object(
            reconcile,
            "make_client",
            lambda: httpx.Client(transport=simulator_transport(service)),
        ):
            self.page.keyboard.press("r")
            self.page.get_by_text("the target has no trace of this operation").first.wait_for()
        self.page.wait_for_function("() => !document.querySelector('.htmx-request')")

        text = header.inner_text()
        assert "Conflict" in text and "Retries exhausted" not in text
        assert "A retry can fix this" not in text
        assert "The observation says not to retry" in text
        assert header.locator("a.button.primary").inner_text() == "Reject…"
        assert header.locator("button.primary").count() == 0  # approve retry is not primary
        self.screenshot("reconcile-409-desktop")
        self.page.set_viewport_size({"width": 390, "height": 844})
        self.screenshot("reconcile-409-phone")
        self.page.keyboard.press("Shift+R")
        self.page.get_by_label("Reason (the agent reads it as the observation)").wait_for()
        self.assert_no_console_errors()
