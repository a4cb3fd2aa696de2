"""callgate's agent SDK: check tool calls at the gate, execute them once, report what happened.

This module is for agent runtimes. It imports only httpx, pydantic and the standard library
(no Django), so it can be vendored into any Python agent::

    from callgate.sdk import CallgateClient, ToolFailure

    client = CallgateClient("https://callgate.example", api_key, buffer_dir="/var/lib/agent/cg")
    client.register_tool("create_follow_up", parameters=FollowUp, description="…", effect="write",
                         idempotent=True, reconcilable=True,
                         reconcile_url="https://tickets.example/ops/{operation_id}")
    result = client.run("openai", tool_call, execute=create_follow_up, request_id=request_id)

``run`` walks the seven steps of a tool call: the gate (parse, validate, authorize) answers
with a verdict; an allowed call is executed once with its operation ID and a timeout; the
attempt is reported; the answer's route decides what happens next: retry with full-jitter
exponential backoff under the SAME operation ID, wait for a reconciliation or an operator's
decision, return a stored receipt, or hand the observation back to the model. A write whose
outcome is unknown is never retried unless callgate (a reconciliation that found nothing, or
an operator) says so.

Events that cannot be delivered (callgate down) are kept in a bounded on-disk buffer (JSON
lines) and re-sent later; their event IDs make re-sending safe.

Units: every duration is in seconds (floats allowed). Times on the wire are RFC 3339 UTC.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CallAnswer",
    "CallgateClient",
    "CallgateError",
    "CallgateUnavailable",
    "CircuitBreaker",
    "EventBuffer",
    "RetryPolicy",
    "RunResult",
    "SelfCorrector",
    "ToolFailure",
    "ToolRegistration",
    "backoff_delay",
    "parse_call",
]

logger = logging.getLogger("callgate.sdk")

Format = Literal["openai", "openai_responses", "anthropic", "gemini", "mcp", "plain"]
Verdict = Literal[
    "allow",
    "reask",
    "deny",
    "retry",
    "reconcile",
    "return_receipt",
    "pending_approval",
    "review",
    "stop",
]
Outcome = Literal["success", "error", "timeout", "connection_reset", "circuit_open"]

#: verdicts after which the agent waits for callgate (a reconciliation or a human).
WAITING_VERDICTS = frozenset({"reconcile", "review", "pending_approval"})
#: answers the SDK treats as "callgate is unavailable": keep the events, try later.
_UNAVAILABLE_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


# --------------------------------------------------------------------------- wire models


class RetryPolicy(BaseModel):
    """A contract's retry policy. ``backoff_delay`` turns it into sleeps.

    ``initial_interval`` and ``maximum_interval`` are seconds; ``deadline_seconds`` bounds
    the whole call (first attempt to last), ``None`` for no deadline.
    """

    initial_interval: float = Field(1.0, ge=0)
    backoff_coefficient: float = Field(2.0, ge=1)
    maximum_interval: float = Field(60.0, ge=0)
    deadline_seconds: int | None = Field(None, ge=1)


class Decision(BaseModel):
    model_config = ConfigDict(extra="allow")

    decision: str
    reason: str | None = None
    decided_at: str | None = None


class CallAnswer(BaseModel):
    """callgate's answer about one operation (the gate, an event, or ``GET /calls/{op}``)."""

    model_config = ConfigDict(extra="allow")

    operation_id: str
    verdict: Verdict
    state: str
    reason: str | None = None
    category: str | None = None
    route: str | None = None
    observation: str = ""
    receipt: Any = None
    attempts: int = 0
    max_attempts: int | None = None
    retry_after: float | None = None
    decision: Decision | None = None
    # only on GET /api/v1/calls/{operation_id}
    tool: str | None = None
    contract_version: int | None = None
    created_at: str | None = None
    updated_at: str | None = None


class Finding(BaseModel):
    path: str = ""
    message: str = ""


class ToolRegistration(BaseModel):
    """The answer to ``PUT /api/v1/tools/{name}``: the contract's version and its lint."""

    model_config = ConfigDict(extra="allow")

    name: str
    version: int
    created: bool
    lint: dict[str, Any] = Field(default_factory=dict)

    @property
    def lint_score(self) -> int | None:
        return self.lint.get("score")

    @property
    def findings(self) -> list[Finding]:
        return [Finding(**f) for f in self.lint.get("findings", [])]


