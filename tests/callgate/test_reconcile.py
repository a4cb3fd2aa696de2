"""Reconciliation: ``reconcile_lookup`` against the simulator (all four outcomes, the auth
header, timeouts), and the ``reconcile_call`` task and the periodic jobs moving calls."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import httpx
from django.test import SimpleTestCase, override_settings
from django.utils import timezone

from callgate import reconcile
from callgate.models import CallEvent, ToolCall, ToolContract
from callgate.reconcile import (
    ABSENT,
    APPLIED,
    MISMATCH,
    UNKNOWN,
    argument_differences,
    reconcile_lookup,
)
from demo.simulator import SimulatorService, simulator_transport
from reviews.models import ReviewItem
from tests.factories import BaseTestCase

TOKEN = "acme-secret"
LOOKUP_URL = "http://sim/tenants/acme/operations/{operation_id}"
ARGS = {"ticket_id": "T-1", "assignee_id": "u-7", "due_at": "2026-12-01T09:00:00Z"}


def http_contract(**fields) -> ToolContract:
    values = {
        "name": "create_follow_up",
        "version": 1,
        "parameters": {"type": "object"},
        "effect": "write",
        "idempotent": True,
        "reconcile_method": "http",
        "reconcile_url": LOOKUP_URL,
        **fields,
    }
    return ToolContract(**values)


class ReconcileLookupTestCase(SimpleTestCase):
    def setUp(self):
        self.service = SimulatorService({"acme": TOKEN, "globex": "globex-secret"})
        self.ticket = self.service.add_ticket("acme")
        self.client = httpx.Client(transport=simulator_transport(self.service))
        self.contract = http_contract()

    def tearDown(self):
        self.client.close()

    def write(self, operation_id: str, body: dict = ARGS) -> None:
        response = self.client.post(
            "http://sim/tenants/acme/follow-ups",
            json=body,
            headers={"Idempotency-Key": operation_id, "Authorization": f"Bearer {TOKEN}"},
        )
        assert response.status_code == 201

    def lookup(self, operation_id: str, arguments=ARGS):
        return reconcile_lookup(
            contract=self.contract,
            operation_id=operation_id,
            arguments=arguments,
            client=self.client,
        )


@override_settings(
    CALLGATE_RECONCILE_AUTH_HEADER=f"Authorization: Bearer {TOKEN}", CALLGATE_RECONCILE_TIMEOUT=3
)
class ReconcileLookupTests(ReconcileLookupTestCase):
    def test_it_finds_an_applied_write_with_matching_arguments(self):
        self.write("op-1")
        result = self.lookup("op-1")

        assert result.outcome == APPLIED
        assert (result.found, result.matches) == (True, True)
        assert result.receipt["id"] == "F-1"
        assert result.as_detail()["receipt"]["id"] == "F-1"

    def test_it_reports_a_record_with_different_content(self):
        self.write("op-1", {**ARGS, "assignee_id": "u-8"})
        result = self.lookup("op-1")

        assert result.outcome == MISMATCH
        assert (result.found, result.matches) == (True, False)
        assert result.differences == ["$.assignee_id"]

    def test_it_reports_an_absent_operation(self):
        result = self.lookup("never-sent")

        assert result.outcome == ABSENT
        assert (result.found, result.matches) == (False, False)

    def test_it_finds_the_write_after_a_timeout_after_write(self):
        self.service.fail_next("timeout_after_write")
        with self.assertRaises(httpx.ReadTimeout):
            self.write("op-1")

        assert self.lookup("op-1").outcome == APPLIED

    def test_it_finds_nothing_after_a_timeout_without_write(self):
        self.service.fail_next("timeout_no_write")
        with self.assertRaises(httpx.ReadTimeout):
            self.write("op-1")

        assert self.lookup("op-1").outcome == ABSENT

    def test_it_quotes_the_operation_id_into_one_path_segment(self):
        self.write("conv/42?x=1#frag")

        assert self.lookup("conv/42?x=1#frag").outcome == APPLIED

    def test_it_ignores_redacted_argument_values(self):
        self.write("op-1")

        assert self.lookup("op-1", {**ARGS, "assignee_id": "•••"}).outcome == APPLIED
        assert (
            self.lookup("op-1", {**ARGS, "due_at": "•••", "assignee_id": "u-9"}).outcome == MISMATCH
        )

    def test_it_sends_the_configured_auth_header_and_timeout(self):
        seen = []

        def handler(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return httpx.Response(404, json={"error": "no"})

        with httpx.Client(transport=httpx.MockTransport(handler)) as client:
            result = reconcile_lookup(
                contract=self.contract, operation_id="a b", arguments=ARGS, client=client
            )

        assert result.outcome == ABSENT
        assert seen[0].headers["Authorization"] == f"Bearer {TOKEN}"
        assert seen[0].url.raw_path == b"/tenants/acme/operations/a%20b"
        assert seen[0].extensions["timeout"]["read"] == 3

    def test_it_never_sends_the_credential_to_an_origin_that_is_not_allowed(self):
        seen = []

        def handler(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return httpx.Response(404, json={"error": "no"})

        elsewhere = ToolContract(
            name="steal",
            reconcile_method="http",
            reconcile_url="http://attacker.example/steal/{operation_id}",
        )
        with httpx.Client(transport=httpx.MockTransport(handler)) as client:
            reconcile_lookup(contract=elsewhere, operation_id="op-1", arguments=ARGS, client=client)
        assert "Authorization" not in seen[0].headers

    def test_it_cannot_tell_on_a_timeout_and_calls_it_transient(self):
        self.service.fail_next("timeout_no_write", on="lookup")
        result = self.lookup("op-1")

        assert result.outcome == UNKNOWN
        assert result.transient
        assert "timed out" in result.detail

    def test_it_cannot_tell_on_a_refused_connection(self):
        self.service.fail_next("connect_error", on="lookup")
        result = self.lookup("op-1")

        assert (result.outcome, result.transient) == (UNKNOWN, True)

    def test_it_cannot_tell_on_5xx_and_429(self):
        for mode, status in [("unavailable", 503), ("server_error", 500), ("rate_limited", 429)]:
            self.service.fail_next(mode, on="lookup")
            result = self.lookup("op-1")
            assert (result.outcome, result.http_status, result.transient) == (
                UNKNOWN,
                status,
                True,
            ), mode

    def test_it_cannot_tell_when_credentials_are_rejected_and_does_not_retry(self):
        self.service.fail_next("unauthorized", on="lookup")
        result = self.lookup("op-1")

        assert (result.outcome, result.http_status, result.transient) == (UNKNOWN, 401, False)

    def test_it_cannot_tell_from_a_body_that_is_not_json(self):
        self.service.fail_next("garbage", on="lookup")
        result = self.lookup("op-1")

        assert (result.outcome, result.transient) == (UNKNOWN, False)
        assert "not JSON" in result.detail

    def test_it_refuses_a_contract_without_http_lookup(self):
        with self.assertRaises(ValueError):
            reconcile_lookup(
                contract=http_contract(reconcile_method="agent"), operation_id="x", arguments={}
            )


class LookupOriginTests(SimpleTestCase):
    """Look-ups over the network (``make_client``) never reach callgate's own network."""

    def lookup(self, url: str):
        contract = ToolContract(name="t", reconcile_method="http", reconcile_url=url)
        return reconcile_lookup(contract=contract, operation_id="op-1", arguments=ARGS)

    def test_it_refuses_loopback_private_and_link_local_addresses_without_connecting(self):
        for url in (
            "http://127.0.0.1:9/ops/{operation_id}",
            "http://10.1.2.3/ops/{operation_id}",
            "http://169.254.169.254/latest/meta-data/{operation_id}",
            "http://[::1]:9/{operation_id}",
            "http://localhost:9/ops/{operation_id}",
        ):
            result = self.lookup(url)
            assert (result.outcome, result.transient) == (UNKNOWN, False), url
            assert (
                "non-public address" in result.detail and "CALLGATE_OUTBOUND_ALLOW" in result.detail
            )

    @override_settings(CALLGATE_RECONCILE_ORIGINS=["http://127.0.0.1:9"])
    def test_a_listed_origin_is_reached_and_nothing_else(self):
        reached = self.lookup("http://127.0.0.1:9/ops/{operation_id}")  # nothing listens on port 9
        assert (reached.outcome, reached.transient) == (UNKNOWN, True)
        assert reached.detail.startswith("look-up failed")
        other = self.lookup("https://tickets.example.com/ops/{operation_id}")
        assert (other.outcome, other.transient) == (UNKNOWN, False)
        assert "not in CALLGATE_RECONCILE_ORIGINS" in other.detail


