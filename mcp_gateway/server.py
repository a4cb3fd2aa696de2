"""The MCP gateway: an MCP server (the official SDK's low-level ``Server``) whose tools are the
union of its upstream MCP servers' tools, and whose every ``tools/call`` goes through
callgate's gate exactly as ``POST /api/v1/calls`` does (``callgate.services.gate_check``).

One ``tools/call``, step by step (DESIGN "The seven steps of a tool call"):

1. The caller is the agent of the callgate API key in ``Authorization: Bearer`` (Streamable
   HTTP; the SDK's bearer middleware) or given to the command (stdio).
2. The call is proposed to the gate as an MCP ``tools/call`` (format ``mcp``), with the
   request ID of ``_meta.request_id`` or, without one, one per MCP session
   (``mcp-session:<session ID>``); the session ID and the client's ``clientInfo`` travel in
   the recorded call's ``params._meta``.
3. The verdict decides: a re-ask, a denial or any refusal is answered as a ``CallToolResult``
   with ``isError: true`` and callgate's observation as its text (what MCP clients show the
   model); a duplicate of a succeeded write is answered with its stored result
   (``return_receipt``) and nothing is sent upstream; a call that needs approval waits for an
   operator's decision in the review queue (progress notifications while it waits, up to the
   contract's approval timeout).
4. An allowed call is sent upstream ONCE, with the operation ID in ``_meta``
   (``callgate/operation_id``) and the upstream's timeout.
5. What came back (a result, ``isError``, a JSON-RPC error, a timeout, a dropped connection)
   is reported as the call's attempt (``callgate.services.attempt_report``, the path of
   ``POST /api/v1/events``) and classified. The gateway sends the call again only when the
   first attempt was never sent (the upstream could not be reached) and callgate says retry;
   an unknown outcome is never retried here (callgate reconciles it or an operator reviews it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections
from django.utils import timezone
from mcp import types
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import Route

from callgate import services as core
from callgate.auth import api_key_verify
from callgate.inbox import EventRefused
from callgate.ingest import call_answer
from callgate.lifecycle import IllegalTransition
from callgate.models import ApiKey, Project, ToolCall
from callgate.schemas import AttemptEvent, ContractIn, GateRequest
from callgate.selectors import call_by_operation
from callgate_sdk.wire import edited_arguments
from mcp_gateway import services
from mcp_gateway.pool import META_OPERATION_ID, Outcome, UpstreamConnection, UpstreamSpec

logger = logging.getLogger(__name__)

#: How often a call waiting for approval looks at its state, and sends progress (seconds).
APPROVAL_POLL = 0.5
#: The longest backoff the gateway sleeps before sending a call that was never sent (seconds).
MAX_RETRY_SLEEP = 5.0
#: Steps of one tools/call (gate, waits, attempts): a bound against a loop, never reached.
MAX_STEPS = 20
#: Re-list the upstreams' tools on a client's tools/list at most this often (seconds).
TOOLS_REFRESH = 5.0


def db(fn):
    """``fn`` (Django ORM code) run in Django's thread, awaitable."""

    def run(*args, **kwargs):
        close_old_connections()
        return fn(*args, **kwargs)

    return sync_to_async(run, thread_sensitive=True)


@dataclass(frozen=True)
class ToolRoute:
    """Where an exposed tool name goes: an upstream and the tool's name there."""

    connection: UpstreamConnection
    name: str
    tool: types.Tool
    contract: ContractIn | None


class KeyVerifier:
    """The SDK's ``TokenVerifier`` for callgate API keys of one project."""

    def __init__(self, project: Project):
        self.project_id = project.pk

    async def verify_token(self, token: str) -> AccessToken | None:
        key = await db(api_key_verify)(token)
        if key is None or key.project_id != self.project_id:
            return None
        return AccessToken(token=token, client_id=str(key.pk), scopes=[])