RunStatus = Literal[
    "succeeded",  # executed; callgate (or, when it was down, the attempt itself) says it worked
    "receipt",  # not executed (again): the stored receipt is the result
    "reask",  # the model must propose again; hand it ``observation``
    "denied",  # do not execute, do not retry
    "stopped",  # give up and tell the user (budget exhausted, rejected, expired)
    "waiting",  # still waiting for a reconciliation or a human after the wait limit
    "outcome_unknown",  # callgate unreachable and the write's outcome is unknown: never retried
    "failed",  # callgate unreachable and the attempt failed permanently, or the retries ran out
]


class RunResult(BaseModel):
    """What ``CallgateClient.run`` ended with.

    ``result`` is the tool's result (or the stored receipt); ``observation`` is the text to hand
    back to the model when the call did not succeed; ``executions`` counts how many times the
    execute callable ran during this ``run``; ``answer`` is callgate's last answer (``None``
    when callgate could not be reached).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    status: RunStatus
    operation_id: str | None = None
    result: Any = None
    observation: str = ""
    reason: str | None = None
    route: str | None = None
    executions: int = 0
    answer: CallAnswer | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("succeeded", "receipt")


# --------------------------------------------------------------------------- errors


class CallgateError(Exception):
    """callgate answered with a 4xx: the request itself is wrong. ``errors`` are ``{"loc","msg"}``."""

    def __init__(self, status_code: int, message: str, errors: list[dict] | None = None):
        super().__init__(f"{status_code}: {message}")
        self.status_code = status_code
        self.message = message
        self.errors = errors or []


class CallgateUnavailable(Exception):
    """callgate could not be reached, or answered 5xx/429. ``retry_after``: the seconds its
    ``Retry-After`` header asked to wait (backpressure), when it sent one."""

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


#: The longest ``Retry-After`` the gate check waits out before trying once more (seconds).
GATE_RETRY_AFTER_LIMIT = 30.0


def _retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds (RFC 9110 §10.2.3, the delay-seconds form), or None."""
    try:
        return max(0.0, float(response.headers.get("Retry-After", "")))
    except ValueError:
        return None


class ToolFailure(Exception):
    """Raised by an execute callable when the tool did not succeed.

    ``sent``: did the request reach the target (``True``), certainly not (``False``), or
    cannot tell (``None``). ``outcome``: ``error``, ``timeout`` or ``connection_reset``.
    ``http_status``: the target's status code, if any. ``error``: a short message.
    """

    def __init__(
        self,
        error: str = "",
        *,
        sent: bool | None = True,
        outcome: Outcome = "error",
        http_status: int | None = None,
        result: Any = None,
    ):
        super().__init__(error or outcome)
        self.sent = sent
        self.outcome = outcome
        self.http_status = http_status
        self.error = error or outcome
        self.result = result


# --------------------------------------------------------------------------- helpers


def now_rfc3339(clock: Callable[[], float] = time.time) -> str:
    return datetime.fromtimestamp(clock(), UTC).isoformat().replace("+00:00", "Z")


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8: equal arguments give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def derive_operation_id(request_id: str | None, tool: str, arguments: Any) -> str:
    """An operation ID from request ID + tool + canonical arguments (never from model text).

    Used only when callgate cannot be reached to derive one itself; the SDK then sends it
    explicitly with every event of the call.
    """
    digest = hashlib.sha256(
        f"{request_id or ''}\n{tool}\n{canonical_json(arguments)}".encode()
    ).hexdigest()
    return f"op_{digest[:32]}"


def backoff_delay(
    n: int,
    policy: RetryPolicy,
    rand: Callable[[float, float], float] = random.uniform,
) -> float:
    """Full-jitter exponential backoff for the ``n``-th retry (``n`` from 0), in seconds:
    ``uniform(0, min(maximum_interval, initial_interval * backoff_coefficient ** n))``."""
    cap = min(
        policy.maximum_interval, policy.initial_interval * policy.backoff_coefficient ** max(n, 0)
    )
    return rand(0.0, cap)


@dataclass
class ParsedCall:
    tool: str
    arguments: dict
    call_id: str | None = None


