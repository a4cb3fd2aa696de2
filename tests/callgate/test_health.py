"""/health/ (liveness) and /ready/ (database, cache, broker, inbox lag) with django-health-check."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.test import TransactionTestCase, override_settings
from django.utils import timezone

from callgate.models import Agent, InboxEvent, Project
from tests.factories import BaseTestCase


class HealthTests(BaseTestCase):
    def test_liveness_and_readiness_answer_without_a_login(self):
        self.assertEqual(self.client.get("/health/").status_code, 200)
        ready = self.client.get("/ready/?format=json")
        self.assertEqual(ready.status_code, 200, ready.content)


class InboxLagTests(TransactionTestCase):
    """The checks run in django-health-check's executor threads: the row must be committed."""

    @override_settings(CALLGATE_READY_INBOX_LAG=60)
    def test_readiness_fails_when_the_inbox_lags(self):
        project = Project.objects.create(slug="lag", name="Lag")
        InboxEvent.objects.create(
            project=project,
            agent=Agent.objects.create(project=project, name="bot"),
            event_id=uuid.uuid4(),
            body={"type": "attempt"},
            received_at=timezone.now() - timedelta(minutes=5),
        )
        ready = self.client.get("/ready/?format=json")
        self.assertEqual(ready.status_code, 500)
        self.assertIn("oldest pending inbox event", ready.content.decode())
        self.assertEqual(self.client.get("/health/").status_code, 200)

    @override_settings(CELERY_BROKER_URL="redis://127.0.0.1:1/0")
    def test_readiness_fails_when_the_broker_is_unreachable(self):
        from callgate.celery import app

        original = app.conf.broker_url
        app.conf.broker_url = "redis://127.0.0.1:1/0"
        self.addCleanup(setattr, app.conf, "broker_url", original)
        ready = self.client.get("/ready/?format=json")
        self.assertEqual(ready.status_code, 500)
        self.assertIn("broker unreachable", ready.content.decode())
