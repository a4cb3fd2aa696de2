"""Celery tasks of the core app. Tasks take ids, stay thin, and call services.

- ``drain_inbox(project_id)``: apply the events ``POST /api/v1/events`` stored in the inbox,
  in arrival order (``callgate.inbox.inbox_drain``); enqueued after each batch.
- ``reconcile_call(call_id)``: look a ``reconciling`` call up in its target and record the
  outcome (``callgate.reconcile`` does the look-up, ``callgate.services`` the writes).
- Periodic (``CELERY_BEAT_SCHEDULE`` in settings), each idempotent and bounded per run:
  ``sweep_inbox`` (drains what a lost ``drain_inbox`` left), ``sweep_reconciling`` (the
  outbox sweeper), ``sweep_deadlines``, ``purge_events``.

Queues and redelivery: ``callgate.queues`` routes each task to its queue (ingest, reconcile,
webhooks, default) and lists the tasks that are ``acks_late`` with ``reject_on_worker_lost``
(all of these), so a task whose worker died runs again. ``reconcile_call`` is safe to repeat (a GET, then a state-checked
service call), and stops on its own: it does nothing unless the call is still
``reconciling``, and a loop guard escalates a call that callgate has already reconciled
``RECONCILE_MAX_PER_HOUR`` times in the last hour (counted in the CallEvent log: the
``reconciled`` events with source ``callgate``), so a call bouncing between reconcile and
retry ends in review instead of looping. A worker killed in the middle of a look-up leaves
no event, so such redeliveries are not counted; the look-up is a GET with a timeout, so
that needs a crash in callgate itself (an exact counter would need a field on ToolCall).
"""

from __future__ import annotations

import logging
import random
from datetime import timedelta

from celery import shared_task
from django.core.cache import cache
from django.utils import timezone

from callgate import services
from callgate.inbox import DrainBusy, inbox_drain
from callgate.lifecycle import IllegalTransition
from callgate.logmask import OPERATION_ID
from callgate.models import CallEvent, InboxEvent, Project, ToolCall
from callgate.prometheus import RECONCILE_OUTCOMES
from callgate.reconcile import UNKNOWN, LookupResult, reconcile_calls_claim_stale, reconcile_lookup
from callgate.reports.rollups import refresh_rollups  # noqa: F401  (defined beside the rollup code; beat: refresh-rollups)

logger = logging.getLogger(__name__)

#: look-up retries of one reconcile_call (transient failures only), full-jitter backoff
RECONCILE_MAX_RETRIES = 4
RECONCILE_BACKOFF_BASE = 2.0  # seconds
RECONCILE_BACKOFF_CAP = 30.0  # seconds
#: the outbox sweeper re-enqueues calls left ``reconciling`` this long; longer than one
#: task's whole retry window (at most 2+4+8+16 s of backoff plus 5 look-up timeouts)
RECONCILE_SWEEP_DELAY = timedelta(minutes=2)
#: loop guard: callgate's own reconciliations of one call per hour before escalating
RECONCILE_MAX_PER_HOUR = 5
SWEEP_BATCH = 500
PURGE_BATCH = 1000
PURGE_MAX_BATCHES = 200  # per project and run; the next run continues


@shared_task(name="callgate.tasks.ping")
def ping() -> str:
    """Liveness probe for workers: returns ``"pong"``. Touches no database."""
    return "pong"


def backoff_seconds(retries: int) -> float:
    """Full-jitter exponential backoff before look-up retry number ``retries + 1``."""
    return random.uniform(0, min(RECONCILE_BACKOFF_CAP, RECONCILE_BACKOFF_BASE * 2**retries))


def reconcile_loop_exceeded(*, call: ToolCall) -> bool:
    """True when callgate already recorded ``RECONCILE_MAX_PER_HOUR`` reconciliations of
    this call in the last hour (the redelivery/ping-pong guard)."""
    since = timezone.now() - timedelta(hours=1)
    recent = CallEvent.objects.filter(
        call=call,
        kind=CallEvent.Kind.RECONCILED,
        source=CallEvent.Source.CALLGATE,
        received_at__gte=since,
    ).count()
    return recent >= RECONCILE_MAX_PER_HOUR


