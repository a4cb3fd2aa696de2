"""REST API v1 for agents: thin views that parse, call a service, and answer.

The ingest hot path validates with pydantic (``callgate.schemas``), never with DRF
serializers, and stores a batch in the inbox in a fixed number of queries; the events are
applied in order by ``callgate.tasks.drain_inbox`` (``callgate.ingest``).
Every error answers ``{"error": "…", "errors": [{"loc": "field.path", "msg": "…"}]}``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import uuid
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from pydantic import ValidationError
from redis.exceptions import RedisError
from rest_framework import exceptions, status
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.views import exception_handler as drf_exception_handler

from callgate import otlp, search, selectors, services
from callgate.auth import AgentPrincipal
from callgate.inbox import (
    DRAIN_LOCK_WAIT,
    EventRefused,
    event_answer,
    events_receive,
    inbox_over_limit,
)
from callgate.ingest import call_answer
from callgate.models import ToolCall
from callgate.schemas import (
    EVENT_ADAPTER,
    CallDetail,
    CallList,
    ContractIn,
    ContractOut,
    ErrorBody,
    EventsResponse,
    EventStatus,
    GateAnswer,
    GateRequest,
    error_list,
)
from callgate.selectors import CallFilters, Cursor
from callgate.tasks import drain_inbox_enqueue
from callgate.taxonomy import Category, Reason
from callgate.timeparse import RFC3339, parse_time
from callgate_sdk import providers
from callgate_sdk.wire import MAX_JSON_DEPTH, json_depth

MAX_BATCH_EVENTS = 1000
MAX_BATCH_BYTES = 5 * 1024 * 1024
#: Tool names as providers allow them (OpenAI: [a-zA-Z0-9_-]{1,64}; MCP adds dots and more).
TOOL_NAME_PATTERN = r"^[^\s\x00-\x1f\x7f]{1,128}$"
TOOL_NAME = re.compile(TOOL_NAME_PATTERN[1:-1])
HTTP_207_MULTI_STATUS = 207


#: Answers any API operation may give whatever its own: no key or a bad one, and the
#: throttles (per key, per project, failed keys per address), with ``Retry-After``.
EVERY_OPERATION_RESPONSES = {
    "401": "No valid API key: `Authorization: Bearer <key>`.",
    "429": "Too many requests (a throttle, or too many failed keys from this address); "
    "`Retry-After` says how many seconds to wait.",
}


def openapi_every_operation(result: dict, generator, request, public) -> dict:
    """drf-spectacular postprocessing hook (``SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]``):
    every operation documents the answers of ``EVERY_OPERATION_RESPONSES`` (the error
    shape, ``ErrorBody``), which authentication and throttling give before any view runs,
    unless it documents them itself (the OTLP receiver answers a ``google.rpc.Status``)."""
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    retry_after = {
        "Retry-After": {
            "description": "Seconds to wait before sending again.",
            "schema": {"type": "integer", "minimum": 1},
        }
    }
    for item in result.get("paths", {}).values():
        for operation in item.values():
            responses = operation.setdefault("responses", {})
            for code, description in EVERY_OPERATION_RESPONSES.items():
                if code not in responses:
                    responses[code] = {"description": description, "content": error}
                if code == "429" and "content" in responses[code]:
                    responses[code].setdefault("headers", retry_after)
    return result


logger = logging.getLogger(__name__)

#: seconds a client waits when the shared cache (Redis) cannot be reached
CACHE_DOWN_RETRY_AFTER = 5


def exception_handler(exc, context):
    """DRF's handler with callgate's error shape: ``{"error": "…", "errors": []}``. The shared
    cache (Redis: key stamps, throttles, failed-key counts) unreachable is a 503 with
    ``Retry-After`` (RFC 9110 §15.6.4): nothing was stored, send again."""
    if isinstance(exc, RedisError):
        logger.warning("the shared cache cannot be reached: %s", exc)
        response = _error(
            "callgate's shared cache cannot be reached; nothing was stored. Send again after "
            "Retry-After seconds.",
            code=status.HTTP_503_SERVICE_UNAVAILABLE,
        )
        response["Retry-After"] = str(CACHE_DOWN_RETRY_AFTER)
        return response
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


@csrf_exempt
def api_not_found(request: HttpRequest, path: str = "") -> JsonResponse:
    """Any path under ``/api/`` that names no endpoint, whatever the method: 404 in the API's
    error shape ``{"error": "…", "errors": [{"loc": "path", "msg": "…"}]}``, never the
    browser's HTML page (an integrator's client parses JSON). Unauthenticated on purpose:
    it reveals nothing beyond the public endpoint list at ``/api/docs/``. A known path with a
    wrong method is DRF's JSON 405 (``exception_handler``)."""
    return JsonResponse(
        {
            "error": f"No API endpoint at {request.path}; the endpoints are listed at /api/docs/.",
            "errors": [{"loc": "path", "msg": "no such endpoint"}],
        },
        status=status.HTTP_404_NOT_FOUND,
    )