def parse_call(format: Format, call: Any) -> ParsedCall:
    """The tool name, arguments (a dict) and provider call ID of a provider's tool call.

    Raises ``ValueError`` when ``call`` is not a recognisable call of ``format`` or its
    arguments are not a JSON object (callgate's gate reports these as ``malformed_call`` /
    ``invalid_json``; the SDK only parses locally to hand the arguments to the tool).
    """
    if not isinstance(call, dict):
        raise ValueError("call must be a JSON object")
    call_id = None
    if format == "openai":
        fn = call.get("function") or {}
        name, raw, call_id = fn.get("name"), fn.get("arguments"), call.get("id")
    elif format == "openai_responses":
        name, raw, call_id = (
            call.get("name"),
            call.get("arguments"),
            call.get("call_id") or call.get("id"),
        )
    elif format == "anthropic":
        name, raw, call_id = call.get("name"), call.get("input"), call.get("id")
    elif format == "gemini":
        fn = call.get("functionCall") or call.get("function_call") or {}
        name, raw, call_id = fn.get("name"), fn.get("args", {}), fn.get("id")
    elif format == "mcp":
        params = call.get("params") or {}
        name, raw = params.get("name"), params.get("arguments", {})
        call_id = str(call["id"]) if call.get("id") is not None else None
    elif format == "plain":
        name, raw = call.get("tool"), call.get("arguments", {})
    else:
        raise ValueError(f"unknown format {format!r}")
    if not isinstance(name, str) or not name:
        raise ValueError("no tool name")
    if raw is None:
        raw = {}
    if isinstance(raw, str):
        raw = json.loads(raw) if raw.strip() else {}
    if not isinstance(raw, dict):
        raise ValueError("arguments are not a JSON object")
    return ParsedCall(tool=name, arguments=raw, call_id=call_id)


# --------------------------------------------------------------------------- circuit breaker


