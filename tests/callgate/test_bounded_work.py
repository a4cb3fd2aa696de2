"""Bounded work (issue 16): a contract's complexity budget at registration, a bound on each
validation's work, poison inbox events quarantined, and drain locks taken with a bounded wait."""

from __future__ import annotations

import time
import uuid
from unittest import mock, skipUnless

import psycopg
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import TransactionTestCase

from callgate import classification
from callgate.classification import (
    MAX_REF_EXPANSION,
    MAX_SCHEMA_BYTES,
    MAX_VALIDATION_ERRORS,
    schema_problems,
    validate_arguments,
)
from callgate.models import ToolContract
from callgate.taxonomy import Reason
from tests.factories import BaseTestCase


def doubling_graph(levels: int = 40) -> dict:
    """``a0 -> anyOf[a1, a1] -> …``: 2.9 KB whose $refs expand to 2**levels subschemas."""
    defs = {
        f"a{i}": {"anyOf": [{"$ref": f"#/$defs/a{i + 1}"}, {"$ref": f"#/$defs/a{i + 1}"}]}
        for i in range(levels)
    }
    defs[f"a{levels}"] = {"type": "string"}
    return {"type": "object", "properties": {"x": {"$ref": "#/$defs/a0"}}, "$defs": defs}


def contract(parameters: dict) -> dict:
    return {"description": "A tool", "effect": "read", "parameters": parameters}


class ContractBudgetTests(BaseTestCase):
    def test_the_doubling_ref_graph_is_refused_naming_the_subschema(self):
        response = self.api().put("/api/v1/tools/poison", contract(doubling_graph()), format="json")
        self.assertEqual(response.status_code, 400, response.content)
        [error] = response.json()["errors"]
        self.assertEqual(error["loc"], "parameters")
        self.assertIn("complexity budget", error["msg"])
        self.assertIn("/$defs/a", error["msg"])
        self.assertIn(f"{MAX_REF_EXPANSION:,}", error["msg"])

    def test_a_shallow_ref_graph_and_a_recursive_one_are_accepted(self):
        self.assertIsNone(schema_problems(doubling_graph(levels=8)))
        tree = {
            "type": "object",
            "properties": {"root": {"$ref": "#/$defs/node"}},
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
                    },
                }
            },
        }
        self.assertIsNone(schema_problems(tree))

    def test_an_oversized_schema_is_refused_with_its_size(self):
        properties = {f"p{i}": {"type": "string", "description": "x" * 200} for i in range(400)}
        problem = schema_problems({"type": "object", "properties": properties})
        self.assertIn("bytes", problem)
        self.assertIn(f"{MAX_SCHEMA_BYTES:,}", problem)

    def test_a_keyword_with_too_many_entries_is_named(self):
        problem = schema_problems(
            {"type": "object", "properties": {"x": {"anyOf": [{"const": i} for i in range(100)]}}}
        )
        self.assertIn("anyOf at /properties/x has 100 entries", problem)


class ValidationBoundTests(BaseTestCase):
    def test_a_thousand_missing_required_properties_are_cheap_and_capped(self):
        properties = {f"p{i}": {"type": "string"} for i in range(400)}
        schema = {"type": "object", "properties": properties, "required": list(properties)}
        problems = validate_arguments({}, schema)
        self.assertEqual(len(problems), MAX_VALIDATION_ERRORS)
        self.assertEqual(problems[0].reason, Reason.MISSING_REQUIRED)
        self.assertEqual(problems[0].path, "$.p0")

    def test_unique_items_over_thousands_of_objects_is_linear_and_exact(self):
        schema = {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}
        items = [{"a": i} for i in range(4000)]
        with mock.patch.object(
            classification, "canonical_json", wraps=classification.canonical_json
        ) as canonical:
            self.assertEqual(validate_arguments({"xs": items}, schema), [])
        self.assertEqual(canonical.call_count, len(items))  # once per item: linear, no pairs
        [problem] = validate_arguments({"xs": [{"a": 1, "b": 2}, {"b": 2, "a": 1.0}]}, schema)
        self.assertEqual(problem.path, "$.xs")
        self.assertEqual(validate_arguments({"xs": [1, True]}, schema), [])

    def test_a_validation_over_its_step_budget_is_classified_not_run_forever(self):
        # a contract stored before the budget existed: validation stops at the step budget
        problems = validate_arguments({"x": 1}, doubling_graph())
        [problem] = problems
        self.assertEqual(problem.reason, Reason.CONSTRAINT_VIOLATION)
        self.assertIn("too costly", problem.message)

    def test_a_float_multiple_of_against_a_huge_integer(self):
        schema = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 0.5}}}
        self.assertEqual(validate_arguments({"n": 10**400}, schema), [])
        [problem] = validate_arguments(
            {"n": 10**400 + 1},
            {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2.0}}},
        )
        self.assertEqual(problem.path, "$.n")