class JsonErrorsMixin(APIView):
    """For a view whose answer is not JSON (the OpenAPI document's YAML, the docs page's
    HTML): its errors (a wrong method's 405 above all) answer in the API's JSON error shape
    like every other ``/api/`` path, not in the view's own format."""

    def handle_exception(self, exc: Exception) -> Response:
        response = super().handle_exception(exc)
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return response


class ApiSchemaApi(JsonErrorsMixin, SpectacularAPIView):
    """``GET /api/schema/``: the OpenAPI document (drf-spectacular), errors in JSON."""


class ApiDocsView(JsonErrorsMixin, SpectacularSwaggerSplitView):
    """``GET /api/docs/``: the browsable API page (Swagger UI), errors in JSON."""


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
    if json_depth(body) > MAX_JSON_DEPTH:
        raise exceptions.ParseError(f"The body is nested deeper than {MAX_JSON_DEPTH} levels.")
    return body


def _join_loc(prefix: str, path: str) -> str:
    """``events[3]`` + ``result[0].n`` → ``events[3].result[0].n``; ``(body)`` for the body itself."""
    if not prefix or not path or path.startswith("["):
        return prefix + path or "(body)"
    return f"{prefix}.{path}"


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
            "(`accepted`; `duplicate` for an `event_id` seen before with the same content, key order aside, which "
            "stores nothing new: re-sending is safe; `conflict` for an `event_id` seen before, or earlier in the "
            "batch, with other content, its `errors[].loc` naming `event_id`: nothing is stored, send that event "
            "with a new `event_id`; or `rejected` with field paths), "
            "so one bad item never sinks the batch. **Status 200** when no item was rejected or a conflict, "
            "**207 Multi-Status** when any was: treat 207 as a partial failure and fix those items; "
            "the others are stored. **409 Conflict** when the request is one event (an object, or an array of one) "
            "and it is a conflict: the error shape, `errors[0].loc` `event_id` (`events[0].event_id` for an "
            "array). An accepted event is stored durably and applied to its call shortly "
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
            409: ErrorBody,
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
        valid: list[tuple[int, Any]] = []
        results: list[dict[str, Any] | None] = []
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
        counts = {"accepted": 0, "duplicate": 0, "conflict": 0, "rejected": len(items) - len(valid)}
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
        if len(items) == 1 and counts["conflict"] and results[0]:  # the request is that event
            return _error(
                "This event_id was already used for an event with other content; send this "
                "event with a new event_id.",
                results[0]["errors"],
                code=status.HTTP_409_CONFLICT,
            )
        failed = counts["rejected"] or counts["conflict"]
        return Response(
            {
                "accepted": counts["accepted"],
                "duplicates": counts["duplicate"],
                "conflicts": counts["conflict"],
                "rejected": counts["rejected"],
                "results": results,
            },
            status=HTTP_207_MULTI_STATUS if failed else status.HTTP_200_OK,
        )


