"""The inbox: ``events_receive`` stores, ``inbox_drain`` applies in arrival order, one drainer
per project, and nothing stored is lost or applied twice."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from unittest import mock, skipUnless

from django.db import connection, connections, transaction
from django.test import TransactionTestCase
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from callgate import inbox, ingest, tasks
from callgate.inbox import event_answer, events_receive, inbox_drain
from callgate.metrics import hour_floor
from callgate.models import (
    Agent,
    CallEvent,
    InboxEvent,
    Membership,
    Project,
    RequestBudget,
    RollupDirtyBucket,
    ToolCall,
)
from tests.factories import (
    FOLLOW_UP,
    WEATHER,
    BaseTestCase,
    make_call,
    make_contracts,
    make_event,
    validated,
    weather_call,
)


class InboxTests(BaseTestCase):
    def setUp(self):
        self.client_api = self.api()
        for name, body in (("get_weather", WEATHER), ("create_follow_up", FOLLOW_UP)):
            assert (
                self.client_api.put(f"/api/v1/tools/{name}", body, format="json").status_code == 201
            )

    def receive(self, envelopes: list[dict], **kwargs) -> list[str]:
        return [
            o.status
            for o in events_receive(
                project=self.project, agent=self.agent, events=validated(envelopes), **kwargs
            )
        ]

    def test_an_event_is_pending_until_drained_then_applied_in_arrival_order(self):
        proposed, attempt = weather_call(1)
        assert self.receive([proposed]) == ["accepted"]
        assert self.receive([attempt]) == ["accepted"]
        found = self.client_api.get(f"/api/v1/events/{attempt['event_id']}").json()
        assert found == {
            "event_id": attempt["event_id"],
            "status": "pending",
            "kind": "attempt",
            "errors": [],
            "answer": None,
        }
        assert not ToolCall.objects.filter(project=self.project).exists()

        assert inbox_drain(self.project.pk) == 2
        found = self.client_api.get(f"/api/v1/events/{attempt['event_id']}").json()
        assert found["status"] == "applied" and found["answer"]["reason"] == "ok"
        # applied rows live on as CallEvents; their inbox rows keep only the event ID and type
        rows = InboxEvent.objects.filter(project=self.project).order_by("id")
        assert [(r.status, r.body) for r in rows] == [
            ("applied", {"type": "proposed"}),
            ("applied", {"type": "attempt"}),
        ]
        assert CallEvent.objects.filter(project=self.project).count() == 2

    def test_a_resent_event_is_a_duplicate_while_pending_and_after_it_was_applied(self):
        event = weather_call(1)[0]
        assert self.receive([event, event]) == ["accepted", "duplicate"]
        assert self.receive([event]) == ["duplicate"]
        inbox_drain(self.project.pk)
        assert self.receive([event]) == ["duplicate"]
        assert CallEvent.objects.filter(event_id=event["event_id"]).count() == 1

    def test_it_refuses_decisions_from_a_key_that_may_not_decide_before_storing_them(self):
        decision = make_event("decision", operation_id="op-1", decision="approve")
        assert self.receive([decision]) == ["rejected"]
        assert not InboxEvent.objects.exists()
        assert self.receive([decision], may_decide=True) == ["accepted"]

    def test_receiving_a_batch_takes_a_fixed_number_of_queries(self):
        def count(n: int, start: int) -> int:
            envelopes = [e for i in range(start, start + n) for e in weather_call(i)]
            with CaptureQueriesContext(connection) as queries:
                assert set(self.receive(envelopes)) == {"accepted"}
            return len(queries)

        assert count(2, 0) == count(500, 100)

    @skipUnless(connection.vendor == "postgresql", "a PostgreSQL query plan")
    def test_a_fresh_tenant_beside_a_large_one_recognises_duplicates_by_the_unique_index(self):
        # A large tenant's applied events, and no ANALYZE since: the planner knows nothing
        # of the new tenant (a probe of applied CallEvents once chose a scan of the project's
        # events for it: 18.8 s per batch). The insert must read nothing but the unique index.
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO callgate_inboxevent "
                "(project_id, agent_id, event_id, body, received_at, status, errors) "
                "SELECT %s, %s, gen_random_uuid(), '{}'::jsonb, now(), 'applied', '[]'::jsonb "
                "FROM generate_series(1, 20000)",
                [self.other_project.pk, self.other_agent.pk],
            )
        fresh = Project.objects.create(slug="fresh", name="Fresh")
        fresh_agent = Agent.objects.create(project=fresh, name="fresh-bot")
        envelopes = [e for i in range(250) for e in weather_call(i)]
        events = validated(envelopes)
        seen = []

        def remember(execute, sql, params, many, context):
            seen.append((sql, params))
            return execute(sql, params, many, context)

        with connection.execute_wrapper(remember):
            outcomes = events_receive(project=fresh, agent=fresh_agent, events=events)
        assert {o.status for o in outcomes} == {"accepted"}
        [(insert, params)] = [
            (sql, params)
            for sql, params in seen
            if sql.startswith("INSERT INTO callgate_inboxevent")
        ]
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + insert, params)
            plan = "\n".join(line for (line,) in cursor.fetchall())
        assert "Conflict Arbiter Indexes: inboxevent_unique_event_id" in plan, plan
        assert "callgate_callevent" not in plan, plan
        assert "Scan on callgate_inboxevent" not in plan, plan

        inbox_drain(fresh.pk)
        applied = {
            str(i)
            for i in InboxEvent.objects.filter(project=fresh, status="applied").values_list(
                "event_id", flat=True
            )
        }
        assert applied == {
            str(i)
            for i in CallEvent.objects.filter(project=fresh).values_list("event_id", flat=True)
        }
        again = [e for e in events if str(e.event_id) in applied][:10]
        assert len(again) == 10
        outcomes = events_receive(project=fresh, agent=fresh_agent, events=again)
        assert {o.status for o in outcomes} == {"duplicate"}  # applied: the conflict says so

    @skipUnless(
        connection.vendor == "postgresql", "SQLite splits bulk inserts by its 999-parameter limit"
    )
    def test_draining_takes_a_fixed_number_of_queries_per_chunk(self):
        def count(n: int, start: int) -> int:
            self.receive([e for i in range(start, start + n) for e in weather_call(i)])
            ingest.tools_cache_forget(self.project.pk)  # each run reads the contracts once
            with CaptureQueriesContext(connection) as queries:
                assert inbox_drain(self.project.pk) == 2 * n
            return len(queries)

        assert count(2, 0) == count(inbox.DRAIN_CHUNK // 2, 100)

    def test_inbox_lag_is_the_age_of_the_oldest_pending_event(self):
        from callgate.inbox import inbox_lag_seconds

        assert inbox_lag_seconds(self.project) == 0.0
        self.receive(weather_call(1))
        InboxEvent.objects.filter(project=self.project).update(
            received_at=timezone.now() - timedelta(seconds=30)
        )
        self.receive(weather_call(2))
        assert 29 < inbox_lag_seconds(self.project) < 60
        assert inbox_lag_seconds(self.other_project) == 0.0
        self.login_overview_shows_lag()
        inbox_drain(self.project.pk)
        assert inbox_lag_seconds(self.project) == 0.0

    def login_overview_shows_lag(self):
        Membership.objects.get_or_create(
            user=self.alice, project=self.project, defaults={"role": "operator"}
        )
        self.client.force_login(self.alice)
        body = self.client.get(f"/p/{self.project.slug}/").content.decode()
        assert "inbox lag" in body.lower()

    def test_a_rule_refusal_stays_in_the_inbox_and_does_not_block_later_events(self):
        orphan = make_event("attempt", operation_id="op_missing", sent=True, outcome="success")
        proposed, attempt = weather_call(1)
        self.receive([orphan, proposed, attempt])
        inbox_drain(self.project.pk)
        row = InboxEvent.objects.get(event_id=orphan["event_id"])
        assert row.status == InboxEvent.Status.REJECTED
        assert row.errors[0]["loc"] == "operation_id"
        assert (
            event_answer(self.project, uuid.UUID(attempt["event_id"]))["answer"]["reason"] == "ok"
        )
        assert inbox_drain(self.project.pk) == 0  # a rejected row is not tried again

    def test_a_body_that_no_longer_validates_is_rejected_and_the_rest_applied(self):
        broken = InboxEvent.objects.create(
            project=self.project,
            agent=self.agent,
            event_id=uuid.uuid4(),
            body={"type": "attempt", "sent": "maybe"},
        )
        proposed, attempt = weather_call(1)
        self.receive([proposed, attempt])
        assert inbox_drain(self.project.pk) == 3
        broken.refresh_from_db()
        assert broken.status == InboxEvent.Status.REJECTED and broken.errors[0]["msg"]
        assert ToolCall.objects.get(project=self.project).reason == "ok"

    def test_an_unexpected_failure_applies_the_rest_one_by_one(self):
        events = [e for i in range(3) for e in weather_call(i)]
        poison = events[2]["event_id"]  # the second call's proposal
        real = ingest._apply_once

        def failing(**kwargs):
            if any(str(e.event_id) == poison for e in kwargs["events"]):
                raise RuntimeError("injected fault")
            return real(**kwargs)

        self.receive(events)
        with (
            mock.patch.object(ingest, "_apply_once", failing),
            self.assertLogs("callgate.inbox", "ERROR"),
        ):
            assert inbox_drain(self.project.pk) == 6
        row = InboxEvent.objects.get(event_id=poison)
        assert (
            row.status == InboxEvent.Status.REJECTED and row.errors[0]["msg"] == inbox.APPLY_FAILED
        )
        assert ToolCall.objects.filter(project=self.project, reason="ok").count() == 2
        # the poisoned call's attempt found no call: refused by the rules, recorded, not lost
        assert InboxEvent.objects.get(event_id=events[3]["event_id"]).errors[0]["loc"] == "call_id"

    def test_a_drain_stops_at_the_rows_received_before_it(self):
        self.receive(weather_call(1))
        bound = (
            InboxEvent.objects.filter(project=self.project)
            .order_by("-id")
            .values_list("id", flat=True)[0]
        )
        self.receive(weather_call(2))  # arrives "during" the drain
        assert inbox._drain_chunk(self.project.pk, bound=bound) == 2
        assert (
            InboxEvent.objects.filter(
                project=self.project, status=InboxEvent.Status.PENDING
            ).count()
            == 2
        )
        assert inbox_drain(self.project.pk) == 2

    def test_a_rejected_event_keeps_no_secrets_and_is_applied_when_sent_again_later(self):
        proposed, attempt = weather_call(1)
        attempt["result"] = {"password": "hunter2", "temperature": 3}
        assert self.receive([attempt]) == ["accepted"]
        inbox_drain(self.project.pk)  # its proposal has not arrived yet: refused
        row = InboxEvent.objects.get(event_id=attempt["event_id"])
        assert row.status == InboxEvent.Status.REJECTED
        assert row.body["result"] == {"password": "•••", "temperature": 3}
        self.receive([proposed])
        assert self.receive([attempt]) == ["accepted"]  # the same event, sent again: tried anew
        inbox_drain(self.project.pk)
        found = event_answer(self.project, uuid.UUID(attempt["event_id"]))
        assert found["status"] == "applied" and found["answer"]["reason"] == "ok"
        assert self.receive([attempt]) == ["duplicate"]

    def test_the_sweep_applies_what_a_lost_task_left(self):
        self.receive(weather_call(1))
        other = Agent.objects.create(project=self.other_project, name="other")
        events_receive(
            project=self.other_project, agent=other, events=validated(weather_call(2)[:1])
        )
        assert tasks.sweep_inbox() == 3
        assert not InboxEvent.objects.filter(status=InboxEvent.Status.PENDING).exists()
        assert ToolCall.objects.filter(project=self.other_project).count() == 1

    def test_the_gate_applies_earlier_events_first(self):
        body = {
            "format": "plain",
            "call": {"tool": "create_follow_up", "arguments": {"ticket_id": "T-1"}},
            "request_id": "req-1",
        }
        op = self.client_api.post("/api/v1/calls", body, format="json").json()["operation_id"]
        self.receive(
            [make_event("attempt", operation_id=op, sent=True, outcome="timeout")]
        )  # not applied yet
        again = self.client_api.post("/api/v1/calls", body, format="json").json()
        assert again["verdict"] == "reconcile" and again["reason"] == "outcome_unknown"

    def test_the_gate_leaves_other_requests_backlog_to_the_drain(self):
        self.receive(weather_call(5) + weather_call(6)[:1])  # other requests', not applied yet
        body = {
            "format": "plain",
            "call": {"tool": "create_follow_up", "arguments": {"ticket_id": "T-2"}},
            "request_id": "req-gate",
        }
        answer = self.client_api.post("/api/v1/calls", body, format="json").json()
        assert answer["verdict"] == "allow"
        pending = InboxEvent.objects.filter(project=self.project, status="pending")
        assert pending.count() == 3  # the backlog waits for its drain, not for the gate
        assert ToolCall.objects.filter(project=self.project).count() == 1
        assert inbox_drain(self.project.pk) == 3 and not pending.exists()

    def test_the_gate_applies_a_pending_event_of_its_operation_first(self):
        body = {
            "format": "plain",
            "call": {"tool": "create_follow_up", "arguments": {"ticket_id": "T-3"}},
            "operation_id": "op-explicit-3",
        }
        self.client_api.post("/api/v1/calls", body, format="json")
        self.receive(
            [make_event("attempt", operation_id="op-explicit-3", sent=True, outcome="timeout")]
        )
        again = self.client_api.post("/api/v1/calls", body, format="json").json()
        assert again["reason"] == "outcome_unknown"
        assert not InboxEvent.objects.filter(project=self.project, status="pending").exists()

    def test_retention_removes_old_rejected_rows_but_never_pending_ones(self):
        self.project.retention_days = 7
        self.project.save(update_fields=["retention_days"])
        old = timezone.now() - timedelta(days=8)
        for status in (InboxEvent.Status.REJECTED, InboxEvent.Status.PENDING):
            InboxEvent.objects.create(
                project=self.project,
                agent=self.agent,
                event_id=uuid.uuid4(),
                body={},
                status=status,
                received_at=old,
            )
        tasks.purge_events()
        assert list(InboxEvent.objects.values_list("status", flat=True)) == [
            InboxEvent.Status.PENDING
        ]


@skipUnless(
    connection.vendor == "postgresql", "concurrent drainers need PostgreSQL's advisory locks"
)
class ConcurrentDrainTests(TransactionTestCase):
    def test_concurrent_receivers_and_drainers_apply_every_event_once_in_order(self):
        project = Project.objects.create(slug="race", name="Race")
        agent = Agent.objects.create(project=project, name="bot")
        from callgate import services
        from callgate.schemas import ContractIn

        services.contract_register(
            agent=agent, name="get_weather", payload=ContractIn.model_validate(WEATHER)
        )
        batches = [
            [e for i in range(start, start + 50) for e in weather_call(i)]
            for start in range(0, 400, 50)
        ]
        errors: list[BaseException] = []

        def work(batch: list[dict]) -> None:
            try:
                events_receive(project=project, agent=agent, events=validated(batch))
                inbox_drain(project.pk, lock_wait=60)  # the bounded wait is tested apart
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=work, args=(batch,)) for batch in batches]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert inbox_drain(project.pk) == 0  # each drain took what was received before it
        assert not InboxEvent.objects.filter(project=project).exclude(status="applied").exists()
        assert CallEvent.objects.filter(project=project).count() == 800
        assert ToolCall.objects.filter(project=project).count() == 400
        assert set(ToolCall.objects.filter(project=project).values_list("reason", flat=True)) == {
            "ok"
        }

    def test_batches_with_the_same_events_in_opposite_orders_store_each_once_and_answer_200(self):
        # each insert waits on the other's rows: PostgreSQL aborts one, which is tried again
        project = Project.objects.create(slug="cross", name="Cross")
        agent = Agent.objects.create(project=project, name="bot")
        events = validated([e for i in range(300) for e in weather_call(i)])
        answers: dict[str, list[str]] = {}
        errors: list[BaseException] = []
        start = threading.Barrier(2)

        def send(name: str, batch: list) -> None:
            try:
                start.wait()
                outcomes = events_receive(project=project, agent=agent, events=batch)
                answers[name] = [o.status for o in outcomes]
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [
            threading.Thread(target=send, args=("forward", events)),
            threading.Thread(target=send, args=("backward", events[::-1])),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        forward, backward = answers["forward"], answers["backward"][::-1]
        assert all(
            sorted([a, b]) == ["accepted", "duplicate"]
            for a, b in zip(forward, backward, strict=True)
        )
        assert InboxEvent.objects.filter(project=project).count() == len(events)


@skipUnless(connection.vendor == "postgresql", "row locks and query plans of PostgreSQL")
class GateSettleTests(TransactionTestCase):
    """``settle_pending`` (the gate) and ``inbox_drain`` side by side: the row locks let each
    event be applied once, after the earlier events of its request."""

    def setUp(self):
        from callgate import services
        from callgate.schemas import ContractIn

        self.project = Project.objects.create(slug="gate-race", name="Gate race")
        self.agent = Agent.objects.create(project=self.project, name="bot")
        services.contract_register(
            agent=self.agent, name="get_weather", payload=ContractIn.model_validate(WEATHER)
        )

    def test_gate_checks_and_drains_at_once_apply_every_event_once_in_order(self):
        n = 120
        proposals = validated([weather_call(i)[0] for i in range(n)])
        attempts = validated([weather_call(i)[1] for i in range(n)])
        events_receive(project=self.project, agent=self.agent, events=proposals)
        errors: list[BaseException] = []

        def settle(part: list) -> None:
            try:
                for attempt in part:
                    inbox.event_settle(project=self.project, agent=self.agent, event=attempt)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
            finally:
                connections.close_all()

        def drain() -> None:
            try:
                for _ in range(20):
                    inbox_drain(self.project.pk, lock_wait=60)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=settle, args=(attempts[k::2],)) for k in range(2)]
        threads.append(threading.Thread(target=drain))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        calls = ToolCall.objects.filter(project=self.project)
        assert calls.count() == n
        assert set(calls.values_list("reason", "attempts")) == {("ok", 1)}
        assert CallEvent.objects.filter(project=self.project).count() == 2 * n
        assert set(InboxEvent.objects.filter(project=self.project).values_list("status")) == {
            ("applied",)
        }

    def test_finding_a_requests_pending_events_reads_no_backlog(self):
        events_receive(
            project=self.project,
            agent=self.agent,
            events=validated([e for i in range(20) for e in weather_call(i)]),
        )
        with connection.cursor() as cursor:  # statistics taken while the backlog was small
            cursor.execute("ANALYZE callgate_inboxevent")
        events_receive(  # then a backlog arrives, before autovacuum's next ANALYZE
            project=self.project,
            agent=self.agent,
            events=validated([e for i in range(20, 1520) for e in weather_call(i)]),
        )
        for event in validated(weather_call(7)):  # another request's event; one of req-7
            sent: list[tuple[str, list]] = []

            def keep(execute, sql, params, many, context, sent=sent):
                sent.append((sql, params))
                return execute(sql, params, many, context)

            with connection.execute_wrapper(keep), transaction.atomic():
                inbox.settle_pending(self.project, event, agent=self.agent)
            [(sql, params)] = [(sql, params) for sql, params in sent if "FOR UPDATE" in sql][:1]
            with ingest.bound_cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
                [[plan]] = cursor.fetchall()
            scanned = _rows_read(plan[0]["Plan"])
            assert scanned < 20, (scanned, plan)


def _rows_read(node: dict) -> int:
    """The rows a plan's scans of the inbox read: returned, and removed by a filter."""
    own = (
        node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
        if node.get("Relation Name") == "callgate_inboxevent"
        else 0
    )
    return own + sum(_rows_read(child) for child in node.get("Plans", []))