class Gateway:
    """An MCP server in front of ``specs`` for ``project``. ``api_key`` is the caller's key
    for stdio (one client); over HTTP each request names its own."""

    def __init__(
        self, *, project: Project, specs: list[UpstreamSpec], api_key: ApiKey | None = None
    ):
        self.project, self.specs = project, specs
        self.stdio_key = api_key
        self.connections: dict[str, UpstreamConnection] = {}
        self.routes: dict[str, ToolRoute] = {}
        self.server: Server = Server("callgate-mcp-gateway")
        self._keys: dict[str, ApiKey] = {}  # by the SDK's client_id (the key's pk)
        self._joined: dict[int, int] = {}  # agent ID → tools generation it joined
        self._generation = 0
        self._refreshed = 0.0
        self._refresh_lock = anyio.Lock()
        self._inflight: dict[str, anyio.Event] = {}
        self._stdio_sessions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.server.list_tools()(self.list_tools)
        self.server.call_tool(validate_input=False)(self.call_tool)

    # --- upstreams ------------------------------------------------------------------------

    def start(self, task_group) -> None:
        self.connections = {
            spec.name: UpstreamConnection(spec, task_group, self._health) for spec in self.specs
        }

    def close(self) -> None:
        for connection in self.connections.values():
            connection.close(stopping=True)

    async def _health(self, spec: UpstreamSpec, up: bool, error: str) -> None:
        if spec.pk is not None:
            await db(services.upstream_health)(upstream_id=spec.pk, up=up, error=error)

    async def refresh_tools(self, *, force: bool = False) -> None:
        """List every upstream's tools, register their contracts, rebuild the routes. An
        upstream that cannot be reached keeps its previous routes (and shows as down)."""
        async with self._refresh_lock:
            if not force and time.monotonic() - self._refreshed < TOOLS_REFRESH:
                return
            listed: dict[str, list[types.Tool]] = {}
            for name, connection in self.connections.items():
                try:
                    listed[name] = await connection.list_tools()
                except Exception as exc:  # unreachable: keep what it had
                    logger.warning("upstream %s: tools/list failed: %s", name, exc)
                    listed[name] = [
                        r.tool for r in self.routes.values() if r.connection is connection
                    ]
            as_json = {
                name: [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
                for name, tools in listed.items()
            }
            names = services.exposed_names(as_json)
            routes: dict[str, ToolRoute] = {}
            for upstream, tools in listed.items():
                connection = self.connections[upstream]
                own = {t.name: names[(upstream, t.name)] for t in tools}
                published = await db(self._publish)(connection.spec, as_json[upstream], own)
                by_name = {t.name: t for t in tools}
                for entry in published:
                    routes[entry["exposed"]] = ToolRoute(
                        connection, entry["name"], by_name[entry["name"]], entry["contract"]
                    )
            if {k: v.contract for k, v in routes.items()} != {
                k: v.contract for k, v in self.routes.items()
            }:
                self._generation += 1
            self.routes = routes
            self._refreshed = time.monotonic()

    def _publish(self, spec: UpstreamSpec, tools: list[dict], names: dict[str, str]) -> list:
        assert spec.pk is not None  # the gateway's upstreams are Upstream rows
        return services.tools_publish(upstream_id=spec.pk, tools=tools, names=names)

    # --- MCP handlers ---------------------------------------------------------------------

    async def list_tools(self) -> list[types.Tool]:
        """The MCP ``tools/list`` handler: every upstream's tools under their exposed names."""
        await self.refresh_tools()
        return [
            route.tool.model_copy(update={"name": exposed})
            for exposed, route in self.routes.items()
        ]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """The MCP ``tools/call`` handler: always a ``CallToolResult`` (``isError`` for
        anything but the upstream's success or a stored receipt), never a JSON-RPC error."""
        ctx = self.server.request_context
        caller = await self._caller(ctx)
        if not self.routes:
            await self.refresh_tools(force=True)
        await self._join(caller)
        session_id, client = self._session_info(ctx)
        extra = (ctx.meta.model_extra or {}) if ctx.meta else {}
        request_id = extra.get("request_id")
        if not isinstance(request_id, str) or not 0 < len(request_id) <= 200:
            request_id = f"mcp-session:{session_id}"
        call = {
            "jsonrpc": "2.0",
            "id": ctx.request_id,
            "method": "tools/call",
            "params": {
                "name": name,
                "arguments": arguments,
                "_meta": {"callgate/session_id": session_id, "callgate/client": client},
            },
        }
        gate = GateRequest(format="mcp", call=call, request_id=request_id)
        try:
            return await self._run(caller, gate, name, arguments, ctx)
        except EventRefused as exc:
            return _error_result(f"callgate refused the call: {exc}", None)

    async def _run(
        self, caller: ApiKey, gate: GateRequest, name: str, arguments: dict, ctx
    ) -> types.CallToolResult:
        """The gate's verdict followed to the end (see the module docstring)."""
        found = await db(core.gate_check)(project=caller.project, agent=caller.agent, gate=gate)
        answer = found["answer"]
        unsent = False  # the last attempt never reached the upstream
        asked = True  # the answer is the gate's (the client asked), not an attempt's
        for _ in range(MAX_STEPS):
            op, verdict = answer["operation_id"], answer["verdict"]
            if verdict == "return_receipt":
                return _receipt_result(answer)
            if verdict == "pending_approval":
                answer = await self._await_decision(caller, op, ctx)
                edit = (answer["decision"] or {}).get("arguments")
                if edit is not None:  # approved with edits: run those (and its new op ID)
                    arguments = edited_arguments(edit, arguments)
                continue
            runnable = verdict == "allow" and answer["state"] == ToolCall.State.ALLOWED
            if verdict == "retry" and (asked or unsent):
                await anyio.sleep(min(float(answer["retry_after"] or 0), MAX_RETRY_SLEEP))
                runnable = True
            if not runnable:
                return _error_result(answer["observation"] or answer["reason"] or verdict, answer)
            if op in self._inflight:  # the same operation is out upstream: wait, then ask again
                await self._inflight[op].wait()
                # (a new event: the gate request has no event_id, so each check gets its own)
                found = await db(core.gate_check)(
                    project=caller.project, agent=caller.agent, gate=gate
                )
                answer = found["answer"]
                continue
            done = self._inflight[op] = anyio.Event()
            try:
                # shielded: a client that cancels or hangs up does not stop the call it started
                # from being reported (the upstream's timeout bounds the wait)
                with anyio.CancelScope(shield=True):
                    outcome = await self._send(name, arguments, op)
                    answer = await db(core.attempt_report)(
                        project=caller.project,
                        agent=caller.agent,
                        attempt=_attempt_event(op, gate.request_id, outcome),
                    )
            finally:
                del self._inflight[op]
                done.set()
            if answer["state"] == ToolCall.State.SUCCEEDED and outcome.result is not None:
                return _with_meta(outcome.result, op, answer)
            unsent, asked = outcome.kind == "unavailable", False
            if not (answer["verdict"] == "retry" and unsent):
                return _error_result(answer["observation"] or outcome.message, answer)
        return _error_result("The call did not settle; see it in callgate.", answer)

    async def _send(self, name: str, arguments: dict, op: str) -> Outcome:
        route = self.routes.get(name)
        if route is None:
            return Outcome("unavailable", message=f"no upstream serves {name!r} now")
        outcome = await route.connection.call(route.name, arguments, meta={META_OPERATION_ID: op})
        if outcome.kind != "result":  # the upstream answered (up) or could not be reached
            up = outcome.kind in ("rpc_error", "timeout")
            await self._health(route.connection.spec, up, _text(outcome))
        return outcome

    async def _await_decision(self, caller: ApiKey, op: str, ctx) -> dict:
        """Wait until the call is no longer ``pending_approval``: an operator decided in the
        review queue, or its approval timeout passed (then ``approval_expired`` is recorded).
        Sends ``notifications/progress`` meanwhile when the client asked for progress."""
        token = ctx.meta.progressToken if ctx.meta else None
        started = time.monotonic()
        while True:
            answer, expires_at = await db(_call_state)(caller.project, op)
            if answer["verdict"] != "pending_approval":
                return answer
            if expires_at is not None and timezone.now() >= expires_at:
                return await db(_approval_expire)(caller.project, op)
            if token is not None:
                total = (expires_at - timezone.now()).total_seconds() if expires_at else None
                waited = time.monotonic() - started
                await ctx.session.send_progress_notification(
                    token,
                    progress=waited,
                    total=waited + total if total is not None else None,
                    message=f"Waiting for an operator's approval in callgate (operation {op})",
                    related_request_id=ctx.request_id,
                )
            await anyio.sleep(APPROVAL_POLL)

    # --- identity -------------------------------------------------------------------------

    async def _caller(self, ctx) -> ApiKey:
        """The API key of the request (its agent and project): stdio's, or the one the SDK's
        bearer middleware verified (``KeyVerifier``) for this HTTP request."""
        if self.stdio_key is not None:
            return self.stdio_key
        user = getattr(ctx.request, "user", None) if ctx.request is not None else None
        token = getattr(user, "access_token", None)
        if token is None:  # RequireAuthMiddleware lets nothing else through
            raise PermissionError("no callgate API key on this request")
        key = self._keys.get(token.client_id)
        if key is None:
            key = await db(ApiKey.objects.select_related("agent", "project").get)(
                pk=int(token.client_id)
            )
            self._keys[token.client_id] = key
        return key

    async def _join(self, caller: ApiKey) -> None:
        agent = caller.agent
        if self._joined.get(agent.pk) == self._generation:
            return
        contracts = {name: r.contract for name, r in self.routes.items() if r.contract}
        await db(services.agent_tools_join)(agent=agent, contracts=contracts)
        self._joined[agent.pk] = self._generation

    def _session_info(self, ctx) -> tuple[str, dict]:
        session_id = None
        if ctx.request is not None:
            session_id = ctx.request.headers.get("mcp-session-id")
        if not session_id:
            session_id = self._stdio_sessions.setdefault(ctx.session, uuid.uuid4().hex)
        params = ctx.session.client_params
        info = params.clientInfo if params else None
        client = {"name": info.name, "version": info.version} if info else {}
        return session_id, client

    # --- transports -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The upstream connections open (lazily) and the tools listed, for the duration."""
        try:
            async with anyio.create_task_group() as tg:
                self.start(tg)
                try:
                    await self.refresh_tools(force=True)
                    yield
                finally:
                    self.close()
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await db(connections.close_all)()

    def http_app(self) -> Starlette:
        """A Starlette app serving MCP Streamable HTTP at ``/mcp`` to callgate API keys."""
        manager = StreamableHTTPSessionManager(app=self.server)

        @contextlib.asynccontextmanager
        async def lifespan(app):
            async with self.running(), manager.run():
                yield

        async def endpoint(scope, receive, send):
            await manager.handle_request(scope, receive, send)

        return Starlette(
            routes=[Route("/mcp", endpoint=RequireAuthMiddleware(endpoint, []))],
            middleware=[
                Middleware(
                    AuthenticationMiddleware, backend=BearerAuthBackend(KeyVerifier(self.project))
                ),
                Middleware(AuthContextMiddleware),
            ],
            lifespan=lifespan,
        )

    async def run_stdio(self) -> None:
        """Serve one client over stdin/stdout (desktop clients start the gateway as a command)."""
        from mcp.server.stdio import stdio_server

        async with self.running(), stdio_server() as (read, write):
            await self.server.run(read, write, self.server.create_initialization_options())


# --- helpers (Django thread) --------------------------------------------------------------


def _call_state(project: Project, op: str):
    """The call's answer and approval timeout; by the operation ID it was proposed under too
    (an operator's edit may have given it a new one)."""
    call = call_by_operation(
        calls=ToolCall.objects.select_related("contract").filter(project=project),
        operation_id=op,
    )
    if call is None:
        raise ToolCall.DoesNotExist(op)
    return call_answer(call), call.approval_expires_at


def _approval_expire(project: Project, op: str) -> dict:
    call = call_by_operation(
        calls=ToolCall.objects.select_related("contract", "agent", "project").filter(
            project=project
        ),
        operation_id=op,
    )
    if call is None:
        raise ToolCall.DoesNotExist(op)
    with contextlib.suppress(IllegalTransition):  # decided meanwhile: read that instead
        call = core.call_approval_expired(call=call)
    return _call_state(project, op)[0]


# --- results ------------------------------------------------------------------------------


def _text(outcome: Outcome) -> str:
    if outcome.kind == "rpc_error":
        return f"MCP error {outcome.code}: {outcome.message}"
    return outcome.message


def _attempt_event(op: str, request_id: str | None, outcome: Outcome) -> AttemptEvent:
    """The attempt event of one upstream call (``shared/cases/README.md`` "attempt")."""
    fields: dict[str, Any] = {"sent": True, "outcome": "success"}
    if outcome.kind == "result":
        assert outcome.result is not None  # a "result" outcome carries it
        fields.update(
            result=outcome.result.model_dump(mode="json", by_alias=True, exclude_none=True),
            result_format="mcp",
        )
    elif outcome.kind == "rpc_error":
        fields.update(outcome="error", error=_text(outcome))
    elif outcome.kind == "timeout":
        fields.update(
            sent=None, outcome="timeout", error=f"MCP tools/call timed out: {outcome.message}"
        )
    elif outcome.kind == "dropped":
        fields.update(
            sent=None,
            outcome="connection_reset",
            error=f"MCP connection dropped: {outcome.message}",
        )
    else:  # unavailable: never sent
        fields.update(
            sent=False, outcome="connection_reset", error=f"upstream unavailable: {outcome.message}"
        )
    return AttemptEvent(
        type="attempt",
        event_id=uuid.uuid4(),
        occurred_at=timezone.now(),
        operation_id=op,
        request_id=request_id,
        **fields,
    )


def _callgate_meta(answer: dict | None) -> dict:
    if not answer:
        return {}
    return {
        META_OPERATION_ID: answer["operation_id"],
        "callgate/state": answer["state"],
        "callgate/reason": answer["reason"],
        "callgate/route": answer["route"],
    }


def _with_meta(result: types.CallToolResult, op: str, answer: dict) -> types.CallToolResult:
    return result.model_copy(update={"meta": {**(result.meta or {}), **_callgate_meta(answer)}})


def _error_result(text: str, answer: dict | None) -> types.CallToolResult:
    """What MCP clients show the model for a refused or failed call (``isError: true``)."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        isError=True,
        _meta=_callgate_meta(answer) or None,
    )


def _receipt_result(answer: dict) -> types.CallToolResult:
    """The stored result of a succeeded operation (its receipt) as a ``CallToolResult``."""
    receipt = answer["receipt"]
    try:
        result = types.CallToolResult.model_validate(receipt)
    except ValueError:  # a receipt not reported by the gateway (e.g. reconciled)
        result = types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(receipt))]
        )
    meta = {**_callgate_meta(answer), "callgate/observation": answer["observation"]}
    return result.model_copy(update={"meta": {**(result.meta or {}), **meta}})
