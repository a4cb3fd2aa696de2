from __future__ import annotations

from datetime import timedelta

from django.test import override_settings
from django.utils import timezone

from callgate import escalation
from callgate.auth import api_key_issue
from callgate.models import CallEvent, ToolCall
from reviews import services
from reviews.models import ReviewAudit, ReviewItem
from reviews.selectors import QueueFilters, annotate_rows, queue_items
from tests.factories import BaseTestCase, make_event
from tests.reviews.fixtures import add_reconciled, make_call, make_contract, make_item


class ReviewItemOpenTests(BaseTestCase):
    def test_it_opens_one_item_per_call_with_an_audit_row(self):
        call = make_call(self.project, self.agent)
        first = escalation.review_item_open(call=call, kind="escalation")
        second = escalation.review_item_open(call=call, kind="escalation")
        assert first.pk == second.pk
        assert first.priority == 1
        assert list(first.audit.values_list("action", flat=True)) == ["opened"]

    def test_it_settles_open_items_with_an_audit_row(self):
        item = make_item(self.project, self.agent)
        assert escalation.review_items_settle(call=item.call, note="late receipt") == 1
        item.refresh_from_db()
        assert item.status == "settled"
        row = item.audit.last()
        assert (row.action, row.state_before, row.state_after, row.reason) == (
            "settled",
            "open",
            "settled",
            "late receipt",
        )


class ReviewClaimTests(BaseTestCase):
    def test_it_claims_and_a_second_operator_conflicts(self):
        item = make_item(self.project, self.agent)
        services.review_item_claim(item=item, user=self.alice)
        stale = ReviewItem.objects.get(pk=item.pk)
        try:
            services.review_item_claim(item=stale, user=self.bob)
            raise AssertionError("bob must not win")
        except services.ReviewConflict as exc:
            assert "alice claimed" in str(exc)
            assert exc.item.assignee == self.alice

    @override_settings(CALLGATE_REVIEW_CLAIM_LEASE=60)
    def test_it_lets_a_lapsed_claim_be_taken_over(self):
        item = make_item(self.project, self.agent)
        services.review_item_claim(item=item, user=self.alice)
        ReviewItem.objects.filter(pk=item.pk).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        item.refresh_from_db()
        assert item.current_assignee_id() is None
        services.review_item_claim(item=item, user=self.bob)
        item.refresh_from_db()
        assert item.assignee == self.bob

    def test_it_lapses_idle_claims_periodically(self):
        item = make_item(self.project, self.agent)
        services.review_item_claim(item=item, user=self.alice)
        ReviewItem.objects.filter(pk=item.pk).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        assert services.review_leases_lapse() == 1
        item.refresh_from_db()
        assert (item.status, item.assignee) == ("open", None)
        assert item.audit.last().action == "lease_lapsed"

    def test_it_releases_and_assigns(self):
        item = make_item(self.project, self.agent)
        services.review_item_claim(item=item, user=self.alice)
        services.review_item_release(item=item, user=self.alice)
        item.refresh_from_db()
        assert item.status == "open"
        services.review_item_assign(item=item, user=self.alice, assignee=self.bob)
        item.refresh_from_db()
        assert (item.status, item.assignee) == ("claimed", self.bob)
        assert item.lease_active()

    def test_it_refuses_to_assign_a_viewer(self):
        item = make_item(self.project, self.agent)
        try:
            services.review_item_assign(item=item, user=self.alice, assignee=self.victor)
            raise AssertionError
        except services.ReviewError:
            pass


