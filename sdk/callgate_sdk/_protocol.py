"""The client protocol, written once for the sync and the async client ("sans I/O").

Each step is a generator that yields what it needs done (``Http``, ``Sleep``, ``Execute``,
``Flush``) and receives the outcome (or has the exception thrown in at the ``yield``);
``CallgateClient`` performs the effects with ``httpx.Client`` and threads,
``AsyncCallgateClient`` with ``httpx.AsyncClient`` and ``asyncio``. So the seven steps of a
call, the routes, the backoff, the breaker and the buffering behave alike in both.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import random
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from callgate_sdk.buffer import EventBuffer
from callgate_sdk.errors import CallgateError, CallgateUnavailable, ToolFailure, failure_cause
from callgate_sdk.models import (
    WAITING_VERDICTS,
    CallAnswer,
    Effect,
    Format,
    Outcome,
    RetryPolicy,
    RunResult,
    RunStatus,
    ToolRegistration,
)
from callgate_sdk.providers import Proposal, normalise
from callgate_sdk.resilience import CircuitBreaker, backoff_delay
from callgate_sdk.wire import HiddenValueMoved, derive_operation_id, edited_arguments

logger = logging.getLogger("callgate_sdk")

T = TypeVar("T")
Steps = Generator[Any, Any, T]

#: answers the SDK treats as "callgate is unavailable": keep the events, try later.
_UNAVAILABLE_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
#: The longest ``Retry-After`` a gate check waits out before trying once more (seconds).
GATE_RETRY_AFTER_LIMIT = 30.0


def _retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds (RFC 9110 §10.2.3, the delay-seconds form), or None."""
    try:
        return max(0.0, float(response.headers.get("Retry-After", "")))
    except ValueError:
        return None


#: how long ``report_now`` stops trying callgate after it could not be reached (full jitter,
#: doubling per failure in a row): events go straight to the buffer meanwhile, and the
#: background flusher (or ``flush()``) tries again.
OFFLINE_BACKOFF = RetryPolicy(initial_interval=1.0, backoff_coefficient=2.0, maximum_interval=30.0)
_ENVELOPE_KEYS = frozenset(
    {"operation_id", "call_id", "request_id", "conversation_id", "trace_id", "actor"}
)


# --------------------------------------------------------------------------- effects


@dataclass(frozen=True)
class Http:
    """One request to callgate; the driver sends back the ``httpx.Response`` or throws the
    ``httpx.HTTPError``."""

    method: str
    path: str
    body: Any = None


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Execute:
    """Run the tool once: ``fn(arguments, operation_id)``, within ``timeout`` seconds (``None``:
    no limit). The driver sends back its result or throws what it raised (a ``ToolFailure``
    with ``outcome="timeout"``, ``sent=None`` when the limit passed)."""

    fn: Callable[[dict, str], Any]
    arguments: dict
    operation_id: str
    timeout: float | None


@dataclass(frozen=True)
class Flush:
    """Send the buffered events (the driver holds the client's flush lock)."""


# --------------------------------------------------------------------------- request context

_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "callgate_request", default=None
)


@contextlib.contextmanager
def request_context(
    request_id: str | None = None,
    *,
    conversation_id: str | None = None,
    trace_id: str | None = None,
    actor: str | None = None,
) -> Iterator[dict[str, str]]:
    """Correlation keys for the calls made inside the ``with`` block (gated tools, ``run``,
    the framework adapters): ``request_id`` (the user request the model answers; equal
    arguments under one request ID share one operation ID, so a repeated write returns the
    receipt instead of running twice), ``conversation_id``, ``trace_id``, ``actor``. Nested
    blocks override the keys they set. Works across threads started inside and asyncio tasks."""
    keys = {
        **(_context.get() or {}),
        **_drop_none(
            {
                "request_id": request_id,
                "conversation_id": conversation_id,
                "trace_id": trace_id,
                "actor": actor,
            }
        ),
    }
    token = _context.set(keys)
    try:
        yield keys
    finally:
        _context.reset(token)


