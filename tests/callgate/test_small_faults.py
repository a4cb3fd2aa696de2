"""Small faults of issue 16, each fixed as a kind: CSV formulas behind any field separator,
one error for "no such operator in this project", API keys masked in every gunicorn
access-log format, and the compose health check against the README's ALLOWED_HOSTS."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from django.test import LiveServerTestCase, SimpleTestCase, override_settings

from callgate.csvexport import csv_safe
from tests.factories import BaseTestCase
from tests.reviews.fixtures import make_item

ROOT = Path(__file__).resolve().parents[2]
KEY = "cg_0123abcd_" + "A" * 43


class CsvSafeTests(SimpleTestCase):
    def test_every_piece_after_a_separator_is_neutralised(self):
        for raw, safe in (
            ("=1+1", "'=1+1"),
            ("x;=cmd|' /C calc'!A0", "x;'=cmd|' /C calc'!A0"),
            ("a,+b", "a,'+b"),
            ("tab\t@SUM(1)", "tab\t'@SUM(1)"),
            ("line\n-2+3", "line\n'-2+3"),
            ("plain; text, fine", "plain; text, fine"),
        ):
            self.assertEqual(csv_safe(raw), safe, raw)
        self.assertEqual(csv_safe(-5), -5)
        self.assertIsNone(csv_safe(None))


class NoSuchOperatorTests(BaseTestCase):
    def test_unknown_users_and_other_tenants_users_get_the_same_error(self):
        item = make_item(self.project, self.agent)
        self.client.force_login(self.alice)
        answers = []
        for username in ("olga", "nobody-at-all", "victor"):  # other tenant, unknown, viewer
            response = self.client.post(
                f"/p/acme/review/{item.pk}/assign/", {"assignee": username}, HTTP_HX_REQUEST="true"
            )
            self.assertEqual(response.status_code, 422)
            answers.append(
                re.sub(re.escape(username), "<name>", response.content.decode()).count(
                    "No operator &#x27;<name>&#x27; in this project."
                )
            )
        self.assertEqual(answers, [1, 1, 1])


class GunicornAccessLogTests(SimpleTestCase):
    """A real gunicorn, with callgate's logger class, in two access-log formats."""

    def test_keys_in_urls_and_headers_are_masked_in_any_format(self):
        for log_format in (
            '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"',
            "%(U)s?%(q)s {x-api-key}i {authorization}i",
        ):
            log = self.serve_and_log(log_format)
            self.assertNotIn(KEY, log)
            self.assertIn("cg_0123abcd_…", log)

    def serve_and_log(self, log_format: str) -> str:
        log_file = ROOT / "test-artifacts" / "gunicorn-access.log"
        log_file.parent.mkdir(exist_ok=True)
        log_file.unlink(missing_ok=True)
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "callgate.wsgi",
                "--bind",
                "127.0.0.1:8257",
                "--workers",
                "1",
                "--access-logfile",
                str(log_file),
                "--access-logformat",
                log_format,
                "--logger-class",
                "callgate.logmask.GunicornLogger",
            ],
            cwd=ROOT,
            env={**os.environ, "DEBUG": "true"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(100):
                try:
                    httpx.get(
                        f"http://127.0.0.1:8257/api/v1/calls/op?api_key={KEY}",
                        headers={"X-Api-Key": KEY, "Authorization": f"Bearer {KEY}"},
                        timeout=2,
                    )
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            time.sleep(0.3)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=10)
        return log_file.read_text()