@skipUnless(connection.vendor == "postgresql", "prepared statements' generic plans")
class BatchLookupPlanTests(BaseTestCase):
    """The calls and budgets a batch reads are found through indexes or joins, linear in the
    batch whatever the plan: a prepared statement's generic plan, on statistics taken while
    the project was small, once filtered the project's calls with a linear search of a
    500-element array per row (``= ANY($2)``: 40 ms a batch)."""

    def generic_plan(self, sql: str, params: list) -> str:
        numbered, n = "", 0
        for piece in sql.split("%s"):
            numbered += piece + (f"${n + 1}" if n < len(params) else "")
            n += 1
        with connection.cursor() as cursor:
            cursor.execute("SET plan_cache_mode = force_generic_plan")
            try:
                with transaction.atomic():
                    with ingest.bound_cursor() as bound:
                        bound.execute(f"PREPARE lookup AS {numbered}", [])
                        try:
                            literal = ", ".join(
                                connection.ops.compose_sql("%s", [p]) for p in params
                            )
                            bound.execute(f"EXPLAIN ANALYZE EXECUTE lookup({literal})", [])
                            return "\n".join(row[0] for row in bound.fetchall())
                        finally:
                            bound.execute("DEALLOCATE lookup", [])
            finally:
                cursor.execute("RESET plan_cache_mode")

    def test_a_batch_of_attempts_finds_its_calls_and_budgets_without_an_array_filter(self):
        now = timezone.now()
        calls = [
            make_call(project=self.project, agent=self.agent, created_at=now) for _ in range(60)
        ]
        for call in calls:
            call.request_id = f"req-{call.pk}"
        ToolCall.objects.bulk_update(calls, ["request_id"])
        RequestBudget.objects.bulk_create(
            RequestBudget(project=self.project, request_id=c.request_id, tool_name=c.tool_name)
            for c in calls
        )
        with connection.cursor() as cursor:  # statistics of an empty project
            cursor.execute("ANALYZE callgate_toolcall; ANALYZE callgate_requestbudget")
        wanted = calls[::2]
        plans = [
            self.generic_plan(
                ingest._CALLS_LOCKED,
                [
                    [c.operation_id for c in wanted],
                    self.project.pk,
                    [c.operation_id for c in wanted],
                    self.project.pk,
                    ["r"],
                    ["c"],
                    self.project.pk,
                ],
            ),
            self.generic_plan(
                ingest._BUDGETS,
                [[c.request_id for c in wanted], [c.tool_name for c in wanted], self.project.pk],
            ),
        ]
        for plan in plans:  # no row filtered by a search of an array parameter
            assert not [
                line for line in plan.splitlines() if "Filter" in line and "ANY ($" in line
            ], plan
        with connection.cursor() as cursor:  # and the generic plan is the one they run
            cursor.execute("SHOW plan_cache_mode")
            assert cursor.fetchone()[0] == "force_generic_plan"
        found = ingest._calls_locked(self.project, {c.operation_id for c in wanted}, set())
        assert [c.pk for c in found] == sorted(c.pk for c in wanted)
        budgets = ingest._budgets(self.project, {(c.request_id, c.tool_name) for c in wanted})
        assert sorted(b.request_id for b in budgets) == sorted(c.request_id for c in wanted)


