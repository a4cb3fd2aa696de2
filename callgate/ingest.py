"""The one path every event takes.

Agents' events arrive through ``POST /api/v1/events`` and the gate ``POST /api/v1/calls``:
``events_receive`` stores the validated envelopes in the inbox (``InboxEvent``, one
statement per batch, duplicates recognised by event ID) and ``inbox_drain`` applies them in
arrival order per project, from a Celery task for ``/events`` and at once for the gate.
Operator decisions, reconciliation results and sweeps call ``events_apply`` directly; the
replay command goes through ``events_receive`` and ``inbox_drain`` like the API.

A batch is applied in one transaction with a fixed number of SQL queries whatever its
size: everything the rules need is loaded up front (events already seen, calls, contracts,
re-ask budgets), each event is classified in memory in order (``callgate.classification``,
pure) and moved through the transition table (``callgate.lifecycle``), then all rows are
written with bulk operations. Review items are opened and settled in bulk; reconciliation
tasks are enqueued on commit, never before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from callgate import classification as cls
from callgate import lifecycle
from callgate.models import (
    Agent,
    AgentTool,
    CallEvent,
    Project,
    RequestBudget,
    ToolCall,
    ToolContract,
)
from callgate.providers import normalise
from callgate.reports.rollups import buckets_touch
from callgate.schemas import (
    ApprovalExpiredEvent,
    AttemptEvent,
    DecisionEvent,
    DeniedEvent,
    ProposedEvent,
    ReceiptEvent,
    ReconciledEvent,
)
from callgate.taxonomy import REASK_REASONS, Reason, Route
from callgate.wire import canonical_json, derive_operation_id, redact

S = ToolCall.State
logger = logging.getLogger(__name__)


def retry_after(contract: ToolContract | None, attempts: int) -> float:
    """Full-jitter exponential backoff in seconds (AWS Architecture Blog, "Exponential
    Backoff and Jitter"): uniform(0, min(maximum, initial * coefficient ** (attempts - 1)))."""
    if contract is None:
        return 1.0
    exponent = min(max(attempts - 1, 0), 64)  # past that the maximum interval caps it anyway
    cap = min(
        contract.retry_maximum_interval,
        contract.retry_initial_interval * contract.retry_backoff_coefficient**exponent,
    )
    return round(random.uniform(0, cap), 3)


def contract_view(contract: ToolContract) -> cls.Contract:
    return cls.Contract(
        name=contract.name,
        parameters=contract.parameters,
        effect=contract.effect,
        idempotent=contract.idempotent,
        reconcilable=contract.reconcilable,
        max_attempts=contract.max_attempts,
        max_reasks=contract.max_reasks,
        requires_approval=contract.requires_approval,
        description=contract.description,
    )


VERDICT_FOR_ROUTE = {
    Route.PROCEED: "allow",
    Route.REASK: "reask",
    Route.DENY: "deny",
    Route.RETRY: "retry",
    Route.RECONCILE: "reconcile",
    Route.RETURN_RECEIPT: "return_receipt",
    Route.REVIEW: "review",
    Route.STOP: "stop",
}


def call_answer(call: ToolCall, *, contract: ToolContract | None = None) -> dict:
    """The ``CallAnswer`` shape the API returns for a call (see ``callgate.api``)."""
    contract = contract or call.contract
    verdict = (
        "pending_approval"
        if call.state == S.PENDING_APPROVAL
        else VERDICT_FOR_ROUTE.get(call.route, "allow")
    )
    decision = None
    if call.decision:
        decision = {
            "decision": call.decision,
            "reason": call.decision_reason,
            "decided_at": call.decided_at.isoformat() if call.decided_at else None,
        }
    return {
        "operation_id": call.operation_id,
        "verdict": verdict,
        "state": call.state,
        "reason": call.reason or None,
        "category": call.category or None,
        "route": call.route or Route.PROCEED,
        "observation": call.observation,
        "receipt": call.receipt,
        "attempts": call.attempts,
        "max_attempts": contract.max_attempts if contract else None,
        "retry_after": retry_after(contract, call.attempts) if call.route == Route.RETRY else None,
        "decision": decision,
    }


# --- the batch ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What happened to one event: ``accepted``, ``duplicate`` (event ID seen before) or
    ``rejected`` (with ``errors``, each ``{"loc", "msg"}``)."""

    status: str
    errors: list[dict] = field(default_factory=list)


ACCEPTED = Outcome(status="accepted")
DUPLICATE = Outcome(status="duplicate")


class Rejected(Exception):
    def __init__(self, loc: str, msg: str):
        self.loc, self.msg = loc, msg
        super().__init__(msg)


@dataclass
class _Prepared:
    """A proposal normalised and keyed before the calls are loaded."""

    proposal: Any
    operation_id: str
    digest: str


#: Event types that record a human decision: an agent's key may report them only with
#: ``ApiKey.can_decide`` (an agent runtime with its own approval UI); ``events_receive``
#: refuses them otherwise.
DECISION_TYPES = frozenset({"decision", "approval_expired"})


class _Batch:
    def __init__(self, *, project: Project, agent: Agent, source: str, user=None):
        self.project, self.agent, self.source, self.user = project, agent, source, user
        self.now = timezone.now()
        self.calls: dict[str, ToolCall] = {}
        self.by_call_id: dict[tuple[str, str], ToolCall] = {}
        self.new_calls: list[ToolCall] = []
        self.new_ids: set[str] = set()
        self.changed: set[str] = set()
        self.events: list[tuple[ToolCall, CallEvent]] = []
        self.budgets: dict[tuple[str, str], int] = {}
        self.budget_rows: dict[tuple[str, str], RequestBudget] = {}
        self.to_review: dict[str, str] = {}  # operation_id -> kind
        self.to_settle: dict[str, str] = {}  # operation_id -> note
        self.to_reconcile: set[str] = set()
        self.prepared: dict[int, _Prepared] = {}

    # loading: a fixed number of queries ------------------------------------------------

    def load(self, events: list[Any]) -> set[str]:
        seen = set(
            str(e)
            for e in CallEvent.objects.filter(
                project=self.project, event_id__in=[e.event_id for e in events]
            ).values_list("event_id", flat=True)
        )
        contracts: dict[str, ToolContract] = {}
        for contract in ToolContract.objects.filter(project=self.project).order_by(
            "name", "-version"
        ):
            contracts.setdefault(contract.name, contract)
        self.contracts = contracts
        registered = set(AgentTool.objects.filter(agent=self.agent).values_list("name", flat=True))
        self.tools = (
            {name: c for name, c in contracts.items() if name in registered}
            if registered
            else contracts
        )
        self.tool_views = {name: contract_view(c) for name, c in self.tools.items()}

        op_ids, pairs, budget_keys = set(), set(), set()
        for index, event in enumerate(events):
            if isinstance(event, ProposedEvent):
                prepared = self._prepare(event)
                self.prepared[index] = prepared
                op_ids.add(prepared.operation_id)
                if event.request_id and prepared.proposal.tool:
                    budget_keys.add((event.request_id, prepared.proposal.tool))
            elif event.operation_id:
                op_ids.add(event.operation_id)
            elif event.request_id and event.call_id:
                pairs.add((event.request_id, event.call_id))
        # One query: calls named by operation ID, or by (request ID, call ID); the pairs are
        # matched by two IN lists and re-checked here (a cross product is harmless).
        query = Q(operation_id__in=op_ids)
        if pairs:
            query |= Q(request_id__in={r for r, _ in pairs}, call_id__in={c for _, c in pairs})
        if op_ids or pairs:
            rows = (
                ToolCall.objects.select_for_update(of=("self",))
                .select_related("contract")
                .filter(query, project=self.project)
            )
            for call in rows:
                if call.operation_id in op_ids or (call.request_id, call.call_id) in pairs:
                    self._remember(call)
        if (
            budget_keys
        ):  # two IN lists, pairs re-checked here (an OR per pair is too deep for SQLite)
            rows = RequestBudget.objects.filter(
                project=self.project,
                request_id__in={r for r, _ in budget_keys},
                tool_name__in={t for _, t in budget_keys},
            )
            for row in rows:
                if (row.request_id, row.tool_name) in budget_keys:
                    self.budget_rows[(row.request_id, row.tool_name)] = row
        return seen

    def _remember(self, call: ToolCall) -> None:
        self.calls[call.operation_id] = call
        if call.request_id and call.call_id:
            self.by_call_id[(call.request_id, call.call_id)] = call

    def _prepare(self, event: ProposedEvent) -> _Prepared:
        proposal = normalise(event.format, event.call)
        canonical = canonical_json(proposal.arguments) if proposal.arguments_ok else None
        digest = hashlib.sha256(canonical).hexdigest() if canonical is not None else ""
        if event.operation_id:
            operation_id = event.operation_id
        elif event.request_id and proposal.tool:
            operation_id = derive_operation_id(
                request_id=event.request_id,
                tool=proposal.tool,
                canonical=canonical,
                raw_arguments=None
                if canonical is not None
                else (proposal.raw_arguments or repr(proposal.arguments)),
            )
        else:
            operation_id = f"op_{uuid.uuid4().hex}"
        return _Prepared(proposal=proposal, operation_id=operation_id, digest=digest)

    # applying: in memory --------------------------------------------------------------

    def apply(self, index: int, event: Any) -> ToolCall:
        if isinstance(event, ProposedEvent):
            return self._proposed(event, self.prepared[index])
        call = self._find(event)
        state_before = call.state
        if isinstance(event, DecisionEvent):
            lifecycle.check(call.state, "decision", decision=event.decision)
        else:
            lifecycle.check(call.state, event.type)
        contract = call.contract
        name = call.tool_name or "the tool"
        executed = call.attempts > 0
        if isinstance(event, AttemptEvent):
            if contract is None:
                raise Rejected(
                    "type", "this call was refused at the gate; it has no contract to execute"
                )
            attempts = max(call.attempts + 1, event.attempt or 0)
            attempt = cls.Attempt(
                sent=event.sent,
                outcome=event.outcome,
                http_status=event.http_status,
                error=event.error,
                result=event.result,
                result_count=event.result_count,
                result_format=event.result_format,
            )
            result = cls.classify_attempt(
                attempt,
                contract=contract_view(contract),
                attempts_used=attempts,
                deadline_passed=bool(call.deadline and event.occurred_at > call.deadline),
                operation_id=call.operation_id,
            )
            call.attempts = attempts
            executed = True
            if (
                call.state == S.SUCCEEDED
            ):  # a late or out-of-order attempt: recorded, changes nothing
                return self._record(call, event, result, state_before, change=False)
            if result.route == Route.PROCEED:
                call.receipt, call.receipt_at = (
                    redact(event.result, contract.sensitive_fields),
                    self.now,
                )
        elif isinstance(event, ReconciledEvent):
            if contract is None:
                raise Rejected(
                    "type", "this call was refused at the gate; there is nothing to reconcile"
                )
            result = cls.classify_reconciled(
                found=event.found,
                matches=event.matches,
                contract=contract_view(contract),
                attempts_used=call.attempts,
                deadline_passed=bool(call.deadline and self.now > call.deadline),
            )
            if call.state == S.SUCCEEDED or (
                call.state == S.FAILED and result.reason != Reason.RECONCILED_APPLIED
            ):
                return self._record(call, event, result, state_before, change=False)
            if result.reason == Reason.RECONCILED_APPLIED:
                call.receipt = (
                    event.receipt
                    if event.receipt is not None
                    else call.receipt or {"reconciled": True}
                )
                call.receipt_at = self.now
        elif isinstance(event, ReceiptEvent):
            result = cls.classify_receipt(contract_name=name)
            if call.state == S.SUCCEEDED:
                return self._record(call, event, result, state_before, change=False)
            call.receipt, call.receipt_at = event.result, self.now
        elif isinstance(event, DeniedEvent):
            result = cls.classify_denied(contract_name=name)
        elif isinstance(event, DecisionEvent):
            result = cls.classify_decision(
                decision=event.decision,
                reason=event.reason,
                contract_name=name,
                current=Reason(call.reason) if call.reason else None,
                idempotent=bool(contract and contract.idempotent),
            )
            call.decision, call.decision_reason, call.decided_at = (
                event.decision,
                event.reason,
                self.now,
            )
            call.decided_by = self.user
            if event.decision == "mark_applied":
                call.receipt = call.receipt or {"marked_applied": True}
                call.receipt_at = self.now
        elif isinstance(event, ApprovalExpiredEvent):
            result = cls.classify_approval_expired(contract_name=name)
        else:  # pragma: no cover - the schema's union is closed
            raise Rejected("type", f"unknown event type {event.type!r}")
        new_state = lifecycle.next_state(call.state, event.type, result, executed=executed)
        self._set(call, result, new_state)
        return self._record(call, event, result, state_before)

    def _find(self, event: Any) -> ToolCall:
        if event.operation_id:
            call = self.calls.get(event.operation_id)
            if call is None:
                raise Rejected(
                    "operation_id",
                    f"no call with operation_id {event.operation_id!r} in this project",
                )
            return call
        if event.request_id and event.call_id:
            call = self.by_call_id.get((event.request_id, event.call_id))
            if call is None:
                raise Rejected(
                    "call_id",
                    f"no call with call_id {event.call_id!r} in request {event.request_id!r}",
                )
            return call
        raise Rejected(
            "operation_id", "name the call: give operation_id, or call_id together with request_id"
        )

    def _proposed(self, event: ProposedEvent, prepared: _Prepared) -> ToolCall:
        proposal = prepared.proposal
        call = self.calls.get(prepared.operation_id)
        state_before = call.state if call else None
        lifecycle.check(state_before, "proposed")
        contract = self.tools.get(proposal.tool or "")
        if (
            call is not None
            and call.state in (S.RECONCILING, S.IN_REVIEW, S.PENDING_APPROVAL)
            and call.arguments_digest == prepared.digest
        ):
            # Already being handled (outcome unknown, or a human decides): answer where it
            # stands. Never a second execution while the outcome of the first is unknown.
            current = cls.Verdict(
                reason=Reason(call.reason) if call.reason else None,
                route=Route(call.route or Route.PROCEED),
                observation=call.observation,
            )
            return self._record(call, event, current, state_before, change=False)
        budget_key = (
            (event.request_id, proposal.tool) if event.request_id and proposal.tool else None
        )
        existing = None
        if call is not None and call.state != S.REJECTED:
            existing = cls.Existing(
                arguments_digest=call.arguments_digest, has_receipt=call.state == S.SUCCEEDED
            )
        result = cls.classify_proposal(
            proposal,
            tools=self.tool_views,
            existing=existing,
            arguments_digest=prepared.digest,
            reasks_used=self._reasks_used(budget_key),
        )
        if budget_key and result.reason in REASK_REASONS:
            self.budgets[budget_key] = self._reasks_used(budget_key) + 1
        if call is None:
            call = ToolCall(
                project=self.project,
                agent=self.agent,
                operation_id=prepared.operation_id,
                request_id=event.request_id or "",
                conversation_id=event.conversation_id or "",
                trace_id=event.trace_id or "",
                call_id=event.call_id or proposal.call_id or "",
                actor=event.actor or "",
                provider_format=event.format,
                tool_name=(proposal.tool or "")[:128],
                contract=contract,
                created_at=self.now,
                state=S.ALLOWED,
            )
            if proposal.arguments_ok:
                call.arguments = redact(
                    proposal.arguments, contract.sensitive_fields if contract else ()
                )
                call.arguments_digest = prepared.digest
            if contract and contract.deadline_seconds:
                call.deadline = event.occurred_at + timedelta(seconds=contract.deadline_seconds)
            self.new_calls.append(call)
            self.new_ids.add(call.operation_id)
            self._remember(call)
        elif result.reason == Reason.DUPLICATE_SUPPRESSED:
            call.duplicates_suppressed += 1
        elif call.state in (S.REJECTED, S.FAILED) and proposal.arguments_ok:
            call.contract = contract or call.contract
            call.arguments = redact(
                proposal.arguments, contract.sensitive_fields if contract else ()
            )
            call.arguments_digest = prepared.digest
        if result.reason == Reason.APPROVAL_PENDING and contract is not None:
            call.approval_expires_at = self.now + timedelta(
                seconds=contract.approval_timeout_seconds
            )
        new_state = lifecycle.next_state(
            state_before, "proposed", result, executed=call.attempts > 0
        )
        self._set(call, result, new_state)
        return self._record(
            call, event, result, state_before, body=self._proposal_body(event, proposal, contract)
        )

    def _proposal_body(
        self, event: ProposedEvent, proposal: Any, contract: ToolContract | None
    ) -> dict:
        """The stored body of a proposal: the provider's call with its arguments redacted."""
        sensitive = contract.sensitive_fields if contract else ()
        body = {"format": event.format, "call": redact(event.call, sensitive)}
        if proposal.arguments_ok:
            body["arguments"] = redact(proposal.arguments, sensitive)
            if (
                proposal.raw_arguments is not None
            ):  # the JSON string inside the call may hold secrets
                body["call"] = json.loads(
                    json.dumps(body["call"]).replace(
                        json.dumps(proposal.raw_arguments)[1:-1], "<see arguments>"
                    )
                )
        elif proposal.raw_arguments is not None:
            body["raw_arguments"] = proposal.raw_arguments[:2000]
        if proposal.malformed:
            body["malformed"] = proposal.malformed
        if proposal.parse_error:
            body["parse_error"] = proposal.parse_error
        return body

    def _reasks_used(self, key: tuple[str, str] | None) -> int:
        if key is None:
            return 0
        if key in self.budgets:
            return self.budgets[key]
        row = self.budget_rows.get(key)
        return row.reasks_used if row else 0

    def _set(self, call: ToolCall, result: cls.Verdict, new_state: str) -> None:
        previous_state = call.state
        call.state = new_state
        call.reason = result.reason.value if result.reason else ""
        call.category = result.category.value if result.category else ""
        call.route = result.route.value
        call.observation = result.observation
        call.updated_at = self.now
        key = call.operation_id
        if new_state in (S.IN_REVIEW, S.PENDING_APPROVAL):
            self.to_review[key] = "approval" if new_state == S.PENDING_APPROVAL else "escalation"
            self.to_settle.pop(key, None)
        elif previous_state in (S.IN_REVIEW, S.PENDING_APPROVAL, S.RECONCILING):
            # An operator deciding through the queue has closed the item already (nothing
            # left to settle); any other decision or later event closes it here.
            self.to_review.pop(key, None)
            self.to_settle[key] = f"settled by a later event: {call.reason or 'allowed'}"
        if (
            new_state == S.RECONCILING
            and call.contract
            and call.contract.reconcile_method == ToolContract.ReconcileMethod.HTTP
        ):
            call.reconcile_requested_at = self.now
            self.to_reconcile.add(key)

    def _record(
        self,
        call: ToolCall,
        event: Any,
        result: cls.Verdict,
        state_before: str | None,
        *,
        change: bool = True,
        body: dict | None = None,
    ) -> ToolCall:
        if change or call.operation_id not in self.new_ids:
            self.changed.add(call.operation_id)
        if body is None:
            body = event.model_dump(
                mode="json",
                exclude={
                    "event_id",
                    "occurred_at",
                    "operation_id",
                    "call_id",
                    "request_id",
                    "conversation_id",
                    "trace_id",
                    "actor",
                },
            )
            body = redact(body, call.contract.sensitive_fields if call.contract else ())
        self.events.append(
            (
                call,
                CallEvent(
                    project=self.project,
                    event_id=event.event_id,
                    kind=event.type,
                    source=self.source,
                    body=body,
                    occurred_at=event.occurred_at,
                    received_at=self.now,
                    reason=result.reason.value if result.reason else "",
                    category=result.category.value if result.category else "",
                    route=result.route.value,
                    observation=result.observation,
                    state_before=state_before or "",
                    state_after=call.state,
                ),
            )
        )
        return call

    # saving: bulk operations ------------------------------------------------------------

    def save(self) -> None:
        new_ids = self.new_ids
        if self.new_calls:
            ToolCall.objects.bulk_create(self.new_calls)
        existing = [self.calls[op] for op in self.changed if op not in new_ids]
        if existing:
            ToolCall.objects.bulk_update(existing, CALL_FIELDS)
        if self.events:
            rows = []
            for call, row in self.events:
                row.call_id = call.pk
                rows.append(row)
            CallEvent.objects.bulk_create(rows)
        if self.budgets:
            RequestBudget.objects.bulk_create(
                [
                    RequestBudget(project=self.project, request_id=r, tool_name=t, reasks_used=n)
                    for (r, t), n in self.budgets.items()
                ],
                update_conflicts=True,
                unique_fields=["project", "request_id", "tool_name"],
                update_fields=["reasks_used"],
            )
        from reviews import services as review_services

        if self.to_settle:
            review_services.review_items_settle_bulk(
                calls=[self.calls[op] for op in self.to_settle],
                note_by_call={self.calls[op].pk: n for op, n in self.to_settle.items()},
            )
        if self.to_review:
            review_services.review_items_open_bulk(
                calls=[(self.calls[op], kind) for op, kind in self.to_review.items()]
            )
        if self.to_reconcile:
            ids = [self.calls[op].pk for op in self.to_reconcile]
            transaction.on_commit(lambda: _enqueue_reconcile(ids))


CALL_FIELDS = [
    "state",
    "reason",
    "category",
    "route",
    "observation",
    "attempts",
    "duplicates_suppressed",
    "receipt",
    "receipt_at",
    "arguments",
    "arguments_digest",
    "contract",
    "approval_expires_at",
    "reconcile_requested_at",
    "decision",
    "decision_reason",
    "decided_by",
    "decided_at",
    "updated_at",
]


def _enqueue_reconcile(call_ids: list[int]) -> None:
    from callgate.tasks import reconcile_call

    for pk in call_ids:
        reconcile_call.delay(pk)


def events_apply(
    *,
    project: Project,
    agent: Agent,
    events: list[Any],
    source: str = CallEvent.Source.AGENT,
    user=None,
) -> list[Outcome]:
    """Apply validated events (``callgate.schemas`` models) in order; one ``Outcome`` each.

    Events whose ``event_id`` was stored before (or repeats within the batch) are
    ``duplicate`` and change nothing. An event the rules refuse (unknown call, a transition
    the call's state does not allow) is ``rejected`` with ``errors`` naming the field; the
    others are stored. Runs in one transaction; retried once if a concurrent request
    created the same operation first. Each event's classification is stored on its
    ``CallEvent``; ``event_answer`` reads it back."""
    for attempt in range(2):
        try:
            with transaction.atomic():
                return _apply_once(
                    project=project, agent=agent, events=events, source=source, user=user
                )
        except IntegrityError:
            if attempt == 1:
                raise
    raise AssertionError("unreachable")


def _apply_once(*, project, agent, events, source, user) -> list[Outcome]:
    batch = _Batch(project=project, agent=agent, source=source, user=user)
    seen = batch.load(events)
    outcomes: list[Outcome] = []
    for index, event in enumerate(events):
        key = str(event.event_id)
        if key in seen:
            outcomes.append(DUPLICATE)
            continue
        seen.add(key)
        try:
            batch.apply(index, event)
        except Rejected as exc:
            outcomes.append(Outcome(status="rejected", errors=[{"loc": exc.loc, "msg": exc.msg}]))
            continue
        except lifecycle.IllegalTransition as exc:
            outcomes.append(Outcome(status="rejected", errors=[{"loc": "type", "msg": str(exc)}]))
            continue
        outcomes.append(ACCEPTED)
    batch.save()
    buckets_touch(batch.calls[op] for op in batch.changed | batch.new_ids)
    return outcomes


# --- the inbox: receive now, apply in order -------------------------------------------------

#: Inbox rows applied per transaction (and per hold of the project's drain lock).
