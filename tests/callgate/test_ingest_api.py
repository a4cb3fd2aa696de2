"""POST /api/v1/events, GET /api/v1/events/{id}, POST /api/v1/calls, GET /api/v1/calls/{id},
PUT /api/v1/tools/{name}. Celery is eager here, so ``POST /events`` drains the inbox before it
answers; ``tests/callgate/test_inbox.py`` covers the inbox on its own."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from unittest import mock, skipUnless

from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from callgate.auth import api_key_issue
from callgate.ingest import tools_cache_forget
from callgate.models import Agent, CallEvent, InboxEvent, ToolCall, ToolContract
from callgate_sdk.wire import derive_operation_id
from reviews.models import ReviewItem
from tests.factories import FOLLOW_UP, WEATHER, BaseTestCase, make_event, proposal


class IngestTests(BaseTestCase):
    def setUp(self):
        self.client_api = self.api()
        assert (
            self.client_api.put("/api/v1/tools/get_weather", WEATHER, format="json").status_code
            == 201
        )
        assert (
            self.client_api.put(
                "/api/v1/tools/create_follow_up", FOLLOW_UP, format="json"
            ).status_code
            == 201
        )

    def post(self, body, **kwargs):
        return self.client_api.post("/api/v1/events", body, format="json", **kwargs)

    def status_of(self, event: dict) -> dict:
        response = self.client_api.get(f"/api/v1/events/{event['event_id']}")
        assert response.status_code == 200, response.content
        return response.json()

    def test_it_accepts_a_single_event_and_answers_the_verdict_on_the_event(self):
        event = proposal("get_weather", {"city": "Oslo"}, request_id="r1")
        response = self.post(event)
        assert response.status_code == 200
        result = response.json()["results"][0]
        assert result == {
            "index": 0,
            "event_id": event["event_id"],
            "status": "accepted",
            "errors": [],
        }
        found = self.status_of(event)
        assert found["status"] == "applied" and found["kind"] == "proposed"
        assert found["answer"]["verdict"] == "allow"
        assert found["answer"]["operation_id"].startswith("op_")

    def test_it_answers_400_for_an_event_id_that_is_not_a_uuid_and_404_for_another_projects_event(
        self,
    ):
        response = self.client_api.get("/api/v1/events/not-a-uuid")
        assert response.status_code == 400
        assert response.json()["errors"][0]["loc"] == "event_id"
        event = proposal("get_weather", {"city": "Oslo"}, request_id="r1")
        self.post(event)
        assert (
            self.api(self.other_key).get(f"/api/v1/events/{event['event_id']}").status_code == 404
        )
        assert self.client_api.get(f"/api/v1/events/{uuid.uuid4()}").status_code == 404

    def test_it_stores_a_resent_event_once_and_answers_duplicate(self):
        event = proposal("get_weather", {"city": "Oslo"}, request_id="r1")
        assert self.post(event).json()["results"][0]["status"] == "accepted"
        again = self.post(event).json()
        assert again["results"][0]["status"] == "duplicate"
        assert CallEvent.objects.filter(event_id=event["event_id"]).count() == 1

    def test_it_answers_207_and_keeps_the_good_items_of_a_batch(self):
        good = proposal("get_weather", {"city": "Oslo"}, request_id="r1")
        bad_type = {**proposal("get_weather", {"city": "Rome"}, request_id="r2"), "occurred_at": 12}
        missing_id = proposal("get_weather", {"city": "Bern"}, request_id="r3")
        del missing_id["event_id"]
        unknown_type = make_event("exploded", operation_id="x")
        not_object = "just text"
        response = self.post([good, bad_type, missing_id, unknown_type, not_object])
        assert response.status_code == 207
        body = response.json()
        assert [r["status"] for r in body["results"]] == [
            "accepted",
            "rejected",
            "rejected",
            "rejected",
            "rejected",
        ]
        locs = [r["errors"][0]["loc"] for r in body["results"][1:]]
        assert locs[0] == "events[1].occurred_at"
        assert locs[1] == "events[2].event_id"
        assert locs[2].startswith("events[3]")
        assert locs[3].startswith("events[4]")
        assert CallEvent.objects.filter(event_id=good["event_id"]).exists()
        assert ToolCall.objects.filter(project=self.project).count() == 1

    def test_it_rejects_implausible_event_times_naming_the_field_and_keeps_the_rest(self):
        good = proposal("get_weather", {"city": "Oslo"}, request_id="r1")
        soon = (datetime.now(UTC) + timedelta(hours=23)).isoformat()  # within the skew allowed
        skewed = {**proposal("get_weather", {"city": "Rome"}, request_id="r2"), "occurred_at": soon}
        times = {
            "2126-01-01T00:00:00Z": "in the future",
            "2026-06-15T09:00:00": "RFC 3339",
            "1999-12-31T23:59:59Z": "greater than 2000",
            "1750000000": "RFC 3339",
            "2026-06-15T09:00Z": "RFC 3339",
            "2026-06-15T09:00:00+0100": "RFC 3339",
        }
        bad = [
            {**proposal("get_weather", {"city": "Bern"}, request_id=f"b{i}"), "occurred_at": when}
            for i, when in enumerate(times)
        ]
        response = self.post([good, skewed, *bad])
        assert response.status_code == 207
        results = response.json()["results"]
        assert [r["status"] for r in results] == ["accepted", "accepted"] + ["rejected"] * len(
            times
        )
        for index, (result, words) in enumerate(
            zip(results[2:], times.values(), strict=True), start=2
        ):
            assert result["errors"][0]["loc"] == f"events[{index}].occurred_at"
            assert words in result["errors"][0]["msg"]
        assert not InboxEvent.objects.filter(event_id__in=[e["event_id"] for e in bad]).exists()
        assert not CallEvent.objects.filter(event_id__in=[e["event_id"] for e in bad]).exists()
        assert (
            self.status_of(good)["status"] == "applied"
            and self.status_of(skewed)["status"] == "applied"
        )

    def test_it_rejects_wrong_field_types_with_the_field_path(self):
        event = make_event(
            "attempt", operation_id="op_x", sent="yes", outcome="success", http_status=200
        )
        result = self.post(event).json()["results"][0]
        assert result["status"] == "rejected"
        assert result["errors"][0]["loc"] == "sent"
        # fields named like an event type keep their name in the path
        zeroth = make_event("attempt", operation_id="op_x", sent=True, outcome="success", attempt=0)
        maybe = make_event("decision", operation_id="op_x", decision="maybe")
        results = self.post([zeroth, maybe]).json()["results"]
        assert [r["errors"][0]["loc"] for r in results] == [
            "events[0].attempt",
            "events[1].decision",
        ]

    def test_it_rejects_an_event_for_an_unknown_call_when_applying_without_losing_others(self):
        ok = proposal("get_weather", {"city": "Oslo"}, request_id="r1")
        orphan = make_event(
            "attempt", operation_id="op_nope", sent=True, outcome="success", result={"t": 1}
        )
        response = self.post([ok, orphan])
        assert response.status_code == 200  # both stored; the rules run when they are applied
        found = self.status_of(orphan)
        assert found["status"] == "rejected" and found["answer"] is None
        assert found["errors"][0]["loc"] == "operation_id"
        assert "op_nope" in found["errors"][0]["msg"]
        assert self.status_of(ok)["status"] == "applied"
        assert CallEvent.objects.filter(event_id=ok["event_id"]).exists()
        assert (
            self.post(orphan).json()["results"][0]["status"] == "accepted"
        )  # sent again: tried anew
        assert self.status_of(orphan)["status"] == "rejected"

    def test_it_answers_400_for_a_body_that_is_not_json(self):
        for body in (b"{not json", b'{"type": NaN}', b"\xff\xfe", b""):
            response = self.client_api.generic(
                "POST", "/api/v1/events", body, content_type="application/json"
            )
            assert response.status_code == 400, body
            assert "not valid JSON" in response.json()["error"]

    def test_it_answers_400_for_json_nested_too_deep(self):
        deep = "[" * 5000 + "]" * 5000
        response = self.client_api.generic(
            "POST", "/api/v1/events", deep, content_type="application/json"
        )
        assert response.status_code == 400
        arguments: dict = {"city": "Oslo"}
        for _ in range(100):
            arguments = {"x": arguments}
        response = self.post(proposal("get_weather", arguments, request_id="r1"))
        assert response.status_code == 400
        assert "nested deeper" in response.json()["error"]

    def test_it_keeps_an_event_whose_strings_hold_nul_characters(self):
        body = json.dumps(proposal("get_weather", {"city": "Os\u0000lo"}, request_id="r1"))
        response = self.client_api.generic(
            "POST", "/api/v1/events", body, content_type="application/json"
        )
        assert response.status_code == 200, response.json()
        assert ToolCall.objects.get(project=self.project).arguments == {"city": "Os\ufffdlo"}

    def test_it_keeps_events_whose_strings_hold_unpaired_surrogates(self):
        good = proposal("get_weather", {"city": "Oslo"}, request_id="r1")
        odd = make_event("receipt", operation_id="op_x", result={"emoji": "half"})
        body = json.dumps([good, odd]).replace('"half"', '"\\ud83d and \\udc00"')
        response = self.client_api.generic(
            "POST", "/api/v1/events", body, content_type="application/json"
        )
        assert response.status_code == 200, response.content
        assert self.status_of(good)["status"] == "applied"
        assert (
            self.status_of(odd)["status"] == "rejected"
        )  # no call op_x: refused by the rules, yet stored
        assert InboxEvent.objects.get(event_id=odd["event_id"]).body["result"] == {
            "emoji": "\ufffd and \ufffd"
        }

    def test_a_number_too_large_to_read_refuses_its_item_not_the_batch(self):
        good = proposal("get_weather", {"city": "Oslo"}, request_id="r1")
        huge_float = make_event(
            "attempt", operation_id="op", sent=True, outcome="success", result=[7]
        )
        long_int = make_event(
            "attempt", operation_id="op", sent=True, outcome="success", result={"n": 8}
        )
        body = (
            json.dumps([good, huge_float, long_int])
            .replace("[7]", "[1e400]")
            .replace('{"n": 8}', '{"n": ' + "9" * 5000 + "}")
        )
        response = self.client_api.generic(
            "POST", "/api/v1/events", body, content_type="application/json"
        )
        assert response.status_code == 207
        results = response.json()["results"]
        assert [r["status"] for r in results] == ["accepted", "rejected", "rejected"]
        assert [r["errors"][0]["loc"] for r in results[1:]] == [
            "events[1].result[0]",
            "events[2].result.n",
        ]
        assert all("too large" in r["errors"][0]["msg"] for r in results[1:])
        assert CallEvent.objects.filter(event_id=good["event_id"]).exists()
        single = json.dumps(huge_float).replace("[7]", "[1e400]")
        response = self.client_api.generic(
            "POST", "/api/v1/events", single, content_type="application/json"
        )
        assert (
            response.status_code == 207
            and response.json()["results"][0]["errors"][0]["loc"] == "result[0]"
        )
        gate = '{"format": "plain", "call": {"tool": "get_weather", "arguments": {"n": 1e400}}}'
        response = self.client_api.generic(
            "POST", "/api/v1/calls", gate, content_type="application/json"
        )
        assert response.status_code == 400 and "too large" in response.json()["error"]

    def test_it_answers_413_for_a_body_over_5_mb(self):
        big = json.dumps([proposal("get_weather", {"city": "x" * 6_000_000})])
        response = self.client_api.generic(
            "POST", "/api/v1/events", big, content_type="application/json"
        )
        assert response.status_code == 413
        assert "5 MB" in response.json()["error"]
        assert not ToolCall.objects.exists()

    def test_it_takes_a_full_batch_of_1000_events(self):
        events = [
            proposal("get_weather", {"city": f"C{i}"}, request_id=f"r{i}") for i in range(1000)
        ]
        response = self.post(events)
        assert response.status_code == 200, response.content[:300]
        assert response.json()["accepted"] == 1000

    def test_it_answers_413_for_more_than_1000_events(self):
        events = [
            proposal("get_weather", {"city": "Oslo"}, request_id=f"r{i}") for i in range(1001)
        ]
        response = self.post(events)
        assert response.status_code == 413
        assert "1000" in response.json()["error"]

    def test_it_needs_an_api_key(self):
        from rest_framework.test import APIClient

        response = APIClient().post(
            "/api/v1/events", proposal("get_weather", {"city": "Oslo"}), format="json"
        )
        assert response.status_code in (401, 403)
        assert response.json()["error"]

    @skipUnless(
        connection.vendor == "postgresql", "SQLite splits bulk inserts by its 999-parameter limit"
    )
    @override_settings(CALLGATE_INBOX_PROBE_MS=0)  # each batch probes the inbox once
    def test_it_stores_a_batch_in_a_fixed_number_of_queries(self):
        def batch(n: int, start: int) -> list[dict]:
            events = []
            for i in range(start, start + n):
                events.append(
                    proposal(
                        "get_weather", {"city": f"City {i}"}, request_id=f"req-{i}", call_id=f"c{i}"
                    )
                )
                events.append(
                    make_event(
                        "attempt",
                        request_id=f"req-{i}",
                        call_id=f"c{i}",
                        sent=True,
                        outcome="success",
                        result={"temperature": i},
                    )
                )
            return events

        # the drain task stops after a chunk that used up its time budget (1 s); on a loaded
        # machine the large batch's chunk can, which leaves out the last empty probe
        budget = mock.patch("callgate.tasks.DRAIN_TASK_SECONDS", 600.0)
        assert self.post(batch(1, 1000)).status_code == 200  # the key is known from now on
        tools_cache_forget(self.project.pk)  # each batch reads the contracts once
        with budget, CaptureQueriesContext(connection) as small:
            assert self.post(batch(5, 0)).status_code == 200
        tools_cache_forget(self.project.pk)
        with budget, CaptureQueriesContext(connection) as large:
            assert self.post(batch(200, 100)).status_code == 200
        assert len(large) == len(small), [q["sql"][:80] for q in large.captured_queries]
        assert ToolCall.objects.filter(project=self.project, reason="ok").count() == 1 + 5 + 200

    def test_it_redacts_sensitive_and_secret_fields_before_storage(self):
        event = proposal(
            "create_follow_up",
            {"ticket_id": "T-1", "note": "call me at 555", "password": "hunter2"},
            request_id="r1",
        )
        self.post(event)
        call = ToolCall.objects.get(project=self.project)
        assert call.arguments == {"ticket_id": "T-1", "note": "•••", "password": "•••"}
        stored = json.dumps(list(CallEvent.objects.values_list("body", flat=True)))
        assert "hunter2" not in stored and "555" not in stored

    def test_it_opens_one_review_item_and_closes_it_on_a_late_receipt(self):
        proposed = proposal("create_follow_up", {"ticket_id": "T-1"}, request_id="r1")
        self.post(proposed)
        op = self.status_of(proposed)["answer"]["operation_id"]
        self.post(make_event("attempt", operation_id=op, sent=True, outcome="timeout"))
        self.post(make_event("reconciled", operation_id=op, found=True, matches=False))
        item = ReviewItem.objects.get(call__operation_id=op)
        assert item.status == "open"
        late = make_event("receipt", operation_id=op, result={"follow_up_id": "F-1"})
        self.post(late)
        assert self.status_of(late)["answer"]["reason"] == "reconciled_applied"
        item.refresh_from_db()
        assert item.status == "settled"

    def test_an_agent_cannot_decide_on_its_own_calls(self):
        self.client_api.put(
            "/api/v1/tools/pay", {**WEATHER, "requires_approval": True}, format="json"
        )
        proposed = proposal("pay", {"city": "Oslo"}, request_id="r1")
        self.post(proposed)
        op = self.status_of(proposed)["answer"]
        for event in (
            make_event("decision", operation_id=op["operation_id"], decision="approve"),
            make_event("approval_expired", operation_id=op["operation_id"]),
        ):
            response = self.post(event)
            assert response.status_code == 207
            assert response.json()["results"][0]["errors"][0]["loc"] == "type"
        assert ToolCall.objects.get(operation_id=op["operation_id"]).state == "pending_approval"
        runtime = self.api(api_key_issue(agent=self.agent, can_decide=True).plain)
        decision = make_event(
            "decision", operation_id=op["operation_id"], decision="reject", reason="no"
        )
        assert runtime.post("/api/v1/events", decision, format="json").status_code == 200
        assert self.status_of(decision)["answer"]["reason"] == "approval_rejected"

    def test_it_refuses_an_attempt_on_a_call_waiting_for_approval(self):
        self.client_api.put(
            "/api/v1/tools/pay", {**WEATHER, "requires_approval": True}, format="json"
        )
        proposed = proposal("pay", {"city": "Oslo"}, request_id="r1")
        self.post(proposed)
        op = self.status_of(proposed)["answer"]
        assert op["verdict"] == "pending_approval"
        attempt = make_event(
            "attempt",
            operation_id=op["operation_id"],
            sent=True,
            outcome="success",
            result={"ok": 1},
        )
        assert self.post(attempt).status_code == 200
        found = self.status_of(attempt)
        assert found["status"] == "rejected"
        assert "pending_approval" in found["errors"][0]["msg"]
        assert ToolCall.objects.get(operation_id=op["operation_id"]).state == "pending_approval"


class GateTests(BaseTestCase):
    def setUp(self):
        self.client_api = self.api()
        self.client_api.put("/api/v1/tools/create_follow_up", FOLLOW_UP, format="json")

    def check(self, body):
        return self.client_api.post("/api/v1/calls", body, format="json")

    def test_it_allows_a_valid_call_and_derives_a_stable_operation_id(self):
        body = {
            "format": "plain",
            "call": {"tool": "create_follow_up", "arguments": {"ticket_id": "T-1"}},
            "request_id": "req-1",
        }
        first = self.check(body).json()
        assert first["verdict"] == "allow" and first["route"] == "proceed"
        self.client_api.post(
            "/api/v1/events",
            make_event(
                "attempt",
                operation_id=first["operation_id"],
                sent=True,
                outcome="success",
                result={"id": "F-1"},
            ),
            format="json",
        )
        again = self.check(body).json()
        assert again["operation_id"] == first["operation_id"]
        assert again["verdict"] == "return_receipt"
        assert again["receipt"] == {"id": "F-1"}
        assert ToolCall.objects.get(operation_id=first["operation_id"]).duplicates_suppressed == 1

    def test_large_numbers_derive_the_operation_id_the_arguments_had_when_sent(self):
        # PostgreSQL's jsonb keeps 1e300 as the integer 10**300; RFC 8785 takes both as one double
        for number in (1e21, 1e300, 2.0**60):
            arguments = {"ticket_id": "T-1", "note": "n", "password": "p", "size": number}
            body = {
                "format": "plain",
                "request_id": f"req-{number}",
                "call": {"tool": "send_big", "arguments": arguments},
            }
            answer = self.check(body).json()
            assert answer["operation_id"] == derive_operation_id(
                request_id=f"req-{number}", tool="send_big", arguments=arguments
            ), number
        assert derive_operation_id(
            request_id="r", tool="t", arguments=[10**21]
        ) == derive_operation_id(request_id="r", tool="t", arguments=[1e21])

    def test_it_never_allows_a_second_execution_while_the_outcome_is_unknown(self):
        body = {
            "format": "plain",
            "call": {"tool": "create_follow_up", "arguments": {"ticket_id": "T-1"}},
            "request_id": "req-1",
        }
        op = self.check(body).json()["operation_id"]
        self.client_api.post(
            "/api/v1/events",
            make_event("attempt", operation_id=op, sent=True, outcome="timeout"),
            format="json",
        )
        again = self.check(body).json()
        assert again["verdict"] == "reconcile"
        assert again["reason"] == "outcome_unknown"

    def test_a_resent_check_gets_the_same_operation_and_its_current_state(self):
        body = {
            "format": "plain",
            "call": {"tool": "create_follow_up", "arguments": {"ticket_id": "T-1"}},
            "request_id": "req-1",
            "event_id": str(uuid.uuid4()),
        }
        first = self.check(body).json()
        again = self.check(body)
        assert again.status_code == 200
        assert again.json()["operation_id"] == first["operation_id"]
        assert CallEvent.objects.filter(event_id=body["event_id"]).count() == 1

    def test_it_refuses_implausible_times(self):
        body = {
            "format": "plain",
            "call": {"tool": "create_follow_up", "arguments": {"ticket_id": "T-1"}},
            "occurred_at": "9999-12-31T23:59:59Z",
        }
        response = self.check(body)
        assert response.status_code == 400
        assert response.json()["errors"][0]["loc"] == "occurred_at"

    def test_it_answers_400_for_a_nul_in_the_url(self):
        assert self.client_api.get("/api/v1/calls/a%00b").status_code == 400

    def test_it_stores_arguments_whose_json_string_escapes_nul_and_surrogates(self):
        arguments = '{"ticket_id": "T-1\\u0000\\ud800"}'
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "create_follow_up", "arguments": arguments},
        }
        response = self.check({"format": "openai", "call": call, "request_id": "r-nul"})
        assert response.status_code == 200, response.content
        stored = ToolCall.objects.get(operation_id=response.json()["operation_id"])
        assert stored.arguments == {"ticket_id": "T-1\ufffd\ufffd"}

    def test_a_contract_stored_with_a_pattern_re2_cannot_run_answers_instead_of_failing(self):
        broken = ToolContract.objects.get(project=self.project, name="create_follow_up")
        broken.parameters = {
            "type": "object",
            "properties": {"ticket_id": {"type": "string", "pattern": "^(?=T)"}},
        }
        broken.save(update_fields=["parameters"])  # as registered before patterns ran in RE2
        response = self.check(
            {
                "format": "plain",
                "call": {"tool": "create_follow_up", "arguments": {"ticket_id": "T"}},
            }
        )
        assert response.status_code == 200, response.content
        assert "cannot be applied" in response.json()["observation"]

    def test_it_answers_malformed_output_without_an_error(self):
        answer = self.check({"format": "openai", "call": "I will call the weather tool now"}).json()
        assert answer["reason"] == "malformed_call"
        assert "create_follow_up" in answer["observation"]

    def test_it_answers_400_naming_the_field_for_a_bad_request(self):
        response = self.check({"format": "cobol", "call": {}})
        assert response.status_code == 400
        assert response.json()["errors"][0]["loc"] == "format"

    def test_it_returns_404_for_another_projects_call(self):
        op = self.check(
            {
                "format": "plain",
                "call": {"tool": "create_follow_up", "arguments": {"ticket_id": "T-1"}},
                "request_id": "r",
            }
        ).json()["operation_id"]
        assert self.api(self.other_key).get(f"/api/v1/calls/{op}").status_code == 404
        assert self.client_api.get(f"/api/v1/calls/{op}").status_code == 200


class ToolRegistrationTests(BaseTestCase):
    def test_it_versions_changed_contracts_and_ignores_repeats(self):
        api = self.api()
        first = api.put("/api/v1/tools/get_weather", WEATHER, format="json")
        assert first.status_code == 201 and first.json()["version"] == 1
        again = api.put("/api/v1/tools/get_weather", WEATHER, format="json")
        assert again.status_code == 200 and again.json() == {**first.json(), "created": False}
        changed = {**WEATHER, "description": "Weather forecast for a city on a given date"}
        second = api.put("/api/v1/tools/get_weather", changed, format="json")
        assert second.status_code == 201 and second.json()["version"] == 2
        assert (
            ToolContract.objects.get(
                project=self.project, name="get_weather", version=1
            ).description
            == WEATHER["description"]
        )

    def test_it_rejects_an_invalid_json_schema_naming_the_problem(self):
        bad = {
            **WEATHER,
            "parameters": {"type": "object", "properties": {"city": {"type": "strnig"}}},
        }
        response = self.api().put("/api/v1/tools/get_weather", bad, format="json")
        assert response.status_code == 400
        assert response.json()["errors"][0]["loc"] == "parameters"
        assert "properties/city/type" in response.json()["error"]

    def test_it_rejects_remote_or_dangling_refs_other_dialects_and_backtracking_patterns(self):
        for parameters, needle in (
            (
                {"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/internal"}}},
                "must be local",
            ),
            (
                {"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}},
                "points to nothing",
            ),
            ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"}, "2020-12"),
            (
                {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(?=x)x"}}},
                "linear time",
            ),
        ):
            response = self.api().put(
                "/api/v1/tools/t", {**WEATHER, "parameters": parameters}, format="json"
            )
            assert response.status_code == 400, parameters
            assert needle in response.json()["error"]
        ok = {
            "type": "object",
            "$defs": {"city": {"type": "string"}},
            "properties": {"city": {"$ref": "#/$defs/city"}},
        }
        assert (
            self.api()
            .put("/api/v1/tools/t", {**WEATHER, "parameters": ok}, format="json")
            .status_code
            == 201
        )

    def test_it_returns_lint_findings(self):
        vague = {
            "description": "tool",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
        }
        body = self.api().put("/api/v1/tools/do_stuff", vague, format="json").json()
        assert body["lint"]["score"] < 80
        assert any("n" in f["path"] for f in body["lint"]["findings"])

    def test_it_rejects_a_tool_name_that_is_too_long_or_has_spaces(self):
        for name in ("x" * 129, "get%20weather"):
            response = self.api().put(f"/api/v1/tools/{name}", WEATHER, format="json")
            assert response.status_code == 400
            assert response.json()["errors"][0]["loc"] == "name"

    def test_it_rejects_a_reconcile_url_without_the_placeholder_or_with_it_in_the_host(self):
        for url in (
            "https://target.example/ops/",
            "http://{operation_id}.attacker.example/x",
            "{operation_id}://x/y",
            "https:///{operation_id}",
        ):
            response = self.api().put(
                "/api/v1/tools/get_weather", {**WEATHER, "reconcile_url": url}, format="json"
            )
            assert response.status_code == 400, url
            assert response.json()["errors"][0]["loc"] == "reconcile_url"

    def test_an_agent_cannot_change_another_agents_contract(self):
        self.api().put("/api/v1/tools/get_weather", WEATHER, format="json")
        other = self.api(
            api_key_issue(agent=Agent.objects.create(project=self.project, name="rogue")).plain
        )
        weaker = {**WEATHER, "parameters": {"type": "object"}, "max_attempts": 100}
        response = other.put("/api/v1/tools/get_weather", weaker, format="json")
        assert response.status_code == 403
        assert "support-bot" in response.json()["error"]
        assert ToolContract.objects.filter(project=self.project, name="get_weather").count() == 1
        assert (
            other.put("/api/v1/tools/get_weather", WEATHER, format="json").status_code == 200
        )  # the same joins

    def test_a_key_cannot_register_tools_in_another_project(self):
        self.api(self.other_key).put("/api/v1/tools/get_weather", WEATHER, format="json")
        assert not ToolContract.objects.filter(project=self.project).exists()
        assert ToolContract.objects.filter(project=self.other_project).count() == 1


class EventIdTests(BaseTestCase):
    def test_event_ids_are_scoped_per_project(self):
        event_id = str(uuid.uuid4())
        for key in (self.key, self.other_key):
            api = self.api(key)
            api.put("/api/v1/tools/get_weather", WEATHER, format="json")
            event = {
                **proposal("get_weather", {"city": "Oslo"}, request_id="r"),
                "event_id": event_id,
            }
            assert (
                api.post("/api/v1/events", event, format="json").json()["results"][0]["status"]
                == "accepted"
            )


class CauseApiTests(BaseTestCase):
    """An attempt's cause, as read, on its event (TAXONOMY v2 "Reading the cause of a
    failure"); an error of any length is accepted, classified whole and stored cut."""

    def setUp(self):
        self.client_api = self.api()
        self.client_api.put("/api/v1/tools/create_follow_up", FOLLOW_UP, format="json")

    def attempt(self, **fields) -> dict:
        propose = proposal("create_follow_up", {"ticket_id": "T-1"}, request_id="r-cause")
        self.client_api.post("/api/v1/events", propose, format="json")
        op = self.client_api.get(f"/api/v1/events/{propose['event_id']}").json()["answer"]
        event = make_event("attempt", operation_id=op["operation_id"], sent=True, **fields)
        response = self.client_api.post("/api/v1/events", event, format="json")
        assert response.status_code == 200, response.json()
        return self.client_api.get(f"/api/v1/events/{event['event_id']}").json()

    def test_a_jsonrpc_error_is_read_and_its_cause_answered(self):
        found = self.attempt(
            outcome="error",
            jsonrpc_error={"code": -32603, "message": "Internal error: upstream rate limit hit"},
        )
        assert found["answer"]["reason"] == "rate_limited"
        assert found["cause"] == (
            "JSON-RPC -32603 (internal error) with 'rate limit' in its message"
        )
        assert found["failed_items"] is None

    def test_a_partial_failure_answers_its_failed_items(self):
        found = self.attempt(
            outcome="success",
            result={"succeeded": ["a"], "failed": [{"id": "T-9", "error": "ticket is closed"}]},
        )
        assert found["answer"]["reason"] == "partial_failure"
        assert found["failed_items"] == [{"item": "T-9", "error": "ticket is closed"}]
        assert "T-9" in found["answer"]["observation"]

    def test_an_error_of_any_length_is_accepted_classified_whole_and_stored_cut(self):
        trace = "ChargeFailed\n" + "\tat x.Y.z(Y.java:1)\n" * 2_000 + "Caused by: Read timed out"
        assert len(trace) > 20_000
        found = self.attempt(outcome="error", error=trace)
        assert found["answer"]["reason"] == "outcome_unknown"  # the tail named the timeout
        assert "Y.java" not in found["answer"]["observation"]
        stored = CallEvent.objects.get(event_id=found["event_id"]).body["error"]
        assert len(stored) < 5_000 and stored.endswith("Caused by: Read timed out")
        assert f"of {len(trace):,} characters cut" in stored

    def test_a_jsonrpc_error_without_a_code_is_refused_naming_the_field(self):
        propose = proposal("create_follow_up", {"ticket_id": "T-1"}, request_id="r-bad")
        self.client_api.post("/api/v1/events", propose, format="json")
        event = make_event(
            "attempt",
            operation_id="op_x",
            sent=True,
            outcome="error",
            jsonrpc_error={"message": "x"},
        )
        response = self.client_api.post("/api/v1/events", event, format="json")
        assert response.status_code == 207
        errors = response.json()["results"][0]["errors"]
        assert any(e["loc"].endswith("jsonrpc_error.code") for e in errors), errors


