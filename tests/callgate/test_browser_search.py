"""The header's search box and saved views in a real browser, at 1440 and 390 px: ``/``
focuses the box, a search lands on the calls list with ``q=``, a malformed one names its
term, and a search saved as a view opens again from the menu. Screenshots go to
``test-artifacts/``."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from callgate.models import SavedView
from callgate.taxonomy import Reason
from tests.browser_support import BrowserTestCase
from tests.factories import make_call, make_review_item

WIDTHS = {"desktop": (1440, 900), "phone": (390, 844)}


class SearchBrowserTests(BrowserTestCase):
    def seed(self):
        now = timezone.now()
        calls = []
        for i in range(12):
            calls.append(
                make_call(
                    project=self.project,
                    agent=self.agent,
                    created_at=now - timedelta(minutes=i),
                    tool="create_ticket" if i % 2 else "search_orders",
                    reason=Reason.CONFLICT if i % 4 == 1 else Reason.OK,
                    state="failed" if i % 4 == 1 else "succeeded",
                    observation="HTTP 409: Ticket closed" if i % 4 == 1 else "",
                    request_id=f"req-{i}",
                )
            )
        make_review_item(calls[1])
        return calls

    def test_it_searches_from_the_header_and_saves_the_view(self):
        calls = self.seed()
        closed = {c.pk for c in calls if "closed" in c.observation}
        self.login("alice", next_path="/p/acme/")
        for name, (width, height) in WIDTHS.items():
            with self.subTest(viewport=name):
                self.page.set_viewport_size({"width": width, "height": height})
                self.visit("/p/acme/")
                box = self.page.locator("#search-box")
                assert box.is_visible()
                self.page.keyboard.press("/")
                assert self.page.evaluate("document.activeElement.id") == "search-box"
                self.page.keyboard.type('tool:create_ticket "ticket closed"')
                self.screenshot(f"search-typed-{name}", full_page=False)
                with self.page.expect_navigation(wait_until="load"):
                    self.page.keyboard.press("Enter")
                assert "/p/acme/calls/?q=" in self.page.url
                rows = self.page.locator("#call-rows tr[data-row]")
                assert {int(r.get_attribute("id").split("-")[1]) for r in rows.all()} == closed
                # the box stays on the screen (the phone puts it on a line of its own)
                box_edge = self.page.locator("#search-box").bounding_box()
                assert box_edge and box_edge["x"] + box_edge["width"] <= width
                self.screenshot(f"search-results-{name}")

                # saved under a name, listed in the menu, opened again
                self.page.locator(".savedviews summary").click()
                self.page.locator(".savedviews input[name=name]").fill(f"Closed tickets {name}")
                with self.page.expect_navigation(wait_until="load"):
                    self.page.locator(".savedviews button[type=submit]", has_text="Save").click()
                view = SavedView.objects.get(user=self.alice, name=f"Closed tickets {name}")
                self.visit("/p/acme/calls/")
                self.page.locator(".savedviews summary").click()
                self.screenshot(f"saved-views-menu-{name}", full_page=False)
                with self.page.expect_navigation(wait_until="load"):
                    self.page.get_by_role("link", name=view.name).click()
                assert self.page.locator("#call-rows tr[data-row]").count() == len(closed)

                # a malformed search names its term
                self.visit("/p/acme/review/?q=colour%3Ared")
                error = self.page.locator("p.error", has_text="colour:red")
                assert error.is_visible()
                self.page.locator(".searchhelp summary").click()
                assert self.page.locator(".searchhelp dt", has_text="assignee:").is_visible()
                self.screenshot(f"queue-bad-search-{name}")
        # the malformed search's page is a 400, which Chromium logs; nothing else
        self.console_errors = [e for e in self.console_errors if "status of 400" not in e]
        self.assert_no_console_errors()
