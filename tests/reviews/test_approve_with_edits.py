"""Approve with edits (issue 31, point 3): an operator changes the arguments of a pending
call before approving it. The edit is validated against the contract with the gate's
validator, keeps redacted values, gives the call the operation ID its new canonical
arguments derive, is audited from → to, and reaches the agent: the call's answer, the
decision webhook, and the SDK, which executes the edited arguments."""

from __future__ import annotations

import hashlib
import json
from unittest import mock

import httpx
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import override_settings
from django.urls import reverse

import reviews.tasks  # noqa: F401  (registers the delivery task the outbox sends by name)
from callgate.models import Agent, ToolCall, ToolContract
from callgate_sdk import CallgateClient, wire
from callgate_sdk.wire import canonical_arguments, derive_operation_id, edited_arguments
from reviews import services, webhooks
from reviews.models import ReviewAudit, ReviewItem
from tests.factories import BaseTestCase, make_event
from tests.reviews.fixtures import (
    REFUND,
    REFUND_PROPOSED,
    make_contract,
    make_item,
    make_refund_approval,
)

PROPOSED = REFUND_PROPOSED


class EditsTestCase(BaseTestCase):
    def setUp(self):
        self.item = make_refund_approval(self.project, self.agent)
        self.call = self.item.call

    def edit(self, **changes) -> dict:
        return {**PROPOSED, **changes}

    def decide(self, arguments, *, user=None, item=None, decision="approve"):
        return services.review_item_decide(
            item=item or self.item,
            user=user or self.alice,
            decision=decision,
            reason="Refund capped at 80 by policy.",
            arguments=arguments,
        )