class ReviewDecisionTests(BaseTestCase):
    def test_it_rejects_with_a_reason_that_becomes_the_observation(self):
        item = make_item(self.project, self.agent, reason="retry_exhausted")
        services.review_item_decide(
            item=item, user=self.alice, decision="reject", reason="Customer cancelled."
        )
        item.refresh_from_db()
        call = ToolCall.objects.get(pk=item.call_id)
        assert (item.status, item.resolution, item.resolved_by) == (
            "resolved",
            "reject",
            self.alice,
        )
        assert call.decision == "reject" and call.decision_reason == "Customer cancelled."
        assert call.state in {"failed", "rejected"} and call.route == "stop"
        assert call.reason == "retry_exhausted"  # kept beside the decision
        row = item.audit.last()
        assert (row.action, row.actor, row.state_before, row.state_after, row.reason) == (
            "reject",
            self.alice,
            "open",
            "resolved",
            "Customer cancelled.",
        )
        assert row.call_state_before == "in_review"
        assert CallEvent.objects.filter(call=call, kind="decision", source="operator").exists()

    def test_it_needs_a_reason_to_reject(self):
        item = make_item(self.project, self.agent)
        try:
            services.review_item_decide(item=item, user=self.alice, decision="reject", reason=" ")
            raise AssertionError
        except services.ReviewError:
            pass
        item.refresh_from_db()
        assert item.status == "open"

    def test_it_blocks_approve_retry_of_an_unknown_write_without_reconciliation(self):
        item = make_item(self.project, self.agent, reason="outcome_unknown")
        try:
            services.review_item_decide(item=item, user=self.alice, decision="approve_retry")
            raise AssertionError
        except services.ReviewError as exc:
            assert "reconciliation that found nothing" in str(exc)
        assert ToolCall.objects.get(pk=item.call_id).state == "in_review"

    def test_it_allows_approve_retry_after_a_reconciliation_found_nothing(self):
        item = make_item(self.project, self.agent, reason="outcome_unknown")
        add_reconciled(item.call, found=False)
        services.review_item_decide(item=item, user=self.alice, decision="approve_retry")
        call = ToolCall.objects.get(pk=item.call_id)
        assert call.decision == "approve_retry" and call.route == "retry"
        assert not item.audit.last().override

    def test_it_does_not_count_a_reconciliation_that_found_the_write(self):
        item = make_item(self.project, self.agent, reason="reconcile_mismatch")
        add_reconciled(item.call, found=True, matches=False)
        assert services.approve_retry_guard(item.call)

    def test_it_allows_an_override_with_a_reason_and_marks_it(self):
        item = make_item(
            self.project,
            self.agent,
            reason="not_reconcilable",
            contract=make_contract(self.project, "send_invoice", reconcile="none"),
            tool="send_invoice",
        )
        try:
            services.review_item_decide(
                item=item, user=self.alice, decision="approve_retry", override=True
            )
            raise AssertionError("an override needs a reason")
        except services.ReviewError:
            pass
        services.review_item_decide(
            item=item,
            user=self.alice,
            decision="approve_retry",
            override=True,
            reason="Checked the mailbox: nothing was sent.",
        )
        row = item.audit.last()
        assert row.override and row.action == "approve_retry"

    def test_it_does_not_guard_reads(self):
        contract = make_contract(self.project, "get_weather", effect="read", reconcile="none")
        item = make_item(
            self.project,
            self.agent,
            reason="retry_exhausted",
            contract=contract,
            tool="get_weather",
        )
        assert services.approve_retry_guard(item.call) == ""

    def test_it_marks_applied_with_a_receipt(self):
        item = make_item(self.project, self.agent)
        services.review_item_decide(
            item=item, user=self.alice, decision="mark_applied", reason="Ticket exists."
        )
        call = ToolCall.objects.get(pk=item.call_id)
        assert (
            call.receipt is not None
            and call.reason == "reconciled_applied"
            and call.state == "succeeded"
        )

    def test_it_approves_an_approval_request(self):
        item = make_item(self.project, self.agent, kind="approval")
        assert services.allowed_decisions(item)["approve_retry"]
        services.review_item_decide(item=item, user=self.alice, decision="approve")
        call = ToolCall.objects.get(pk=item.call_id)
        assert call.state == "allowed" and call.decision == "approve"

    def test_it_refuses_a_decision_the_call_state_does_not_allow_and_changes_nothing(self):
        item = make_item(self.project, self.agent)
        ToolCall.objects.filter(pk=item.call_id).update(state="succeeded")
        item.call.refresh_from_db()
        try:
            services.review_item_decide(
                item=item, user=self.alice, decision="mark_failed", reason="x"
            )
            raise AssertionError
        except services.ReviewError:
            pass
        item.refresh_from_db()
        assert item.status == "open"
        assert item.audit.count() == 1

    def test_it_conflicts_when_the_item_was_decided_meanwhile(self):
        item = make_item(self.project, self.agent)
        stale = ReviewItem.objects.select_related("call").get(pk=item.pk)
        services.review_item_decide(item=item, user=self.alice, decision="reject", reason="No.")
        try:
            services.review_item_decide(
                item=stale, user=self.bob, decision="mark_failed", reason="Broken."
            )
            raise AssertionError
        except services.ReviewConflict as exc:
            assert "alice already decided" in str(exc)
        assert ToolCall.objects.get(pk=item.call_id).decision == "reject"


