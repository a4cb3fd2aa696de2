"""Browser tests: system Chromium driven by Playwright against Django's live server.

Use ``BrowserTestCase`` (a ``StaticLiveServerTestCase``, so static files and the htmx
bundle from ``node_modules`` are served) for every test that needs a real browser::

    from tests.browser_support import BrowserTestCase

    class QueueBrowserTests(BrowserTestCase):
        def test_it_lists_open_items(self):
            self.login("alice")
            self.visit(f"/p/{self.project.slug}/review/")
            self.page.get_by_role("heading", name="Review").wait_for()
            self.screenshot("review-queue")
            self.assert_no_console_errors()

What it gives a test:

- ``self.page``: a fresh Playwright ``Page`` (own browser context, 1280×800) per test;
  the Chromium process is shared by the test class.
- The personas of ``tests.factories.BaseTestCase`` (``self.project``/``self.other_project``,
  ``self.alice`` … ``self.olga``, ``self.agent``, ``self.key`` …), rebuilt for every test
  because a live-server test cannot use a transaction per test.
- ``self.login(username)`` through the real login form; ``self.visit(path)``;
  ``self.url(path)``.
- ``self.screenshot(name)`` saves ``test-artifacts/<name>.png`` (full page) and returns the
  path; after every test the final state is saved as
  ``test-artifacts/<TestClass>.<test_method>.png`` for post-mortems.
- ``self.console_errors``: console errors and uncaught page errors (CSP violations show up
  here); ``self.assert_no_console_errors()``.

Chromium is ``/usr/bin/chromium`` (``CALLGATE_CHROMIUM`` overrides), started with
``--headless --no-sandbox --disable-gpu --disable-background-networking``. The tests are
marked ``browser``; deselect them with ``pytest -m "not browser"``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.staticfiles.testing import StaticLiveServerTestCase

from tests.factories import PASSWORD, BaseTestCase

CHROMIUM_PATH = os.environ.get("CALLGATE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS_DIR = Path(settings.BASE_DIR) / "test-artifacts"
VIEWPORT = {"width": 1280, "height": 800}
#: Playwright's default timeout for actions and waits, milliseconds (generous: CI has 2 cores).
DEFAULT_TIMEOUT_MS = 30_000


def launch_chromium(playwright):
    """Launch the system Chromium with callgate's standard flags. Returns a ``Browser``."""
    if not Path(CHROMIUM_PATH).exists():
        raise RuntimeError(
            f"{CHROMIUM_PATH} is missing: install it with `apt-get install -y chromium` "
            "(scripts/test does this when run as root)"
        )
    return playwright.chromium.launch(
        executable_path=CHROMIUM_PATH, args=CHROMIUM_ARGS, headless=True
    )


def artifact_path(name: str) -> Path:
    """``test-artifacts/<name>.png`` with a file-system-safe name; creates the directory."""
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "screenshot"
    return ARTIFACTS_DIR / f"{safe}.png"


@pytest.mark.browser
class BrowserTestCase(StaticLiveServerTestCase):
    """A live server plus a Chromium page per test; see the module docstring."""

    host = "localhost"
    #: (width, height) of the page; override per class for narrow-screen tests.
    viewport = VIEWPORT

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        from playwright.sync_api import sync_playwright

        # Playwright's sync API runs an asyncio loop in this thread; Django's ORM would then
        # refuse to run here (SynchronousOnlyOperation). Tests do their ORM work in the same
        # thread between page actions, which is safe.
        cls._previous_async_unsafe = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
        cls._playwright = sync_playwright().start()
        try:
            cls.browser = launch_chromium(cls._playwright)
        except Exception:
            cls._playwright.stop()
            cls._restore_async_unsafe()
            super().tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            cls.browser.close()
            cls._playwright.stop()
        finally:
            cls._restore_async_unsafe()
            super().tearDownClass()

    @classmethod
    def _restore_async_unsafe(cls):
        if cls._previous_async_unsafe is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = cls._previous_async_unsafe

    def setUp(self):
        super().setUp()
        # The same personas as BaseTestCase (projects acme/globex, alice … olga, keys).
        BaseTestCase.setUpTestData.__func__(type(self))
        self.context = self.browser.new_context(
            viewport=dict(self.viewport), locale="en-GB", timezone_id="UTC"
        )
        self.context.set_default_timeout(DEFAULT_TIMEOUT_MS)
        self.context.set_default_navigation_timeout(DEFAULT_TIMEOUT_MS)
        self.page = self.context.new_page()
        self.console_errors: list[str] = []
        self.page.on("console", self._on_console)
        self.page.on("pageerror", lambda exc: self.console_errors.append(f"pageerror: {exc}"))

    def tearDown(self):
        try:
            self.page.screenshot(
                path=str(artifact_path(f"{type(self).__name__}.{self._testMethodName}")),
                full_page=True,
            )
        except Exception:  # the page may already be gone; the test's own result matters more
            pass
        self.context.close()
        super().tearDown()

    def _on_console(self, message) -> None:
        if message.type == "error":
            self.console_errors.append(f"console: {message.text}")

    # --- helpers

    def url(self, path: str) -> str:
        """The live server's absolute URL for ``path`` (``/p/acme/``)."""
        return f"{self.live_server_url}{path}"

    def visit(self, path: str):
        """Open ``path`` and wait until the page has loaded. Returns the ``Response``."""
        return self.page.goto(self.url(path), wait_until="load")

    def login(
        self, username: str, password: str = PASSWORD, *, next_path: str | None = None
    ) -> None:
        """Log in through the real form and wait until the login page is left.

        Raises ``AssertionError`` when the form answers with an error."""
        login_path = "/login/" + (f"?next={next_path}" if next_path else "")
        self.visit(login_path)
        self.page.fill("#id_username", username)
        self.page.fill("#id_password", password)
        with self.page.expect_navigation(wait_until="load"):
            self.page.click("form button[type=submit]")
        if "/login/" in self.page.url:
            raise AssertionError(f"login as {username!r} failed; the page is still {self.page.url}")

    def screenshot(self, name: str, *, full_page: bool = True) -> Path:
        """Save ``test-artifacts/<name>.png`` and return its path."""
        path = artifact_path(name)
        self.page.screenshot(path=str(path), full_page=full_page)
        return path

    def assert_no_console_errors(self) -> None:
        """No console errors or uncaught exceptions so far (CSP violations included)."""
        assert self.console_errors == [], "\n".join(self.console_errors)
