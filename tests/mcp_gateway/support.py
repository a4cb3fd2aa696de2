"""Helpers of the MCP gateway's tests: a real gateway (``mcp_gateway.server.Gateway`` under
uvicorn, in a thread, on a loopback port) in front of a real upstream MCP server
(``tests/mcp_gateway/upstream.py``, a stdio subprocess or Streamable HTTP), and a real MCP
client (``mcp.ClientSession`` over ``streamablehttp_client``)."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import uvicorn
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from mcp_gateway import services
from mcp_gateway.pool import UpstreamSpec
from mcp_gateway.server import Gateway

UPSTREAM = Path(__file__).with_name("upstream.py")


def free_port() -> int:
    """A loopback TCP port the kernel has just handed out and nobody listens on (fixed ports
    collided with another test run on the same machine: "address already in use")."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def upstream_command(**env: str) -> str:
    """The stdio command line of the test upstream, with its settings (``UPSTREAM_LOG`` …) in
    its environment (the SDK starts stdio servers with a minimal environment)."""
    settings = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
    return f"env {settings} {sys.executable} {UPSTREAM}"


class UpstreamLog:
    """The JSON-lines file the test upstream appends every call that reached it to."""

    def __init__(self):
        handle, self.path = tempfile.mkstemp(prefix="mcp-upstream-", suffix=".jsonl")
        os.close(handle)

    def calls(self, tool: str | None = None) -> list[dict]:
        lines = Path(self.path).read_text().splitlines()
        return [
            json.loads(x) for x in lines if x and (tool is None or json.loads(x)["tool"] == tool)
        ]

    def remove(self) -> None:
        Path(self.path).unlink(missing_ok=True)


class RunningGateway:
    """A ``Gateway`` served by uvicorn in a thread at ``url``; ``stop()`` ends it."""

    def __init__(
        self,
        *,
        project,
        upstreams: dict[str, str],
        timeout: float = 10.0,
        port: int | None = None,
        overrides: dict | None = None,
    ):
        specs = []
        for name, target in upstreams.items():
            row = services.upstream_configure(
                project=project,
                name=name,
                target=target,
                timeout_seconds=timeout,
                tool_overrides=overrides or {},
            )
            specs.append(
                UpstreamSpec(
                    name=name, transport=row.transport, target=target, timeout=timeout, pk=row.pk
                )
            )
        self.gateway = Gateway(project=project, specs=specs)
        port = port or free_port()
        self.url = f"http://127.0.0.1:{port}/mcp"
        config = uvicorn.Config(
            self.gateway.http_app(),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the MCP gateway did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


@asynccontextmanager
async def mcp_client(url: str, key: str, *, name: str = "test-client"):
    """A real MCP client session with ``Authorization: Bearer <key>``."""
    from mcp import types

    headers = {"Authorization": f"Bearer {key}"}
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as (read, write, _),
    ):
        async with ClientSession(
            read, write, client_info=types.Implementation(name=name, version="1.0")
        ) as session:
            await session.initialize()
            yield session


def run(coro_fn, *args):
    """Run an async test body to completion (in this thread)."""
    return anyio.run(coro_fn, *args)


class HttpUpstream:
    """The test upstream as a Streamable HTTP server in a subprocess at ``url``."""

    def __init__(self, log: UpstreamLog, port: int | None = None):
        self.log, self.port = log, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(UPSTREAM), "--http", str(self.port)],
            env={**os.environ, "UPSTREAM_LOG": self.log.path},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("the HTTP upstream did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None
