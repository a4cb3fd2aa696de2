"""One time format in a real browser (shared/UI.md): the report range is typed and shown as
24-hour text in the browser's time zone, even where the browser's own date-time inputs
would show 12-hour forms (en-US), and goes to the server and the URL in UTC."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import parse_qs, urlparse
from zoneinfo import ZoneInfo

from tests.browser_support import BrowserTestCase, artifact_path

ZONE = "America/Chicago"


class ReportRangeInBrowserTimeTests(BrowserTestCase):
    def setUp(self):
        super().setUp()
        self.login("maria")
        self.local = self.browser.new_context(
            viewport=dict(self.viewport), locale="en-US", timezone_id=ZONE
        )
        self.local.add_cookies(self.context.cookies())
        self.addCleanup(self.local.close)

    def test_it_shows_the_range_in_local_24_hour_time_and_sends_utc(self):
        page = self.local.new_page()
        page.goto(
            self.url("/p/acme/reports/?since=2026-11-23T23:00:00Z&until=2026-11-24T15:00:00Z")
        )
        since = page.locator("input[name=since]")
        # 23:00 UTC is 17:00 in Chicago (CST, UTC-6), written the 24-hour way
        assert since.input_value() == "2026-11-23 17:00"
        assert page.locator("input[name=until]").input_value() == "2026-11-24 09:00"
        assert since.get_attribute("type") == "text"
        label = " ".join(page.locator("label", has=since).inner_text().split())
        assert label.startswith("From (America/Chicago)")
        assert "PM" not in page.locator(".report-filters").inner_text()
        # the range above the report: local too, the UTC moment on hover
        head = page.locator(".pagehead time").first
        assert head.inner_text() == "Nov 23, 17:00"
        assert head.get_attribute("title") == "2026-11-23 23:00:00 UTC"
        page.screenshot(path=str(artifact_path("reports-range-chicago")))

        # typed in local time (afternoon, 24-hour), sent as the UTC moment
        since.fill("2026-11-23 14:00")
        page.locator("input[name=until]").fill("2026-11-24")  # a date: that whole local day
        with page.expect_navigation():
            page.get_by_role("button", name="Apply").click()
        query = parse_qs(urlparse(page.url).query)
        local = ZoneInfo(ZONE)
        assert query["since"] == [_utc(datetime(2026, 11, 23, 14, 0, tzinfo=local))]
        assert query["until"] == [_utc(datetime(2026, 11, 25, 0, 0, tzinfo=local))]
        assert page.locator("input[name=since]").input_value() == "2026-11-23 14:00"
        assert page.locator("input[name=until]").input_value() == "2026-11-25 00:00"


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
