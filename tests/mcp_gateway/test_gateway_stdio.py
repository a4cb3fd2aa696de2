"""``manage.py mcp_gateway --stdio``, as a desktop client starts it: the official SDK's
``stdio_client`` runs the command (with ``--upstream``), and the calls go through the gate."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from django.db import connection
from django.test import TransactionTestCase
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from callgate.models import ToolCall
from mcp_gateway.models import Upstream
from tests.factories import BaseTestCase
from tests.mcp_gateway.support import UpstreamLog, run, upstream_command

MANAGE = Path(__file__).resolve().parents[2] / "manage.py"

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the gateway process needs a shared database"
)


class StdioGatewayTests(TransactionTestCase):
    def setUp(self):
        BaseTestCase.setUpTestData.__func__(type(self))
        self.log = UpstreamLog()

    def tearDown(self):
        self.log.remove()

    def gateway(self, key: str) -> StdioServerParameters:
        db = connection.settings_dict
        url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
        return StdioServerParameters(
            command=sys.executable,
            args=[
                str(MANAGE),
                "mcp_gateway",
                "--project",
                self.project.slug,
                "--stdio",
                "--upstream",
                f"desk={upstream_command(UPSTREAM_LOG=self.log.path)}",
            ],
            env={
                **os.environ,
                "DATABASE_URL": url,
                "CALLGATE_API_KEY": key,
                "CELERY_BROKER_URL": "memory://",
            },
        )

    def test_the_command_serves_stdio_through_the_gate(self):
        async def body():
            async with stdio_client(self.gateway(self.key)) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    tools = (await session.list_tools()).tools
                    bad = await session.call_tool("create_ticket", {"subject": "x"})
                    good = await session.call_tool(
                        "create_ticket", {"subject": "From the desktop", "priority": 2}
                    )
                    return tools, bad, good

        tools, bad, good = run(body)
        self.assertIn("create_ticket", {t.name for t in tools})
        self.assertTrue(bad.isError)
        self.assertIn("priority", bad.content[0].text)
        self.assertFalse(good.isError, good)
        self.assertEqual(len(self.log.calls("create_ticket")), 1)
        self.assertEqual(Upstream.objects.get(project=self.project, name="desk").status, "up")
        call = ToolCall.objects.get(
            project=self.project, tool_name="create_ticket", state="succeeded"
        )
        self.assertTrue(call.request_id.startswith("mcp-session:"))
