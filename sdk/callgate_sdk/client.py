"""``CallgateClient`` (httpx.Client, threads) and ``AsyncCallgateClient`` (httpx.AsyncClient,
asyncio): the same methods, the same protocol (``_protocol.Protocol``), one connection pool
per client.

::

    client = CallgateClient("https://callgate.example", api_key, buffer_dir="/var/lib/agent/cg")

    @client.tool(effect="write", idempotent=True,
                 reconcile="https://tickets.example/ops/{operation_id}")
    def create_follow_up(ticket_id: str, due_at: str, operation_id: str) -> dict:
        \"\"\"Create a follow-up on a ticket.

        Args:
            ticket_id: Ticket id, e.g. T-1042.
            due_at: When it is due (RFC 3339).
        \"\"\"
        return tickets.post(..., headers={"Idempotency-Key": operation_id}).json()

    with request_context("req-42"):
        create_follow_up("T-1042", "2026-12-01T09:00:00Z")  # or raises CallNotAllowed

``run(format, call, execute)`` walks the seven steps for a call in a provider's format: the
gate answers with a verdict; an allowed call is executed once with its operation ID and a
timeout; the attempt is reported; the answer's route decides what follows: retry with
full-jitter exponential backoff under the SAME operation ID, wait for a reconciliation or an
operator's decision, return a stored receipt, or hand the observation back to the model. A
write whose outcome is unknown is never retried unless callgate says so.

Units: every duration is in seconds (floats allowed).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from callgate_sdk._protocol import (
    Execute,
    Flush,
    Http,
    Protocol,
    Sleep,
    Steps,
    _operation,
    call_with_operation,
)
from callgate_sdk._version import __version__
from callgate_sdk.errors import CallgateUnavailable, CallNotAllowed, ToolFailure
from callgate_sdk.models import CallAnswer, Effect, Format, RunResult, ToolRegistration
from callgate_sdk.tools import Registration, ToolSpec

logger = logging.getLogger("callgate_sdk")

_USER_AGENT = f"callgate-sdk/{__version__}"


def _headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}", "User-Agent": _USER_AGENT}


def _timed_out(timeout: float) -> ToolFailure:
    return ToolFailure(f"timed out after {timeout}s", sent=None, outcome="timeout")


class CallgateClient(Protocol):
    """A synchronous client of callgate's REST API v1 for one agent (one API key).

    ``transport``: an httpx transport (``httpx.WSGITransport(app=…)`` for an in-process
    callgate, ``httpx.MockTransport`` in tests). ``timeout``: seconds per request to callgate.
    Events are sent in batches by a background thread every ``flush_interval`` seconds
    (``None``: no thread; call ``flush()``). ``sleep`` is injectable for tests. The other
    options are ``Protocol``'s (buffer, fail_open, execute_timeout, wait_limit, breakers).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 10.0,
        flush_interval: float | None = 2.0,
        sleep: Callable[[float], None] = time.sleep,
        **options: Any,
    ):
        super().__init__(**options)
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url, transport=transport, timeout=timeout, headers=_headers(api_key)
        )
        self.sleep = sleep
        self.flush_interval = flush_interval
        self._flush_lock = threading.Lock()
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

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, *, flush: bool = True) -> None:
        """Stop the background thread, try a last flush, close the connection pool. Events
        that could not be delivered stay in the buffer (on disk with ``buffer_dir``)."""
        self._closed.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if flush:
            self.flush()
        self._http.close()

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

    # ---------------------------------------------------------------- the effects

    def _drive(self, steps: Steps[Any]) -> Any:
        value: Any = None
        error: Exception | None = None
        while True:
            try:
                effect = steps.throw(error) if error is not None else steps.send(value)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            try:
                value = self._perform(effect)
            except Exception as exc:
                error = exc

    def _perform(self, effect: Any) -> Any:
        if isinstance(effect, Http):
            if effect.body is None:
                return self._http.request(effect.method, effect.path)
            return self._http.request(effect.method, effect.path, json=effect.body)
        if isinstance(effect, Sleep):
            return self.sleep(effect.seconds)
        if isinstance(effect, Execute):
            return self._execute_now(effect)
        if isinstance(effect, Flush):
            return self.flush()
        raise TypeError(f"unknown effect {effect!r}")

    @staticmethod
    def _execute_now(effect: Execute) -> Any:
        args: tuple[Any, ...] = (
            effect.operation_id,
            effect.fn,
            effect.arguments,
            effect.operation_id,
        )
        if effect.timeout is None:
            return call_with_operation(*args)
        pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="callgate-tool"
        )
        try:
            future = pool.submit(call_with_operation, *args)
            try:
                return future.result(timeout=effect.timeout)
            except concurrent.futures.TimeoutError:
                if future.done():
                    raise  # the tool's own timeout
                raise _timed_out(effect.timeout) from None
        finally:
            pool.shutdown(wait=False)

    # ---------------------------------------------------------------- the API

    def register_tool(self, name: str, **contract: Any) -> ToolRegistration:
        """Register (or confirm) a tool contract: ``PUT /api/v1/tools/{name}``.

        ``parameters`` is a JSON Schema dict or a pydantic model class (its
        ``model_json_schema()`` is sent); the other keywords are the contract's fields
        (``description``, ``effect``, ``idempotent``, ``reconcilable``, ``reconcile_url``,
        ``max_attempts``, ``max_reasks``, ``requires_approval``, ``approval_timeout_seconds``,
        ``retry``, ``sensitive_fields``, ``version``). Returns the version and its lint score.
        Raises ``CallgateError`` (4xx, e.g. an invalid schema) or ``CallgateUnavailable``.
        """
        return self._drive(self.register_tool_steps(name, **contract))

    def check(self, format: Format, call: Any, **keys: Any) -> CallAnswer:
        """Ask the gate about a proposed call before executing it: ``POST /api/v1/calls``.
        ``keys``: ``request_id``, ``operation_id``, ``conversation_id``, ``trace_id``,
        ``actor``, ``event_id``. Returns the ``CallAnswer``. Raises ``CallgateUnavailable``
        when callgate cannot be reached, ``CallgateError`` on 4xx."""
        return self._drive(self.check_steps(format, call, **keys))

    def check_turn(self, format: Format, response: Any, **keys: Any) -> list[CallAnswer]:
        """Ask the gate about a whole model response (parallel tool calls, TAXONOMY v2) in one
        round trip: ``POST /api/v1/calls`` with ``turn``. One ``CallAnswer`` per call of the
        response, in order (``call_id`` and ``executed_by`` among its extra fields); calls the
        provider executed itself are recorded, never to be executed here. ``keys``:
        ``request_id`` (default: the ``request_context``'s), ``actor``. Raises like ``check``."""
        return self._drive(self.check_turn_steps(format, response, **keys))

    def get_call(self, operation_id: str) -> CallAnswer:
        """callgate's current answer about an operation: ``GET /api/v1/calls/{operation_id}``."""
        return self._drive(self.get_call_steps(operation_id))

    def wait(self, answer: CallAnswer, *, limit: float | None = None) -> CallAnswer:
        """Poll ``GET /api/v1/calls/{op}`` (from ``poll_interval``, doubling) while ``answer``'s
        verdict is a waiting one (a reconciliation, a review, an approval), at most ``limit``
        seconds (default ``wait_limit``). Returns the last answer."""
        limit = self.wait_limit if limit is None else limit
        return self._drive(self._wait(answer.operation_id, answer, limit))

    def report(self, event: dict) -> None:
        """Queue an event for the background sender (kept in the buffer until delivered)."""
        self.buffer.append([event])
        if self._thread is not None and len(self.buffer) >= self.batch_size:
            self._wake.set()

    def report_now(self, event: dict) -> CallAnswer | None:
        """Send one event now (``POST /api/v1/events``) and return callgate's answer for it,
        read with ``GET /api/v1/events/{event_id}`` once callgate has applied it. When callgate
        cannot be reached (or earlier events are still waiting, to keep their order) the event
        is buffered and ``None`` is returned; ``None`` too when it was stored but not applied
        within ``answer_timeout`` seconds. For a moment after callgate was found unreachable
        (``OFFLINE_BACKOFF``: 1 s doubling to 30 s, full jitter) events are buffered without
        trying it again, so an agent that is offline keeps its pace. Raises ``CallgateError`` when callgate rejects the
        event, on receipt (a 207 item) or when applying it."""
        return self._drive(self.report_now_steps(event))

    def flush(self) -> int:
        """Send buffered events in batches until the buffer is empty or callgate is unavailable.

        Returns the number of events delivered (accepted or duplicate). Rejected events (a 207
        item with ``status: rejected``, or a 4xx for a single event) are logged and dropped;
        on 5xx/connection errors events stay buffered for the next flush.
        """
        with self._flush_lock:
            return self._drive(self.flush_steps())

    def run(
        self,
        format: Format,
        call: Any,
        execute: Callable[[dict, str], Any],
        **options: Any,
    ) -> RunResult:
        """Check ``call`` at the gate, execute it (``execute(arguments, operation_id)``) when
        allowed, report the attempt, and follow the route until the call is settled.

        ``execute`` returns the tool's result or raises; the attempt's cause is read from the
        exception (``errors.failure_cause``: ``ToolFailure`` states it exactly). ``options``:
        ``request_id``, ``operation_id``, ``conversation_id``, ``trace_id``, ``actor`` (default:
        the ``request_context``), ``timeout`` (seconds per execution, default
        ``execute_timeout``; ``None`` runs it inline without a limit; a timeout is reported as
        ``outcome: timeout`` with ``sent: null``), ``wait_limit`` (seconds to wait for a
        reconciliation or a decision), ``gated`` (the gate's answer when the caller already
        asked it: the gate is not asked again).

        Never raises for tool failures; raises ``CallgateError`` when callgate rejects the
        request itself, and ``CallgateUnavailable`` when the gate is down and the client is
        not ``fail_open``.
        """
        return self._drive(self.run_steps(format, call, execute, **options))

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        effect: Effect = "write",
        **options: Any,
    ) -> Any:
        """Decorator: a gated tool (see ``callgate_sdk.tools``). ``effect``, ``idempotent``,
        ``reconcile`` (URL template with ``{operation_id}``), ``requires_approval``,
        ``max_attempts``, ``max_reasks``, ``retry``, ``sensitive_fields``, ``name``,
        ``description`` describe the contract, registered on the first call (or by
        ``.register()``); ``timeout`` and ``wait_limit`` are ``run``'s.

        Calling the tool returns the function's result, or the stored receipt for a duplicate,
        and raises ``CallNotAllowed`` (with the observation) otherwise. An ``async def`` tool
        gives an ``async`` gated tool; the protocol then runs in a worker thread."""

        def wrap(function: Callable[..., Any]) -> Any:
            run_options: dict[str, Any] = {
                k: options.pop(k) for k in ("timeout", "wait_limit") if k in options
            }
            spec = ToolSpec.of(function, effect=effect, **options)
            return GatedTool(self, spec, run_options)

        return wrap(fn) if fn is not None else wrap


