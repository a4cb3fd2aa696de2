"""Reconciliation never weakens what a failure said, and every change of an open item's
reason is audited (issue 31, point 1): through the real ingest API, the reconcile task
against the in-process simulator, and the item page."""

from __future__ import annotations

from unittest import mock

import httpx
from django.test import override_settings
from django.urls import reverse

from callgate import reconcile
from callgate.models import CallEvent, ToolCall
from demo.simulator import SimulatorService, simulator_transport
from reviews import services
from reviews.models import ReviewAudit, ReviewItem
from tests.factories import BaseTestCase, make_event
from tests.reviews.fixtures import CLOSED_409, SIM_ARGS, SIM_TOKEN, follow_up_contract


@override_settings(CALLGATE_RECONCILE_AUTH_HEADER=f"Authorization: Bearer {SIM_TOKEN}")
class ReconcileKeepsTheFailureTestCase(BaseTestCase):
    idempotent = True

    def setUp(self):
        self.service = SimulatorService({"acme": SIM_TOKEN})
        self.service.add_ticket("acme")
        self.sim = httpx.Client(transport=simulator_transport(self.service))
        self.addCleanup(self.sim.close)
        patcher = mock.patch.object(
            reconcile,
            "make_client",
            lambda: httpx.Client(transport=simulator_transport(self.service)),
        )
        patcher.start()
        self.addCleanup(patcher.stop)
        contract = follow_up_contract(idempotent=self.idempotent)
        response = self.api().put("/api/v1/tools/create_follow_up", contract, format="json")
        assert response.status_code in (200, 201), response.content

    def failed_with(self, **attempt) -> ReviewItem:
        """Report the proposal and one attempt of ``op-1`` through the API; its open item."""
        envelopes = [
            make_event(
                "proposed",
                format="plain",
                call={"tool": "create_follow_up", "arguments": SIM_ARGS},
                operation_id="op-1",
            ),
            make_event("attempt", operation_id="op-1", **attempt),
        ]
        with (
            self.captureOnCommitCallbacks(execute=True),
            mock.patch("callgate.tasks.backoff_seconds", return_value=0),
        ):
            response = self.api().post("/api/v1/events", envelopes, format="json")
        assert response.status_code == 200, response.content
        return ReviewItem.objects.get(call__operation_id="op-1", status="open")

    def reconcile_now(self, item: ReviewItem) -> tuple[ReviewItem, ToolCall]:
        with self.captureOnCommitCallbacks(execute=True):
            services.review_item_reconcile(item=item, user=self.alice)
        item.refresh_from_db()
        return item, ToolCall.objects.get(pk=item.call_id)

    def write(self, body: dict) -> None:
        self.sim.post(
            "http://sim/tenants/acme/follow-ups",
            json=body,
            headers={"Idempotency-Key": "op-1", "Authorization": f"Bearer {SIM_TOKEN}"},
        )

    def lookups(self, call: ToolCall) -> list[dict]:
        return list(
            CallEvent.objects.filter(call=call, kind="reconciled").values_list("body", flat=True)
        )


class ConflictStandsTests(ReconcileKeepsTheFailureTestCase):
    def test_it_keeps_a_409_when_the_target_has_no_trace_of_the_operation(self):
        item = self.failed_with(**CLOSED_409)
        assert (item.reason, item.call.state) == ("conflict", ToolCall.State.IN_REVIEW)
        observation = item.call.observation

        item, call = self.reconcile_now(item)

        assert (call.reason, call.route, call.state) == ("conflict", "review", "in_review")
        assert call.observation == observation and "Do not retry" in observation
        assert (item.status, item.reason) == ("open", "conflict")
        assert [b["found"] for b in self.lookups(call)] == [False]  # the look-up is recorded
        assert services.primary_action(item)[0] == "reject"
        assert not item.audit.filter(action=ReviewAudit.Action.REASON_CHANGED).exists()

    def test_it_keeps_a_409_when_the_target_holds_other_content(self):
        self.write({**SIM_ARGS, "assignee_id": "u-9"})
        item = self.failed_with(**CLOSED_409)

        item, call = self.reconcile_now(item)

        assert (call.reason, call.state, item.reason) == ("conflict", "in_review", "conflict")
        assert [(b["found"], b["matches"]) for b in self.lookups(call)] == [(True, False)]

    def test_a_write_found_applied_settles_the_call_whatever_it_said(self):
        self.write(SIM_ARGS)
        item = self.failed_with(**CLOSED_409)

        item, call = self.reconcile_now(item)

        assert (call.reason, call.state) == ("reconciled_applied", ToolCall.State.SUCCEEDED)
        assert item.status == ReviewItem.Status.SETTLED

    def test_it_keeps_a_401_too(self):
        item = self.failed_with(sent=True, outcome="error", http_status=401, error="token expired")
        assert item.reason == "authentication_failed"

        item, call = self.reconcile_now(item)

        assert call.reason == item.reason == "authentication_failed"
        assert call.state == ToolCall.State.IN_REVIEW


