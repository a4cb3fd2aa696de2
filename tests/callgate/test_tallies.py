"""Refusal tallies (``callgate.reports.tallies``): refused proposals are counted in the batch
that stores their events (in ``batch_write``'s one statement on PostgreSQL), the cells equal
a recount from the events, and the reasons report read from them equals a direct count of
the events for every range and filter."""

from __future__ import annotations

import importlib
from datetime import timedelta
from unittest import skipUnless

import psycopg
from django.apps import apps as django_apps
from django.core.management import call_command
from django.db import OperationalError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from callgate.auth import api_key_issue
from callgate.ingest import batch_write
from callgate.metrics import hour_floor
from callgate.models import Agent, CallEvent, RefusalRollup
from callgate.reports import selectors as reports
from callgate.reports import tallies
from reviews import services
from reviews.models import ReviewRollup
from tests.factories import FOLLOW_UP, BaseTestCase, make_call
from tests.reviews.fixtures import make_item


def cells(project_id: int) -> dict[tuple, int]:
    return {
        (r.dims, r.tool_name, r.agent_id, r.grain, r.bucket, r.reason): r.proposals
        for r in RefusalRollup.objects.filter(project_id=project_id)
        if r.proposals
    }


class RefusalTallyTests(BaseTestCase):
    def setUp(self):
        self.second = Agent.objects.create(project=self.project, name="second-bot")
        self.clients = {self.agent.pk: self.api(), self.second.pk: self.api(
            api_key_issue(agent=self.second).plain)}  # fmt: skip
        for tool in ("pay", "refund"):
            response = self.clients[self.agent.pk].put(
                f"/api/v1/tools/{tool}",
                {
                    **FOLLOW_UP,
                    "volatile_arguments": ["/nonce"],
                    "max_identical": 2,
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "ticket_id": {"type": "string"},
                            "nonce": {"type": "string"},
                        },
                        "required": ["ticket_id"],
                    },
                },
                format="json",
            )
            assert response.status_code in (200, 201), response.content

    def propose(self, agent_id: int, tool: str, nonce: str, request_id: str) -> dict:
        response = self.clients[agent_id].post(
            "/api/v1/calls",
            {
                "format": "plain",
                "call": {"tool": tool, "arguments": {"ticket_id": "T-1", "nonce": nonce}},
                "request_id": request_id,
            },
            format="json",
        )
        assert response.status_code == 200, response.content
        return response.json()

    def loop(self, agent_id: int, tool: str, request_id: str, times: int) -> list[dict]:
        return [self.propose(agent_id, tool, str(n), request_id) for n in range(times)]

    def test_refused_proposals_are_counted_once_as_a_recount_of_the_events_would(self):
        self.loop(self.agent.pk, "pay", "r1", 5)  # 2 allowed, 3 loops
        self.loop(self.agent.pk, "refund", "r2", 4)  # 2 loops
        self.loop(self.second.pk, "pay", "r3", 3)  # 1 loop
        refused = CallEvent.objects.filter(tallies.REFUSED_PROPOSAL, project=self.project)
        assert refused.count() == 6
        counted = cells(self.project.pk)
        assert sum(n for k, n in counted.items() if k[0] == "total" and k[3] == "day") == 6
        # eight cells a refusal: hour and day, times the four dims
        assert sum(counted.values()) == 6 * 8
        tallies.refusal_rollups_rebuild(project_id=self.project.pk)
        assert cells(self.project.pk) == counted
        migration = importlib.import_module("callgate.migrations.0022_refusal_rollup")
        RefusalRollup.objects.all().delete()
        migration.backfill(django_apps, None)
        assert cells(self.project.pk) == counted
        RefusalRollup.objects.filter(project=self.project).update(proposals=99)  # drifted
        call_command("backfill_rollups", "--project", self.project.slug, verbosity=0)
        assert cells(self.project.pk) == counted

    def test_the_reasons_report_counts_them_per_tool_and_agent(self):
        self.loop(self.agent.pk, "pay", "r1", 5)
        self.loop(self.agent.pk, "refund", "r2", 4)
        self.loop(self.second.pk, "pay", "r3", 3)
        hour = hour_floor(timezone.now())
        for tool, agent_id, expected in (
            ("", None, 6),
            ("pay", None, 4),
            ("refund", None, 2),
            ("", self.second.pk, 1),
            ("pay", self.agent.pk, 3),
            ("refund", self.second.pk, 0),
        ):
            f = reports.ReportFilters(
                since=hour - timedelta(days=3), until=hour + timedelta(hours=1),
                tool=tool, agent_id=agent_id,
            )  # fmt: skip
            data = reports.report_reasons(project=self.project, f=f)
            assert data["refused_total"] == expected, (tool, agent_id, data)
            rows = {r["reason"]: r["refused"] for r in data["rows"] if r["refused"]}
            assert rows == ({"loop_detected": expected} if expected else {})
        # a range that ends before them counts none
        f = reports.ReportFilters(since=hour - timedelta(days=3), until=hour)
        assert reports.report_reasons(project=self.project, f=f)["refused_total"] == 0
        # nor does another project
        assert not RefusalRollup.objects.filter(project=self.other_project).exists()

    @skipUnless(connection.vendor == "postgresql", "batch_write's one statement")
    def test_a_refused_gate_check_takes_no_statement_more_than_an_allowed_one(self):
        self.loop(self.agent.pk, "pay", "warm-up", 3)
        with CaptureQueriesContext(connection) as allowed:
            assert self.propose(self.agent.pk, "pay", "a", "r9")["verdict"] == "allow"
        self.propose(self.agent.pk, "pay", "b", "r9")
        with CaptureQueriesContext(connection) as refused:
            assert self.propose(self.agent.pk, "pay", "c", "r9")["reason"] == "loop_detected"
        assert len(refused) == len(allowed), [q["sql"][:80] for q in refused]
        assert sum(cells(self.project.pk).values()) == 2 * 8