class ReconcileLookupAuthTests(ReconcileLookupTestCase):
    @override_settings(CALLGATE_RECONCILE_AUTH_HEADER="")
    def test_it_cannot_tell_without_credentials(self):
        self.write("op-1")
        result = self.lookup("op-1")

        assert (result.outcome, result.http_status) == (UNKNOWN, 401)

    @override_settings(CALLGATE_RECONCILE_AUTH_HEADER="no colon here")
    def test_it_rejects_a_malformed_auth_setting(self):
        with self.assertRaises(ValueError):
            self.lookup("op-1")


class ArgumentDifferencesTests(SimpleTestCase):
    def test_it_compares_types_strictly_and_keys_both_ways(self):
        assert argument_differences({"n": 1}, {"n": 1.0}) == ["$.n"]
        assert argument_differences({"n": 1}, {"n": True}) == ["$.n"]
        assert argument_differences({"a": 1}, {"a": 1, "b": 2}) == ["$.b"]
        assert argument_differences({"a": [1, {"s": "•••"}]}, {"a": [1, {"s": "secret"}]}) == []
        assert argument_differences({"a": [1]}, {"a": [1, 2]}) == ["$.a"]


# --- the task (needs the lead's lifecycle services) ---------------------------------------
@override_settings(CALLGATE_RECONCILE_AUTH_HEADER=f"Authorization: Bearer {TOKEN}")
class ReconcileTaskTests(BaseTestCase):
    def setUp(self):
        self.service = SimulatorService({"acme": TOKEN})
        self.service.add_ticket("acme")
        self.sim_client = httpx.Client(transport=simulator_transport(self.service))
        patcher = mock.patch.object(
            reconcile,
            "make_client",
            lambda: httpx.Client(transport=simulator_transport(self.service)),
        )
        patcher.start()
        self.addCleanup(patcher.stop)
        self.addCleanup(self.sim_client.close)
        self.contract = http_contract(project=self.project, digest="x")
        self.contract.save()

    def reconciling_call(self, operation_id: str = "op-1", **fields) -> ToolCall:
        values = {
            "project": self.project,
            "agent": self.agent,
            "operation_id": operation_id,
            "tool_name": "create_follow_up",
            "contract": self.contract,
            "arguments": ARGS,
            "state": ToolCall.State.RECONCILING,
            "reason": "outcome_unknown",
            "category": "unknown_outcome",
            "route": "reconcile",
            "reconcile_requested_at": timezone.now(),
            **fields,
        }
        return ToolCall.objects.create(**values)

    def write(self, operation_id: str, body: dict = ARGS) -> None:
        self.sim_client.post(
            "http://sim/tenants/acme/follow-ups",
            json=body,
            headers={"Idempotency-Key": operation_id, "Authorization": f"Bearer {TOKEN}"},
        )

    def run_task(self, call: ToolCall):
        from callgate.tasks import reconcile_call

        return reconcile_call.apply(args=[call.pk]).get()

    def test_it_records_an_applied_write_with_its_receipt(self):
        self.write("op-1")
        call = self.reconciling_call()

        assert self.run_task(call) == APPLIED
        call.refresh_from_db()
        assert call.reason == "reconciled_applied"
        assert call.receipt["id"] == "F-1"
        assert (
            CallEvent.objects.filter(call=call, kind="reconciled", source="callgate").count() == 1
        )
        assert len(self.service.writes) == 1  # reconciliation never writes

    def test_it_records_an_absent_write(self):
        call = self.reconciling_call()

        assert self.run_task(call) == ABSENT
        call.refresh_from_db()
        assert call.reason == "reconciled_absent"

    def test_it_records_a_mismatch(self):
        self.write("op-1", {**ARGS, "assignee_id": "u-9"})
        call = self.reconciling_call()

        assert self.run_task(call) == MISMATCH
        call.refresh_from_db()
        assert call.reason == "reconcile_mismatch"
        assert call.state == ToolCall.State.IN_REVIEW

    def test_it_retries_transient_failures_then_finds_the_write(self):
        self.write("op-1")
        self.service.fail_next("unavailable", count=2, on="lookup")
        call = self.reconciling_call()

        with mock.patch("callgate.tasks.backoff_seconds", return_value=0):
            assert self.run_task(call) == APPLIED
        call.refresh_from_db()
        assert call.reason == "reconciled_applied"

    def test_it_escalates_after_the_last_retry(self):
        self.service.fail_next("timeout_no_write", count=20, on="lookup")
        call = self.reconciling_call()

        with mock.patch("callgate.tasks.backoff_seconds", return_value=0):
            assert self.run_task(call) == "could_not_tell"
        call.refresh_from_db()
        assert call.state == ToolCall.State.IN_REVIEW

    def test_it_looks_up_a_call_in_review_only_when_an_operator_asks(self):
        from callgate.tasks import reconcile_call

        self.write("op-1")
        call = self.reconciling_call(state=ToolCall.State.IN_REVIEW)

        assert reconcile_call.apply(args=[call.pk]).get() == "skipped"
        assert reconcile_call.apply(args=[call.pk], kwargs={"manual": True}).get() == APPLIED
        call.refresh_from_db()
        assert call.reason == "reconciled_applied"

    def test_it_escalates_a_call_reconciled_too_often(self):
        from callgate import tasks

        call = self.reconciling_call()
        now = timezone.now()
        for _ in range(tasks.RECONCILE_MAX_PER_HOUR):
            CallEvent.objects.create(
                project=self.project,
                call=call,
                kind="reconciled",
                source="callgate",
                body={"type": "reconciled", "found": False},
                occurred_at=now,
            )

        assert self.run_task(call) == "escalated"
        call.refresh_from_db()
        assert call.state == ToolCall.State.IN_REVIEW

    def test_it_does_nothing_unless_the_call_is_reconciling(self):
        self.write("op-1")
        call = self.reconciling_call(state=ToolCall.State.SUCCEEDED)

        assert self.run_task(call) == "skipped"
        assert not CallEvent.objects.filter(call=call).exists()