class ApproveWithEditsServiceTests(EditsTestCase):
    def test_it_approves_the_edited_arguments_under_the_operation_id_they_derive(self):
        proposed_op = self.call.operation_id
        edited = self.edit(amount=80)
        self.decide(edited)
        call = ToolCall.objects.get(pk=self.call.pk)
        assert call.state == ToolCall.State.ALLOWED and call.decision == "approve"
        assert call.arguments == call.decision_arguments == edited  # card_number stays •••
        expected_op = derive_operation_id(
            request_id=call.request_id,
            tool="issue_refund",
            arguments=edited,
            volatile_arguments=["/nonce"],
        )
        assert call.operation_id == expected_op != proposed_op
        assert call.proposed_operation_id == proposed_op
        assert (
            call.arguments_digest
            == hashlib.sha256(canonical_arguments(edited, ["/nonce"])).hexdigest()
        )
        row = ReviewAudit.objects.get(item=self.item, action=ReviewAudit.Action.EDIT_ARGUMENTS)
        assert row.actor == self.alice
        assert row.detail["arguments"] == [{"path": "$.amount", "from": 120, "to": 80}]
        assert row.detail["operation_id"] == {"from": proposed_op, "to": expected_op}
        assert "$.amount: 120 → 80" in row.reason and expected_op in row.reason
        # the decision row follows the edit, with the operator's reason
        decision_row = ReviewAudit.objects.get(item=self.item, action=ReviewAudit.Action.APPROVE)
        assert decision_row.reason == "Refund capped at 80 by policy."

    def test_it_refuses_arguments_the_contract_refuses_naming_each_path_and_changes_nothing(self):
        before = ToolCall.objects.get(pk=self.call.pk)
        bad = self.edit(ticket_id="1042", amount=0, refund_all=True)
        try:
            self.decide(bad)
            raise AssertionError("accepted arguments the schema refuses")
        except services.ReviewArgumentsRefused as exc:
            paths = {p["path"] for p in exc.problems}
            assert {"$.ticket_id", "$.amount", "$.refund_all"} <= paths, exc.problems
            assert "$.amount" in str(exc)
        after = ToolCall.objects.get(pk=self.call.pk)
        assert (after.operation_id, after.arguments, after.state, after.arguments_digest) == (
            before.operation_id,
            before.arguments,
            before.state,
            before.arguments_digest,
        )
        self.item.refresh_from_db()
        assert self.item.status == ReviewItem.Status.OPEN
        assert not self.item.audit.exclude(action=ReviewAudit.Action.OPENED).exists()

    def test_it_refuses_a_changed_sensitive_value_and_anything_but_an_object(self):
        for arguments, path in (
            (self.edit(card_number="4111111111111111"), "$.card_number"),
            (["not", "an", "object"], "$"),
        ):
            try:
                self.decide(arguments)
                raise AssertionError(f"accepted {arguments!r}")
            except services.ReviewArgumentsRefused as exc:
                assert [p["path"] for p in exc.problems] == [path], exc.problems
        assert ToolCall.objects.get(pk=self.call.pk).state == ToolCall.State.PENDING_APPROVAL

    def test_a_volatile_change_keeps_the_operation_id_and_no_change_is_a_plain_approval(self):
        op = self.call.operation_id
        self.decide(self.edit(nonce="n-2"))
        call = ToolCall.objects.get(pk=self.call.pk)
        assert call.operation_id == op and call.proposed_operation_id == ""
        assert call.decision_arguments == self.edit(nonce="n-2")

        other = make_item(self.project, self.agent, kind="approval", arguments=PROPOSED)
        self.decide(dict(PROPOSED), item=other)
        call = ToolCall.objects.get(pk=other.call_id)
        assert call.state == ToolCall.State.ALLOWED and call.decision_arguments is None
        assert not other.audit.filter(action=ReviewAudit.Action.EDIT_ARGUMENTS).exists()

    def test_only_an_approval_edits_arguments(self):
        try:
            self.decide(self.edit(amount=80), decision="reject")
            raise AssertionError
        except services.ReviewError as exc:
            assert "Only an approval" in str(exc)

    def test_two_operators_editing_at_once_one_wins_the_other_conflicts(self):
        stale = ReviewItem.objects.select_related("call__contract").get(pk=self.item.pk)
        self.decide(self.edit(amount=80))
        try:
            self.decide(self.edit(amount=50), user=self.bob, item=stale)
            raise AssertionError("the second edit won too")
        except services.ReviewConflict as exc:
            assert "alice already decided" in str(exc)
        call = ToolCall.objects.get(pk=self.call.pk)
        assert call.arguments["amount"] == 80
        assert ReviewAudit.objects.filter(item=self.item, action="edit_arguments").count() == 1

    def test_an_escalated_call_is_retried_with_edits(self):
        item = make_item(
            self.project,
            self.agent,
            tool="issue_refund",
            reason="reconciled_absent",
            arguments=PROPOSED,
        )
        assert services.allowed_decisions(item)["approve_retry"] == ""
        self.decide(self.edit(amount=60), item=item, decision="approve_retry")
        call = ToolCall.objects.get(pk=item.call_id)
        assert call.decision == "approve_retry" and call.arguments["amount"] == 60


class AgentToldTests(EditsTestCase):
    def test_the_call_answers_under_both_operation_ids_with_the_edited_arguments(self):
        proposed_op = self.call.operation_id
        self.decide(self.edit(amount=80))
        call = ToolCall.objects.get(pk=self.call.pk)
        for op in (proposed_op, call.operation_id):
            response = self.api().get(f"/api/v1/calls/{op}")
            assert response.status_code == 200, response.content
            body = response.json()
            assert body["operation_id"] == call.operation_id
            assert body["verdict"] == "allow"
            assert body["decision"]["arguments"] == self.edit(amount=80)
            assert body["decision"]["proposed_operation_id"] == proposed_op
        # the call page answers under the proposed ID too, and names it
        self.client.force_login(self.alice)
        page = self.client.get(
            reverse("callgate:call_detail", args=[self.project.slug, proposed_op])
        )
        assert page.status_code == 200
        assert call.operation_id in page.content.decode()
        assert f'proposed as <span class="op">{proposed_op}</span>' in page.content.decode()
        # another project's key still sees nothing under either ID
        assert self.api(self.other_key).get(f"/api/v1/calls/{proposed_op}").status_code == 404

    def test_the_openapi_schema_documents_decision_arguments(self):
        response = self.client.get("/api/v1/schema/")
        if response.status_code == 404:
            response = self.client.get("/api/schema/")
        assert response.status_code == 200
        text = response.content.decode()
        assert "proposed_operation_id" in text and "approved with edits" in text

    @override_settings(CALLGATE_OUTBOUND_ALLOW=["agent.example"])  # reached by name, no DNS
    def test_the_decision_webhook_carries_the_edited_arguments(self):
        Agent.objects.filter(pk=self.agent.pk).update(
            webhook_url="https://agent.example/hooks/callgate", webhook_secret="s3cret"
        )
        received: list[httpx.Request] = []

        def handler(request: httpx.Request) -> httpx.Response:
            received.append(request)
            return httpx.Response(204)

        item = ReviewItem.objects.select_related("call__contract").get(pk=self.item.pk)
        with (
            mock.patch.object(webhooks, "TRANSPORT", httpx.MockTransport(handler)),
            self.captureOnCommitCallbacks(execute=True),
        ):
            self.decide(self.edit(amount=80), item=item)
        assert len(received) == 1
        payload = json.loads(received[0].content)
        call = ToolCall.objects.get(pk=self.call.pk)
        assert payload["operation_id"] == call.operation_id
        assert payload["proposed_operation_id"] == self.call.operation_id
        assert payload["arguments"] == self.edit(amount=80)