class GateEdgeTests(BaseTestCase):
    """Inputs that made the gate answer 500 (issue 16, "smaller faults")."""

    def gate(self, call: dict, **fields):
        return self.api().post(
            "/api/v1/calls", {"format": "plain", "call": call, **fields}, format="json"
        )

    def test_a_tool_name_over_128_characters_with_a_request_id_is_classified(self):
        response = self.gate({"tool": "t" * 300, "arguments": {}}, request_id="req-1")
        self.assertLess(response.status_code, 500, response.content)
        self.assertEqual(response.json()["reason"], "unknown_tool")

    def test_a_float_multiple_of_against_a_huge_integer_is_classified(self):
        schema = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 0.3}}}
        self.assertEqual(
            self.api().put("/api/v1/tools/count", contract(schema), format="json").status_code, 201
        )
        response = self.api().generic(
            "POST",
            "/api/v1/calls",
            '{"format": "plain", "call": {"tool": "count", "arguments": {"n": 1'
            + "0" * 400
            + "1}}}",
            content_type="application/json",
        )
        self.assertEqual(response.status_code, 200, response.content)
        self.assertEqual(response.json()["reason"], "constraint_violation")


class _WorkerKilled(BaseException):
    """What a hard time limit or kill -9 amounts to for the drain: nothing after it runs."""


class QuarantineTests(BaseTestCase):
    def setUp(self):
        from tests.factories import WEATHER

        assert (
            self.api().put("/api/v1/tools/get_weather", WEATHER, format="json").status_code == 201
        )

    def test_a_poison_event_is_quarantined_after_failed_drains_and_the_rest_applied(self):
        from callgate import inbox, ingest
        from callgate.models import InboxEvent, ToolCall
        from tests.factories import validated, weather_call

        events = [e for i in range(3) for e in weather_call(i)]
        poison = events[2]["event_id"]
        real = ingest.events_apply

        def dies_on_poison(**kwargs):
            if any(str(e.event_id) == poison for e in kwargs["events"]):
                raise _WorkerKilled
            return real(**kwargs)

        inbox.events_receive(project=self.project, agent=self.agent, events=validated(events))
        with mock.patch.object(inbox, "events_apply", dies_on_poison):
            for _ in range(inbox.QUARANTINE_AFTER):
                with self.assertRaises(_WorkerKilled):
                    inbox.inbox_drain(self.project.pk)
            with self.assertLogs("callgate.inbox", "ERROR"):
                inbox.inbox_drain(self.project.pk)
        row = InboxEvent.objects.get(event_id=poison)
        self.assertEqual(row.status, InboxEvent.Status.QUARANTINED)
        self.assertEqual(row.attempts, inbox.QUARANTINE_AFTER)
        self.assertFalse(InboxEvent.objects.filter(status=InboxEvent.Status.PENDING).exists())
        self.assertEqual(ToolCall.objects.filter(project=self.project, reason="ok").count(), 2)
        answer = self.api().get(f"/api/v1/events/{poison}").json()
        self.assertEqual(answer["status"], "quarantined")
        self.assertIn("set aside", answer["errors"][0]["msg"])
        self.assertEqual(inbox.inbox_drain(self.project.pk), 0)  # never tried again

    def test_administrators_see_quarantined_rows(self):
        from callgate.models import InboxEvent

        InboxEvent.objects.create(
            project=self.project,
            agent=self.agent,
            event_id=uuid.uuid4(),
            body={"type": "attempt"},
            status=InboxEvent.Status.QUARANTINED,
            attempts=3,
        )
        admin = get_user_model().objects.create_superuser("root", password="pw-123456789")
        self.client.force_login(admin)
        page = self.client.get("/admin/callgate/inboxevent/?status=quarantined")
        self.assertEqual(page.status_code, 200)
        self.assertContains(page, "Quarantined")


