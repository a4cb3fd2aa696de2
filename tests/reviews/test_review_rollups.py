"""Review rollups (``callgate.reports.tallies``): every way an item closes counts it once, in the
closing transaction; the cells equal a recount from the items; the review-health report
read from them equals a direct count over the items for any range and filter; its
percentiles stay within the histogram's bound of the exact nearest-rank value."""

from __future__ import annotations

import importlib
import math
import random
from datetime import UTC, datetime, timedelta

from django.apps import apps as django_apps
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from callgate import escalation
from callgate.metrics import hour_floor
from callgate.models import Agent
from callgate.reports import selectors as reports
from callgate.reports import tallies as rollups
from reviews import services
from reviews.models import ClosedItemCount, ReviewItem, ReviewRollup
from tests.factories import BaseTestCase, make_review_item
from tests.reviews.fixtures import make_call, make_item


def cells(project_id: int) -> dict[tuple, int]:
    """The project's cells as ``{key: items}`` (no zero cells)."""
    return {
        (r.dims, r.tool_name, r.agent_id, r.grain, r.bucket, r.status, r.resolution,
         r.decision_bucket): r.items
        for r in ReviewRollup.objects.filter(project_id=project_id)
        if r.items
    }  # fmt: skip


def closed_counts(project_id: int) -> dict[tuple, int]:
    """The project's ``ClosedItemCount`` cells as ``{(status, tool, agent, reason): items}``."""
    return {
        (r.status, r.tool_name, r.agent_id, r.reason): r.items
        for r in ClosedItemCount.objects.filter(project_id=project_id)
        if r.items
    }


def closed_items(project_id: int) -> dict[tuple, int]:
    """What ``closed_counts`` should hold: the project's closed items counted directly."""
    out: dict[tuple, int] = {}
    for item in ReviewItem.objects.filter(project_id=project_id).exclude(
        status__in=ReviewItem.OPEN_STATUSES
    ):
        key = (item.status, item.tool_name, item.agent_id or 0, item.reason)
        out[key] = out.get(key, 0) + 1
    return out


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


class ClosingPathsTests(BaseTestCase):
    def test_every_way_an_item_closes_counts_it_once_as_a_recount_would(self):
        decided = make_item(self.project, self.agent)
        services.review_item_decide(item=decided, user=self.alice, decision="reject", reason="No.")
        bulk = [make_item(self.project, self.agent, tool="send_invoice") for _ in range(2)]
        services.review_items_bulk(
            project=self.project,
            user=self.alice,
            action="reject",
            items=ReviewItem.objects.filter(pk__in=[i.pk for i in bulk]),
            reason="Burst of duplicates.",
        )
        settled = make_item(self.project, Agent.objects.create(project=self.project, name="b"))
        assert escalation.review_items_settle(call=settled.call, note="late receipt") == 1
        approval = make_item(self.project, self.agent, kind="approval")
        ReviewItem.objects.filter(pk=approval.pk).update(
            approval_expires_at=timezone.now() - timedelta(seconds=5)
        )
        assert services.review_items_expire() == 1
        make_item(self.project, self.agent)  # still open: not counted
        counted = cells(self.project.pk)
        # eight cells an item (hour and day × four dims): 5 closed items
        assert sum(counted.values()) == 5 * 8
        totals = {(k[5], k[6]): n for k, n in counted.items() if k[0] == "total" and k[3] == "day"}
        assert totals == {("resolved", "reject"): 3, ("settled", "settled"): 1,
                          ("expired", "expired"): 1}  # fmt: skip
        human = [k for k in counted if k[5] == "resolved"]
        assert human and all(k[7] >= 1 for k in human)
        assert all(k[7] == 0 for k in counted if k[5] != "resolved")
        # the queue's counts of closed items: one per status, tool, agent and reason
        kept = closed_counts(self.project.pk)
        assert kept == closed_items(self.project.pk)
        assert sum(kept.values()) == 5
        # a recount from the items gives the same cells
        rollups.review_rollups_rebuild(project_id=self.project.pk)
        assert cells(self.project.pk) == counted
        assert closed_counts(self.project.pk) == kept

    def test_settling_items_in_bulk_takes_the_same_statements_for_one_or_ten(self):
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        def statements(n: int) -> int:
            calls = [make_item(self.project, self.agent).call for _ in range(n)]
            with CaptureQueriesContext(connection) as queries:
                assert escalation.review_items_settle_bulk(calls=calls, note_by_call={}) == n
            return len(queries)

        # the counts read what the items were loaded with (a field left out was one query
        # an item, inside the ingest batch's transaction)
        assert statements(1) == statements(10)
        assert closed_counts(self.project.pk) == closed_items(self.project.pk)

    def test_a_rolled_back_decision_counts_nothing(self):
        item = make_item(self.project, self.agent)
        with self.assertRaises(RuntimeError), transaction.atomic():
            services.review_item_decide(item=item, user=self.alice, decision="reject", reason="No.")
            raise RuntimeError("the request failed after the decision")
        assert not ReviewRollup.objects.filter(project=self.project).exists()
        assert not ClosedItemCount.objects.filter(project=self.project).exists()

    def test_a_conflicting_second_decision_counts_nothing_more(self):
        item = make_item(self.project, self.agent)
        services.review_item_decide(item=item, user=self.alice, decision="reject", reason="No.")
        before, kept = cells(self.project.pk), closed_counts(self.project.pk)
        with self.assertRaises(services.ReviewConflict):
            services.review_item_decide(item=item, user=self.bob, decision="reject", reason="No.")
        assert cells(self.project.pk) == before
        assert closed_counts(self.project.pk) == kept == closed_items(self.project.pk)

    def test_the_backfill_command_recounts_and_is_idempotent(self):
        for _ in range(3):
            item = make_item(self.project, self.agent)
            services.review_item_decide(item=item, user=self.alice, decision="reject", reason="No.")
        counted, kept = cells(self.project.pk), closed_counts(self.project.pk)
        ReviewRollup.objects.filter(project=self.project).update(items=99)  # drifted
        ClosedItemCount.objects.filter(project=self.project).update(items=99)
        call_command("backfill_rollups", verbosity=0)
        assert cells(self.project.pk) == counted
        assert closed_counts(self.project.pk) == kept
        call_command("backfill_rollups", "--project", self.project.slug, verbosity=0)
        assert cells(self.project.pk) == counted

    def test_the_migrations_backfill_counts_as_a_rebuild_does(self):
        migration = importlib.import_module("reviews.migrations.0008_review_rollup")
        for decision in ("reject", "mark_applied"):
            item = make_item(self.project, self.agent)
            services.review_item_decide(item=item, user=self.alice, decision=decision, reason="x")
        escalation.review_items_settle(call=make_item(self.project, self.agent).call, note="")
        counted, kept = cells(self.project.pk), closed_counts(self.project.pk)
        ReviewRollup.objects.all().delete()
        migration.backfill(django_apps, None)
        assert cells(self.project.pk) == counted
        ClosedItemCount.objects.all().delete()
        importlib.import_module("reviews.migrations.0009_closed_item_count").backfill(
            django_apps, None
        )
        assert closed_counts(self.project.pk) == kept


