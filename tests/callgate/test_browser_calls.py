"""The calls list and call detail in a real browser (Chromium via Playwright), light and
dark: rows render with badges, the keyboard opens a call, the 5 s poll brings new rows in
highlighted without losing the selection, and no CSP or script errors. Screenshots go to
``test-artifacts/`` for a human to look at."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.utils import timezone
from rest_framework.test import APIClient

from callgate.auth import api_key_issue
from callgate.models import CallEvent, ToolCall, ToolContract
from callgate.reports import rollups
from callgate.taxonomy import TABLE, Reason
from tests.browser_support import BrowserTestCase
from tests.factories import FOLLOW_UP, WEATHER, make_event

#: every reason once, then mostly ok: what a day of a busy agent looks like
REASONS = [r.value for r in Reason] + ["ok"] * 25 + ["empty_result"] * 4


def seed(project, agent, n: int = 60) -> list[ToolCall]:
    """``n`` calls of mixed reasons over the last hours, each with a proposed and an
    attempt event; newest first."""
    contract = ToolContract.objects.create(
        project=project,
        name="create_follow_up",
        version=2,
        digest=uuid.uuid4().hex,
        effect="write",
        idempotent=True,
        reconcile_method="http",
        lint_score=72,
        lint_findings=[{"path": "properties.assignee_id", "message": "has no description"}],
        parameters={
            "type": "object",
            "properties": {"ticket_id": {"type": "string"}, "card": {"type": "string"}},
        },
    )
    now = timezone.now()
    calls = []
    for i in range(n):
        reason = REASONS[i % len(REASONS)]
        category, route = TABLE[Reason(reason)]
        created = now - timedelta(minutes=7 * i + 1)
        call = ToolCall.objects.create(
            project=project,
            agent=agent,
            operation_id=f"{i:04d}" + uuid.uuid4().hex[:20],
            tool_name=contract.name,
            contract=contract,
            arguments={"ticket_id": f"T-{1000 + i}", "card": "•••"},
            state="succeeded" if category.value in ("ok", "empty_result") else "in_review",
            reason=reason,
            category=category.value,
            route=route.value,
            attempts=1 + i % 3,
            observation=""
            if category.value == "ok"
            else f"{reason}: check the ticket before retrying.",
            created_at=created,
            updated_at=created,
        )
        CallEvent.objects.create(
            project=project,
            call=call,
            kind="proposed",
            body={"format": "anthropic"},
            occurred_at=created,
            received_at=created,
            state_after="allowed",
        )
        CallEvent.objects.create(
            project=project,
            call=call,
            kind="attempt",
            occurred_at=created,
            received_at=created + timedelta(seconds=2),
            body={
                "attempt": 1,
                "sent": True,
                "outcome": "success" if category.value == "ok" else "timeout",
            },
            reason=reason,
            category=category.value,
            route=route.value,
            state_before="allowed",
            state_after=call.state,
        )
        calls.append(call)
    rollups.rollups_rebuild(project_id=project.pk)  # what the refresh does within a minute
    return calls


class CallsBrowserTests(BrowserTestCase):
    def test_it_opens_a_call_from_the_list_with_the_keyboard(self):
        calls = seed(self.project, self.agent)
        self.login("alice", next_path="/p/acme/calls/")
        assert self.page.locator("#call-rows tr[data-row]").count() == 50
        assert self.page.locator("#call-rows .badge").first.is_visible()
        self.screenshot("calls-list-light", full_page=False)

        self.page.keyboard.press("j")
        self.page.keyboard.press("j")
        assert self.page.locator(f"#call-{calls[1].pk}").get_attribute("aria-selected") == "true"
        with self.page.expect_navigation(wait_until="load"):
            self.page.keyboard.press("Enter")
        assert self.page.url.endswith(f"/p/acme/calls/{calls[1].operation_id}/")
        self.page.get_by_role("heading", name="Timeline").wait_for()
        assert self.page.locator("pre.json .redacted").count() == 1
        self.screenshot("call-detail-light")
        self.assert_no_console_errors()

    def test_it_brings_new_rows_in_and_keeps_the_selection(self):
        calls = seed(self.project, self.agent, n=10)
        self.login("alice", next_path="/p/acme/calls/?since=24h")
        self.page.locator(f"#call-{calls[2].pk}").click()
        new = ToolCall.objects.create(
            project=self.project,
            agent=self.agent,
            operation_id="fresh-" + uuid.uuid4().hex,
            tool_name="get_weather",
            state="retry_wait",
            reason="rate_limited",
            category="transient",
            route="retry",
            attempts=1,
        )
        self.page.locator(f"#call-{new.pk}.new").wait_for(timeout=12_000)
        assert self.page.locator(f"#call-{calls[2].pk}").get_attribute("aria-selected") == "true"
        assert self.page.locator(f"#call-{calls[0].pk}").get_attribute("class") in (None, "")
        self.assert_no_console_errors()

    def test_it_filters_from_the_bar_and_clears_in_one_click(self):
        seed(self.project, self.agent)
        self.login("alice", next_path="/p/acme/calls/")
        self.page.select_option("select[name=category]", "transient")
        self.page.wait_for_url("**category=transient**")
        self.page.locator(".chips .chip").first.wait_for()
        # the badges read as labels; the slugs are in their tooltips
        badges = self.page.locator("#call-rows .badge")
        titles = [t.split(" · ")[0] for t in (badges.evaluate_all("els => els.map(e => e.title)"))]
        assert titles and set(titles) <= {
            "rate_limited",
            "unavailable",
            "circuit_open",
            "read_failure",
        }
        assert set(badges.all_inner_texts()) <= {
            "Rate limited",
            "Target unavailable",
            "Circuit open",
            "Read failed",
        }
        self.page.get_by_label("Clear the category filter").click()
        self.page.wait_for_url(lambda url: "category=" not in url)
        assert self.page.locator("#call-rows tr[data-row]").count() == 50
        self.assert_no_console_errors()

    def test_it_reads_well_in_dark_mode(self):
        calls = seed(self.project, self.agent)
        self.context.close()
        self.context = self.browser.new_context(
            viewport=dict(self.viewport), color_scheme="dark", locale="en-GB", timezone_id="UTC"
        )
        self.page = self.context.new_page()
        self.page.on("console", self._on_console)
        self.login("alice", next_path="/p/acme/calls/")
        background = self.page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(15, 18, 22)"
        self.screenshot("calls-list-dark", full_page=False)
        self.visit(f"/p/acme/calls/{calls[0].operation_id}/")
        self.screenshot("call-detail-dark")
        self.assert_no_console_errors()


class CauseBrowserTests(BrowserTestCase):
    """The call detail shows the cause that was read and a partial failure's failed items,
    from events that went through the real ingest path."""

    def _ingest(self, events: list[dict]) -> str:
        from callgate import services
        from callgate.ingest import events_apply
        from callgate.schemas import EVENT_ADAPTER, ContractIn

        services.contract_register(
            agent=self.agent,
            name="upsert_contacts",
            payload=ContractIn.model_validate(
                {
                    "effect": "write",
                    "parameters": {
                        "type": "object",
                        "properties": {"contacts": {"type": "array"}},
                        "required": ["contacts"],
                    },
                }
            ),
        )
        now = timezone.now().isoformat()
        parsed = [
            EVENT_ADAPTER.validate_python(
                {"event_id": str(uuid.uuid4()), "occurred_at": now, "request_id": "r-1", **e}
            )
            for e in events
        ]
        events_apply(project=self.project, agent=self.agent, events=parsed[:1])
        call = ToolCall.objects.get(project=self.project, request_id="r-1")
        for event in parsed[1:]:
            event.operation_id = call.operation_id
            events_apply(project=self.project, agent=self.agent, events=[event])
        return call.operation_id

    def test_it_shows_the_cause_read_and_the_failed_items(self):
        failures = [
            {"email": "cy@example.com", "error": "address bounced"},
            {"email": "dee@example.com", "error": "opted out of marketing"},
        ]
        operation_id = self._ingest(
            [
                {
                    "type": "proposed",
                    "format": "plain",
                    "call": {"tool": "upsert_contacts", "arguments": {"contacts": [1, 2, 3, 4]}},
                },
                {
                    "type": "attempt",
                    "sent": True,
                    "outcome": "success",
                    "http_status": 200,
                    "result": {
                        "succeeded": ["ana@example.com", "bo@example.com"],
                        "failed": failures,
                    },
                },
            ]
        )
        self.login("alice", next_path=f"/p/acme/calls/{operation_id}/")
        card = self.page.locator("#cause")
        card.get_by_role("heading", name="Cause read").wait_for()
        assert "2 failed item(s) beside successes" in card.inner_text()
        rows = card.locator("table.failed-items tbody tr").all_inner_texts()
        assert [r.split("\t")[0] for r in rows] == ["cy@example.com", "dee@example.com"]
        assert "opted out" in rows[1]
        timeline = self.page.locator("ol.timeline").inner_text()
        assert "Cause read:" in timeline and "cy@example.com" in timeline
        self.screenshot("call-detail-partial-failure")
        self.assert_no_console_errors()


class TurnBrowserTests(BrowserTestCase):
    def test_the_call_detail_shows_its_turn_and_the_list_filters_by_v2_reasons(self):
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_issue(agent=self.agent).plain}")
        for name, body in (("get_weather", WEATHER), ("create_follow_up", FOLLOW_UP)):
            api.put(f"/api/v1/tools/{name}", body, format="json")
        write = {"ticket_id": "T-7"}
        response = {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "On it."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Rome"},
                },
                {"type": "tool_use", "id": "toolu_2", "name": "create_follow_up", "input": write},
                {"type": "tool_use", "id": "toolu_3", "name": "create_follow_up", "input": write},
            ],
        }
        turn = make_event("turn", format="anthropic", response=response, request_id="req-t")
        assert api.post("/api/v1/events", turn, format="json").status_code == 200
        first = ToolCall.objects.get(
            project=self.project, tool_name="get_weather", arguments__city="Oslo"
        )
        self.login("alice", next_path=f"/p/acme/calls/{first.operation_id}/")
        section = self.page.locator("#turn")
        section.wait_for()
        assert section.locator("tbody tr").count() == 4
        text = section.inner_text()
        assert Reason.DUPLICATE_CALL_ID.label in text and Reason.DUPLICATE_IN_FLIGHT.label in text
        assert "allowed" not in text  # labels, never raw codes
        assert section.locator("tr[aria-current=true]").count() == 1
        self.screenshot("call-detail-turn")
        self.visit("/p/acme/calls/")
        self.page.select_option("select[name=reason]", "duplicate_in_flight")
        self.page.wait_for_url("**reason=duplicate_in_flight**")
        self.page.locator(".chips .chip").first.wait_for()
        assert set(self.page.locator("#call-rows .badge").all_inner_texts()) == {
            Reason.DUPLICATE_IN_FLIGHT.label
        }
        self.screenshot("calls-filter-duplicate-in-flight", full_page=False)
        self.assert_no_console_errors()
