"""callgate for the OpenAI Agents SDK (``pip install 'callgate-sdk[openai-agents]'``).

``CallgateGate(client).function_tool(fn, effect="write", ...)`` is ``agents.function_tool``
with callgate in front of every call the model makes:

- a tool input guardrail asks callgate's gate; a re-ask, a denial or a stop answers the model
  with callgate's observation as the tool's output (``reject_content``), a duplicate with the
  stored receipt; the function does not run;
- with ``requires_approval=True``, the tool's ``needs_approval`` hook puts the call in
  callgate's approval queue and waits (``approval_wait`` seconds) for an operator; approved,
  the call runs; still undecided, the Agents SDK's own interruption takes over (resume the
  run later: the call then waits for callgate's decision again, never runs without it);
- the call runs once under its operation ID (``callgate_sdk.current_operation_id()`` inside
  the function), the attempt is reported with the cause read from the exception, and the
  route is followed (retries under the same operation ID, a reconciliation, a decision).
  What the model reads when it did not succeed is callgate's observation.

Requires an ``AsyncCallgateClient``. The request ID (equal arguments under one request ID are
one operation, so a repeated write is answered with the receipt or waits for the first one's
outcome) is the ``request_context``'s, else the Agents SDK's trace ID of the run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from agents import FunctionTool, RunContextWrapper, function_tool
from agents.tool_context import ToolContext
from agents.tool_guardrails import (
    ToolGuardrailFunctionOutput,
    ToolInputGuardrail,
    ToolInputGuardrailData,
)
from agents.tracing import get_current_trace

from callgate_sdk._protocol import current_request
from callgate_sdk.client import AsyncCallgateClient
from callgate_sdk.models import WAITING_VERDICTS, CallAnswer, Effect

REFUSED = frozenset({"reask", "deny", "stop"})


def _request_id() -> str | None:
    request_id = current_request().get("request_id")
    if request_id:
        return request_id
    trace = get_current_trace()
    trace_id = getattr(trace, "trace_id", None) if trace is not None else None
    return trace_id if trace_id and trace_id != "no-op" else None


def _as_output(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


class CallgateGate:
    """Gates function tools of the OpenAI Agents SDK through ``client``.

    ``approval_wait``: seconds the ``needs_approval`` hook waits for an operator before
    handing the call to the Agents SDK's interruption. The gate's answers are kept per
    provider call ID between the hook, the guardrail and the invocation of one call.
    """

    def __init__(self, client: AsyncCallgateClient, *, approval_wait: float = 60.0):
        self.client = client
        self.approval_wait = approval_wait
        self._answers: dict[str, CallAnswer] = {}
        self._registered: set[str] = set()
        self._registering: dict[str, asyncio.Lock] = {}

    def function_tool(
        self,
        fn: Callable[..., Any],
        *,
        effect: Effect = "write",
        idempotent: bool = False,
        reconcile: str | None = None,
        requires_approval: bool = False,
        name: str | None = None,
        description: str | None = None,
        **contract: Any,
    ) -> FunctionTool:
        """``agents.function_tool(fn)`` gated by callgate. ``reconcile`` is the contract's
        ``reconcile_url`` (makes it reconcilable); ``contract``: more contract fields
        (``max_attempts``, ``max_reasks``, ``retry``, ``sensitive_fields``, ...)."""
        tool = function_tool(
            fn, name_override=name, description_override=description, failure_error_function=None
        )
        if reconcile is not None:
            contract.update(reconcilable=True, reconcile_url=reconcile)
        contract.update(effect=effect, idempotent=idempotent, requires_approval=requires_approval)
        return self.gate(tool, **contract)

    def gate(self, tool: FunctionTool, **contract: Any) -> FunctionTool:
        """A copy of ``tool`` behind callgate (``contract``: the fields of ``register_tool``,
        the schema and description taken from the tool). Build it with
        ``failure_error_function=None`` (as ``function_tool`` here does) so that the cause of
        a failure is read from the exception rather than from an error string."""
        contract.setdefault("parameters", tool.params_json_schema)
        contract.setdefault("description", tool.description or "")
        guardrail: ToolInputGuardrail[Any] = ToolInputGuardrail(
            guardrail_function=self._guardrail(tool.name, contract), name="callgate"
        )
        return dataclasses.replace(
            tool,
            tool_input_guardrails=[guardrail, *(tool.tool_input_guardrails or [])],
            needs_approval=(
                self._needs_approval(tool.name, contract)
                if contract.get("requires_approval")
                else tool.needs_approval
            ),
            on_invoke_tool=self._invoke(tool, contract),
        )

    # ---------------------------------------------------------------- the gate

    async def _check(self, tool: str, contract: dict, call_id: str, arguments: str) -> CallAnswer:
        async with self._registering.setdefault(tool, asyncio.Lock()):
            if tool not in self._registered:
                await self.client.register_tool(tool, **contract)
                self._registered.add(tool)
        call = {"type": "function_call", "call_id": call_id, "name": tool, "arguments": arguments}
        keys = current_request()
        answer = await self.client.check(
            "openai_responses",
            call,
            request_id=_request_id(),
            conversation_id=keys.get("conversation_id"),
            trace_id=keys.get("trace_id"),
            actor=keys.get("actor"),
        )
        self._answers[call_id] = answer
        return answer

    def _needs_approval(self, tool: str, contract: dict):
        async def needs_approval(
            context: RunContextWrapper[Any], arguments: dict[str, Any], call_id: str
        ) -> bool:
            answer = self._answers.get(call_id) or await self._check(
                tool, contract, call_id, json.dumps(arguments)
            )
            if answer.verdict == "pending_approval":
                answer = await self.client.wait(answer, limit=self.approval_wait)
                self._answers[call_id] = answer
            return answer.verdict == "pending_approval"  # undecided: the SDK's interruption

        return needs_approval

    def _guardrail(self, tool: str, contract: dict):
        async def callgate(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
            context = data.context
            answer = self._answers.get(context.tool_call_id) or await self._check(
                tool, contract, context.tool_call_id, context.tool_arguments
            )
            info = {"operation_id": answer.operation_id, "verdict": answer.verdict}
            if answer.verdict in REFUSED:
                self._answers.pop(context.tool_call_id, None)
                return ToolGuardrailFunctionOutput.reject_content(answer.observation, info)
            if answer.verdict == "return_receipt":
                self._answers.pop(context.tool_call_id, None)
                return ToolGuardrailFunctionOutput.reject_content(_as_output(answer.receipt), info)
            return ToolGuardrailFunctionOutput.allow(info)

        return callgate

    def _invoke(self, tool: FunctionTool, contract: dict):
        inner = tool.on_invoke_tool

        async def on_invoke_tool(context: ToolContext[Any], arguments: str) -> Any:
            answer = self._answers.pop(context.tool_call_id, None)
            if answer is None:  # the guardrail did not run (a resumed, approved call)
                answer = await self._check(tool.name, contract, context.tool_call_id, arguments)
                self._answers.pop(context.tool_call_id, None)
            if answer.verdict in REFUSED or answer.verdict == "return_receipt":
                return answer.observation or _as_output(answer.receipt)

            async def execute(parsed: dict, operation_id: str) -> Any:
                return await inner(context, json.dumps(parsed))

            call = {
                "type": "function_call",
                "call_id": context.tool_call_id,
                "name": tool.name,
                "arguments": arguments,
            }
            result = await self.client.run(
                "openai_responses", call, execute, gated=answer, request_id=_request_id()
            )
            if result.ok:
                return _as_output(result.result)
            if result.status == "waiting" and answer.verdict in WAITING_VERDICTS:
                return result.observation or f"{tool.name}: waiting for callgate ({answer.verdict})"
            return result.observation or f"{tool.name}: {result.status}"

        return on_invoke_tool
