"""Whole model turns (TAXONOMY v2) through the REST API: ``turn`` events in
``POST /api/v1/events``, the gate ``POST /api/v1/calls`` with ``turn``, multi-call envelopes
sent as one call, loops, sticky refusals and approval_granted."""

from __future__ import annotations

from unittest import skipUnless

from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from callgate.ingest import tools_cache_forget
from callgate.models import CallEvent, RequestBudget, ToolCall
from tests.factories import FOLLOW_UP, WEATHER, BaseTestCase, make_event

TWO_CALLS = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        },
        {
            "id": "call_b",
            "type": "function",
            "function": {"name": "create_follow_up", "arguments": '{"ticket_id": "T-1"}'},
        },
    ],
}


class TurnTests(BaseTestCase):
    def setUp(self):
        self.client_api = self.api()
        for name, body in (("get_weather", WEATHER), ("create_follow_up", FOLLOW_UP)):
            assert self.client_api.put(
                f"/api/v1/tools/{name}", body, format="json"
            ).status_code in (
                200,
                201,
            )

    def gate(self, body: dict):
        return self.client_api.post("/api/v1/calls", body, format="json")

    def test_the_gate_answers_one_verdict_per_call_of_a_turn_in_order(self):
        response = self.gate({"format": "openai", "turn": TWO_CALLS, "request_id": "r1"})
        assert response.status_code == 200, response.json()
        calls = response.json()["calls"]
        assert [c["call_id"] for c in calls] == ["call_a", "call_b"]
        assert [c["verdict"] for c in calls] == ["allow", "allow"]
        assert len({c["operation_id"] for c in calls}) == 2
        # sent again: the same operations, nothing added
        again = self.gate({"format": "openai", "turn": TWO_CALLS, "request_id": "r1"}).json()
        assert [c["operation_id"] for c in again["calls"]] == [c["operation_id"] for c in calls]
        assert ToolCall.objects.filter(project=self.project).count() == 2

    def test_attempts_name_their_call_of_a_turn_by_call_id(self):
        turn = make_event("turn", format="openai", response=TWO_CALLS, request_id="r2")
        assert self.client_api.post("/api/v1/events", turn, format="json").status_code == 200
        attempt = make_event(
            "attempt", request_id="r2", call_id="call_b", sent=True, outcome="timeout"
        )
        assert self.client_api.post("/api/v1/events", attempt, format="json").status_code == 200
        found = self.client_api.get(f"/api/v1/events/{turn['event_id']}").json()
        assert found["kind"] == "turn" and len(found["calls"]) == 2
        b = ToolCall.objects.get(project=self.project, call_id="call_b")
        assert b.reason == "outcome_unknown" and b.state == "reconciling"
        assert ToolCall.objects.get(project=self.project, call_id="call_a").state == "allowed"

    def test_a_multi_call_envelope_sent_as_one_call_is_refused_naming_the_field(self):
        response = self.gate({"format": "openai", "call": TWO_CALLS, "request_id": "r3"})
        assert response.status_code == 400
        assert response.json()["errors"][0]["loc"] == "call"
        assert "turn" in response.json()["error"]
        event = make_event("proposed", format="openai", call=TWO_CALLS, request_id="r3")
        batch = self.client_api.post("/api/v1/events", [event], format="json")
        assert batch.status_code == 207
        result = batch.json()["results"][0]
        assert result["status"] == "rejected" and result["errors"][0]["loc"].endswith("call")
        assert not ToolCall.objects.filter(project=self.project).exists()

    def test_a_turn_in_a_format_without_turns_or_without_calls_is_a_400(self):
        assert self.gate({"format": "mcp", "turn": {}}).status_code == 400
        response = self.gate({"format": "openai", "turn": {"role": "assistant", "content": "hi"}})
        assert response.status_code == 400 and "no tool call" in response.json()["error"]
        both = self.gate({"format": "openai", "turn": TWO_CALLS, "call": TWO_CALLS})
        assert both.status_code == 400

    def test_provider_executed_tools_are_recorded_and_never_gated(self):
        response = {
            "role": "assistant",
            "content": [
                {
                    "type": "server_tool_use",
                    "id": "srv_1",
                    "name": "web_search",
                    "input": {"q": "x"},
                },
                {
                    "type": "web_search_tool_result",
                    "tool_use_id": "srv_1",
                    "content": {
                        "type": "web_search_tool_result_error",
                        "error_code": "too_many_requests",
                    },
                },
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
            ],
        }
        calls = self.gate({"format": "anthropic", "turn": response, "request_id": "r4"}).json()[
            "calls"
        ]
        assert [c["executed_by"] for c in calls] == ["provider", "client"]
        assert calls[0]["reason"] == "rate_limited" and calls[1]["verdict"] == "allow"

    @skipUnless(
        connection.vendor == "postgresql", "SQLite splits bulk inserts by its 999-parameter limit"
    )
    @override_settings(CALLGATE_INBOX_PROBE_MS=0)  # each request probes the inbox once
    def test_a_turn_is_applied_in_a_fixed_number_of_queries(self):
        def turn(n: int, request: str) -> dict:
            calls = [
                {
                    "id": f"c{i}",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": f'{{"city": "C{i}"}}'},
                }
                for i in range(n)
            ]
            return make_event(
                "turn", format="openai", response={"tool_calls": calls}, request_id=request
            )

        warm = self.client_api.post("/api/v1/events", turn(1, "q0"), format="json")
        assert warm.status_code == 200  # the key is known from now on
        tools_cache_forget(self.project.pk)  # each turn reads the contracts once
        with CaptureQueriesContext(connection) as small:
            assert (
                self.client_api.post("/api/v1/events", turn(2, "q1"), format="json").status_code
                == 200
            )
        tools_cache_forget(self.project.pk)
        with CaptureQueriesContext(connection) as large:
            assert (
                self.client_api.post("/api/v1/events", turn(40, "q2"), format="json").status_code
                == 200
            )
        assert len(large) == len(small)
        assert CallEvent.objects.filter(project=self.project).count() == 1 + 2 + 40


