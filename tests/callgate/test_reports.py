"""Report selectors, pages (permissions, CSV, drill-down links) and the reports API."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from unittest import mock
from urllib.parse import parse_qs, urlparse

from callgate import labels
from callgate.models import Agent, CallEvent, ToolCall
from callgate.reports import rollups
from callgate.reports import selectors as reports
from callgate.reports.rollups import rollups_rebuild
from callgate.taxonomy import Reason
from tests.factories import (
    T0,
    BaseTestCase,
    make_call,
    make_contracts,
    make_review_item,
    seed_calls,
)


class ReportFixture(BaseTestCase):
    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        cls.agent2 = Agent.objects.create(project=cls.project, name="travel-bot")
        cls.contracts = make_contracts(cls.project)
        cls.calls = seed_calls(cls.project, [cls.agent, cls.agent2], cls.contracts)
        # the previous week, fewer calls, and another project's calls in the same hours
        seed_calls(
            cls.project, [cls.agent], cls.contracts, seed=8, n=120, start=T0 - timedelta(days=7)
        )
        seed_calls(cls.other_project, [cls.other_agent], {}, seed=9, n=80)
        rollups_rebuild()

    def filters(self, **params) -> reports.ReportFilters:
        base = {"since": "2026-03-02", "until": "2026-03-08"}
        base.update(params)
        return reports.report_filters_parse(base, project=self.project)

    def direct(self, **filters):
        qs = ToolCall.objects.filter(
            project=self.project, created_at__gte=T0, created_at__lt=T0 + timedelta(days=7)
        )
        return qs.filter(**filters)


class ReportSelectorsTests(ReportFixture):
    def test_it_parses_filters_to_whole_hours(self):
        f = reports.report_filters_parse(
            {
                "since": "2026-03-02T10:30:00+01:00",
                "until": "2026-03-02T12:10Z",
                "granularity": "hour",
            },
            project=self.project,
        )
        assert f.since == datetime(2026, 3, 2, 9, tzinfo=UTC)
        assert f.until == datetime(2026, 3, 2, 13, tzinfo=UTC)
        f = self.filters()
        assert (f.since, f.until, f.granularity) == (T0, T0 + timedelta(days=7), "day")

    def test_it_names_the_field_of_a_bad_filter(self):
        cases = [
            ({"since": "yesterday"}, "since"),
            ({"until": "2026-13-01"}, "until"),
            ({"since": "2026-03-05", "until": "2026-03-01"}, "since"),
            ({"granularity": "minute"}, "granularity"),
            ({"since": "2026-01-01", "until": "2026-03-01", "granularity": "hour"}, "granularity"),
            ({"agent": "abc"}, "agent"),
            ({"agent": str(self.other_agent.pk)}, "agent"),
            ({"tool": "x" * 200}, "tool"),
        ]
        for params, field in cases:
            try:
                reports.report_filters_parse(params, project=self.project)
            except reports.ReportFilterError as exc:
                assert exc.field == field, (params, exc)
            else:
                raise AssertionError(f"no error for {params}")

    def test_it_counts_categories_per_day_like_the_raw_calls(self):
        data = reports.report_categories(project=self.project, f=self.filters())
        assert len(data["periods"]) == 7  # Mar 2 .. Mar 8: a date as "until" includes that day
        for series in data["series"]:
            for i, period in enumerate(data["periods"]):
                since = datetime.fromisoformat(period["since"].replace("Z", "+00:00"))
                until = datetime.fromisoformat(period["until"].replace("Z", "+00:00"))
                assert (
                    series["counts"][i]
                    == ToolCall.objects.filter(
                        project=self.project,
                        category=series["category"],
                        created_at__gte=since,
                        created_at__lt=until,
                    ).count()
                )
        assert data["total"] == self.direct().count()

    def test_it_buckets_by_week_starting_monday_and_clips_partial_weeks(self):
        f = self.filters(since="2026-02-25", until="2026-03-10", granularity="week")
        data = reports.report_categories(project=self.project, f=f)
        assert [p["since"] for p in data["periods"]] == [
            "2026-02-25T00:00:00Z",
            "2026-03-02T00:00:00Z",
            "2026-03-09T00:00:00Z",
        ]
        total = ToolCall.objects.filter(
            project=self.project, created_at__gte=f.since, created_at__lt=f.until
        ).count()
        assert data["total"] == total

    def test_it_compares_reasons_with_the_previous_period(self):
        f = reports.report_filters_parse(
            {"since": "2026-03-02", "until": "2026-03-08"}, project=self.project
        )
        data = reports.report_reasons(project=self.project, f=f)
        prev_since, prev_until = f.previous
        for row in data["rows"]:
            now_n = ToolCall.objects.filter(
                project=self.project,
                reason=row["reason"],
                created_at__gte=f.since,
                created_at__lt=f.until,
            ).count()
            prev_n = ToolCall.objects.filter(
                project=self.project,
                reason=row["reason"],
                created_at__gte=prev_since,
                created_at__lt=prev_until,
            ).count()
            assert (row["calls"], row["previous_calls"], row["change"]) == (
                now_n,
                prev_n,
                now_n - prev_n,
            )
        assert abs(sum(r["share"] or 0 for r in data["rows"]) - 1) < 0.01

    def test_it_filters_by_tool_and_agent(self):
        f = reports.report_filters_parse(
            {
                "since": "2026-03-02",
                "until": "2026-03-08",
                "tool": "get_weather",
                "agent": str(self.agent2.pk),
            },
            project=self.project,
        )
        data = reports.report_tools(project=self.project, f=f)
        assert [r["tool"] for r in data["rows"]] == ["get_weather"]
        assert (
            data["rows"][0]["calls"]
            == ToolCall.objects.filter(
                project=self.project,
                tool_name="get_weather",
                agent=self.agent2,
                created_at__gte=f.since,
                created_at__lt=f.until,
            ).count()
        )
        agents = reports.report_agents(project=self.project, f=f)
        assert [r["agent"] for r in agents["rows"]] == ["travel-bot"]

    def test_it_reports_routes_duplicates_and_contract_quality(self):
        f = self.filters(until="2026-03-09")
        routes = reports.report_routes(project=self.project, f=f)
        assert routes["total"] == self.direct().count()
        assert {r["route"]: r["calls"] for r in routes["rows"]}["proceed"] == self.direct(
            route="proceed"
        ).count()
        dups = reports.report_duplicates(project=self.project, f=f)
        assert dups["repeats_answered"] == sum(c.duplicates_suppressed for c in self.direct())
        assert dups["duplicate_calls"] == self.direct(category="duplicate").count()
        quality = reports.report_contracts(project=self.project, f=f)
        row = next(r for r in quality["rows"] if r["tool"] == "create_follow_up")
        calls = self.direct(contract=self.contracts["create_follow_up"])
        assert (row["lint_score"], row["calls"]) == (71, calls.count())
        assert row["argument_errors"] == calls.filter(category="argument_error").count()

    def test_it_reports_retries_and_unknown_outcomes(self):
        f = self.filters(until="2026-03-09")
        data = reports.report_retries(project=self.project, f=f)
        needed = (
            self.direct().filter(attempts__gte=2)
            | self.direct(category="transient")
            | self.direct(reason="retry_exhausted")
        )
        assert data["total"] == needed.distinct().count()
        assert data["exhausted"] == self.direct(reason="retry_exhausted").count()
        assert sum(a["calls"] for a in data["attempts"]) == data["total"]

        call = self.direct(reason="outcome_unknown").first()
        ToolCall.objects.filter(pk=call.pk).update(
            decided_at=T0 + timedelta(days=1), decision="mark_failed", state=ToolCall.State.FAILED
        )
        settled = self.direct(reason="ok").first()  # once unknown, settled by a later receipt
        CallEvent.objects.create(
            project=self.project,
            call=settled,
            kind="attempt",
            body={},
            occurred_at=T0,
            category="unknown_outcome",
            reason="outcome_unknown",
        )
        rollups.rollups_rebuild(project_id=self.project.pk)  # what the refresh does next
        unknown = reports.report_unknown_outcomes(project=self.project, f=f)
        open_n = self.direct(
            category="unknown_outcome", state__in=rollups.OPEN_STATES, decided_at__isnull=True
        ).count()
        open_n += self.direct(
            category="reconciliation", state__in=rollups.OPEN_STATES, decided_at__isnull=True
        ).count()
        assert unknown["by_human"] == 1
        assert unknown["open"] == open_n
        assert (
            unknown["total"]
            == self.direct(category__in=["unknown_outcome", "reconciliation"]).count() + 1
        )

    def test_it_reports_review_health(self):
        calls = list(self.direct(reason="outcome_unknown")[:4])
        now = T0 + timedelta(days=3)
        for i, call in enumerate(calls):
            make_review_item(
                call,
                status="resolved",
                resolution="mark_applied" if i % 2 else "reject",
                created_at=now - timedelta(hours=i + 1),
                resolved_at=now,
            )
        make_review_item(
            self.calls[0],
            reason="ok",
            created_at=now - timedelta(minutes=30),
        )
        data = reports.report_review(project=self.project, f=self.filters(), now=now)
        assert data["available"] and data["open_total"] == 1
        assert {b["bucket"]: b["items"] for b in data["open_by_age"]}["15m_1h"] == 1
        assert data["decided"] == 4
        # nearest rank over log-scale buckets: within 4.4 % of the exact 2 h and 4 h
        assert abs(data["median_seconds"] - 2 * 3600) <= 0.044 * 2 * 3600
        assert abs(data["p90_seconds"] - 4 * 3600) <= 0.044 * 4 * 3600
        assert data["median_seconds"] < data["p90_seconds"]
        assert {d["resolution"]: d["items"] for d in data["decisions"]} == {
            "mark_applied": 2,
            "reject": 2,
        }


class ReportPagesTests(ReportFixture):
    PAGES = ["", "reasons/", "tools/", "agents/", "reliability/", "review/"]

    def url(self, page="", **params):
        from urllib.parse import urlencode

        base = f"/p/acme/reports/{page}"
        return base + ("?" + urlencode(params) if params else "")

    def test_it_shows_every_page_to_managers_and_operators(self):
        for user in (self.maria, self.alice):
            self.client.force_login(user)
            for page in self.PAGES:
                response = self.client.get(self.url(page, since="2026-03-02", until="2026-03-08"))
                assert response.status_code == 200, (user, page, response.status_code)
                assert b'role="img"' in response.content or page == "review/"
                assert b'id="report-charts"' in response.content or page == "review/"

    def test_it_forbids_viewers_and_hides_other_projects(self):
        self.client.force_login(self.victor)
        assert self.client.get(self.url()).status_code == 403
        self.client.force_login(self.olga)
        assert self.client.get(self.url()).status_code == 404
        self.client.logout()
        assert self.client.get(self.url()).status_code == 302

    def test_it_reverses_the_navigation_name(self):
        from django.urls import reverse

        assert reverse("callgate:reports", args=["acme"]) == "/p/acme/reports/"

    def test_it_answers_400_naming_the_bad_filter(self):
        self.client.force_login(self.maria)
        response = self.client.get(self.url(granularity="minute"))
        assert response.status_code == 400
        assert b"granularity" in response.content

    def test_its_last_hour_is_the_previous_whole_hour_and_this_one_just_after_the_hour(self):
        self.client.force_login(self.maria)
        hour = T0 + timedelta(days=2, hours=10)
        with mock.patch("django.utils.timezone.now", return_value=hour + timedelta(minutes=2)):
            presets = self.client.get(self.url()).context["presets"]
            chip = next(p for p in presets if p["label"] == "1 h")
            response = self.client.get(self.url() + chip["url"])
            rows = list(
                csv.reader(
                    io.StringIO(
                        self.client.get(
                            self.url("reasons/") + chip["url"] + "&format=csv&table=reasons"
                        ).content.decode()
                    )
                )
            )
        f = response.context["f"]
        assert (f.since, f.until, f.granularity) == (
            hour - timedelta(hours=1),
            hour + timedelta(hours=1),
            "hour",
        )
        assert [p["label"] for p in response.context["presets"] if p["current"]] == ["1 h"]
        assert b"the previous whole hour and this one so far" in response.content
        # at 10:02 the report counts the calls since 09:00, not those of two minutes
        previous_hour = ToolCall.objects.filter(
            project=self.project, created_at__gte=f.since, created_at__lt=hour
        ).count()
        assert previous_hour > 0
        assert rows[-1][0] == "Total"
        assert (
            int(rows[-1][2])
            == ToolCall.objects.filter(
                project=self.project, created_at__gte=f.since, created_at__lt=f.until
            ).count()
        )

    def test_it_exports_each_table_as_csv_with_the_page_numbers(self):
        self.client.force_login(self.maria)
        response = self.client.get(
            self.url(
                "reasons/", since="2026-03-02", until="2026-03-08", format="csv", table="reasons"
            )
        )
        assert response.status_code == 200
        assert response["Content-Type"].startswith("text/csv")
        assert "attachment" in response["Content-Disposition"]
        rows = list(csv.reader(io.StringIO(response.content.decode())))
        assert rows[0][:3] == ["Reason", "Category", "Calls"]
        by_reason = {r[0]: int(r[2]) for r in rows[1:-1]}
        f = self.filters()
        assert (
            by_reason[labels.label("ok", "reason")]
            == ToolCall.objects.filter(
                project=self.project, reason="ok", created_at__gte=f.since, created_at__lt=f.until
            ).count()
        )
        assert rows[-1][0] == "Total"
        for page, name in [
            ("", "categories"),
            ("", "routes"),
            ("tools/", "tools"),
            ("tools/", "contracts"),
            ("agents/", "agents"),
            ("reliability/", "retries"),
            ("reliability/", "attempts"),
            ("reliability/", "unknown_outcomes"),
            ("reliability/", "duplicates"),
        ]:
            response = self.client.get(
                self.url(page, format="csv", table=name, since="2026-03-02", until="2026-03-08")
            )
            assert response.status_code == 200, (page, name)
        assert self.client.get(self.url(format="csv", table="nope")).status_code == 404

    def test_it_links_counts_to_exactly_those_calls(self):
        self.client.force_login(self.maria)
        response = self.client.get(
            self.url(
                since="2026-03-02", until="2026-03-08", tool="get_weather", agent=self.agent.pk
            )
        )
        content = response.content.decode()
        assert "/p/acme/calls/?" in content
        link = next(
            c
            for card in response.context["cards"]
            for row in card["table"]["rows"]
            for c in row
            if c.get("href") and "category=argument_error" in c["href"]
        )
        q = {k: v[0] for k, v in parse_qs(urlparse(link["href"]).query).items()}
        assert q["tool"] == "get_weather" and q["agent"] == str(self.agent.pk)
        since = datetime.fromisoformat(q["since"].replace("Z", "+00:00"))
        until = datetime.fromisoformat(q["until"].replace("Z", "+00:00"))
        assert until - since == timedelta(days=1)
        assert (
            int(link["text"].replace(",", ""))
            == ToolCall.objects.filter(
                project=self.project,
                tool_name="get_weather",
                agent=self.agent,
                category="argument_error",
                created_at__gte=since,
                created_at__lt=until,
            ).count()
        )

    def test_it_keeps_filters_in_the_subnavigation_and_csv_links(self):
        self.client.force_login(self.maria)
        response = self.client.get(
            self.url(since="2026-03-02", until="2026-03-08", tool="get_weather")
        )
        sections = response.context["sections"]
        assert all("tool=get_weather" in s["url"] for s in sections)
        assert "tool=get_weather" in response.context["cards"][0]["table"]["csv"]

    def test_it_shows_an_empty_state(self):
        self.client.force_login(self.maria)
        response = self.client.get(self.url(since="2020-01-01", until="2020-01-05"))
        assert response.status_code == 200
        assert b"No calls in this range." in response.content


class ReportApiTests(ReportFixture):
    def test_it_serves_every_report_as_json_for_the_keys_project(self):
        for name in [
            "categories",
            "reasons",
            "tools",
            "agents",
            "routes",
            "duplicates",
            "retries",
            "unknown-outcomes",
            "contracts",
            "review",
        ]:
            response = self.api().get(
                f"/api/v1/reports/{name}", {"since": "2026-03-02", "until": "2026-03-08"}
            )
            assert response.status_code == 200, (name, response.content)
            assert response.json()["filters"]["since"] == "2026-03-02T00:00:00Z"
        body = (
            self.api()
            .get("/api/v1/reports/categories", {"since": "2026-03-02", "until": "2026-03-08"})
            .json()
        )
        assert (
            body["total"]
            == ToolCall.objects.filter(
                project=self.project, created_at__gte=T0, created_at__lt=T0 + timedelta(days=7)
            ).count()
        )
        other = (
            self.api(self.other_key)
            .get("/api/v1/reports/categories", {"since": "2026-03-02", "until": "2026-03-08"})
            .json()
        )
        assert other["total"] == ToolCall.objects.filter(project=self.other_project).count()

    def test_it_answers_400_naming_the_field(self):
        response = self.api().get("/api/v1/reports/tools", {"granularity": "fortnight"})
        assert response.status_code == 400
        assert response.json()["errors"][0]["loc"] == "granularity"
        response = self.api().get("/api/v1/reports/agents", {"agent": str(self.other_agent.pk)})
        assert response.status_code == 400 and response.json()["errors"][0]["loc"] == "agent"

    def test_it_needs_an_api_key(self):
        from rest_framework.test import APIClient

        assert APIClient().get("/api/v1/reports/categories").status_code in (401, 403)
        self.client.force_login(self.maria)
        assert self.client.get("/api/v1/reports/categories").status_code in (401, 403)

    def test_it_is_documented_in_the_openapi_document(self):
        self.client.force_login(self.maria)
        from drf_spectacular.generators import SchemaGenerator

        schema = SchemaGenerator().get_schema(request=None, public=True)
        op = schema["paths"]["/api/v1/reports/categories"]["get"]
        assert {p["name"] for p in op["parameters"]} >= {
            "since",
            "until",
            "granularity",
            "tool",
            "agent",
        }
        assert "200" in op["responses"] and "400" in op["responses"]
        assert "/api/v1/reports/unknown-outcomes" in schema["paths"]


class ReportFindingsTests(ReportFixture):
    """Testers' findings: extreme dates and NUL characters, review health without human
    decisions, plurals, and how fresh the rollups are."""

    BAD_MOMENTS = [
        ({"until": "9999-12-31"}, "until"),
        ({"until": "0001-01-01"}, "until"),
        ({"since": "0001-01-01"}, "since"),
        ({"since": "0001-01-01T00:00:00+01:00"}, "since"),
        ({"until": "9999-12-31T23:59:59-01:00"}, "until"),
        ({"since": "9999-12-30", "until": "9999-12-31"}, "until"),
        ({"since": "9999-12-30", "until": "2026-03-02"}, "since"),
        ({"since": "1969-12-31T23:00:00Z"}, "since"),
    ]
    NUL_VALUES = [
        ({"tool": "\x00"}, "tool"),
        ({"agent": "1\x00"}, "agent"),
        ({"since": "2026-03-02\x00"}, "since"),
        ({"until": "\x00"}, "until"),
        ({"granularity": "day\x00"}, "granularity"),
    ]

    def test_it_refuses_moments_outside_the_supported_years_naming_the_field(self):
        for params, field in self.BAD_MOMENTS + self.NUL_VALUES:
            try:
                reports.report_filters_parse(params, project=self.project)
            except reports.ReportFilterError as exc:
                assert exc.field == field, (params, exc)
            else:
                raise AssertionError(f"no error for {params}")
        # the edges of the window still work
        f = reports.report_filters_parse(
            {"since": "1970-01-01", "until": "1970-01-03"}, project=self.project
        )
        assert f.since == datetime(1970, 1, 1, tzinfo=UTC)
        f = reports.report_filters_parse({"until": "9000-06-01"}, project=self.project)
        assert f.until == datetime(9000, 6, 2, tzinfo=UTC)

    def test_it_answers_400_for_extreme_dates_and_nul_in_the_api(self):
        for params, field in self.BAD_MOMENTS:
            response = self.api().get("/api/v1/reports/categories", params)
            assert response.status_code == 400, (params, response.status_code)
            assert response.json()["errors"][0]["loc"] == field, (params, response.json())
        for params, _ in self.NUL_VALUES:  # a site-wide check may answer before the report does
            assert self.api().get("/api/v1/reports/categories", params).status_code == 400, params

    def test_it_answers_400_for_extreme_dates_and_nul_on_the_pages(self):
        self.client.force_login(self.maria)
        for page in ("", "reliability/", "review/"):
            for params, field in self.BAD_MOMENTS:
                response = self.client.get(f"/p/acme/reports/{page}", params)
                assert response.status_code == 400, (page, params, response.status_code)
                assert f"Filter <strong>{field}</strong>" in response.content.decode(), (
                    page,
                    params,
                )
            for params, _ in self.NUL_VALUES:
                assert self.client.get(f"/p/acme/reports/{page}", params).status_code == 400, (
                    page,
                    params,
                )

    def test_it_shows_a_dash_for_time_to_decision_without_human_decisions(self):
        now = T0 + timedelta(days=3)
        for status, call in zip(
            ("settled", "expired"), self.direct(reason="outcome_unknown")[:2], strict=True
        ):
            make_review_item(
                call,
                status=status,
                resolution=status,
                created_at=now,
                resolved_at=now,
            )
        data = reports.report_review(project=self.project, f=self.filters(), now=now)
        assert data["decided"] == 2 and data["human_decided"] == 0
        assert data["median_seconds"] is None and data["p90_seconds"] is None
        self.client.force_login(self.maria)
        response = self.client.get(
            "/p/acme/reports/review/", {"since": "2026-03-02", "until": "2026-03-08"}
        )
        tiles = {t["label"]: t for t in response.context["cards"][0]["tiles"]}
        assert tiles["time to decision, median"]["value"] == "—"
        assert tiles["time to decision, p90"]["value"] == "—"
        assert "0 s" not in response.content.decode()
        assert "over 0 human decisions" in response.content.decode()

    def test_it_says_one_call_not_one_calls(self):
        start = datetime(2025, 6, 2, 10, tzinfo=UTC)
        make_call(
            project=self.project, agent=self.agent, created_at=start, reason=Reason.OK, attempts=2
        )
        rollups_rebuild(project_id=self.project.pk)
        self.client.force_login(self.maria)
        for page in ("", "reliability/", "review/"):
            response = self.client.get(
                f"/p/acme/reports/{page}", {"since": "2025-06-02", "until": "2025-06-02"}
            )
            assert response.status_code == 200
            content = response.content.decode()
            assert "1 calls" not in content, page
        response = self.client.get(
            "/p/acme/reports/reliability/", {"since": "2025-06-02", "until": "2025-06-02"}
        )
        tiles = {t["label"]: t for t in response.context["cards"][0]["tiles"]}
        assert tiles["call needed a retry"]["value"] == "1"
        assert tiles["succeeded later"]["note"] == "1 call"

    def test_it_shows_when_the_rollups_were_last_refreshed(self):
        from django.core.cache import cache

        from callgate.reports import rollups

        self.client.force_login(self.maria)
        cache.delete(rollups.WATERMARK_KEY)
        cache.delete(rollups.REBUILT_KEY)
        response = self.client.get("/p/acme/reports/")
        assert "data as of unknown" in response.content.decode()
        from django.utils import timezone

        moment = timezone.now().replace(hour=0, minute=7, second=31, microsecond=0)
        rollups.rollups_refresh_changed(now=moment)
        for page in ("", "reasons/", "tools/", "agents/", "reliability/", "review/"):
            response = self.client.get(f"/p/acme/reports/{page}")
            content = response.content.decode()
            assert (
                # UTC, as everything in the reports
                f'data as of <time datetime="{reports.iso(moment)}">00:07 UTC</time>' in content
            ), page
        # a full rebuild counts as a refresh too (compared with the clock, not with the
        # moment above: from 00:00 to 00:07 UTC that moment is still to come)
        before_rebuild = timezone.now()
        rollups_rebuild()
        assert rollups.rollups_as_of() >= before_rebuild
        cache.delete(rollups.WATERMARK_KEY)
        assert rollups.rollups_as_of() is not None
