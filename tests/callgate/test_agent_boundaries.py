"""Agent boundaries (issue 16): who may publish a contract version, whose calls an agent's
events may name, and whose word settles a review item."""

from __future__ import annotations

from callgate import services
from callgate.auth import api_key_issue
from callgate.models import Agent, CallEvent, ToolCall, ToolContract
from callgate.schemas import ContractIn
from reviews.models import ReviewItem
from reviews.services import approve_retry_guard
from tests.factories import PAYMENT, BaseTestCase, make_event, proposal

#: a write callgate cannot reconcile (neither reconcile_url nor reconcilable)
TRANSFER = {
    "description": "Transfer money between accounts",
    "effect": "write",
    "parameters": {"type": "object", "properties": {"amount": {"type": "number"}}},
}


class BoundaryTestCase(BaseTestCase):
    def setUp(self):
        self.owner = self.api()
        self.rogue_agent = Agent.objects.create(project=self.project, name="rogue")
        self.rogue = self.api(api_key_issue(agent=self.rogue_agent).plain)

    def events(self, client, *events):
        response = client.post("/api/v1/events", list(events), format="json")
        assert response.status_code in (200, 207), response.content
        return response.json()["results"]

    def event_status(self, client, event) -> dict:
        return client.get(f"/api/v1/events/{event['event_id']}").json()


class ContractOwnershipTests(BoundaryTestCase):
    def test_registering_the_identical_contract_first_gives_use_not_ownership(self):
        assert self.owner.put("/api/v1/tools/pay", PAYMENT, format="json").status_code == 201
        assert self.rogue.put("/api/v1/tools/pay", PAYMENT, format="json").status_code == 200
        weaker = {**PAYMENT, "requires_approval": False, "parameters": {"type": "object"}}
        response = self.rogue.put("/api/v1/tools/pay", weaker, format="json")
        self.assertEqual(response.status_code, 403, response.content)
        [error] = response.json()["errors"]
        self.assertEqual(error["loc"], "name")
        self.assertIn("support-bot", error["msg"])
        self.assertEqual(ToolContract.objects.filter(project=self.project, name="pay").count(), 1)
        # the owner's payment of 1,000,000 still waits for approval
        gate = self.owner.post(
            "/api/v1/calls",
            {"format": "plain", "call": {"tool": "pay", "arguments": {"amount": 1_000_000}}},
            format="json",
        ).json()
        self.assertEqual(gate["verdict"], "reask")
        # the rogue may use the tool: its own proposals are checked against the contract
        gate = self.rogue.post(
            "/api/v1/calls",
            {"format": "plain", "call": {"tool": "pay", "arguments": {"amount": 5}}},
            format="json",
        ).json()
        self.assertEqual(gate["verdict"], "pending_approval")

    def test_the_owner_publishes_changed_versions(self):
        assert self.owner.put("/api/v1/tools/pay", PAYMENT, format="json").status_code == 201
        self.rogue.put("/api/v1/tools/pay", PAYMENT, format="json")
        changed = {**PAYMENT, "description": "Pay an invoice in EUR"}
        response = self.owner.put("/api/v1/tools/pay", changed, format="json")
        self.assertEqual(response.status_code, 201)
        latest = ToolContract.objects.get(project=self.project, name="pay", version=2)
        self.assertEqual(latest.published_by, "agent support-bot")

    def test_a_project_admin_publishes_a_version_of_any_tool(self):
        self.owner.put("/api/v1/tools/pay", PAYMENT, format="json")
        stricter = ContractIn.model_validate({**PAYMENT, "max_attempts": 1})
        contract, created = services.contract_publish(
            project=self.project, name="pay", payload=stricter, user=self.maria
        )
        self.assertTrue(created)
        self.assertEqual((contract.version, contract.max_attempts), (2, 1))
        self.assertEqual(contract.published_by, "user maria")
        with self.assertRaises(services.ContractRejected) as refused:
            services.contract_publish(
                project=self.project, name="nope", payload=stricter, user=self.maria
            )
        self.assertEqual(refused.exception.loc, "name")