class ApproveWithEditsViewTests(EditsTestCase):
    def url(self, name="decide"):
        return reverse(f"reviews:{name}", args=[self.project.slug, self.item.pk])

    def post(self, text, **headers):
        return self.client.post(self.url(), {"decision": "approve", "arguments": text}, **headers)

    def test_the_form_is_prefilled_with_pretty_json(self):
        self.client.force_login(self.alice)
        page = self.client.get(self.url("item"))
        assert "Approve with edits…" in page.content.decode()
        form = self.client.get(self.url("item") + "?confirm=edit").content.decode()
        assert 'name="arguments"' in form
        assert "&quot;amount&quot;: 120" in form  # indented JSON, escaped in the textarea

    def test_bad_json_and_bad_arguments_answer_422_by_path_and_good_ones_approve(self):
        self.client.force_login(self.alice)
        htmx = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "item"}
        response = self.post('{"amount": 80,', **htmx)
        assert response.status_code == 422
        text = response.content.decode()
        assert "not JSON" in text and "line 1" in text
        for deep in ("[" * 100_000, '{"a":' * 100 + "1" + "}" * 100):
            response = self.post(deep, **htmx)
            assert response.status_code == 422, deep[:20]
            assert "nested" in response.content.decode()
        response = self.post(json.dumps(self.edit(amount=9000)), **htmx)
        assert response.status_code == 422
        text = response.content.decode()
        assert "<code>$.amount</code>" in text and "9000" in text  # the typed text is kept
        assert ToolCall.objects.get(pk=self.call.pk).state == ToolCall.State.PENDING_APPROVAL
        response = self.post(json.dumps(self.edit(amount=80)), **htmx)
        assert response.status_code == 200
        call = ToolCall.objects.get(pk=self.call.pk)
        assert "Approved with your edits" in response.content.decode()
        assert call.operation_id in response.content.decode()
        assert call.arguments["amount"] == 80

    def test_a_viewer_cannot_edit(self):
        self.client.force_login(self.victor)
        response = self.post(json.dumps(self.edit(amount=80)))
        assert response.status_code in (403, 404)
        assert ToolCall.objects.get(pk=self.call.pk).state == ToolCall.State.PENDING_APPROVAL


