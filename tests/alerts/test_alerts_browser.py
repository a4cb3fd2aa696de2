"""Firing alerts in a real browser (Chromium), desktop and phone: the count beside "Alerts"
in the navigation, the overview's panel with value and actions, snoozing from it, the
history with who acted and the link to exactly the calls behind the alert."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from alerts.models import AlertRule
from alerts.services import alert_rule_evaluate
from callgate.reports.rollups import rollups_rebuild
from callgate.taxonomy import Reason
from tests.browser_support import BrowserTestCase
from tests.factories import make_call


class FiringAlertBrowserTests(BrowserTestCase):
    viewport = {"width": 1440, "height": 900}

    def seed(self) -> AlertRule:
        now = timezone.now()
        for i in range(7):
            make_call(
                project=self.project,
                agent=self.agent,
                tool="create_follow_up",
                reason=Reason.TYPE_MISMATCH if i < 5 else Reason.OK,
                created_at=now - timedelta(minutes=2 + i),
            )
        rollups_rebuild(project_id=self.project.pk)
        rule = AlertRule.objects.create(
            project=self.project,
            name="Argument errors on create_follow_up",
            metric=AlertRule.Metric.CATEGORY_COUNT,
            target="argument_error",
            tool="create_follow_up",
            threshold=3,
            clear_threshold=1,
        )
        assert alert_rule_evaluate(rule).kind == "firing"
        return rule

    def nav_alerts(self):
        return self.page.locator("nav a", has_text="Alerts")

    def test_an_operator_sees_snoozes_and_follows_a_firing_alert(self):
        self.seed()
        self.login("alice")
        self.visit("/p/acme/")
        panel = self.page.locator("[data-firing-alerts]")
        panel.get_by_text("Argument errors on create_follow_up").wait_for()
        assert self.nav_alerts().locator(".count").inner_text() == "1"
        assert panel.locator("[data-alert-link]").first.inner_text() == "5 calls"
        self.screenshot("alerts-overview-1440")

        panel.locator("summary", has_text="Snooze").click()
        self.screenshot("alerts-snooze-menu-1440", full_page=False)
        with self.page.expect_navigation(wait_until="load"):
            panel.get_by_role("button", name="1 h").click()
        panel.get_by_text("Snoozed until").wait_for()
        assert self.nav_alerts().locator(".count").count() == 0
        assert (
            self.page.locator(".messages")
            .inner_text()
            .startswith("Argument errors on create_follow_up: snoozed by alice for 1 h")
        )

        self.visit("/p/acme/alerts/")
        assert self.page.locator("td [data-alert-link]").inner_text() == "5 calls"
        self.page.get_by_text("Snoozed", exact=True).wait_for()
        self.screenshot("alerts-rules-1440")

        self.visit("/p/acme/alerts/history/")
        self.page.get_by_text("by alice", exact=True).wait_for()
        self.screenshot("alerts-history-1440")
        with self.page.expect_navigation(wait_until="load"):
            self.page.locator("tr[data-alert-event=firing] [data-alert-link]").click()
        assert "/p/acme/calls/" in self.page.url and "until=" in self.page.url
        assert self.page.locator("tr[data-href], tbody tr").count() >= 5
        self.screenshot("alerts-calls-behind-1440")
        self.assert_no_console_errors()

    def test_the_panel_and_history_fit_a_phone(self):
        rule = self.seed()
        self.page.set_viewport_size({"width": 390, "height": 844})
        self.login("bob")
        self.visit("/p/acme/")
        panel = self.page.locator("[data-firing-alerts]")
        panel.get_by_text(rule.name).wait_for()
        box = panel.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
        for name in ("Acknowledge", "Resolve"):
            button = panel.get_by_role("button", name=name)
            b = button.bounding_box()
            assert b is not None and b["x"] + b["width"] <= 390, name
        self.screenshot("alerts-overview-390")
        panel.locator("summary", has_text="Snooze").click()
        menu = panel.locator(".menu-body")
        m = menu.bounding_box()
        assert m is not None and m["x"] >= 0 and m["x"] + m["width"] <= 390
        self.screenshot("alerts-snooze-menu-390", full_page=False)
        with self.page.expect_navigation(wait_until="load"):
            panel.get_by_role("button", name="Acknowledge").click()
        panel.get_by_text("Acknowledged by bob").wait_for()
        self.visit("/p/acme/alerts/history/")
        self.page.get_by_text("by bob", exact=True).wait_for()
        self.screenshot("alerts-history-390")
        self.assert_no_console_errors()
