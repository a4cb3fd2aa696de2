"""The production image and ``docker-compose.yml``.

- ``ImageContentsTests`` (no Docker needed): every local app of ``INSTALLED_APPS`` is copied
  into the image and packaged, so the image starts (alerts and the MCP gateway were left out
  once: the image failed at start-up with ``ModuleNotFoundError``).
- ``ComposeSmokeTests`` (``-m docker``): builds and starts the compose file under a project
  name of its own and a free port, waits for the web service's health check and ``/ready/``,
  creates a project and an agent key with the management commands, posts an event and waits
  until a worker applied it; ``docker compose down -v`` at the end, whatever happened.
  Skipped when no Docker engine answers (``docker info`` fails). About a minute with the
  image layers cached; a cold build takes longer (``BUILD_TIMEOUT``).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import tomllib
import unittest
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.test import SimpleTestCase

from tests.factories import WEATHER

ROOT = Path(__file__).resolve().parent.parent
#: seconds for ``up --build`` (a cold build installs npm and pip packages)
BUILD_TIMEOUT = 600
#: seconds for the web service's health check and /ready/ to pass, and for the event to apply
READY_TIMEOUT = 180
APPLY_TIMEOUT = 90


def _docker_engine() -> str:
    """Why the smoke test cannot run here, or "" when a Docker engine answers."""
    if shutil.which("docker") is None:
        return "no docker client on PATH"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "docker info did not answer within 30 s"
    if info.returncode != 0:
        return "no Docker engine answers (docker info failed)"
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0:
        return "the docker compose plugin is missing"
    return ""


class ImageContentsTests(SimpleTestCase):
    def local_apps(self) -> set[str]:
        return {app for app in settings.INSTALLED_APPS if (ROOT / app / "__init__.py").exists()}

    def test_it_copies_every_local_app_into_the_image(self):
        dockerfile = (ROOT / "Dockerfile").read_text()
        copied = set(re.findall(r"^COPY (\w+) \1$", dockerfile, flags=re.MULTILINE))
        self.assertEqual((self.local_apps() | {"demo"}) - copied, set())

    def test_it_packages_every_local_app(self):
        pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
        include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
        wanted = {f"{app}*" for app in self.local_apps() | {"demo"}}
        self.assertEqual(wanted - set(include), set())


@pytest.mark.docker
class ComposeSmokeTests(SimpleTestCase):
    @classmethod
    def setUpClass(cls):
        if why := _docker_engine():
            raise unittest.SkipTest(why)
        super().setUpClass()

    def setUp(self):
        self.name = f"callgate-smoke-{uuid.uuid4().hex[:8]}"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        # an empty env file: a developer's .env beside the compose file stays out of the test
        self.env_file = Path(tempfile.mkstemp(suffix=".env")[1])
        self.addCleanup(self.env_file.unlink)
        # the variables the compose file reads come from here alone (not the test run's own
        # DEBUG, CACHE_URL, …); the rest (PATH, DOCKER_HOST, …) pass through
        compose_file = (ROOT / "docker-compose.yml").read_text()
        interpolated = set(re.findall(r"\$\{(\w+)", compose_file))
        self.environment = {
            **{k: v for k, v in os.environ.items() if k not in interpolated},
            "SECRET_KEY": secrets.token_urlsafe(50),
            "ALLOWED_HOSTS": "localhost",
            "CALLGATE_WEB_PORT": str(self.port),
        }
        self.base = f"http://127.0.0.1:{self.port}"

    def compose(self, *args: str, timeout: float = 120) -> str:
        result = subprocess.run(
            [
                "docker",
                "compose",
                "--project-name",
                self.name,
                "--file",
                str(ROOT / "docker-compose.yml"),
                "--env-file",
                str(self.env_file),
                *args,
            ],
            cwd=ROOT,
            env=self.environment,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert result.returncode == 0, f"docker compose {' '.join(args)}: {result.stderr[-2000:]}"
        return result.stdout

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.base + path, headers={"Host": "localhost"}, timeout=10)

    def wait_for(self, what: str, check, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2)
        logs = self.compose("logs", "--tail", "40")
        self.fail(f"{what} not within {timeout:.0f} s; the services' last logs:\n{logs[-4000:]}")

    def web_health(self) -> bool:
        container = self.compose("ps", "--quiet", "web").strip()
        status = subprocess.run(
            ["docker", "inspect", "--format", "{{.State.Health.Status}}", container],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return status == "healthy"

    def test_it_starts_is_ready_and_applies_an_event(self):
        try:
            self.compose("up", "--detach", "--build", timeout=BUILD_TIMEOUT)
            self.wait_for("the web service's health check", self.web_health, READY_TIMEOUT)
            self.wait_for(
                "/ready/ answering 200",
                lambda: self.get("/ready/").status_code == 200,
                READY_TIMEOUT,
            )
            manage = ("exec", "-T", "web", "python", "manage.py")
            self.compose(*manage, "create_project", "smoke", "Smoke test")
            key = self.compose(*manage, "create_agent_key", "smoke", "smoke-agent").split()[-1]
            auth = {"Host": "localhost", "Authorization": f"Bearer {key}"}
            tool = httpx.put(f"{self.base}/api/v1/tools/get_weather", json=WEATHER, headers=auth)
            self.assertEqual(tool.status_code, 201, tool.text)
            event_id = str(uuid.uuid4())
            event = {
                "event_id": event_id,
                "occurred_at": datetime.now(UTC).isoformat(),
                "type": "proposed",
                "format": "plain",
                "call": {"tool": "get_weather", "arguments": {"city": "Oslo"}},
            }
            posted = httpx.post(f"{self.base}/api/v1/events", json=[event], headers=auth)
            self.assertEqual(posted.status_code, 200, posted.text)
            self.assertEqual(posted.json()["accepted"], 1)

            def applied() -> bool:
                answer = httpx.get(f"{self.base}/api/v1/events/{event_id}", headers=auth)
                return answer.status_code == 200 and answer.json()["status"] == "applied"

            self.wait_for("the event applied by worker-ingest", applied, APPLY_TIMEOUT)
        finally:
            self.compose("down", "--volumes", "--remove-orphans", timeout=BUILD_TIMEOUT)
