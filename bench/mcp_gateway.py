"""MCP gateway benchmark (PostgreSQL): the gateway's own cost per ``tools/call``.

Usage:  DATABASE_URL=postgres://postgres@127.0.0.1:5432/callgate_bench python bench/mcp_gateway.py [--calls 200]

Starts the test upstream MCP server (``tests/mcp_gateway/upstream.py``, FastMCP over
Streamable HTTP) and ``manage.py mcp_gateway`` in front of it (two subprocesses on loopback),
then times, in one run and interleaved, the same real ``mcp`` client ``tools/call`` (one
client session each, calls one after the other):

  1. straight to the upstream;
  2. through the gateway, each call new (the gate: validation, the proposed event, the
     upstream call with its operation ID, the attempt reported and classified);
  3. through the gateway, a repeat of a succeeded call (answered from its stored receipt,
     nothing sent upstream).

Prints p50 and p99 latency of each in milliseconds, and the gateway's cost per call
(gateway p50 minus direct p50).
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "callgate.settings")
os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))

import anyio  # noqa: E402
import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402

from callgate.auth import api_key_issue  # noqa: E402
from callgate.models import Agent, Project  # noqa: E402

UPSTREAM = ROOT / "tests" / "mcp_gateway" / "upstream.py"
for noisy in ("httpx", "mcp"):  # one line per request otherwise
    logging.getLogger(noisy).setLevel(logging.WARNING)


def wait_for_port(port: int, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"{what} exited with {process.returncode}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    sys.exit(f"{what} did not listen on {port}")


async def timed_calls(
    url: str, key: str | None, arguments: list[dict], tool: str, request_id: str | None = None
) -> list[float]:
    """Seconds per call of ``tool`` with each of ``arguments`` over one client session, under
    callgate's ``request_id`` when given (``_meta.request_id``)."""
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        await session.list_tools()
        times = []
        for args in arguments:
            started = time.perf_counter()
            meta = {"request_id": request_id} if request_id else None
            result = await session.call_tool(tool, args, meta=meta)
            times.append(time.perf_counter() - started)
            if result.isError:
                sys.exit(f"{tool} {args} failed: {result.content}")
        return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200, help="calls per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--upstream-port", type=int, default=8233)
    parser.add_argument("--gateway-port", type=int, default=8234)
    options = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("bench/mcp_gateway.py needs PostgreSQL: set DATABASE_URL=postgres://…")
    call_command("migrate", verbosity=0)
    project = Project.objects.create(slug=f"bench-{uuid.uuid4().hex[:8]}", name="bench")
    agent = Agent.objects.create(project=project, name="bench-agent")
    key = api_key_issue(agent=agent).plain
    connection.close()

    upstream_url = f"http://127.0.0.1:{options.upstream_port}/mcp"
    gateway_url = f"http://127.0.0.1:{options.gateway_port}/mcp"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    upstream = subprocess.Popen(
        [sys.executable, str(UPSTREAM), "--http", str(options.upstream_port)], **quiet
    )
    gateway = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "manage.py"),
            "mcp_gateway",
            "--project",
            project.slug,
            "--upstream",
            f"shop={upstream_url}",
            "--bind",
            f"127.0.0.1:{options.gateway_port}",
        ],
        **quiet,
    )
    try:
        wait_for_port(options.upstream_port, upstream, "the upstream")
        wait_for_port(options.gateway_port, gateway, "the gateway")
        direct, gated, receipts = [], [], []
        for round_no in range(options.rounds + 1):  # round 0 warms up
            fresh = [{"order_id": f"R{round_no}-{i}"} for i in range(options.calls)]
            d = anyio.run(timed_calls, upstream_url, None, fresh, "lookup_order")
            request_id = f"bench-{uuid.uuid4().hex}"
            g = anyio.run(timed_calls, gateway_url, key, fresh, "lookup_order", request_id)
            # the same calls in the same request again: answered from their receipts
            r = anyio.run(timed_calls, gateway_url, key, fresh, "lookup_order", request_id)
            if round_no:
                direct += d
                gated += g
                receipts += r
    finally:
        for process in (gateway, upstream):
            process.terminate()
            process.wait(timeout=15)
    rows = [
        ("direct to upstream", direct),
        ("through the gateway", gated),
        ("repeat (receipt)", receipts),
    ]
    print(f"tools/call latency, {len(direct)} calls each, ms")
    print(f"{'':24} {'p50':>8} {'p99':>8}")
    for label, values in rows:
        print(
            f"{label:24} {1000 * statistics.median(values):8.2f} {1000 * percentile(values, 0.99):8.2f}"
        )
    cost = statistics.median(gated) - statistics.median(direct)
    print(
        f"gateway cost per call (p50): {1000 * cost:.2f} ms "
        f"({statistics.median(gated) / statistics.median(direct):.1f}x direct)"
    )


if __name__ == "__main__":
    main()