def other_session(*, autocommit: bool = False) -> psycopg.Connection:
    """A second PostgreSQL session on the test database (another worker's, say)."""
    settings = connection.settings_dict
    return psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"],
        user=settings["USER"],
        password=settings["PASSWORD"],
        dbname=settings["NAME"],
        autocommit=autocommit,
    )


@skipUnless(connection.vendor == "postgresql", "the drain lock is a PostgreSQL advisory lock")
class DrainLockWaitTests(BaseTestCase):
    def test_a_held_drain_lock_is_waited_for_a_bounded_time_and_other_projects_go_on(self):
        from callgate import inbox
        from callgate.models import InboxEvent
        from tests.factories import validated, weather_call

        for project, agent in ((self.project, self.agent), (self.other_project, self.other_agent)):
            schema = {"type": "object", "properties": {"city": {"type": "string"}}}
            ToolContract.objects.create(
                project=project, name="get_weather", version=1, parameters=schema, digest="x"
            )
            inbox.events_receive(project=project, agent=agent, events=validated(weather_call(1)))
        with other_session(autocommit=True) as other:  # another drainer, holding A's lock
            other.execute(
                "SELECT pg_advisory_lock(%s, %s)", [inbox.DRAIN_LOCK_CLASS, self.project.pk]
            )
            started = time.monotonic()
            with self.assertRaises(inbox.DrainBusy):
                inbox.inbox_drain(self.project.pk, lock_wait=0.3)
            self.assertLess(time.monotonic() - started, 2.0)
            self.assertEqual(inbox.inbox_drain(self.other_project.pk, lock_wait=0.3), 2)
            # a drainer that could not get the lock counted no attempt (no false quarantine)
            self.assertEqual(
                set(
                    InboxEvent.objects.filter(project=self.project).values_list(
                        "attempts", flat=True
                    )
                ),
                {0},
            )
            # the gate does not wait for the drainer: it applies its own request's events
            response = self.api().post(
                "/api/v1/calls",
                {"format": "plain", "call": {"tool": "get_weather", "arguments": {"city": "Oslo"}}},
                format="json",
            )
            self.assertEqual(response.status_code, 200, response.content)
            self.assertEqual(response.json()["verdict"], "allow")
        self.assertEqual(
            InboxEvent.objects.filter(project=self.project, status="pending").count(), 2
        )
        self.assertEqual(inbox.inbox_drain(self.project.pk), 2)


@skipUnless(connection.vendor == "postgresql", "row locks of another PostgreSQL session")
class GateLockWaitTests(TransactionTestCase):
    def test_a_gate_check_waits_a_bounded_time_for_its_requests_rows_then_answers_429(self):
        from rest_framework.test import APIClient

        from callgate import inbox
        from callgate.auth import api_key_issue
        from callgate.models import Agent, InboxEvent, Project
        from tests.factories import validated, weather_call

        self.project = Project.objects.create(slug="held", name="Held")
        self.agent = Agent.objects.create(project=self.project, name="bot")
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_issue(agent=self.agent).plain}")
        schema = {"type": "object", "properties": {"city": {"type": "string"}}}
        ToolContract.objects.create(
            project=self.project, name="get_weather", version=1, parameters=schema, digest="x"
        )
        inbox.events_receive(
            project=self.project, agent=self.agent, events=validated(weather_call(1)[:1])
        )
        held = InboxEvent.objects.get(project=self.project, status="pending")
        with other_session() as other:  # a drain in the middle of applying the request's row
            other.execute("SELECT id FROM callgate_inboxevent WHERE id = %s FOR UPDATE", [held.pk])
            started = time.monotonic()
            response = client.post(
                "/api/v1/calls",
                {
                    "format": "plain",
                    "request_id": "req-1",
                    "call": {"tool": "get_weather", "arguments": {"city": "Oslo"}},
                },
                format="json",
            )
            waited = time.monotonic() - started
            other.rollback()
        self.assertEqual(response.status_code, 429, response.content)
        self.assertGreaterEqual(int(response["Retry-After"]), 1)
        self.assertGreaterEqual(waited, inbox.DRAIN_LOCK_WAIT)


