"""Celery queues (issue 16): each task goes to its own queue through Celery's own routing
(``task_routes``/``task_queues`` from ``callgate.queues``), so that a slow reconcile target
never holds up ingest; only tasks safe to run twice are redelivered after a lost worker."""

from __future__ import annotations

from pathlib import Path

import yaml
from django.test import SimpleTestCase

from callgate import queues
from callgate.celery import app
from tests.factories import WEATHER, BaseTestCase, proposal

ROOT = Path(__file__).resolve().parents[2]

EXPECTED = {
    "callgate.tasks.drain_inbox": "ingest",
    "callgate.tasks.sweep_inbox": "ingest",
    "callgate.tasks.reconcile_call": "reconcile",
    "reviews.tasks.webhook_deliver": "webhooks",
    "alerts.tasks.deliver_alert": "webhooks",
    "reviews.tasks.slack_notify": "webhooks",
    "reviews.tasks.slack_respond": "webhooks",
    "reviews.tasks.email_notify": "webhooks",
    "callgate.tasks.sweep_reconciling": "default",
    "callgate.tasks.sweep_deadlines": "default",
    "callgate.tasks.purge_events": "default",
    "callgate.tasks.ping": "default",
    "callgate.rollups.refresh_rollups": "default",
    "reviews.tasks.sweep_webhooks": "default",
    "reviews.tasks.review_housekeeping": "default",
    "alerts.tasks.evaluate_alerts": "default",
    "reviews.tasks.review_items_notify": "default",
}
#: tasks that send messages no receiver deduplicates: never sent twice after a lost worker
SENT_ONCE = {
    "alerts.tasks.deliver_alert",
    "reviews.tasks.slack_notify",
    "reviews.tasks.slack_respond",
    "reviews.tasks.email_notify",
}


class QueueRoutingTests(SimpleTestCase):
    def setUp(self):
        app.loader.import_default_modules()

    def registered(self) -> set[str]:
        return {name for name in app.tasks if not name.startswith("celery.")}

    def test_it_routes_each_task_name_to_its_queue(self):
        router = app.amqp.Router()
        routed = {
            name: router.route({}, name, args=(), kwargs={})["queue"].name
            for name in self.registered()
        }
        self.assertEqual(routed, EXPECTED)

    def test_every_queue_is_declared_and_the_rest_goes_to_default(self):
        self.assertEqual(
            [q.name for q in app.conf.task_queues], ["ingest", "reconcile", "webhooks", "default"]
        )
        self.assertEqual(app.conf.task_default_queue, "default")
        queue = app.amqp.Router().route({}, "no.such.task", args=(), kwargs={})["queue"]
        self.assertEqual(queue.name, "default")

    def test_a_prefix_keeps_deployments_on_one_broker_apart(self):
        self.assertEqual(
            queues.task_routes("b1-")["callgate.tasks.reconcile_call"], {"queue": "b1-reconcile"}
        )
        self.assertEqual(
            queues.queue_names("b1-"), ["b1-ingest", "b1-reconcile", "b1-webhooks", "b1-default"]
        )

    def test_only_tasks_safe_to_repeat_are_redelivered_after_a_lost_worker(self):
        for name in self.registered():
            task = app.tasks[name]
            again = name not in SENT_ONCE
            self.assertEqual((task.acks_late, task.reject_on_worker_lost), (again, again), name)
        self.assertEqual(app.conf.worker_prefetch_multiplier, 1)

    def test_the_compose_workers_consume_every_queue_and_ingest_apart(self):
        compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
        consumed: dict[str, set[str]] = {}
        for name, service in compose["services"].items():
            command = service.get("command") or []
            if "worker" not in command:
                continue
            queues_arg = command[command.index("-Q") + 1]
            consumed[name] = {
                q.replace("${CALLGATE_QUEUE_PREFIX:-}", "") for q in queues_arg.split(",")
            }
        self.assertEqual(set().union(*consumed.values()), set(queues.QUEUES))
        ingest = [name for name, names in consumed.items() if "ingest" in names]
        self.assertEqual(len(ingest), 1)
        self.assertEqual(consumed[ingest[0]], {"ingest"})  # nothing else shares its processes
        reconcile = [name for name, names in consumed.items() if "reconcile" in names]
        self.assertEqual(consumed[reconcile[0]], {"reconcile"})


class EagerModeTests(BaseTestCase):
    def test_the_embedded_default_still_runs_routed_tasks_in_process(self):
        from reviews.tasks import review_housekeeping

        self.assertTrue(app.conf.task_always_eager)
        self.assertEqual(review_housekeeping.delay().get(), {"lapsed": 0, "expired": 0})
        # drain_inbox, routed to "ingest", runs on commit in this process
        self.api().put("/api/v1/tools/get_weather", WEATHER, format="json")
        event = proposal("get_weather", {"city": "Oslo"})
        self.assertEqual(self.api().post("/api/v1/events", event, format="json").status_code, 200)
        found = self.api().get(f"/api/v1/events/{event['event_id']}").json()
        self.assertEqual(found["status"], "applied")
