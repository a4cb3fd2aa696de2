"""Connections to the upstream MCP servers: one ``ClientSession`` per upstream, shared by
every gateway session and call (the SDK multiplexes requests by JSON-RPC ID), opened on
first use and opened again after the upstream went away (a crashed stdio process is started
again, an HTTP server is dialled again).

What a tools/call upstream can end in, as ``Outcome.kind``:

- ``result``: a ``CallToolResult`` (``isError`` or not);
- ``rpc_error``: a JSON-RPC error answer (``McpError``: code and message);
- ``timeout``: no answer within the upstream's timeout (the request was sent: unknown outcome);
- ``dropped``: the connection closed while the request was out (unknown outcome);
- ``unavailable``: the request was never sent (cannot connect, the connection was already
  closed, or an HTTP upstream refused the connection or no longer knew the MCP session; it
  answers 404 to a request of an unknown session without running it, MCP 2025-06-18 "Session
  Management"): safe to send again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import anyio
import httpx
from mcp import ClientSession, McpError, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT
from mcp.shared.message import SessionMessage

logger = logging.getLogger(__name__)

#: How long connecting and the MCP ``initialize`` handshake may take (seconds).
CONNECT_TIMEOUT = 20.0
#: ``_meta`` key of the operation ID on an upstream tools/call.
META_OPERATION_ID = "callgate/operation_id"
#: The code the SDK's Streamable HTTP client answers a request with when the server no longer
#: knows the session (HTTP 404: the request did not run).
SESSION_TERMINATED = 32600
#: How long a closed session may answer its pending requests before it is torn down (seconds).
CLOSE_GRACE = 0.2


@dataclass(frozen=True)
class UpstreamSpec:
    """Where an upstream is and how long a call may take there (seconds)."""

    name: str
    transport: str  # "http" or "stdio"
    target: str  # URL or command line
    timeout: float = 30.0
    pk: int | None = None  # the ``Upstream`` row, for health records
    overrides: dict = field(default_factory=dict, hash=False, compare=False)


@dataclass
class Outcome:
    kind: str  # result, rpc_error, timeout, dropped, unavailable
    result: types.CallToolResult | None = None
    code: int | None = None
    message: str = ""


class UpstreamUnavailable(Exception):
    """The upstream cannot be reached; nothing was sent."""


HealthFn = Callable[[UpstreamSpec, bool, str], Awaitable[None]]


class UpstreamConnection:
    """One upstream's ``ClientSession``, held open by a task of the pool's task group."""

    def __init__(self, spec: UpstreamSpec, task_group, health: HealthFn):
        self.spec, self._tg, self._health = spec, task_group, health
        self._session: ClientSession | None = None
        self._closed: anyio.Event | None = None
        self._lock = anyio.Lock()
        self.generation = 0  # how many times a session was opened
        self._stopping = False
        self._pending: dict[str, anyio.CancelScope] = {}  # operation ID → its call's scope

    async def session(self) -> ClientSession:
        """The open session; connects (again) when there is none. Raises ``UpstreamUnavailable``."""
        async with self._lock:
            if self._session is None:
                await self._connect()
            assert self._session is not None
            return self._session

    async def _connect(self) -> None:
        ready = anyio.Event()
        problem: list[str] = []
        self._tg.start_soon(self._hold, ready, problem)
        with anyio.move_on_after(CONNECT_TIMEOUT):
            await ready.wait()
        if self._session is None:
            error = problem[0] if problem else f"no answer to initialize in {CONNECT_TIMEOUT}s"
            await self._health(self.spec, False, error)
            raise UpstreamUnavailable(f"{self.spec.name}: {error}")

    @contextlib.asynccontextmanager
    async def _transport(self):
        if self.spec.transport == "stdio":
            argv = shlex.split(self.spec.target)
            async with stdio_client(StdioServerParameters(command=argv[0], args=argv[1:])) as s:
                yield s
            return
        timeout = httpx.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT)
        transport = RefusalWatch(self._refused)
        async with (
            httpx.AsyncClient(timeout=timeout, transport=transport) as http,
            streamable_http_client(self.spec.target, http_client=http) as streams,
        ):
            yield streams

    def _refused(self, operation_id: str) -> None:
        scope = self._pending.get(operation_id)
        if scope is not None:
            scope.cancel()

    async def _hold(self, ready: anyio.Event, problem: list[str]) -> None:
        """Open the transport and the session, and keep them open until the upstream's
        messages end (it crashed or hung up) or ``close``. The upstream's read stream is
        relayed so that its end is seen at once: pending requests then fail with the SDK's
        "Connection closed" and the next call connects again."""
        closed = anyio.Event()
        try:
            async with AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport())
                read, write = streams[0], streams[1]
                relay_in, relay_out = anyio.create_memory_object_stream[SessionMessage | Exception](
                    100
                )
                tg = await stack.enter_async_context(anyio.create_task_group())

                async def relay() -> None:
                    try:
                        async with relay_in:
                            async for message in read:
                                await relay_in.send(message)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        pass
                    finally:
                        closed.set()

                tg.start_soon(relay)
                session = await stack.enter_async_context(ClientSession(relay_out, write))
                with anyio.fail_after(CONNECT_TIMEOUT):
                    await session.initialize()
                self._session, self._closed = session, closed
                self.generation += 1
                ready.set()
                await self._health(self.spec, True, "")
                await closed.wait()
                self._session = None
                # let the session answer its pending requests "Connection closed" before it
                # is torn down (its receive loop sees the end of the relay first)
                await anyio.sleep(CLOSE_GRACE)
                tg.cancel_scope.cancel()
        except Exception as exc:  # the transport failed: a refused connection, a bad command
            text = _error_text(exc)
            problem.append(text)
            logger.warning("upstream %s: %s", self.spec.name, text)
        finally:
            self._session = None
            closed.set()
            ready.set()
        if problem or (self.generation and not self._stopping):
            error = problem[0] if problem else "the upstream closed the connection"
            await self._health(self.spec, False, error)

    def close(self, *, stopping: bool = False) -> None:
        """Close the session; the next call opens a new one (unless the gateway is
        ``stopping``)."""
        self._stopping = self._stopping or stopping
        if self._closed is not None:
            self._closed.set()

    async def list_tools(self) -> list[types.Tool]:
        session = await self.session()
        tools, cursor = [], None
        while True:
            with anyio.fail_after(self.spec.timeout):
                page = await session.list_tools(
                    params=types.PaginatedRequestParams(cursor=cursor) if cursor else None
                )
            tools.extend(page.tools)
            cursor = page.nextCursor
            if not cursor:
                return tools

    async def call(self, name: str, arguments: dict, *, meta: dict[str, Any]) -> Outcome:
        """One tools/call upstream, never repeated; see the module docstring for outcomes.
        ``meta`` carries the operation ID (``META_OPERATION_ID``)."""
        try:
            session = await self.session()
        except UpstreamUnavailable as exc:
            return Outcome("unavailable", message=str(exc))
        operation_id = meta.get(META_OPERATION_ID, "")
        scope = self._pending[operation_id] = anyio.CancelScope()
        try:
            with scope:  # cancelled when the HTTP upstream refuses the connection (RefusalWatch)
                result = await session.call_tool(
                    name,
                    arguments,
                    read_timeout_seconds=timedelta(seconds=self.spec.timeout),
                    meta=meta,
                )
        except McpError as exc:
            if exc.error.code == types.CONNECTION_CLOSED:
                self.close()
                return Outcome("dropped", message=exc.error.message)
            if exc.error.code == SESSION_TERMINATED:
                self.close()
                return Outcome("unavailable", message=f"{self.spec.name}: MCP session ended")
            if exc.error.code == 408 and exc.error.message.startswith("Timed out while waiting"):
                return Outcome("timeout", message=f"no answer in {self.spec.timeout:g}s")
            return Outcome("rpc_error", code=exc.error.code, message=exc.error.message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            self.close()
            return Outcome("unavailable", message=f"{self.spec.name}: connection closed")
        finally:
            self._pending.pop(operation_id, None)
        if scope.cancelled_caught:
            self.close()
            return Outcome("unavailable", message=f"{self.spec.name}: connection refused")
        return Outcome("result", result=result)


class RefusalWatch(httpx.AsyncBaseTransport):
    """httpx's transport, telling ``refused(operation_id)`` when the POST of a tools/call
    could not connect: that request never reached the upstream."""

    def __init__(self, refused: Callable[[str], None]):
        self._inner = httpx.AsyncHTTPTransport()
        self._refused = refused

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self._inner.handle_async_request(request)
        except httpx.ConnectError:
            if request.method == "POST":
                operation_id = _operation_id_of(request.content)
                if operation_id:
                    self._refused(operation_id)
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


def _operation_id_of(body: bytes) -> str | None:
    """The operation ID in a JSON-RPC tools/call body's ``params._meta``, if any."""
    try:
        message = json.loads(body)
        return message["params"]["_meta"][META_OPERATION_ID]
    except (ValueError, KeyError, TypeError):
        return None


def _error_text(exc: BaseException) -> str:
    """The innermost message of an exception (task groups wrap them in groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:1000]
