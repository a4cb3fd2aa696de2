"""The demo's history (demo.history): realistic rhythm and incidents, rollups that match,
and seeding twice resets instead of duplicating."""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timedelta

from django.utils import timezone

from callgate.escalation import review_audit
from callgate.lint import lint_contract
from callgate.models import CallRollup, Membership, ToolCall, ToolContract
from callgate.reports.selectors import direct_counts
from demo.fleet import AGENT_TOOLS, WAITING_SHIFT_LIMIT, agent_tool_sets, spread_over_days
from demo.history import AT_THE_GATE, HISTORY_PREFIX, Incidents, demo_reset, history_seed
from reviews.models import ReviewItem
from reviews.selectors import queue_progress
from tests.factories import (
    BaseTestCase,
    make_call,
    make_review_item,
    make_user,
    rollup_counts,
)


def last_thursday_noon() -> datetime:
    """The latest Thursday 12:00 UTC at least a day ago: the history's weekdays, weekends and
    incidents fall on the same days whatever day the suite runs."""
    day = (timezone.now() - timedelta(days=1)).replace(hour=12, minute=0, second=0, microsecond=0)
    return day - timedelta(days=(day.weekday() - 3) % 7)


class DemoHistoryTests(BaseTestCase):
    def test_it_seeds_weeks_of_rhythmic_traffic_with_incidents_and_resets(self):
        now = last_thursday_noon()
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


class DemoDataHonestyTests(BaseTestCase):
    """What the demo's pages say agrees with its data (issue 15): lint scores with their
    findings, each agent's own tools, items and decisions at their calls' times."""

    @classmethod
    def setUpTestData(cls):
        super().setUpTestData()
        cls.operator = make_user("operator")
        Membership.objects.create(
            project=cls.project, user=cls.operator, role=Membership.Role.OPERATOR
        )
        cls.now = last_thursday_noon()
        cls.result = history_seed(project=cls.project, seed=5, days=4, now=cls.now)

    def test_it_scores_its_contracts_with_the_linter(self):
        versions = ToolContract.objects.filter(project=self.project, name="book_meeting")
        assert versions.count() == 2
        for contract in versions:
            report = lint_contract(
                name=contract.name,
                description=contract.description,
                parameters=contract.parameters,
            )
            assert contract.lint_score == report.score
            key = lambda f: (f["path"], f["code"])  # noqa: E731 (jsonb keeps its own key order)
            assert sorted(contract.lint_findings, key=key) == sorted(
                (f.as_dict() for f in report.findings), key=key
            )
            # a score below 100 lists what to improve; 100 lists nothing
            assert (contract.lint_score < 100) == bool(contract.lint_findings)
        page = self.client
        page.force_login(self.maria)
        html = page.get("/p/acme/contracts/book_meeting/").content.decode()
        assert "nothing to improve" not in html

    def test_it_gives_each_agent_its_own_tools(self):
        registered = {
            agent.name: set(agent.tools.values_list("name", flat=True))
            for agent in self.project.agents.all()
        }
        assert registered["shop-bot"] == {"get_weather", "search_products"}
        assert registered["finance-bot"] == {"issue_payout", "book_meeting"}
        assert "book_meeting" in registered["support-bot"]
        assert "issue_payout" not in registered["support-bot"]
        assert len({frozenset(tools) for tools in registered.values()}) == len(registered)
        # every history call is by an agent that registered the tool
        for name, tool in (
            ToolCall.objects.filter(project=self.project)
            .values_list("agent__name", "tool_name")
            .distinct()
        ):
            assert tool in registered[name], (name, tool)

    def test_its_decisions_keep_their_calls_times_and_say_who(self):
        items = ReviewItem.objects.filter(project=self.project).select_related("call")
        assert items.count() == self.result.review_items > 3
        for item in items:
            assert item.created_at == item.call.created_at
            assert item.resolved_at == item.call.decided_at > item.created_at
            assert item.call.decided_by == item.resolved_by == self.operator
            trail = list(item.audit.order_by("created_at"))
            assert [a.action for a in trail] == ["opened", item.resolution]
            assert [a.created_at for a in trail] == [item.created_at, item.resolved_at]
        # "decided today" counts the decisions made since midnight (UTC), no older ones
        midnight = self.now.replace(hour=0, minute=0, second=0, microsecond=0)
        today = items.filter(resolved_at__gte=midnight).count()
        assert today < items.count()
        progress = {
            p["user"].username: p["decided_today"]
            for p in queue_progress(project=self.project, now=self.now)
        }
        assert progress.get("operator", 0) == today


