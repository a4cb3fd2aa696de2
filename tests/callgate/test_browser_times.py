"""One time zone in the reports, in a real browser (issue 31): the rows are UTC hours and
days, so the range above them, its inputs, the as-of time and the exports are UTC too, and
say so, whatever the browser's time zone; the range is 24-hour text even where the
browser's own date-time inputs would show 12-hour forms (en-US)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

from tests.browser_support import BrowserTestCase, artifact_path

ZONE = "America/Chicago"


class ReportRangeInUtcTests(BrowserTestCase):
    def setUp(self):
        super().setUp()
        self.login("maria")

    def local_page(self, width: int, height: int):
        context = self.browser.new_context(
            viewport={"width": width, "height": height}, locale="en-US", timezone_id=ZONE
        )
        context.add_cookies(self.context.cookies())
        self.addCleanup(context.close)
        return context.new_page()

    def test_it_shows_and_takes_the_range_in_utc_in_another_time_zone(self):
        for width, height in ((1440, 900), (390, 844)):
            page = self.local_page(width, height)
            page.goto(
                self.url("/p/acme/reports/?since=2026-11-23T23:00:00Z&until=2026-11-24T15:00:00Z")
            )
            since = page.locator("input[name=since]")
            # 23:00 UTC stays 23:00 (17:00 in Chicago), written the 24-hour way
            assert since.input_value() == "2026-11-23 23:00"
            assert page.locator("input[name=until]").input_value() == "2026-11-24 15:00"
            assert since.get_attribute("type") == "text"
            label = " ".join(page.locator("label", has=since).inner_text().split())
            assert label.startswith("From (UTC)")
            assert "PM" not in page.locator(".report-filters").inner_text()
            head = page.locator(".pagehead").inner_text()
            assert "2026-11-23 23:00 – 2026-11-24 15:00 UTC" in head
            assert "(all times UTC)" in head
            page.screenshot(path=str(artifact_path(f"reports-range-utc-{width}")), full_page=True)

        # typed as UTC, sent as typed
        since.fill("2026-11-23 14:00")
        page.locator("input[name=until]").fill("2026-11-24")  # a date: that whole UTC day
        with page.expect_navigation():
            page.get_by_role("button", name="Apply").click()
        query = parse_qs(urlparse(page.url).query)
        assert query["since"] == ["2026-11-23 14:00"] and query["until"] == ["2026-11-24"]
        assert page.locator("input[name=since]").input_value() == "2026-11-23 14:00"
        assert page.locator("input[name=until]").input_value() == "2026-11-25 00:00"