class SdkRunsEditedArgumentsTests(BaseTestCase):
    """The SDK against the real callgate (in-process over ``httpx.WSGITransport``): the
    tool waits for approval, an operator approves with edits while it polls, and the tool
    runs once, with the edited arguments and the agent's own sensitive value."""

    def setUp(self):
        # like Django's test client: keep the test's connection open across requests
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        self.addCleanup(request_started.connect, close_old_connections)
        self.addCleanup(request_finished.connect, close_old_connections)

    def test_the_sdk_executes_the_edited_arguments_under_the_new_operation_id(self):
        executed: list[tuple[dict, str]] = []

        def operator_decides(_seconds: float) -> None:
            item = ReviewItem.objects.select_related("call__contract").filter(
                project=self.project, status=ReviewItem.Status.OPEN
            )
            for open_item in item:
                edited = {**open_item.call.arguments, "amount": 80}
                services.review_item_decide(
                    item=open_item, user=self.alice, decision="approve", arguments=edited
                )

        client = CallgateClient(
            base_url="http://testserver",
            api_key=self.key,
            transport=httpx.WSGITransport(app=WSGIHandler()),
            sleep=operator_decides,
        )
        self.addCleanup(client.close)
        client.register_tool(
            "issue_refund",
            parameters=REFUND,
            effect="write",
            requires_approval=True,
            sensitive_fields=["card_number"],
        )
        proposed = {"ticket_id": "T-7", "amount": 120, "card_number": "4242424242424242"}

        def refund(arguments: dict, operation_id: str) -> dict:
            executed.append((arguments, operation_id))
            return {"refunded": arguments["amount"]}

        result = client.run(
            "plain",
            {"tool": "issue_refund", "arguments": proposed},
            refund,
            request_id="req-sdk-1",
            wait_limit=60,
        )
        assert result.status == "succeeded", result
        call = ToolCall.objects.get(project=self.project, tool_name="issue_refund")
        assert executed == [({**proposed, "amount": 80}, call.operation_id)]
        assert call.proposed_operation_id and call.proposed_operation_id != call.operation_id
        assert result.operation_id == call.operation_id
        assert call.state == ToolCall.State.SUCCEEDED and call.attempts == 1
        assert call.arguments["card_number"] == "•••"  # never stored


def test_edited_arguments_put_back_the_agents_own_redacted_values():
    proposed = {"a": 1, "card": "4242", "items": [{"k": "x", "token": "t0"}], "gone": 2}
    edited = {"a": 5, "card": "•••", "items": [{"k": "y", "token": "•••"}], "new": True}
    assert edited_arguments(edited, proposed) == {
        "a": 5,
        "card": "4242",
        "items": [{"k": "y", "token": "t0"}],
        "new": True,
    }
    # a "•••" where the agent had nothing stays as typed
    assert edited_arguments({"x": "•••"}, {}) == {"x": "•••"}


