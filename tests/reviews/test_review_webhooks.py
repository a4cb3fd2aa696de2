from __future__ import annotations

import json
from unittest import mock

import httpx
from django.test import override_settings

from callgate.models import Agent
from reviews import services, webhooks
from reviews.models import WebhookDelivery
from tests.factories import BaseTestCase
from tests.reviews.fixtures import make_item


@override_settings(CALLGATE_OUTBOUND_ALLOW=["agent.example"])  # the mock transport's host
class WebhookTestCase(BaseTestCase):
    def setUp(self):
        Agent.objects.filter(pk=self.agent.pk).update(
            webhook_url="https://agent.example/hooks/callgate", webhook_secret="s3cret"
        )
        self.agent.refresh_from_db()
        self.received: list[httpx.Request] = []

    def transport(self, statuses):
        answers = iter(statuses)

        def handler(request: httpx.Request) -> httpx.Response:
            self.received.append(request)
            status = next(answers)
            if status is None:
                raise httpx.ConnectError("connection refused", request=request)
            return httpx.Response(status)

        return httpx.MockTransport(handler)

    def decide(self, item):
        with self.captureOnCommitCallbacks(execute=True):
            services.review_item_decide(
                item=item, user=self.alice, decision="reject", reason="Not for this customer."
            )


class DecisionWebhookTests(WebhookTestCase):
    def test_it_posts_a_signed_decision(self):
        item = make_item(self.project, self.agent)
        with mock.patch.object(webhooks, "TRANSPORT", self.transport([200])):
            self.decide(item)
        assert len(self.received) == 1
        request = self.received[0]
        body = request.content.decode()
        payload = json.loads(body)
        assert payload["operation_id"] == item.call.operation_id
        assert (payload["decision"], payload["reason"], payload["decided_by"]) == (
            "reject",
            "Not for this customer.",
            "alice",
        )
        ts = request.headers["X-Callgate-Timestamp"]
        assert request.headers["X-Callgate-Signature"] == webhooks.webhook_sign(
            secret="s3cret", timestamp=int(ts), body=body
        )
        assert webhooks.webhook_verify(
            secret="s3cret",
            timestamp=ts,
            body=body,
            signature=request.headers["X-Callgate-Signature"],
        )
        assert not webhooks.webhook_verify(
            secret="wrong",
            timestamp=ts,
            body=body,
            signature=request.headers["X-Callgate-Signature"],
        )
        delivery = WebhookDelivery.objects.get()
        assert (delivery.attempt, delivery.status_code, delivery.ok, delivery.item_id) == (
            1,
            200,
            True,
            item.pk,
        )

    def test_it_retries_with_backoff_and_logs_each_attempt(self):
        item = make_item(self.project, self.agent)
        with (
            mock.patch.object(webhooks, "TRANSPORT", self.transport([503, None, 204])),
            mock.patch("reviews.tasks.random.uniform", return_value=0.0) as jitter,
        ):
            self.decide(item)
        rows = list(
            WebhookDelivery.objects.order_by("attempt").values_list("attempt", "status_code", "ok")
        )
        assert rows == [(1, 503, False), (2, None, False), (3, 204, True)]
        assert "ConnectError" in WebhookDelivery.objects.get(attempt=2).error
        # full jitter over an exponentially growing window: uniform(0, base * 2**n)
        assert [c.args for c in jitter.call_args_list] == [(0, 2.0), (0, 4.0)]
        assert len({r.headers["X-Callgate-Delivery"] for r in self.received}) == 1

    def test_it_gives_up_after_the_last_attempt(self):
        item = make_item(self.project, self.agent)
        with (
            mock.patch.object(webhooks, "TRANSPORT", self.transport([500] * 10)),
            mock.patch("reviews.tasks.random.uniform", return_value=0.0),
        ):
            self.decide(item)
        assert WebhookDelivery.objects.count() == webhooks.WEBHOOK_MAX_ATTEMPTS
        assert not WebhookDelivery.objects.filter(ok=True).exists()

    def test_it_sends_nothing_without_a_webhook(self):
        Agent.objects.filter(pk=self.agent.pk).update(webhook_url="")
        item = make_item(self.project, self.agent)
        with mock.patch.object(webhooks, "TRANSPORT", self.transport([])):
            self.decide(item)
        assert self.received == [] and WebhookDelivery.objects.count() == 0

    def test_it_shows_deliveries_on_the_item_page(self):
        item = make_item(self.project, self.agent)
        with (
            mock.patch.object(webhooks, "TRANSPORT", self.transport([502, 200])),
            mock.patch("reviews.tasks.random.uniform", return_value=0.0),
        ):
            self.decide(item)
        self.client.force_login(self.alice)
        body = self.client.get(f"/p/acme/review/{item.pk}/").content.decode()
        assert "Webhook deliveries" in body and "HTTP 502" in body