class CircuitBreaker:
    """One tool's circuit breaker: closed → open after ``failure_threshold`` consecutive
    failures; open for ``cooldown`` seconds; then half-open: one trial call, which closes
    the circuit on success or opens it again on failure. Thread-safe."""

    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"

    def __init__(
        self,
        *,
        failure_threshold: int = 5,
        cooldown: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.failure_threshold = failure_threshold
        self.cooldown = cooldown
        self.clock = clock
        self._state = self.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trial_running = False
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        with self._lock:
            if self._state == self.OPEN and self.clock() - self._opened_at >= self.cooldown:
                return self.HALF_OPEN
            return self._state

    def allow(self) -> bool:
        """True when a call may go out now (closed, or the single half-open trial)."""
        with self._lock:
            if self._state == self.CLOSED:
                return True
            if self._state == self.OPEN:
                if self.clock() - self._opened_at < self.cooldown:
                    return False
                self._state = self.HALF_OPEN
                self._trial_running = False
            if self._trial_running:
                return False
            self._trial_running = True
            return True

    def record_success(self) -> None:
        with self._lock:
            self._state, self._failures, self._trial_running = self.CLOSED, 0, False

    def record_failure(self) -> None:
        with self._lock:
            self._failures += 1
            if self._state == self.HALF_OPEN or self._failures >= self.failure_threshold:
                self._state, self._opened_at, self._trial_running = self.OPEN, self.clock(), False

    def retry_after(self) -> float:
        """Seconds until the breaker lets a trial through (0 when it would now)."""
        with self._lock:
            if self._state != self.OPEN:
                return 0.0
            return max(0.0, self.cooldown - (self.clock() - self._opened_at))


# --------------------------------------------------------------------------- event buffer


class EventBuffer:
    """A bounded FIFO of events. With ``directory`` it is a JSON-lines file
    (``<directory>/events.jsonl``) that survives restarts; without, it lives in memory.

    When appending would exceed ``max_bytes``, the oldest events are dropped with a warning.
    Thread-safe within one process (an advisory file lock guards the file across processes
    on POSIX).
    """

    FILE_NAME = "events.jsonl"

    def __init__(
        self, directory: str | os.PathLike | None = None, *, max_bytes: int = 10 * 1024 * 1024
    ):
        self.max_bytes = max_bytes
        self._lock = threading.RLock()
        self._memory: list[str] = []
        self.path: Path | None = None
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self.path = Path(directory) / self.FILE_NAME
        self.dropped = 0

    # --- low level
    def _read(self) -> list[str]:
        if self.path is None:
            return list(self._memory)
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [line for line in text.splitlines() if line.strip()]

    def _write(self, lines: list[str]) -> None:
        if self.path is None:
            self._memory = list(lines)
            return
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write("".join(line + "\n" for line in lines))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def _file_lock(self):
        if self.path is None:
            return _NullLock()
        return _FileLock(self.path.with_suffix(".lock"))

    # --- API
    def append(self, events: Iterable[dict]) -> None:
        """Add events at the end, dropping the oldest ones if the buffer would exceed ``max_bytes``."""
        new = [json.dumps(e, separators=(",", ":"), default=str) for e in events]
        if not new:
            return
        with self._lock, self._file_lock():
            lines = self._read() + new
            size = sum(len(line.encode()) + 1 for line in lines)
            dropped = 0
            while lines and size > self.max_bytes:
                size -= len(lines[0].encode()) + 1
                lines.pop(0)
                dropped += 1
            if dropped:
                self.dropped += dropped
                logger.warning(
                    "callgate event buffer full (%d bytes): dropped the %d oldest event(s)",
                    self.max_bytes,
                    dropped,
                )
            if self.path is not None and not dropped:
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write("".join(line + "\n" for line in new))
                    fh.flush()
                    os.fsync(fh.fileno())
            else:
                self._write(lines)

    def peek(self, n: int) -> list[dict]:
        """The ``n`` oldest events (not removed). Unreadable lines are dropped with a warning."""
        with self._lock, self._file_lock():
            lines = self._read()
            out, bad = [], 0
            for line in lines[:n]:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    bad += 1
            if bad:
                logger.warning("callgate event buffer: dropped %d unreadable line(s)", bad)
                self._write([line for line in lines if _is_json(line)])
            return out

    def remove(self, event_ids: Iterable[str]) -> None:
        """Remove the events with these IDs (delivered, or rejected for good)."""
        ids = set(event_ids)
        if not ids:
            return
        with self._lock, self._file_lock():
            keep = []
            for line in self._read():
                try:
                    if json.loads(line).get("event_id") in ids:
                        continue
                except json.JSONDecodeError:
                    continue
                keep.append(line)
            self._write(keep)

    def __len__(self) -> int:
        with self._lock:
            return len(self._read())

    def size_bytes(self) -> int:
        with self._lock:
            return sum(len(line.encode()) + 1 for line in self._read())


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
        return True
    except json.JSONDecodeError:
        return False


class _NullLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _FileLock:
    def __init__(self, path: Path):
        self.path = path
        self._fh = None

    def __enter__(self):
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return self
        self._fh = open(self.path, "a")
        fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self._fh is not None:
            import fcntl

            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
        return False


# --------------------------------------------------------------------------- the client


@dataclass
class _ToolInfo:
    effect: str = "write"  # unknown tools are treated as writes: the safe assumption
    idempotent: bool = False
    max_attempts: int = 3
    retry: RetryPolicy = field(default_factory=RetryPolicy)


class CallgateClient:
    """A client of callgate's REST API v1 for one agent (one API key).

    ``transport``: an httpx transport (``httpx.WSGITransport(app=…)`` to talk to an
    in-process callgate, ``httpx.MockTransport`` in tests). ``timeout``: seconds per request
    to callgate. ``buffer_dir``: where undelivered events are kept (JSON lines; ``None`` keeps
    them in memory only), at most ``buffer_max_bytes``. Events are sent in batches of
    ``batch_size`` by a background thread every ``flush_interval`` seconds (``None``: no
    thread; call ``flush()`` yourself). ``sleep``/``clock``/``rand`` are injectable for tests.
    ``fail_open``: when the gate cannot be reached, execute anyway (the proposal and the
    attempt are buffered and reported later) instead of raising ``CallgateUnavailable``.
    ``answer_timeout``: seconds ``report_now`` waits for callgate to apply a reported event
    (``GET /api/v1/events/{id}`` polled from 50 ms, doubling up to 1 s) before deciding locally.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 10.0,
        buffer_dir: str | os.PathLike | None = None,
        buffer_max_bytes: int = 10 * 1024 * 1024,
        batch_size: int = 100,
        flush_interval: float | None = 2.0,
        fail_open: bool = False,
        execute_timeout: float | None = 30.0,
        wait_limit: float = 300.0,
        answer_timeout: float = 10.0,
        poll_interval: float = 1.0,
        max_poll_interval: float = 30.0,
        breaker_threshold: int = 5,
        breaker_cooldown: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[float, float], float] = random.uniform,
        actor: str | None = None,
    ):
        if batch_size < 1 or batch_size > 1000:
            raise ValueError("batch_size must be between 1 and 1000")
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url,
            transport=transport,
            timeout=timeout,
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": "callgate-sdk/1"},
        )
        self.buffer = EventBuffer(buffer_dir, max_bytes=buffer_max_bytes)
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.fail_open = fail_open
        self.execute_timeout = execute_timeout
        self.wait_limit = wait_limit
        self.answer_timeout = answer_timeout
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        self.breaker_threshold = breaker_threshold
        self.breaker_cooldown = breaker_cooldown
        self.sleep = sleep
        self.clock = clock
        self.rand = rand
        self.actor = actor
        self.tools: dict[str, _ToolInfo] = {}
        self.breakers: dict[str, CircuitBreaker] = {}
        self._flush_lock = threading.Lock()
        self._flush_not_before = 0.0  # clock() before which flush() does not send (Retry-After)
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        if flush_interval is not None:
            self._thread = threading.Thread(
                target=self._flush_loop, name="callgate-sdk-flush", daemon=True
            )
            self._thread.start()

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> CallgateClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self, *, flush: bool = True) -> None:
        """Stop the background thread, try a last flush, close the HTTP client. Events that
        could not be delivered stay in the buffer (on disk with ``buffer_dir``)."""
        self._closed.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if flush:
            self.flush()
        self._http.close()

    # ---------------------------------------------------------------- low-level requests

    def _request(self, method: str, path: str, body: Any = None) -> httpx.Response:
        """One request. Raises ``CallgateUnavailable`` on connection errors, 5xx and 429,
        ``CallgateError`` on other 4xx (except 207, which the caller reads)."""
        try:
            response = (
                self._http.request(method, path, json=body)
                if body is not None
                else self._http.request(method, path)
            )
        except httpx.HTTPError as exc:
            raise CallgateUnavailable(f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc
        if response.status_code in _UNAVAILABLE_STATUSES or response.status_code >= 500:
            raise CallgateUnavailable(
                f"{method} {path}: HTTP {response.status_code}",
                retry_after=_retry_after(response),
            )
        if response.status_code >= 400:
            try:
                data = response.json()
            except ValueError:
                data = {}
            message = data.get("error") if isinstance(data, dict) else None
            errors = data.get("errors") if isinstance(data, dict) else None
            raise CallgateError(response.status_code, message or response.reason_phrase, errors)
        return response

    # ---------------------------------------------------------------- contracts

    def register_tool(
        self,
        name: str,
        *,
        parameters: dict | type[BaseModel],
        description: str = "",
        effect: Literal["read", "write"] = "read",
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
    ) -> ToolRegistration:
        """Register (or confirm) a tool contract: ``PUT /api/v1/tools/{name}``.

        ``parameters`` is a JSON Schema dict or a pydantic model class (its
        ``model_json_schema()`` is sent). Returns the contract version and its lint score.
        Raises ``CallgateError`` (4xx, e.g. an invalid schema) or ``CallgateUnavailable``.
        """
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
        if version is not None:
            body["version"] = version
        if reconcile_url is not None:
            body["reconcile_url"] = reconcile_url
        if approval_timeout_seconds is not None:
            body["approval_timeout_seconds"] = approval_timeout_seconds
        if retry is not None:
            body["retry"] = retry.model_dump()
        if sensitive_fields:
            body["sensitive_fields"] = sensitive_fields
        response = self._request("PUT", f"/api/v1/tools/{name}", body)
        self.tools[name] = _ToolInfo(
            effect=effect,
            idempotent=idempotent,
            max_attempts=max_attempts,
            retry=retry or RetryPolicy(),
        )
        return ToolRegistration.model_validate(response.json())

    def breaker(self, tool: str) -> CircuitBreaker:
        """The circuit breaker of ``tool`` (created on first use)."""
        if tool not in self.breakers:
            self.breakers[tool] = CircuitBreaker(
                failure_threshold=self.breaker_threshold,
                cooldown=self.breaker_cooldown,
                clock=self.clock,
            )
        return self.breakers[tool]

    # ---------------------------------------------------------------- the gate and calls

    def check(
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
    ) -> CallAnswer:
        """Ask the gate about a proposed call before executing it: ``POST /api/v1/calls``.

        Returns the ``CallAnswer`` (verdict, operation ID, observation). Raises
        ``CallgateUnavailable`` when callgate cannot be reached, ``CallgateError`` on 4xx.
        A 429 with ``Retry-After`` (the project's inbox is full) is waited out once, up to
        ``GATE_RETRY_AFTER_LIMIT`` seconds, and the same check (same ``event_id``) sent again.
        """
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
        try:
            response = self._request("POST", "/api/v1/calls", body)
        except CallgateUnavailable as exc:
            if exc.retry_after is None or exc.retry_after > GATE_RETRY_AFTER_LIMIT:
                raise
            self.sleep(exc.retry_after)
            response = self._request("POST", "/api/v1/calls", body)
        return CallAnswer.model_validate(response.json())

    def get_call(self, operation_id: str) -> CallAnswer:
        """callgate's current answer about an operation: ``GET /api/v1/calls/{operation_id}``."""
        return CallAnswer.model_validate(
            self._request("GET", f"/api/v1/calls/{operation_id}").json()
        )

    # ---------------------------------------------------------------- events

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

    def report(self, event: dict) -> None:
        """Queue an event for the background sender (kept on disk until delivered)."""
        self.buffer.append([event])
        if len(self.buffer) >= self.batch_size:
            self._wake.set()

    def report_now(self, event: dict) -> CallAnswer | None:
        """Send one event now (``POST /api/v1/events``) and return callgate's answer for it,
        read with ``GET /api/v1/events/{event_id}`` once callgate has applied it. When callgate
        cannot be reached (or earlier events are still waiting, to keep their order) the event
        is buffered and ``None`` is returned; ``None`` too when it was stored but not applied
        within ``answer_timeout`` seconds. Raises ``CallgateError`` when callgate rejects the
        event, on receipt (a 207 item) or when applying it."""
        if len(self.buffer):
            self.flush()
            if len(self.buffer):
                self.buffer.append([event])
                return None
        try:
            response = self._request("POST", "/api/v1/events", [event])
        except CallgateUnavailable as exc:
            logger.warning(
                "callgate unavailable, event %s buffered: %s", event.get("event_id"), exc
            )
            self.buffer.append([event])
            return None
        item = (response.json().get("results") or [{}])[0]
        if item.get("status") == "rejected":
            raise CallgateError(422, "event rejected", item.get("errors"))
        return self._event_answer(str(event["event_id"]))

    def _event_answer(self, event_id: str) -> CallAnswer | None:
        """Poll ``GET /api/v1/events/{event_id}`` until callgate has applied the event."""
        deadline = self.clock() + self.answer_timeout
        interval = 0.05
        while True:
            try:
                found = self._request("GET", f"/api/v1/events/{event_id}").json()
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
            self.sleep(min(interval, remaining))
            interval = min(1.0, interval * 2)

    def flush(self) -> int:
        """Send buffered events in batches until the buffer is empty or callgate is unavailable.

        Returns the number of events delivered (accepted or duplicate). Rejected events (a 207
        item with ``status: rejected``, or a 4xx for a single event) are logged and dropped;
        on 5xx/connection errors events stay buffered for the next flush.
        """
        delivered = 0
        with self._flush_lock:
            if self.clock() < self._flush_not_before:  # callgate asked to wait (Retry-After)
                return delivered
            size = self.batch_size
            while True:
                batch = self.buffer.peek(size)
                if not batch:
                    return delivered
                try:
                    response = self._request("POST", "/api/v1/events", batch)
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
                    self.buffer.remove([batch[0].get("event_id")])
                    continue
                results = response.json().get("results") or []
                done = set()
                for item in results:
                    index = item.get("index")
                    event_id = item.get("event_id")
                    if event_id is None and isinstance(index, int) and 0 <= index < len(batch):
                        event_id = batch[index].get("event_id")
                    if item.get("status") == "rejected":
                        logger.error(
                            "callgate rejected event %s, dropped: %s", event_id, item.get("errors")
                        )
                    else:
                        delivered += 1
                    done.add(event_id)
                if not results:  # a 2xx without per-item results: the whole batch was taken
                    done = {e.get("event_id") for e in batch}
                    delivered += len(batch)
                self.buffer.remove(done)
                size = self.batch_size

    def _flush_loop(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            if self._closed.is_set():
                return
            try:
                self.flush()
            except Exception:  # never let the reporter thread die
                logger.exception("callgate event flush failed")

    # ---------------------------------------------------------------- run: the seven steps

    def run(
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
    ) -> RunResult:
        """Check ``call`` at the gate, execute it (``execute(arguments, operation_id)``) when
        allowed, report the attempt, and follow the route until the call is settled.

        ``execute`` returns the tool's result or raises ``ToolFailure``; any other exception
        is reported as a tool error (``sent: true``). ``timeout`` (seconds, default the
        client's ``execute_timeout``; ``None`` runs it inline without a limit) bounds each
        execution; a timeout is reported as ``outcome: timeout`` with ``sent: null``.
        ``wait_limit`` (seconds) bounds the wait for a reconciliation or a decision.

        Never raises for tool failures; raises ``CallgateError`` when callgate rejects the
        request itself, and ``CallgateUnavailable`` when the gate is down and the client is
        not ``fail_open``.
        """
        timeout = self.execute_timeout if timeout is ... else timeout
        wait_limit = self.wait_limit if wait_limit is None else wait_limit
        keys = _drop_none(
            {
                "request_id": request_id,
                "conversation_id": conversation_id,
                "trace_id": trace_id,
                "actor": actor or self.actor,
            }
        )
        started = self.clock()
        try:
            parsed: ParsedCall | None = parse_call(format, call)
        except (ValueError, json.JSONDecodeError):
            parsed = None
        if parsed is not None and parsed.call_id:
            keys["call_id"] = parsed.call_id
        info = self.tools.get(parsed.tool) if parsed else None
        info = info or _ToolInfo()

        # 1-4. propose, parse, validate, authorize: the gate
        try:
            answer: CallAnswer | None = self.check(
                format,
                call,
                operation_id=operation_id,
                **{k: v for k, v in keys.items() if k != "call_id"},
            )
        except CallgateUnavailable:
            if not self.fail_open or parsed is None:
                raise
            op = operation_id or derive_operation_id(request_id, parsed.tool, parsed.arguments)
            logger.warning(
                "callgate unavailable at the gate; executing %s %s unchecked (fail_open)",
                parsed.tool,
                op,
            )
            self.buffer.append(
                [self.event("proposed", operation_id=op, format=format, call=call, **keys)]
            )
            answer = None
        else:
            op = answer.operation_id

        attempt_no = answer.attempts if answer else 0
        executions = 0
        retries = 0

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

        last_result: Any = None
        while True:
            verdict = answer.verdict if answer else "allow"
            if (
                answer is not None
                and answer.state == "succeeded"
                and verdict not in ("return_receipt",)
            ):
                # 7. route: proceed, the attempt succeeded
                return finish(
                    "succeeded", answer, result=last_result if executions else answer.receipt
                )
            if verdict == "return_receipt":
                result = answer.receipt if answer.receipt is not None else last_result
                return finish("receipt", answer, result=result)
            if verdict == "reask":
                return finish("reask", answer)
            if verdict == "deny":
                return finish("denied", answer)
            if verdict == "stop":
                return finish("stopped", answer)
            if verdict in WAITING_VERDICTS:
                answer = self._wait(op, answer, wait_limit)
                if answer.verdict in WAITING_VERDICTS:
                    return finish("waiting", answer)
                continue
            if verdict == "retry":
                if (
                    info.retry.deadline_seconds is not None
                    and self.clock() - started >= info.retry.deadline_seconds
                ):
                    return finish("waiting", answer)  # callgate classifies the deadline on its side
                # callgate draws the full-jitter delay from the contract's policy; without it
                # (callgate unreachable) the SDK draws it from the policy it registered
                if answer.retry_after is not None:
                    delay = float(answer.retry_after)
                else:
                    delay = backoff_delay(retries, info.retry, self.rand)
                self.sleep(delay)
                retries += 1
            # verdict allow (or retry after its backoff): 5. execute, once, with the operation ID
            if (
                attempt_no
                >= max(info.max_attempts, (answer.max_attempts or 0) if answer else 0) + 2
            ):
                return finish(
                    "failed",
                    answer,
                    observation="callgate kept allowing attempts beyond the budget",
                )
            if parsed is None:
                return finish("failed", answer, observation="the call could not be parsed locally")
            attempt_no += 1
            breaker = self.breaker(parsed.tool)
            if not breaker.allow():
                attempt = {
                    "attempt": attempt_no,
                    "sent": False,
                    "outcome": "circuit_open",
                    "http_status": None,
                    "error": f"circuit open for {parsed.tool}",
                }
                failure_sent: bool | None = False
                outcome = "circuit_open"
            else:
                executions += 1
                attempt, outcome, failure_sent, last_result = self._execute(
                    execute, parsed.arguments, op, timeout, attempt_no
                )
                if outcome == "success":
                    breaker.record_success()
                elif _counts_against_breaker(attempt):
                    breaker.record_failure()
                else:
                    breaker.record_success()  # the target answered: it is up
            # 6. report the attempt; its answer routes the call
            event = self.event("attempt", operation_id=op, **keys, **attempt)
            answer = self.report_now(event)
            if answer is not None:
                continue
            # callgate unreachable: decide locally, conservatively
            if outcome == "success":
                return finish("succeeded", None, result=last_result)
            unknown = (
                failure_sent is not False
                and outcome in ("timeout", "connection_reset")
                or (
                    failure_sent is not False
                    and (attempt.get("http_status") or 0) in (500, 502, 504)
                )
            )
            if info.effect != "read" and unknown:
                return finish(
                    "outcome_unknown",
                    None,
                    observation=f"{parsed.tool}: the outcome is unknown; it will be reconciled, "
                    "do not retry",
                )
            retryable = (
                outcome in ("circuit_open", "timeout", "connection_reset")
                or failure_sent is False
                or (attempt.get("http_status") or 0) in (429, 500, 502, 503, 504)
            )
            if not retryable or attempt_no >= info.max_attempts:
                return finish(
                    "failed", None, observation=f"{parsed.tool} failed: {attempt.get('error')}"
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
    ) -> tuple[dict, str, bool | None, Any]:
        """Run the tool once. Returns (attempt event body, outcome, sent, result)."""
        try:
            if timeout is None:
                result = execute(dict(arguments), op)
            else:
                pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="callgate-tool"
                )
                try:
                    result = pool.submit(execute, dict(arguments), op).result(timeout=timeout)
                finally:
                    pool.shutdown(wait=False)
        except concurrent.futures.TimeoutError:
            return (
                {
                    "attempt": attempt_no,
                    "sent": None,
                    "outcome": "timeout",
                    "http_status": None,
                    "error": f"timed out after {timeout}s",
                },
                "timeout",
                None,
                None,
            )
        except ToolFailure as exc:
            body = {
                "attempt": attempt_no,
                "sent": exc.sent,
                "outcome": exc.outcome,
                "http_status": exc.http_status,
                "error": exc.error,
            }
            if exc.result is not None:
                body["result"] = exc.result
            return body, exc.outcome, exc.sent, None
        except Exception as exc:  # the tool's own code failed: a tool error the model may fix
            return (
                {
                    "attempt": attempt_no,
                    "sent": True,
                    "outcome": "error",
                    "http_status": None,
                    "error": f"{exc.__class__.__name__}: {exc}",
                },
                "error",
                True,
                None,
            )
        body = {
            "attempt": attempt_no,
            "sent": True,
            "outcome": "success",
            "http_status": None,
            "error": None,
            "result": result,
        }
        return body, "success", True, result

    def _wait(self, op: str, answer: CallAnswer, wait_limit: float) -> CallAnswer:
        """Poll ``GET /calls/{op}`` with exponential backoff until the verdict is no longer a
        waiting one or ``wait_limit`` seconds passed. callgate being down counts as waiting."""
        deadline = self.clock() + wait_limit
        interval = self.poll_interval
        while answer.verdict in WAITING_VERDICTS:
            remaining = deadline - self.clock()
            if remaining <= 0:
                return answer
            self.sleep(min(interval, remaining))
            interval = min(self.max_poll_interval, interval * 2)
            try:
                answer = self.get_call(op)
            except CallgateUnavailable:
                continue
        return answer


def _counts_against_breaker(attempt: dict) -> bool:
    """Failures that say the target is unhealthy (not the call's own fault)."""
    if attempt.get("outcome") in ("timeout", "connection_reset"):
        return True
    if attempt.get("sent") is False:
        return True
    return (attempt.get("http_status") or 0) in (429, 500, 502, 503, 504)


_ENVELOPE_KEYS = frozenset(
    {"operation_id", "call_id", "request_id", "conversation_id", "trace_id", "actor"}
)


def _drop_none(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


# --------------------------------------------------------------------------- self-correction


class SelfCorrector:
    """Hands callgate's observation back to the model until the call goes through.

    ``model_fn(observation) -> call`` (same format) or ``-> (format, call)`` proposes again;
    at most ``max_reasks`` re-asks (callgate also counts them per request and tool and
    answers ``stop`` / ``reask_exhausted`` when the contract's budget is spent).
    """

    def __init__(self, client: CallgateClient, model_fn: Callable[[str], Any], max_reasks: int = 2):
        self.client = client
        self.model_fn = model_fn
        self.max_reasks = max_reasks
        self.reasks = 0

    def run(
        self,
        format: Format,
        call: Any,
        execute: Callable[[dict, str], Any],
        *,
        request_id: str,
        **kwargs: Any,
    ) -> RunResult:
        """``CallgateClient.run`` in a loop: on ``reask`` ask the model again (same request ID).
        Returns the first result that is not a re-ask, or the last re-ask when the local
        budget is spent."""
        self.reasks = 0
        while True:
            result = self.client.run(format, call, execute, request_id=request_id, **kwargs)
            if result.status != "reask" or self.reasks >= self.max_reasks:
                return result
            self.reasks += 1
            proposal = self.model_fn(result.observation)
            if isinstance(proposal, tuple) and len(proposal) == 2:
                format, call = proposal
            else:
                call = proposal