class ApprovalTimeoutTests(BaseTestCase):
    def test_it_extends_the_timeout_on_item_and_call(self):
        item = make_item(self.project, self.agent, kind="approval")
        before = item.approval_expires_at
        services.review_item_extend(item=item, user=self.alice, seconds=600)
        item.refresh_from_db()
        assert item.approval_expires_at == before + timedelta(seconds=600)
        assert ToolCall.objects.get(pk=item.call_id).approval_expires_at == item.approval_expires_at
        assert item.audit.last().action == "extend"

    def test_it_expires_overdue_approvals_never_approving(self):
        item = make_item(
            self.project, self.agent, kind="approval", approval_in=timedelta(seconds=-5)
        )
        ReviewItem.objects.filter(pk=item.pk).update(
            approval_expires_at=timezone.now() - timedelta(seconds=5)
        )
        assert services.review_items_expire() == 1
        item.refresh_from_db()
        call = ToolCall.objects.get(pk=item.call_id)
        assert item.status == "expired"
        assert call.state != "allowed" and call.reason == "approval_expired"
        assert item.audit.last().action == "expired"


class ReviewAuditTests(BaseTestCase):
    def test_it_is_append_only(self):
        item = make_item(self.project, self.agent)
        row = item.audit.get()
        row.reason = "changed"
        for attempt in (
            lambda: row.save(),
            lambda: row.delete(),
            lambda: ReviewAudit.objects.update(reason="x"),
            lambda: ReviewAudit.objects.filter(pk=row.pk).delete(),
        ):
            try:
                attempt()
                raise AssertionError("must refuse")
            except TypeError:
                pass
        assert ReviewAudit.objects.get(pk=row.pk).reason == "outcome_unknown"

    def test_it_records_comments(self):
        item = make_item(self.project, self.agent)
        services.review_item_comment(item=item, user=self.bob, text="Looking at the CRM.")
        assert item.audit.filter(action="comment", actor=self.bob).count() == 1