@skipUnless(connection.vendor == "postgresql", "advisory locks")
class TallyLockTests(BaseTestCase):
    """An addition holds the project's tally lock shared, a rebuild exclusively: a rebuild
    waits for the additions in flight and holds new ones back, so that none is counted
    twice or lost (a rebuild read the items, a close committed, the delete wiped it)."""

    def other_session(self, function: str, lock_class: int):
        """A second connection holding ``function(lock_class, project)`` (session level)."""
        settings = connection.settings_dict
        other = psycopg.connect(
            dbname=settings["NAME"], host=settings["HOST"], port=settings["PORT"] or 5432,
            user=settings["USER"], autocommit=True,
        )  # fmt: skip
        other.execute(f"SELECT {function}(%s, %s)", [lock_class, self.project.pk])
        return other

    def attempt(self, action) -> bool:
        """Does ``action`` get through within 300 ms (else it waited on a lock)?"""
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '300ms'")
                action()
            return True
        except OperationalError as exc:
            assert "lock timeout" in str(exc), exc
            return False

    def refused_event(self) -> CallEvent:
        call = make_call(
            project=self.project, agent=self.agent, created_at=timezone.now(), tool="pay"
        )
        event = CallEvent(
            project=self.project, kind=CallEvent.Kind.PROPOSED, reason="loop_detected",
            state_before="allowed", state_after="allowed", occurred_at=call.created_at, body={},
        )  # fmt: skip
        event.call = call
        return event

    def test_a_batch_adding_refusals_waits_for_a_rebuild_of_the_projects_cells(self):
        event = self.refused_event()

        def write() -> None:
            batch_write(new_calls=[], changed_calls=[], events=[event], budgets=[], touched=[])

        other = self.other_session("pg_advisory_lock", tallies.LOCK_CLASS[RefusalRollup])
        try:
            assert not self.attempt(write)
            assert not CallEvent.objects.filter(project=self.project).exists()  # rolled back
        finally:
            other.close()
        assert self.attempt(write)
        assert sum(cells(self.project.pk).values()) == 8

    def test_a_review_closing_waits_for_a_rebuild_and_a_rebuild_for_closings(self):
        item = make_item(self.project, self.agent)

        def decide() -> None:
            services.review_item_decide(item=item, user=self.alice, decision="reject", reason="x")

        other = self.other_session("pg_advisory_lock", tallies.LOCK_CLASS[ReviewRollup])
        try:
            assert not self.attempt(decide)
        finally:
            other.close()
        other = self.other_session("pg_advisory_lock_shared", tallies.LOCK_CLASS[ReviewRollup])
        try:  # shared with another addition, exclusive of a rebuild
            assert self.attempt(decide)
            assert not self.attempt(
                lambda: tallies.review_rollups_rebuild(project_id=self.project.pk)
            )
        finally:
            other.close()
        assert self.attempt(lambda: tallies.review_rollups_rebuild(project_id=self.project.pk))
        assert ReviewRollup.objects.filter(project=self.project).count() == 8
