"""``manage.py seed_scale``: the clones are rows as the ingest engine writes them."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from io import StringIO
from unittest import skipUnless

from django.core.management import call_command
from django.db import connection, models
from django.test import TestCase
from django.utils import timezone

from callgate.models import CallEvent, CallRollup, Project, RequestBudget, ToolCall
from callgate.reports.selectors import direct_counts
from demo import seeding
from reviews.models import ReviewAudit, ReviewItem


def filled(row: models.Model) -> frozenset[str]:
    """The columns of ``row`` holding a value (not NULL, not empty text or JSON)."""
    return frozenset(
        f.attname
        for f in row._meta.concrete_fields
        if getattr(row, f.attname) not in (None, "", [], {})
    )


@skipUnless(connection.vendor == "postgresql", "seed_scale is set-based PostgreSQL SQL")
class SeedScaleTests(TestCase):
    def test_seeded_rows_match_what_the_ingest_engine_writes(self):
        # The reference: the same scenarios driven through the engine into another project.
        reference = Project.objects.create(slug="reference", name="Reference")
        seeding.membership_operator(reference)
        seeding._templates(reference)
        shapes = {
            model: {filled(r) for r in model.objects.filter(project=reference)}
            for model in (ToolCall, CallEvent, ReviewItem, ReviewAudit)
        }
        outcomes = set(
            ToolCall.objects.filter(project=reference).values_list("state", "reason", "route")
        )

        out = StringIO()
        call_command("seed_scale", "big", "--calls", "1500", "--days", "30", stdout=out, stderr=out)
        project = Project.objects.get(slug="big")
        calls = list(ToolCall.objects.filter(project=project))
        assert len(calls) == 1500
        assert len({c.operation_id for c in calls}) == 1500
        for model, allowed in shapes.items():
            rows = model.objects.filter(project=project)
            assert rows.exists(), model
            unexpected = {filled(r) for r in rows} - allowed
            assert not unexpected, (model.__name__, unexpected)
        assert {(c.state, c.reason, c.route) for c in calls} <= outcomes
        # no leftovers of the template project
        assert Project.objects.count() == 2

        # spread over the window, newest first in the last days, timestamps consistent
        now = timezone.now()
        assert min(c.created_at for c in calls) >= now - timedelta(days=30, minutes=1)
        assert max(c.created_at for c in calls) <= now
        assert all(c.updated_at >= c.created_at for c in calls)
        assert not CallEvent.objects.filter(
            project=project, received_at__lt=models.F("call__created_at")
        ).exists()
        events_per_call = Counter(
            CallEvent.objects.filter(project=project).values_list("call_id", flat=True)
        )
        assert set(events_per_call) == {c.pk for c in calls}

        # about 3% escalated (open or decided items), each with its audit trail
        items = ReviewItem.objects.filter(project=project)
        assert 0.015 * 1500 <= items.count() <= 0.05 * 1500
        assert not items.filter(audit__isnull=True).exists()
        assert items.filter(status__in=ReviewItem.OPEN_STATUSES).exists()
        assert RequestBudget.objects.filter(project=project).exists()

        rollups = {
            (r.bucket, r.tool_name, r.agent_id, r.reason, r.route): (
                r.calls,
                r.attempts,
                r.duplicates_suppressed,
            )
            for r in CallRollup.objects.filter(project=project)
        }
        assert rollups == direct_counts(
            project=project, since=now - timedelta(days=31), until=now + timedelta(hours=1)
        )

    def test_the_same_seed_gives_the_same_calls(self):
        seeding.seed_scale(slug="one", calls=200, seed=7)
        seeding.seed_scale(slug="two", calls=200, seed=7)

        def shape(slug):
            return sorted(
                ToolCall.objects.filter(project__slug=slug).values_list(
                    "operation_id", "tool_name", "reason", "agent__name"
                )
            )

        assert shape("one") == shape("two")

    def test_bad_arguments_are_refused(self):
        with self.assertRaisesMessage(Exception, "calls and days must be at least 1"):
            call_command("seed_scale", "x", "--calls", "0", stdout=StringIO())
