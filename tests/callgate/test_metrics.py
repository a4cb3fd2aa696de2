"""GET /metrics: django-prometheus's metrics and callgate's counters and inbox gauges."""

from __future__ import annotations

import re

from callgate.inbox import events_receive
from tests.factories import WEATHER, BaseTestCase, proposal, validated, weather_call


def value(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


class MetricsTests(BaseTestCase):
    def test_verdicts_and_the_inbox_backlog_are_exported(self):
        self.api().put("/api/v1/tools/get_weather", WEATHER, format="json")
        unknown = 'callgate_verdicts_total{reason="unknown_tool",route="reask"}'
        before = value(self.client.get("/metrics").content.decode(), unknown)
        self.api().post("/api/v1/events", proposal("get_wether", {"city": "Oslo"}), format="json")
        events_receive(project=self.project, agent=self.agent, events=validated(weather_call(1)))
        text = self.client.get("/metrics").content.decode()
        self.assertEqual(value(text, unknown), before + 1)
        self.assertEqual(value(text, "callgate_inbox_pending"), 2)
        self.assertGreaterEqual(value(text, "callgate_inbox_oldest_age_seconds"), 0)
        self.assertIn("django_http_requests_total_by_method_total", text)
