"""REST API v1 for agents: thin views that parse, call a service, and answer.

The ingest hot path validates with pydantic (``callgate.schemas``), never with DRF
serializers, and stores a batch in the inbox in a fixed number of queries; the events are
applied in order by ``callgate.tasks.drain_inbox`` (``callgate.ingest``).
Every error answers ``{"error": "…", "errors": [{"loc": "field.path", "msg": "…"}]}``.
"""

from __future__ import annotations

import math
import re
import uuid

from django.http import Http404
from drf_spectacular.utils import OpenApiExample, extend_schema
from pydantic import ValidationError
from rest_framework import exceptions, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.views import exception_handler as drf_exception_handler

from callgate import providers, services
from callgate.auth import AgentPrincipal
from callgate.inbox import (
    APPLY_FAILED,
    DRAIN_LOCK_WAIT,
    DrainBusy,
    event_answer,
    events_receive,
    inbox_drain,
    inbox_over_limit,
    proposal_reused,
)
from callgate.ingest import call_answer
from callgate.models import ToolCall
from callgate.schemas import (
    EVENT_ADAPTER,
    CallAnswer,
    CallDetail,
    ContractIn,
    ContractOut,
    ErrorBody,
    EventsResponse,
    EventStatus,
    GateRequest,
    ProposedEvent,
    error_list,
)
from callgate.tasks import drain_inbox_enqueue

MAX_BATCH_EVENTS = 1000
MAX_BATCH_BYTES = 5 * 1024 * 1024
#: Tool names as providers allow them (OpenAI: [a-zA-Z0-9_-]{1,64}; MCP adds dots and more).
TOOL_NAME = re.compile(r"[^\s\x00-\x1f\x7f]{1,128}")
#: Deeper JSON is refused at the door: every later step (redaction, canonical JSON,
#: schema validation) walks it recursively.
MAX_JSON_DEPTH = 64
HTTP_207_MULTI_STATUS = 207


def exception_handler(exc, context):
    """DRF's handler with callgate's error shape: ``{"error": "…", "errors": []}``."""
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    detail = response.data.get("detail") if isinstance(response.data, dict) else response.data
    if isinstance(detail, list):
        detail = "; ".join(str(d) for d in detail)
    response.data = {
        "error": str(detail) if detail is not None else str(response.data),
        "errors": [],
    }
    return response


def _error(
    message: str, errors: list[dict] | None = None, code: int = status.HTTP_400_BAD_REQUEST
) -> Response:
    return Response({"error": message, "errors": errors or []}, status=code)


def _too_busy(message: str, *, retry_after: float) -> Response:
    """429 with ``Retry-After`` (whole seconds, RFC 9110 §10.2.3) in the API's error shape."""
    seconds = max(1, math.ceil(retry_after))
    response = _error(
        message,
        [{"loc": "(project)", "msg": f"retry after {seconds} s"}],
        code=status.HTTP_429_TOO_MANY_REQUESTS,
    )
    response["Retry-After"] = str(seconds)
    return response


def _inbox_full(wait: float) -> Response:
    return _too_busy(
        "The project's inbox holds more events than callgate can apply in time; nothing was "
        "stored. Send again after Retry-After seconds.",
        retry_after=wait,
    )


def _agent(request: Request) -> AgentPrincipal:
    if not isinstance(request.user, AgentPrincipal):
        raise exceptions.NotAuthenticated(
            "This endpoint needs an agent's API key: 'Authorization: Bearer <key>'."
        )
    return request.user


def _json_body(request: Request, *, limit: int = MAX_BATCH_BYTES, too_large: list | None = None):
    """The parsed JSON body; raises a 413 past ``limit`` bytes and a 400 for non-JSON, and for
    a number too large to read unless a ``too_large`` list takes it (``providers.loads``)."""
    length = request.META.get("CONTENT_LENGTH")
    if length and length.isdigit() and int(length) > limit:
        raise PayloadTooLarge(limit)
    raw = request.body
    if len(raw) > limit:
        raise PayloadTooLarge(limit)
    try:
        # PostgreSQL's jsonb cannot hold U+0000 or unpaired surrogates: the event is kept,
        # with U+FFFD in their place
        body = providers.loads(raw, too_large=too_large)
    except (UnicodeDecodeError, ValueError) as exc:
        raise exceptions.ParseError(f"The body is not valid JSON: {exc}") from None
    except RecursionError:
        raise exceptions.ParseError(
            f"The body is nested deeper than {MAX_JSON_DEPTH} levels."
        ) from None
    if _depth(body) > MAX_JSON_DEPTH:
        raise exceptions.ParseError(f"The body is nested deeper than {MAX_JSON_DEPTH} levels.")
    return body