class ItemPageAfterReconcileTests(ReconcileKeepsTheFailureTestCase):
    def test_the_reconcile_endpoint_leaves_reject_the_primary_action_of_a_409(self):
        item = self.failed_with(**CLOSED_409)
        self.client.force_login(self.alice)
        url = reverse("reviews:reconcile", args=["acme", item.pk])

        with self.captureOnCommitCallbacks(execute=True):
            response = self.client.post(url)
        assert response.status_code == 302
        page = self.client.get(reverse("reviews:item", args=["acme", item.pk])).content.decode()

        call = ToolCall.objects.get(pk=item.call_id)
        assert (call.reason, call.state) == ("conflict", "in_review")
        assert "the target has no trace of this operation" in page
        assert "The observation says not to retry" in page
        assert "A retry can fix this" not in page
        assert "Retries exhausted" not in page
        assert 'class="button primary" data-key' in page and "Reject…" in page
        assert 'class="primary" data-key="a"' not in page  # approve retry is not the primary


class ReasonChangedTests(ReconcileKeepsTheFailureTestCase):
    """A non-idempotent write whose first look-up could not tell stays in review as
    ``outcome_unknown``; "Reconcile now" then finds it absent: ``reconciled_absent``, still in
    review, and the item's reason follows with an audit row."""

    idempotent = False

    def unknown_in_review(self) -> ReviewItem:
        self.service.fail_next("unavailable", count=50, on="lookup")
        item = self.failed_with(sent=True, outcome="timeout")
        self.service.clear_failures()
        assert (item.reason, item.call.state) == ("outcome_unknown", ToolCall.State.IN_REVIEW)
        return item

    def test_it_audits_the_reason_change_from_to(self):
        item = self.unknown_in_review()

        item, call = self.reconcile_now(item)

        assert (call.reason, call.state) == ("reconciled_absent", ToolCall.State.IN_REVIEW)
        assert (item.status, item.reason) == ("open", "reconciled_absent")
        [row] = item.audit.filter(action=ReviewAudit.Action.REASON_CHANGED)
        assert row.detail == {"from": "outcome_unknown", "to": "reconciled_absent"}
        assert row.actor is None and row.state_before == row.state_after == "open"
        assert row.call_state_after == ToolCall.State.IN_REVIEW

    def test_the_item_page_reads_the_change_in_words(self):
        item = self.unknown_in_review()
        item, _ = self.reconcile_now(item)
        self.client.force_login(self.alice)

        page = self.client.get(reverse("reviews:item", args=["acme", item.pk])).content.decode()

        assert "Review item <strong>reason changed</strong> by callgate: " in page
        assert "Outcome unknown → Reconciled: it did not happen" in page
        assert "outcome_unknown → " not in page

    def test_a_same_reason_verdict_writes_no_row(self):
        item = self.unknown_in_review()
        self.service.fail_next("unavailable", count=50, on="lookup")
        with mock.patch("callgate.tasks.backoff_seconds", return_value=0):
            item, call = self.reconcile_now(item)

        assert call.reason == item.reason == "outcome_unknown"
        assert not item.audit.filter(action=ReviewAudit.Action.REASON_CHANGED).exists()