class DemoSpreadTests(BaseTestCase):
    """``demo.fleet.spread_over_days`` moves a call's whole story back in time together."""

    def test_it_moves_items_audit_and_decisions_with_their_call(self):
        now = timezone.now()
        decided = make_call(
            project=self.project,
            agent=self.agent,
            created_at=now - timedelta(seconds=30),
            reason="retry_exhausted",
            state=ToolCall.State.SUCCEEDED,
            decision="approve_retry",
            decided_at=now,
        )
        item = make_review_item(
            decided,
            reason="retry_exhausted",
            status=ReviewItem.Status.RESOLVED,
            resolution="approve_retry",
            resolved_by=self.olga,
            resolved_at=now,
            created_at=now - timedelta(seconds=20),
        )
        review_audit(item=item, action="opened", before="", after="open")
        waiting = make_call(
            project=self.project,
            agent=self.agent,
            created_at=now,
            reason="approval_pending",
            state=ToolCall.State.PENDING_APPROVAL,
            approval_expires_at=now + timedelta(minutes=5),
        )
        spread_over_days(project=self.project, rng=random.Random(2), days=3)
        decided.refresh_from_db()
        item.refresh_from_db()
        shift = now - timedelta(seconds=30) - decided.created_at
        assert shift > timedelta(minutes=15)  # moved back (seed 2 moves it hours)
        assert decided.decided_at == now - shift
        assert item.created_at == now - timedelta(seconds=20) - shift
        assert item.resolved_at == now - shift
        assert item.audit.get().created_at < now - shift + timedelta(seconds=5)
        waiting.refresh_from_db()
        # still waiting: moved back a little, and its approval has not run out
        assert now - waiting.created_at <= timedelta(seconds=WAITING_SHIFT_LIMIT)
        assert waiting.approval_expires_at > timezone.now()
        assert waiting.approval_expires_at - waiting.created_at == timedelta(minutes=5)


class FleetToolSetTests(BaseTestCase):
    def test_each_role_registers_its_own_tools_and_a_small_fleet_keeps_every_tool(self):
        sets = agent_tool_sets(["support-bot", "shop-bot", "finance-bot", "legacy-bot"])
        assert sets["shop-bot"] == ("get_weather", "search_products")
        assert sets["finance-bot"] == ("issue_payout",)
        assert len(set(sets.values())) == 4
        assert agent_tool_sets(["support-bot-2"])["support-bot-2"][:5] == sets["support-bot"]
        # one agent alone runs every episode: it registers every tool
        alone = agent_tool_sets(["shop-bot"])["shop-bot"]
        assert set(alone) == {t for tools in AGENT_TOOLS.values() for t in tools}


class DemoHistoryArgumentsTests(BaseTestCase):
    def test_history_calls_carry_the_arguments_their_tool_takes(self):
        history_seed(project=self.project, seed=2, days=2)
        calls = ToolCall.objects.filter(project=self.project)
        assert not calls.filter(arguments={}).exists()
        for call in calls.filter(tool_name="issue_payout")[:5]:
            assert call.arguments["iban"] == "•••" and call.arguments["amount_cents"] > 0
        meetings = calls.filter(tool_name="book_meeting", contract__version=2)
        for call in meetings[:20]:
            forgot = call.category == "argument_error"
            assert ("timezone" in call.arguments) is not forgot, call.reason

    def test_only_calls_refused_before_they_ran_are_rejected_at_the_gate(self):
        history_seed(project=self.project, seed=4, days=4)
        calls = ToolCall.objects.filter(project=self.project)
        rejected = calls.filter(state=ToolCall.State.REJECTED)
        assert rejected.exists() and not rejected.filter(attempts__gt=0).exists()
        assert set(rejected.values_list("reason", flat=True)) <= AT_THE_GATE
        assert not calls.filter(reason__in=AT_THE_GATE, attempts__gt=0).exists()
        # refused by the target after an attempt: failed, not "rejected at the gate"
        denied = calls.filter(reason="permission_denied")
        assert denied.exists()
        assert set(denied.values_list("state", flat=True)) == {ToolCall.State.FAILED}
        assert not denied.filter(attempts=0).exists()
