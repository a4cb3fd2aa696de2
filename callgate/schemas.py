"""Wire-format payloads (pydantic v2): events, the gate request, contracts.

These are the shapes of ``shared/cases/README.md`` wrapped in the API envelope of
``DESIGN.md`` ("One wire format"). Models are strict (no silent coercion, unknown fields
rejected) except where JSON has no native type: ``event_id`` (UUID) and ``occurred_at``
(RFC 3339) are parsed from strings.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit
from uuid import UUID

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    RootModel,
    TypeAdapter,
    field_validator,
    model_validator,
)

from callgate.timeparse import RFC3339
from callgate_sdk.models import Verdict
from callgate_sdk.wire import pointer_problem

Id = Annotated[str, Field(min_length=1, max_length=200)]
Format = Literal[
    "openai", "openai_responses", "anthropic", "gemini", "bedrock", "ollama", "mcp", "plain"
]
TurnFormat = Literal["openai", "openai_responses", "anthropic", "gemini", "bedrock", "ollama"]
TURN_FORMATS: tuple[str, ...] = get_args(TurnFormat)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


def _rfc3339_text(value: Any) -> Any:
    # pydantic alone also takes Unix times, minutes without seconds, "+0100", "09:00:00,5"
    if not isinstance(value, datetime) and not (
        isinstance(value, str) and RFC3339.fullmatch(value)
    ):
        raise ValueError("must be an RFC 3339 string, e.g. 2026-06-15T09:00:00Z")
    return value


#: An RFC 3339 time with a UTC offset, parsed by pydantic (a ``datetime`` passes as it is).
Rfc3339 = Annotated[AwareDatetime, BeforeValidator(_rfc3339_text)]
#: How far in the future an event's time may lie (clock skew), and the earliest time accepted.
MAX_CLOCK_SKEW = timedelta(days=1)
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)


class Envelope(_Strict):
    """Fields every event carries: identity, time, and the correlation keys of its call.

    ``occurred_at`` is checked here for form (an RFC 3339 string with a UTC offset, after
    2000) and, when the event is received, for clock skew (``callgate.inbox.events_receive``:
    at most ``MAX_CLOCK_SKEW`` ahead, checked once per batch's clock reading)."""

    event_id: UUID = Field(
        strict=False, description="Client-generated UUID; a re-sent event is stored once."
    )
    occurred_at: Rfc3339 = Field(
        strict=False, gt=EARLIEST, description="RFC 3339 time the event happened at the agent."
    )
    operation_id: Id | None = None
    call_id: Id | None = Field(None, description="The provider's tool-call ID.")
    request_id: Id | None = None
    conversation_id: Id | None = None
    trace_id: Id | None = None
    actor: Id | None = Field(None, description="The end user the agent acts for.")


class ProposedEvent(Envelope):
    type: Literal["proposed"]
    format: Format
    call: Any = Field(description="The model's tool call exactly as its provider emits it.")


class JsonRpcError(_Strict):
    """A JSON-RPC 2.0 error object (JSON-RPC 2.0 §5.1), as an MCP server answers a
    ``tools/call`` it refuses or fails: ``code`` -32700…-32600 for the envelope, -32601 method
    not found, -32602 invalid params, -32603 internal error, -32000…-32099 server errors."""

    code: int = Field(ge=-(2**53), le=2**53)
    message: str = Field(description="Any length: classified whole, stored cut.")
    data: Any = None


class TurnEvent(Envelope):
    """A whole model response that may hold several tool calls (TAXONOMY v2, "Whole model
    turns"): split into one call per tool call, in order, each with its own operation ID."""

    type: Literal["turn"]
    format: TurnFormat
    response: Any = Field(description="The model's response exactly as its provider emits it.")


class AttemptEvent(Envelope):
    """One execution of a call. ``call_id`` (the envelope's) names the call of a turn that it
    executed. ``error``, a string ``result`` and ``jsonrpc_error.message`` may be of any length
    (within the request size limit): they are classified whole and stored cut."""

    type: Literal["attempt"]
    attempt: int | None = Field(None, ge=1, le=10_000)
    sent: bool | None = Field(
        description="Whether the request left the caller; null when it cannot tell."
    )
    outcome: Literal["success", "error", "timeout", "connection_reset", "circuit_open"]
    http_status: int | None = Field(None, ge=100, le=599)
    error: str | None = None
    result: Any = None
    result_count: int | None = Field(None, ge=0, le=2**53)
    result_format: Literal["mcp"] | None = None
    jsonrpc_error: JsonRpcError | None = Field(
        None, description="An MCP server's JSON-RPC error answer (with outcome: error)."
    )


class DeniedEvent(Envelope):
    type: Literal["denied"]
    reason: str = Field(max_length=2_000)


class ReconciledEvent(Envelope):
    type: Literal["reconciled"]
    found: bool
    matches: bool = False
    receipt: Any = None
    detail: dict | None = Field(
        None, description="What the look-up saw (HTTP status, differing fields)."
    )


class ReceiptEvent(Envelope):
    type: Literal["receipt"]
    result: Any = None


class DecisionEvent(Envelope):
    type: Literal["decision"]
    decision: Literal["approve", "reject", "approve_retry", "mark_applied", "mark_failed"]
    reason: str = Field("", max_length=2_000)


class ApprovalExpiredEvent(Envelope):
    type: Literal["approval_expired"]


# callgate's own events: applied by ``callgate.ingest.events_apply`` like any other, through
# the transition table, but never accepted from a client (they are not in ``Event``).


class ReconcileFailedEvent(Envelope):
    """callgate's reconciler could not tell whether the operation happened (after its
    retries). Stored as a ``reconciled`` event whose ``found`` is null; a call still
    ``reconciling`` goes to review with its reason kept."""

    type: Literal["reconcile_failed"]
    detail: dict = Field(description="What the look-up saw (error, HTTP status).")


class DeadlinePassedEvent(Envelope):
    """A call still waiting to retry when its retry deadline passed (the deadline sweep):
    ``retry_exhausted``, route review."""

    type: Literal["deadline_passed"]


Event = Annotated[
    ProposedEvent
    | TurnEvent
    | AttemptEvent
    | DeniedEvent
    | ReconciledEvent
    | ReceiptEvent
    | DecisionEvent
    | ApprovalExpiredEvent,
    Field(discriminator="type"),
]
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
EVENT_TYPES = frozenset(
    {
        "proposed",
        "turn",
        "attempt",
        "denied",
        "reconciled",
        "receipt",
        "decision",
        "approval_expired",
    }
)


class GateRequest(_Strict):
    """``POST /api/v1/calls``: a proposed call to check before executing it (``call``), or a
    whole model response whose calls are checked together (``turn``; TAXONOMY v2)."""

    format: Format
    call: Any = None
    turn: Any = Field(
        None, description="A whole model response (as in a turn event); answered {calls: [...]}"
    )
    operation_id: Id | None = None
    request_id: Id | None = None
    conversation_id: Id | None = None
    trace_id: Id | None = None
    actor: Id | None = None
    event_id: UUID | None = Field(None, strict=False)
    occurred_at: Rfc3339 | None = Field(
        None,
        strict=False,
        gt=EARLIEST,
        description="As for events; clock skew is checked on receipt.",
    )

    @model_validator(mode="after")
    def _call_or_turn(self) -> GateRequest:
        has_call, has_turn = "call" in self.model_fields_set, "turn" in self.model_fields_set
        if has_call == has_turn:
            raise ValueError("send either call (one tool call) or turn (a whole model response)")
        if has_turn and self.format not in TURN_FORMATS:
            raise ValueError(f"a turn's format must be one of {', '.join(TURN_FORMATS)}")
        return self


class RetryPolicy(_Strict):
    initial_interval: float = Field(1.0, gt=0, le=3600, description="seconds")
    backoff_coefficient: float = Field(2.0, ge=1, le=10)
    maximum_interval: float = Field(60.0, gt=0, le=86_400, description="seconds")
    deadline_seconds: int | None = Field(None, gt=0, le=30 * 86_400)


class ContractIn(_Strict):
    """``PUT /api/v1/tools/{name}``: one tool contract (the case files' contract shape)."""

    name: str | None = Field(
        None, max_length=128, description="Must equal the name in the URL when given."
    )
    version: str | None = Field(
        None, max_length=64, description="The agent's own label; callgate numbers versions."
    )
    description: str = Field("", max_length=5_000)
    effect: Literal["read", "write"] = "read"
    idempotent: bool = False
    reconcilable: bool = False
    reconcile_url: str | None = Field(None, max_length=500)
    max_attempts: int = Field(3, ge=1, le=100)
    max_reasks: int = Field(2, ge=0, le=100)
    requires_approval: bool = False
    approval_timeout_seconds: int = Field(15 * 60, ge=10, le=7 * 86_400)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    sensitive_fields: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list, max_length=100
    )
    parameters: dict
    # TAXONOMY v2
    volatile_arguments: list[Annotated[str, Field(max_length=500)]] = Field(
        default_factory=list,
        max_length=100,
        description="JSON Pointers (RFC 6901) to arguments left out of the operation ID and the "
        "duplicate checks (a client idempotency key, a nonce); still validated and stored.",
    )
    max_identical: int = Field(
        3, ge=1, le=1000, description="Identical proposals allowed per request (loop_detected)."
    )
    not_found_may_hide_forbidden: bool = False
    result_error_markers: bool = True

    @field_validator("volatile_arguments")
    @classmethod
    def _pointers(cls, value: list[str]) -> list[str]:
        for index, pointer in enumerate(value):
            if problem := pointer_problem(pointer):
                raise ValueError(f"[{index}] {problem}")
        return value

    @field_validator("reconcile_url")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        if "{operation_id}" not in value:
            raise ValueError("must contain the placeholder {operation_id}")
        parts = urlsplit(value)
        if "{" in parts.scheme + parts.netloc or not parts.netloc:
            raise ValueError(
                "the placeholder {operation_id} may only stand in the path or query, after the host"
            )
        return value