#: Items per page of ``GET /api/v1/calls``: the default and the most a client may ask for.
CALLS_LIST_DEFAULT = 100
CALLS_LIST_MAX = 500
#: The query parameters of ``GET /api/v1/calls`` that narrow the list (all exact matches,
#: except ``since``/``until``), with their enumerated values where they have them.
CALLS_LIST_CHOICES = {
    "category": Category.values,
    "reason": Reason.values,
    "state": ToolCall.State.values,
}
CALLS_LIST_TEXT = {
    "trace_id": "trace_id",
    "request_id": "request_id",
    "conversation_id": "conversation_id",
    "tool": "tool",
    "agent": "agent_name",
}
CALLS_LIST_PARAMETERS = [
    OpenApiParameter(
        "cursor",
        str,
        description="Opaque: the `next_cursor` of the previous page. Absent: the newest calls.",
    ),
    OpenApiParameter(
        "limit",
        int,
        description=f"Items per page, 1 to {CALLS_LIST_MAX} (default {CALLS_LIST_DEFAULT}).",
    ),
    OpenApiParameter("trace_id", str, description="The OpenTelemetry trace ID (32 hex)."),
    OpenApiParameter("request_id", str, description="The request ID the calls belong to."),
    OpenApiParameter("conversation_id", str, description="The conversation ID."),
    OpenApiParameter("tool", str, description="The tool's name."),
    OpenApiParameter("agent", str, description="The agent's name."),
    OpenApiParameter(
        "q",
        str,
        description=(
            "A search query, the language of the calls page's search box (`callgate.search`): "
            "terms separated by spaces, all of which must hold. `key:value` with the keys "
            "`tool`, `agent`, `reason`, `category`, `route`, `state`, `request`, `operation` "
            "(an operation ID or its prefix), `conversation`, `trace`; a bare word or "
            '`"quoted text"` matches an operation ID (or prefix), request ID, trace ID or '
            "conversation ID exactly, or a piece of the error text (case-insensitive); a "
            "leading `-` negates a term. Example: `tool:create_ticket -state:succeeded "
            '"ticket closed"`. A malformed query (unknown key, unclosed quote, bad value) '
            "is a 400 with `errors[0].loc` `q` and the term in its message. At most "
            f"{search.MAX_QUERY} characters and {search.MAX_TERMS} terms."
        ),
    ),
    *[
        OpenApiParameter(name, str, enum=list(values), description=f"The call's current {name}.")
        for name, values in CALLS_LIST_CHOICES.items()
    ],
    OpenApiParameter(
        "since",
        OpenApiTypes.DATETIME,
        description="RFC 3339 date-time: calls created at or after it.",
    ),
    OpenApiParameter(
        "until", OpenApiTypes.DATETIME, description="RFC 3339 date-time: calls created before it."
    ),
]


def _calls_list_query(params) -> tuple[CallFilters, Cursor | None, int, list[dict]]:
    """The filters, cursor and limit of ``GET /api/v1/calls``; a non-empty error list (each
    ``{"loc", "msg"}``, ``loc`` the parameter's name) when any parameter is bad or unknown."""
    errors: list[dict] = []
    values: dict = {}
    known = {"cursor", "limit", "since", "until", "q", *CALLS_LIST_CHOICES, *CALLS_LIST_TEXT}
    for name in sorted(set(params) - known):
        errors.append({"loc": name, "msg": f"unknown parameter; expected one of {sorted(known)}"})
    for name, allowed in CALLS_LIST_CHOICES.items():
        raw = params.get(name)
        if raw is not None and raw not in allowed:
            errors.append({"loc": name, "msg": f"must be one of {', '.join(allowed)}"})
        elif raw:
            values[name] = raw
    for name, field in CALLS_LIST_TEXT.items():
        raw = params.get(name)
        if raw is not None and not 0 < len(raw) <= 200:
            errors.append({"loc": name, "msg": "must be 1 to 200 characters"})
        elif raw:
            values[field] = raw
    for name in ("since", "until"):
        raw = params.get(name)
        if raw is None:
            continue
        # RFC 3339 only; a "+" of an offset that arrived unescaped (a space) is put back
        text = raw.replace(" ", "+") if "T" in raw.upper() else raw
        if not RFC3339.fullmatch(text):
            errors.append(
                {"loc": name, "msg": "must be an RFC 3339 date-time, e.g. 2026-06-15T09:00:00Z"}
            )
            continue
        try:
            values[name] = parse_time(raw)
        except ValueError as exc:
            errors.append({"loc": name, "msg": str(exc)})
    try:
        values["search"] = selectors.search_parse(params.get("q", ""))
    except search.QueryError as exc:
        errors.append({"loc": "q", "msg": f"term {exc.term!r}: {exc.message}"})
    raw_limit = params.get("limit", str(CALLS_LIST_DEFAULT))
    limit = int(raw_limit) if raw_limit.isascii() and raw_limit.isdigit() else 0
    if not 1 <= limit <= CALLS_LIST_MAX:
        errors.append({"loc": "limit", "msg": f"must be an integer from 1 to {CALLS_LIST_MAX}"})
    cursor = None
    if params.get("cursor") is not None:
        cursor = Cursor.decode(params["cursor"])
        if cursor is None:
            errors.append(
                {"loc": "cursor", "msg": "not a cursor of this API; pass next_cursor as it is"}
            )
    return CallFilters(**values), cursor, limit, errors