class ReviewBulkTests(BaseTestCase):
    def test_it_rejects_in_bulk_and_counts_conflicts(self):
        items = [make_item(self.project, self.agent) for _ in range(3)]
        services.review_item_decide(item=items[0], user=self.bob, decision="reject", reason="No.")
        result = services.review_items_bulk(
            project=self.project,
            user=self.alice,
            action="reject",
            items=ReviewItem.objects.filter(pk__in=[i.pk for i in items]),
            reason="Burst of duplicates.",
        )
        # items[0] is closed: the CAS finds nothing to change (conflict)
        assert (result.done, result.conflicts) == (2, 1)

    def test_a_bulk_claim_is_set_based_and_counts_conflicts(self):
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        def claim_all() -> tuple[services.BulkResult, int]:
            with CaptureQueriesContext(connection) as queries:
                result = services.review_items_bulk(
                    project=self.project,
                    user=self.alice,
                    action="claim",
                    items=queue_items(
                        project=self.project, filters=QueueFilters(), user=self.alice
                    ),
                )
            return result, len(queries)

        held = make_item(self.project, self.agent)
        services.review_item_claim(item=held, user=self.bob)  # a live claim of someone else
        make_item(self.project, self.agent)
        small, small_count = claim_all()
        assert (small.done, small.conflicts) == (1, 1)
        for _ in range(12):
            make_item(self.project, self.agent)
        large, large_count = claim_all()  # renews alice's own claim, takes the new ones
        assert (large.done, large.conflicts) == (13, 1)
        assert large_count == small_count
        assert ReviewItem.objects.filter(assignee=self.alice, status="claimed").count() == 13
        held.refresh_from_db()
        assert held.assignee_id == self.bob.pk
        assert ReviewAudit.objects.filter(action="claim", actor=self.alice).count() == 14

    def test_a_bulk_assign_to_a_non_operator_is_refused(self):
        item = make_item(self.project, self.agent)
        with self.assertRaisesMessage(services.ReviewError, "only be assigned to operators"):
            services.review_items_bulk(
                project=self.project,
                user=self.alice,
                action="assign",
                items=ReviewItem.objects.filter(pk=item.pk),
                assignee=self.victor,
            )

    def test_it_ignores_items_of_another_project(self):
        foreign = make_item(self.other_project, self.other_agent)
        result = services.review_items_bulk(
            project=self.project,
            user=self.alice,
            action="reject",
            items=ReviewItem.objects.filter(pk=foreign.pk),
            reason="x",
        )
        assert result.total == 0
        foreign.refresh_from_db()
        assert foreign.status == "open"


class ReviewBulkOpenSettleTests(BaseTestCase):
    def test_it_opens_many_items_in_a_fixed_number_of_queries(self):
        calls = [make_call(self.project, self.agent) for _ in range(6)]
        escalation.review_item_open(call=calls[0], kind="escalation")
        with self.assertNumQueries(5):  # existing, savepoint, items, audit rows, release
            items = escalation.review_items_open_bulk(calls=[(c, "escalation") for c in calls])
        assert len(items) == 6 and all(i.pk for i in items)
        assert ReviewAudit.objects.filter(action="opened").count() == 6

    def test_it_settles_many_items_and_expires_approvals(self):
        escalated = make_item(self.project, self.agent)
        approval = make_item(self.project, self.agent, kind="approval")
        ToolCall.objects.filter(pk=approval.call_id).update(
            reason="approval_expired", state="failed"
        )
        approval.call.refresh_from_db()
        closed = escalation.review_items_settle_bulk(
            calls=[escalated.call, approval.call],
            note_by_call={
                escalated.call_id: "late receipt",
                approval.call_id: "approval timed out",
            },
        )
        assert closed == 2
        escalated.refresh_from_db()
        approval.refresh_from_db()
        assert (escalated.status, escalated.resolution_reason) == ("settled", "late receipt")
        assert approval.status == "expired"
        assert list(
            ReviewAudit.objects.filter(action__in=["settled", "expired"])
            .order_by("item_id")
            .values_list("action", flat=True)
        ) == ["settled", "expired"]


class ReviewHousekeepingTaskTests(BaseTestCase):
    def test_it_lapses_claims_and_expires_approvals(self):
        from reviews.tasks import review_housekeeping

        claimed = make_item(self.project, self.agent)
        services.review_item_claim(item=claimed, user=self.alice)
        ReviewItem.objects.filter(pk=claimed.pk).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        approval = make_item(self.project, self.agent, kind="approval")
        ReviewItem.objects.filter(pk=approval.pk).update(
            approval_expires_at=timezone.now() - timedelta(seconds=1)
        )
        assert review_housekeeping.delay().get() == {"lapsed": 1, "expired": 1}
        assert review_housekeeping.delay().get() == {"lapsed": 0, "expired": 0}  # idempotent