class AsyncCallgateClient(Protocol):
    """The asyncio client: ``CallgateClient``'s methods as coroutines, on one
    ``httpx.AsyncClient``. ``transport``: an ``httpx.AsyncBaseTransport``. A sync tool
    runs in a worker thread (``asyncio.to_thread``), an async one on the loop; a timed-out
    async tool is cancelled. ``async with`` (or ``start()``) runs the background flusher
    every ``flush_interval`` seconds; ``aclose()`` stops it and flushes."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 10.0,
        flush_interval: float | None = 2.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        **options: Any,
    ):
        super().__init__(**options)
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.base_url, transport=transport, timeout=timeout, headers=_headers(api_key)
        )
        self.sleep = sleep
        self.flush_interval = flush_interval
        self._flush_lock: asyncio.Lock | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    # ---------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> AsyncCallgateClient:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def start(self) -> None:
        """Start the background flusher on the running loop (no-op without ``flush_interval``)."""
        if self.flush_interval is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._flush_loop())

    async def aclose(self, *, flush: bool = True) -> None:
        """Stop the flusher, try a last flush, close the connection pool."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if flush:
            await self.flush()
        await self._http.aclose()

    def _event(self) -> asyncio.Event:
        if self._wake is None:
            self._wake = asyncio.Event()
        return self._wake

    async def _flush_loop(self) -> None:
        wake = self._event()
        while True:
            try:
                await asyncio.wait_for(wake.wait(), self.flush_interval)
            except TimeoutError:
                pass
            wake.clear()
            try:
                await self.flush()
            except Exception:  # never let the flusher die
                logger.exception("callgate event flush failed")

    # ---------------------------------------------------------------- the effects

    async def _drive(self, steps: Steps[Any]) -> Any:
        value: Any = None
        error: Exception | None = None
        while True:
            try:
                effect = steps.throw(error) if error is not None else steps.send(value)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            try:
                value = await self._perform(effect)
            except Exception as exc:
                error = exc

    async def _perform(self, effect: Any) -> Any:
        if isinstance(effect, Http):
            if effect.body is None:
                return await self._http.request(effect.method, effect.path)
            return await self._http.request(effect.method, effect.path, json=effect.body)
        if isinstance(effect, Sleep):
            return await self.sleep(effect.seconds)
        if isinstance(effect, Execute):
            return await self._execute_now(effect)
        if isinstance(effect, Flush):
            return await self.flush()
        raise TypeError(f"unknown effect {effect!r}")

    @staticmethod
    async def _execute_now(effect: Execute) -> Any:
        fn = effect.fn
        token = _operation.set(effect.operation_id)  # copied into the task / the thread
        try:
            if inspect.iscoroutinefunction(fn):
                task = asyncio.ensure_future(fn(effect.arguments, effect.operation_id))
            else:
                task = asyncio.ensure_future(
                    asyncio.to_thread(fn, effect.arguments, effect.operation_id)
                )
        finally:
            _operation.reset(token)
        if effect.timeout is None:
            return await task
        done, _ = await asyncio.wait({task}, timeout=effect.timeout)
        if not done:
            task.cancel()
            raise _timed_out(effect.timeout)
        return task.result()

    # ---------------------------------------------------------------- the API

    async def register_tool(self, name: str, **contract: Any) -> ToolRegistration:
        """``CallgateClient.register_tool``."""
        return await self._drive(self.register_tool_steps(name, **contract))

    async def check(self, format: Format, call: Any, **keys: Any) -> CallAnswer:
        """``CallgateClient.check``."""
        return await self._drive(self.check_steps(format, call, **keys))

    async def check_turn(self, format: Format, response: Any, **keys: Any) -> list[CallAnswer]:
        """``CallgateClient.check_turn``."""
        return await self._drive(self.check_turn_steps(format, response, **keys))

    async def get_call(self, operation_id: str) -> CallAnswer:
        """``CallgateClient.get_call``."""
        return await self._drive(self.get_call_steps(operation_id))

    async def wait(self, answer: CallAnswer, *, limit: float | None = None) -> CallAnswer:
        """``CallgateClient.wait``."""
        limit = self.wait_limit if limit is None else limit
        return await self._drive(self._wait(answer.operation_id, answer, limit))

    def report(self, event: dict) -> None:
        """``CallgateClient.report`` (the flusher started by ``start()`` sends it)."""
        self.buffer.append([event])
        if len(self.buffer) >= self.batch_size and self._task is not None:
            self._event().set()

    async def report_now(self, event: dict) -> CallAnswer | None:
        """``CallgateClient.report_now``."""
        return await self._drive(self.report_now_steps(event))

    async def flush(self) -> int:
        """``CallgateClient.flush``."""
        if self._flush_lock is None:
            self._flush_lock = asyncio.Lock()
        async with self._flush_lock:
            return await self._drive(self.flush_steps())

    async def run(
        self,
        format: Format,
        call: Any,
        execute: Callable[[dict, str], Any],
        **options: Any,
    ) -> RunResult:
        """``CallgateClient.run``; ``execute`` may be a coroutine function."""
        return await self._drive(self.run_steps(format, call, execute, **options))

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        effect: Effect = "write",
        **options: Any,
    ) -> Any:
        """``CallgateClient.tool``; the gated tool is always a coroutine function (a sync
        function runs in a worker thread)."""

        def wrap(function: Callable[..., Any]) -> Any:
            run_options: dict[str, Any] = {
                k: options.pop(k) for k in ("timeout", "wait_limit") if k in options
            }
            spec = ToolSpec.of(function, effect=effect, **options)
            return AsyncGatedTool(self, spec, run_options)

        return wrap(fn) if fn is not None else wrap