def _join_loc(prefix: str, path: str) -> str:
    """``events[3]`` + ``result[0].n`` → ``events[3].result[0].n``; ``(body)`` for the body itself."""
    if not prefix or not path or path.startswith("["):
        return prefix + path or "(body)"
    return f"{prefix}.{path}"


def _depth(value) -> int:
    """Nesting depth of a parsed JSON value: arrays and objects inside each other (a scalar
    is 0, ``[]`` is 1, ``[{}]`` is 2). Without recursion; leaves are never pushed."""
    if type(value) is not dict and type(value) is not list:
        return 0
    deepest, stack = 1, [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, level = pop()
        if level > deepest:
            deepest = level
        for child in node.values() if type(node) is dict else node:
            kind = type(child)
            if kind is dict or kind is list:
                push((child, level + 1))
    return deepest


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE

    def __init__(self, limit: int):
        super().__init__(
            f"The body is larger than the limit of {limit // (1024 * 1024)} MB "
            f"({limit} bytes); send at most {MAX_BATCH_EVENTS} events per batch."
        )


class EventsIngestApi(APIView):
    @extend_schema(
        operation_id="events_ingest",
        summary="Report tool-call events (one, or a batch of up to 1,000)",
        description=(
            "The body is one event object or a JSON array of events (at most 1,000 events and 5 MB; "
            "larger: 413). Each event is validated on its own: the answer lists a result per item "
            "(`accepted`, `duplicate` for an `event_id` seen before, or `rejected` with field paths), "
            "so one bad item never sinks the batch. **Status 200** when no item was rejected, "
            "**207 Multi-Status** when any was: treat 207 as a partial failure and fix the rejected items; "
            "the others are stored. An accepted event is stored durably and applied to its call shortly "
            "after, in arrival order: read its classification with `GET /api/v1/events/{event_id}` (or the "
            "call's with `GET /api/v1/calls/{operation_id}`). To ask before executing, use the gate "
            "`POST /api/v1/calls`, which answers at once. Event types and fields: see `shared/cases/README.md`."
        ),
        request={
            "application/json": {
                "oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}]
            }
        },
        responses={
            200: EventsResponse,
            207: EventsResponse,
            400: ErrorBody,
            401: ErrorBody,
            413: ErrorBody,
            429: ErrorBody,
        },
        examples=[
            OpenApiExample(
                "attempt",
                request_only=True,
                value={
                    "event_id": "0b6f3c2e-7f55-4b1e-9f3c-1f1e2d3c4b5a",
                    "occurred_at": "2026-06-15T09:00:00Z",
                    "type": "attempt",
                    "operation_id": "op_3f9c",
                    "sent": True,
                    "outcome": "timeout",
                    "http_status": None,
                    "error": "ReadTimeout",
                },
            )
        ],
    )
    def post(self, request: Request) -> Response:
        principal = _agent(request)
        if (wait := inbox_over_limit(principal.project)) is not None:
            return _inbox_full(wait)
        too_large: list = []  # numbers too large to read refuse their item, not the batch
        body = _json_body(request, too_large=too_large)
        items = body if isinstance(body, list) else [body]
        if isinstance(body, list) and len(body) > MAX_BATCH_EVENTS:
            return _error(
                f"The batch has {len(body)} events; the limit is {MAX_BATCH_EVENTS} per request.",
                code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            )
        if not items:
            return _error(
                "The batch is empty: send one event object or a non-empty array.", code=400
            )
        prefix = "events" if isinstance(body, list) else ""
        valid, results = [], []
        validate = EVENT_ADAPTER.validate_python
        for index, item in enumerate(items):
            unreadable = providers.too_large_path(item) if too_large else None
            if unreadable is None:
                try:
                    valid.append((index, validate(item)))
                    results.append(None)
                    continue
                except ValidationError as exc:
                    errors = error_list(exc, prefix=f"{prefix}[{index}]" if prefix else "")
            else:
                path, number = unreadable
                errors = [
                    {
                        "loc": _join_loc(f"{prefix}[{index}]" if prefix else "", path),
                        "msg": number.problem,
                    }
                ]
            event_id = item.get("event_id") if isinstance(item, dict) else None
            results.append(
                {
                    "index": index,
                    "event_id": event_id if isinstance(event_id, str) else None,
                    "status": "rejected",
                    "errors": errors,
                }
            )
        counts = {"accepted": 0, "duplicate": 0, "rejected": len(items) - len(valid)}
        if valid:
            outcomes = events_receive(
                project=principal.project,
                agent=principal.agent,
                events=[e for _, e in valid],
                may_decide=principal.api_key.can_decide,
            )
            for (index, event), outcome in zip(valid, outcomes, strict=True):
                counts[outcome.status] += 1
                errors = (
                    [
                        {
                            "loc": f"{prefix}[{index}].{e['loc']}" if prefix else e["loc"],
                            "msg": e["msg"],
                        }
                        for e in outcome.errors
                    ]
                    if outcome.errors
                    else []
                )
                results[index] = {
                    "index": index,
                    "event_id": str(event.event_id),
                    "status": outcome.status,
                    "errors": errors,
                }
            if counts["accepted"]:
                drain_inbox_enqueue(principal.project.pk)
        code = HTTP_207_MULTI_STATUS if counts["rejected"] else status.HTTP_200_OK
        return Response(
            {
                "accepted": counts["accepted"],
                "duplicates": counts["duplicate"],
                "rejected": counts["rejected"],
                "results": results,
            },
            status=code,
        )


class GateCheckApi(APIView):
    @extend_schema(
        operation_id="calls_check",
        summary="Check a proposed call before executing it (the gate)",
        description=(
            "Normalises the provider's call (OpenAI Chat Completions and Responses, Anthropic, Gemini, MCP, plain), "
            "validates it against the agent's tool contracts, applies duplicate and idempotency rules, records a "
            "`proposed` event and answers the operation ID to execute under, the verdict, the route and the "
            "observation text for the model. A duplicate of a succeeded operation answers `return_receipt` with the "
            "stored receipt. Unrecognisable output is `malformed_call`, never an error."
        ),
        request=GateRequest,
        responses={
            200: CallAnswer,
            400: ErrorBody,
            401: ErrorBody,
            409: ErrorBody,
            429: ErrorBody,
            500: ErrorBody,
        },
    )
    def post(self, request: Request) -> Response:
        principal = _agent(request)
        if (wait := inbox_over_limit(principal.project)) is not None:
            return _inbox_full(wait)
        body = _json_body(request, limit=1024 * 1024)
        try:
            gate = GateRequest.model_validate(body)
        except ValidationError as exc:
            errors = error_list(exc)
            return _error(f"Invalid gate request: {errors[0]['loc']}: {errors[0]['msg']}", errors)
        event = ProposedEvent(
            type="proposed",
            format=gate.format,
            call=gate.call,
            operation_id=gate.operation_id,
            request_id=gate.request_id,
            conversation_id=gate.conversation_id,
            trace_id=gate.trace_id,
            actor=gate.actor,
            **services.gate_envelope(gate),
        )
        # the same path as /events, then applied at once (after the events received before it)
        [received] = events_receive(
            project=principal.project, agent=principal.agent, events=[event]
        )
        if received.status == "rejected":
            return _error(f"Invalid gate request: {received.errors[0]['msg']}", received.errors)
        if received.status == "duplicate" and proposal_reused(principal.project, event):
            return _error(
                "This event_id was already used for another call; send a new one.",
                [{"loc": "event_id", "msg": "already used for another tool or other arguments"}],
                code=status.HTTP_409_CONFLICT,
            )
        try:
            inbox_drain(principal.project.pk)
        except DrainBusy:  # its own event stays pending: answered below
            pass
        found = event_answer(principal.project, event.event_id)
        if (
            found is None or found["kind"] != "proposed"
        ):  # a re-sent check finds its first answer; not another kind
            return _error(
                "This event_id was already used for another kind of event; send a new one.",
                [{"loc": "event_id", "msg": "already used"}],
                code=status.HTTP_409_CONFLICT,
            )
        if found["status"] == "pending":  # another drainer held the project's inbox too long
            return _too_busy(
                "The project's inbox is busy applying earlier events; send this check again "
                "(with the same event_id) after Retry-After seconds.",
                retry_after=DRAIN_LOCK_WAIT,
            )
        if found["status"] != "applied":
            failed = any(
                e["msg"] == APPLY_FAILED for e in found["errors"]
            )  # callgate's bug, not the request's
            return _error(
                found["errors"][0]["msg"],
                found["errors"],
                code=status.HTTP_500_INTERNAL_SERVER_ERROR if failed else status.HTTP_409_CONFLICT,
            )
        return Response(found["answer"])


class EventDetailApi(APIView):
    @extend_schema(
        operation_id="events_retrieve",
        summary="Where one reported event stands: pending, applied (with its classification) or rejected",
        description=(
            "`POST /api/v1/events` stores events and applies them shortly after, in arrival order. This answers "
            "`pending` until then; `applied` with the answer as this event left the call (reason, category, "
            "route, verdict, observation, state; attempts, receipt and decision are the call's now); or `rejected` with the "
            "errors when the rules refused it (an attempt for an unknown call, a transition the call's state "
            "does not allow). Poll with a short backoff while `pending`."
        ),
        responses={200: EventStatus, 400: ErrorBody, 401: ErrorBody, 404: ErrorBody},
    )
    def get(self, request: Request, event_id: str) -> Response:
        principal = _agent(request)
        try:
            key = uuid.UUID(event_id)
        except ValueError:
            return _error(
                "Invalid event_id: must be a UUID.", [{"loc": "event_id", "msg": "must be a UUID"}]
            )
        found = event_answer(principal.project, key)
        if found is None:
            raise Http404
        return Response(found)


class CallDetailApi(APIView):
    @extend_schema(
        operation_id="calls_retrieve",
        summary="A call's state, reason, route, attempts, receipt and review decision",
        description="One of this key's agent's calls; another agent's call answers 404.",
        responses={200: CallDetail, 401: ErrorBody, 404: ErrorBody},
    )
    def get(self, request: Request, operation_id: str) -> Response:
        principal = _agent(request)
        call = (
            ToolCall.objects.select_related("contract")
            .filter(project=principal.project, agent=principal.agent, operation_id=operation_id)
            .first()
        )
        if call is None:
            raise Http404
        return Response(
            {
                **call_answer(call),
                "tool": call.tool_name,
                "contract_version": call.contract.version if call.contract else None,
                "created_at": call.created_at,
                "updated_at": call.updated_at,
            }
        )


class ToolRegisterApi(APIView):
    @extend_schema(
        operation_id="tools_register",
        summary="Register (or re-register) a tool contract",
        description=(
            "Idempotent: the same contract again answers 200 with the current version; a changed contract "
            "creates the next version (201). Versions are never modified. `parameters` must be a valid JSON "
            "Schema (draft 2020-12) of an object within callgate's complexity budget; callgate treats undeclared "
            "properties as errors. The agent that created a tool owns it: another agent registering the "
            "identical contract gets to use it, a changed one from it answers 403 (a project admin publishes "
            "from the contract's page). The answer includes the contract linter's score and findings."
        ),
        request=ContractIn,
        responses={
            200: ContractOut,
            201: ContractOut,
            400: ErrorBody,
            401: ErrorBody,
            403: ErrorBody,
        },
    )
    def put(self, request: Request, name: str) -> Response:
        principal = _agent(request)
        if not TOOL_NAME.fullmatch(name):
            return _error(
                "Invalid tool name: 1 to 128 characters, no spaces or control characters.",
                [{"loc": "name", "msg": "1 to 128 printable characters without spaces"}],
            )
        body = _json_body(request, limit=1024 * 1024)
        try:
            payload = ContractIn.model_validate(body)
        except ValidationError as exc:
            errors = error_list(exc)
            return _error(f"Invalid contract: {errors[0]['loc']}: {errors[0]['msg']}", errors)
        try:
            contract, created = services.contract_register(
                agent=principal.agent, name=name, payload=payload
            )
        except services.ContractForbidden as exc:
            return _error(
                f"Not allowed: {exc.loc}: {exc.msg}",
                [{"loc": exc.loc, "msg": exc.msg}],
                code=status.HTTP_403_FORBIDDEN,
            )
        except services.ContractRejected as exc:
            return _error(
                f"Invalid contract: {exc.loc}: {exc.msg}", [{"loc": exc.loc, "msg": exc.msg}]
            )
        return Response(
            {
                "name": contract.name,
                "version": contract.version,
                "created": created,
                "lint": {"score": contract.lint_score, "findings": contract.lint_findings},
            },
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )
