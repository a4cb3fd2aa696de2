"""``callgate-sdk`` alone: a fresh virtual environment gets the SDK's wheel and nothing but
its dependencies (no Django, no Celery, no database driver), and gates, executes and reports
calls against a live callgate with the sync and the async client.

No network: the wheel is built offline from ``sdk/`` and the dependencies are the installed
distributions of the closure of the wheel's ``Requires-Dist``, copied file by file from this
environment (``importlib.metadata``); ``pip check`` in the fresh environment proves the
closure complete, so a dependency added to the SDK (Django, say) shows up there.
"""

from __future__ import annotations

import email.parser
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

from django.test import LiveServerTestCase
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from callgate.auth import api_key_issue
from callgate.models import Agent, Project, ToolCall

from .live import OwnPorts

SDK_DIR = Path(__file__).resolve().parents[2] / "sdk"
SERVER_ONLY = {"django", "celery", "psycopg", "djangorestframework", "kombu", "redis"}

SCRIPT = textwrap.dedent(
    '''
    import asyncio, importlib.util, json, sys
    from callgate_sdk import AsyncCallgateClient, CallgateClient, CallNotAllowed, request_context

    url, key = sys.argv[1:3]
    out = {"django_importable": importlib.util.find_spec("django") is not None}
    executions = []

    with CallgateClient(url, key, flush_interval=None, execute_timeout=10) as client:

        @client.tool(effect="write", idempotent=True)
        def add_note(ticket_id: str, text: str, operation_id: str) -> dict:
            """Add a note to a support ticket.

            Args:
                ticket_id: Ticket id, e.g. T-1042.
                text: The note's text.
            """
            executions.append(operation_id)
            return {"note_id": "N-1", "ticket_id": ticket_id}

        with request_context("req-sync"):
            out["sync_first"] = add_note("T-1", "call back tomorrow")
            out["sync_again"] = add_note("T-1", "call back tomorrow")
        out["sync_executions"] = len(executions)
        out["sync_operation_id"] = executions[0]


    async def main():
        async with AsyncCallgateClient(url, key, flush_interval=None, execute_timeout=10) as client:

            @client.tool(effect="read")
            async def lookup_ticket(ticket_id: str) -> dict:
                """Look a support ticket up.

                Args:
                    ticket_id: Ticket id, e.g. T-1042.
                """
                return {"ticket_id": ticket_id, "status": "open"}

            with request_context("req-async"):
                out["async_result"] = await lookup_ticket("T-2")
                try:
                    await lookup_ticket(ticket_id=42)  # not a string: the gate re-asks
                except CallNotAllowed as exc:
                    out["async_reask"] = {"status": exc.status, "observation": exc.observation}


    asyncio.run(main())
    print(json.dumps(out))
    '''
)


def requirements_of(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        message = email.parser.Parser().parsestr(archive.read(metadata).decode())
    return [Requirement(r) for r in message.get_all("Requires-Dist") or []]


def closure(requirements: list[Requirement]) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions the requirements need (extras and markers evaluated)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    queue = [r for r in requirements if not r.marker or r.marker.evaluate({"extra": ""})]
    while queue:
        name = canonicalize_name(queue.pop().name)
        if name in found:
            continue
        dist = importlib.metadata.distribution(name)
        found[name] = dist
        for text in dist.requires or []:
            requirement = Requirement(text)
            if not requirement.marker or requirement.marker.evaluate({"extra": ""}):
                queue.append(requirement)
    return found


class FreshVenvTests(OwnPorts, LiveServerTestCase):
    def setUp(self):
        super().setUp()
        self.project = Project.objects.create(slug="acme", name="Acme")
        self.agent = Agent.objects.create(project=self.project, name="support-bot")
        self.key = api_key_issue(agent=self.agent).plain
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = Path(self._tmp.name)

    def run_checked(self, *args: str | Path) -> str:
        done = subprocess.run(
            [str(a) for a in args], capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def test_only_the_sdk_gates_executes_and_reports_sync_and_async(self):
        # the wheel, built offline from a copy (the source tree stays clean)
        source = shutil.copytree(SDK_DIR, self.tmp / "sdk", ignore=shutil.ignore_patterns("build"))
        self.run_checked(
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            source,
            "-w",
            self.tmp / "wheels",
        )
        [wheel] = (self.tmp / "wheels").glob("callgate_sdk-*.whl")
        venv = self.tmp / "venv"
        self.run_checked(sys.executable, "-m", "venv", venv)
        python = venv / "bin" / "python"
        site = Path(
            self.run_checked(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
            .strip()
            .splitlines()[-1]
        )
        dependencies = closure(requirements_of(wheel))
        assert not set(dependencies) & SERVER_ONLY, sorted(dependencies)
        for dist in dependencies.values():
            for file in dist.files or []:
                if file.parts[0] == ".." or "__pycache__" in file.parts:
                    continue  # console scripts, byte code
                target = site / file
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(dist.locate_file(file), target)
        self.run_checked(
            python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", wheel
        )
        assert "No broken requirements" in self.run_checked(python, "-m", "pip", "check")
        installed = {
            canonicalize_name(d["name"])
            for d in json.loads(
                self.run_checked(
                    python, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"
                )
            )
        }
        assert "callgate-sdk" in installed and not installed & SERVER_ONLY, sorted(installed)

        (self.tmp / "agent.py").write_text(SCRIPT)
        out = json.loads(
            self.run_checked(python, self.tmp / "agent.py", self.live_server_url, self.key)
            .strip()
            .splitlines()[-1]
        )

        assert out["django_importable"] is False
        # sync: executed once; the repeat under the same request is answered with the receipt
        assert out["sync_first"] == {"note_id": "N-1", "ticket_id": "T-1"}
        assert out["sync_again"] == out["sync_first"] and out["sync_executions"] == 1
        note = ToolCall.objects.get(project=self.project, tool_name="add_note")
        assert note.operation_id == out["sync_operation_id"]
        assert note.state == ToolCall.State.SUCCEEDED and note.attempts == 1
        # async: a read executed and reported; a bad call re-asked with the observation
        assert out["async_result"] == {"ticket_id": "T-2", "status": "open"}
        assert out["async_reask"]["status"] == "reask"
        assert "ticket_id" in out["async_reask"]["observation"]
        lookups = ToolCall.objects.filter(project=self.project, tool_name="lookup_ticket")
        states = sorted(str(c.state) for c in lookups)
        assert ToolCall.State.SUCCEEDED in states and len(states) == 2, states
