"""The demo's webhook sink verifies each signed delivery with the secret of the alert rule or
agent that sent it (issue 31, point 6), through callgate's real sender
(``reviews.webhooks.webhook_post``, Standard Webhooks signatures)."""

from __future__ import annotations

from unittest import mock

import httpx
from django.test import Client, override_settings

from alerts.models import AlertRule
from callgate.models import ToolCall
from demo import sink
from reviews import webhooks
from reviews.models import WebhookOutbox
from tests.factories import BaseTestCase

SINK = "http://sink.test/simulator/webhook-sink/"


def alert_body(rule: AlertRule, *, project: str = "acme") -> dict:
    return {
        "type": "alert",
        "delivery_id": f"00000000-0000-0000-0000-{rule.pk:012d}",
        "event": "firing",
        "project": project,
        "rule": {"id": rule.pk, "name": rule.name},
        "message": f"{rule.name} fired",
    }


# the sink is this test's Django, reached by name through the outbound guard (no DNS)
@override_settings(CALLGATE_OUTBOUND_ALLOW=["sink.test"])
class WebhookSinkTests(BaseTestCase):
    def setUp(self):
        sink.clear()
        self.addCleanup(sink.clear)
        django = Client()

        def to_django(request: httpx.Request) -> httpx.Response:
            headers = {
                k: v
                for k, v in request.headers.items()
                if k.lower() not in ("content-length", "host")
            }
            answer = django.post(
                request.url.path,
                data=request.content,
                content_type="application/json",
                headers=headers,
            )
            return httpx.Response(answer.status_code)

        patcher = mock.patch.object(webhooks, "TRANSPORT", httpx.MockTransport(to_django))
        patcher.start()
        self.addCleanup(patcher.stop)
        self.rules = [
            AlertRule.objects.create(
                project=self.project,
                name=name,
                metric=AlertRule.Metric.REVIEW_AGE,
                threshold=1800,
                clear_threshold=600,
                webhook_url=SINK,
                webhook_format=AlertRule.WebhookFormat.CALLGATE,
                webhook_secret=secret,
            )
            for name, secret in (("Waiting over 30 min", "first-secret"), ("Stuck", "second"))
        ]

    def post(self, *, secret: str, payload: dict) -> dict:
        response = webhooks.webhook_post(url=SINK, secret=secret, payload=payload)
        assert response.status_code == 204
        return sink.received()[0]

    def test_each_rule_is_verified_with_its_own_secret(self):
        for rule in self.rules:
            got = self.post(secret=rule.webhook_secret, payload=alert_body(rule))
            assert (got["signed"], got["verified"]) == (True, True)
            assert got["sender"] == f"alert rule “{rule.name}”"

    def test_a_delivery_signed_with_another_rules_secret_does_not_verify(self):
        first, second = self.rules
        got = self.post(secret=second.webhook_secret, payload=alert_body(first))
        assert (got["verified"], got["sender"]) == (False, "alert rule “Waiting over 30 min”")
        assert got["why"] == "No matching signature found"

    def test_a_rule_of_another_project_or_none_is_no_sender(self):
        rule = self.rules[0]
        got = self.post(secret=rule.webhook_secret, payload=alert_body(rule, project="globex"))
        assert (got["verified"], got["why"]) == (False, "no secret to check")
        assert "not in this callgate" in got["sender"]

    def test_a_decision_is_verified_with_its_agents_secret(self):
        self.agent.webhook_url, self.agent.webhook_secret = SINK, "agent-secret"
        self.agent.save(update_fields=["webhook_url", "webhook_secret"])
        call = ToolCall.objects.create(
            project=self.project, agent=self.agent, operation_id="op-1", tool_name="t"
        )
        row = WebhookOutbox.objects.create(project=self.project, call=call)
        payload = webhooks.webhook_payload(
            call=call, item_pk=None, delivery_id=str(row.delivery_id)
        )

        got = self.post(secret="agent-secret", payload=payload)
        assert (got["verified"], got["sender"]) == (True, "agent “support-bot”")
        got = self.post(secret=self.rules[0].webhook_secret, payload=payload)
        assert (got["verified"], got["why"]) == (False, "No matching signature found")

    def test_the_page_says_which_verified(self):
        first, second = self.rules
        self.post(secret=first.webhook_secret, payload=alert_body(first))
        self.post(secret=first.webhook_secret, payload=alert_body(second))
        self.client.force_login(self.alice)

        page = self.client.get("/simulator/webhook-sink/").content.decode()

        assert "signed, verified</span> with the secret of alert rule “Waiting over 30 min”" in page
        assert (
            "signature does not verify</span> for alert rule “Stuck”: No matching signature" in page
        )

    def test_the_demo_rules_get_their_own_secrets_and_keep_them(self):
        rules = sink.demo_alert_rules(project=self.project, public_url="http://sink.test")
        [signed] = [r for r in rules if r.webhook_format == AlertRule.WebhookFormat.CALLGATE]
        assert len(signed.webhook_secret) >= 24
        again = sink.demo_alert_rules(project=self.project, public_url="http://sink.test")
        assert [r.webhook_secret for r in again] == [r.webhook_secret for r in rules]