class CallOwnershipTests(BoundaryTestCase):
    def test_another_agents_events_cannot_name_a_call(self):
        self.owner.put("/api/v1/tools/transfer", TRANSFER, format="json")
        proposed = proposal("transfer", {"amount": 5}, request_id="r1", call_id="c1")
        self.events(self.owner, proposed)
        op = self.event_status(self.owner, proposed)["answer"]["operation_id"]
        by_op = make_event("attempt", operation_id=op, sent=True, outcome="success", result={})
        by_pair = make_event(
            "attempt", request_id="r1", call_id="c1", sent=True, outcome="success", result={}
        )
        self.events(self.rogue, by_op, by_pair)
        for event, field in ((by_op, "operation_id"), (by_pair, "call_id")):
            answer = self.event_status(self.rogue, event)
            self.assertEqual(answer["status"], "rejected")
            self.assertEqual(answer["errors"][0]["loc"], field)
            self.assertIn("for this agent", answer["errors"][0]["msg"])
        self.assertEqual(ToolCall.objects.get(operation_id=op).state, "allowed")
        self.assertEqual(self.rogue.get(f"/api/v1/calls/{op}").status_code, 404)
        self.assertEqual(self.owner.get(f"/api/v1/calls/{op}").status_code, 200)


class TrustedSettlementTests(BoundaryTestCase):
    def call_in_review(self, contract: dict, state: str = "in_review") -> str:
        self.owner.put("/api/v1/tools/transfer", contract, format="json")
        proposed = proposal("transfer", {"amount": 5}, request_id="r1")
        self.events(self.owner, proposed)
        op = self.event_status(self.owner, proposed)["answer"]["operation_id"]
        self.events(
            self.owner, make_event("attempt", operation_id=op, sent=True, outcome="timeout")
        )
        call = ToolCall.objects.get(operation_id=op)
        assert call.state == state, call.state
        return op

    def test_an_agents_reconciliation_of_a_contract_it_does_not_reconcile_is_information(self):
        op = self.call_in_review(TRANSFER)
        absent = make_event("reconciled", operation_id=op, found=False, matches=False)
        receipt = make_event("receipt", operation_id=op, result={"id": "T-1"})
        self.events(self.owner, absent, receipt)
        for event in (absent, receipt):
            self.assertEqual(self.event_status(self.owner, event)["status"], "applied")
        call = ToolCall.objects.get(operation_id=op)
        self.assertEqual(call.state, "in_review")
        self.assertIsNone(call.receipt)
        item = ReviewItem.objects.get(call=call)
        self.assertTrue(item.is_open)
        stored = CallEvent.objects.get(event_id=absent["event_id"])
        self.assertTrue(stored.body["information_only"])
        # the approve-retry guard does not count it
        self.assertIn("reconciliation", approve_retry_guard(call))

    def test_a_can_decide_key_settles(self):
        op = self.call_in_review(TRANSFER)
        runtime = self.api(api_key_issue(agent=self.agent, can_decide=True).plain)
        receipt = make_event("receipt", operation_id=op, result={"id": "T-1"})
        self.events(runtime, receipt)
        call = ToolCall.objects.get(operation_id=op)
        self.assertEqual(call.state, "succeeded")
        self.assertFalse(ReviewItem.objects.get(call=call).is_open)

    def test_the_agent_settles_a_contract_it_reconciles_itself(self):
        op = self.call_in_review({**TRANSFER, "reconcilable": True}, state="reconciling")
        self.events(self.owner, make_event("receipt", operation_id=op, result={"id": "T-1"}))
        self.assertEqual(ToolCall.objects.get(operation_id=op).state, "succeeded")