class ProposedOperationIdTests(BaseTestCase):
    """After an edit renamed the call, the operation ID the agent proposed it under keeps
    naming the edited call everywhere: a repeat of the original proposal (events API or
    gate) is answered as that call with its decision, its events apply to it, and no second
    call or approval item is ever made under the old ID."""

    CONTRACT = {
        "description": "Refund an order to the customer's card",
        "effect": "write",
        "requires_approval": True,
        "parameters": {
            "type": "object",
            "properties": {"order": {"type": "string"}, "amount": {"type": "integer"}},
            "required": ["order", "amount"],
        },
    }
    ORIGINAL = {"order": "O-1", "amount": 120}
    EDITED = {"order": "O-1", "amount": 50}

    def setUp(self):
        self.api_client = self.api()
        response = self.api_client.put("/api/v1/tools/refund", self.CONTRACT, format="json")
        assert response.status_code in (200, 201), response.content
        self.propose(self.ORIGINAL)
        self.item = ReviewItem.objects.get(call__operation_id="op-A-1")
        services.review_item_decide(
            item=self.item, user=self.alice, decision="approve", arguments=self.EDITED
        )
        self.call = ToolCall.objects.get(pk=self.item.call_id)
        assert self.call.proposed_operation_id == "op-A-1" != self.call.operation_id

    def propose(self, arguments: dict) -> None:
        event = make_event(
            "proposed",
            format="plain",
            operation_id="op-A-1",
            request_id="req-1",
            call={"tool": "refund", "arguments": arguments},
        )
        response = self.api_client.post("/api/v1/events", [event], format="json")
        assert response.status_code in (200, 202), response.content

    def answer(self, operation_id: str = "op-A-1") -> dict:
        response = self.api_client.get(f"/api/v1/calls/{operation_id}")
        assert response.status_code == 200, response.content
        return response.json()

    def assert_one_call_and_no_open_item(self) -> None:
        assert list(ToolCall.objects.filter(project=self.project).values_list("pk", flat=True)) == [
            self.call.pk
        ]
        assert not ReviewItem.objects.filter(
            project=self.project, status__in=ReviewItem.OPEN_STATUSES
        ).exists()

    def test_the_original_proposal_sent_again_is_the_edited_call_with_its_decision(self):
        self.propose(self.ORIGINAL)
        self.assert_one_call_and_no_open_item()
        body = self.answer()
        assert body["operation_id"] == self.call.operation_id
        assert body["verdict"] == "allow" and body["reason"] == "approval_granted"
        assert body["decision"]["arguments"] == self.EDITED
        assert body["decision"]["proposed_operation_id"] == "op-A-1"
        call = ToolCall.objects.get(pk=self.call.pk)
        assert call.arguments == self.EDITED  # the repeat never restores what was edited

    def test_the_gate_answers_the_original_proposal_as_the_edited_call(self):
        gate = {
            "format": "plain",
            "call": {"tool": "refund", "arguments": self.ORIGINAL},
            "operation_id": "op-A-1",
            "request_id": "req-1",
        }
        response = self.api_client.post("/api/v1/calls", gate, format="json")
        assert response.status_code == 200, response.content
        body = response.json()
        assert body["operation_id"] == self.call.operation_id and body["verdict"] == "allow"
        assert body["decision"]["arguments"] == self.EDITED
        self.assert_one_call_and_no_open_item()

    def test_events_under_the_original_id_apply_to_the_edited_call(self):
        attempt = make_event("attempt", operation_id="op-A-1", sent=True, outcome="success")
        response = self.api_client.post("/api/v1/events", [attempt], format="json")
        assert response.status_code in (200, 202), response.content
        call = ToolCall.objects.get(pk=self.call.pk)
        assert call.state == ToolCall.State.SUCCEEDED and call.attempts == 1
        self.propose(self.ORIGINAL)  # after the success: the same call, never run twice
        self.assert_one_call_and_no_open_item()
        assert self.call.events.order_by("-pk").first().reason == "duplicate_suppressed"
        assert ToolCall.objects.get(pk=self.call.pk).duplicates_suppressed == 1

    def test_other_arguments_under_the_original_id_are_a_mismatch_of_the_edited_call(self):
        self.propose({"order": "O-1", "amount": 70})
        self.assert_one_call_and_no_open_item()
        last = self.call.events.order_by("-pk").first()
        assert last.reason == "idempotency_mismatch"
        assert ToolCall.objects.get(pk=self.call.pk).arguments == self.EDITED

    def test_an_edit_may_not_take_an_id_another_call_was_proposed_under(self):
        other = make_refund_approval(self.project, self.agent)
        taken = derive_operation_id(
            request_id=other.call.request_id,
            tool="issue_refund",
            arguments={**PROPOSED, "amount": 80},
            volatile_arguments=["/nonce"],
        )
        ToolCall.objects.filter(pk=self.call.pk).update(proposed_operation_id=taken)
        try:
            services.review_item_decide(
                item=other,
                user=self.alice,
                decision="approve",
                arguments={**PROPOSED, "amount": 80},
            )
            raise AssertionError("took an operation ID that names another call")
        except services.ReviewArgumentsRefused as exc:
            assert exc.problems[0]["path"] == "$"
        assert ToolCall.objects.get(pk=other.call_id).operation_id != taken


