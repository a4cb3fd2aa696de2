"""A real upstream MCP server for the gateway's tests and benchmark (FastMCP, the official SDK).

Tools: ``lookup_order`` (read), ``create_ticket`` (write), ``refund`` (destructive: needs
approval), ``slow_write`` (a write that takes ``UPSTREAM_SLOW`` seconds), ``crash`` (a write
during which the process dies) and ``transfer`` (a write answered with a JSON-RPC error for a
negative amount). Every call that reaches a tool is appended to the JSON-lines
file ``UPSTREAM_LOG`` (tool, arguments, the operation ID from ``_meta``, the process ID), so a
test can count what the upstream really saw.

    python tests/mcp_gateway/upstream.py              # stdio
    python tests/mcp_gateway/upstream.py --http 8232  # Streamable HTTP at /mcp
"""

from __future__ import annotations

import json
import os
import sys
import time

import anyio
from mcp import McpError, types
from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations

mcp = FastMCP("test-upstream", log_level="WARNING")


def _log(ctx: Context, tool: str, arguments: dict) -> None:
    meta = ctx.request_context.meta
    _write(tool, arguments, (meta.model_extra or {}) if meta else {})


def _write(tool: str, arguments: dict, extra: dict) -> None:
    path = os.environ.get("UPSTREAM_LOG")
    if not path:
        return
    with open(path, "a") as out:
        out.write(
            json.dumps(
                {
                    "tool": tool,
                    "arguments": arguments,
                    "operation_id": extra.get("callgate/operation_id"),
                    "pid": os.getpid(),
                }
            )
            + "\n"
        )


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=True))
def lookup_order(order_id: str, ctx: Context) -> dict:
    """Look up an order by its ID; answers its status."""
    _log(ctx, "lookup_order", {"order_id": order_id})
    return {"order_id": order_id, "status": "shipped"}


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False))
def create_ticket(subject: str, priority: int, ctx: Context) -> dict:
    """Open a support ticket with a subject and a priority from 1 (low) to 3 (high)."""
    _log(ctx, "create_ticket", {"subject": subject, "priority": priority})
    return {"ticket": f"T-{abs(hash((subject, priority))) % 10000}", "subject": subject}


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
def refund(order_id: str, amount_cents: int, ctx: Context) -> dict:
    """Refund part of an order, in cents; money leaves the company."""
    _log(ctx, "refund", {"order_id": order_id, "amount_cents": amount_cents})
    return {"refund": f"R-{order_id}", "amount_cents": amount_cents}


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False))
async def slow_write(note: str, ctx: Context) -> dict:
    """Save a note; slow (takes UPSTREAM_SLOW seconds)."""
    _log(ctx, "slow_write", {"note": note})
    await anyio.sleep(float(os.environ.get("UPSTREAM_SLOW", "30")))
    return {"saved": note}


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False))
def crash(note: str, ctx: Context) -> dict:
    """Save a note; the server process dies while doing it."""
    _log(ctx, "crash", {"note": note})
    time.sleep(float(os.environ.get("UPSTREAM_CRASH_AFTER", "0.3")))
    os._exit(3)


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False))
def transfer(account: str, amount_cents: int) -> dict:
    """Move money to an account; the server answers a JSON-RPC error for a negative amount."""
    return {"transferred": amount_cents, "to": account}


_call_tool = mcp._mcp_server.request_handlers[types.CallToolRequest]


async def _call_tool_or_rpc_error(request: types.CallToolRequest):
    """``transfer`` with a negative amount is refused as a JSON-RPC error (-32602), the way
    low-level MCP servers refuse bad parameters (FastMCP itself answers ``isError``)."""
    arguments = request.params.arguments or {}
    if request.params.name == "transfer" and arguments.get("amount_cents", 0) < 0:
        meta = request.params.meta
        _write("transfer", arguments, (meta.model_extra or {}) if meta else {})
        raise McpError(
            types.ErrorData(code=types.INVALID_PARAMS, message="amount_cents must be positive")
        )
    return await _call_tool(request)


mcp._mcp_server.request_handlers[types.CallToolRequest] = _call_tool_or_rpc_error


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        mcp.settings.port = int(sys.argv[2])
        mcp.settings.host = "127.0.0.1"
        mcp.run("streamable-http")
    else:
        mcp.run("stdio")