_operation: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "callgate_operation", default=None
)


def current_operation_id() -> str | None:
    """Inside a tool that callgate let run: its operation ID (pass it on as the target's
    idempotency key); ``None`` elsewhere. Set by both clients around each execution."""
    return _operation.get()


def call_with_operation(operation_id: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` with ``current_operation_id()`` returning ``operation_id``."""
    context = contextvars.copy_context()
    context.run(_operation.set, operation_id)
    return context.run(fn, *args)


def current_request() -> dict[str, str]:
    """The correlation keys set by the innermost ``request_context`` (empty outside one)."""
    return dict(_context.get() or {})


# --------------------------------------------------------------------------- helpers


def now_rfc3339(clock: Callable[[], float] = time.time) -> str:
    return datetime.fromtimestamp(clock(), UTC).isoformat().replace("+00:00", "Z")


def _drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


def local_operation_id(
    request_id: str | None, proposal: Proposal, volatile_arguments: Iterable[str] = ()
) -> str:
    """The operation ID callgate derives for ``proposal`` (``wire.derive_operation_id`` over
    the request ID, the tool and the canonical arguments without the contract's
    ``volatile_arguments``), or a fresh one without a request ID (callgate too assigns a
    fresh one then). Used when callgate cannot be reached."""
    if not request_id or not proposal.tool:
        return f"op_{uuid.uuid4().hex}"
    if proposal.arguments_ok:
        return derive_operation_id(
            request_id=request_id,
            tool=proposal.tool,
            arguments=proposal.arguments,
            volatile_arguments=volatile_arguments,
        )
    return derive_operation_id(
        request_id=request_id,
        tool=proposal.tool,
        raw_arguments=proposal.raw_arguments or repr(proposal.arguments),
    )


def _counts_against_breaker(attempt: dict) -> bool:
    """Failures that say the target is unhealthy (not the call's own fault)."""
    if attempt.get("outcome") in ("timeout", "connection_reset"):
        return True
    if attempt.get("sent") is False:
        return True
    return (attempt.get("http_status") or 0) in (429, 500, 502, 503, 504)


@dataclass
class ToolInfo:
    """What the client knows of a tool's contract (from ``register_tool``)."""

    effect: Effect = "write"  # unknown tools are treated as writes: the safe assumption
    idempotent: bool = False
    max_attempts: int = 3
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    volatile_arguments: tuple[str, ...] = ()


# --------------------------------------------------------------------------- the protocol


class Protocol:
    """Configuration, per-tool state and the protocol's steps, shared by both clients.

    ``buffer_dir``: where undelivered events are kept (SQLite; ``None`` keeps them in memory),
    at most ``buffer_max_bytes``. ``batch_size``: events per ``POST /api/v1/events``.
    ``fail_open``: when the gate cannot be reached, execute anyway (the proposal and the
    attempt are buffered and reported later) instead of raising ``CallgateUnavailable``.
    ``execute_timeout``: seconds one execution may take (``None``: no limit).
    ``wait_limit``: seconds to wait for a reconciliation or an operator's decision, polling
    ``GET /api/v1/calls/{op}`` from ``poll_interval`` doubling to ``max_poll_interval``.
    ``answer_timeout``: seconds to wait for callgate to apply a reported event.
    ``breaker_threshold``/``breaker_cooldown``: each tool's circuit breaker.
    ``clock``/``rand`` are injectable for tests.
    """

    def __init__(
        self,
        *,
        buffer_dir: Any = None,
        buffer_max_bytes: int = 10 * 1024 * 1024,
        batch_size: int = 100,
        fail_open: bool = False,
        execute_timeout: float | None = 30.0,
        wait_limit: float = 300.0,
        answer_timeout: float = 10.0,
        poll_interval: float = 1.0,
        max_poll_interval: float = 30.0,
        breaker_threshold: int = 5,
        breaker_cooldown: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[float, float], float] = random.uniform,
        actor: str | None = None,
    ):
        if batch_size < 1 or batch_size > 1000:
            raise ValueError("batch_size must be between 1 and 1000")
        self.buffer = EventBuffer(buffer_dir, max_bytes=buffer_max_bytes)
        self.batch_size = batch_size
        self.fail_open = fail_open
        self.execute_timeout = execute_timeout
        self.wait_limit = wait_limit
        self.answer_timeout = answer_timeout
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        self.breaker_threshold = breaker_threshold
        self.breaker_cooldown = breaker_cooldown
        self.clock = clock
        self.rand = rand
        self.actor = actor
        self.tools: dict[str, ToolInfo] = {}
        self.breakers: dict[str, CircuitBreaker] = {}
        self._offline_until = 0.0
        self._offline_streak = 0
        self._flush_not_before = 0.0  # clock() before which flush does not send (Retry-After)

    @property
    def offline(self) -> bool:
        """True while callgate was just found unreachable (``OFFLINE_BACKOFF``)."""
        return self.clock() < self._offline_until

    def breaker(self, tool: str) -> CircuitBreaker:
        """The circuit breaker of ``tool`` (created on first use)."""
        if tool not in self.breakers:
            self.breakers[tool] = CircuitBreaker(
                failure_threshold=self.breaker_threshold,
                cooldown=self.breaker_cooldown,
                clock=self.clock,
            )
        return self.breakers[tool]

    def event(self, type_: str, *, operation_id: str | None = None, **fields: Any) -> dict:
        """An event envelope: fresh ``event_id``, ``occurred_at`` now, correlation keys, body."""
        envelope = {
            "event_id": str(uuid.uuid4()),
            "occurred_at": now_rfc3339(),
            "type": type_,
            "operation_id": operation_id,
        }
        envelope.update(fields)
        # correlation keys are left out when unknown; body fields keep their nulls (``sent: null``)
        return {k: v for k, v in envelope.items() if v is not None or k not in _ENVELOPE_KEYS}

    # ---------------------------------------------------------------- requests

    def _request(self, method: str, path: str, body: Any = None) -> Steps[httpx.Response]:
        """One request. Raises ``CallgateUnavailable`` on connection errors, 5xx and 429,
        ``CallgateError`` on other 4xx (the caller reads a 207)."""
        try:
            response = yield Http(method, path, body)
        except httpx.HTTPError as exc:
            self._went_offline()
            raise CallgateUnavailable(f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc
        if response.status_code in _UNAVAILABLE_STATUSES or response.status_code >= 500:
            self._went_offline()
            raise CallgateUnavailable(
                f"{method} {path}: HTTP {response.status_code}",
                retry_after=_retry_after(response),
            )
        self._offline_until, self._offline_streak = 0.0, 0
        if response.status_code >= 400:
            try:
                data = response.json()
            except ValueError:
                data = {}
            message = data.get("error") if isinstance(data, dict) else None
            errors = data.get("errors") if isinstance(data, dict) else None
            raise CallgateError(response.status_code, message or response.reason_phrase, errors)
        return response

    def _went_offline(self) -> None:
        delay = backoff_delay(self._offline_streak, OFFLINE_BACKOFF, self.rand)
        self._offline_until = self.clock() + delay
        self._offline_streak += 1

    # ---------------------------------------------------------------- contracts

    def register_tool_steps(
        self,
        name: str,
        *,
        parameters: dict | type[BaseModel],
        description: str = "",
        effect: Effect = "read",
        idempotent: bool = False,
        reconcilable: bool = False,
        reconcile_url: str | None = None,
        max_attempts: int = 3,
        max_reasks: int = 2,
        requires_approval: bool = False,
        approval_timeout_seconds: int | None = None,
        retry: RetryPolicy | None = None,
        sensitive_fields: list[str] | None = None,
        version: str | None = None,
        **fields: Any,
    ) -> Steps[ToolRegistration]:
        """``fields``: contract fields this client does not name (sent as they are, e.g.
        ``volatile_arguments``); callgate refuses an unknown one with a 400 naming it."""
        schema = (
            parameters.model_json_schema()
            if isinstance(parameters, type) and issubclass(parameters, BaseModel)
            else parameters
        )
        body: dict[str, Any] = {
            "description": description,
            "effect": effect,
            "idempotent": idempotent,
            "reconcilable": reconcilable,
            "max_attempts": max_attempts,
            "max_reasks": max_reasks,
            "requires_approval": requires_approval,
            "parameters": schema,
        }
        optional = {
            "version": version,
            "reconcile_url": reconcile_url,
            "approval_timeout_seconds": approval_timeout_seconds,
            "retry": retry.model_dump() if retry is not None else None,
            "sensitive_fields": sensitive_fields or None,
        }
        body.update(_drop_none(optional))
        body.update(fields)
        response = yield from self._request("PUT", f"/api/v1/tools/{name}", body)
        self.tools[name] = ToolInfo(
            effect=effect,
            idempotent=idempotent,
            max_attempts=max_attempts,
            retry=retry or RetryPolicy(),
            volatile_arguments=tuple(fields.get("volatile_arguments") or ()),
        )
        return ToolRegistration.model_validate(response.json())

    # ---------------------------------------------------------------- the gate and calls

    def check_steps(
        self,
        format: Format,
        call: Any,
        *,
        request_id: str | None = None,
        operation_id: str | None = None,
        conversation_id: str | None = None,
        trace_id: str | None = None,
        actor: str | None = None,
        event_id: str | None = None,
    ) -> Steps[CallAnswer]:
        body = _drop_none(
            {
                "format": format,
                "call": call,
                "request_id": request_id,
                "operation_id": operation_id,
                "conversation_id": conversation_id,
                "trace_id": trace_id,
                "actor": actor or self.actor,
                "event_id": event_id or str(uuid.uuid4()),
                "occurred_at": now_rfc3339(),
            }
        )
        response = yield from self._gate_request(body)
        return CallAnswer.model_validate(response.json())

    def _gate_request(self, body: dict) -> Steps[httpx.Response]:
        """``POST /api/v1/calls``; a 429 with ``Retry-After`` (the project's inbox is full) is
        waited out once, up to ``GATE_RETRY_AFTER_LIMIT`` seconds, and the same check (same
        ``event_id``) sent again."""
        try:
            return (yield from self._request("POST", "/api/v1/calls", body))
        except CallgateUnavailable as exc:
            if exc.retry_after is None or exc.retry_after > GATE_RETRY_AFTER_LIMIT:
                raise
            yield Sleep(exc.retry_after)
            return (yield from self._request("POST", "/api/v1/calls", body))

    def check_turn_steps(
        self,
        format: Format,
        response: Any,
        *,
        request_id: str | None = None,
        actor: str | None = None,
    ) -> Steps[list[CallAnswer]]:
        body = _drop_none(
            {
                "format": format,
                "turn": response,
                "request_id": request_id or current_request().get("request_id"),
                "actor": actor or self.actor,
                "event_id": str(uuid.uuid4()),
                "occurred_at": now_rfc3339(),
            }
        )
        answer = (yield from self._gate_request(body)).json()
        return [CallAnswer.model_validate(call) for call in answer["calls"]]

    def get_call_steps(self, operation_id: str) -> Steps[CallAnswer]:
        response = yield from self._request("GET", f"/api/v1/calls/{operation_id}")
        return CallAnswer.model_validate(response.json())

    # ---------------------------------------------------------------- events

    def report_now_steps(self, event: dict) -> Steps[CallAnswer | None]:
        if self.offline:  # found unreachable a moment ago: do not wait for it again per event
            self.buffer.append([event])
            return None
        if len(self.buffer):
            yield Flush()
            if len(self.buffer):
                self.buffer.append([event])  # behind the earlier events, in order
                return None
        try:
            response = yield from self._request("POST", "/api/v1/events", [event])
        except CallgateUnavailable as exc:
            logger.warning(
                "callgate unavailable, event %s buffered: %s", event.get("event_id"), exc
            )
            self.buffer.append([event])
            return None
        item = (response.json().get("results") or [{}])[0]
        if item.get("status") == "rejected":
            raise CallgateError(422, "event rejected", item.get("errors"))
        if item.get("status") == "conflict":  # an event_id used before for other content
            raise CallgateError(409, "event_id already used", item.get("errors"))
        return (yield from self._event_answer(str(event["event_id"])))

    def _event_answer(self, event_id: str) -> Steps[CallAnswer | None]:
        """Poll ``GET /api/v1/events/{event_id}`` until callgate has applied the event."""
        deadline = self.clock() + self.answer_timeout
        interval = 0.05
        while True:
            try:
                found = (yield from self._request("GET", f"/api/v1/events/{event_id}")).json()
            except CallgateUnavailable:
                found = {"status": "pending"}
            if found.get("status") == "rejected":
                raise CallgateError(422, "event rejected", found.get("errors"))
            if found.get("status") == "applied" and isinstance(found.get("answer"), dict):
                return CallAnswer.model_validate(found["answer"])
            remaining = deadline - self.clock()
            if remaining <= 0:
                logger.warning(
                    "callgate has not applied event %s after %.0f s", event_id, self.answer_timeout
                )
                return None
            yield Sleep(min(interval, remaining))
            interval = min(1.0, interval * 2)

    def flush_steps(self) -> Steps[int]:
        """Send buffered events in batches until the buffer is empty or callgate is unavailable.
        Returns how many were delivered (accepted or duplicate). Rejected events are logged
        and dropped; on 5xx/connection errors they stay buffered."""
        delivered = 0
        if self.clock() < self._flush_not_before:  # callgate asked to wait (Retry-After)
            return delivered
        size = self.batch_size
        while True:
            rows = self.buffer.rows(size)
            if not rows:
                return delivered
            seqs = [seq for seq, _ in rows]
            batch = [event for _, event in rows]
            try:
                response = yield from self._request("POST", "/api/v1/events", batch)
            except CallgateUnavailable as exc:
                logger.info(
                    "callgate unavailable, %d event(s) stay buffered: %s", len(self.buffer), exc
                )
                if exc.retry_after is not None:
                    self._flush_not_before = self.clock() + exc.retry_after
                return delivered
            except CallgateError as exc:
                if exc.status_code in (401, 403):
                    logger.error("callgate refused the API key (%s); events stay buffered", exc)
                    return delivered
                if len(batch) > 1:
                    size = max(1, len(batch) // 2)  # find the bad event (or fit under 413)
                    continue
                logger.error(
                    "callgate rejected event %s, dropped: %s %s",
                    batch[0].get("event_id"),
                    exc,
                    exc.errors,
                )
                self.buffer.remove(seqs)
                continue
            results = response.json().get("results") or []
            done = set()
            for position, item in enumerate(results):
                index = item.get("index")
                index = index if isinstance(index, int) and 0 <= index < len(batch) else position
                if index >= len(batch):
                    continue
                if item.get("status") in ("rejected", "conflict"):
                    logger.error(
                        "callgate refused event %s (%s), dropped: %s",
                        item.get("event_id") or batch[index].get("event_id"),
                        item.get("status"),
                        item.get("errors"),
                    )
                else:
                    delivered += 1
                done.add(seqs[index])
            if not results:  # a 2xx without per-item results: the whole batch was taken
                done = set(seqs)
                delivered += len(batch)
            self.buffer.remove(done)
            size = self.batch_size

    # ---------------------------------------------------------------- run: the seven steps

    def run_steps(
        self,
        format: Format,
        call: Any,
        execute: Callable[[dict, str], Any],
        *,
        request_id: str | None = None,
        operation_id: str | None = None,
        conversation_id: str | None = None,
        trace_id: str | None = None,
        actor: str | None = None,
        timeout: float | None = ...,  # type: ignore[assignment]
        wait_limit: float | None = None,
        gated: CallAnswer | None = None,
    ) -> Steps[RunResult]:
        timeout = self.execute_timeout if timeout is ... else timeout
        wait_limit = self.wait_limit if wait_limit is None else wait_limit
        context = current_request()
        keys = _drop_none(
            {
                "request_id": request_id or context.get("request_id"),
                "conversation_id": conversation_id or context.get("conversation_id"),
                "trace_id": trace_id or context.get("trace_id"),
                "actor": actor or context.get("actor") or self.actor,
            }
        )
        started = self.clock()
        proposal = normalise(format, call)
        parsed = proposal.tool is not None and proposal.arguments_ok
        if proposal.call_id:
            keys["call_id"] = proposal.call_id
        info = (self.tools.get(proposal.tool or "") if parsed else None) or ToolInfo()

        # 1-4. propose, parse, validate, authorize: the gate
        if gated is not None:
            answer: CallAnswer | None = gated
            op = gated.operation_id
        else:
            try:
                answer = yield from self.check_steps(
                    format,
                    call,
                    operation_id=operation_id,
                    **{k: v for k, v in keys.items() if k != "call_id"},
                )
            except CallgateUnavailable:
                if not self.fail_open or not parsed:
                    raise
                op = operation_id or local_operation_id(
                    keys.get("request_id"), proposal, info.volatile_arguments
                )
                logger.warning(
                    "callgate unavailable at the gate; executing %s %s unchecked (fail_open)",
                    proposal.tool,
                    op,
                )
                self.buffer.append(
                    [self.event("proposed", operation_id=op, format=format, call=call, **keys)]
                )
                answer = None
            else:
                op = answer.operation_id

        attempt_no = answer.attempts if answer else 0
        arguments = dict(proposal.arguments) if parsed else {}
        executions = 0
        retries = 0
        last_result: Any = None

        def finish(
            status: RunStatus, ans: CallAnswer | None, result: Any = None, observation: str = ""
        ) -> RunResult:
            return RunResult(
                status=status,
                operation_id=op,
                result=result,
                observation=observation or (ans.observation if ans else ""),
                reason=ans.reason if ans else None,
                route=ans.route if ans else None,
                executions=executions,
                answer=ans,
            )

        while True:
            verdict = answer.verdict if answer else "allow"
            if answer is not None and answer.state == "succeeded" and verdict != "return_receipt":
                # 7. route: proceed, the attempt succeeded
                return finish(
                    "succeeded", answer, result=last_result if executions else answer.receipt
                )
            if verdict == "return_receipt":
                assert answer is not None  # without an answer the verdict is "allow"
                result = answer.receipt if answer.receipt is not None else last_result
                return finish("receipt", answer, result=result)
            if verdict == "reask":
                return finish("reask", answer)
            if verdict == "deny":
                return finish("denied", answer)
            if verdict == "stop":
                return finish("stopped", answer)
            if verdict in WAITING_VERDICTS:
                assert answer is not None  # without an answer the verdict is "allow"
                answer = yield from self._wait(op, answer, wait_limit)
                if answer.verdict in WAITING_VERDICTS:
                    return finish("waiting", answer)
                if answer.decision is not None and answer.decision.arguments is not None:
                    # approved with edits: run the operator's arguments (our own values where
                    # they kept a redacted one), under the operation ID callgate now gives
                    try:
                        arguments = edited_arguments(answer.decision.arguments, arguments)
                    except HiddenValueMoved as exc:  # never another entry's hidden value
                        return finish(
                            "stopped", answer, observation=f"not executed: the approved {exc}"
                        )
                    op = answer.operation_id
                continue
            if verdict == "retry":
                if (
                    info.retry.deadline_seconds is not None
                    and self.clock() - started >= info.retry.deadline_seconds
                ):
                    return finish("waiting", answer)  # callgate classifies the deadline
                # callgate draws the full-jitter delay from the contract's policy; without it
                # (callgate unreachable) the SDK draws it from the policy it registered
                if answer is not None and answer.retry_after is not None:
                    delay = float(answer.retry_after)
                else:
                    delay = backoff_delay(retries, info.retry, self.rand)
                yield Sleep(delay)
                retries += 1
            # verdict allow (or retry after its backoff): 5. execute, once, with the operation ID
            budget = max(info.max_attempts, (answer.max_attempts or 0) if answer else 0)
            if attempt_no >= budget + 2:
                return finish(
                    "failed",
                    answer,
                    observation="callgate kept allowing attempts beyond the budget",
                )
            if not parsed:
                return finish("failed", answer, observation="the call could not be parsed locally")
            attempt_no += 1
            breaker = self.breaker(proposal.tool or "")
            if not breaker.allow():
                attempt: dict[str, Any] = {
                    "attempt": attempt_no,
                    "sent": False,
                    "outcome": "circuit_open",
                    "http_status": None,
                    "error": f"circuit open for {proposal.tool}",
                }
                outcome: Outcome = "circuit_open"
            else:
                executions += 1
                attempt, last_result = yield from self._execute(
                    execute, dict(arguments), op, timeout, attempt_no
                )
                outcome = attempt["outcome"]
                if outcome == "success" or not _counts_against_breaker(attempt):
                    breaker.record_success()  # it worked, or the target answered: it is up
                else:
                    breaker.record_failure()
            # 6. report the attempt; its answer routes the call
            event = self.event("attempt", operation_id=op, **keys, **attempt)
            answer = yield from self.report_now_steps(event)
            if answer is not None:
                continue
            # callgate unreachable: decide locally, conservatively
            if outcome == "success":
                return finish("succeeded", None, result=last_result)
            sent = attempt["sent"]
            status = attempt.get("http_status") or 0
            unknown = sent is not False and (
                outcome in ("timeout", "connection_reset") or status in (500, 502, 504)
            )
            if info.effect != "read" and unknown:
                return finish(
                    "outcome_unknown",
                    None,
                    observation=f"{proposal.tool}: the outcome is unknown; it will be reconciled, "
                    "do not retry",
                )
            retryable = (
                outcome in ("circuit_open", "timeout", "connection_reset")
                or sent is False
                or status in (429, 500, 502, 503, 504)
            )
            if not retryable or attempt_no >= info.max_attempts:
                return finish(
                    "failed", None, observation=f"{proposal.tool} failed: {attempt.get('error')}"
                )
            answer = CallAnswer(
                operation_id=op,
                verdict="retry",
                state="retry_wait",
                attempts=attempt_no,
                max_attempts=info.max_attempts,
            )

    def _execute(
        self,
        execute: Callable[[dict, str], Any],
        arguments: dict,
        op: str,
        timeout: float | None,
        attempt_no: int,
    ) -> Steps[tuple[dict, Any]]:
        """Run the tool once. Returns (the attempt event's body, the result)."""
        try:
            result = yield Execute(execute, arguments, op, timeout)
        except Exception as exc:
            outcome, sent, http_status, error = failure_cause(exc)
            body = {
                "attempt": attempt_no,
                "sent": sent,
                "outcome": outcome,
                "http_status": http_status,
                "error": error,
            }
            if isinstance(exc, ToolFailure) and exc.result is not None:
                body["result"] = exc.result
            return body, None
        body = {
            "attempt": attempt_no,
            "sent": True,
            "outcome": "success",
            "http_status": None,
            "error": None,
            "result": to_jsonable_python(result, fallback=str),
        }
        return body, result

    def _wait(self, op: str, answer: CallAnswer, wait_limit: float) -> Steps[CallAnswer]:
        """Poll ``GET /calls/{op}`` with exponential backoff until the verdict is no longer a
        waiting one or ``wait_limit`` seconds passed. callgate being down counts as waiting."""
        deadline = self.clock() + wait_limit
        interval = self.poll_interval
        while answer.verdict in WAITING_VERDICTS:
            remaining = deadline - self.clock()
            if remaining <= 0:
                return answer
            yield Sleep(min(interval, remaining))
            interval = min(self.max_poll_interval, interval * 2)
            try:
                answer = yield from self.get_call_steps(op)
            except CallgateUnavailable:
                continue
        return answer