def call_detail(call: ToolCall) -> dict:
    """The ``CallDetail`` shape of ``GET /api/v1/calls/{operation_id}`` and of each item of
    ``GET /api/v1/calls`` (``call`` with its agent and contract loaded)."""
    return {
        **call_answer(call),
        "tool": call.tool_name,
        "contract_version": call.contract.version if call.contract else None,
        "agent": call.agent.name,
        "request_id": call.request_id or None,
        "conversation_id": call.conversation_id or None,
        "trace_id": call.trace_id or None,
        "call_id": call.call_id or None,
        "created_at": call.created_at,
        "updated_at": call.updated_at,
    }


class CallsApi(APIView):
    @extend_schema(
        operation_id="calls_list",
        summary="List the project's calls, newest first, with filters and cursor pagination",
        description=(
            "Keyset pagination on (created_at, id): pass `next_cursor` back as `cursor` for the next "
            "(older) page; pages stay stable while new calls arrive. Each item has the shape of "
            "`GET /api/v1/calls/{operation_id}`. Filters combine with AND; an unknown parameter or a "
            "bad value is a 400 whose `errors[].loc` names it. A key lists only its own agent's calls "
            "(as `GET /api/v1/calls/{operation_id}` reads only them): another agent's, by `agent` or "
            "not, are never listed. "
            "The same filters as the calls page (`/p/<project>/calls/`)."
        ),
        parameters=CALLS_LIST_PARAMETERS,
        responses={200: CallList, 400: ErrorBody, 401: ErrorBody},
    )
    def get(self, request: Request) -> Response:
        principal = _agent(request)
        filters, cursor, limit, errors = _calls_list_query(request.query_params)
        if errors:
            return _error(f"Invalid parameter {errors[0]['loc']}: {errors[0]['msg']}", errors)
        page = selectors.calls_page(
            project=principal.project,
            # the key's agent's calls alone (an `agent` name or search naming another: none)
            filters=dataclasses.replace(filters, agent=principal.agent.pk),
            before=cursor,
            size=limit,
            detail=True,
        )
        return Response(
            {"items": [call_detail(call) for call in page.rows], "next_cursor": page.older}
        )

    @extend_schema(
        operation_id="calls_check",
        summary="Check a proposed call before executing it (the gate)",
        description=(
            "Normalises the provider's call (OpenAI Chat Completions and Responses, Anthropic, Gemini, Bedrock "
            "Converse, Ollama, MCP, plain), "
            "validates it against the agent's tool contracts, applies duplicate and idempotency rules, records a "
            "`proposed` event and answers the operation ID to execute under, the verdict, the route and the "
            "observation text for the model. A duplicate of a succeeded operation answers `return_receipt` with the "
            "stored receipt. Unrecognisable output is `malformed_call`, never an error. "
            "With `turn` (a whole model response, TAXONOMY v2) instead of `call`, every call of the response is "
            'checked in one round trip and the answer is `{"calls": [CallAnswer, ...]}`, one per call, in order; '
            "calls the provider executed itself are recorded (`executed_by: provider`), never gated. A response "
            "holding several calls sent as `call` is a 400 naming `call`."
        ),
        request=GateRequest,
        responses={
            200: GateAnswer,
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
        turn = "turn" in gate.model_fields_set
        if turn and gate.operation_id:
            return _error(
                "Invalid gate request: operation_id: the calls of a turn get their own "
                "operation IDs; leave it out",
                [{"loc": "operation_id", "msg": "not allowed with turn"}],
            )
        # the same path as /events, then applied at once (after the events received before it)
        try:
            found = services.gate_check(project=principal.project, agent=principal.agent, gate=gate)
        except EventRefused as exc:
            if exc.kind == "invalid":
                return _error(f"Invalid gate request: {exc.errors[0]['msg']}", exc.errors)
            if exc.kind == "reused":  # a re-sent check finds its first answer; not another call
                return _error(
                    "This event_id was already used for another call or kind of event; send a "
                    "new one.",
                    exc.errors,
                    code=status.HTTP_409_CONFLICT,
                )
            if exc.kind == "busy":  # another drainer held the project's inbox too long
                return _too_busy(
                    "The project's inbox is busy applying earlier events; send this check again "
                    "(with the same event_id) after Retry-After seconds.",
                    retry_after=DRAIN_LOCK_WAIT,
                )
            code = (
                status.HTTP_500_INTERNAL_SERVER_ERROR  # callgate's bug, not the request's
                if exc.kind == "internal"
                else status.HTTP_400_BAD_REQUEST
                if turn
                else status.HTTP_409_CONFLICT
            )
            return _error(exc.errors[0]["msg"], exc.errors, code=code)
        if turn:
            return Response({"calls": found["calls"]})
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
            "does not allow). Poll with a short backoff while `pending`. Another agent's event answers "
            "404, as one never received."
        ),
        parameters=[
            OpenApiParameter(
                "event_id",
                OpenApiTypes.UUID,
                OpenApiParameter.PATH,
                description="The event's `event_id`, a UUID (anything else: 400 naming it).",
            )
        ],
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
        found = event_answer(principal.project, key, agent=principal.agent)
        if found is None:
            raise Http404
        return Response(found)


class CallDetailApi(APIView):
    @extend_schema(
        operation_id="calls_retrieve",
        summary="A call's state, reason, route, attempts, receipt and review decision",
        description="One of this key's agent's calls; another agent's call answers 404. A call "
        "an operator approved with edited arguments answers under the operation ID it was "
        "proposed under too; `operation_id` is then its new one and `decision.arguments` the "
        "arguments to execute.",
        responses={200: CallDetail, 401: ErrorBody, 404: ErrorBody},
    )
    def get(self, request: Request, operation_id: str) -> Response:
        principal = _agent(request)
        call = selectors.call_by_operation(
            calls=ToolCall.objects.select_related("agent", "contract").filter(
                project=principal.project, agent=principal.agent
            ),
            operation_id=operation_id,
        )
        if call is None:
            raise Http404
        return Response(call_detail(call))


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
        parameters=[
            OpenApiParameter(
                "name",
                {"type": "string", "pattern": TOOL_NAME_PATTERN},
                OpenApiParameter.PATH,
                description="The tool's name: 1 to 128 characters, no spaces or control "
                "characters (anything else: 400 naming `name`).",
            )
        ],
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


class InboxFull(Exception):
    """Raised inside the OTLP view when ``inbox_over_limit`` says to refuse for now;
    ``retry_after`` in seconds."""

    def __init__(self, retry_after: float):
        super().__init__(
            "This project has CALLGATE_INBOX_LIMIT or more events waiting to be applied; "
            "retry after the Retry-After delay."
        )
        self.retry_after = retry_after


class OtlpTracesApi(APIView):
    """``POST /api/otlp/v1/traces``: the OTLP/HTTP trace receiver (``callgate.otlp``).

    Errors answer a ``google.rpc.Status`` in the request's encoding, as OTLP/HTTP requires,
    not callgate's JSON error shape."""

    parser_classes: list = []  # the body is read as bytes and decoded by callgate.otlp

    @extend_schema(
        operation_id="otlp_traces_export",
        summary="Receive OpenTelemetry traces (OTLP/HTTP) and classify the tool calls in them",
        description=(
            "Point an OTLP/HTTP exporter here: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=<callgate>/api/otlp/v1/traces`, "
            "`OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer <key>`. The body is an `ExportTraceServiceRequest`, "
            "`application/x-protobuf` or `application/json` (OTLP/JSON), optionally `Content-Encoding: gzip`; "
            f"at most {otlp.MAX_BODY_BYTES // (1024 * 1024)} MB as sent, "
            f"{otlp.MAX_DECODED_BYTES // (1024 * 1024)} MB decompressed and {otlp.MAX_SPANS} spans. "
            "GenAI (`chat` spans' tool calls, `execute_tool` spans) and OpenInference (`LLM`, `TOOL` spans) "
            "spans become the same events as `POST /api/v1/events`; other spans are accepted and ignored. "
            "The answer is an `ExportTraceServiceResponse` in the request's encoding; `partial_success` counts "
            "the spans that could not be used and says why. Failures carry a `google.rpc.Status`: 400 "
            "undecodable, 401 no valid key, 413 too large, 415 another media type, 429 with `Retry-After` when "
            "the project's inbox is over its limit."
        ),
        request={
            otlp.PROTOBUF: {"type": "string", "format": "binary"},
            otlp.JSON: {"type": "object"},
        },
        responses={
            200: OpenApiResponse(description="ExportTraceServiceResponse"),
            400: OpenApiResponse(description="google.rpc.Status"),
            401: OpenApiResponse(description="google.rpc.Status"),
            413: OpenApiResponse(description="google.rpc.Status"),
            415: OpenApiResponse(description="google.rpc.Status"),
            429: OpenApiResponse(description="google.rpc.Status; see Retry-After"),
        },
    )
    def post(self, request: Request) -> HttpResponse:
        principal = _agent(request)
        if (wait := inbox_over_limit(principal.project)) is not None:
            raise InboxFull(wait)
        length = request.META.get("CONTENT_LENGTH")
        if length and length.isdigit() and int(length) > otlp.MAX_BODY_BYTES:
            raise otlp.OtlpError(413, otlp.too_large_message(otlp.MAX_BODY_BYTES))
        try:
            body = request.body
        except RequestDataTooBig:
            raise otlp.OtlpError(413, otlp.too_large_message(otlp.MAX_BODY_BYTES)) from None
        if len(body) > otlp.MAX_BODY_BYTES:
            raise otlp.OtlpError(413, otlp.too_large_message(otlp.MAX_BODY_BYTES))
        message = otlp.decode_request(
            body,
            content_type=request.content_type or "",
            content_encoding=request.headers.get("Content-Encoding", ""),
        )
        received = otlp.traces_receive(
            project=principal.project, agent=principal.agent, request=message
        )
        json_encoding = self._json(request)
        return HttpResponse(
            otlp.encode_response(
                json_encoding=json_encoding, rejected=received.rejected, message=received.message
            ),
            content_type=otlp.JSON if json_encoding else otlp.PROTOBUF,
        )

    @staticmethod
    def _json(request) -> bool:
        return otlp.media_type(request.META.get("CONTENT_TYPE", "")) == otlp.JSON

    # DRF's finalize_response takes any HttpResponseBase; the stubs say Response only
    def handle_exception(self, exc: Exception) -> HttpResponse:  # type: ignore[override]
        """Every failure as a ``google.rpc.Status`` in the request's encoding, keeping DRF's
        status and headers (``WWW-Authenticate`` on 401) and ``Retry-After`` on 429."""
        headers: dict[str, str] = {}
        if isinstance(exc, otlp.OtlpError):
            code, message = exc.status, exc.message
        elif isinstance(exc, InboxFull):
            code, message = 429, str(exc)
            headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
        else:
            response = super().handle_exception(exc)  # re-raises what is not an API error
            code, message = response.status_code, response.data.get("error", "")
            headers.update({k: v for k, v in response.items() if k in ("WWW-Authenticate",)})
        json_encoding = self._json(self.request)
        return HttpResponse(
            otlp.encode_status(json_encoding=json_encoding, http_status=code, message=message),
            status=code,
            content_type=otlp.JSON if json_encoding else otlp.PROTOBUF,
            headers=headers,
        )