class UnreadableArgumentsApiTests(BaseTestCase):
    """Arguments that strict JSON cannot say or PostgreSQL cannot store never make the
    events API or the gate answer 500: numbers are refused by name (400 for the body, or
    the event rejected), a NUL or unpaired surrogate is stored as U+FFFD."""

    NUMBERS = ("NaN", "Infinity", "-Infinity", "1e400", "9" * 5000)
    TEXTS = ('"a\\u0000b"', '"a\\ud800b"')

    def post(self, path: str, body: str):
        return self.client.post(
            path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {self.key}"
        )

    def test_the_events_api_and_the_gate_answer_4xx_or_store_what_they_can(self):
        for raw in self.NUMBERS + self.TEXTS:
            call = '{"tool": "create_follow_up", "arguments": {"ticket_id": ' + raw + "}}"
            envelope = {
                "event_id": str(uuid.uuid4()),
                "occurred_at": "2026-01-01T00:00:00Z",
                "type": "proposed",
                "format": "plain",
                "request_id": "r-1",
            }
            events = self.post(
                "/api/v1/events", "[" + json.dumps(envelope)[:-1] + ', "call": ' + call + "}]"
            )
            gate = self.post(
                "/api/v1/calls", '{"format": "plain", "request_id": "r-2", "call": ' + call + "}"
            )
            if raw in self.NUMBERS:
                assert events.status_code in (400, 207), (raw[:12], events.status_code)
                assert events.json().get("accepted", 0) == 0
                assert gate.status_code == 400, (raw[:12], gate.status_code)
                assert "sys." not in gate.json()["error"]  # words for the agent, not Python's
            else:
                assert events.status_code in (200, 202) and gate.status_code == 200, raw
        stored = ToolCall.objects.filter(project=self.project).values_list("arguments", flat=True)
        assert stored and all("\ufffd" in a["ticket_id"] for a in stored), list(stored)