class HiddenValuesStayInPlaceTests(BaseTestCase):
    """A redacted value ("•••") is put back by the agent at its place, so an edit may not
    move one: an array holding one may not lose, gain or reorder entries, and a "•••" may
    not appear where nothing was hidden. Refused with the path (422 on the page); the SDK
    never puts a value back across changed positions."""

    PROPOSED_REAL = {
        "payments": [
            {"to": "ann", "amount": 1, "card_number": "4111-ANN"},
            {"to": "ben", "amount": 2, "card_number": "4222-BEN"},
        ]
    }
    STORED = {
        "payments": [
            {"to": "ann", "amount": 1, "card_number": "•••"},
            {"to": "ben", "amount": 2, "card_number": "•••"},
        ]
    }
    ANN, BEN = STORED["payments"]

    def setUp(self):
        contract = make_contract(self.project, "pay_many", requires_approval=True)
        contract.parameters = {
            "type": "object",
            "properties": {"payments": {"type": "array", "items": {"type": "object"}}},
        }
        contract.save(update_fields=["parameters"])
        self.item = make_item(
            self.project,
            self.agent,
            kind=ReviewItem.Kind.APPROVAL,
            tool="pay_many",
            contract=contract,
            arguments=self.STORED,
        )

    def post(self, arguments: dict):
        self.client.force_login(self.alice)
        url = reverse("reviews:decide", args=[self.project.slug, self.item.pk])
        return self.client.post(
            url,
            {"decision": "approve", "arguments": json.dumps(arguments)},
            HTTP_HX_REQUEST="true",
            HTTP_HX_TARGET="item",
        )

    def test_removing_adding_or_reordering_an_entry_with_a_hidden_value_is_refused(self):
        for payments in (
            [self.BEN],  # ann removed: ben's entry would get ann's card
            [self.BEN, self.ANN],  # reordered
            [self.ANN, self.BEN, {**self.BEN, "to": "cy"}],  # added
        ):
            response = self.post({"payments": payments})
            assert response.status_code == 422, payments
            text = response.content.decode()
            assert "$.payments" in text and "a hidden value cannot be moved" in text
        call = ToolCall.objects.get(pk=self.item.call_id)
        assert call.arguments == self.STORED and call.decision_arguments is None
        self.item.refresh_from_db()
        assert self.item.is_open

    def test_a_hidden_value_typed_where_nothing_was_hidden_is_refused(self):
        try:
            services.review_item_decide(
                item=make_item(
                    self.project,
                    self.agent,
                    kind=ReviewItem.Kind.APPROVAL,
                    arguments={"ticket_id": "T-1"},
                ),
                user=self.alice,
                decision="approve",
                arguments={"ticket_id": "T-1", "card_number": "•••"},
            )
            raise AssertionError("accepted a hidden value where none was")
        except services.ReviewArgumentsRefused as exc:
            assert {"path": "$.card_number", "msg": wire.HIDDEN_MOVED} in exc.problems

    def test_an_entry_edited_in_place_or_without_its_hidden_field_is_accepted(self):
        edited = {
            "payments": [{**self.ANN, "amount": 5}, {"to": "ben", "amount": 2}],
        }
        response = self.post(edited)
        assert response.status_code == 200, response.content
        call = ToolCall.objects.get(pk=self.item.call_id)
        assert call.decision_arguments == edited
        assert edited_arguments(call.decision_arguments, self.PROPOSED_REAL) == {
            "payments": [
                {"to": "ann", "amount": 5, "card_number": "4111-ANN"},
                {"to": "ben", "amount": 2},
            ]
        }

    def test_the_sdk_never_puts_a_hidden_value_back_across_changed_positions(self):
        for payments in ([self.BEN], [self.BEN, self.ANN], [self.ANN, self.BEN, self.BEN]):
            try:
                edited_arguments({"payments": payments}, self.PROPOSED_REAL)
                raise AssertionError(f"restored {payments!r}")
            except wire.HiddenValueMoved as exc:
                assert exc.paths == ["$.payments"]
        nested = {"a": {"rows": [{"k": 1, "token": "•••"}, {"k": 2}]}}
        assert wire.hidden_moves(nested, {"a": {"rows": [{"k": 2}, {"k": 1, "token": "t"}]}}) == [
            "$.a.rows"
        ]