@shared_task(
    bind=True,
    name="callgate.tasks.reconcile_call",
    max_retries=RECONCILE_MAX_RETRIES,
    ignore_result=True,
)
def reconcile_call(self, call_id: int, manual: bool = False) -> str:
    """Reconcile one call by HTTP look-up. Returns what it did (for logs and tests):
    ``"skipped"`` (gone, not ``reconciling``, or no HTTP look-up), ``"escalated"`` (loop
    guard), ``"could_not_tell"`` (after the last retry), or the outcome ``applied`` /
    ``mismatch`` / ``absent``. Transient look-up failures (timeout, connection error,
    429, 5xx) are retried with backoff up to ``RECONCILE_MAX_RETRIES`` times.

    ``manual=True`` (an operator's "reconcile now" on a review item) also looks up a call
    that is ``in_review``, and skips the loop guard."""

    allowed = (
        (ToolCall.State.RECONCILING, ToolCall.State.IN_REVIEW)
        if manual
        else (ToolCall.State.RECONCILING,)
    )
    call = ToolCall.objects.select_related("contract").filter(pk=call_id).first()
    if call is None or call.state not in allowed:
        return "skipped"
    OPERATION_ID.set(call.operation_id)  # in this task's log records (callgate.logmask)
    contract = call.contract
    if contract is None or contract.reconcile_method != contract.ReconcileMethod.HTTP:
        return "skipped"  # the agent reports the reconciliation itself
    try:
        if not manual and self.request.retries == 0 and reconcile_loop_exceeded(call=call):
            services.call_reconcile_failed(
                call=call,
                detail={
                    "outcome": UNKNOWN,
                    "detail": f"reconciled {RECONCILE_MAX_PER_HOUR} times in the last hour; "
                    "stopped to avoid a loop",
                },
            )
            RECONCILE_OUTCOMES.labels("escalated").inc()
            return "escalated"
        try:
            result = reconcile_lookup(
                contract=contract, operation_id=call.operation_id, arguments=call.arguments
            )
        except ValueError as exc:  # a contract without a usable URL, a malformed auth setting
            result = LookupResult(UNKNOWN, detail=str(exc))
        if result.outcome == UNKNOWN:
            if result.transient and self.request.retries < self.max_retries:
                raise self.retry(countdown=backoff_seconds(self.request.retries))
            services.call_reconcile_failed(
                call=call, detail={**result.as_detail(), "lookups": self.request.retries + 1}
            )
            RECONCILE_OUTCOMES.labels("could_not_tell").inc()
            return "could_not_tell"
        services.call_reconciled(
            call=call,
            found=result.found,
            matches=result.matches,
            source="callgate",
            detail=result.as_detail(),
            receipt=result.receipt if result.found else None,
        )
        RECONCILE_OUTCOMES.labels(result.outcome).inc()
        return result.outcome
    except IllegalTransition:  # settled meanwhile (a late receipt, an operator): nothing to do
        return "skipped"


#: ``drain_inbox`` tries again this often when another drainer holds the project's inbox
#: (then ``sweep_inbox`` takes over), DRAIN_RETRY_DELAY seconds apart.
DRAIN_RETRIES = 5
DRAIN_RETRY_DELAY = 1.0
#: Seconds one ``drain_inbox`` run spends on a project before it queues itself again behind
#: the other projects' tasks: a worker serves projects in turn, never one backlog to the end.
DRAIN_TASK_SECONDS = 1.0
#: Seconds a drain task waits for another drainer of its project before it retries later:
#: short, as the drainer holding the project's inbox applies what this one would have.
DRAIN_TASK_LOCK_WAIT = 0.1
#: How long the "a drain of this project is queued" mark lives (seconds): enqueues while it
#: stands are dropped (one queued drain per project; a lost one is replaced after this).
DRAIN_QUEUED_TTL = 60


def _drain_queued_key(project_id: int) -> str:
    return f"callgate:drain-queued:{project_id}"


@shared_task(
    bind=True, name="callgate.tasks.drain_inbox", ignore_result=True, max_retries=DRAIN_RETRIES
)
def drain_inbox(self, project_id: int) -> int:
    """Apply the project's pending inbox events in order, for up to ``DRAIN_TASK_SECONDS``;
    returns rows processed. Safe to run twice at once or again: drainers of one project take
    turns, one chunk at a time. Per-project fairness: a run that leaves events pending queues
    a new run behind the other projects' tasks, and a drain that finds the project's inbox
    held past ``inbox.DRAIN_LOCK_WAIT`` gives the worker back and tries again later
    (Celery's retry), so one project's backlog never holds the workers another waits for."""
    cache.delete(_drain_queued_key(project_id))  # events arriving from now on queue a new run
    try:
        processed = inbox_drain(
            project_id, lock_wait=DRAIN_TASK_LOCK_WAIT, time_budget=DRAIN_TASK_SECONDS
        )
    except DrainBusy as busy:
        if self.request.retries < self.max_retries:
            raise self.retry(countdown=DRAIN_RETRY_DELAY) from None
        return busy.processed
    if InboxEvent.objects.filter(project_id=project_id, status=InboxEvent.Status.PENDING).exists():
        drain_inbox_enqueue(project_id)
    return processed