def error_list(exc, *, prefix: str = "") -> list[dict]:
    """pydantic errors as ``[{"loc": "events[3].occurred_at", "msg": "…"}]``."""
    out = []
    for err in exc.errors(include_url=False):
        loc = prefix
        parts = err["loc"]
        if parts and parts[0] in EVENT_TYPES:
            parts = parts[
                1:
            ]  # the event union's branch (the type), not a field; ("attempt", "attempt") is one
        for part in parts:
            if isinstance(part, int):
                loc += f"[{part}]"
            else:
                loc += f".{part}" if loc else str(part)
        out.append({"loc": loc or "(body)", "msg": err["msg"]})
    return out


# --- answers (documented in the OpenAPI document) -----------------------------------------


class Decision(BaseModel):
    decision: str
    reason: str
    decided_at: datetime | None
    arguments: dict | None = Field(
        None,
        description="The arguments the operator approved with edits: execute the call with "
        "these, not the proposed ones. A value shown as `•••` is a sensitive value callgate "
        "never stored: keep your own there. Null when the decision kept the proposed arguments.",
    )
    proposed_operation_id: str | None = Field(
        None,
        description="The operation ID the call was proposed under, when the edit changed its "
        "canonical arguments and so gave it a new one (`operation_id`; TAXONOMY v2: one "
        "operation ID names one set of arguments). Execute and report under `operation_id`.",
    )