class ComposeHealthCheckTests(LiveServerTestCase):
    def compose(self) -> str:
        return (ROOT / "docker-compose.yml").read_text()

    def test_the_web_health_check_passes_with_the_readmes_allowed_hosts(self):
        snippet = re.search(r'"python", "-c", "(.+)"\]', self.compose()).group(1)
        snippet = snippet.replace("http://127.0.0.1:8000", self.live_server_url)
        # (tests/conftest.py sets ALLOWED_HOSTS per test: override it here, not on the class)
        with override_settings(ALLOWED_HOSTS=["callgate.example.com"]):
            result = subprocess.run(
                [sys.executable, "-c", snippet],
                env={**os.environ, "ALLOWED_HOSTS": "callgate.example.com"},
                capture_output=True,
                timeout=30,
            )
        self.assertEqual(result.returncode, 0, result.stderr.decode()[-500:])

    def test_every_documented_setting_is_passed_through(self):
        readme = (ROOT / "README.md").read_text()
        table = readme[readme.index("| variable | default | meaning |") :]
        table = table[: table.index("\n\n")]
        first_cells = [row.split("|")[1] for row in table.splitlines()[2:]]
        documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", " ".join(first_cells))) - {
            "SECRET_KEY_FILE",  # Docker secrets: set by whoever uses them
            "DEBUG",  # always false in production; set explicitly
        }
        missing = {name for name in documented if f"\n    {name}:" not in self.compose()}
        self.assertEqual(missing, set())


class ReusedEventIdTests(BaseTestCase):
    def test_a_gate_check_reusing_an_event_id_for_another_call_is_409_naming_the_field(self):
        import uuid

        from tests.factories import WEATHER

        self.api().put("/api/v1/tools/get_weather", WEATHER, format="json")
        event_id = str(uuid.uuid4())

        def gate(city: str):
            return self.api().post(
                "/api/v1/calls",
                {
                    "format": "plain",
                    "event_id": event_id,
                    "call": {"tool": "get_weather", "arguments": {"city": city}},
                },
                format="json",
            )

        first = gate("Oslo")
        self.assertEqual(first.status_code, 200)
        again = gate("Oslo")  # the same check sent again: its first answer
        self.assertEqual(again.status_code, 200)
        self.assertEqual(again.json()["operation_id"], first.json()["operation_id"])
        other = gate("Lima")
        self.assertEqual(other.status_code, 409, other.content)
        self.assertEqual(other.json()["errors"][0]["loc"], "event_id")

    def events(self, body):
        return self.api().post("/api/v1/events", body, format="json")

    def test_an_event_reusing_an_applied_event_id_with_other_content_is_409(self):
        from callgate.models import CallEvent, InboxEvent
        from tests.factories import WEATHER, proposal

        self.api().put("/api/v1/tools/get_weather", WEATHER, format="json")
        first = proposal("get_weather", {"city": "Oslo"}, request_id="r1")
        self.assertEqual(self.events(first).json()["accepted"], 1)
        self.assertEqual(InboxEvent.objects.get(event_id=first["event_id"]).status, "applied")
        # the exact same content again, keys in another order: an idempotent duplicate
        reordered = dict(reversed(list(first.items())))
        again = self.events(reordered)
        self.assertEqual(again.status_code, 200, again.content)
        self.assertEqual(again.json()["results"][0]["status"], "duplicate")
        # other content under the same event_id: a conflict naming the field, not the
        # first event's result without a word
        other = {**first, "call": {"tool": "get_weather", "arguments": {"city": "Lima"}}}
        response = self.events(other)
        self.assertEqual(response.status_code, 409, response.content)
        body = response.json()
        self.assertEqual(body["errors"][0]["loc"], "event_id")
        self.assertIn("other content", body["error"])
        # as an array of one: the same 409, the path inside the batch
        response = self.events([other])
        self.assertEqual(response.status_code, 409, response.content)
        self.assertEqual(response.json()["errors"][0]["loc"], "events[0].event_id")
        self.assertEqual(CallEvent.objects.filter(event_id=first["event_id"]).count(), 1)
        self.assertEqual(
            CallEvent.objects.get(event_id=first["event_id"]).call.arguments, {"city": "Oslo"}
        )

    def test_a_batch_reports_each_conflict_and_stores_the_rest(self):
        from callgate.models import InboxEvent
        from tests.factories import WEATHER, proposal

        self.api().put("/api/v1/tools/get_weather", WEATHER, format="json")
        applied = proposal("get_weather", {"city": "Oslo"})
        self.assertEqual(self.events(applied).status_code, 200)
        fresh = proposal("get_weather", {"city": "Rome"})
        twice = proposal("get_weather", {"city": "Bern"})
        lima = {"tool": "get_weather", "arguments": {"city": "Lima"}}
        batch = [
            {**applied, "call": lima},  # a row received before, other content
            applied,  # the same content again
            fresh,
            twice,
            {**twice, "call": lima},  # earlier in this batch, other content
            twice,  # earlier in this batch, the same content
        ]
        response = self.events(batch)
        self.assertEqual(response.status_code, 207, response.content)
        body = response.json()
        self.assertEqual(
            [r["status"] for r in body["results"]],
            ["conflict", "duplicate", "accepted", "accepted", "conflict", "duplicate"],
        )
        self.assertEqual(
            (body["accepted"], body["duplicates"], body["conflicts"], body["rejected"]),
            (2, 2, 2, 0),
        )
        self.assertEqual(
            [e["loc"] for r in body["results"] for e in r["errors"]],
            ["events[0].event_id", "events[4].event_id"],
        )
        self.assertEqual(InboxEvent.objects.get(event_id=twice["event_id"]).status, "applied")
        from callgate.models import CallEvent

        call = CallEvent.objects.get(event_id=twice["event_id"]).call
        self.assertEqual(call.arguments, {"city": "Bern"})

    def test_an_mcp_gateway_attempt_reusing_an_event_id_is_refused(self):
        from callgate import services
        from callgate.inbox import EventRefused
        from callgate.schemas import EVENT_ADAPTER
        from tests.factories import WEATHER, make_event, proposal

        self.api().put("/api/v1/tools/get_weather", WEATHER, format="json")
        proposed = proposal("get_weather", {"city": "Oslo"})
        self.events(proposed)
        op = self.api().get(f"/api/v1/events/{proposed['event_id']}").json()["answer"]
        first = make_event(
            "attempt", operation_id=op["operation_id"], sent=True, outcome="success", result={}
        )
        self.assertEqual(self.events(first).json()["accepted"], 1)
        other = EVENT_ADAPTER.validate_python({**first, "result": {"temp": 3}})
        with self.assertRaises(EventRefused) as refused:
            services.attempt_report(project=self.project, agent=self.agent, attempt=other)
        self.assertEqual(refused.exception.kind, "reused")
        self.assertEqual(refused.exception.errors[0]["loc"], "event_id")