class ContractPublishPageTests(BoundaryTestCase):
    def setUp(self):
        super().setUp()
        from callgate.models import Membership

        self.owner.put("/api/v1/tools/pay", PAYMENT, format="json")
        Membership.objects.filter(user=self.maria, project=self.project).update(role="admin")
        self.url = f"/p/{self.project.slug}/contracts/pay/"

    def test_an_admin_publishes_from_the_contract_page(self):
        import json

        self.client.force_login(self.maria)
        page = self.client.get(self.url)
        self.assertContains(page, "Publish as v2")
        body = {**PAYMENT, "max_attempts": 1}
        response = self.client.post(self.url + "publish/", {"contract": json.dumps(body)})
        self.assertEqual(response.status_code, 302)
        latest = ToolContract.objects.get(project=self.project, name="pay", version=2)
        self.assertEqual((latest.max_attempts, latest.published_by), (1, "user maria"))
        bad = self.client.post(self.url + "publish/", {"contract": '{"parameters": {"type": 1}}'})
        self.assertEqual(bad.status_code, 400)
        self.assertContains(bad, "Not published: parameters", status_code=400)

    def test_operators_neither_see_nor_use_the_action(self):
        self.client.force_login(self.alice)
        self.assertNotContains(self.client.get(self.url), "Publish as v")
        response = self.client.post(self.url + "publish/", {"contract": "{}"})
        self.assertEqual(response.status_code, 403)
        self.assertEqual(ToolContract.objects.filter(project=self.project, name="pay").count(), 1)


class BlindRetryTests(TrustedSettlementTests):
    """An agent's new attempt while the first attempt's outcome is unknown (issue 16): it is
    recorded and flagged for the operator, never a silent close of the review."""

    def retry(self, op: str, **fields) -> dict:
        attempt = make_event("attempt", operation_id=op, sent=True, **fields)
        [result] = self.events(self.owner, attempt)
        self.assertEqual(result["status"], "accepted")
        return self.event_status(self.owner, attempt)

    def assert_flagged(self, op: str, *, attempts: int) -> ReviewItem:
        from reviews.models import ReviewAudit

        call = ToolCall.objects.get(operation_id=op)
        self.assertEqual((call.state, call.attempts), ("in_review", attempts))
        self.assertIsNone(call.receipt)
        item = ReviewItem.objects.get(call=call)
        self.assertTrue(item.is_open)
        self.assertEqual(item.agent_retries, 1)
        self.assertIsNotNone(item.agent_retried_at)
        [audit] = ReviewAudit.objects.filter(item=item, action="agent_retry")
        self.assertIsNone(audit.actor)
        self.assertEqual(audit.detail["attempt"], attempts)
        self.assertEqual(audit.detail["outcome"], "success")
        self.assertIn("may have run twice", audit.reason)
        return item

    def assert_shown(self, item: ReviewItem) -> None:
        self.client.force_login(self.alice)
        page = self.client.get(f"/p/{self.project.slug}/review/{item.pk}/")
        self.assertContains(page, "The agent retried this write")
        self.assertContains(page, "may have run twice")
        queue = self.client.get(f"/p/{self.project.slug}/review/?status=all")
        self.assertContains(queue, "agent retried")

    def test_a_retry_of_a_write_that_cannot_be_reconciled_keeps_the_review_open(self):
        op = self.call_in_review(TRANSFER)
        answer = self.retry(op, outcome="success", result={"id": "T-1"})
        self.assertEqual(answer["status"], "applied")
        self.assertEqual(answer["answer"]["route"], "review")
        self.assertEqual(answer["answer"]["reason"], "not_reconcilable")
        self.assertIn("do not call it again", answer["answer"]["observation"].lower())
        item = self.assert_flagged(op, attempts=2)
        self.assertEqual(item.reason, "not_reconcilable")
        stored = CallEvent.objects.get(event_id=answer["event_id"])
        self.assertTrue(stored.body["blind_retry"])
        self.assertEqual(stored.body["result"], {"id": "T-1"})  # kept for the operator
        self.assert_shown(item)

    def test_a_retry_while_callgate_reconciles_escalates_with_the_flag(self):
        op = self.call_in_review({**TRANSFER, "reconcilable": True}, state="reconciling")
        self.retry(op, outcome="success", result={"id": "T-1"})
        item = self.assert_flagged(op, attempts=2)
        self.assertEqual(item.reason, "outcome_unknown")
        self.assert_shown(item)

    def test_a_retry_the_operator_approved_is_not_flagged(self):
        from reviews import services as review_services
        from reviews.models import ReviewAudit

        op = self.call_in_review(TRANSFER)
        call = ToolCall.objects.get(operation_id=op)
        item = ReviewItem.objects.get(call=call)
        review_services.review_item_decide(
            item=item,
            user=self.alice,
            decision="approve_retry",
            reason="checked the ledger: not there",
            override=True,
        )
        self.retry(op, outcome="success", result={"id": "T-1"})
        self.assertEqual(ToolCall.objects.get(operation_id=op).state, "succeeded")
        item.refresh_from_db()
        self.assertEqual(item.agent_retries, 0)
        self.assertFalse(ReviewAudit.objects.filter(item=item, action="agent_retry").exists())