class CallAnswer(BaseModel):
    """What the agent should do next with a call."""

    operation_id: str
    call_id: str | None = Field(None, description="The provider's tool-call ID, when it had one.")
    executed_by: Literal["client", "provider"] = Field(
        "client",
        description="provider: the model's provider ran the call itself (recorded, never gated).",
    )
    verdict: Verdict
    state: str
    reason: str | None = Field(
        description="Taxonomy reason; null while a call is allowed and nothing is known yet."
    )
    category: str | None
    route: str
    observation: str = Field(
        description="Plain text to hand back to the model (empty for proceed)."
    )
    receipt: Any = Field(description="The stored result of the operation, when it succeeded.")
    attempts: int
    max_attempts: int | None
    retry_after: float | None = Field(
        description="Suggested full-jitter backoff in seconds when the route is retry."
    )
    decision: Decision | None


class TurnAnswer(BaseModel):
    """The gate's answer to a whole model turn: one ``CallAnswer`` per call, in order."""

    calls: list[CallAnswer]


class GateAnswer(RootModel[CallAnswer | TurnAnswer]):
    """The gate's answer: a ``CallAnswer`` for one call, a ``TurnAnswer`` for a turn."""


class CallDetail(CallAnswer):
    tool: str
    contract_version: int | None
    agent: str = Field(description="The name of the agent whose key reported the call.")
    request_id: str | None
    conversation_id: str | None
    trace_id: str | None = Field(
        description="The OpenTelemetry trace ID (32 hex) of a call that arrived as spans."
    )
    call_id: str | None = Field(description="The provider's tool-call ID.")
    created_at: datetime
    updated_at: datetime


