"""The Notifications page and an email decision link's confirmation page in a real browser
(system Chromium), at 1440 px and on a 390 px phone."""

from __future__ import annotations

from django.conf import settings
from django.test import override_settings

from reviews import notifications, tasks
from reviews.models import ProjectNotifications, ReviewItem, SlackIdentity
from tests.browser_support import BrowserTestCase
from tests.reviews.fixtures import make_item

assert tasks.review_items_notify  # registered: run eagerly, not sent to a broker
WIDTHS = {"desktop": (1440, 900), "phone": (390, 844)}


class NotificationsBrowserTests(BrowserTestCase):
    def assert_fits(self) -> None:
        """Nothing of the page's content is wider than the window (no sideways scrolling)."""
        overflow = self.page.evaluate(
            "() => [...document.querySelectorAll('main *')]"
            ".filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)"
            ".map(e => e.tagName + '.' + e.className)"
        )
        assert overflow == [], overflow

    # the live server's form check accepts hooks.slack.com without a DNS look-up
    @override_settings(CALLGATE_OUTBOUND_ALLOW=["hooks.slack.com"])
    def test_a_manager_links_slack_by_its_link_and_sets_the_projects_channels(self):
        # what an unlinked member's signed click in Slack is answered with
        link = notifications.slack_link_create(team_id="T0ACME", slack_user_id="U0MARIA")
        self.login("maria")
        for name, (width, height) in WIDTHS.items():
            self.page.set_viewport_size({"width": width, "height": height})
            self.visit(link.removeprefix(settings.CALLGATE_BASE_URL))
            self.page.get_by_role("heading", name="Link your Slack account?").wait_for()
            self.assert_fits()
            self.screenshot(f"slack-link-confirm-{name}")
        assert not SlackIdentity.objects.filter(user=self.maria).exists()  # looking links nothing
        self.page.get_by_role("button", name="Link to maria").click()
        self.page.get_by_role("heading", name="Slack account linked").wait_for()
        self.screenshot("slack-link-done-phone")
        self.page.set_viewport_size({"width": 1440, "height": 900})
        self.visit(f"/p/{self.project.slug}/")
        self.page.locator(".usermenu summary").click()
        self.page.get_by_role("menuitem", name="Notifications").click()
        self.page.get_by_role("heading", name="Notifications").wait_for()
        self.page.get_by_text("Linked to Slack member").wait_for()
        assert self.page.get_by_label("Slack member ID").count() == 0  # no typed IDs
        self.page.get_by_label("Slack incoming webhook URL").fill(
            "https://hooks.slack.com/services/T0ACME/B0REVIEW/xyz"
        )
        self.page.get_by_label("Email addresses").fill("ops@acme.test")
        self.page.locator("form:has(input[value=project]) button[type=submit]").click()
        self.page.get_by_text("The project's notifications are saved.").wait_for()
        assert SlackIdentity.objects.filter(user=self.maria, slack_user_id="U0MARIA").exists()
        assert ProjectNotifications.objects.get(project=self.project).emails == "ops@acme.test"
        for name, (width, height) in WIDTHS.items():
            self.page.set_viewport_size({"width": width, "height": height})
            self.assert_fits()
            self.screenshot(f"notifications-{name}")
        self.page.get_by_role("button", name="Unlink").click()
        self.page.get_by_text("Your Slack account is unlinked.").wait_for()
        self.page.get_by_text("How to link").wait_for()
        self.screenshot("notifications-unlinked-phone")
        assert not SlackIdentity.objects.filter(user=self.maria).exists()
        self.assert_no_console_errors()

    def test_an_email_link_confirms_then_decides(self):
        item = make_item(self.project, self.agent, kind=ReviewItem.Kind.APPROVAL)
        url = notifications.decision_link_create(item=item, user=self.alice, decision="approve")
        path = url.removeprefix(settings.CALLGATE_BASE_URL)
        # a reject link of a call whose arguments the message had to cut: the page shows all
        long = make_item(
            self.project,
            self.agent,
            kind=ReviewItem.Kind.APPROVAL,
            arguments={"memo": "Routine refund, confirmed by phone. " * 12, "amount": 99999},
        )
        reject = notifications.decision_link_create(item=long, user=self.alice, decision="reject")
        for name, (width, height) in WIDTHS.items():
            self.page.set_viewport_size({"width": width, "height": height})
            self.visit(reject.removeprefix(settings.CALLGATE_BASE_URL))
            self.page.get_by_role("button", name="Reject").wait_for()
            self.page.get_by_text('"amount": 99999').wait_for()
            self.assert_fits()
            self.screenshot(f"email-link-reject-{name}")
            self.visit(path)
            self.page.get_by_role("heading", name="Approve issue_refund?").wait_for()
            self.assert_fits()
            self.screenshot(f"email-link-confirm-{name}")
        item.refresh_from_db()
        assert item.is_open  # looking decides nothing
        self.page.get_by_role("button", name="Approve").click()
        self.page.get_by_text("Approved by alice").wait_for()
        self.screenshot("email-link-done-phone")
        self.visit(path)
        self.page.get_by_text("a link decides once").wait_for()
        self.assert_fits()
        self.screenshot("email-link-used-phone")
        item.refresh_from_db()
        assert (item.resolution, item.resolved_by) == ("approve", self.alice)
