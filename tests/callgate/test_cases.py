"""Every case of ``tests/cases/classification.jsonl`` (the repository's copy of
``shared/cases``) through the REST API path: contracts registered with
``PUT /api/v1/tools/{name}``, events posted to ``POST /api/v1/events`` one by one, the answer
to the last event read from its ``GET /api/v1/events/{event_id}`` (``expect``), the call it
concerns from ``GET /api/v1/calls/{operation_id}`` (``expect_call``) and every call the case
created, in creation order (``expect_calls``)."""

from __future__ import annotations

import io
import json

from django.core.management import call_command
from django.test import TestCase

from callgate.auth import api_key_issue
from callgate.models import ToolCall
from callgate.replay import case_envelopes, case_history, case_tool_payloads, names_its_call
from tests.factories import CASES_FILE, BaseTestCase, load_cases

CASES = load_cases()


def check_observation(expected: dict, observation: str) -> None:
    text = observation.lower()
    for part in expected.get("observation_contains", []):
        assert part.lower() in text, f"{part!r} missing from: {observation}"
    for part in expected.get("observation_excludes", []):
        assert part.lower() not in text, f"{part!r} leaked into: {observation}"


class CaseTests(BaseTestCase):
    def run_case(self, case: dict) -> None:
        # the cases report operator decisions as events: a key of a runtime with its own approval UI
        api = self.api(api_key_issue(agent=self.agent, can_decide=True).plain)
        for name, body in case_tool_payloads(case).items():
            response = api.put(f"/api/v1/tools/{name}", body, format="json")
            assert response.status_code in (200, 201), response.json()
        case_history(case, agent=self.agent)
        before = (
            ToolCall.objects.filter(agent=self.agent)
            .order_by("-pk")
            .values_list("pk", flat=True)
            .first()
            or 0
        )
        answer, operation_id = None, None
        for envelope in case_envelopes(case):
            if not names_its_call(envelope) and operation_id:
                envelope["operation_id"] = operation_id
            response = api.post("/api/v1/events", envelope, format="json")
            assert response.status_code == 200, response.json()
            assert response.json()["results"][0]["status"] == "accepted", response.json()
            # stored in the inbox and applied by the drain task (eager here), then read back
            found = api.get(f"/api/v1/events/{envelope['event_id']}").json()
            assert found["status"] == "applied", found
            answer = found["answer"]
            operation_id = answer["operation_id"]
        if "expect" in case:
            expect = case["expect"]
            assert (answer["reason"], answer["category"], answer["route"]) == (
                expect["reason"],
                expect["category"],
                expect["route"],
            ), answer["observation"]
            check_observation(expect, answer["observation"])
        stored = api.get(f"/api/v1/calls/{operation_id}").json()
        if "expect_call" in case:
            expect = case["expect_call"]
            assert (stored["reason"], stored["category"], stored["route"]) == (
                expect["reason"],
                expect["category"],
                expect["route"],
            ), stored
            if "state" in expect:
                assert stored["state"] == expect["state"], stored
        if "expect_calls" in case:
            created = ToolCall.objects.filter(agent=self.agent, pk__gt=before).order_by("pk")
            calls = [api.get(f"/api/v1/calls/{c.operation_id}").json() for c in created]
            assert len(calls) == len(case["expect_calls"]), [
                (c["call_id"], c["reason"]) for c in calls
            ]
            for expected, call in zip(case["expect_calls"], calls, strict=True):
                if "call_id" in expected:
                    assert call["call_id"] == expected["call_id"], call
                got = (call["reason"], call["category"], call["route"])
                assert got == (expected["reason"], expected["category"], expected["route"]), call
                check_observation(expected, call["observation"])


def _make_test(case):
    def test(self):
        self.run_case(case)

    test.__doc__ = case.get("title")
    return test


for _case in CASES:
    setattr(CaseTests, f"test_case_{_case['id'].replace('-', '_')}", _make_test(_case))


def replay_mismatches(case: dict, line: dict) -> list[str]:
    """What ``manage.py classify`` printed for ``case`` that its expectations contradict."""
    problems = []
    expect = case.get("expect")
    if expect:
        got = (line["reason"], line["category"], line["route"])
        if got != (expect["reason"], expect["category"], expect["route"]):
            problems.append(f"answer {got}")
    for index, expected in enumerate(case.get("expect_calls", [])):
        calls = line["calls"]
        if index >= len(calls):
            problems.append(f"call {index} missing")
            continue
        got = (calls[index]["reason"], calls[index]["category"], calls[index]["route"])
        if got != (expected["reason"], expected["category"], expected["route"]):
            problems.append(f"call {index} {got}")
    return problems


class ClassifyCommandCaseTests(TestCase):
    def test_every_case_through_manage_py_classify(self):
        out = io.StringIO()
        call_command("classify", str(CASES_FILE), stdout=out)
        lines = [json.loads(line) for line in out.getvalue().splitlines()]
        assert [line["id"] for line in lines] == [case["id"] for case in CASES]
        failing = {
            case["id"]: problems
            for case, line in zip(CASES, lines, strict=True)
            if (problems := replay_mismatches(case, line))
        }
        assert not failing, f"{len(failing)} case(s) differ: {failing}"