class AdminDeletionTests(BaseTestCase):
    """A deletion in the admin leaves every count of the project as a recount would make
    it; the audit trail keeps the admin from deleting review items, so closed items never
    leave ``ClosedItemCount`` counting what is gone."""

    def setUp(self):
        super().setUp()
        root = get_user_model().objects.create_superuser("root", password="pw-123456789")
        self.client.force_login(root)

    def counted(self) -> dict[str, list]:
        """Every row the project's rollups and tallies hold, as comparable tuples."""
        from callgate.models import CallRollup, RefusalRollup, RollupCube

        out = {}
        for model in (CallRollup, RollupCube, RefusalRollup, ReviewRollup, ClosedItemCount):
            rows = model.objects.filter(project=self.project).values()
            out[model.__name__] = sorted(
                tuple(sorted((k, str(v)) for k, v in row.items() if k != "id")) for row in rows
            )
        return out

    def test_deleting_an_agent_leaves_the_counts_a_recount_would_make(self):
        from tests.reviews.fixtures import make_call

        retired = Agent.objects.create(project=self.project, name="retired-bot")
        for agent in (retired, retired, self.agent):
            make_call(self.project, agent, reason="ok", state="succeeded")
        self.close(self.agent)
        rollups.counts_rebuild(project_id=self.project.pk)
        before = self.counted()
        response = self.client.post(f"/admin/callgate/agent/{retired.pk}/delete/", {"post": "yes"})
        assert response.status_code == 302 and not Agent.objects.filter(pk=retired.pk).exists()
        after = self.counted()
        assert after != before  # the retired agent's calls were counted, and are no more
        rollups.counts_rebuild(project_id=self.project.pk)
        assert self.counted() == after

    def test_an_agent_or_item_with_an_audit_trail_cannot_be_deleted(self):
        item = self.close(self.agent)
        before = self.counted()
        for path in (
            f"/admin/callgate/agent/{self.agent.pk}/delete/",
            f"/admin/reviews/reviewitem/{item.pk}/delete/",
        ):
            assert self.client.post(path, {"post": "yes"}).status_code == 403, path
        assert ReviewItem.objects.filter(pk=item.pk).exists()
        assert self.counted() == before

    def close(self, agent) -> ReviewItem:
        item = make_item(self.project, agent)
        services.review_item_decide(item=item, user=self.alice, decision="reject", reason="x")
        return item


