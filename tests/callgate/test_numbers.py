"""One number, one definition (shared/UI.md, issue 15): each number of the overview equals
the report's, the report's CSV, the API's and the row count of the calls list it links to,
on the same data; every drill-down (also "Unclassified" and "(no tool name)") lands on
exactly the calls it counted."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime, timedelta
from html import unescape
from unittest import mock
from urllib.parse import urlparse

from django.test import SimpleTestCase
from django.utils import timezone

from callgate import labels, metrics
from callgate.models import Agent, CallEvent, ToolCall
from callgate.reports.rollups import rollups_rebuild
from callgate.taxonomy import Category, Reason, Route
from tests.factories import BaseTestCase, make_call, make_contracts, seed_calls


class NumbersAgreeTests(BaseTestCase):
    @classmethod
    def setUpClass(cls):
        # one moment for the whole class: the data is laid out on the last 24 whole hours, and
        # an hour that turns between set-up and a page load would move the window (CI once
        # ran these at 03:00)
        clock = mock.patch("django.utils.timezone.now", return_value=timezone.now())
        clock.start()
        cls.addClassCleanup(clock.stop)
        super().setUpClass()

    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        cls.agent2 = Agent.objects.create(project=cls.project, name="travel-bot")
        contracts = make_contracts(cls.project)
        since, until = metrics.window(timedelta(hours=24))
        cls.since, cls.until = since, until
        now = timezone.now()
        # inside the window (up to now), and in the hour just before it (must not count)
        seed_calls(
            cls.project,
            [cls.agent, cls.agent2],
            contracts,
            n=160,
            start=since,
            hours=int((now - since).total_seconds() // 3600) or 1,
        )
        seed_calls(
            cls.project,
            [cls.agent],
            contracts,
            seed=3,
            n=30,
            start=since - timedelta(hours=1),
            hours=1,
        )
        for i in range(3):  # in flight: no category yet, one without a tool name
            make_call(
                project=cls.project,
                agent=cls.agent,
                tool="" if i == 0 else "get_weather",
                reason="",
                state=ToolCall.State.ALLOWED,
                created_at=since + timedelta(minutes=5 + i),
            )
        make_call(
            project=cls.project,
            agent=cls.agent,
            tool="",
            reason=Reason.UNKNOWN_TOOL,
            created_at=since + timedelta(minutes=9),
        )
        # an unknown outcome since settled: counted by "had an unknown outcome" only
        settled = make_call(
            project=cls.project,
            agent=cls.agent,
            reason=Reason.OK,
            created_at=since + timedelta(minutes=11),
        )
        CallEvent.objects.create(
            project=cls.project,
            call=settled,
            kind=CallEvent.Kind.ATTEMPT,
            body={},
            occurred_at=settled.created_at,
            category=Category.UNKNOWN_OUTCOME,
            reason=Reason.OUTCOME_UNKNOWN,
        )
        # a duplicate call that was not answered with a receipt (same operation, other arguments)
        make_call(
            project=cls.project,
            agent=cls.agent,
            tool="create_follow_up",
            reason=Reason.IDEMPOTENCY_MISMATCH,
            created_at=since + timedelta(minutes=12),
        )
        # an unknown outcome a human decided: counted by "settled by a human"
        decided = make_call(
            project=cls.project,
            agent=cls.agent,
            tool="issue_refund",
            reason=Reason.OK,
            created_at=since + timedelta(minutes=13),
            decided_at=since + timedelta(minutes=20),
        )
        CallEvent.objects.create(
            project=cls.project,
            call=decided,
            kind=CallEvent.Kind.ATTEMPT,
            body={},
            occurred_at=decided.created_at,
            category=Category.UNKNOWN_OUTCOME,
            reason=Reason.OUTCOME_UNKNOWN,
        )
        rollups_rebuild()

    def setUp(self):
        self.client.force_login(self.maria)

    # --- helpers ---------------------------------------------------------------------

    def overview_numbers(self) -> dict[str, tuple[int, str]]:
        html = self.client.get("/p/acme/").content.decode()
        found = re.findall(
            r'href="([^"]+)" data-number="([\w-]+)"><span class="big">([\d,]+)</span>', html
        )
        found += [
            (href, name, n)
            for href, name, n in re.findall(
                r'<a href="([^"]+)" data-number="([\w-]+)">([\d,]+)</a>', html
            )
        ]
        return {name: (int(n.replace(",", "")), unescape(href)) for href, name, n in found}

    def listed(self, href: str) -> int:
        """The calls list's count for a drill-down link, checked against its rows; for the
        calls that answered repeats (``category=repeated``) the repeats the list sums."""
        url = urlparse(href)
        response = self.client.get(url.path + "?" + url.query)
        assert response.status_code == 200, href
        assert not response.context["errors"], response.context["errors"]
        total = response.context["total"]
        rows = response.context["page"].rows
        if total <= len(rows) or response.context["page"].older is None:
            assert len(rows) == total, href
        if response.context["repeats"] is not None:
            return response.context["repeats"]
        return total

    def window_params(self) -> dict:
        return {"since": metrics_iso(self.since), "until": metrics_iso(self.until)}

    def api_categories(self) -> dict:
        response = self.api().get("/api/v1/reports/categories", self.window_params())
        assert response.status_code == 200
        return response.json()

    def report_csv(self, path: str, table: str, **extra) -> list[list[str]]:
        response = self.client.get(
            path, {**self.window_params(), "format": "csv", "table": table, **extra}
        )
        assert response.status_code == 200
        return list(csv.reader(io.StringIO(response.content.decode())))

    def category_totals_from_csv(self) -> dict[str, int]:
        rows = self.report_csv("/p/acme/reports/", "categories", granularity="hour")
        head, foot = rows[0], rows[-1]
        labels = {c.label: c.value for c in Category} | {"Unclassified": ""}
        return {labels[h]: int(v) for h, v in zip(head[1:-1], foot[1:-1], strict=True)}

    def marked_numbers(self, path: str) -> dict[str, tuple[int, str]]:
        """The numbers a report page marks (``data-number``): key -> (value, link)."""
        html = self.client.get(path, {**self.window_params(), "granularity": "hour"})
        found = re.findall(
            r'<a (?:class="big" )?href="([^"]+)" data-number="([\w-]+)">([\d,]+)</a>',
            html.content.decode(),
        )
        return {name: (int(n.replace(",", "")), unescape(href)) for href, name, n in found}

    def csv_cell(self, path: str, table: str, column: str, row: str = "Total") -> int:
        """A report CSV's cell: ``row`` by its first cell ("Total": the foot), ``column`` by
        its header; ``row="*"`` sums the column over the rows (no foot)."""
        rows = self.report_csv(path, table, granularity="hour")
        i = rows[0].index(column)
        if row == "*":
            return sum(int(r[i]) for r in rows[1:])
        return int(next(r for r in rows[1:] if r[0] == row)[i])

    # --- the numbers -----------------------------------------------------------------

    def test_the_numbers_table(self):
        """Every number of ``metrics.NUMBERS``, non-zero on this data, is the same on the
        overview (where it is shown), the report page that shows it, the calls list it
        links to (its rows; for repeats, the sum the list shows), the report's CSV and the
        API; its label is the one of ``metrics.NUMBERS`` in the CSV header or row."""

        def cat(name):
            return labels.label(name, "category")

        def head(key):
            return metrics.label(key).capitalize()

        def api(name):
            return self.api().get(f"/api/v1/reports/{name}", self.window_params()).json()

        def api_category(*names):
            totals = {s["category"]: s["total"] for s in api("categories")["series"]}
            return sum(totals.get(n, 0) for n in names)

        overview_page, reliability = "/p/acme/reports/", "/p/acme/reports/reliability/"
        # key: (report page, (CSV page, table, column, row), API value)
        table = {
            "calls": (
                overview_page,
                (overview_page, "categories", "Total", "Total"),
                lambda: api("categories")["total"],
            ),
            "not_ok": (
                overview_page,
                ("/p/acme/reports/tools/", "tools", head("not_ok"), "*"),
                lambda: api("categories")["not_ok"],
            ),
            "unknown_now": (
                overview_page,
                (overview_page, "categories", cat("unknown_outcome"), "Total"),
                lambda: api_category("unknown_outcome"),
            ),
            "bad_arguments": (
                overview_page,
                None,  # two CSV columns, summed below
                lambda: api_category("argument_error", "hallucination"),
            ),
            "refused": (
                overview_page,
                (overview_page, "routes", "Calls", labels.label(metrics.REFUSED_ROUTE, "route")),
                lambda: {r["route"]: r["calls"] for r in api("routes")["rows"]}["deny"],
            ),
            **{
                key: (
                    reliability,
                    (reliability, "unknown_outcomes", head(key), "Total"),
                    lambda field=field: api("unknown-outcomes")[field],
                )
                for key, field in (
                    ("unknown_ever", "total"),
                    ("unknown_by_reconciliation", "by_reconciliation"),
                    ("unknown_by_human", "by_human"),
                    ("unknown_open", "open"),
                )
            },
            **{
                key: (
                    reliability,
                    (reliability, "duplicates", head(key), "Total"),
                    lambda key=key: api("duplicates")[key],
                )
                for key in ("repeats_answered", "duplicate_calls")
            },
            "retried": (
                reliability,
                (reliability, "retries", "Calls", "Total"),
                lambda: api("retries")["total"],
            ),
            **{
                key: (
                    reliability,
                    (reliability, "retries", "Calls", head(key)),
                    lambda field=field: api("retries")[field],
                )
                for key, field in (
                    ("retried_succeeded", "succeeded"),
                    ("retried_other", "other"),
                    ("retry_exhausted", "exhausted"),
                )
            },
        }
        assert set(table) == set(metrics.NUMBERS), "a number without its row in this table"
        on_overview = self.overview_numbers()
        marked = {page: self.marked_numbers(page) for page in (overview_page, reliability)}
        for key, (page, csv_at, api_value) in table.items():
            value, href = marked[page][key]
            assert value > 0, key
            if key in on_overview:
                assert on_overview[key] == (value, href), key
            assert self.listed(href) == value, key
            if csv_at is None:
                csv_value = self.csv_cell(
                    overview_page, "categories", cat("argument_error")
                ) + self.csv_cell(overview_page, "categories", cat("hallucination"))
            else:
                csv_value = self.csv_cell(*csv_at)
            assert csv_value == value, key
            assert api_value() == value, key
        # the overview shows no number the table does not hold
        assert set(on_overview) - {"open_reviews"} <= {
            k for k in on_overview if k.startswith("category-")
        } | set(table)

    def test_csv_cells_are_labels_and_dates_carry_the_year(self):
        codes = {c.value for c in Category} | {r.value for r in Reason}
        codes |= {r.value for r in Route}
        for path, table in (
            ("/p/acme/reports/", "categories"),
            ("/p/acme/reports/", "routes"),
            ("/p/acme/reports/reasons/", "reasons"),
            ("/p/acme/reports/reliability/", "unknown_outcomes"),
        ):
            rows = self.report_csv(path, table, granularity="hour")
            cells = {cell for row in rows for cell in row}
            assert not cells & codes, (table, cells & codes)
        periods = self.report_csv("/p/acme/reports/", "categories", granularity="hour")
        for row in periods[1:-1]:
            moment = datetime.fromisoformat(row[0].replace("Z", "+00:00"))
            assert self.since <= moment < self.until and moment.year == self.since.year

    def test_total_calls_agree(self):
        page = self.overview_numbers()["calls"]
        direct = ToolCall.objects.filter(
            project=self.project, created_at__gte=self.since, created_at__lt=self.until
        ).count()
        assert page[0] == direct
        assert self.api_categories()["total"] == direct
        assert sum(self.category_totals_from_csv().values()) == direct
        assert self.listed(page[1]) == direct

    def test_not_ok_agrees(self):
        page = self.overview_numbers()["not_ok"]
        direct = ToolCall.objects.filter(
            project=self.project,
            created_at__gte=self.since,
            created_at__lt=self.until,
            category__in=metrics.NOT_OK_CATEGORIES,
        ).count()
        assert 0 < page[0] == direct
        assert self.api_categories()["not_ok"] == direct
        csv_totals = self.category_totals_from_csv()
        assert sum(n for c, n in csv_totals.items() if metrics.is_not_ok(c)) == direct
        assert self.listed(page[1]) == direct
        # the per-tool "not ok" of the report sums to the same
        tools = self.api().get("/api/v1/reports/tools", self.window_params()).json()
        assert sum(r["not_ok"] for r in tools["rows"]) == direct

    def test_unknown_outcome_agrees(self):
        page = self.overview_numbers()["unknown_now"]
        direct = ToolCall.objects.filter(
            project=self.project,
            created_at__gte=self.since,
            created_at__lt=self.until,
            category=Category.UNKNOWN_OUTCOME,
        ).count()
        assert 0 < page[0] == direct
        api = {s["category"]: s["total"] for s in self.api_categories()["series"]}
        assert api["unknown_outcome"] == direct
        assert self.category_totals_from_csv()["unknown_outcome"] == direct
        assert self.listed(page[1]) == direct

    def test_had_an_unknown_outcome_is_its_own_number_and_drills_down_exactly(self):
        api = self.api().get("/api/v1/reports/unknown-outcomes", self.window_params()).json()
        rows = self.report_csv("/p/acme/reports/reliability/", "unknown_outcomes")
        assert int(rows[-1][-1]) == api["total"]
        html = self.client.get(
            "/p/acme/reports/reliability/", self.window_params()
        ).content.decode()
        links = re.findall(r'<a href="([^"]+category=unknown_ever[^"]*)"[^>]*>([\d,]+)</a>', html)
        assert links
        for href, n in links:
            assert self.listed(unescape(href)) == int(n.replace(",", ""))
        assert any(int(n) == api["total"] for _, n in links)

    def test_refused_agrees(self):
        page = self.overview_numbers()["refused"]
        direct = ToolCall.objects.filter(
            project=self.project,
            created_at__gte=self.since,
            created_at__lt=self.until,
            route=metrics.REFUSED_ROUTE,
        ).count()
        assert 0 < page[0] == direct
        api = self.api().get("/api/v1/reports/routes", self.window_params()).json()
        assert {r["route"]: r["calls"] for r in api["rows"]}["deny"] == direct
        routes = self.report_csv("/p/acme/reports/", "routes")
        refused = labels.label(metrics.REFUSED_ROUTE, "route")
        assert dict((r[0], r[1]) for r in routes[1:])[refused] == str(direct)
        assert self.listed(page[1]) == direct

    def test_every_category_of_the_overview_drills_down_exactly(self):
        numbers = self.overview_numbers()
        csv_totals = self.category_totals_from_csv()
        assert "category-none" in numbers  # the unclassified row is there and links
        for name, (n, href) in numbers.items():
            if not name.startswith("category-"):
                continue
            slug = name.removeprefix("category-")
            assert csv_totals["" if slug == "none" else slug] == n
            assert self.listed(href) == n, name

    def test_every_number_on_the_report_pages_drills_down_exactly(self):
        for path in (
            "/p/acme/reports/",
            "/p/acme/reports/reasons/",
            "/p/acme/reports/tools/",
            "/p/acme/reports/agents/",
        ):
            html = self.client.get(
                path, {**self.window_params(), "granularity": "day"}
            ).content.decode()
            links = re.findall(r'<td class="num[^"]*"><a href="([^"]+)"[^>]*>([\d,]+)</a>', html)
            assert links, path
            for href, n in links:
                assert self.listed(unescape(href)) == int(n.replace(",", "")), (path, href)
            assert "tool=%28none%29" in html or path != "/p/acme/reports/tools/"

    def test_the_last_24_hours_are_24_whole_hours_up_to_now_and_say_so(self):
        now = timezone.now()
        assert self.until - self.since == timedelta(hours=24)
        # never older than 24 hours, and all of the last 23
        assert now - timedelta(hours=24) < self.since <= now - timedelta(hours=23)
        html = self.client.get("/p/acme/").content.decode()
        shown = re.search(
            r"Last 24 hours: <span data-window[^>]*><time datetime=\"([^\"]+)\"", html
        )
        assert shown and shown.group(1) == self.since.isoformat()
        assert "– now</span>" in html
        # the calls list's "24h", the agents page and the reports' "24 h" preset: the same
        total = self.overview_numbers()["calls"][0]
        assert self.listed("/p/acme/calls/?since=24h") == total
        agents = self.client.get("/p/acme/agents/").context["agents"]
        assert sum(a.calls_24h for a in agents) == total
        reports = self.client.get("/p/acme/reports/").content.decode()
        preset = re.search(r'href="(\?[^"]+)"[^>]*>24 h</a>', reports)
        assert preset, "no 24 h preset"
        query = unescape(preset.group(1))
        assert f"since={metrics_iso(self.since)}".replace(":", "%3A") in query
        page = self.client.get("/p/acme/reports/" + query)
        assert page.context["f"].since == self.since and page.context["f"].until == self.until
        assert sum(self.category_totals_from_csv().values()) == total


class WindowTests(SimpleTestCase):
    """``metrics.window``: "the last N hours" is N whole UTC hours ending with the current
    one; ``covering_window`` (alert rules) holds all of the last N hours."""

    def at(self, hour, minute=0):
        return datetime(2026, 11, 30, hour, minute, tzinfo=UTC)

    def test_it_is_exactly_the_length_in_whole_hours_ending_with_this_hour(self):
        now = self.at(17, 42)
        since, until = metrics.window(timedelta(hours=24), now=now)
        assert (since, until) == (self.at(18) - timedelta(days=1), self.at(18))
        assert until - since == timedelta(hours=24)
        on_the_hour = metrics.window(timedelta(hours=24), now=self.at(17))
        assert on_the_hour == (self.at(18) - timedelta(days=1), self.at(18))
        week = metrics.window(timedelta(days=7), now=now)
        assert week[1] - week[0] == timedelta(days=7) and week[1] == self.at(18)
        # a length that is no whole number of hours is rounded up to one
        assert metrics.window(timedelta(minutes=90), now=now) == (self.at(16), self.at(18))
        # and to at least two: the previous hour and this one
        assert metrics.window(timedelta(minutes=5), now=now) == (self.at(16), self.at(18))

    def test_the_last_hour_holds_the_past_60_minutes_just_after_the_hour(self):
        for now in (self.at(17), self.at(17, 2), self.at(17, 59)):
            since, until = metrics.window(metrics.WINDOWS["1h"], now=now)
            # the previous whole hour and the current one (not the current one alone,
            # which holds 2 minutes of calls at 17:02)
            assert (since, until) == (self.at(16), self.at(18)), now
            assert since <= now - timedelta(hours=1) and until > now

    def test_the_calls_lists_last_hour_is_exact_and_its_day_is_whole_hours(self):
        now = self.at(17, 2)
        assert metrics.list_since(metrics.WINDOWS["1h"], now=now) == self.at(16, 2)
        day = metrics.WINDOWS["24h"]
        assert metrics.list_since(day, now=now) == metrics.window(day, now=now)[0]

    def test_the_covering_window_of_alerts_holds_all_of_the_last_length(self):
        now = self.at(17, 42)
        since, until = metrics.covering_window(timedelta(hours=1), now=now)
        assert (since, until) == (self.at(16), self.at(18))
        assert since <= now - timedelta(hours=1) and until >= now


def metrics_iso(moment) -> str:
    from callgate.reports.selectors import iso

    return iso(moment)
