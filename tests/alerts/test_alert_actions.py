"""Alerts operators can act on: the calls behind an alert, acknowledge / snooze / unsnooze /
resolve (recorded with who and when, notifications held back as Sentry does), the count in
the navigation, the overview's panel and the absolute links of notifications."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from unittest import mock

import httpx
from django.core import mail
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from alerts import services
from alerts.models import AlertDelivery, AlertEvent, AlertRule
from alerts.selectors import firing_unhandled_count
from alerts.services import alert_calls_link, alert_link, alert_rule_evaluate
from callgate.reports.rollups import rollups_rebuild
from callgate.taxonomy import Reason
from reviews import webhooks
from tests.factories import BaseTestCase, make_call

HOOK = "https://hooks.example.com/services/T0/B0/x"


@override_settings(
    CALLGATE_OUTBOUND_ALLOW=["hooks.example.com"], CALLGATE_BASE_URL="https://cg.example.org"
)
class AlertActionsTestCase(BaseTestCase):
    def setUp(self):
        self.sent: list[httpx.Request] = []
        patcher = mock.patch.object(
            webhooks,
            "TRANSPORT",
            httpx.MockTransport(lambda request: self.sent.append(request) or httpx.Response(200)),
        )
        patcher.start()
        self.addCleanup(patcher.stop)

    def rule(self, **fields) -> AlertRule:
        defaults = dict(
            project=self.project,
            name="Argument errors",
            metric=AlertRule.Metric.CATEGORY_COUNT,
            target="argument_error",
            threshold=3,
            clear_threshold=1,
            webhook_url=HOOK,
            emails="oncall@example.com",
        )
        return AlertRule.objects.create(**{**defaults, **fields})

    def calls(self, reason, n, *, tool="get_weather", agent=None, ago=timedelta(minutes=1)):
        now = timezone.now()
        for _ in range(n):
            make_call(
                project=self.project,
                agent=agent or self.agent,
                tool=tool,
                reason=reason,
                created_at=now - ago,
            )
        rollups_rebuild(project_id=self.project.pk)

    def evaluate(self, rule: AlertRule) -> AlertEvent | None:
        with self.captureOnCommitCallbacks(execute=True):
            return alert_rule_evaluate(rule)

    def firing(self, **fields) -> AlertRule:
        rule = self.rule(**fields)
        self.calls(Reason.TYPE_MISMATCH, 4)
        assert self.evaluate(rule).kind == "firing"
        return rule

    def post(self, user, rule: AlertRule, action: str, data=None, *, project=None):
        self.client.force_login(user)
        slug = (project or self.project).slug
        with self.captureOnCommitCallbacks(execute=True):
            return self.client.post(reverse(f"alerts:{action}", args=[slug, rule.pk]), data or {})

    def kinds(self, rule: AlertRule) -> list[tuple[str, str | None]]:
        return [
            (e.kind, e.actor.get_username() if e.actor else None)
            for e in AlertEvent.objects.filter(rule=rule).order_by("at", "pk")
        ]

    def listed(self, link: str) -> int:
        """How many calls the calls page lists at ``link``."""
        self.client.force_login(self.alice)
        response = self.client.get(link)
        assert response.status_code == 200
        assert response.context["errors"] == []
        return len(response.context["rows"])


class CallsBehindAnAlertTests(AlertActionsTestCase):
    def test_the_link_lists_exactly_the_calls_the_rule_counted(self):
        from callgate.models import Agent

        other_agent = Agent.objects.create(project=self.project, name="travel-bot")
        rule = self.rule(tool="get_weather", agent=self.agent, threshold=100, clear_threshold=50)
        self.calls(Reason.TYPE_MISMATCH, 4)  # counted
        self.calls(Reason.MISSING_REQUIRED, 2)  # counted: the same category
        self.calls(Reason.TYPE_MISMATCH, 3, tool="send_email")  # another tool
        self.calls(Reason.TYPE_MISMATCH, 2, agent=other_agent)  # another agent
        self.calls(Reason.UNAVAILABLE, 3)  # another category
        self.calls(Reason.TYPE_MISMATCH, 5, ago=timedelta(hours=5))  # before the window
        alert_rule_evaluate(rule)
        rule.refresh_from_db()
        link = alert_calls_link(rule, at=rule.last_evaluated_at)
        assert link is not None and "since=" in link and "until=" in link
        assert rule.last_value == 6
        assert self.listed(link) == 6
        # later calls do not change what the link of that evaluation lists
        self.calls(Reason.TYPE_MISMATCH, 2, ago=timedelta(0))
        assert self.listed(link) == 6

    def test_a_reason_rate_links_to_the_calls_with_the_reason(self):
        rule = self.rule(
            metric=AlertRule.Metric.REASON_RATE,
            target=Reason.UNAVAILABLE,
            threshold=0.9,
            clear_threshold=0.5,
            min_calls=1,
        )
        self.calls(Reason.UNAVAILABLE, 3)
        self.calls(Reason.OK, 9)
        alert_rule_evaluate(rule)
        rule.refresh_from_db()
        assert rule.last_value == 0.25
        link = alert_calls_link(rule, at=rule.last_evaluated_at)
        assert "reason=unavailable" in link
        assert self.listed(link) == 3

    def test_the_rules_page_links_each_value_to_its_calls(self):
        rule = self.firing()
        rule.refresh_from_db()
        self.client.force_login(self.alice)
        html = self.client.get(reverse("alerts:rules", args=["acme"])).content.decode()
        link = alert_calls_link(rule, at=rule.last_evaluated_at)
        assert f'href="{link.replace("&", "&amp;")}" data-alert-link' in html
        assert self.listed(link) == 4

    def test_review_age_links_to_the_queue_and_inbox_lag_to_the_history(self):
        age = self.rule(name="age", metric=AlertRule.Metric.REVIEW_AGE, target="", threshold=60)
        lag = self.rule(name="lag", metric=AlertRule.Metric.INBOX_LAG, target="", threshold=60)
        now = timezone.now()
        assert alert_calls_link(age, at=now) is None
        assert alert_link(age, at=now)[0] == reverse("reviews:queue", args=["acme"])
        assert alert_link(lag, at=now)[0] == reverse("alerts:history", args=["acme"])


class NotificationLinkTests(AlertActionsTestCase):
    def test_slack_email_and_signed_webhook_carry_the_absolute_link(self):
        rule = self.firing()
        path = alert_calls_link(rule, at=AlertEvent.objects.get(rule=rule).at)
        absolute = "https://cg.example.org" + path
        [request] = self.sent
        text = json.loads(request.content)["text"]
        assert f"<{absolute}|View the calls>" in text
        [message] = mail.outbox
        assert f"View the calls: {absolute}" in message.body
        assert "Alert history: https://cg.example.org/p/acme/alerts/history/" in message.body
        delivery = AlertDelivery.objects.get(channel="webhook")
        assert services.alert_payload(delivery)["url"] == absolute

    def test_slack_control_characters_in_names_are_escaped(self):
        self.firing(name="<!channel> & friends")
        text = json.loads(self.sent[0].content)["text"]
        assert "&lt;!channel&gt; &amp; friends" in text and "<!channel>" not in text


class AcknowledgeTests(AlertActionsTestCase):
    def remind_due(self, rule: AlertRule) -> None:
        AlertRule.objects.filter(pk=rule.pk).update(
            notified_at=timezone.now() - services.REMIND_EVERY - timedelta(minutes=1)
        )
        rule.refresh_from_db()

    def test_an_unhandled_firing_alert_reminds_and_an_acknowledged_one_does_not(self):
        rule = self.firing()
        self.remind_due(rule)
        assert self.evaluate(rule).kind == "reminder"
        assert len(self.sent) == 2 and "still firing" in json.loads(self.sent[1].content)["text"]
        assert self.evaluate(rule) is None  # not again within the hour

        response = self.post(self.alice, rule, "acknowledge", {"next": "/p/acme/"})
        assert response.status_code == 302 and response["Location"] == "/p/acme/"
        rule.refresh_from_db()
        assert rule.acknowledged_by == self.alice and rule.acknowledged_at is not None
        self.remind_due(rule)
        assert self.evaluate(rule) is None
        assert len(self.sent) == 2
        assert self.kinds(rule)[-1] == ("acknowledged", "alice")

    def test_resolving_ends_the_acknowledgement(self):
        rule = self.firing()
        self.post(self.alice, rule, "acknowledge")
        AlertRule.objects.filter(pk=rule.pk).update(clear_threshold=100)  # everything below
        rule.refresh_from_db()
        assert self.evaluate(rule).kind == "resolved"
        rule.refresh_from_db()
        assert rule.acknowledged_at is None and rule.state == "ok"
        assert len(self.sent) == 2  # fired, resolved

    def test_an_alert_that_is_not_firing_cannot_be_acknowledged(self):
        rule = self.rule()
        response = self.post(self.alice, rule, "acknowledge")
        assert response.status_code == 409
        assert "is not firing" in response.content.decode()
        assert self.kinds(rule) == []


class SnoozeTests(AlertActionsTestCase):
    def test_a_snooze_for_a_time_holds_notifications_and_ends_by_itself(self):
        rule = self.rule()
        before = timezone.now()
        response = self.post(self.bob, rule, "snooze", {"minutes": "30"})
        assert response.status_code == 302
        rule.refresh_from_db()
        assert timedelta(minutes=29) < rule.snoozed_until - before < timedelta(minutes=31)
        self.calls(Reason.TYPE_MISMATCH, 4)
        assert self.evaluate(rule).kind == "firing"
        assert self.sent == [] and mail.outbox == []
        assert AlertDelivery.objects.count() == 0

        AlertRule.objects.filter(pk=rule.pk).update(snoozed_until=timezone.now())
        rule.refresh_from_db()
        event = self.evaluate(rule)
        assert event.kind == "unsnoozed" and "its time passed" in event.message
        assert len(self.sent) == 1 and len(mail.outbox) == 1
        assert mail.outbox[0].subject == "[callgate] snooze ended: Argument errors"
        rule.refresh_from_db()
        assert rule.snoozed_at is None
        assert self.kinds(rule) == [("snoozed", "bob"), ("firing", None), ("unsnoozed", None)]

    def test_a_snooze_until_n_more_calls_ends_at_the_nth(self):
        rule = self.firing()
        self.post(self.alice, rule, "snooze", {"calls": "3"})
        self.calls(Reason.TYPE_MISMATCH, 2, ago=timedelta(0))
        self.calls(Reason.UNAVAILABLE, 5, ago=timedelta(0))  # not matching
        assert self.evaluate(rule) is None
        rule.refresh_from_db()
        assert rule.snoozed_at is not None
        self.calls(Reason.MISSING_REQUIRED, 1, ago=timedelta(0))  # the third matching call
        event = self.evaluate(rule)
        assert event.kind == "unsnoozed" and "3 more matching calls came" in event.message
        assert len(self.sent) == 2  # fired, snooze ended while firing

    def test_unsnooze_by_hand(self):
        rule = self.firing()
        self.post(self.alice, rule, "snooze", {"minutes": "1440"})
        assert firing_unhandled_count(project=self.project) == 0
        response = self.post(self.bob, rule, "unsnooze")
        assert response.status_code == 302
        rule.refresh_from_db()
        assert rule.snoozed_at is None
        assert firing_unhandled_count(project=self.project) == 1
        assert self.kinds(rule)[-2:] == [("snoozed", "alice"), ("unsnoozed", "bob")]
        assert self.post(self.bob, rule, "unsnooze").status_code == 409

    def test_bad_snooze_values_are_refused_naming_the_field(self):
        rule = self.firing()
        for data, field in [
            ({}, "minutes"),
            ({"minutes": "0"}, "minutes"),
            ({"minutes": "abc"}, "minutes"),
            ({"minutes": "-5"}, "minutes"),
            ({"minutes": "43201"}, "minutes"),
            ({"calls": "0"}, "calls"),
            ({"calls": "1.5"}, "calls"),
            ({"calls": "1000001"}, "calls"),
        ]:
            response = self.post(self.alice, rule, "snooze", data)
            assert response.status_code == 400, data
            assert re.search(rf"\b{field}:", response.content.decode()), data
        age = self.rule(name="age", metric=AlertRule.Metric.REVIEW_AGE, target="", threshold=1)
        response = self.post(self.alice, age, "snooze", {"calls": "5"})
        assert response.status_code == 400 and "calls: this rule counts no calls" in (
            response.content.decode()
        )
        rule.refresh_from_db()
        assert rule.snoozed_at is None


class ResolveTests(AlertActionsTestCase):
    def test_resolve_by_hand_notifies_and_the_next_evaluation_may_fire_again(self):
        rule = self.firing()
        self.post(self.alice, rule, "snooze", {"minutes": "60"})
        response = self.post(self.maria, rule, "resolve")
        assert response.status_code == 302
        rule.refresh_from_db()
        assert rule.state == "ok" and rule.snoozed_at is None
        assert (
            len(self.sent) == 2 and "resolved by maria" in json.loads(self.sent[1].content)["text"]
        )
        assert self.evaluate(rule).kind == "firing"  # still 4 argument errors: it regressed
        assert self.kinds(rule) == [
            ("firing", None),
            ("snoozed", "alice"),
            ("resolved", "maria"),
            ("firing", None),
        ]
        assert (
            self.post(
                self.maria,
                AlertRule.objects.create(
                    project=self.project,
                    name="quiet",
                    metric="category_count",
                    target="transient",
                    threshold=5,
                    clear_threshold=1,
                ),
                "resolve",
            ).status_code
            == 409
        )


class ActionAccessTests(AlertActionsTestCase):
    def test_viewers_are_refused_and_other_projects_rules_are_not_found(self):
        rule = self.firing()
        assert self.post(self.victor, rule, "acknowledge").status_code == 403
        assert self.post(self.olga, rule, "acknowledge").status_code == 404  # not a member
        other = AlertRule.objects.create(
            project=self.other_project,
            name="theirs",
            metric="category_count",
            target="transient",
            threshold=1,
            clear_threshold=1,
            state="firing",
        )
        for action in ("acknowledge", "snooze", "unsnooze", "resolve"):
            assert self.post(self.alice, other, action, {"minutes": "30"}).status_code == 404
        other.refresh_from_db()
        assert other.state == "firing" and other.snoozed_at is None
        assert self.kinds(rule) == [("firing", None)]

    def test_actions_are_post_only_and_csrf_protected(self):
        rule = self.firing()
        self.client.force_login(self.alice)
        url = reverse("alerts:acknowledge", args=["acme", rule.pk])
        assert self.client.get(url).status_code == 405
        strict = Client(enforce_csrf_checks=True)
        strict.force_login(self.alice)
        assert strict.post(url).status_code == 403
        rule.refresh_from_db()
        assert rule.acknowledged_at is None

    def test_next_must_stay_on_this_site(self):
        rule = self.firing()
        response = self.post(self.alice, rule, "acknowledge", {"next": "https://evil.example/"})
        assert response["Location"] == "/p/acme/alerts/history/"


class WhereOperatorsLookTests(AlertActionsTestCase):
    def nav_count(self, html: str) -> str | None:
        match = re.search(
            r'href="/p/acme/alerts/"[^>]*>Alerts(?: <span class="count">(\d+)</span>)?', html
        )
        assert match, "no Alerts link"
        return match.group(1)

    def test_the_navigation_counts_firing_alerts_nobody_handled(self):
        self.client.force_login(self.alice)
        assert self.nav_count(self.client.get("/p/acme/calls/").content.decode()) is None
        rule = self.firing()
        self.firing(name="Second", target="argument_error")
        self.client.force_login(self.alice)
        assert self.nav_count(self.client.get("/p/acme/calls/").content.decode()) == "2"
        self.post(self.alice, rule, "acknowledge")
        assert self.nav_count(self.client.get("/p/acme/").content.decode()) == "1"
        self.client.force_login(self.victor)  # viewers do not see alerts
        assert self.nav_count(self.client.get("/p/acme/calls/").content.decode()) is None
        with self.assertNumQueries(1):
            assert firing_unhandled_count(project=self.project) == 1

    def test_an_expired_snooze_counts_before_the_evaluation_ends_it(self):
        rule = self.firing()
        self.post(self.alice, rule, "snooze", {"minutes": "30"})
        assert firing_unhandled_count(project=self.project) == 0
        AlertRule.objects.filter(pk=rule.pk).update(snoozed_until=timezone.now())
        assert firing_unhandled_count(project=self.project) == 1

    def test_the_overview_panel_lists_firing_alerts_with_value_link_and_actions(self):
        rule = self.firing()
        self.client.force_login(self.alice)
        html = self.client.get("/p/acme/").content.decode()
        assert "Firing alerts" in html and "Argument errors" in html
        assert "4 calls" in html
        rule.refresh_from_db()
        link = alert_calls_link(rule, at=rule.last_evaluated_at).replace("&", "&amp;")
        assert f'href="{link}"' in html
        for action in ("acknowledge", "snooze", "resolve"):
            assert reverse(f"alerts:{action}", args=["acme", rule.pk]) in html
        self.client.force_login(self.victor)
        assert "Firing alerts" not in self.client.get("/p/acme/").content.decode()

    def test_the_history_shows_who_acted_and_links_each_event_to_its_calls(self):
        rule = self.firing()
        self.post(self.bob, rule, "acknowledge")
        self.client.force_login(self.alice)
        html = self.client.get("/p/acme/alerts/history/").content.decode()
        assert "by bob" in html and "Acknowledged" in html
        fired = AlertEvent.objects.get(rule=rule, kind="firing")
        link = alert_calls_link(rule, at=fired.at)
        assert link.replace("&", "&amp;") in html
        assert self.listed(link) == 4
