"""The report pages in a real browser (Chromium via Playwright), light and dark: charts are
drawn (no CSP or script errors), tables sit beside them, and screenshots of every page go
to ``test-artifacts/`` for a human to look at."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from callgate.models import Agent
from callgate.reports.rollups import hour_floor, rollups_rebuild
from tests.browser_support import BrowserTestCase, artifact_path
from tests.factories import make_contracts, make_review_item, seed_calls

PAGES = [
    ("overview", ""),
    ("reasons", "reasons/"),
    ("tools", "tools/"),
    ("agents", "agents/"),
    ("reliability", "reliability/"),
    ("review", "review/"),
]


class BrowserReportsTests(BrowserTestCase):
    viewport = {"width": 1440, "height": 900}

    def setUp(self):
        super().setUp()
        agents = [
            self.agent,
            *(
                Agent.objects.create(project=self.project, name=n)
                for n in ("travel-bot", "billing-bot")
            ),
        ]
        contracts = make_contracts(self.project)
        start = hour_floor(timezone.now()) - timedelta(days=7)
        calls = seed_calls(self.project, agents, contracts, n=900, start=start, hours=24 * 7)
        seed_calls(
            self.project,
            agents,
            contracts,
            seed=3,
            n=700,
            start=start - timedelta(days=7),
            hours=24 * 7,
        )
        self._review_items(calls)
        rollups_rebuild()

    def _review_items(self, calls):
        now = timezone.now()
        review = [c for c in calls if c.route == "review"]
        for i, call in enumerate(review):
            if i % 3 == 0:
                make_review_item(
                    call,
                    created_at=now - timedelta(minutes=7 * i + 3),
                )
            else:
                make_review_item(
                    call,
                    status="resolved",
                    resolution=["approve_retry", "reject", "mark_applied", "mark_failed"][i % 4],
                    created_at=call.created_at,
                    resolved_at=call.created_at + timedelta(minutes=4 + 9 * (i % 7)),
                )

    def _context(self, scheme: str):
        if not self.context.cookies():
            self.login("maria")
        context = self.browser.new_context(color_scheme=scheme, viewport=self.viewport)
        context.add_cookies(self.context.cookies())
        return context

    def test_it_draws_every_report_page_in_light_and_dark(self):
        for scheme in ("light", "dark"):
            context = self._context(scheme)
            page = context.new_page()
            errors: list[str] = []
            # script errors and CSP violations show as console errors; 404s are checked by URL below
            page.on(
                "console",
                lambda msg, errors=errors: (
                    errors.append(msg.text)
                    if msg.type == "error" and not msg.text.startswith("Failed to load resource")
                    else None
                ),
            )
            page.on(
                "response",
                lambda r, errors=errors: (
                    errors.append(f"{r.status} {r.url}")
                    if r.status >= 400 and not r.url.endswith("/favicon.ico")
                    else None
                ),
            )
            page.on("pageerror", lambda exc, errors=errors: errors.append(str(exc)))
            for name, path in PAGES:
                response = page.goto(f"{self.live_server_url}/p/acme/reports/{path}")
                assert response.status == 200, (name, response.status)
                page.wait_for_load_state("networkidle")
                canvases = page.locator("canvas[role=img]")
                for i in range(canvases.count()):
                    canvas = canvases.nth(i)
                    assert canvas.get_attribute("aria-label")
                    # Chart.js sized the canvas: it drew something
                    assert page.evaluate(
                        "(c) => Chart.getChart(c) !== undefined", canvas.element_handle()
                    ), (name, i)
                assert page.locator("table.report-table").count() >= 1
                if (
                    name == "overview"
                ):  # bars use the chart shades (--chart-*), one distinct colour per category
                    fills = page.evaluate("""() => Chart.getChart(document.getElementById('chart-categories')).data.datasets
                        .map((d) => [d.label, d.backgroundColor])""")
                    assert len(fills) >= 10 and len({f for _, f in fills}) == len(fills), (
                        scheme,
                        fills,
                    )
                    expected = page.evaluate("""() => ['ok', 'transient', 'approval', 'duplicate', 'denied', 'tool_error']
                        .map((c) => getComputedStyle(document.documentElement).getPropertyValue('--chart-' + c).trim())""")
                    assert all(expected) and set(expected) <= {f for _, f in fills}, (
                        scheme,
                        expected,
                        fills,
                    )
                page.screenshot(path=str(artifact_path(f"reports-{name}-{scheme}")), full_page=True)
            assert errors == [], errors
            context.close()

    def test_it_keeps_the_filters_when_the_form_is_submitted(self):
        context = self._context("light")
        page = context.new_page()
        page.goto(f"{self.live_server_url}/p/acme/reports/tools/")
        page.select_option("select[name=tool]", "get_weather")
        page.select_option("select[name=granularity]", "hour")
        page.click("form.report-filters button[type=submit]")
        page.wait_for_load_state("networkidle")
        assert "tool=get_weather" in page.url and "granularity=hour" in page.url
        page.click("nav.subnav a:has-text('Agents')")
        page.wait_for_load_state("networkidle")
        assert "/reports/agents/" in page.url and "tool=get_weather" in page.url
        assert page.locator("select[name=tool]").input_value() == "get_weather"
        context.close()

    def test_its_last_hour_chip_shows_two_whole_hours_and_says_so(self):
        context = self._context("light")
        page = context.new_page()
        page.goto(f"{self.live_server_url}/p/acme/reports/")
        page.click(".presets a.chip:has-text('1 h')")
        page.wait_for_load_state("networkidle")
        assert "granularity=hour" in page.url
        assert page.locator(".presets a.chip[aria-current=true]").inner_text() == "1 h"
        head = page.locator(".pagehead p.muted").first.inner_text()
        assert "the previous whole hour and this one so far" in head, head
        # two hourly periods: the previous hour and this one
        periods = page.locator("table.report-table").first.locator("tbody tr")
        assert periods.count() == 2, periods.all_inner_texts()
        page.screenshot(path=str(artifact_path("reports-last-hour")), full_page=True)
        context.close()


class BrowserReportsNarrowTests(BrowserReportsTests):
    """A 1366 px laptop screen: wide tables fit their card (headers wrap) or scroll inside it
    with a visible hint; nothing is clipped."""

    viewport = {"width": 1366, "height": 768}

    def test_it_draws_every_report_page_in_light_and_dark(self):  # covered at 1440 px
        pass

    def test_it_keeps_the_filters_when_the_form_is_submitted(self):  # covered at 1440 px
        pass

    def test_its_last_hour_chip_shows_two_whole_hours_and_says_so(self):  # covered at 1440 px
        pass

    def test_it_fits_or_scrolls_wide_tables_within_their_card(self):
        context = self._context("light")
        page = context.new_page()
        for name, path in PAGES:
            page.goto(f"{self.live_server_url}/p/acme/reports/{path}")
            page.wait_for_load_state("networkidle")
            boxes = page.evaluate("""() => [...document.querySelectorAll('.table-scroll')].map((box) => {
                const card = box.closest('.card').getBoundingClientRect();
                const r = box.getBoundingClientRect();
                return {table: box.querySelector('table').dataset.table, scroll: box.scrollWidth, client: box.clientWidth,
                        inside: r.left >= card.left - 1 && r.right <= card.right + 1,
                        hinted: box.classList.contains('overflowing') && getComputedStyle(box).overflowX === 'auto'};
            })""")
            for box in boxes:
                assert box["inside"], (name, box)
                assert box["scroll"] <= box["client"] + 1 or box["hinted"], (name, box)
            assert page.evaluate(
                "() => document.documentElement.scrollWidth <= window.innerWidth"
            ), name
            if name == "tools":
                page.screenshot(path=str(artifact_path("reports-tools-1366")), full_page=True)
        context.close()