class WebhookOutboxTests(WebhookTestCase):
    """Issue 16: the decision and its delivery in one transaction; a lost broker message
    delays a delivery, never loses it; Standard Webhooks signatures; the SSRF guard."""

    def test_it_signs_with_standard_webhooks_and_keeps_the_previous_headers(self):
        from standardwebhooks.webhooks import Webhook, WebhookVerificationError

        item = make_item(self.project, self.agent)
        with mock.patch.object(webhooks, "TRANSPORT", self.transport([200])):
            self.decide(item)
        [request] = self.received
        body = request.content.decode()
        headers = dict(request.headers)
        assert Webhook(b"s3cret").verify(body, headers)["operation_id"] == item.call.operation_id
        assert Webhook("whsec_czNjcmV0").verify(body, headers)  # base64("s3cret")
        assert headers["webhook-id"] == headers["x-callgate-delivery"]
        assert "x-callgate-signature" in headers
        with self.assertRaises(WebhookVerificationError):
            Webhook(b"wrong").verify(body, headers)

    def test_a_lost_broker_message_delays_the_delivery_and_the_sweeper_sends_it(self):
        from datetime import timedelta

        from django.utils import timezone

        from reviews import tasks
        from reviews.models import WebhookOutbox

        item = make_item(self.project, self.agent)
        with (
            # every send fails as with the broker down (tasks are sent by name: Signature.delay)
            mock.patch("celery.canvas.Signature.delay", side_effect=OSError("broker down")),
            self.assertLogs("callgate.celery", "WARNING"),
        ):
            self.decide(item)  # no exception: the decision is saved
        item.refresh_from_db()
        assert item.call.decision == "reject"
        row = WebhookOutbox.objects.get(call=item.call)
        assert row.delivered_at is None and row.attempts == 0
        with mock.patch.object(webhooks, "TRANSPORT", self.transport([200])):
            assert tasks.sweep_webhooks() == 0  # not overdue yet: its task may still come
            WebhookOutbox.objects.filter(pk=row.pk).update(
                next_attempt_at=timezone.now() - timedelta(minutes=5)
            )
            assert tasks.sweep_webhooks() == 1
            assert tasks.sweep_webhooks() == 0
            # a late duplicate of the lost message sends nothing again
            assert tasks.webhook_deliver.apply(args=[str(row.delivery_id)]).get() == "skipped"
        row.refresh_from_db()
        assert row.delivered_at is not None and row.attempts == 1
        assert len(self.received) == 1
        assert self.received[0].headers["webhook-id"] == str(row.delivery_id)

    def test_a_webhook_url_on_a_private_address_is_refused_before_connecting(self):
        from reviews.models import WebhookOutbox

        for url in ("http://127.0.0.1:8000/hook", "http://169.254.169.254/latest/meta-data"):
            Agent.objects.filter(pk=self.agent.pk).update(webhook_url=url)
            self.agent.refresh_from_db()
            item = make_item(self.project, self.agent)
            with (
                mock.patch.object(webhooks, "TRANSPORT", self.transport([])),
                mock.patch("reviews.tasks.random.uniform", return_value=0.0),
            ):
                self.decide(item)
            assert self.received == []
            attempts = WebhookDelivery.objects.filter(item=item)
            assert attempts.count() == webhooks.WEBHOOK_MAX_ATTEMPTS
            assert "non-public address" in attempts.first().error
            assert WebhookOutbox.objects.get(item=item).given_up_at is not None