class RequestRuleTests(BaseTestCase):
    def setUp(self):
        self.client_api = self.api()
        self.client_api.put(
            "/api/v1/tools/pay",
            {
                **FOLLOW_UP,
                "volatile_arguments": ["/nonce"],
                "max_identical": 2,
                "parameters": {
                    "type": "object",
                    "properties": {"ticket_id": {"type": "string"}, "nonce": {"type": "string"}},
                    "required": ["ticket_id"],
                },
            },
            format="json",
        )

    def propose(self, nonce: str, request_id: str = "r1") -> dict:
        return self.client_api.post(
            "/api/v1/calls",
            {
                "format": "plain",
                "call": {"tool": "pay", "arguments": {"ticket_id": "T-1", "nonce": nonce}},
                "request_id": request_id,
            },
            format="json",
        ).json()

    def test_volatile_arguments_leave_the_operation_id_and_count_towards_the_loop(self):
        first, second, third = self.propose("a"), self.propose("b"), self.propose("c")
        assert first["operation_id"] == second["operation_id"] == third["operation_id"]
        assert third["reason"] == "loop_detected" and third["route"] == "stop"
        assert "again" not in third["observation"].split("Stop")[-1]
        # the stored call is untouched by the refusal
        assert ToolCall.objects.get(operation_id=first["operation_id"]).reason == ""
        assert self.propose("d", request_id="r2")["verdict"] == "allow"  # per request

    def test_the_reasons_report_counts_refused_proposals_beside_the_calls(self):
        from callgate.reports.selectors import report_filters_parse, report_reasons

        for nonce in "abcd":
            self.propose(nonce)
        data = report_reasons(
            project=self.project, f=report_filters_parse({}, project=self.project)
        )
        loops = [r for r in data["rows"] if r["reason"] == "loop_detected"]
        assert loops and loops[0]["refused"] == 2 and loops[0]["calls"] == 0
        assert data["refused_total"] == 2

    def test_a_denial_sticks_to_the_tool_and_arguments_within_the_request(self):
        first = self.propose("a")
        self.client_api.post(
            "/api/v1/events",
            make_event("denied", operation_id=first["operation_id"], reason="no"),
            format="json",
        )
        again = self.propose("b")
        assert again["reason"] == "permission_denied" and again["verdict"] == "deny"
        row = RequestBudget.objects.get(project=self.project, request_id="r1", tool_name="pay")
        assert list(row.refusals.values())[0]["reason"] == "permission_denied"

    def test_the_contract_refuses_a_volatile_argument_that_is_not_a_json_pointer(self):
        response = self.client_api.put(
            "/api/v1/tools/bad",
            {**WEATHER, "volatile_arguments": ["nonce"]},
            format="json",
        )
        assert response.status_code == 400
        assert "volatile_arguments" in response.json()["errors"][0]["loc"]


class ApprovalGrantedTests(BaseTestCase):
    def test_an_approved_call_waiting_for_its_attempt_is_approval_granted(self):
        from callgate.auth import api_key_issue

        api = self.api(api_key_issue(agent=self.agent, can_decide=True).plain)
        api.put("/api/v1/tools/pay", {**FOLLOW_UP, "requires_approval": True}, format="json")
        answer = api.post(
            "/api/v1/calls",
            {
                "format": "plain",
                "call": {"tool": "pay", "arguments": {"ticket_id": "T-9"}},
                "request_id": "r",
            },
            format="json",
        ).json()
        assert answer["verdict"] == "pending_approval"
        op = answer["operation_id"]
        api.post(
            "/api/v1/events",
            make_event("decision", operation_id=op, decision="approve"),
            format="json",
        )
        stored = api.get(f"/api/v1/calls/{op}").json()
        assert (stored["reason"], stored["category"], stored["route"], stored["verdict"]) == (
            "approval_granted",
            "approval",
            "proceed",
            "allow",
        )
        again = api.post(
            "/api/v1/calls",
            {
                "format": "plain",
                "call": {"tool": "pay", "arguments": {"ticket_id": "T-9"}},
                "request_id": "r",
            },
            format="json",
        ).json()
        assert again["reason"] == "approval_granted"  # not a second approval request
        api.post(
            "/api/v1/events",
            make_event("attempt", operation_id=op, sent=True, outcome="success", result={"ok": 1}),
            format="json",
        )
        assert api.get(f"/api/v1/calls/{op}").json()["reason"] == "ok"