class ReproposalTests(BoundaryTestCase):
    """A proposal naming another agent's operation ID is answered as if that ID named no
    call of this agent, and never touches the stored call (found by re-proposing an
    owner's IDs with a tool that does not exist, through the gate and the events API)."""

    def owners_call(self) -> tuple[str, dict]:
        self.owner.put("/api/v1/tools/transfer", TRANSFER, format="json")
        proposed = proposal("transfer", {"amount": 5}, request_id="r1")
        self.events(self.owner, proposed)
        op = self.event_status(self.owner, proposed)["answer"]["operation_id"]
        call = ToolCall.objects.get(operation_id=op)
        return op, {f: getattr(call, f) for f in ("state", "reason", "route", "observation")}

    def assert_untouched(self, op: str, before: dict) -> None:
        call = ToolCall.objects.get(operation_id=op)
        self.assertEqual({f: getattr(call, f) for f in before}, before)
        self.assertEqual(call.events.filter(kind="proposed").count(), 1)  # the owner's alone

    def test_through_the_events_api(self):
        op, before = self.owners_call()
        for call in (
            {"tool": "no_such_tool", "arguments": {}},
            {"tool": "transfer", "arguments": {"amount": 5}},
        ):
            event = make_event("proposed", format="plain", operation_id=op, call=call)
            self.events(self.rogue, event)
            answer = self.event_status(self.rogue, event)
            self.assertEqual(answer["status"], "rejected", answer)
            self.assertEqual(answer["errors"][0]["loc"], "operation_id")
            self.assertIn("for this agent", answer["errors"][0]["msg"])
        self.assert_untouched(op, before)

    def test_through_the_gate(self):
        op, before = self.owners_call()
        response = self.rogue.post(
            "/api/v1/calls",
            {
                "format": "plain",
                "operation_id": op,
                "call": {"tool": "no_such_tool", "arguments": {}},
            },
            format="json",
        )
        self.assertEqual(response.status_code, 409, response.content)
        self.assertEqual(response.json()["errors"][0]["loc"], "operation_id")
        self.assertNotIn(before["observation"] or "<none>", response.content.decode())
        self.assert_untouched(op, before)


class ReadBoundaryTests(BoundaryTestCase):
    """A key reads only its own agent's calls and events, on every read endpoint."""

    def test_the_calls_list_holds_only_the_keys_agents_calls(self):
        self.owner.put("/api/v1/tools/transfer", TRANSFER, format="json")
        self.events(self.owner, proposal("transfer", {"amount": 5}, request_id="r1"))
        self.rogue.put("/api/v1/tools/transfer", TRANSFER, format="json")
        self.events(self.rogue, proposal("transfer", {"amount": 7}, request_id="r2"))
        owner_agent = ToolCall.objects.get(request_id="r1").agent
        for client, request_id in ((self.owner, "r1"), (self.rogue, "r2")):
            items = client.get("/api/v1/calls").json()["items"]
            self.assertEqual([item["request_id"] for item in items], [request_id])
        # naming the other agent lists nothing, as a filter or in a search
        for query in (f"agent={owner_agent.name}", f"q=agent:{owner_agent.name}"):
            response = self.rogue.get(f"/api/v1/calls?{query}")
            self.assertEqual(response.status_code, 200, response.content)
            self.assertEqual(response.json()["items"], [], query)

    def test_another_agents_event_answers_404(self):
        self.owner.put("/api/v1/tools/transfer", TRANSFER, format="json")
        proposed = proposal("transfer", {"amount": 5}, request_id="r1")
        rejected = make_event("attempt", operation_id="op-none", sent=True, outcome="success")
        self.events(self.owner, proposed, rejected)
        for event in (proposed, rejected):
            path = f"/api/v1/events/{event['event_id']}"
            self.assertEqual(self.owner.get(path).status_code, 200)
            self.assertEqual(self.rogue.get(path).status_code, 404, self.rogue.get(path).content)