class PeriodicJobTests(BaseTestCase):
    def setUp(self):
        self.contract = http_contract(project=self.project, digest="x")
        self.contract.save()

    def make_call(self, operation_id: str, **fields) -> ToolCall:
        return ToolCall.objects.create(
            project=self.project,
            agent=self.agent,
            operation_id=operation_id,
            tool_name="create_follow_up",
            contract=self.contract,
            arguments=ARGS,
            **fields,
        )

    def test_it_claims_stale_reconciling_calls_once(self):
        old = timezone.now() - timedelta(minutes=10)
        stale = self.make_call(
            "stale", state=ToolCall.State.RECONCILING, reconcile_requested_at=old
        )
        self.make_call(
            "fresh", state=ToolCall.State.RECONCILING, reconcile_requested_at=timezone.now()
        )
        self.make_call("done", state=ToolCall.State.SUCCEEDED, reconcile_requested_at=old)

        assert reconcile.reconcile_calls_claim_stale(older_than=timedelta(minutes=2)) == [stale.pk]
        assert reconcile.reconcile_calls_claim_stale(older_than=timedelta(minutes=2)) == []

    def test_it_reenqueues_stale_calls_from_the_sweeper(self):
        from callgate import tasks

        stale = self.make_call(
            "stale",
            state=ToolCall.State.RECONCILING,
            reconcile_requested_at=timezone.now() - timedelta(minutes=10),
        )
        with mock.patch.object(tasks.reconcile_call, "delay") as delay:
            assert tasks.sweep_reconciling() == 1
        delay.assert_called_once_with(stale.pk)

    def test_it_purges_events_past_the_projects_retention(self):
        from callgate import tasks

        self.project.retention_days = 30
        self.project.save(update_fields=["retention_days"])
        call = self.make_call("op-1", state=ToolCall.State.SUCCEEDED)
        now = timezone.now()
        for days in (40, 31, 29, 1):
            CallEvent.objects.create(
                project=self.project,
                call=call,
                kind="attempt",
                body={},
                occurred_at=now,
                received_at=now - timedelta(days=days),
            )
        other_call = ToolCall.objects.create(
            project=self.other_project,
            agent=self.other_agent,
            operation_id="op-1",
            state=ToolCall.State.SUCCEEDED,
        )
        CallEvent.objects.create(  # globex keeps the default 90 days
            project=self.other_project,
            call=other_call,
            kind="attempt",
            body={},
            occurred_at=now,
            received_at=now - timedelta(days=40),
        )

        with mock.patch.object(tasks, "PURGE_BATCH", 1):
            assert tasks.purge_events() == 2
        assert CallEvent.objects.filter(project=self.project).count() == 2
        assert CallEvent.objects.filter(project=self.other_project).count() == 1

    def test_it_sweeps_calls_past_their_deadline(self):
        from callgate import tasks

        call = self.make_call(
            "late",
            state=ToolCall.State.RETRY_WAIT,
            reason="unavailable",
            category="transient",
            route="retry",
            attempts=1,
            deadline=timezone.now() - timedelta(seconds=1),
        )
        self.make_call(
            "early",
            state=ToolCall.State.RETRY_WAIT,
            reason="unavailable",
            category="transient",
            route="retry",
            attempts=1,
            deadline=timezone.now() + timedelta(hours=1),
        )

        assert tasks.sweep_deadlines() == 1
        call.refresh_from_db()
        assert (call.state, call.reason, call.route) == ("in_review", "retry_exhausted", "review")
        event = call.events.get()
        assert (event.kind, event.source) == ("deadline_passed", "callgate")
        assert (event.state_before, event.state_after) == ("retry_wait", "in_review")
        assert ReviewItem.objects.filter(call=call, status=ReviewItem.Status.OPEN).count() == 1
        assert tasks.sweep_deadlines() == 0  # the call left retry_wait: nothing more to do


