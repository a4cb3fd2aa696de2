"""The review queue's counts after an action, and a claimed row that keeps its place, in a
real browser (system Chromium via Playwright), at 1440 and 390 px."""

from __future__ import annotations

from datetime import timedelta

from reviews.models import ReviewItem
from tests.browser_support import BrowserTestCase
from tests.reviews.fixtures import make_item


class QueueCountsBrowserTests(BrowserTestCase):
    def rows(self) -> list[dict]:
        """Every queue row's id, top and height (CSS px, the page's own coordinates)."""
        return self.page.eval_on_selector_all(
            "table.queue tbody tr",
            "rows => rows.map(r => { const b = r.getBoundingClientRect();"
            " return {id: r.id, top: Math.round(b.top + window.scrollY),"
            " height: Math.round(b.height)}; })",
        )

    def wait_until_htmx_idle(self) -> None:
        self.page.wait_for_function(
            "() => !document.querySelector('.htmx-added, .htmx-settling, .htmx-swapping, .htmx-request')"
        )

    def status_count(self, status: str) -> str:
        return self.page.locator(f"select[name=status] option[value={status}]").inner_text()

    def test_counts_are_fresh_and_a_claimed_row_keeps_its_place(self):
        items = [
            make_item(
                self.project,
                self.agent,
                reason="outcome_unknown",
                age=timedelta(minutes=40 - i),
            )
            for i in range(4)
        ]
        self.login("alice")
        for width, height in ((1440, 900), (390, 844)):
            ReviewItem.objects.filter(pk__in=[i.pk for i in items]).update(
                status=ReviewItem.Status.OPEN, assignee=None, lease_expires_at=None
            )
            self.page.set_viewport_size({"width": width, "height": height})
            self.visit(f"/p/{self.project.slug}/review/")
            self.page.locator("table.queue").wait_for()
            assert "Claimed (0)" in self.status_count("claimed")
            before = self.rows()
            # one row claimed from its own button: the rows keep their places and heights
            row = self.page.locator(f"#item-{items[1].pk}")
            row.get_by_role("button", name="Claim").click()
            self.page.locator(f"#item-{items[1].pk} .rowflash").wait_for()
            self.wait_until_htmx_idle()
            assert self.rows() == before, (width, before, self.rows())
            self.page.wait_for_function(
                "() => document.querySelector('select[name=status] option[value=claimed]')"
                ".textContent.includes('Claimed (1)')"
            )
            assert "1 claimed" in self.page.locator(".progress-strip .chip.me").inner_text()
            # a bulk claim of two more: the chip and the status count say three
            for item in (items[2], items[3]):
                self.page.locator(f"#item-{item.pk} input[type=checkbox]").check()
            self.page.select_option("select[name=action]", "claim")
            self.page.get_by_role("button", name="Apply").click()
            self.page.get_by_text("Bulk claim: 2 done").wait_for()
            self.page.wait_for_function(
                "() => document.querySelector('select[name=status] option[value=claimed]')"
                ".textContent.includes('Claimed (3)')"
            )
            self.wait_until_htmx_idle()
            assert "3 claimed" in self.page.locator(".progress-strip .chip.me").inner_text()
            self.screenshot(f"queue-after-bulk-claim-{width}")
        self.assert_no_console_errors()
