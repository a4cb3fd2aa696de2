"""callgate for LangChain and LangGraph (``pip install 'callgate-sdk[langchain]'``).

``gate_tool(client, tool, effect="write", ...)`` wraps a ``BaseTool`` so that every call (a
LangGraph ``ToolNode`` included) goes through callgate: the gate sees the model's arguments
as proposed (the wrapper's ``args_schema`` is the tool's JSON Schema, so LangChain does not
refuse a bad call before callgate can re-ask it), the tool runs once under the operation ID,
the attempt is reported with the cause read from the exception, and a call that did not
succeed comes back to the model as a ``ToolMessage`` with ``status="error"`` whose content is
callgate's observation (a duplicate's content is the stored receipt).

``CallgateCallbackHandler(client)`` only observes: it reports the tools that are not gated
(``on_tool_start`` a proposal, ``on_tool_end`` / ``on_tool_error`` the attempt), buffered and
sent in the background.

Works with ``CallgateClient`` (``invoke``) and ``AsyncCallgateClient`` (``ainvoke``). The
request ID is the ``request_context``'s, else ``configurable["callgate_request_id"]``.
"""

from __future__ import annotations

import contextvars
import json
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, ToolException
from pydantic import BaseModel, ConfigDict

from callgate_sdk._protocol import current_request, local_operation_id
from callgate_sdk.client import AsyncCallgateClient, CallgateClient
from callgate_sdk.errors import failure_cause
from callgate_sdk.models import Effect, RunResult
from callgate_sdk.providers import normalise

GATED = "callgate_gated"
_call_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "callgate_langchain_call_id", default=None
)


def _request_id(config: RunnableConfig | None) -> str | None:
    configurable = (config or {}).get("configurable") or {}
    return current_request().get("request_id") or configurable.get("callgate_request_id")


def _content(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


class CallgateTool(BaseTool):
    """A ``BaseTool`` behind callgate (build it with ``gate_tool``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool
    client: Any  # CallgateClient | AsyncCallgateClient
    contract: dict[str, Any]
    registered: bool = False
    handle_tool_error: bool = True  # the observation becomes the ToolMessage's content

    def run(self, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        token = _call_id.set(kwargs.get("tool_call_id"))
        try:
            return super().run(tool_input, *args, **kwargs)
        finally:
            _call_id.reset(token)

    async def arun(self, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        token = _call_id.set(kwargs.get("tool_call_id"))
        try:
            return await super().arun(tool_input, *args, **kwargs)
        finally:
            _call_id.reset(token)

    def _proposal(self, arguments: dict) -> dict:
        return {
            "id": _call_id.get() or "",
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(arguments)},
        }

    def _answer(self, result: RunResult) -> Any:
        if result.ok:
            return result.result
        raise ToolException(result.observation or f"{self.name}: {result.status}")

    def _run(self, config: RunnableConfig, **arguments: Any) -> Any:
        client = self.client
        if not isinstance(client, CallgateClient):
            raise NotImplementedError("an AsyncCallgateClient gates ainvoke; use a CallgateClient")
        if not self.registered:
            client.register_tool(self.name, **self.contract)
            self.registered = True

        def execute(parsed: dict, operation_id: str) -> Any:
            return self.inner.invoke(parsed, config)

        call = self._proposal(arguments)
        return self._answer(client.run("openai", call, execute, request_id=_request_id(config)))

    async def _arun(self, config: RunnableConfig, **arguments: Any) -> Any:
        client = self.client
        if not isinstance(client, AsyncCallgateClient):
            return await super()._arun(config=config, **arguments)  # the sync client, in a thread
        if not self.registered:
            await client.register_tool(self.name, **self.contract)
            self.registered = True

        async def execute(parsed: dict, operation_id: str) -> Any:
            return await self.inner.ainvoke(parsed, config)

        call = self._proposal(arguments)
        result = await client.run("openai", call, execute, request_id=_request_id(config))
        return self._answer(result)


def gate_tool(
    client: CallgateClient | AsyncCallgateClient,
    tool: BaseTool,
    *,
    effect: Effect = "write",
    idempotent: bool = False,
    reconcile: str | None = None,
    requires_approval: bool = False,
    **contract: Any,
) -> CallgateTool:
    """``tool`` behind callgate; its contract is registered on the first call from the tool's
    name, description and argument schema. ``reconcile`` is the contract's ``reconcile_url``;
    ``contract``: more fields of ``register_tool`` (``max_attempts``, ``retry``, ...). The
    inner tool should raise on failure (its ``handle_tool_error`` off, the default) so that
    the cause is read from the exception."""
    schema = tool.tool_call_schema
    if not isinstance(schema, dict) and not issubclass(schema, BaseModel):
        raise TypeError(f"{tool.name}: callgate reads pydantic v2 argument schemas, not v1 ones")
    parameters = schema if isinstance(schema, dict) else schema.model_json_schema()
    parameters = {k: v for k, v in parameters.items() if k not in ("title", "description")}
    if reconcile is not None:
        contract.update(reconcilable=True, reconcile_url=reconcile)
    contract.update(
        parameters=parameters,
        description=tool.description,
        effect=effect,
        idempotent=idempotent,
        requires_approval=requires_approval,
    )
    return CallgateTool(
        name=tool.name,
        description=tool.description,
        args_schema=parameters,
        inner=tool,
        client=client,
        contract=contract,
        metadata={**(tool.metadata or {}), GATED: True},
    )


class CallgateCallbackHandler(BaseCallbackHandler):
    """Reports the calls of tools that are not gated (observe only: nothing is refused).

    On ``on_tool_start`` a ``proposed`` event (format ``plain``; the operation ID derived
    as callgate derives it from the request ID, or fresh without one); on ``on_tool_end``
    a successful attempt with the output; on ``on_tool_error`` a failed one, the cause read
    from the exception. Events go to the client's buffer (``report``), sent in the
    background. Gated tools (``gate_tool``) are skipped: they report themselves.
    """

    def __init__(self, client: CallgateClient | AsyncCallgateClient):
        self.client = client
        self._runs: dict[UUID, str] = {}

    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if (metadata or {}).get(GATED):
            return
        call = {"tool": serialized.get("name") or "", "arguments": inputs or input_str}
        keys = current_request()
        operation_id = local_operation_id(keys.get("request_id"), normalise("plain", call))
        self._runs[run_id] = operation_id
        call_id = kwargs.get("tool_call_id")
        fields = {k: v for k, v in {**keys, "call_id": call_id}.items() if v}
        self.client.report(
            self.client.event(
                "proposed", operation_id=operation_id, format="plain", call=call, **fields
            )
        )

    def _attempt(self, run_id: UUID, **body: Any) -> None:
        operation_id = self._runs.pop(run_id, None)
        if operation_id is not None:
            event = self.client.event("attempt", operation_id=operation_id, attempt=1, **body)
            self.client.report(event)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        content = getattr(output, "content", output)
        self._attempt(
            run_id,
            sent=True,
            outcome="success",
            http_status=None,
            error=None,
            result=content if isinstance(content, (str, dict, list)) else _content(content),
        )

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        outcome, sent, http_status, message = failure_cause(error)
        self._attempt(run_id, sent=sent, outcome=outcome, http_status=http_status, error=message)
