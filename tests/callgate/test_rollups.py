"""Rollups equal a direct count over the calls, after late changes and a refresh."""

from __future__ import annotations

import io
import random
import threading
from datetime import UTC, datetime, timedelta

from django.core.cache import cache
from django.core.management import call_command
from django.db import connection, connections
from django.db.models import Sum
from django.test import TransactionTestCase
from django.utils import timezone

from callgate.models import Agent, CallRollup, RollupCube, RollupDirtyBucket, ToolCall
from callgate.reports import rollups
from callgate.reports.selectors import direct_counts
from callgate.taxonomy import TABLE, Reason
from tests.factories import BaseTestCase, make_call, rollup_counts

REASONS = [r for r in Reason]
STATES = [s for s in ToolCall.State]


def generate(rng: random.Random, *, project, agents, now, n=300) -> list[ToolCall]:
    tools = ["get_weather", "create_follow_up", "issue_refund", ""]
    calls = []
    for _ in range(n):
        reason = rng.choice(REASONS + [""])
        calls.append(
            make_call(
                project=project,
                agent=rng.choice(agents),
                tool=rng.choice(tools),
                reason=reason,
                created_at=now
                - timedelta(minutes=rng.randrange(0, 60 * 30), seconds=rng.randrange(60)),
                attempts=rng.randrange(0, 5),
                duplicates=rng.choice([0, 0, 0, 1, 2]),
                state=rng.choice(STATES),
            )
        )
    return calls


def cube_sums(project, dims: str, grain: str) -> dict:
    """``{(bucket, *dimension values): (calls, attempts, unknown)}`` of a cube."""
    return {
        (r["bucket"], *(r[c] for c in rollups.CUBE_DIMS[dims])): (
            r["calls"],
            r["attempts"],
            r["unknown_calls"],
        )
        for r in RollupCube.objects.filter(project=project, dims=dims, grain=grain).values()
        if r["calls"]
    }


def rollup_sums(project, dims: str, grain: str) -> dict:
    """The same sums computed from ``CallRollup`` (what the cube must equal)."""
    out: dict = {}
    for r in CallRollup.objects.filter(project=project).values():
        floor = {"hour": rollups.hour_floor, "day": rollups.day_floor}.get(
            grain, rollups.month_floor
        )
        bucket = floor(r["bucket"])
        key = (bucket, *(r[c] for c in rollups.CUBE_DIMS[dims]))
        n, a, u = out.get(key, (0, 0, 0))
        out[key] = (n + r["calls"], a + r["attempts"], u + r["unknown_calls"])
    return {k: v for k, v in out.items() if v[0]}


def assert_cubes_agree(project) -> None:
    for dims in rollups.CUBE_DIMS:
        for grain in ("hour", "day", "month"):
            assert cube_sums(project, dims, grain) == rollup_sums(project, dims, grain), (
                dims,
                grain,
            )


