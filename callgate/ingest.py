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

import functools
import hashlib
import json
import logging
import random
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar, TypeVar, cast

import psycopg
from django.db import IntegrityError, connection, models, transaction
from django.db.backends.utils import CursorDebugWrapper
from django.db.models import Field, Q
from django.utils import timezone
from psycopg.types.json import Jsonb

from callgate import classification as cls
from callgate import escalation, lifecycle
from callgate.celery import enqueue_on_commit
from callgate.metrics import hour_floor
from callgate.models import (
    Agent,
    AgentTool,
    CallEvent,
    Project,
    RefusalRollup,
    RequestBudget,
    RollupDirtyBucket,
    ToolCall,
    ToolContract,
)
from callgate.prometheus import VERDICTS
from callgate.reports.rollups import buckets_touch
from callgate.reports.tallies import LOCK_CLASS, refusal_counts, tally_add, tally_key_columns
from callgate.schemas import (
    ApprovalExpiredEvent,
    AttemptEvent,
    DeadlinePassedEvent,
    DecisionEvent,
    DeniedEvent,
    ProposedEvent,
    ReceiptEvent,
    ReconciledEvent,
    ReconcileFailedEvent,
    TurnEvent,
)
from callgate.taxonomy import (
    REASK_REASONS,
    REFUSALS,
    STICKY_REASONS,
    Category,
    Reason,
    Route,
    category_of,
)
from callgate_sdk.providers import TurnError, normalise, split_turn
from callgate_sdk.wire import canonical_arguments, cut_texts, derive_operation_id, redact

S = ToolCall.State
logger = logging.getLogger(__name__)