# --------------------------------------------------------------------------- gated tools


class GatedTool:
    """A function behind ``CallgateClient``: call it as the function. ``spec`` is its contract;
    ``register()`` registers it now (otherwise on the first call)."""

    def __init__(self, client: CallgateClient, spec: ToolSpec, run_options: dict[str, Any]):
        self.client = client
        self.spec = spec
        self.name = spec.name
        self.run_options = run_options
        self._registration = Registration()
        functools.update_wrapper(self, spec.fn)

    def register(self) -> ToolRegistration | None:
        """Register the contract unless done; ``None`` when it was done before, or when
        callgate is down and the client is ``fail_open`` (tried again on the next call)."""
        with self._registration.lock:
            if self._registration.done:
                return None
            try:
                registration = self.client.register_tool(self.spec.name, **self.spec.contract())
            except CallgateUnavailable:
                if not self.client.fail_open:
                    raise
                self.client.tools.setdefault(self.spec.name, self.spec.tool_info())
                logger.warning("callgate unavailable: %s not registered yet", self.spec.name)
                return None
            self._registration.done = True
            return registration

    def run(self, *args: Any, **kwargs: Any) -> RunResult:
        """The call's whole ``RunResult`` (never raises ``CallNotAllowed``)."""
        self.register()
        if self.spec.is_async:
            raise TypeError(f"{self.name} is async: await it (or use AsyncCallgateClient)")
        return self.client.run(
            "plain", self.spec.proposal(args, kwargs), self._execute, **self.run_options
        )

    def _execute(self, arguments: dict, operation_id: str) -> Any:
        return self.spec.fn(**self.spec.call_arguments(arguments, operation_id))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.spec.is_async:
            return self._call_async(args, kwargs)
        return _outcome(self.run(*args, **kwargs))

    async def _call_async(self, args: tuple, kwargs: dict) -> Any:
        loop = asyncio.get_running_loop()

        def execute(arguments: dict, operation_id: str) -> Any:
            coroutine = self.spec.fn(**self.spec.call_arguments(arguments, operation_id))
            return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

        def run() -> RunResult:
            self.register()
            proposal = self.spec.proposal(args, kwargs)
            return self.client.run("plain", proposal, execute, **self.run_options)

        return _outcome(await asyncio.to_thread(run))