class ApproveRetryGuardFreshnessTests(BaseTestCase):
    """Only a reconciliation newer than the call's latest attempt proves that attempt absent."""

    def put_unreconcilable_write(self) -> None:
        response = self.api().put(
            "/api/v1/tools/send_invoice",
            {
                "description": "Send an invoice to a customer.",
                "effect": "write",
                "idempotent": False,
                "reconcilable": False,
                "max_attempts": 3,
                "max_reasks": 1,
                "parameters": {"type": "object", "properties": {"invoice_id": {"type": "string"}}},
            },
            format="json",
        )
        assert response.status_code in (200, 201)

    def post_event(self, type_: str, **fields) -> dict:
        # a reconciliation settles only from a trusted source here: a key with can_decide
        key = (
            api_key_issue(agent=self.agent, can_decide=True).plain
            if type_ == "reconciled"
            else None
        )
        response = self.api(key).post(
            "/api/v1/events", make_event(type_, operation_id="op-guard-1", **fields), format="json"
        )
        assert response.status_code == 200, response.json()
        return response.json()["results"][0]

    def test_it_requires_an_override_again_after_the_approved_retry_times_out(self):
        self.put_unreconcilable_write()
        gate = self.api().post(
            "/api/v1/calls",
            {
                "format": "plain",
                "operation_id": "op-guard-1",
                "call": {"tool": "send_invoice", "arguments": {"invoice_id": "I-1"}},
            },
            format="json",
        )
        assert gate.json()["verdict"] == "allow"
        self.post_event(
            "attempt", sent=True, outcome="timeout", http_status=None, error="timed out"
        )
        self.post_event("reconciled", found=False, matches=False)
        first = ReviewItem.objects.get(call__operation_id="op-guard-1", status="open")
        services.review_item_decide(item=first, user=self.alice, decision="approve_retry")

        self.post_event(
            "attempt", sent=True, outcome="timeout", http_status=None, error="timed out again"
        )
        second = ReviewItem.objects.get(call__operation_id="op-guard-1", status="open")
        assert second.pk != first.pk and second.call.reason in services.UNKNOWN_OUTCOME_REASONS
        assert services.reconciled_absent(second.call) is False
        assert "reconciliation that found nothing" in services.approve_retry_guard(second.call)
        row = queue_items(project=self.project, filters=QueueFilters(), user=self.alice).get(
            pk=second.pk
        )
        annotate_rows(project=self.project, rows=[row])
        assert row.has_absent is False
        assert services.queue_approve_action(row)[1]
        try:
            services.review_item_decide(item=second, user=self.alice, decision="approve_retry")
            raise AssertionError("the old reconciliation must not count for the new attempt")
        except services.ReviewError as exc:
            assert "reconciliation that found nothing" in str(exc)
        assert ToolCall.objects.get(pk=second.call_id).state == "in_review"

        self.post_event("reconciled", found=False, matches=False)  # a fresh look-up counts again
        second.call.refresh_from_db()
        assert services.reconciled_absent(second.call) is True
        row = queue_items(project=self.project, filters=QueueFilters(), user=self.alice).get(
            pk=second.pk
        )
        annotate_rows(project=self.project, rows=[row])
        assert row.has_absent is True

    def test_it_orders_events_received_at_the_same_instant_by_id(self):
        item = make_item(self.project, self.agent, reason="outcome_unknown")
        at = timezone.now()

        def add(kind: str, body: dict) -> CallEvent:
            return CallEvent.objects.create(
                project_id=item.project_id,
                call=item.call,
                kind=kind,
                body=body,
                occurred_at=at,
                received_at=at,
            )

        add(CallEvent.Kind.ATTEMPT, {"type": "attempt", "outcome": "timeout", "sent": True})
        add(CallEvent.Kind.RECONCILED, {"type": "reconciled", "found": False, "matches": False})
        assert services.reconciled_absent(item.call) is True
        add(CallEvent.Kind.ATTEMPT, {"type": "attempt", "outcome": "timeout", "sent": True})
        assert services.reconciled_absent(item.call) is False