M = TypeVar("M", bound=models.Model)


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
        volatile_arguments=tuple(contract.volatile_arguments or ()),
        max_identical=contract.max_identical,
        not_found_may_hide_forbidden=contract.not_found_may_hide_forbidden,
        result_error_markers=contract.result_error_markers,
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
        else VERDICT_FOR_ROUTE.get(Route(call.route), "allow")
    )
    decision = None
    if call.decision:
        decision = {
            "decision": call.decision,
            "reason": call.decision_reason,
            "decided_at": call.decided_at.isoformat() if call.decided_at else None,
            "arguments": call.decision_arguments,
            "proposed_operation_id": call.proposed_operation_id or None,
        }
    return {
        "operation_id": call.operation_id,
        "call_id": call.call_id or None,
        "executed_by": call.executed_by,
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
    """What happened to one event: ``accepted``, ``duplicate`` (event ID seen before),
    ``conflict`` (event ID seen before with other content: ``callgate.inbox.events_receive``)
    or ``rejected`` (with ``errors``, each ``{"loc", "msg"}``). ``recorded``: for an accepted
    event, the ``CallEvent`` rows it was stored as (one; one per call of a turn), each with
    its ``call`` (and the call's ``contract``) as the event left it."""

    status: str
    errors: list[dict] = field(default_factory=list)
    recorded: tuple[CallEvent, ...] = ()


ACCEPTED = Outcome(status="accepted")
DUPLICATE = Outcome(status="duplicate")


class Rejected(Exception):
    def __init__(self, loc: str, msg: str):
        self.loc, self.msg = loc, msg
        super().__init__(msg)


@dataclass
class _Prepared:
    """A proposal normalised and keyed before the calls are loaded: its operation ID, the
    digest of its canonical arguments without the volatile ones (``digest``, empty when they
    do not parse) and the key that counts identical proposals in the request (``loop_key``)."""

    proposal: Any
    operation_id: str
    digest: str
    loop_key: str
    item: Any = None  # the provider's call object
    executed_by: str = "client"
    result: Any = None  # providers.ProviderResult of a provider-executed call
    duplicate_call_id: bool = False
    in_flight: bool = False


#: Event types that record a human decision: an agent's key may report them only with
#: ``ApiKey.can_decide`` (an agent runtime with its own approval UI); ``events_receive``
#: refuses them otherwise.
DECISION_TYPES = frozenset({"decision", "approval_expired"})

#: Namespace of the event IDs of a turn's second and later calls (``turn_event_ids``).
TURN_NAMESPACE = uuid.UUID("5f1b7c2e-3d0a-4c55-9e61-7a2b8c9d0e1f")


def turn_event_ids(event_id: uuid.UUID | str, count: int) -> list[uuid.UUID]:
    """The ``CallEvent`` IDs of a turn's ``count`` calls: the turn's own event ID for the
    first, a UUIDv5 of it and the call's index for each later one (stable, so a re-sent turn
    is recognised and ``GET /api/v1/events/{event_id}`` finds them all)."""
    first = uuid.UUID(str(event_id))
    return [first] + [uuid.uuid5(TURN_NAMESPACE, f"{first}/{index}") for index in range(1, count)]


def _no_contract_view(name: str) -> cls.Contract:
    """What classification assumes of a tool without a contract (an unknown tool run anyway,
    a provider-executed tool): a read, the no-contract re-ask budget."""
    return cls.Contract(
        name=name or "the tool",
        parameters={},
        max_reasks=cls.NO_CONTRACT_REASKS,
        registered=False,
    )


class _TurnPart:
    """One call of a turn seen as its own proposal: the turn's envelope with the call's own
    event ID (``turn_event_ids``)."""

    type = "proposed"
    operation_id = None
    call_id = None

    def __init__(self, turn: TurnEvent, event_id: uuid.UUID):
        self.event_id, self.format, self.occurred_at = event_id, turn.format, turn.occurred_at
        self.request_id, self.conversation_id = turn.request_id, turn.conversation_id
        self.trace_id, self.actor = turn.trace_id, turn.actor


#: Width of the stored tool-name columns: a longer (unknown) name is kept truncated.
TOOL_NAME_LENGTH = ToolCall._meta.get_field("tool_name").max_length


@dataclass(frozen=True, slots=True)
class _Step:
    """What an event handler of ``_Batch`` decided. ``result`` None: the event may not
    settle the call (an agent's word where only an operator's counts), recorded as
    information. ``settles`` False: recorded with its verdict, the call keeps its state.
    ``body``/``kind``: what is stored, when not the event itself."""

    result: cls.Verdict | None
    settles: bool = True
    body: dict | None = None
    kind: str | None = None
    #: an agent's attempt while the write's outcome is unknown (``_Batch._blind_retry``)
    blind_retry: bool = False


def _name(call: ToolCall) -> str:
    return call.tool_name or "the tool"


def _current(call: ToolCall, *, route: Route | None = None) -> cls.Verdict:
    """The call's verdict as it stands (its reason, route, or ``route``, and observation)."""
    return cls.Verdict(
        reason=Reason(call.reason) if call.reason else None,
        route=route or Route(call.route or Route.PROCEED),
        observation=call.observation,
    )


@dataclass(frozen=True, slots=True)
class KnownTools:
    """A project's latest contract per tool name (``contracts``), those an agent may call
    (``tools``: its registered ones, or all when it registered none) and their classifier
    views (``views``), as of the project's ``config_version``. Shared: never mutate."""

    version: int
    contracts: dict[str, ToolContract]
    tools: dict[str, ToolContract]
    views: dict[str, cls.Contract]


#: (project ID, agent ID) → KnownTools; the least recently used goes past this many.
TOOLS_CACHE_SIZE = 1024
_tools_cache: OrderedDict[tuple[int, int], KnownTools] = OrderedDict()
_tools_cache_lock = threading.Lock()


def tools_for(project: Project, agent: Agent) -> KnownTools:
    """The contracts ``agent`` may call, from this process's cache while ``project``'s
    ``config_version`` (read with the project: by the key's authentication for an API
    request, per chunk by a drain) is the one they were loaded at; else two queries. The
    stamp is bumped by ``callgate.signals`` on every change of a contract or an agent's
    registered tools, so no process keeps answering from an old contract."""
    key = (project.pk, agent.pk)
    with _tools_cache_lock:
        known = _tools_cache.get(key)
        if known is not None and known.version == project.config_version:
            _tools_cache.move_to_end(key)
            return known
    contracts: dict[str, ToolContract] = {}
    for contract in ToolContract.objects.filter(project=project).order_by("name", "-version"):
        contracts.setdefault(contract.name, contract)
    registered = set(AgentTool.objects.filter(agent=agent).values_list("name", flat=True))
    tools = (
        {name: c for name, c in contracts.items() if name in registered}
        if registered
        else contracts
    )
    known = KnownTools(
        version=project.config_version,
        contracts=contracts,
        tools=tools,
        views={name: contract_view(c) for name, c in tools.items()},
    )
    with _tools_cache_lock:
        _tools_cache[key] = known
        _tools_cache.move_to_end(key)
        while len(_tools_cache) > TOOLS_CACHE_SIZE:
            _tools_cache.popitem(last=False)
    return known


def tools_cache_forget(project_id: int) -> None:
    """Drop this process's cached contracts of the project (``callgate.signals``, on a
    change made here: a caller holding a project loaded before it still sees the change)."""
    with _tools_cache_lock:
        for key in [key for key in _tools_cache if key[0] == project_id]:
            del _tools_cache[key]


def _budget_key(request_id: str | None, tool: str | None) -> tuple[str, str] | None:
    """The re-ask budget's key, ``(request ID, tool name as stored)``, when both are given."""
    return (request_id, tool[:TOOL_NAME_LENGTH]) if request_id and tool else None


class _Batch:
    def __init__(
        self, *, project: Project, agent: Agent, source: str, user=None, may_decide: bool = False
    ):
        self.project, self.agent, self.source, self.user = project, agent, source, user
        self.may_decide = may_decide
        self.now = timezone.now()
        self.calls: dict[str, ToolCall] = {}
        self.by_call_id: dict[tuple[str, str], ToolCall] = {}
        self.new_calls: list[ToolCall] = []
        self.new_ids: set[str] = set()
        self.changed: set[str] = set()
        self.events: list[tuple[ToolCall, CallEvent]] = []
        self.budget_rows: dict[tuple[str, str], RequestBudget] = {}
        self.budgets_changed: set[tuple[str, str]] = set()
        self.to_review: dict[str, str] = {}  # operation_id -> kind
        self.to_settle: dict[str, str] = {}  # operation_id -> note
        self.to_reconcile: set[str] = set()
        self.blind_retries: list[tuple[str, dict]] = []  # (operation_id, what the retry was)
        self.prepared: dict[int, list[_Prepared]] = {}
        self.turn_errors: dict[int, TurnError] = {}  # id(event) -> why its envelope is refused

    # loading: a fixed number of queries ------------------------------------------------

    def load(self, events: list[Any], *, deduplicated: bool = False) -> set[str]:
        """Load what applying ``events`` reads (contracts, calls, re-ask budgets); returns the
        event IDs stored before, unless ``deduplicated`` (nothing to look up)."""
        seen = (
            set()
            if deduplicated
            else set(
                str(e)
                for e in CallEvent.objects.filter(
                    project=self.project, event_id__in=[e.event_id for e in events]
                ).values_list("event_id", flat=True)
            )
        )
        known = tools_for(self.project, self.agent)
        self.contracts, self.tools, self.tool_views = known.contracts, known.tools, known.views

        op_ids, pairs, budget_keys = set(), set(), set()
        for index, event in enumerate(events):
            if isinstance(event, ProposedEvent | TurnEvent):
                prepared = self._prepare_all(event)
                self.prepared[index] = prepared
                for each in prepared:
                    op_ids.add(each.operation_id)
                    if key := _budget_key(event.request_id, each.proposal.tool):
                        budget_keys.add(key)
            elif event.operation_id:
                op_ids.add(event.operation_id)
            elif event.request_id and event.call_id:
                pairs.add((event.request_id, event.call_id))
        # One query: calls named by operation ID, or by (request ID, call ID); the pairs are
        # matched by two lists and re-checked here (a cross product is harmless). In creation
        # order: a call ID reused within a turn names its first call.
        if op_ids or pairs:
            for call in _calls_locked(self.project, op_ids, pairs):
                if (
                    call.operation_id in op_ids
                    or call.proposed_operation_id in op_ids
                    or (call.request_id, call.call_id) in pairs
                ):
                    self._remember(call)
                    if call.request_id and call.tool_name:
                        budget_keys.add((call.request_id, call.tool_name))
        if budget_keys:  # pairs re-checked here (SQLite matches two IN lists: a cross product)
            for budget in _budgets(self.project, budget_keys):
                if (budget.request_id, budget.tool_name) in budget_keys:
                    self.budget_rows[(budget.request_id, budget.tool_name)] = budget
        return seen

    def _remember(self, call: ToolCall) -> None:
        """Key ``call`` by its operation ID and by the one it was proposed under before an
        operator's edit renamed it (``services.call_arguments_edit``): that ID keeps naming
        it. A call's own ID wins over another's proposed one."""
        self.calls[call.operation_id] = call
        if call.proposed_operation_id:
            self.calls.setdefault(call.proposed_operation_id, call)
        if call.request_id and call.call_id:
            self.by_call_id.setdefault((call.request_id, call.call_id), call)

    def _prepare_all(self, event: ProposedEvent | TurnEvent) -> list[_Prepared]:
        """The event's calls, prepared: one for a proposal, one per tool call of a turn
        (with the turn-level findings; the k-th identical call gets the k-th operation ID)."""
        if isinstance(event, ProposedEvent):
            return [self._prepare(event, normalise(event.format, event.call), item=event.call)]
        try:
            calls = split_turn(event.format, event.response)
        except TurnError as exc:
            self.turn_errors[id(event)] = exc
            return []
        prepared: list[_Prepared] = []
        seen_ids: set[str] = set()
        identical: dict[tuple[str | None, str], int] = {}
        for turn_call in calls:
            proposal = turn_call.proposal
            first = self._prepare(event, proposal, item=turn_call.item)
            key = (proposal.tool, first.loop_key)
            identical[key] = ordinal = identical.get(key, 0) + 1
            each = (
                first
                if ordinal == 1
                else self._prepare(event, proposal, item=turn_call.item, ordinal=ordinal)
            )
            each.executed_by, each.result = turn_call.executed_by, turn_call.result
            each.in_flight = ordinal > 1 and proposal.tool is not None
            if proposal.call_id:
                each.duplicate_call_id = proposal.call_id in seen_ids
                seen_ids.add(proposal.call_id)
            prepared.append(each)
        return prepared

    def _prepare(
        self, event: ProposedEvent | TurnEvent, proposal: Any, *, item: Any, ordinal: int = 1
    ) -> _Prepared:
        contract = self.tools.get(proposal.tool or "")
        volatile = contract.volatile_arguments if contract else ()
        canonical = (
            canonical_arguments(proposal.arguments, volatile) if proposal.arguments_ok else None
        )
        digest = hashlib.sha256(canonical).hexdigest() if canonical is not None else ""
        raw = (
            None if canonical is not None else (proposal.raw_arguments or repr(proposal.arguments))
        )
        loop_key = digest or hashlib.sha256((raw or "").encode(errors="replace")).hexdigest()
        if event.operation_id and isinstance(event, ProposedEvent):
            operation_id = event.operation_id
        elif event.request_id and proposal.tool:
            operation_id = derive_operation_id(
                request_id=event.request_id,
                tool=proposal.tool,
                canonical=canonical,
                raw_arguments=raw,
                ordinal=ordinal,
            )
        else:
            operation_id = f"op_{uuid.uuid4().hex}"
        return _Prepared(
            proposal=proposal,
            operation_id=operation_id,
            digest=digest,
            loop_key=loop_key,
            item=item,
        )

    # applying: in memory --------------------------------------------------------------

    def apply(self, index: int, event: Any) -> None:
        """Apply one event in memory: a proposal or a turn creates or answers calls, any
        other event moves the call it names (``_call_event``)."""
        if isinstance(event, ProposedEvent):
            [prepared] = self.prepared[index]
            self._proposed(event, prepared, body=self._proposal_body(event.format, prepared))
        elif isinstance(event, TurnEvent):
            self._turn(event, self.prepared[index])
        else:
            self._call_event(event)

    def _turn(self, event: TurnEvent, prepared: list[_Prepared]) -> None:
        """One call per tool call of the response, in order, each with its own event
        (``turn_event_ids``); provider-executed calls are recorded with their result."""
        if id(event) in self.turn_errors:
            error = self.turn_errors[id(event)]
            raise Rejected(error.loc, error.msg)
        if not prepared:
            raise Rejected("response", "holds no tool call; there is nothing to record")
        if event.operation_id:
            raise Rejected(
                "operation_id", "the calls of a turn get their own operation IDs; leave it out"
            )
        ids = turn_event_ids(event.event_id, len(prepared))
        for index, each in enumerate(prepared):
            body = self._proposal_body(event.format, each)
            body["turn"] = {"event_id": str(event.event_id), "index": index, "calls": len(prepared)}
            body["executed_by"] = each.executed_by
            part = _TurnPart(event, ids[index])
            if each.executed_by == "provider":
                self._provider_call(part, each, body=body)
            else:
                self._proposed(part, each, body=body, turn=True)

    def _call_event(self, event: Any) -> ToolCall:
        """Move the call ``event`` names through the one transition table: check that the
        call's state allows the event, let the handler for its type (``_ON``) classify it
        and update the call's own fields, then set the state that follows from the verdict
        (``lifecycle.next_state``) and record the event."""
        call = self._find(event)
        state_before = call.state
        lifecycle.check(call.state, event.type, decision=getattr(event, "decision", None))
        step = self._ON[event.type](self, call, event)
        if step.result is None:
            return self._information(call, event, state_before)
        if step.settles:
            new_state = lifecycle.next_state(
                call.state, event.type, step.result, executed=call.attempts > 0
            )
            self._set(call, step.result, new_state)
        return self._record(
            call,
            event,
            step.result,
            state_before,
            change=step.settles,
            body=step.body,
            kind=step.kind,
            blind_retry=step.blind_retry,
        )

    # one handler per event type: classify, update the call's own fields, say the step

    def _on_attempt(self, call: ToolCall, event: AttemptEvent) -> _Step:
        contract = call.contract
        attempts = max(call.attempts + 1, event.attempt or 0)
        attempt = cls.Attempt(
            sent=event.sent,
            outcome=event.outcome,
            http_status=event.http_status,
            error=event.error,
            result=event.result,
            result_count=event.result_count,
            result_format=event.result_format,
            jsonrpc_error=event.jsonrpc_error.model_dump() if event.jsonrpc_error else None,
        )
        if self.source == CallEvent.Source.AGENT and _outcome_unknown(call):
            call.attempts = attempts
            return self._blind_retry(call, event)
        view = contract_view(contract) if contract else _no_contract_view(_name(call))
        result = cls.classify_attempt(
            attempt,
            contract=view,
            attempts_used=attempts,
            deadline_passed=bool(call.deadline and event.occurred_at > call.deadline),
            tool_names=self.tools,
            gate_passed=call.state != S.REJECTED,
        )
        call.attempts = attempts
        if call.state == S.SUCCEEDED:  # a late or out-of-order attempt: recorded, changes nothing
            return _Step(result, settles=False)
        result = self._spend_reask(call, result, view)
        if result.route == Route.PROCEED:
            call.receipt = redact(event.result, contract.sensitive_fields if contract else ())
            call.receipt_at = self.now
        return _Step(result)

    def _blind_retry(self, call: ToolCall, event: AttemptEvent) -> _Step:
        """An agent's new attempt of a write whose outcome is still unknown (TAXONOMY:
        never retried blindly): the attempt is recorded and counted, its result kept on the
        event for the operator (``blind_retry``), and the call goes to (or stays in) review
        with its reason; its review item is flagged and audited
        (``escalation.review_items_note_retries``), never closed by it. The agent is told
        not to call again: an operator decides."""
        result = cls.Verdict(
            reason=Reason(call.reason),
            route=Route.REVIEW,
            observation=(
                f"The earlier outcome of {_name(call)} is unknown and an operator is reviewing it; "
                "this new attempt was recorded for them (the write may have run twice). Do not "
                "call it again: wait for the operator's decision."
            ),
        )
        self.blind_retries.append(
            (
                call.operation_id,
                {
                    "event_id": str(event.event_id),
                    "attempt": call.attempts,
                    "outcome": event.outcome,
                    "sent": event.sent,
                    "state_before": call.state,
                },
            )
        )
        return _Step(result, blind_retry=True)

    def _on_reconciled(self, call: ToolCall, event: ReconciledEvent) -> _Step:
        contract = call.contract
        if contract is None:
            raise Rejected(
                "type", "this call was refused at the gate; there is nothing to reconcile"
            )
        if not self._may_settle(contract):
            return _Step(None)
        current = _current(call)
        result = cls.classify_reconciled(
            found=event.found,
            matches=event.matches,
            contract=contract_view(contract),
            attempts_used=call.attempts,
            deadline_passed=bool(call.deadline and self.now > call.deadline),
            current=current,
        )
        if (
            result is current
            or call.state == S.SUCCEEDED
            or (call.state == S.FAILED and result.reason != Reason.RECONCILED_APPLIED)
        ):  # the failure's own reason stands (``classify_reconciled``): recorded, kept
            return _Step(result, settles=False)
        if result.reason == Reason.RECONCILED_APPLIED:
            if event.receipt is not None:
                call.receipt = event.receipt
            else:
                call.receipt = call.receipt or {"reconciled": True}
            call.receipt_at = self.now
        return _Step(result)

    def _on_reconcile_failed(self, call: ToolCall, event: ReconcileFailedEvent) -> _Step:
        """The look-up could not tell: a call still ``reconciling`` goes to review with its
        reason kept; one already in review (an operator's "reconcile now") keeps its state and
        gets the event, so the item page shows the result. Stored as a ``reconciled`` event
        with ``found`` null."""
        kept = _current(call, route=Route.REVIEW)
        body = {"type": "reconciled", "found": None, "detail": event.detail}
        return _Step(
            kept, settles=call.state == S.RECONCILING, body=body, kind=CallEvent.Kind.RECONCILED
        )

    def _on_receipt(self, call: ToolCall, event: ReceiptEvent) -> _Step:
        if not self._may_settle(call.contract):
            return _Step(None)
        result = cls.classify_receipt(contract_name=_name(call))
        if call.state == S.SUCCEEDED:
            return _Step(result, settles=False)
        call.receipt, call.receipt_at = event.result, self.now
        return _Step(result)

    def _on_denied(self, call: ToolCall, event: DeniedEvent) -> _Step:
        return _Step(cls.classify_denied(contract_name=_name(call)))

    def _on_decision(self, call: ToolCall, event: DecisionEvent) -> _Step:
        contract = call.contract
        result = cls.classify_decision(
            decision=event.decision,
            reason=event.reason,
            contract_name=_name(call),
            current=Reason(call.reason) if call.reason else None,
            idempotent=bool(contract and contract.idempotent),
        )
        call.decision, call.decision_reason = event.decision, event.reason
        call.decided_at, call.decided_by = self.now, self.user
        if event.decision == "mark_applied":
            call.receipt = call.receipt or {"marked_applied": True}
            call.receipt_at = self.now
        return _Step(result)

    def _on_approval_expired(self, call: ToolCall, event: ApprovalExpiredEvent) -> _Step:
        return _Step(cls.classify_approval_expired(contract_name=_name(call)))

    def _on_deadline_passed(self, call: ToolCall, event: DeadlinePassedEvent) -> _Step:
        body = {
            "type": "deadline_passed",
            "deadline": call.deadline.isoformat() if call.deadline else None,
        }
        return _Step(cls.classify_deadline_passed(contract_name=_name(call)), body=body)

    _ON: ClassVar[dict[str, Callable[[_Batch, ToolCall, Any], _Step]]] = {
        "attempt": _on_attempt,
        "reconciled": _on_reconciled,
        "reconcile_failed": _on_reconcile_failed,
        "receipt": _on_receipt,
        "denied": _on_denied,
        "decision": _on_decision,
        "approval_expired": _on_approval_expired,
        "deadline_passed": _on_deadline_passed,
    }

    def _may_settle(self, contract: ToolContract | None) -> bool:
        """Whether this batch's ``reconciled`` or ``receipt`` event may settle a call: from
        an operator or callgate's reconciler, from a key with ``can_decide``, or from the agent
        when its contract makes the agent the reconciler (``reconcile_method`` agent). An
        agent's word on a contract callgate reconciles itself, or that cannot be reconciled,
        is information for the operator (issue 16: an agent cannot close a review)."""
        return (
            self.source != CallEvent.Source.AGENT
            or self.may_decide
            or (
                contract is not None
                and contract.reconcile_method == ToolContract.ReconcileMethod.AGENT
            )
        )

    def _information(self, call: ToolCall, event: Any, state_before: str) -> ToolCall:
        """Record an agent's report that may not settle the call: the call keeps its state,
        reason and review item; the event says ``information_only`` (DESIGN: trust)."""
        return self._record(
            call, event, _current(call), state_before, change=False, information=True
        )

    def _find(self, event: Any) -> ToolCall:
        call = self._lookup(event)
        if self.source == CallEvent.Source.AGENT and call.agent_id != self.agent.pk:
            # another agent's call: answered as if it did not exist (no existence oracle)
            raise Rejected(
                "operation_id" if event.operation_id else "call_id",
                "no call with this "
                + ("operation_id" if event.operation_id else "call_id")
                + " for this agent",
            )
        return call

    def _lookup(self, event: Any) -> ToolCall:
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

    def _proposed(
        self, event: Any, prepared: _Prepared, *, body: dict, turn: bool = False
    ) -> ToolCall:
        """A proposed call (alone, or one call of a turn): classified at the gate with what
        the request knows (identical proposals, sticky refusals) and the turn's findings. A
        refusal (``REFUSALS``) of an existing call is recorded on its own event and leaves
        the call as it was."""
        proposal = prepared.proposal
        call = self.calls.get(prepared.operation_id)
        if (
            call is not None
            and self.source == CallEvent.Source.AGENT
            and call.agent_id != self.agent.pk
        ):
            # another agent's call: never classified against, changed or answered with (its
            # receipt, its observation); the ID is refused as naming no call of this agent
            raise Rejected(
                "operation_id",
                "no call with this operation_id for this agent"
                if event.operation_id
                else "another agent's call has the operation ID derived from this request, "
                "tool and arguments: send an operation_id of your own",
            )
        digest = prepared.digest
        # a proposal under the ID an operator's edit renamed: the proposal the operator
        # edited is this call as edited (never its pre-edit arguments again)
        renamed = call is not None and call.operation_id != prepared.operation_id
        if call is not None and renamed and digest == call.proposed_arguments_digest != "":
            digest = call.arguments_digest
        state_before = call.state if call else None
        lifecycle.check(state_before, "proposed")
        contract = self.tools.get(proposal.tool or "")
        request_id = event.request_id
        budget_key = _budget_key(request_id, proposal.tool)
        identical = self._count_proposal(budget_key, prepared.loop_key) if contract else 1
        context = cls.Context(
            identical=identical,
            sticky=self._sticky(budget_key, prepared.loop_key),
            duplicate_call_id=prepared.duplicate_call_id,
            in_flight=prepared.in_flight,
        )
        if (
            call is not None
            and call.arguments_digest == digest
            and identical <= (contract.max_identical if contract else identical)
            and context.sticky is None
            and (
                call.state in (S.RECONCILING, S.IN_REVIEW, S.PENDING_APPROVAL)
                or (call.state == S.ALLOWED and call.reason == Reason.APPROVAL_GRANTED)
            )
        ):
            # Already being handled (outcome unknown, a human decides, approved and about to
            # run): answer where it stands. Never a second execution while the first's
            # outcome is unknown.
            current = _current(call)
            return self._record(call, event, current, state_before, change=False, body=body)
        existing = None
        # a call refused at the gate for its arguments may be corrected under its operation ID
        if call is not None and not (call.state == S.REJECTED and call.reason in REASK_REASONS):
            existing = cls.Existing(
                arguments_digest=call.arguments_digest, has_receipt=call.state == S.SUCCEEDED
            )
        result = cls.classify_proposal(
            proposal,
            tools=self.tool_views,
            existing=existing,
            arguments_digest=digest,
            reasks_used=self._reasks_used(budget_key),
            context=context,
        )
        if budget_key and result.reason in REASK_REASONS:
            self._budget(budget_key).reasks_used += 1
        if call is not None and result.reason in REFUSALS:
            if result.reason == Reason.DUPLICATE_SUPPRESSED:
                call.duplicates_suppressed += 1
                self.changed.add(call.operation_id)
            return self._record(call, event, result, state_before, change=False, body=body)
        if call is None:
            call = ToolCall(
                project=self.project,
                agent=self.agent,
                operation_id=prepared.operation_id,
                request_id=request_id or "",
                conversation_id=event.conversation_id or "",
                trace_id=event.trace_id or "",
                call_id=(None if turn else event.call_id) or proposal.call_id or "",
                actor=event.actor or "",
                provider_format=event.format,
                tool_name=(proposal.tool or "")[:TOOL_NAME_LENGTH],
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
        elif call.state in (S.REJECTED, S.FAILED) and proposal.arguments_ok and not renamed:
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
        return self._record(call, event, result, state_before, body=body)

    def _provider_call(self, event: Any, prepared: _Prepared, *, body: dict) -> ToolCall:
        """A call the model's provider executed itself (TAXONOMY v2): never gated, classified
        from its result block like an attempt (a missing result is ``unavailable``)."""
        proposal, found = prepared.proposal, prepared.result
        name = proposal.tool or "the tool"
        call = self.calls.get(prepared.operation_id)
        if call is not None:  # the same turn sent again: recorded, changes nothing
            current = _current(call)
            return self._record(call, event, current, call.state, change=False, body=body)
        view = _no_contract_view(name)
        attempt = cls.Attempt(
            sent=found.sent,
            outcome=found.outcome,
            http_status=found.http_status,
            error=found.error,
            result=found.result,
            result_format=found.result_format,
        )
        result = cls.classify_attempt(
            attempt, contract=view, attempts_used=1, deadline_passed=False
        )
        call = ToolCall(
            project=self.project,
            agent=self.agent,
            operation_id=prepared.operation_id,
            request_id=event.request_id or "",
            conversation_id=event.conversation_id or "",
            trace_id=event.trace_id or "",
            call_id=proposal.call_id or "",
            actor=event.actor or "",
            provider_format=event.format,
            executed_by="provider",
            tool_name=name[:128],
            arguments=redact(proposal.arguments, ()) if proposal.arguments_ok else None,
            arguments_digest=prepared.digest,
            created_at=self.now,
            state=S.ALLOWED,
            attempts=1,
        )
        result = self._spend_reask(call, result, view)
        if result.route == Route.PROCEED:
            call.receipt, call.receipt_at = redact(found.result, ()), self.now
        self.new_calls.append(call)
        self.new_ids.add(call.operation_id)
        self._remember(call)
        self._set(call, result, lifecycle.next_state(None, "attempt", result, executed=True))
        return self._record(call, event, result, None, body=body)

    def _proposal_body(self, format: str, prepared: _Prepared) -> dict:
        """The stored body of a proposal: the provider's call with its arguments redacted."""
        proposal = prepared.proposal
        contract = self.tools.get(proposal.tool or "")
        sensitive = contract.sensitive_fields if contract else ()
        body = {"format": format, "call": redact(prepared.item, sensitive)}
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

    # what the request knows: re-asks, identical proposals, sticky refusals -----------------

    def _budget(self, key: tuple[str, str]) -> RequestBudget:
        """The request's row for a tool (created in memory when new), marked to be saved."""
        row = self.budget_rows.get(key)
        if row is None:
            row = self.budget_rows[key] = RequestBudget(
                project=self.project, request_id=key[0], tool_name=key[1], proposals={}, refusals={}
            )
        self.budgets_changed.add(key)
        return row

    def _count_proposal(self, key: tuple[str, str] | None, loop_key: str) -> int:
        """Count one more proposal of these canonical arguments; how many there were, this
        one included (``max_identical``; without a request ID, 1)."""
        if key is None:
            return 1
        row = self._budget(key)
        row.proposals[loop_key] = count = row.proposals.get(loop_key, 0) + 1
        return count

    def _sticky(self, key: tuple[str, str] | None, loop_key: str) -> cls.Verdict | None:
        row = self.budget_rows.get(key) if key else None
        refusal = row.refusals.get(loop_key) if row is not None else None
        if not refusal:
            return None
        return cls.verdict(Reason(refusal["reason"]), refusal["observation"])

    def _spend_reask(self, call: ToolCall, result: cls.Verdict, view: cls.Contract) -> cls.Verdict:
        """An execution outcome routed ``reask`` spends one re-ask of its request and tool;
        ``reask_exhausted`` once they are spent (TAXONOMY v2 "Precedence")."""
        if result.route != Route.REASK or not call.request_id or not call.tool_name:
            return result
        key = (call.request_id, call.tool_name)
        result = cls.spend_reask(
            result, name=view.name, max_reasks=view.max_reasks, reasks_used=self._reasks_used(key)
        )
        if result.reason in REASK_REASONS:
            self._budget(key).reasks_used += 1
        return result

    def _reasks_used(self, key: tuple[str, str] | None) -> int:
        row = self.budget_rows.get(key) if key else None
        return row.reasks_used if row else 0

    def _set(self, call: ToolCall, result: cls.Verdict, new_state: str) -> None:
        previous_state = call.state
        call.state = new_state
        call.reason = result.reason.value if result.reason else ""
        call.category = result.category.value if result.category else ""
        call.route = result.route.value
        call.observation = result.observation
        call.updated_at = self.now
        if result.reason in STICKY_REASONS and call.request_id and call.tool_name:
            refusal = {"reason": call.reason, "observation": call.observation}
            loop_key = call.arguments_digest
            if loop_key:
                self._budget((call.request_id, call.tool_name)).refusals[loop_key] = refusal
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
        kind: str | None = None,
        information: bool = False,
        blind_retry: bool = False,
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
            if isinstance(event, AttemptEvent):  # classified whole above, stored cut
                body = cut_texts(body)
        if information:
            body["information_only"] = True
        if blind_retry:
            body["blind_retry"] = True
        VERDICTS.labels(result.reason.value if result.reason else "", result.route.value).inc()
        cause = result.cause
        self.events.append(
            (
                call,
                CallEvent(
                    project=self.project,
                    event_id=event.event_id,
                    kind=kind or event.type,
                    source=self.source,
                    body=body,
                    occurred_at=event.occurred_at,
                    received_at=self.now,
                    reason=result.reason.value if result.reason else "",
                    category=result.category.value if result.category else "",
                    route=result.route.value,
                    observation=result.observation,
                    cause=cause.said[:300] if cause else "",
                    failed_items=[i.as_dict() for i in cause.failed_items[:100]] or None
                    if cause
                    else None,
                    state_before=state_before or "",
                    state_after=call.state,
                ),
            )
        )
        return call

    # saving: bulk operations ------------------------------------------------------------

    def save(self) -> None:
        new_ids = self.new_ids
        for call, row in self.events:
            row.call = call
        batch_write(
            new_calls=self.new_calls,
            changed_calls=[self.calls[op] for op in self.changed if op not in new_ids],
            events=[row for _, row in self.events],
            budgets=[self.budget_rows[key] for key in self.budgets_changed],
            touched=[self.calls[op] for op in self.changed | new_ids],
        )
        if self.to_settle:
            escalation.review_items_settle_bulk(
                calls=[self.calls[op] for op in self.to_settle],
                note_by_call={self.calls[op].pk: n for op, n in self.to_settle.items()},
            )
        if self.to_review:
            escalation.review_items_open_bulk(
                calls=[(self.calls[op], kind) for op, kind in self.to_review.items()]
            )
        if self.blind_retries:
            escalation.review_items_note_retries(
                retries=[(self.calls[op], detail) for op, detail in self.blind_retries]
            )
        if self.to_reconcile:
            for op in self.to_reconcile:
                enqueue_on_commit("callgate.tasks.reconcile_call", self.calls[op].pk)


#: The reasons of a call whose last write's outcome is unknown (TAXONOMY category
#: ``unknown_outcome``): while its call is reconciling or in review, the agent's next attempt
#: is a blind retry.
UNKNOWN_OUTCOME_REASONS = frozenset(
    reason.value for reason in Reason if category_of(reason) == Category.UNKNOWN_OUTCOME
)


def _outcome_unknown(call: ToolCall) -> bool:
    """Whether the call waits on an unknown outcome (reconciling, or in review with its
    reason kept after a look-up that could not tell): no operator approved a retry."""
    return call.state in (S.RECONCILING, S.IN_REVIEW) and call.reason in UNKNOWN_OUTCOME_REASONS


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


def bound_cursor():
    """A cursor for the ingest hot path's hand-written SQL. PostgreSQL: psycopg 3's own
    ``Cursor``, which sends parameters apart from the SQL text (server-side binding) and
    prepares a statement once it has run ``prepare_threshold`` times on the connection
    (settings: ``DATABASE_PREPARE_THRESHOLD``, 5; its generic plan is then reused, never
    replanned for the values: ``plan_cache_mode=force_generic_plan``), inside Django's
    wrapper (its execute wrappers see it as any query; its query log, when on, shows the text
    with the parameters apart). Django's default cursor quotes parameters into the text,
    which costs about 4 of 45 µs per event for the inbox insert (the batch's JSON document
    is one ~200 kB parameter) and a parse and plan per statement: preparing took the gate's
    five statements from 2.8 to 1.5 ms. Elsewhere: Django's cursor."""
    if connection.vendor != "postgresql":
        return connection.cursor()
    connection.ensure_connection()
    cursor = psycopg.Cursor(connection.connection)
    return (
        _BoundDebugCursor(cursor, connection)
        if connection.queries_logged
        else connection.make_cursor(cursor)
    )


class _BoundDebugCursor(CursorDebugWrapper):
    """Django's query log for ``bound_cursor``: the statement's text as sent (psycopg keeps
    no text of a prepared statement's run for Django's usual log line, which would be None)."""

    def execute(self, sql, params=None):
        with self.debug_sql(sql, params):
            return self._execute_with_wrappers(sql, params, many=False, executor=self._execute)


def _calls_locked(
    project: Project, op_ids: set[str], pairs: set[tuple[str, str]]
) -> list[ToolCall]:
    """The project's calls whose operation ID, or the one they were proposed under before an
    operator's edit renamed them (``proposed_operation_id``), is in ``op_ids``, or whose
    (request ID, call ID) is one of ``pairs``, with their contract, locked ``FOR UPDATE``,
    in ``id`` order.

    PostgreSQL: one statement whose text never changes, sent through ``bound_cursor`` (so it
    is prepared), rows made into models without the ORM's compiler (about 0.4 ms of the
    gate's time each check). The lists are joined as ``unnest`` of arrays, never tested with
    ``= ANY(array)``: a prepared statement's generic plan, on statistics that think the
    project small, filtered the project's calls with a linear search of the array per row
    (40 ms for a batch of 500 in a 10,000-call project; a join is linear whatever the plan).
    The proposed IDs are a branch of their own that says ``proposed_operation_id <> ''``,
    so it reads the partial index ``toolcall_proposed_operation``. Elsewhere: the ORM."""
    if connection.vendor != "postgresql":
        query = Q(operation_id__in=op_ids) | Q(proposed_operation_id__in=op_ids - {""})
        if pairs:
            query |= Q(request_id__in={r for r, _ in pairs}, call_id__in={c for _, c in pairs})
        return list(
            ToolCall.objects.select_for_update(of=("self",))
            .select_related("contract")
            .filter(query, project=project)
            .order_by("pk")
        )
    by_pair = sorted(pairs)
    with bound_cursor() as cursor:
        cursor.execute(
            _CALLS_LOCKED,
            [
                sorted(op_ids),
                project.pk,
                sorted(op_ids),
                project.pk,
                [r for r, _ in by_pair],
                [c for _, c in by_pair],
                project.pk,
            ],
        )
        rows = cursor.fetchall()
    width = len(ToolCall._meta.concrete_fields)
    calls = models_from_rows(ToolCall, [row[:width] for row in rows])
    contracts = models_from_rows(ToolContract, [row[width:] for row in rows])
    contract_field = ToolCall._meta.get_field("contract")
    for call, contract in zip(calls, contracts, strict=True):
        contract_field.set_cached_value(call, contract if contract.pk is not None else None)
    return calls


def _budgets(project: Project, keys: set[tuple[str, str]]) -> list[RequestBudget]:
    """The project's re-ask budgets of ``keys``, ``(request ID, tool name)`` pairs.
    PostgreSQL: as ``_calls_locked`` (pairs joined as ``unnest`` of two arrays); elsewhere
    two IN lists (an OR per pair is too deep for SQLite), a cross product the caller
    re-checks."""
    if connection.vendor != "postgresql":
        return list(
            RequestBudget.objects.filter(
                project=project,
                request_id__in={r for r, _ in keys},
                tool_name__in={t for _, t in keys},
            )
        )
    by_key = sorted(keys)
    with bound_cursor() as cursor:
        cursor.execute(_BUDGETS, [[r for r, _ in by_key], [t for _, t in by_key], project.pk])
        return models_from_rows(RequestBudget, cursor.fetchall())


def _select_list(model: type[models.Model], alias: str) -> str:
    return ", ".join(f'{alias}."{f.column}"' for f in model._meta.concrete_fields)


#: ``RefusalRollup``'s cell key columns, in ``refusal_counts``' order.
_REFUSAL_KEY = tally_key_columns(RefusalRollup)
_CALLS_LOCKED = (
    f"SELECT {_select_list(ToolCall, 'c')}, {_select_list(ToolContract, 'k')} "
    f'FROM "{ToolCall._meta.db_table}" c LEFT JOIN "{ToolContract._meta.db_table}" k '
    'ON k."id" = c."contract_id" WHERE c."id" IN ('
    f'SELECT n."id" FROM "{ToolCall._meta.db_table}" n '
    'JOIN unnest(%s::text[]) AS o(operation_id) ON n."operation_id" = o.operation_id '
    'WHERE n."project_id" = %s '
    "UNION "
    f'SELECT n."id" FROM "{ToolCall._meta.db_table}" n '
    'JOIN unnest(%s::text[]) AS o(operation_id) ON n."proposed_operation_id" = o.operation_id '
    """WHERE n."project_id" = %s AND n."proposed_operation_id" <> '' """
    "UNION "
    f'SELECT n."id" FROM "{ToolCall._meta.db_table}" n '
    "JOIN unnest(%s::text[], %s::text[]) AS p(request_id, call_id) "
    'ON n."request_id" = p.request_id AND n."call_id" = p.call_id '
    'WHERE n."project_id" = %s) '
    'ORDER BY c."id" FOR UPDATE OF c'
)
_BUDGETS = (
    f"SELECT {_select_list(RequestBudget, 'b')} "
    f'FROM "{RequestBudget._meta.db_table}" b '
    "JOIN unnest(%s::text[], %s::text[]) AS k(request_id, tool_name) "
    'ON b."request_id" = k.request_id AND b."tool_name" = k.tool_name '
    'WHERE b."project_id" = %s'
)


def models_from_rows(model: type[M], rows: list[tuple]) -> list[M]:
    """Instances of ``model`` from rows holding every concrete field's column, in the
    model's field order (``SELECT`` lists built from ``_meta.concrete_fields``), as the ORM
    makes them: each field's database converters (JSON decoded), then ``Model.from_db``."""
    names, converters = _row_converters(model)
    out = []
    for row in rows:
        values = list(row)
        for index, column, convert in converters:
            values[index] = convert(values[index], column, connection)
        out.append(model.from_db(connection.alias, names, values))
    return out


@functools.cache
def _row_converters(model: type[models.Model]) -> tuple[list[str], list[tuple[int, Any, Any]]]:
    fields = model._meta.concrete_fields
    return [f.attname for f in fields], [
        (index, f.cached_col, convert)
        for index, f in enumerate(fields)
        for convert in f.get_db_converters(connection)
    ]


def batch_write(
    *,
    new_calls: list[ToolCall],
    changed_calls: list[ToolCall],
    events: list[CallEvent],
    budgets: list[RequestBudget],
    touched: list[ToolCall],
) -> None:
    """Write what a batch applied: insert ``new_calls`` (their ``pk`` set), write
    ``CALL_FIELDS`` of ``changed_calls`` (rows that exist), insert ``events`` (each with its
    ``call``; their ``pk`` set) and add the refused proposals among them to their
    ``RefusalRollup`` cells (``tallies.refusal_counts``), upsert the re-ask ``budgets`` and
    mark the rollup buckets of ``touched`` (``buckets_touch``).

    PostgreSQL: one statement whatever the batch, data-modifying CTEs over one JSON document
    per table read back by ``jsonb_populate_recordset`` into the table's row type (``_records``;
    the statement's text and the cost of building it stay fixed: Django's ``bulk_update``
    builds a ``CASE WHEN`` per column and row, measured at 90% of the apply path's time in the
    SDK's flow; and the gate pays one round trip instead of five).
    The events of new calls find their call's ID through the calls' ``RETURNING``; the
    foreign keys are checked at the end of the statement. Elsewhere (SQLite, the embedded
    default): the ORM's bulk operations."""
    if connection.vendor != "postgresql":
        if new_calls:
            ToolCall.objects.bulk_create(new_calls)
        if changed_calls:
            ToolCall.objects.bulk_update(changed_calls, CALL_FIELDS)
        if events:
            CallEvent.objects.bulk_create(events)
        if budgets:
            RequestBudget.objects.bulk_create(
                budgets,
                update_conflicts=True,
                unique_fields=["project", "request_id", "tool_name"],
                update_fields=["reasks_used", "proposals", "refusals"],
            )
        buckets_touch(touched)
        tally_add(RefusalRollup, "proposals", refusal_counts(events))
        return
    parts: list[str] = []
    params: list[Any] = []
    call_table, event_table = ToolCall._meta.db_table, CallEvent._meta.db_table
    if new_calls:
        columns = _column_list(_insert_fields(ToolCall))
        parts.append(
            f'new_calls AS (INSERT INTO "{call_table}" ({columns}) SELECT {columns} '
            f'FROM jsonb_populate_recordset(NULL::"{call_table}", %s::jsonb) '
            'RETURNING "id", "operation_id")'
        )
        params.append(_records(new_calls, _insert_fields(ToolCall), add=True))
    if changed_calls:
        fields = [cast(Field, ToolCall._meta.pk)] + [
            cast(Field, ToolCall._meta.get_field(name)) for name in CALL_FIELDS
        ]
        assignments = ", ".join(f'"{f.column}" = v."{f.column}"' for f in fields[1:])
        parts.append(
            f'changed_calls AS (UPDATE "{call_table}" SET {assignments} '
            f'FROM jsonb_populate_recordset(NULL::"{call_table}", %s::jsonb) AS v '
            f'WHERE "{call_table}"."id" = v."id")'
        )
        params.append(_records(changed_calls, fields))
    if events:
        fields = _insert_fields(CallEvent)
        columns = _column_list(fields)
        values = ", ".join(
            ('COALESCE(v."call_id", new_calls."id")' if new_calls else 'v."call_id"')
            if f.attname == "call_id"
            else f'v."{f.column}"'
            for f in fields
        )
        # the events of a new call name it by operation ID (its ID comes back above); in the
        # batch's order, which their IDs keep (a call's timeline is in ID order)
        join = (
            " LEFT JOIN new_calls ON new_calls.\"operation_id\" = e.row ->> 'operation_id'"
            if new_calls
            else ""
        )
        parts.append(
            f'new_events AS (INSERT INTO "{event_table}" ({columns}) SELECT {values} '
            f"FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS e(row, n) "
            f'CROSS JOIN LATERAL jsonb_populate_record(NULL::"{event_table}", e.row) AS v{join} '
            'ORDER BY e.n RETURNING "id", "event_id")'
        )
        params.append(
            _records(
                events,
                fields,
                add=True,
                extra=lambda event: {
                    "call_id": event.call.pk,
                    "operation_id": event.call.operation_id,
                },
            )
        )
    if budgets:
        budget_table = RequestBudget._meta.db_table
        columns = _column_list(_insert_fields(RequestBudget))
        parts.append(
            f'budgets AS (INSERT INTO "{budget_table}" ({columns}) SELECT {columns} '
            f'FROM jsonb_populate_recordset(NULL::"{budget_table}", %s::jsonb) '
            'ON CONFLICT ("project_id", "request_id", "tool_name") DO UPDATE SET '
            '"reasks_used" = EXCLUDED."reasks_used", "proposals" = EXCLUDED."proposals", '
            '"refusals" = EXCLUDED."refusals")'
        )
        params.append(_records(budgets, _insert_fields(RequestBudget)))
    if refused := sorted(refusal_counts(events).items()):
        # added to in key order (two batches lock shared cells in the same order), under the
        # project's shared tally lock (a rebuild of its cells holds it exclusively)
        [project_id] = {cell[0] for cell, _ in refused}  # a batch is one project's
        table = RefusalRollup._meta.db_table
        key = ", ".join(f'"{c}"' for c in _REFUSAL_KEY)
        parts.append(
            f'refusals AS (INSERT INTO "{table}" ({key}, "proposals") SELECT u.* '
            "FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::bigint[], %s::text[], "
            f'%s::timestamptz[], %s::text[], %s::integer[]) AS u({key}, "proposals") '
            "CROSS JOIN (SELECT pg_advisory_xact_lock_shared(%s, %s)) AS lock "
            f'ON CONFLICT ({key}) DO UPDATE SET "proposals" = "{table}"."proposals" '
            '+ EXCLUDED."proposals")'
        )
        params += [[cell[i] for cell, _ in refused] for i in range(len(_REFUSAL_KEY))]
        params += [[n for _, n in refused], LOCK_CLASS[RefusalRollup], project_id]
    if buckets := sorted({(c.project_id, hour_floor(c.created_at)) for c in touched}):
        parts.append(
            f'buckets AS (INSERT INTO "{RollupDirtyBucket._meta.db_table}" '
            f'("project_id", "bucket", "touched_at") '
            f"SELECT b.project_id, b.bucket, now() FROM unnest(%s::bigint[], "
            f"%s::timestamptz[]) AS b(project_id, bucket) ON CONFLICT DO NOTHING)"
        )
        params += [[p for p, _ in buckets], [b for _, b in buckets]]
    if not parts:
        return
    answers = []
    if new_calls:
        answers.append('SELECT \'call\', "id", "operation_id"::text FROM new_calls')
    if events:
        answers.append('SELECT \'event\', "id", "event_id"::text FROM new_events')
    answer = " UNION ALL ".join(answers) if answers else "SELECT NULL, NULL, NULL"
    with bound_cursor() as cursor:
        cursor.execute(f"WITH {', '.join(parts)} {answer}", params)
        returned = cursor.fetchall()
    call_ids = {op: pk for kind, pk, op in returned if kind == "call"}
    event_ids = {event_id: pk for kind, pk, event_id in returned if kind == "event"}
    for call in new_calls:
        call.pk = call_ids[call.operation_id]
        call._state.adding, call._state.db = False, connection.alias
    for event in events:
        call = event.call
        event.pk = event_ids[str(event.event_id)]
        event.call = call  # its ID known now (setting call_id alone would drop the cached call)
        event._state.adding, event._state.db = False, connection.alias


def _insert_fields(model: type[models.Model]) -> list[Field]:
    """The columns an insert of ``model`` writes: every concrete field but the primary key
    and generated columns."""
    return [
        cast(Field, f)
        for f in model._meta.concrete_fields
        if not f.primary_key and not getattr(f, "generated", False)
    ]


def _column_list(fields: list[Field]) -> str:
    return ", ".join(f'"{f.column}"' for f in fields)


def _records(
    objs: list,
    fields: list[Field],
    *,
    add: bool = False,
    extra: Callable[[Any], dict] | None = None,
) -> Jsonb:
    """``objs`` as one JSON array of objects keyed by column (``fields``' values as the ORM
    saves them on PostgreSQL, in the text form ``jsonb_populate_record`` reads back into the
    column's type: times in ISO 8601, UUIDs as text, JSON columns' values as they are;
    ``pre_save`` for the timestamps of new rows when ``add``), each updated with ``extra(obj)``.
    One parameter per table, encoded by the C ``json`` module: dumping one typed array per
    column and row through psycopg cost about a third of the apply path's time."""
    plan = _record_plan(tuple(fields), add)
    rows = []
    for obj in objs:
        row = {}
        for column, attname, kind, f in plan:
            value = f.pre_save(obj, add=True) if kind == "now" else getattr(obj, attname)
            if value is not None and kind in ("time", "now"):
                value = value.isoformat()
            elif value is not None and kind == "uuid":
                value = str(value)
            row[column] = value
        if extra is not None:
            row.update(extra(obj))
        rows.append(row)
    return Jsonb(rows, dumps=_dumps)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@functools.cache
def _record_plan(fields: tuple[Field, ...], add: bool) -> list[tuple[str, str, str, Field]]:
    """Per field of ``_records``: column, attribute, how its value is written (``time``,
    ``now`` for an auto timestamp of a new row, ``uuid``, or ``as_is``) and the field."""
    plan = []
    for f in fields:
        kind = f.get_internal_type()
        how = (
            (
                "now"
                if add and (getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False))
                else "time"
            )
            if kind == "DateTimeField"
            else "uuid"
            if kind == "UUIDField"
            else "as_is"
        )
        plan.append((cast(str, f.column), f.attname, how, f))
    return plan


def events_apply(
    *,
    project: Project,
    agent: Agent,
    events: list[Any],
    source: str = CallEvent.Source.AGENT,
    user=None,
    may_decide: bool = False,
    deduplicated: bool = False,
    savepoint: bool = True,
) -> list[Outcome]:
    """Apply validated events (``callgate.schemas`` models) in order; one ``Outcome`` each.

    Events whose ``event_id`` was stored before (or repeats within the batch) are
    ``duplicate`` and change nothing; ``deduplicated``: the caller's inbox insert decided
    that already (its unique index on the event ID, rows kept until retention, as the
    events), so no query looks for them again. An event the rules refuse (unknown call, a transition
    the call's state does not allow) is ``rejected`` with ``errors`` naming the field; the
    others are stored. Runs in one transaction (a savepoint inside the caller's, unless
    ``savepoint`` is False: then the caller's transaction is the one to roll back and go
    again); retried once if a concurrent request created the same operation first. Each event's classification is stored on its
    ``CallEvent``; ``event_answer`` reads it back.

    An agent's events name only that agent's calls (another agent's call is answered as
    unknown). ``may_decide`` (the key's ``can_decide``) lets an agent's ``reconciled`` and
    ``receipt`` events settle calls whose contract the agent does not reconcile itself."""
    for attempt in range(2):
        try:
            with transaction.atomic(savepoint=savepoint):
                return _apply_once(
                    project=project,
                    agent=agent,
                    events=events,
                    source=source,
                    user=user,
                    may_decide=may_decide,
                    deduplicated=deduplicated,
                )
        except IntegrityError:
            if attempt == 1 or not savepoint:
                raise
    raise AssertionError("unreachable")


def _apply_once(*, project, agent, events, source, user, may_decide, deduplicated) -> list[Outcome]:
    batch = _Batch(project=project, agent=agent, source=source, user=user, may_decide=may_decide)
    seen = batch.load(events, deduplicated=deduplicated)
    outcomes: list[Outcome] = []
    for index, event in enumerate(events):
        key = str(event.event_id)
        if key in seen:
            outcomes.append(DUPLICATE)
            continue
        seen.add(key)
        mark = len(batch.events)
        try:
            batch.apply(index, event)
        except Rejected as exc:
            outcomes.append(Outcome(status="rejected", errors=[{"loc": exc.loc, "msg": exc.msg}]))
            continue
        except lifecycle.IllegalTransition as exc:
            outcomes.append(Outcome(status="rejected", errors=[{"loc": "type", "msg": str(exc)}]))
            continue
        outcomes.append(
            Outcome(status="accepted", recorded=tuple(row for _, row in batch.events[mark:]))
        )
    batch.save()
    return outcomes


# --- the inbox: receive now, apply in order -------------------------------------------------

#: Inbox rows applied per transaction (and per hold of the project's drain lock).