class ReconcileEndToEndTests(BaseTestCase):
    """A write times out after the target applied it; callgate looks it up by operation ID
    in the simulator and settles the call without a second write."""

    def setUp(self):
        self.service = SimulatorService({"acme": TOKEN})
        self.ticket = self.service.add_ticket("acme")
        self.sim = httpx.Client(transport=simulator_transport(self.service))
        self.addCleanup(self.sim.close)
        patcher = mock.patch.object(
            reconcile,
            "make_client",
            lambda: httpx.Client(transport=simulator_transport(self.service)),
        )
        patcher.start()
        self.addCleanup(patcher.stop)
        contract = {
            "description": "Create a follow-up task on a support ticket, assigned to one agent.",
            "effect": "write",
            "idempotent": True,
            "reconcilable": True,
            "reconcile_url": LOOKUP_URL,
            "max_attempts": 3,
            "max_reasks": 2,
            "parameters": {
                "type": "object",
                "properties": {
                    "ticket_id": {"type": "string"},
                    "assignee_id": {"type": "string"},
                    "due_at": {"type": "string"},
                },
                "required": ["ticket_id", "assignee_id", "due_at"],
                "additionalProperties": False,
            },
        }
        response = self.api().put("/api/v1/tools/create_follow_up", contract, format="json")
        assert response.status_code in (200, 201), response.content

    def report(self, *events):
        from tests.factories import make_event

        envelopes = [make_event(e.pop("type"), **e) for e in events]
        with self.captureOnCommitCallbacks(execute=True):
            response = self.api().post("/api/v1/events", envelopes, format="json")
        assert response.status_code == 200, response.content
        return [self.api().get(f"/api/v1/events/{e['event_id']}").json() for e in envelopes]

    @override_settings(CALLGATE_RECONCILE_AUTH_HEADER=f"Authorization: Bearer {TOKEN}")
    def test_it_settles_a_timed_out_write_that_the_target_applied(self):
        proposed = {"tool": "create_follow_up", "arguments": ARGS}
        self.service.fail_next("timeout_after_write")
        with self.assertRaises(httpx.ReadTimeout):
            self.sim.post(
                "http://sim/tenants/acme/follow-ups",
                json=ARGS,
                headers={"Idempotency-Key": "op-e2e", "Authorization": f"Bearer {TOKEN}"},
            )

        results = self.report(
            {"type": "proposed", "format": "plain", "call": proposed, "operation_id": "op-e2e"},
            {
                "type": "attempt",
                "operation_id": "op-e2e",
                "sent": True,
                "outcome": "timeout",
                "http_status": None,
            },
        )

        assert results[-1]["answer"]["reason"] == "outcome_unknown"
        call = ToolCall.objects.get(project=self.project, operation_id="op-e2e")
        assert call.reason == "reconciled_applied"
        assert call.state == ToolCall.State.SUCCEEDED
        assert call.receipt["id"] == "F-1"
        assert len(self.service.writes) == 1

    @override_settings(CALLGATE_RECONCILE_AUTH_HEADER=f"Authorization: Bearer {TOKEN}")
    def test_it_sends_an_absent_write_of_an_idempotent_tool_back_to_retry(self):
        proposed = {"tool": "create_follow_up", "arguments": ARGS}
        self.service.fail_next("timeout_no_write")
        with self.assertRaises(httpx.ReadTimeout):
            self.sim.post(
                "http://sim/tenants/acme/follow-ups",
                json=ARGS,
                headers={"Idempotency-Key": "op-e2e", "Authorization": f"Bearer {TOKEN}"},
            )

        self.report(
            {"type": "proposed", "format": "plain", "call": proposed, "operation_id": "op-e2e"},
            {"type": "attempt", "operation_id": "op-e2e", "sent": None, "outcome": "timeout"},
        )

        call = ToolCall.objects.get(project=self.project, operation_id="op-e2e")
        assert call.reason == "reconciled_absent"
        assert call.route == "retry"
        assert call.state == ToolCall.State.RETRY_WAIT
        assert self.service.writes == []

    def test_it_never_passes_another_tenants_name_to_the_model(self):
        other = SimulatorService({"acme": TOKEN, "globex": "g"})
        other.add_ticket("acme")
        foreign = other.add_ticket("globex")
        with httpx.Client(transport=simulator_transport(other)) as client:
            refused = client.post(
                "http://sim/tenants/acme/follow-ups",
                json={**ARGS, "ticket_id": foreign},
                headers={"Idempotency-Key": "op-403", "Authorization": f"Bearer {TOKEN}"},
            )
        assert refused.status_code == 403 and "globex" in refused.text

        results = self.report(
            {
                "type": "proposed",
                "format": "plain",
                "call": {"tool": "create_follow_up", "arguments": {**ARGS, "ticket_id": foreign}},
                "operation_id": "op-403",
            },
            {
                "type": "attempt",
                "operation_id": "op-403",
                "sent": True,
                "outcome": "error",
                "http_status": 403,
                "error": refused.text,
            },
        )

        answer = results[-1]["answer"]
        assert answer["reason"] == "permission_denied"
        assert "globex" not in answer["observation"].lower()