class BatchWriteTests(BaseTestCase):
    """``ingest.batch_write`` (one statement of CTEs over JSON records on PostgreSQL, the ORM's bulk
    operations elsewhere) writes every field as the ORM would, NULLs, JSON and foreign keys
    included, and only the rows it is given."""

    def test_new_calls_events_and_budgets_round_trip_and_get_their_ids(self):
        now = timezone.now()
        contract = make_contracts(self.project)["get_weather"]
        existing = make_call(project=self.project, agent=self.agent, created_at=now)
        new = ToolCall(
            project=self.project,
            agent=self.agent,
            operation_id="op-new",
            request_id="req-9",
            call_id="c1",
            tool_name="get_weather",
            contract=contract,
            arguments={"city": "Zürich", "days": [1, None]},
            arguments_digest="d",
            state="allowed",
            reason="ok",
            category="ok",
            route="proceed",
            observation='Go "ahead" \\ ✓\nnow',
            receipt="a receipt that is a JSON string",
            created_at=now - timedelta(hours=3),
            updated_at=now,
        )
        events = [
            CallEvent(
                project=self.project,
                call=call,
                event_id=uuid.uuid4(),
                kind="proposed",
                source="agent",
                body={"type": "proposed", "n": n},
                occurred_at=now,
                received_at=now,
                reason="ok",
                route="proceed",
                failed_items=[{"path": "/a"}] if n else None,
                state_after="allowed",
            )
            for n, call in enumerate((new, existing, new))
        ]
        budget = RequestBudget(
            project=self.project, request_id="req-9", tool_name="get_weather", reasks_used=1
        )
        ingest.batch_write(
            new_calls=[new], changed_calls=[], events=events, budgets=[budget], touched=[new]
        )
        assert new.pk is not None and all(e.pk is not None for e in events)
        assert [e.call_id for e in events] == [new.pk, existing.pk, new.pk]
        assert [e.pk for e in events] == sorted(e.pk for e in events)  # a timeline is ID order
        for model, rows in ((ToolCall, [new]), (CallEvent, events)):
            for row in rows:
                stored = model.objects.get(pk=row.pk)
                for field in model._meta.concrete_fields:
                    assert getattr(stored, field.attname) == getattr(row, field.attname), (
                        model.__name__,
                        field.name,
                    )
        assert RequestBudget.objects.get(project=self.project, request_id="req-9").reasks_used == 1
        budget.reasks_used = 2  # an upsert: the same key again
        ingest.batch_write(new_calls=[], changed_calls=[], events=[], budgets=[budget], touched=[])
        assert RequestBudget.objects.get(project=self.project, request_id="req-9").reasks_used == 2
        assert RollupDirtyBucket.objects.filter(
            project=self.project, bucket=hour_floor(new.created_at)
        ).exists()

    def test_every_call_field_round_trips(self):
        now = timezone.now()
        contract = make_contracts(self.project)["get_weather"]
        first, second, untouched = (
            make_call(project=self.project, agent=self.agent, created_at=now) for _ in range(3)
        )
        first.state, first.reason, first.category, first.route = "in_review", "", "", "review"
        first.observation, first.attempts, first.duplicates_suppressed = "Wait.", 4, 2
        first.receipt, first.receipt_at = {"id": "R-1", "items": [1, None, "é"]}, now
        first.arguments, first.arguments_digest = {"city": "Oslo"}, "abc"
        first.contract, first.approval_expires_at, first.reconcile_requested_at = contract, now, now
        first.decision, first.decision_reason = "approve_retry", "checked by phone"
        first.decided_by, first.decided_at, first.updated_at = self.alice, now, now
        second.receipt, second.contract, second.decided_by = None, None, None
        second.arguments = ["not", "an", "object"]
        ingest.batch_write(
            new_calls=[], changed_calls=[first, second], events=[], budgets=[], touched=[]
        )
        for call in (first, second):
            stored = ToolCall.objects.get(pk=call.pk)
            for name in ingest.CALL_FIELDS:
                field = ToolCall._meta.get_field(name)
                assert getattr(stored, field.attname) == getattr(call, field.attname), name
        assert ToolCall.objects.get(pk=untouched.pk).updated_at == untouched.updated_at