class CallList(BaseModel):
    """``GET /api/v1/calls``: a page of calls, newest first."""

    items: list[CallDetail]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next (older) page; null on the last page."
    )


class FieldError(BaseModel):
    loc: str = Field(description="JSON path of the offending field, e.g. events[3].occurred_at")
    msg: str


class ErrorBody(BaseModel):
    error: str
    errors: list[FieldError] = []


class EventResult(BaseModel):
    index: int
    event_id: str | None
    status: Literal["accepted", "duplicate", "conflict", "rejected"] = Field(
        description=(
            "accepted: stored, applied shortly in arrival order (read the outcome with GET /api/v1/events/{event_id}); "
            "duplicate: this event_id was received before with the same content (key order aside): nothing new is "
            "stored; conflict: this event_id was received before (or earlier in this batch) with other content: not "
            "stored, errors[].loc names event_id (send it with a new event_id); rejected: not stored, see errors."
        )
    )
    errors: list[FieldError] = []


class FailedItem(BaseModel):
    item: str = Field(description="How the result names the failed item: its ID, or 'index N'.")
    error: str = Field(description="Its error message, if the result gives one.")


class EventStatus(BaseModel):
    """Where one received event stands (``GET /api/v1/events/{event_id}``)."""

    event_id: str
    status: Literal["pending", "applied", "rejected", "quarantined"] = Field(
        description=(
            "pending: stored, not applied yet; applied: classified and recorded on its call (see answer); "
            "rejected: the rules refused it when it was applied (see errors), e.g. an attempt for an unknown call; "
            "quarantined: applying it stopped callgate's worker repeatedly; set aside for the operators."
        )
    )
    kind: str | None = Field(description="The event's type: proposed, attempt, denied, …")
    errors: list[FieldError] = []
    calls: list[CallAnswer] | None = Field(
        None, description="For a turn event: one answer per call of the turn, in order."
    )
    answer: CallAnswer | None = Field(
        description=(
            "For an applied event: the answer as this event left the call (reason, category, route, verdict, "
            "observation, state); attempts, receipt and decision are the call's now."
        )
    )
    cause: str | None = Field(
        None,
        description="For an attempt that failed: how its cause was read, e.g. 'JSON-RPC -32603 "
        "(internal error) with 'rate limit' in its message' (TAXONOMY v2).",
    )
    failed_items: list[FailedItem] | None = Field(
        None, description="For a partial failure: the failed items the result names."
    )


class EventsResponse(BaseModel):
    """200 when every item was accepted or a duplicate; 207 Multi-Status when any was rejected
    or a conflict (a partial failure: the other items are stored)."""

    accepted: int
    duplicates: int
    conflicts: int = Field(
        description="Items whose event_id was used before for other content (status conflict)."
    )
    rejected: int
    results: list[EventResult]


class LintFinding(BaseModel):
    path: str
    code: str
    message: str


class LintOut(BaseModel):
    score: int
    findings: list[LintFinding]


class ContractOut(BaseModel):
    name: str
    version: int
    created: bool
    lint: LintOut