class UnreadableArgumentsTests(EditsTestCase):
    """Typed arguments that strict JSON cannot say or PostgreSQL cannot store answer 422
    naming the problem, and nothing changes (they were a 500: a DataError, or Python's
    integer digit limit)."""

    BAD = (
        ('{"ticket_id": "T-1", "amount": NaN}', "NaN is not JSON"),
        ('{"ticket_id": "T-1", "amount": Infinity}', "Infinity is not JSON"),
        ('{"ticket_id": "T-1", "amount": -Infinity}', "-Infinity is not JSON"),
        ('{"ticket_id": "T-1", "amount": 1e400}', "too large"),
        ('{"ticket_id": "T-1", "amount": ' + "9" * 5000 + "}", "4,300 digits"),
        ('{"ticket_id": "T-1\\u0000", "amount": 5}', "NUL"),
        ('{"ticket_id": "T-1\\ud800", "amount": 5}', "unpaired surrogate"),
        ('{"ticket_id": "T-1", "amount": 5, "n\\u0000": 1}', "the key must not contain a NUL"),
    )

    def test_each_answers_422_naming_the_problem_and_changes_nothing(self):
        self.client.force_login(self.alice)
        url = reverse("reviews:decide", args=[self.project.slug, self.item.pk])
        before = ToolCall.objects.get(pk=self.call.pk)
        for text, problem in self.BAD:
            response = self.client.post(
                url,
                {"decision": "approve", "arguments": text},
                HTTP_HX_REQUEST="true",
                HTTP_HX_TARGET="item",
            )
            assert response.status_code == 422, (text[:50], response.status_code)
            assert problem in response.content.decode(), text[:50]
            # without htmx: back to the page with the problem (a redirect, never a 500)
            response = self.client.post(url, {"decision": "approve", "arguments": text})
            assert response.status_code == 302, (text[:50], response.status_code)
        after = ToolCall.objects.get(pk=self.call.pk)
        assert (after.state, after.arguments, after.operation_id) == (
            before.state,
            before.arguments,
            before.operation_id,
        )
        self.item.refresh_from_db()
        assert self.item.is_open

    def test_the_service_refuses_what_cannot_be_stored_from_any_caller(self):
        for arguments, path in (
            (self.edit(amount=float("nan")), "$.amount"),
            (self.edit(ticket_id="T-1\x00"), "$.ticket_id"),
        ):
            try:
                self.decide(arguments)
                raise AssertionError(f"accepted {arguments!r}")
            except services.ReviewArgumentsRefused as exc:
                assert [p["path"] for p in exc.problems] == [path], exc.problems


class RetryEditedThenReproposedTests(BaseTestCase):
    def test_a_retry_approved_with_edits_is_the_call_the_original_proposal_names(self):
        api = self.api()
        contract = {**ProposedOperationIdTests.CONTRACT, "requires_approval": False}
        assert api.put("/api/v1/tools/refund", contract, format="json").status_code in (200, 201)
        item = make_item(
            self.project,
            self.agent,
            tool="refund",
            contract=ToolContract.objects.get(project=self.project, name="refund"),
            reason="reconciled_absent",
            arguments=ProposedOperationIdTests.ORIGINAL,
        )
        original = item.call.operation_id
        services.review_item_decide(
            item=item,
            user=self.alice,
            decision="approve_retry",
            arguments=ProposedOperationIdTests.EDITED,
        )
        call = ToolCall.objects.get(pk=item.call_id)
        assert call.proposed_operation_id == original != call.operation_id
        ToolCall.objects.filter(pk=call.pk).update(
            proposed_arguments_digest=hashlib.sha256(
                canonical_arguments(ProposedOperationIdTests.ORIGINAL, [])
            ).hexdigest()
        )  # make_item stores no digest; the gate's is of the canonical arguments
        event = make_event(
            "proposed",
            format="plain",
            operation_id=original,
            request_id=call.request_id,
            call={"tool": "refund", "arguments": ProposedOperationIdTests.ORIGINAL},
        )
        assert api.post("/api/v1/events", [event], format="json").status_code in (200, 202)
        assert ToolCall.objects.filter(project=self.project).count() == 1
        body = api.get(f"/api/v1/calls/{original}").json()
        assert body["operation_id"] == call.operation_id
        assert body["decision"]["arguments"] == ProposedOperationIdTests.EDITED
        assert ToolCall.objects.get(pk=call.pk).arguments == ProposedOperationIdTests.EDITED