class RollupsTests(BaseTestCase):
    def setUp(self):
        cache.delete(rollups.WATERMARK_KEY)
        self.agent2 = Agent.objects.create(project=self.project, name="travel-bot")

    def test_it_equals_a_direct_count_after_late_changes_and_a_refresh(self):
        now = timezone.now()
        for seed in (1, 2, 3):
            rng = random.Random(seed)
            ToolCall.objects.all().delete()
            CallRollup.objects.all().delete()
            cache.delete(rollups.WATERMARK_KEY)
            calls = generate(
                rng,
                project=self.project,
                agents=[self.agent, self.agent2],
                now=now - timedelta(minutes=5),
            )
            generate(
                rng,
                project=self.other_project,
                agents=[self.other_agent],
                now=now - timedelta(minutes=5),
                n=40,
            )
            rollups.rollups_rebuild()
            since, until = now - timedelta(days=3), now + timedelta(hours=1)
            assert rollup_counts(self.project) == direct_counts(
                project=self.project, since=since, until=until
            )
            assert_cubes_agree(self.project)

            # late changes: a new reason, more attempts, a suppressed duplicate, some new calls
            changed_at = now + timedelta(seconds=1)
            for call in rng.sample(calls, 60):
                reason = rng.choice(REASONS)
                category, route = TABLE[reason]
                ToolCall.objects.filter(pk=call.pk).update(
                    reason=reason,
                    category=category,
                    route=route,
                    attempts=call.attempts + rng.randrange(3),
                    duplicates_suppressed=call.duplicates_suppressed + rng.choice([0, 1]),
                    updated_at=changed_at,
                )
                rollups.buckets_touch([call])  # as every writer of calls does
            late = make_call(
                project=self.project, agent=self.agent, created_at=changed_at, updated_at=changed_at
            )
            rollups.buckets_touch([late])
            assert rollup_counts(self.project) != direct_counts(
                project=self.project, since=since, until=until
            )

            result = rollups.rollups_refresh_changed(now=now + timedelta(minutes=1))
            assert result["buckets"] > 0
            assert not RollupDirtyBucket.objects.exists()
            assert rollup_counts(self.project) == direct_counts(
                project=self.project, since=since, until=until
            )
            assert rollup_counts(self.other_project) == direct_counts(
                project=self.other_project, since=since, until=until
            )
            assert_cubes_agree(self.project)
            assert_cubes_agree(self.other_project)

    def test_rollup_rows_count_each_call_once_over_any_range(self):
        """Month rows for whole months, day rows for whole days, hour rows at the ends:
        the sums over ``rollup_rows`` equal ``CallRollup``'s for ranges that start and end
        anywhere, with every filter and grouping (each picking another cube, or
        ``CallRollup`` itself)."""
        now = rollups.hour_floor(timezone.now())
        rng = random.Random(7)
        # calls over ten weeks, so ranges cross whole days and whole months
        for day in (0, 1, 2, 3, 20, 35, 50, 65):
            generate(
                rng,
                project=self.project,
                agents=[self.agent, self.agent2],
                now=now - timedelta(days=day),
                n=60,
            )
        rollups.rollups_rebuild()
        cases = [
            {},
            {"tool": "issue_refund"},
            {"tool": ""},
            {"agent_id": self.agent2.pk},
            {"by": ("tool_name",)},
            {"by": ("agent_id",)},
            {"by": ("contract_id",)},
            {"tool": "get_weather", "agent_id": self.agent.pk},
            {"period": "hour"},
            {"period": "day"},
            {"period": "week", "by": ("agent_id",)},
        ]
        ranges = ((-100, 2), (-50, -3), (-30, -29), (-72, -24), (-200, 200), (-24 * 70, 5))
        for since_h, until_h in ranges:
            since, until = now + timedelta(hours=since_h), now + timedelta(hours=until_h)
            for case in cases:
                expected = CallRollup.objects.filter(
                    project=self.project, bucket__gte=since, bucket__lt=until
                )
                if "tool" in case:
                    expected = expected.filter(tool_name=case["tool"])
                if "agent_id" in case:
                    expected = expected.filter(agent_id=case["agent_id"])
                got = rollups.rollup_rows(
                    project_id=self.project.pk, since=since, until=until, **case
                )
                with self.subTest(since=since_h, until=until_h, case=case):
                    assert got.aggregate(n=Sum("calls"), a=Sum("attempts")) == expected.aggregate(
                        n=Sum("calls"), a=Sum("attempts")
                    )
        everything = rollups.rollup_rows(project_id=self.project.pk).aggregate(n=Sum("calls"))
        assert everything["n"] == ToolCall.objects.filter(project=self.project).count()

    def test_it_moves_calls_between_cells_when_the_reason_changes(self):
        hour = rollups.hour_floor(timezone.now()) - timedelta(hours=3)
        call = make_call(
            project=self.project,
            agent=self.agent,
            created_at=hour + timedelta(minutes=5),
            reason=Reason.OUTCOME_UNKNOWN,
            attempts=1,
        )
        rollups.rollup_bucket_refresh(project_id=self.project.pk, bucket=hour)
        assert list(CallRollup.objects.values_list("reason", "calls")) == [("outcome_unknown", 1)]

        ToolCall.objects.filter(pk=call.pk).update(
            reason="reconciled_applied",
            category="reconciliation",
            route="return_receipt",
            updated_at=timezone.now(),
        )
        rollups.buckets_touch([call])
        rollups.rollups_refresh_changed()
        rows = list(
            CallRollup.objects.values_list("bucket", "reason", "category", "route", "calls")
        )
        assert rows == [(hour, "reconciled_applied", "reconciliation", "return_receipt", 1)]

    def test_ingest_marks_the_buckets_of_the_calls_it_writes(self):
        from callgate.ingest import events_apply
        from callgate.schemas import EVENT_ADAPTER
        from tests.factories import make_event

        proposal = make_event(
            "proposed",
            operation_id="op-rollup",
            format="plain",
            call={"name": "get_weather", "arguments": {"city": "Oslo"}},
        )
        events_apply(
            project=self.project, agent=self.agent, events=[EVENT_ADAPTER.validate_python(proposal)]
        )
        call = ToolCall.objects.get(operation_id="op-rollup")
        assert list(RollupDirtyBucket.objects.values_list("project_id", "bucket")) == [
            (self.project.pk, rollups.hour_floor(call.created_at))
        ]
        rollups.rollups_refresh_changed()
        now = timezone.now()
        assert rollup_counts(self.project) == direct_counts(
            project=self.project, since=now - timedelta(hours=2), until=now + timedelta(hours=1)
        )
        assert not RollupDirtyBucket.objects.exists()

    def test_it_skips_buckets_nothing_changed_in(self):
        old = timezone.now() - timedelta(days=2)
        make_call(project=self.project, agent=self.agent, created_at=old)
        result = rollups.rollups_refresh_changed()
        assert result["buckets"] == 0
        assert not CallRollup.objects.exists()

    def test_it_is_idempotent(self):
        hour = rollups.hour_floor(timezone.now())
        make_call(project=self.project, agent=self.agent, created_at=hour, attempts=2, duplicates=1)
        rollups.rollup_bucket_refresh(project_id=self.project.pk, bucket=hour)
        rollups.rollup_bucket_refresh(project_id=self.project.pk, bucket=hour)
        assert CallRollup.objects.aggregate(
            c=Sum("calls"), a=Sum("attempts"), d=Sum("duplicates_suppressed")
        ) == {"c": 1, "a": 2, "d": 1}

    def test_it_runs_as_a_celery_task(self):
        call = make_call(project=self.project, agent=self.agent, created_at=timezone.now())
        rollups.buckets_touch([call])
        rollups.refresh_rollups.delay()
        assert CallRollup.objects.get().calls == 1

    def test_it_is_scheduled_every_minute(self):
        from django.conf import settings

        entries = [
            e
            for e in settings.CELERY_BEAT_SCHEDULE.values()
            if e["task"] == "callgate.rollups.refresh_rollups"
        ]
        assert len(entries) == 1 and entries[0]["schedule"] == 60.0

    def test_it_backfills_with_progress_and_drops_emptied_buckets(self):
        base = datetime(2026, 1, 5, 10, tzinfo=UTC)
        for i in range(3):
            make_call(project=self.project, agent=self.agent, created_at=base + timedelta(hours=i))
        make_call(project=self.other_project, agent=self.other_agent, created_at=base)
        stale = CallRollup.objects.create(
            project=self.project,
            bucket=base + timedelta(hours=7),
            agent=self.agent,
            reason="ok",
            category="ok",
            route="proceed",
            calls=9,
        )
        out = io.StringIO()
        call_command(
            "backfill_rollups", "--project", "acme", "--since", "2026-01-05T11:00:00Z", stdout=out
        )
        text = out.getvalue()
        assert "3/3" in text and "done" in text.lower()
        assert not CallRollup.objects.filter(pk=stale.pk).exists()
        assert sorted(
            CallRollup.objects.filter(project=self.project).values_list("bucket", flat=True)
        ) == [base + timedelta(hours=1), base + timedelta(hours=2)]
        assert not CallRollup.objects.filter(project=self.other_project).exists()

    def test_it_rejects_an_unknown_project_in_the_backfill(self):
        from django.core.management.base import CommandError

        try:
            call_command("backfill_rollups", "--project", "nope", stdout=io.StringIO())
        except CommandError as exc:
            assert "nope" in str(exc)
        else:
            raise AssertionError("expected CommandError")


class RollupsConcurrencyTests(TransactionTestCase):
    """Refreshes of one bucket from several connections at once are serialised (PostgreSQL)."""

    def test_it_survives_concurrent_refreshes_of_one_bucket(self):
        if connection.vendor != "postgresql":
            self.skipTest("needs PostgreSQL (SQLite serialises every write transaction anyway)")
        from callgate.models import Project

        project = Project.objects.create(slug="race", name="Race")
        agent = Agent.objects.create(project=project, name="bot")
        hour = rollups.hour_floor(timezone.now())
        for i in range(30):
            make_call(
                project=project,
                agent=agent,
                created_at=hour + timedelta(seconds=i),
                tool=f"t{i % 5}",
                reason=REASONS[i % 7],
            )
        errors: list[BaseException] = []
        barrier = threading.Barrier(6)

        def refresh():
            try:
                barrier.wait()
                for _ in range(5):
                    rollups.rollup_bucket_refresh(project_id=project.pk, bucket=hour)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=refresh) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert rollup_counts(project) == direct_counts(
            project=project, since=hour, until=hour + timedelta(hours=1)
        )