class AsyncGatedTool:
    """A function behind ``AsyncCallgateClient``: ``await tool(...)``."""

    def __init__(self, client: AsyncCallgateClient, spec: ToolSpec, run_options: dict[str, Any]):
        self.client = client
        self.spec = spec
        self.name = spec.name
        self.run_options = run_options
        self._registered = False
        self._lock = asyncio.Lock()
        functools.update_wrapper(self, spec.fn)

    async def register(self) -> ToolRegistration | None:
        """``GatedTool.register``."""
        async with self._lock:
            if self._registered:
                return None
            try:
                registration = await self.client.register_tool(
                    self.spec.name, **self.spec.contract()
                )
            except CallgateUnavailable:
                if not self.client.fail_open:
                    raise
                self.client.tools.setdefault(self.spec.name, self.spec.tool_info())
                logger.warning("callgate unavailable: %s not registered yet", self.spec.name)
                return None
            self._registered = True
            return registration

    async def run(self, *args: Any, **kwargs: Any) -> RunResult:
        """The call's whole ``RunResult`` (never raises ``CallNotAllowed``)."""
        await self.register()
        spec = self.spec
        execute: Callable[[dict, str], Any]  # a coroutine function for an async tool
        if spec.is_async:

            async def execute(arguments: dict, operation_id: str) -> Any:
                return await spec.fn(**spec.call_arguments(arguments, operation_id))
        else:

            def execute(arguments: dict, operation_id: str) -> Any:
                return spec.fn(**spec.call_arguments(arguments, operation_id))

        return await self.client.run(
            "plain", spec.proposal(args, kwargs), execute, **self.run_options
        )

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _outcome(await self.run(*args, **kwargs))


def _outcome(result: RunResult) -> Any:
    """The tool's result (or the stored receipt), or ``CallNotAllowed``."""
    if result.ok:
        return result.result
    raise CallNotAllowed(result)


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
