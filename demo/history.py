"""Thirty days of demo history, so every report and the overview have something to read.

``history_seed`` writes calls straight into the database (no SDK round trips: thousands of
calls in seconds) for the demo fleet's agents and tools, with a daily rhythm (busy office
hours, quiet nights), a weekly one (quiet weekends), slow growth, and three incidents:

- **contract change**: ``book_meeting`` v2 adds a required ``timezone`` argument; the
  agents' argument errors spike for two days after the change, then settle as their prompts
  catch up (the contract-quality report shows v1 beside v2);
- **upstream outage**: three hours in which the read tools' target is unavailable: most
  calls run out of retries (``retry_exhausted``), some succeed on a later attempt (a
  transient failure older than an hour has ended one way or the other, as in life);
- **retry storm**: an hour in which ``legacy-bot`` repeats ``create_follow_up`` in a loop;
  callgate answers the repeats with the stored receipt (``duplicate_suppressed``, with
  duplicates counted) and stops the loop (``loop_detected``, ``reask_exhausted``).

Escalated and approval calls of the history were decided (review items resolved by the
``operator`` user, each opened at its call's time, with its audit trail) so the
review-health report has decisions and times to decision. Each agent registers the tools it
calls (``TOOLS``), and ``book_meeting``'s versions are scored by the contract linter.

Every history call's operation ID starts with ``HISTORY_PREFIX``. ``demo_reset`` removes
the demo project's calls (history and earlier fleet runs) so running the demo twice resets
instead of duplicating; the command says so.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from callgate.lint import lint_contract
from callgate.models import (
    Agent,
    AgentTool,
    ApiKey,
    CallEvent,
    CallRollup,
    InboxEvent,
    Project,
    RefusalRollup,
    RequestBudget,
    RollupCube,
    ToolCall,
    ToolContract,
)
from callgate.taxonomy import (
    PROPOSAL_PRECEDENCE,
    Category,
    Reason,
    Route,
    category_of,
    route_of,
)
from callgate_sdk.wire import REDACTED

HISTORY_PREFIX = "hist-"
DAYS = 30
#: calls per hour at the busiest weekday hour, before growth
PEAK_PER_HOUR = 16
#: relative traffic per UTC hour of the day (office hours in Europe and the Americas)
HOURLY = [
    0.15, 0.1, 0.08, 0.08, 0.1, 0.15, 0.3, 0.55, 0.8, 0.95, 1.0, 0.95,
    0.85, 0.9, 1.0, 0.95, 0.85, 0.7, 0.55, 0.45, 0.35, 0.3, 0.25, 0.2,
]  # fmt: skip
WEEKEND = 0.4
GROWTH_PER_DAY = 0.012

#: tool -> (weight, agents that call it)
TOOLS: dict[str, tuple[int, tuple[str, ...]]] = {
    "lookup_ticket": (22, ("support-bot",)),
    "create_follow_up": (16, ("support-bot", "legacy-bot")),
    "escalate_ticket": (5, ("support-bot",)),
    "get_weather": (18, ("shop-bot", "legacy-bot")),
    "search_products": (20, ("shop-bot",)),
    "issue_payout": (6, ("finance-bot",)),
    "book_meeting": (14, ("support-bot", "finance-bot")),
    "do_stuff": (2, ("legacy-bot",)),
}
#: the everyday mix of reasons (weights); write-only reasons only on write tools
BASELINE: dict[str, int] = {
    "ok": 780,
    "empty_result": 45,
    "missing_required": 9,
    "type_mismatch": 10,
    "enum_violation": 5,
    "constraint_violation": 8,
    "invalid_json": 3,
    "unknown_tool": 4,
    "unknown_argument": 6,
    "reference_not_found": 7,
    "permission_denied": 5,
    "rate_limited": 8,
    "unavailable": 6,
    "read_failure": 5,
    "tool_error": 6,
    "partial_failure": 2,
    "duplicate_suppressed": 8,
    "retry_exhausted": 3,
    "reask_exhausted": 2,
}
WRITE_ONLY = {"duplicate_suppressed", "retry_exhausted"}
WRITE_MIX: dict[str, int] = {
    "reconciled_applied": 6,
    "reconciled_absent": 2,
    "not_reconcilable": 1,
    "conflict": 2,
}
APPROVAL_MIX = {"approval_granted": 10, "approval_rejected": 2, "approval_expired": 1}
ARGUMENT_ERRORS = ["missing_required", "type_mismatch", "enum_violation"]
OUTAGE_REASONS = {"unavailable": 5, "circuit_open": 4, "read_failure": 2, "retry_exhausted": 1}


@dataclass
class HistoryResult:
    calls: int = 0
    review_items: int = 0
    by_incident: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Incidents:
    """When the incidents happen (aware UTC datetimes)."""

    contract_change: datetime
    outage: tuple[datetime, datetime]
    storm: tuple[datetime, datetime]

    @classmethod
    def relative_to(cls, now: datetime) -> Incidents:
        day = now.replace(hour=0, minute=0, second=0, microsecond=0)
        outage = day - timedelta(days=6) + timedelta(hours=13)
        storm = day - timedelta(days=3) + timedelta(hours=10)
        return cls(
            contract_change=day - timedelta(days=11) + timedelta(hours=9),
            outage=(outage, outage + timedelta(hours=3)),
            storm=(storm, storm + timedelta(hours=1)),
        )


def demo_reset(*, project: Project) -> int:
    """Delete the project's calls and everything derived from them (events, review items,
    rollups, review and refusal rollups, closed-item counts, inbox rows, re-ask budgets) and the API keys earlier demo runs
    issued (named "demo"). Contracts and agents stay. Returns the number of calls removed."""
    with transaction.atomic():
        n = ToolCall.objects.filter(project=project).count()
        CallEvent.objects.filter(project=project).delete()
        from reviews.models import ClosedItemCount, ReviewItem, ReviewRollup

        ReviewItem.objects.filter(project=project).delete()
        ReviewRollup.objects.filter(project=project).delete()
        ClosedItemCount.objects.filter(project=project).delete()
        ToolCall.objects.filter(project=project).delete()
        CallRollup.objects.filter(project=project).delete()
        RollupCube.objects.filter(project=project).delete()
        RefusalRollup.objects.filter(project=project).delete()
        InboxEvent.objects.filter(project=project).delete()
        RequestBudget.objects.filter(project=project).delete()
        # the keys earlier runs issued (each run prints fresh ones)
        ApiKey.objects.filter(project=project, name="demo").delete()
    return n


def _contracts(project: Project, incidents: Incidents, start: datetime) -> dict:
    """The latest contract per tool, and ``book_meeting`` v1 / v2 (the contract change)."""
    latest: dict[str, ToolContract] = {}
    for contract in ToolContract.objects.filter(project=project).order_by("name", "-version"):
        latest.setdefault(contract.name, contract)
    base: dict[str, Any] = {
        "type": "object",
        "properties": {
            "attendee": {"type": "string", "description": "Email of the person to meet."},
            "starts_at": {"type": "string", "format": "date-time"},
            "minutes": {"type": "integer", "enum": [15, 30, 60]},
        },
        "required": ["attendee", "starts_at", "minutes"],
        "additionalProperties": False,
    }
    changed = {
        **base,
        "properties": {
            **base["properties"],
            "timezone": {"type": "string", "description": "IANA time zone, e.g. Europe/Paris."},
        },
        "required": [*base["required"], "timezone"],
    }
    description = "Book a meeting in the user's calendar."
    versions = {}
    for version, params, created in ((1, base, start), (2, changed, incidents.contract_change)):
        # scored by the linter, as a registered contract is: the score and the findings the
        # contract's page lists agree
        report = lint_contract(name="book_meeting", description=description, parameters=params)
        versions[version], _ = ToolContract.objects.update_or_create(
            project=project,
            name="book_meeting",
            version=version,
            defaults={
                "description": description,
                "parameters": params,
                "effect": ToolContract.Effect.WRITE,
                "idempotent": True,
                "digest": uuid.uuid5(uuid.NAMESPACE_URL, f"book_meeting/{version}").hex * 2,
                "lint_score": report.score,
                "lint_findings": [f.as_dict() for f in report.findings],
                "created_at": created,
            },
        )
    return {"latest": latest, "book_meeting": versions}


def _pick(rng: random.Random, weights: dict[str, int]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _reason_for(
    rng: random.Random,
    *,
    tool: str,
    write: bool,
    approval: bool,
    at: datetime,
    incidents: Incidents,
) -> tuple[str, str]:
    """(reason, incident name or "") of one history call."""
    if tool == "book_meeting" and at >= incidents.contract_change:
        days = (at - incidents.contract_change).total_seconds() / 86400
        rate = 0.04 + 0.55 * math.exp(-days / 1.2)  # spikes, then the prompts catch up
        if rng.random() < rate:
            return rng.choice(ARGUMENT_ERRORS), "contract_change" if days < 3 else ""
    if (
        tool in ("get_weather", "lookup_ticket", "search_products")
        and incidents.outage[0] <= at < incidents.outage[1]
        and rng.random() < 0.75
    ):
        return _pick(rng, OUTAGE_REASONS), "outage"
    if approval and rng.random() < 0.6:
        return _pick(rng, APPROVAL_MIX), ""
    mix = dict(BASELINE)
    if write:
        mix.update(WRITE_MIX)
    else:
        for reason in WRITE_ONLY:
            mix.pop(reason, None)
    return _pick(rng, mix), ""


def _hourly_count(rng: random.Random, moment: datetime, day_index: int) -> int:
    weekend = WEEKEND if moment.weekday() >= 5 else 1.0
    mean = PEAK_PER_HOUR * HOURLY[moment.hour] * weekend * (1 + GROWTH_PER_DAY * day_index)
    return max(0, round(rng.gauss(mean, math.sqrt(mean))))


def history_seed(
    *, project: Project, seed: int = 1, days: int = DAYS, now: datetime | None = None
) -> HistoryResult:
    """Write ``days`` days of history up to ``now`` for the project's agents (see the module
    docstring), then rebuild the project's rollups. Agents the fleet did not create are
    created. Returns counts. Call ``demo_reset`` first to avoid piling up histories."""
    from django.contrib.auth import get_user_model

    from callgate.reports.rollups import rollups_rebuild
    from callgate.reports.tallies import refusal_rollups_rebuild, review_rollups_rebuild
    from reviews.models import ReviewAudit, ReviewItem

    rng = random.Random(seed)
    now = now or timezone.now()
    start = (now - timedelta(days=days)).replace(minute=0, second=0, microsecond=0)
    incidents = Incidents.relative_to(now)
    contracts = _contracts(project, incidents, start)
    agent_names = {name for _, names in TOOLS.values() for name in names}
    agents = {
        name: Agent.objects.get_or_create(project=project, name=name)[0] for name in agent_names
    }
    for tool, (_, names) in TOOLS.items():  # each agent uses the tools it registered
        for name in names:
            registered, _ = AgentTool.objects.get_or_create(agent=agents[name], name=tool)
            if (
                name == names[0]
                and not AgentTool.objects.filter(
                    agent__project=project, name=tool, owner=True
                ).exists()
            ):
                registered.owner = True
                registered.save(update_fields=["owner"])
    operator = get_user_model().objects.filter(username="operator").first()
    result = HistoryResult()
    calls: list[ToolCall] = []
    tools, weights = zip(*((t, w) for t, (w, _) in TOOLS.items()), strict=True)
    hour = start
    while hour < now:
        day_index = (hour - start).days
        for _ in range(_hourly_count(rng, hour, day_index)):
            at = hour + timedelta(seconds=rng.randrange(3600))
            if at >= now:
                continue
            tool = rng.choices(tools, weights=weights)[0]
            calls.append(_call(rng, project, agents, contracts, tool, at, incidents, result))
        if incidents.outage[0] <= hour < incidents.outage[1]:  # the agents retry reads
            for _ in range(45):
                at = hour + timedelta(seconds=rng.randrange(3600))
                tool = rng.choice(["get_weather", "lookup_ticket", "search_products"])
                calls.append(_call(rng, project, agents, contracts, tool, at, incidents, result))
        if incidents.storm[0] <= hour < incidents.storm[1]:
            for _ in range(260):
                at = hour + timedelta(seconds=rng.randrange(3600))
                calls.append(_storm_call(rng, project, agents, contracts, at, result))
        hour += timedelta(hours=1)
    for call in calls:  # the operator decided what the history's humans decided
        if call.decision:
            call.decided_by = operator
    with transaction.atomic():
        ToolCall.objects.bulk_create(calls, batch_size=1000)
        saved = {
            c.operation_id: c
            for c in ToolCall.objects.filter(
                project=project, operation_id__startswith=HISTORY_PREFIX
            ).only("id", "operation_id", "created_at", "reason", "decided_at", "decision")
        }
        events, items = [], []
        for call in calls:
            row = saved[call.operation_id]
            if call.reason in ("reconciled_applied", "reconciled_absent", "not_reconcilable"):
                events.append(_unknown_event(project, row, call))
            if call.decision:
                items.append((_resolved_item(project, row, call, operator), call))
        CallEvent.objects.bulk_create(events, batch_size=1000)
        ReviewItem.objects.bulk_create([item for item, _ in items], batch_size=1000)
        ReviewAudit.objects.bulk_create(
            [row for item, call in items for row in _item_trail(project, item, call)],
            batch_size=1000,
        )
    result.calls = len(calls)
    result.review_items = len(items)
    rollups_rebuild(project_id=project.pk)
    review_rollups_rebuild(project_id=project.pk)
    refusal_rollups_rebuild(project_id=project.pk)
    return result


_STATE_OF_ROUTE = {
    Route.PROCEED: ToolCall.State.SUCCEEDED,
    Route.RETURN_RECEIPT: ToolCall.State.SUCCEEDED,
    Route.RETRY: ToolCall.State.RETRY_WAIT,
    Route.RECONCILE: ToolCall.State.FAILED,
    Route.REASK: ToolCall.State.FAILED,
    Route.DENY: ToolCall.State.FAILED,
    Route.STOP: ToolCall.State.FAILED,
    Route.REVIEW: ToolCall.State.FAILED,
}
#: how a human settled each review-routed reason in the history (decision weights)
DECISION_MIX = {
    "retry_exhausted": {"approve_retry": 6, "reject": 2, "mark_failed": 1},
    "reconciled_absent": {"approve_retry": 8, "reject": 1},
    "not_reconcilable": {"mark_applied": 4, "mark_failed": 2, "reject": 1},
    "conflict": {"reject": 5, "mark_failed": 2},
    "approval_granted": {"approve": 1},
    "approval_rejected": {"reject": 1},
}


def _call(rng, project, agents, contracts, tool, at, incidents, result) -> ToolCall:
    contract = (
        contracts["book_meeting"][2 if at >= incidents.contract_change else 1]
        if tool == "book_meeting"
        else contracts["latest"].get(tool)
    )
    write = contract is not None and contract.effect == ToolContract.Effect.WRITE
    approval = contract is not None and contract.requires_approval
    reason, incident = _reason_for(
        rng, tool=tool, write=write, approval=approval, at=at, incidents=incidents
    )
    if incident:
        result.by_incident[incident] = result.by_incident.get(incident, 0) + 1
    agent = agents[rng.choice(TOOLS[tool][1])]
    max_attempts = max(contract.max_attempts if contract else 3, 2)
    attempts = 2 if rng.random() < 0.06 else 1
    if category_of(reason) == Category.TRANSIENT:
        # a transient failure is retried: by now it succeeded on a later attempt, or its
        # retries ran out; only the last hour's may still be waiting to retry
        if at < timezone.now() - timedelta(hours=1):
            if rng.random() < (0.35 if incident == "outage" else 0.8):
                reason, attempts = "ok", rng.randint(2, max_attempts)
            else:
                reason, attempts = "retry_exhausted", max_attempts
        else:
            attempts = rng.randint(1, max_attempts - 1)
    elif reason == "retry_exhausted":
        attempts = max_attempts
    return _build(rng, project, agent, contract, tool, reason, at, attempts=attempts)


def _storm_call(rng, project, agents, contracts, at, result) -> ToolCall:
    reason = _pick(rng, {"duplicate_suppressed": 14, "loop_detected": 4, "reask_exhausted": 2})
    result.by_incident["retry_storm"] = result.by_incident.get("retry_storm", 0) + 1
    call = _build(
        rng,
        project,
        agents["legacy-bot"],
        contracts["latest"].get("create_follow_up"),
        "create_follow_up",
        reason,
        at,
        attempts=1,
    )
    if reason == "duplicate_suppressed":
        call.duplicates_suppressed = rng.randint(4, 18)
    return call


#: reasons found at the gate, before anything ran (the proposal's own faults, and the
#: approvals a human refused or let run out): the call was never attempted
AT_THE_GATE = (
    (set(PROPOSAL_PRECEDENCE) | {Reason.REASK_EXHAUSTED, Reason.APPROVAL_REJECTED})
    - {Reason.DUPLICATE_SUPPRESSED, Reason.IDEMPOTENCY_MISMATCH}
) | {Reason.APPROVAL_EXPIRED}


def _build(rng, project, agent, contract, tool, reason, at, *, attempts) -> ToolCall:
    route = route_of(reason, idempotent=bool(contract and contract.idempotent))
    state = _STATE_OF_ROUTE[route]
    at_gate = reason in AT_THE_GATE
    if at_gate:
        attempts = 0
        # refused before it ran: "rejected at the gate" (an approval that ran out: failed)
        if state == ToolCall.State.FAILED and reason != Reason.APPROVAL_EXPIRED:
            state = ToolCall.State.REJECTED
    decision = ""
    decided_at = None
    if reason in DECISION_MIX:
        decision = _pick(rng, DECISION_MIX[reason])
        decided_at = at + timedelta(seconds=rng.randint(40, 4 * 3600))
        state = (
            ToolCall.State.SUCCEEDED
            if decision in ("approve", "approve_retry", "mark_applied")
            else ToolCall.State.REJECTED
            if at_gate
            else ToolCall.State.FAILED
        )
    elif reason == Reason.APPROVAL_EXPIRED:
        decided_at = at + timedelta(minutes=15)
    operation_id = f"{HISTORY_PREFIX}{uuid.UUID(int=rng.getrandbits(128)).hex}"
    return ToolCall(
        project=project,
        agent=agent,
        operation_id=operation_id,
        request_id=f"req-h{rng.getrandbits(32):08x}",
        tool_name=tool,
        contract=contract,
        arguments=_arguments(
            tool,
            at,
            operation_id,
            # book_meeting v2 wants a time zone; the calls that forgot it failed on arguments
            with_timezone=bool(
                contract
                and contract.version >= 2
                and category_of(reason) != Category.ARGUMENT_ERROR
            ),
        ),
        state=state,
        reason=reason,
        category=category_of(reason),
        route=route,
        attempts=attempts,
        decision=decision,
        decided_at=decided_at if decision else None,
        created_at=at,
        updated_at=decided_at or at,
    )


def _arguments(tool: str, at: datetime, operation_id: str, *, with_timezone: bool) -> dict:
    """Arguments of the kind the demo's agents send to ``tool`` (drawn from their own
    generator seeded by the operation ID, so the traffic above stays the same); the payout's
    IBAN is redacted as ingest redacts a sensitive field."""
    rng = random.Random(operation_id)
    ticket = f"T-{rng.randint(1, 480)}"
    due = (at + timedelta(days=rng.randint(1, 6))).replace(minute=0, second=0, microsecond=0)
    when = due.strftime("%Y-%m-%dT%H:%M:%SZ")
    generators: dict[str, Callable[[], dict[str, Any]]] = {
        "lookup_ticket": lambda: {"ticket_id": ticket},
        "create_follow_up": lambda: {
            "ticket_id": ticket,
            "assignee_id": f"u-{rng.randint(1, 40)}",
            "due_at": when,
        },
        "escalate_ticket": lambda: {
            "ticket_id": ticket,
            "assignee_id": f"u-{rng.randint(41, 48)}",
            "due_at": when,
        },
        "get_weather": lambda: {"city": rng.choice(("Paris", "Lisbon", "Oslo", "Osaka", "Lima"))},
        "search_products": lambda: {
            "query": rng.choice(("standing desk", "usb-c hub", "desk lamp", "office chair")),
            "num_results": rng.randint(1, 10),
        },
        "issue_payout": lambda: {
            "customer_id": f"C-{rng.randint(1, 300)}",
            "amount_cents": rng.randint(5, 900) * 100,
            "iban": REDACTED,
        },
        "book_meeting": lambda: {
            "attendee": f"customer{rng.randint(1, 300)}@example.com",
            "starts_at": when,
            "minutes": rng.choice([15, 30, 60]),
            **({"timezone": "Europe/Paris"} if with_timezone else {}),
        },
        "do_stuff": lambda: {"x": "reindex", "y": rng.choice(["all", "tickets"])},
    }
    return generators.get(tool, dict)()


def _unknown_event(project, row: ToolCall, call: ToolCall) -> CallEvent:
    """The attempt whose outcome was unknown, before the reconciliation settled it."""
    return CallEvent(
        project=project,
        call_id=row.pk,
        kind=CallEvent.Kind.ATTEMPT,
        source=CallEvent.Source.AGENT,
        body={"type": "attempt", "outcome": "timeout", "sent": True},
        occurred_at=call.created_at,
        received_at=call.created_at,
        reason=Reason.OUTCOME_UNKNOWN,
        category=Category.UNKNOWN_OUTCOME,
        route=Route.RECONCILE,
    )


def _resolved_item(project, row: ToolCall, call: ToolCall, operator):
    from reviews.models import ReviewItem

    approval = call.category == Category.APPROVAL
    assert call.decided_at is not None  # history calls with a decision have its time
    return ReviewItem(
        project=project,
        call_id=row.pk,
        kind=ReviewItem.Kind.APPROVAL if approval else ReviewItem.Kind.ESCALATION,
        status=ReviewItem.Status.RESOLVED,
        reason=Reason.APPROVAL_PENDING if approval else call.reason,
        tool_name=call.tool_name,
        agent_id=call.agent_id,
        resolution=call.decision,
        resolved_by=operator,
        resolved_at=call.decided_at,
        created_at=call.created_at,
        updated_at=call.decided_at,
    )


def _item_trail(project, item, call: ToolCall):
    """The audit trail of a history item: opened by callgate when its call needed a human,
    then decided by the operator."""
    from reviews.models import ReviewAudit, ReviewItem

    call_state = (
        ToolCall.State.PENDING_APPROVAL
        if item.kind == ReviewItem.Kind.APPROVAL
        else ToolCall.State.IN_REVIEW
    )
    opened = ReviewAudit(
        project=project,
        item=item,
        action=ReviewAudit.Action.OPENED,
        state_after=ReviewItem.Status.OPEN,
        call_state_after=call_state,
        reason=item.reason,
        created_at=item.created_at,
    )
    decided = ReviewAudit(
        project=project,
        item=item,
        actor=item.resolved_by,
        action=item.resolution,
        state_before=ReviewItem.Status.OPEN,
        state_after=item.status,
        call_state_before=call_state,
        call_state_after=call.state,
        created_at=item.resolved_at or item.updated_at,
    )
    return [opened, decided]
