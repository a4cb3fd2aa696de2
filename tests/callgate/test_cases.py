"""Every case of ``shared/cases/classification.jsonl`` through the REST API path: contracts
registered with ``PUT /api/v1/tools/{name}``, events posted to ``POST /api/v1/events`` one
by one, the final classification read from the last event's ``GET /api/v1/events/{event_id}``
and from ``GET /api/v1/calls/{operation_id}``."""

from __future__ import annotations

from callgate.auth import api_key_issue
from callgate.replay import case_envelopes, case_history, case_tool_payloads
from tests.factories import BaseTestCase, load_cases

CASES = load_cases()


class CaseTests(BaseTestCase):
    def run_case(self, case: dict) -> None:
        # the cases report operator decisions as events: a key of a runtime with its own approval UI
        api = self.api(api_key_issue(agent=self.agent, can_decide=True).plain)
        for name, body in case_tool_payloads(case).items():
            response = api.put(f"/api/v1/tools/{name}", body, format="json")
            assert response.status_code in (200, 201), response.json()
        case_history(case, agent=self.agent)
        answer, operation_id = None, None
        for envelope in case_envelopes(case):
            if envelope["type"] != "proposed" and operation_id and not envelope.get("operation_id"):
                envelope["operation_id"] = operation_id
            response = api.post("/api/v1/events", envelope, format="json")
            assert response.status_code == 200, response.json()
            assert response.json()["results"][0]["status"] == "accepted", response.json()
            # stored in the inbox and applied by the drain task (eager here), then read back
            found = api.get(f"/api/v1/events/{envelope['event_id']}").json()
            assert found["status"] == "applied", found
            answer = found["answer"]
            operation_id = answer["operation_id"]
        expect = case["expect"]
        assert (answer["reason"], answer["category"], answer["route"]) == (
            expect["reason"],
            expect["category"],
            expect["route"],
        ), answer["observation"]
        observation = answer["observation"].lower()
        for text in expect.get("observation_contains", []):
            assert text.lower() in observation, f"{text!r} missing from: {answer['observation']}"
        for text in expect.get("observation_excludes", []):
            assert text.lower() not in observation, f"{text!r} leaked into: {answer['observation']}"
        stored = api.get(f"/api/v1/calls/{operation_id}").json()
        assert (stored["reason"], stored["route"]) == (expect["reason"], expect["route"])


def _make_test(case):
    def test(self):
        self.run_case(case)

    test.__doc__ = case.get("title")
    return test


for _case in CASES:
    setattr(CaseTests, f"test_case_{_case['id'].replace('-', '_')}", _make_test(_case))