class DrainTaskTests(BaseTestCase):
    def test_a_drain_task_that_finds_the_inbox_held_gives_the_worker_back_and_retries(self):
        from celery.exceptions import Retry

        from callgate import inbox, tasks

        with mock.patch.object(tasks, "inbox_drain", side_effect=inbox.DrainBusy(1)):
            with self.assertRaises(Retry):
                tasks.drain_inbox.apply(args=[self.project.pk], throw=True).get()


class DrainFairnessTests(BaseTestCase):
    """One queued drain per project; a drain run is bounded in time and queues itself again
    behind other projects' tasks (the ~1,500 redundant drain tasks after a burst)."""

    def setUp(self):
        from django.core.cache import cache

        from callgate import tasks

        self.key = tasks._drain_queued_key(self.project.pk)
        cache.delete(self.key)
        self.addCleanup(cache.delete, self.key)

    def test_a_burst_queues_one_drain_per_project(self):
        from callgate import tasks

        with mock.patch.object(tasks.drain_inbox, "delay") as delay:
            for _ in range(5):
                tasks.drain_inbox_enqueue(self.project.pk)
            self.assertEqual(delay.call_count, 1)
            tasks.drain_inbox.apply(args=[self.project.pk]).get()  # the run clears the mark
            tasks.drain_inbox_enqueue(self.project.pk)
            self.assertEqual(delay.call_count, 2)

    def test_stored_events_are_answered_200_when_the_cache_cannot_be_reached(self):
        """The drain's "queued" mark lives in the cache (Redis, the broker's server in
        compose). The events are committed before it is set: a cache that went away in
        between must not turn their 200 into a 500 (the agent would think them lost)."""
        from redis.exceptions import ConnectionError as RedisConnectionError

        from callgate import tasks
        from callgate.models import InboxEvent
        from tests.factories import WEATHER, weather_call

        api = self.api(type(self).key)  # (self.key is the drain mark's, in this class)
        api.put("/api/v1/tools/get_weather", WEATHER, format="json")
        down = mock.Mock(**{"add.side_effect": RedisConnectionError("refused")})
        down.delete.side_effect = RedisConnectionError("refused")
        with (
            mock.patch.object(tasks, "cache", down),
            mock.patch.object(tasks.drain_inbox, "delay") as delay,
        ):
            response = api.post("/api/v1/events", weather_call(1), format="json")
        self.assertEqual(response.status_code, 200, response.content)
        self.assertEqual(response.json()["accepted"], 2)
        self.assertEqual(InboxEvent.objects.filter(project=self.project).count(), 2)
        delay.assert_called_once_with(self.project.pk)  # without the mark, sent anyway

    def test_a_run_over_its_time_budget_queues_the_rest_behind_other_work(self):
        from callgate import inbox, tasks
        from callgate.models import InboxEvent
        from tests.factories import WEATHER, validated, weather_call

        self.api().put("/api/v1/tools/get_weather", WEATHER, format="json")
        events = [e for i in range(6) for e in weather_call(i)]
        inbox.events_receive(project=self.project, agent=self.agent, events=validated(events))
        with (
            mock.patch.object(inbox, "DRAIN_CHUNK", 4),
            mock.patch.object(tasks, "DRAIN_TASK_SECONDS", 0.0),
            mock.patch.object(tasks.drain_inbox, "delay") as delay,
        ):
            self.assertEqual(tasks.drain_inbox.apply(args=[self.project.pk]).get(), 4)
        delay.assert_called_once_with(self.project.pk)
        self.assertEqual(
            InboxEvent.objects.filter(project=self.project, status="pending").count(), 8
        )
