"""Backpressure (issue 16): a project whose inbox is over CALLGATE_INBOX_LIMIT gets 429 with
Retry-After from POST /api/v1/events and the gate, other projects do not, and the SDK (the
real ``CallgateClient`` against the real WSGI application) waits as it is told."""

from __future__ import annotations

import tempfile
from pathlib import Path

from django.core.signals import request_finished, request_started
from django.db import close_old_connections, connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from callgate.inbox import events_receive, inbox_drain, inbox_over_limit
from callgate.models import InboxEvent
from callgate_sdk import CallgateClient, CallgateUnavailable
from demo.fleet import callgate_transport
from tests.factories import WEATHER, BaseTestCase, proposal, validated, weather_call

LIMIT = 4


class _Flooded(BaseTestCase):
    def setUp(self):
        for key in (self.key, self.other_key):
            assert (
                self.api(key).put("/api/v1/tools/get_weather", WEATHER, format="json").status_code
                == 201
            )

    def flood(self) -> None:
        """Fill project A's inbox to the limit (stored, not yet applied)."""
        events = [e for i in range(LIMIT // 2) for e in weather_call(i)]
        events_receive(project=self.project, agent=self.agent, events=validated(events))
        assert InboxEvent.objects.filter(project=self.project, status="pending").count() == LIMIT


# probing on every request: these tests flood and drain within the same second
@override_settings(
    CALLGATE_INBOX_LIMIT=LIMIT, CALLGATE_INBOX_RETRY_AFTER=7, CALLGATE_INBOX_PROBE_MS=0
)
class BackpressureTests(_Flooded):
    def test_events_and_the_gate_answer_429_with_retry_after_and_store_nothing(self):
        self.assertIsNone(inbox_over_limit(self.project))
        self.flood()
        self.assertEqual(inbox_over_limit(self.project), 7.0)
        gate = {"format": "plain", "call": {"tool": "get_weather", "arguments": {"city": "Oslo"}}}
        for path, body in (
            ("/api/v1/events", proposal("get_weather", {"city": "Oslo"})),
            ("/api/v1/calls", gate),
        ):
            response = self.api().post(path, body, format="json")
            self.assertEqual(response.status_code, 429, (path, response.content))
            self.assertEqual(response["Retry-After"], "7")
            self.assertEqual(set(response.json()), {"error", "errors"})
        self.assertEqual(
            InboxEvent.objects.filter(project=self.project, status="pending").count(), LIMIT
        )
        # another tenant is not held back
        self.assertEqual(
            self.api(self.other_key).post("/api/v1/calls", gate, format="json").status_code, 200
        )
        inbox_drain(self.project.pk)
        self.assertEqual(self.api().post("/api/v1/calls", gate, format="json").status_code, 200)


@override_settings(CALLGATE_INBOX_LIMIT=LIMIT, CALLGATE_INBOX_RETRY_AFTER=7)
class BackpressureProbeTests(_Flooded):
    def probes(self) -> int:
        with CaptureQueriesContext(connection) as queries:
            inbox_over_limit(self.project)
        return sum("OFFSET" in q["sql"] for q in queries.captured_queries)

    def test_a_process_probes_a_project_at_most_once_per_interval(self):
        with override_settings(CALLGATE_INBOX_PROBE_MS=60_000):
            self.assertEqual(self.probes(), 1)
            self.flood()
            self.assertEqual(self.probes(), 0)
            self.assertIsNone(inbox_over_limit(self.project))  # the last answer, for now
        with override_settings(CALLGATE_INBOX_PROBE_MS=0):  # the interval has passed
            self.assertEqual(self.probes(), 1)
            self.assertEqual(inbox_over_limit(self.project), 7.0)


@override_settings(
    CALLGATE_INBOX_LIMIT=LIMIT, CALLGATE_INBOX_RETRY_AFTER=7, CALLGATE_INBOX_PROBE_MS=0
)
class SdkBackpressureTests(_Flooded):
    def setUp(self):
        super().setUp()
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        self.addCleanup(request_started.connect, close_old_connections)
        self.addCleanup(request_finished.connect, close_old_connections)
        self.now, self.sleeps, self.on_sleep = 0.0, [], []
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.client_sdk = CallgateClient(
            "http://localhost",
            self.key,
            transport=callgate_transport(),
            flush_interval=None,
            execute_timeout=None,
            buffer_dir=Path(tmp.name),
            sleep=self.sleep,
            clock=lambda: self.now,
        )
        self.addCleanup(self.client_sdk.close, flush=False)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        while self.on_sleep:
            self.on_sleep.pop()()

    def test_the_gate_check_waits_out_retry_after_once_then_answers(self):
        self.flood()
        self.on_sleep.append(lambda: inbox_drain(self.project.pk))  # the backlog drains meanwhile
        answer = self.client_sdk.check(
            "plain", {"tool": "get_weather", "arguments": {"city": "Oslo"}}
        )
        self.assertEqual(answer.verdict, "allow")
        self.assertEqual(self.sleeps, [7.0])

    def test_the_gate_check_raises_when_still_full_after_waiting(self):
        self.flood()
        with self.assertRaises(CallgateUnavailable) as raised:
            self.client_sdk.check("plain", {"tool": "get_weather", "arguments": {"city": "Oslo"}})
        self.assertEqual(raised.exception.retry_after, 7.0)
        self.assertEqual(self.sleeps, [7.0])

    def test_flush_holds_buffered_events_until_retry_after_passed(self):
        self.flood()
        self.client_sdk.buffer.append(
            [self.client_sdk.event("denied", operation_id="op_x", reason="user")]
        )
        self.assertEqual(self.client_sdk.flush(), 0)
        inbox_drain(self.project.pk)
        self.now += 3
        self.assertEqual(self.client_sdk.flush(), 0)  # 3 of 7 s: not sent
        self.assertEqual(len(self.client_sdk.buffer), 1)
        self.now += 5
        self.assertEqual(self.client_sdk.flush(), 1)
        self.assertEqual(len(self.client_sdk.buffer), 0)