UNREACHABLE_CACHE = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens on port 1
    }
}


class SharedCacheDownTests(BaseTestCase):
    """Redis (the shared cache of key stamps, throttles and failed-key counts) unreachable:
    the API answers 503 with Retry-After in its error shape and stores nothing; it was a 500
    (the fault run's broker phase)."""

    def test_the_api_answers_503_with_retry_after_and_stores_nothing(self):
        from callgate.models import InboxEvent, ToolCall
        from tests.factories import proposal

        gate = {"format": "plain", "call": {"tool": "get_weather", "arguments": {"city": "Oslo"}}}
        with override_settings(CACHES=UNREACHABLE_CACHE):
            for path, body in (
                ("/api/v1/events", proposal("get_weather", {"city": "Oslo"})),
                ("/api/v1/calls", gate),
            ):
                response = self.api().post(path, body, format="json")
                self.assertEqual(response.status_code, 503, (path, response.content))
                self.assertEqual(response["Retry-After"], "5")
                self.assertEqual(set(response.json()), {"error", "errors"})
        self.assertFalse(InboxEvent.objects.exists())
        self.assertFalse(ToolCall.objects.exists())
        # back: answered as usual
        self.assertEqual(self.api().post("/api/v1/calls", gate, format="json").status_code, 200)

    def test_changing_a_project_agent_or_key_does_not_need_the_cache(self):
        from callgate.auth import api_key_issue, api_key_revoke
        from callgate.models import Agent

        with override_settings(CACHES=UNREACHABLE_CACHE), self.assertLogs("callgate.auth"):
            agent = Agent.objects.create(project=self.project, name="offline-bot")
            issued = api_key_issue(agent=agent)
            api_key_revoke(api_key=issued.api_key)
        issued.api_key.refresh_from_db()
        self.assertIsNotNone(issued.api_key.revoked_at)