class HistogramTests(BaseTestCase):
    def test_buckets_cover_their_range_and_percentiles_stay_within_the_bound(self):
        for k in range(1, 200):
            low = 0.0 if k == 1 else 2 ** ((k - 1) / 8)
            high = 2 ** (k / 8)
            assert rollups.decision_bucket(low) == k
            assert rollups.decision_bucket(high * 0.9999) == k
            assert low <= rollups.bucket_seconds(k) < high
        rng = random.Random(18)
        for _ in range(200):
            values = [rng.lognormvariate(7, 2) + 1 for _ in range(rng.randint(1, 60))]
            counts: dict[int, int] = {}
            for v in values:
                counts[rollups.decision_bucket(v)] = counts.get(rollups.decision_bucket(v), 0) + 1
            for q in (0.5, 0.9):
                exact = nearest_rank(values, q)
                assert abs(rollups.histogram_percentile(counts, q) - exact) <= 0.0443 * exact
        assert rollups.histogram_percentile({}, 0.5) is None


class ReportFromRollupsTests(BaseTestCase):
    """The report's decided counts equal a count over the items, for ranges that start and
    end inside days (hour cells) or on their bounds (day cells), with every filter."""

    def test_decided_counts_equal_a_direct_count_for_any_range_and_filter(self):
        rng = random.Random(7)
        start = datetime(2026, 3, 1, tzinfo=UTC)
        second = Agent.objects.create(project=self.project, name="second")
        calls = [
            make_call(self.project, rng.choice([self.agent, second]),
                      tool=rng.choice(["send_invoice", "issue_refund"]))
            for _ in range(60)
        ]  # fmt: skip
        for call in calls:
            opened = start + timedelta(minutes=rng.randint(0, 6 * 24 * 60))
            status = rng.choice(["resolved", "resolved", "settled", "expired"])
            make_review_item(
                call,
                status=status,
                resolution=rng.choice(["reject", "mark_applied"]) if status == "resolved"
                else status,
                created_at=opened,
                resolved_at=opened + timedelta(seconds=rng.randint(0, 40_000)),
            )  # fmt: skip
        items = ReviewItem.objects.filter(project=self.project)
        for since, until in (
            (start, start + timedelta(days=8)),
            (start + timedelta(hours=5), start + timedelta(days=3, hours=17)),
            (start + timedelta(days=1), start + timedelta(days=2)),
            (start + timedelta(hours=30), start + timedelta(hours=31)),
        ):
            for tool, agent_id in (
                ("", None),
                ("send_invoice", None),
                ("", second.pk),
                ("issue_refund", self.agent.pk),
            ):
                f = reports.ReportFilters(
                    since=since, until=until, granularity="day", tool=tool, agent_id=agent_id
                )
                data = reports.report_review(project=self.project, f=f)
                direct = items.filter(resolved_at__gte=since, resolved_at__lt=until)
                if tool:
                    direct = direct.filter(tool_name=tool)
                if agent_id is not None:
                    direct = direct.filter(agent_id=agent_id)
                key = (since, until, tool, agent_id)
                assert data["decided"] == direct.count(), key
                human = [
                    (i.resolved_at - i.created_at).total_seconds()
                    for i in direct.filter(status="resolved")
                ]
                assert data["human_decided"] == len(human), key
                by_resolution: dict[str, int] = {}
                for resolution in direct.values_list("resolution", flat=True):
                    by_resolution[resolution] = by_resolution.get(resolution, 0) + 1
                assert {d["resolution"]: d["items"] for d in data["decisions"]} == by_resolution
                if human:
                    for name, q in (("median_seconds", 0.5), ("p90_seconds", 0.9)):
                        exact = nearest_rank(human, q)
                        # a decision under 1.09 s reads as about a second
                        assert abs(data[name] - exact) <= max(0.0443 * exact, 1.1), (key, name)
                else:
                    assert data["median_seconds"] is None

    def test_another_projects_items_are_not_counted(self):
        foreign = make_call(self.other_project, self.other_agent)
        now = timezone.now()
        make_review_item(
            foreign, status="resolved", resolution="reject", created_at=now, resolved_at=now
        )
        hour = hour_floor(now)
        f = reports.ReportFilters(since=hour - timedelta(days=1), until=hour + timedelta(hours=1))
        assert reports.report_review(project=self.project, f=f)["decided"] == 0
        assert reports.report_review(project=self.other_project, f=f)["decided"] == 1