def drain_inbox_enqueue(project_id: int) -> None:
    """Enqueue ``drain_inbox`` for events already stored and committed, unless a run of this
    project is queued already (one per project: a burst of batches queues one task, not one
    per batch). Never raises: the events are committed, and their request must not fail
    after that. A broker that cannot be reached loses nothing (the rows wait in the inbox
    for ``sweep_inbox``); a cache that cannot be reached only costs the one-per-project
    mark (the task is sent anyway: a second drain of a project is harmless)."""
    key = _drain_queued_key(project_id)
    try:
        if not cache.add(key, 1, timeout=DRAIN_QUEUED_TTL):
            return
    except Exception:
        logger.warning("cache unreachable: drain_inbox(%s) sent without its mark", project_id)
    try:
        drain_inbox.delay(project_id)
    except Exception:
        logger.warning(
            "could not enqueue drain_inbox(%s); the inbox sweep will apply the events",
            project_id,
            exc_info=True,
        )
        try:
            cache.delete(key)
        except Exception:  # the mark lapses after DRAIN_QUEUED_TTL
            pass


@shared_task(name="callgate.tasks.sweep_inbox", ignore_result=True)
def sweep_inbox() -> int:
    """Drain every project that has pending inbox events (a ``drain_inbox`` lost with its
    broker or worker). Returns rows processed."""
    project_ids = (
        InboxEvent.objects.filter(status=InboxEvent.Status.PENDING)
        .values_list("project_id", flat=True)
        .distinct()
        .order_by()
    )
    processed = 0
    for project_id in list(project_ids):
        try:
            processed += inbox_drain(project_id)
        except DrainBusy as busy:  # being drained: the next sweep comes back to it
            processed += busy.processed
    return processed


@shared_task(name="callgate.tasks.sweep_reconciling", ignore_result=True)
def sweep_reconciling() -> int:
    """Outbox sweeper: re-enqueue ``reconcile_call`` for calls left ``reconciling`` (an
    on-commit enqueue lost in a crash). Returns how many were enqueued."""
    call_ids = reconcile_calls_claim_stale(older_than=RECONCILE_SWEEP_DELAY, limit=SWEEP_BATCH)
    for call_id in call_ids:
        reconcile_call.delay(call_id)
    return len(call_ids)


def _each_call(queryset, service, label: str) -> int:
    """Apply ``service(call=call)`` to up to ``SWEEP_BATCH`` calls; one failing call is
    logged and skipped, not fatal for the rest. Returns how many succeeded."""
    done = 0
    for call in queryset[:SWEEP_BATCH]:
        try:
            service(call=call)
        except Exception:
            logger.exception("%s failed for call %s", label, call.pk)
        else:
            done += 1
    return done


@shared_task(name="callgate.tasks.sweep_deadlines", ignore_result=True)
def sweep_deadlines() -> int:
    """Calls still ``retry_wait`` past their deadline -> ``services.call_deadline_passed``
    (``retry_exhausted``). Returns how many were moved."""

    overdue = ToolCall.objects.filter(
        state=ToolCall.State.RETRY_WAIT, deadline__lt=timezone.now()
    ).order_by("deadline")
    return _each_call(overdue, services.call_deadline_passed, "deadline sweep")


@shared_task(name="callgate.tasks.purge_events", ignore_result=True)
def purge_events() -> int:
    """Retention: delete CallEvents, and inbox events the rules rejected, received more than
    ``project.retention_days`` days ago, in batches of ``PURGE_BATCH`` (short transactions;
    the next run continues where this stops). A project with ``retention_days == 0`` keeps
    everything. Returns rows deleted."""
    now = timezone.now()
    deleted = 0
    for project in Project.objects.filter(retention_days__gt=0).only("pk", "retention_days"):
        cutoff = now - timedelta(days=project.retention_days)
        for model, old in (
            (CallEvent, CallEvent.objects.filter(project=project, received_at__lt=cutoff)),
            (
                InboxEvent,
                InboxEvent.objects.filter(
                    project=project,
                    status__in=[InboxEvent.Status.REJECTED, InboxEvent.Status.APPLIED],
                    received_at__lt=cutoff,
                ),
            ),
        ):
            for _ in range(PURGE_MAX_BATCHES):
                ids = list(old.order_by().values_list("pk", flat=True)[:PURGE_BATCH])
                if not ids:
                    break
                count, _ = model.objects.filter(pk__in=ids).delete()
                deleted += count
    return deleted
