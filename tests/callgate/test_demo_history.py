"""The demo's history (demo.history): realistic rhythm and incidents, rollups that match,
and seeding twice resets instead of duplicating."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from django.utils import timezone

from callgate.models import CallRollup, ToolCall, ToolContract
from callgate.reports.selectors import direct_counts
from demo.history import HISTORY_PREFIX, Incidents, demo_reset, history_seed
from tests.factories import BaseTestCase, rollup_counts


class DemoHistoryTests(BaseTestCase):
    def test_it_seeds_weeks_of_rhythmic_traffic_with_incidents_and_resets(self):
        now = timezone.now()
        # a contract allowing a single attempt (the demo's issue_payout has max_attempts=1)
        ToolContract.objects.create(
            project=self.project,
            name="get_weather",
            version=1,
            parameters={},
            digest="x",
            max_attempts=1,
        )
        result = history_seed(project=self.project, seed=3, days=14, now=now)
        calls = ToolCall.objects.filter(project=self.project)
        assert result.calls == calls.count() > 2000
        assert calls.filter(operation_id__startswith=HISTORY_PREFIX).count() == result.calls
        # daily and weekly rhythm
        created = list(calls.values_list("created_at", flat=True))
        by_hour = Counter(c.hour for c in created)
        assert by_hour[10] > 4 * by_hour[3]
        days = Counter(c.date() for c in created if c < now - timedelta(days=1))
        weekday = [n for d, n in days.items() if d.weekday() < 5]
        weekend = [n for d, n in days.items() if d.weekday() >= 5]
        assert sum(weekday) / len(weekday) > 1.6 * sum(weekend) / len(weekend)
        # the incidents
        incidents = Incidents.relative_to(now)
        meetings = calls.filter(tool_name="book_meeting")
        after = meetings.filter(
            created_at__gte=incidents.contract_change,
            created_at__lt=incidents.contract_change + timedelta(days=1),
        )
        before = meetings.filter(created_at__lt=incidents.contract_change)
        assert {c.contract.version for c in after} == {2}
        rate_after = after.filter(category="argument_error").count() / after.count()
        rate_before = before.filter(category="argument_error").count() / max(before.count(), 1)
        assert rate_after > 0.25 and rate_after > 4 * rate_before
        outage = calls.filter(
            created_at__gte=incidents.outage[0],
            created_at__lt=incidents.outage[1],
            tool_name="get_weather",
        )
        assert outage.filter(reason="retry_exhausted").count() > outage.count() / 3
        assert outage.filter(reason="ok", attempts__gte=2).exists()
        storm = calls.filter(created_at__gte=incidents.storm[0], created_at__lt=incidents.storm[1])
        assert storm.filter(reason="loop_detected").count() > 20
        assert sum(storm.values_list("duplicates_suppressed", flat=True)) > 500
        # the reports read rollups equal to the calls
        since = now - timedelta(days=15)
        assert rollup_counts(self.project) == direct_counts(
            project=self.project, since=since, until=now + timedelta(hours=1)
        )
        # seeding again after a reset gives the same history, not twice as much
        assert demo_reset(project=self.project) == result.calls
        assert not CallRollup.objects.filter(project=self.project).exists()
        again = history_seed(project=self.project, seed=3, days=14, now=now)
        assert again.calls == result.calls == calls.count()
