"""Alert rules: evaluation from the rollups with hysteresis, notifications by webhook
(Slack-compatible or signed) and email with retries, the rules and history pages."""

from __future__ import annotations

import json
import random
from datetime import timedelta
from unittest import mock

import httpx
from django.core import mail
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import TransactionTestCase, override_settings
from django.utils import timezone

from alerts.models import AlertDelivery, AlertEvent, AlertRule
from alerts.services import alert_rule_evaluate, alert_rule_value
from alerts.tasks import evaluate_alerts
from callgate.reports.rollups import rollups_rebuild
from callgate.taxonomy import Reason
from reviews import webhooks
from tests.factories import BaseTestCase, make_call


class Sink:
    """A webhook receiver behind ``httpx.MockTransport``: records bodies and headers and
    answers ``statuses`` in turn (then 200)."""

    def __init__(self, *statuses: int):
        self.statuses = list(statuses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(self.statuses.pop(0) if self.statuses else 200)

    @property
    def bodies(self) -> list[dict]:
        return [json.loads(r.content) for r in self.requests]


#: the hosts of the tests' webhook URLs (the mock transport answers them)
HOOK_HOSTS = ["hooks.example.com", "agent.example.com"]


@override_settings(CALLGATE_OUTBOUND_ALLOW=HOOK_HOSTS)
class AlertFromTheSimulatorTests(TransactionTestCase):
    """The demo fleet drives the transient rate over a rule's threshold through the real
    SDK and the demo simulator: exactly one notification, then exactly one resolution."""

    def setUp(self):
        super().setUp()
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        self.addCleanup(request_started.connect, close_old_connections)
        self.addCleanup(request_finished.connect, close_old_connections)

    def test_a_rate_over_its_threshold_notifies_once_then_resolves_once(self):
        from demo.fleet import _fleet, demo_setup
        from demo.simulator import MountedTransport, demo_service

        sim = demo_service()
        setup = demo_setup(agents=4)
        fleet = _fleet(
            setup=setup,
            sim=sim,
            rng=random.Random(5),
            base_url="http://localhost",
            public_url="http://127.0.0.1:8000",
            run_tag="alerts",
        )
        fleet.covering = True  # one attempt per call: a failure stays a failure
        rule = AlertRule.objects.create(
            project=setup.project,
            name="Transient above 30 %",
            metric=AlertRule.Metric.CATEGORY_RATE,
            target="transient",
            threshold=0.3,
            clear_threshold=0.15,
            min_calls=5,
            webhook_url="https://hooks.example.com/services/T0/B0/x",
            emails="oncall@example.com",
        )
        sink = Sink()

        def evaluate_twice():
            rollups_rebuild(project_id=setup.project.pk)
            for _ in range(2):  # a second run in the same state notifies nobody again
                evaluate_alerts()  # deliveries run on commit (eager Celery)

        with (
            override_settings(CALLGATE_RECONCILE_TRANSPORT=lambda: MountedTransport(sim)),
            mock.patch.object(webhooks, "TRANSPORT", httpx.MockTransport(sink)),
        ):
            for _ in range(6):
                fleet.episode("ok")
            evaluate_twice()
            assert sink.requests == [] and AlertRule.objects.get(pk=rule.pk).state == "ok"

            for _ in range(6):
                fleet.episode("unavailable")
            evaluate_twice()
            rule.refresh_from_db()
            assert rule.state == "firing" and rule.last_value >= 0.3
            assert len(sink.requests) == 1 and len(mail.outbox) == 1
            assert "Transient above 30 %" in sink.bodies[0]["text"]

            for _ in range(40):
                fleet.episode("ok")
            evaluate_twice()
        rule.refresh_from_db()
        assert rule.state == "ok" and rule.last_value < 0.15
        assert [e.kind for e in AlertEvent.objects.filter(rule=rule).order_by("at", "pk")] == [
            "firing",
            "resolved",
        ]
        assert len(sink.requests) == 2 and "resolved" in sink.bodies[1]["text"]
        assert [m.subject for m in mail.outbox] == [
            "[callgate] Transient above 30 %",
            "[callgate] resolved: Transient above 30 %",
        ]
        assert set(AlertDelivery.objects.values_list("status", flat=True)) == {"delivered"}


@override_settings(CALLGATE_OUTBOUND_ALLOW=HOOK_HOSTS)
class AlertRuleTests(BaseTestCase):
    def rule(self, **fields) -> AlertRule:
        defaults = dict(
            project=self.project,
            name="Argument errors",
            metric=AlertRule.Metric.CATEGORY_COUNT,
            target="argument_error",
            threshold=5,
            clear_threshold=2,
        )
        return AlertRule.objects.create(**{**defaults, **fields})

    def calls(self, reason, n, *, tool="get_weather", ago=timedelta(minutes=1)):
        now = timezone.now()
        for _ in range(n):
            make_call(
                project=self.project,
                agent=self.agent,
                tool=tool,
                reason=reason,
                created_at=now - ago,
            )
        rollups_rebuild(project_id=self.project.pk)

    def test_hysteresis_keeps_a_hovering_number_from_flapping(self):
        rule = self.rule()
        self.calls(Reason.TYPE_MISMATCH, 5)
        with self.captureOnCommitCallbacks(execute=True):
            assert alert_rule_evaluate(rule).kind == "firing"
        # down to 4 (between clear 2 and threshold 5): still firing, nothing sent
        from callgate.models import ToolCall

        ToolCall.objects.filter(project=self.project).first().delete()
        rollups_rebuild(project_id=self.project.pk)
        assert alert_rule_evaluate(rule) is None and rule.state == "firing"
        ToolCall.objects.filter(project=self.project).delete()
        rollups_rebuild(project_id=self.project.pk)
        assert alert_rule_evaluate(rule).kind == "resolved"

    def test_it_scopes_to_a_tool_and_waits_for_enough_calls_on_rates(self):
        rule = self.rule(
            metric=AlertRule.Metric.REASON_RATE,
            target="type_mismatch",
            tool="search",
            threshold=0.5,
            clear_threshold=0.4,
            min_calls=4,
        )
        self.calls(Reason.TYPE_MISMATCH, 3, tool="search")
        self.calls(Reason.OK, 9, tool="get_weather")
        assert alert_rule_value(rule) == (None, 3)  # too few calls of that tool to judge
        self.calls(Reason.OK, 1, tool="search")
        assert alert_rule_value(rule) == (0.75, 4)

    def test_review_age_and_inbox_lag(self):
        from tests.reviews.fixtures import make_item

        make_item(self.project, self.agent, age=timedelta(minutes=40))
        rule = self.rule(
            metric=AlertRule.Metric.REVIEW_AGE, target="", threshold=1800, clear_threshold=600
        )
        value, _ = alert_rule_value(rule)
        assert 2390 < value < 2500
        lag = self.rule(
            name="lag",
            metric=AlertRule.Metric.INBOX_LAG,
            target="",
            threshold=60,
            clear_threshold=30,
        )
        assert alert_rule_value(lag) == (0.0, 0)

    def test_a_failing_webhook_is_retried_then_delivered_and_signed(self):
        rule = self.rule(
            webhook_url="https://agent.example.com/hooks",
            webhook_format=AlertRule.WebhookFormat.CALLGATE,
            webhook_secret="s3cret",
        )
        self.calls(Reason.TYPE_MISMATCH, 6)
        sink = Sink(503, 502)
        with (
            mock.patch.object(webhooks, "TRANSPORT", httpx.MockTransport(sink)),
            self.captureOnCommitCallbacks(execute=True),
        ):
            alert_rule_evaluate(rule)
        delivery = AlertDelivery.objects.get()
        assert delivery.status == "delivered" and delivery.attempts == 3
        last = sink.requests[-1]
        body = last.content.decode()
        assert webhooks.webhook_verify(
            secret="s3cret",
            timestamp=last.headers["X-Callgate-Timestamp"],
            body=body,
            signature=last.headers["X-Callgate-Signature"],
        )
        assert json.loads(body)["type"] == "alert" and json.loads(body)["event"] == "firing"

    def test_an_internal_webhook_url_is_refused_beside_the_field(self):
        self.client.force_login(self.maria)
        for url in (
            "http://127.0.0.1/x",
            "http://169.254.169.254/latest/meta-data",
            "http://[::1]/",
        ):
            response = self.client.post(
                "/p/acme/alerts/save/",
                {
                    "name": "Internal",
                    "metric": "escalation_rate",
                    "window_minutes": 10,
                    "threshold": "0.5",
                    "min_calls": 1,
                    "enabled": "on",
                    "webhook_format": "slack",
                    "webhook_url": url,
                },
            )
            body = response.content.decode()
            assert response.status_code == 422, url
            assert "may not post to this address" in body and 'name="webhook_url"' in body
        assert not AlertRule.objects.filter(name="Internal").exists()

    def test_managers_edit_rules_on_the_page_and_operators_read(self):
        self.client.force_login(self.maria)
        response = self.client.post(
            "/p/acme/alerts/save/",
            {
                "name": "Transient",
                "metric": "category_rate",
                "target": "transient",
                "window_minutes": 60,
                "threshold": "0.2",
                "min_calls": 10,
                "enabled": "on",
                "webhook_format": "slack",
                "webhook_url": "https://hooks.example.com/x",
            },
        )
        assert response.status_code == 302
        rule = AlertRule.objects.get(name="Transient")
        assert abs(rule.clear_threshold - 0.16) < 1e-9 and rule.created_by == self.maria
        bad = self.client.post(
            "/p/acme/alerts/save/",
            {
                "name": "Bad",
                "metric": "category_rate",
                "target": "type_mismatch",
                "window_minutes": 60,
                "threshold": "20",
                "min_calls": 10,
                "webhook_format": "slack",
            },
        )
        body = bad.content.decode()
        assert bad.status_code == 422 and "Pick a category" in body and "between 0 and 1" in body
        self.client.force_login(self.alice)
        page = self.client.get("/p/acme/alerts/").content.decode()
        assert "Share of calls in a category “Transient”" in page and "Add rule" not in page
        assert self.client.post("/p/acme/alerts/save/", {"name": "x"}).status_code == 403
        assert self.client.get("/p/acme/alerts/history/").status_code == 200
        self.client.force_login(self.olga)
        assert self.client.get("/p/acme/alerts/").status_code in (403, 404)
