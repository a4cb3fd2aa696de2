"""Which Celery queue each task goes to, and which tasks may run twice. Pure: no Django.

Four queues, so that one kind of work never waits behind another (issue 16: one tenant's slow
reconcile target held up every tenant's events):

- ``ingest``: applying the inbox (``drain_inbox``) and its sweep: what agents wait for;
- ``reconcile``: HTTP look-ups of operations in their targets (``reconcile_call``), which
  may each take a target's whole timeout;
- ``webhooks``: deliveries to agents' webhooks and alert channels, also outbound HTTP;
- ``default``: everything else (sweeps that only enqueue, rollups, housekeeping, retention).

``callgate.settings`` builds ``CELERY_TASK_ROUTES`` and ``CELERY_TASK_QUEUES`` from
``QUEUE_OF_TASK`` (Celery's own routing: ``task_routes``/``task_queues``); a worker reads
the queues it is started with (``celery -A callgate worker -Q ingest``; see
``docker-compose.yml``). ``CALLGATE_QUEUE_PREFIX`` prefixes every name, so deployments (or
tests) sharing one broker keep apart.
"""

from __future__ import annotations

INGEST, RECONCILE, WEBHOOKS, DEFAULT = "ingest", "reconcile", "webhooks", "default"
QUEUES = (INGEST, RECONCILE, WEBHOOKS, DEFAULT)

#: Task name -> queue (without the prefix). A task missing here goes to ``DEFAULT``.
QUEUE_OF_TASK: dict[str, str] = {
    "callgate.tasks.drain_inbox": INGEST,
    "callgate.tasks.sweep_inbox": INGEST,
    "callgate.tasks.reconcile_call": RECONCILE,
    "reviews.tasks.webhook_deliver": WEBHOOKS,
    "alerts.tasks.deliver_alert": WEBHOOKS,
    "reviews.tasks.slack_notify": WEBHOOKS,
    "reviews.tasks.slack_respond": WEBHOOKS,
    "reviews.tasks.email_notify": WEBHOOKS,
    "callgate.tasks.sweep_reconciling": DEFAULT,
    "callgate.tasks.sweep_deadlines": DEFAULT,
    "callgate.tasks.purge_events": DEFAULT,
    "callgate.tasks.ping": DEFAULT,
    "callgate.rollups.refresh_rollups": DEFAULT,
    "reviews.tasks.sweep_webhooks": DEFAULT,
    "reviews.tasks.review_housekeeping": DEFAULT,
    "alerts.tasks.evaluate_alerts": DEFAULT,
    "reviews.tasks.review_items_notify": DEFAULT,
}

#: Tasks that are safe to run again after a worker died in them (state-checked writes,
#: deliveries the receiver deduplicates by ``webhook-id``): ``acks_late`` with
#: ``reject_on_worker_lost``, so the broker hands them out again (after the visibility
#: timeout). The tasks not here (``alerts.tasks.deliver_alert``, the review notifications
#: ``reviews.tasks.slack_notify``, ``slack_respond``, ``email_notify``) send e-mail and chat
#: messages that no receiver deduplicates: they are acknowledged when they start (a worker
#: killed while sending loses that attempt rather than sending it twice).
REDELIVER_ON_WORKER_LOST = frozenset(QUEUE_OF_TASK) - {
    "alerts.tasks.deliver_alert",
    "reviews.tasks.slack_notify",
    "reviews.tasks.slack_respond",
    "reviews.tasks.email_notify",
}


def queue_name(queue: str, prefix: str = "") -> str:
    """The broker's name of ``queue`` (one of ``QUEUES``) under ``prefix``."""
    return f"{prefix}{queue}"


def task_routes(prefix: str = "") -> dict[str, dict[str, str]]:
    """Celery's ``task_routes``: ``{task name: {"queue": name}}`` for every task of
    ``QUEUE_OF_TASK`` (the rest go to ``task_default_queue``, ``default``)."""
    return {name: {"queue": queue_name(queue, prefix)} for name, queue in QUEUE_OF_TASK.items()}


def queue_names(prefix: str = "") -> list[str]:
    """Every queue's broker name, in ``QUEUES`` order (a worker for all of them: ``-Q``
    with these joined by commas)."""
    return [queue_name(queue, prefix) for queue in QUEUES]