class ReconciledPrecedenceTests(SimpleTestCase):
    """``classify_reconciled`` with the call's verdict before the look-up (issue 31): a
    look-up replaces only a reason whose outcome was unknown; found applied replaces any."""

    def classify(self, current, *, found: bool, matches: bool = False, attempts: int = 1):
        from callgate import classification as cls

        contract = cls.Contract(
            name="create_follow_up", parameters={}, effect="write", idempotent=True
        )
        return cls.classify_reconciled(
            found=found,
            matches=matches,
            contract=contract,
            attempts_used=attempts,
            deadline_passed=False,
            current=current,
        )

    def test_no_lookup_weakens_a_failure_the_target_answered(self):
        from callgate import classification as cls
        from callgate.taxonomy import LOOKUP_ANSWERS, Reason, route_of

        for reason in set(Reason) - LOOKUP_ANSWERS:
            current = cls.Verdict(reason=reason, route=route_of(reason), observation="said")
            for found, matches in ((False, False), (True, False)):
                with self.subTest(reason=reason, found=found):
                    assert self.classify(current, found=found, matches=matches) is current
            applied = self.classify(current, found=True, matches=True)
            assert applied.reason == Reason.RECONCILED_APPLIED, reason

    def test_a_lookup_answers_an_unknown_outcome(self):
        from callgate import classification as cls
        from callgate.taxonomy import LOOKUP_ANSWERS, Reason, route_of

        for reason in LOOKUP_ANSWERS:
            current = cls.Verdict(reason=reason, route=route_of(reason), observation="said")
            with self.subTest(reason=reason):
                assert self.classify(current, found=False).reason == Reason.RECONCILED_ABSENT
                assert (
                    self.classify(current, found=False, attempts=3).reason == Reason.RETRY_EXHAUSTED
                )
                assert self.classify(current, found=True).reason == Reason.RECONCILE_MISMATCH
