#!/usr/bin/env python3
"""Screenshots of every page of a running demo, as an operator and as a manager.

Start the demo (``scripts/run``, which prints the logins), then::

    .venv/bin/python scripts/screenshots.py --operator-password … --manager-password …

(or set ``CALLGATE_OPERATOR_PASSWORD`` / ``CALLGATE_MANAGER_PASSWORD``). It logs in through
the login form with system Chromium (Playwright), visits the login page, the overview, the
calls list and call details, the review queue and an item of each kind and state, the
contracts and a contract's versions, the agents, every report, the alert rules and their
history, the MCP gateway and the demo's webhook sink, and saves a full-page PNG of each as
``test-artifacts/<role>-<page>.png``. The browser runs in the ``en-US`` locale and a time
zone away from UTC (``--timezone``), so 12-hour forms and UTC-only times show up in the
pictures. ``--readme`` also writes the manager's overview to ``docs/overview.png`` (the
README's screenshot). Prints each file it wrote.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from urllib.parse import urljoin

from playwright.sync_api import Page, sync_playwright

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
README_SHOT = ROOT / "docs" / "overview.png"
CHROMIUM = os.environ.get("CALLGATE_CHROMIUM", "/usr/bin/chromium")
VIEWPORT = {"width": 1280, "height": 800}
#: the items of the queue to show, by filter (at most one page each)
ITEM_FILTERS = {
    "approval": "?status=open&reason=approval_pending",
    "escalation": "?status=open",
    "resolved": "?status=resolved",
    "settled": "?status=settled",
}


def _shot(page: Page, name: str, written: list[Path]) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', name)}.png"
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(path), full_page=True)
    written.append(path)
    print(path.relative_to(ROOT))


def _login(page: Page, base: str, username: str, password: str) -> None:
    page.goto(urljoin(base, "/login/"))
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_load_state("networkidle")
    if "/login/" in page.url:
        sys.exit(f"could not log in as {username}: check the password the demo printed")


def _links(page: Page, pattern: str) -> list[str]:
    """The distinct hrefs on the page matching ``pattern``, in page order."""
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
    seen: list[str] = []
    for href in hrefs:
        if re.search(pattern, href or "") and href not in seen:
            seen.append(href)
    return seen


def _visit(page: Page, base: str, path: str, name: str, written: list[Path]) -> None:
    page.goto(urljoin(base, path))
    _shot(page, name, written)


def walk(page: Page, base: str, project: str, role: str, written: list[Path]) -> None:
    p = f"/p/{project}"
    _visit(page, base, f"{p}/", f"{role}-overview", written)
    _visit(page, base, f"{p}/calls/", f"{role}-calls", written)
    calls = _links(page, rf"^{p}/calls/[^?]+/$")
    # a call of each reason shown on the first page (the timeline's wording differs by kind)
    for i, href in enumerate(calls[:6]):
        _visit(page, base, href, f"{role}-call-{i + 1}", written)
    _visit(page, base, f"{p}/review/", f"{role}-review-queue", written)
    for kind, query in ITEM_FILTERS.items():
        page.goto(urljoin(base, f"{p}/review/{query}"))
        items = _links(page, rf"^{p}/review/\d+/$")
        for i, href in enumerate(items[: 3 if kind == "escalation" else 1]):
            _visit(page, base, href, f"{role}-item-{kind}-{i + 1}", written)
    _visit(page, base, f"{p}/contracts/", f"{role}-contracts", written)
    for href in _links(page, rf"^{p}/contracts/[^/]+/$"):
        name = href.rstrip("/").rsplit("/", 1)[-1]
        if name in ("book_meeting", "do_stuff", "create_follow_up"):
            _visit(page, base, href, f"{role}-contract-{name}", written)
    _visit(page, base, f"{p}/agents/", f"{role}-agents", written)
    for section in ("", "reasons/", "tools/", "agents/", "reliability/", "review/"):
        _visit(
            page,
            base,
            f"{p}/reports/{section}",
            f"{role}-report-{section[:-1] or 'summary'}",
            written,
        )
    _visit(page, base, f"{p}/alerts/", f"{role}-alert-rules", written)
    _visit(page, base, f"{p}/alerts/history/", f"{role}-alert-history", written)
    _visit(page, base, f"{p}/gateway/", f"{role}-gateway", written)
    _visit(page, base, "/simulator/webhook-sink/", f"{role}-webhook-sink", written)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--project", default="demo")
    parser.add_argument("--operator-password", default=os.environ.get("CALLGATE_OPERATOR_PASSWORD"))
    parser.add_argument("--manager-password", default=os.environ.get("CALLGATE_MANAGER_PASSWORD"))
    parser.add_argument("--timezone", default="America/Chicago", help="the browser's time zone")
    parser.add_argument("--readme", action="store_true", help="also retake docs/overview.png")
    args = parser.parse_args()
    if not args.operator_password or not args.manager_password:
        parser.error("give the passwords scripts/run printed (or set the environment variables)")
    written: list[Path] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        for role, password in (
            ("operator", args.operator_password),
            ("manager", args.manager_password),
        ):
            context = browser.new_context(
                viewport=VIEWPORT, locale="en-US", timezone_id=args.timezone
            )
            page = context.new_page()
            if role == "operator":
                _visit(page, args.base_url, "/login/", "login", written)
            _login(page, args.base_url, role, password)
            walk(page, args.base_url, args.project, role, written)
            if args.readme and role == "manager":
                page.goto(urljoin(args.base_url, f"/p/{args.project}/"))
                page.wait_for_load_state("networkidle")
                page.screenshot(path=str(README_SHOT))  # the first screen, as a visitor sees it
                print(README_SHOT.relative_to(ROOT))
            context.close()
        browser.close()
    print(f"{len(written)} screenshots in {ARTIFACTS.relative_to(ROOT)}/")


if __name__ == "__main__":
    main()
