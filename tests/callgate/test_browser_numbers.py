"""The numbers in a real browser (issue 31): each labelled as ``metrics.NUMBERS`` says, and a
click on one lands on a calls list that shows the same count, at 1440 and 390 px."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

from django.utils import timezone

from callgate import metrics
from callgate.reports.rollups import rollups_rebuild
from callgate.reports.selectors import iso
from tests.browser_support import BrowserTestCase
from tests.factories import make_contracts, seed_calls


class NumbersBrowserTests(BrowserTestCase):
    def test_a_number_clicked_lands_on_a_list_of_that_many(self):
        since, _ = metrics.window(timedelta(hours=24))
        hours = max(1, int((timezone.now() - since).total_seconds() // 3600))
        seed_calls(
            self.project,
            [self.agent],
            make_contracts(self.project),
            n=120,
            start=since,
            hours=hours,
        )
        rollups_rebuild()
        window = urlencode({"since": iso(since), "until": iso(since + timedelta(hours=24))})
        self.login("maria")
        for width, height in ((1440, 900), (390, 844)):
            self.page.set_viewport_size({"width": width, "height": height})
            for page, key in (
                ("/p/acme/", "unknown_now"),
                (f"/p/acme/reports/reliability/?{window}", "repeats_answered"),
            ):
                self.visit(page)
                number = self.page.locator(f"[data-number={key}]")
                tile = self.page.locator(".tile", has=self.page.locator(f"[data-number={key}]"))
                if tile.count() == 0:  # the overview's tile is the link itself
                    tile = number
                assert metrics.label(key) in tile.inner_text(), key
                big = number.locator(".big")
                shown = (big if big.count() else number).inner_text().strip()
                assert int(shown.replace(",", "")) > 0, key
                self.screenshot(f"numbers-{key}-{width}")
                with self.page.expect_navigation():
                    number.click()
                head = self.page.locator(".pagehead").inner_text()
                listed = (
                    self.page.locator("[data-repeats]")
                    if key == "repeats_answered"
                    else self.page.locator(".pagehead .num").first
                )
                assert listed.inner_text().strip() == shown, (key, head)
        self.assert_no_console_errors()
