"""Page benchmark (PostgreSQL): does a page's cost grow with the project?

Usage:  DATABASE_URL=postgres://postgres@127.0.0.1:5432/callgate_bench \\
        python bench/pages.py [--sizes 10000,1000000] [--rounds 5] [--only calls]

For each size N, a project ``bench-<N>`` built by ``manage.py seed_scale`` (reused when it
already holds N calls, so a second run starts at once). Then every page and read API is
loaded through Django's test client (middleware, sessions, templates; DEBUG off as in
production): overview, calls list (default, each filter, search by operation-ID prefix, an
older page), call detail, review queue (default, each filter, each status, each sort, its
last page, "all matching" bulk claim, rolled back after each load so that every round
sees the same queue), item detail, contracts, contract detail, agents,
every report page and every reports API over 7 and 30 days, and ``GET /api/v1/calls`` if
this version has it. Rounds are interleaved (round 1 of every page at every size, then
round 2, …) so that the machine's load falls on all alike.

Prints per page: p50 at each size, the ratio of the largest to the smallest, the SQL
statement count (from one extra load under ``CaptureQueriesContext``) and the rows the
page shows at each size (a page that shows more at the larger size renders more). Target (issue 18):
ratio <= 1.5, queue and calls list < 150 ms at 1M calls.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "callgate.settings")
os.environ.setdefault("DEBUG", "false")  # as in production
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
os.environ["CELERY_BROKER_URL"] = "memory://"
os.environ["CELERY_RESULT_BACKEND"] = "cache+memory://"

import django  # noqa: E402

warnings.filterwarnings("ignore", message="No directory at", module="django.core.handlers.base")
django.setup()

from django.conf import settings  # noqa: E402

# pages link static files; a benchmark has no collectstatic manifest (DEBUG off wants one)
settings.STORAGES = {
    **settings.STORAGES,
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from callgate.auth import api_key_issue  # noqa: E402
from callgate.models import Membership, Project, ToolCall  # noqa: E402
from callgate.reports.api import REPORT_APIS  # noqa: E402
from demo.seeding import seed_scale  # noqa: E402
from reviews.models import ReviewItem  # noqa: E402

USER = "bench-pages"


def project_of_size(calls: int) -> Project:
    """``bench-<calls>`` with exactly ``calls`` calls, seeded when missing."""
    slug = f"bench-{calls}"
    project = Project.objects.filter(slug=slug).first()
    have = ToolCall.objects.filter(project=project).count() if project else 0
    if have != calls:
        if project is not None:
            raise SystemExit(f"{slug} holds {have} calls, not {calls}: drop it or use --sizes")
        started = time.monotonic()
        print(f"seeding {slug} ({calls} calls)…", file=sys.stderr, flush=True)
        project = seed_scale(
            slug=slug, calls=calls, say=lambda line: print(line, file=sys.stderr)
        ).project
        print(f"  seeded in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return project


def sample_call(project: Project) -> ToolCall:
    """The call the detail pages load: the 501st newest."""
    return ToolCall.objects.filter(project=project).order_by("-created_at")[500:501].get()


def targets(project: Project) -> list[tuple[str, str, str, dict]]:
    """(label, method, path, data) of every page and read API of ``project``."""
    base = f"/p/{project.slug}"
    call = sample_call(project)
    item = ReviewItem.objects.filter(project=project).order_by("-pk").first()
    # the sample call's agent: one with calls at every size (the first agent by name had
    # none in the 10k project, so its filtered pages compared an empty list with a full one)
    agent = call.agent
    pages = [
        ("overview", "GET", f"{base}/", {}),
        ("calls", "GET", f"{base}/calls/", {}),
        ("calls reason=ok", "GET", f"{base}/calls/", {"reason": "ok"}),
        ("calls category=hallucination", "GET", f"{base}/calls/", {"category": "hallucination"}),
        ("calls route=review", "GET", f"{base}/calls/", {"route": "review"}),
        ("calls tool", "GET", f"{base}/calls/", {"tool": "issue_refund"}),
        ("calls agent", "GET", f"{base}/calls/", {"agent": str(agent.pk)}),
        ("calls state=in_review", "GET", f"{base}/calls/", {"state": "in_review"}),
        ("calls since=24h", "GET", f"{base}/calls/", {"since": "24h"}),
        ("calls search op prefix", "GET", f"{base}/calls/", {"q": call.operation_id[:6]}),
        ("call detail", "GET", f"{base}/calls/{call.operation_id}/", {}),
        ("queue (open)", "GET", f"{base}/review/", {}),
        ("queue tool", "GET", f"{base}/review/", {"tool": "issue_refund"}),
        ("queue reason", "GET", f"{base}/review/", {"reason": "reconcile_mismatch"}),
        ("queue agent", "GET", f"{base}/review/", {"agent": agent.name}),
        ("queue age=24h", "GET", f"{base}/review/", {"age": "24h"}),
        ("queue assignee=me", "GET", f"{base}/review/", {"assignee": "me"}),
        ("queue assignee=unassigned", "GET", f"{base}/review/", {"assignee": "unassigned"}),
        *[
            (f"queue status={s}", "GET", f"{base}/review/", {"status": s})
            for s in ("claimed", "resolved", "expired", "settled", "all")
        ],
        (
            "queue status=all last page",
            "GET",
            f"{base}/review/",
            {"status": "all", "last": "1"},
        ),
        (
            "queue bulk claim all matching",
            "POST",
            f"{base}/review/bulk/",
            {"action": "claim", "all_matching": "on", "status": "open"},
        ),
        ("item detail", "GET", f"{base}/review/{item.pk}/", {}) if item else None,
        ("contracts", "GET", f"{base}/contracts/", {}),
        ("contract detail", "GET", f"{base}/contracts/issue_refund/", {}),
        ("agents", "GET", f"{base}/agents/", {}),
    ]
    for days in (7, 30):
        for section in ("", "reasons/", "tools/", "agents/", "reliability/", "review/"):
            name = section.rstrip("/") or "overview"
            pages.append(
                (f"report {name} {days}d", "GET", f"{base}/reports/{section}", {"days": days})
            )
        for name in REPORT_APIS:
            pages.append(
                (f"API reports/{name} {days}d", "API", f"/api/v1/reports/{name}", {"days": days})
            )
    # the API shows a key only its own agent's calls (the key is that agent's: main())
    own = ToolCall.objects.filter(project=project, agent=agent).order_by("-created_at")[500:501]
    own_call = own.get()
    pages.append(("API calls", "API", "/api/v1/calls", {}))
    pages.append(("API calls/{operation_id}", "API", f"/api/v1/calls/{own_call.operation_id}", {}))
    return [p for p in pages if p is not None]


def with_range(data: dict) -> dict:
    """``days`` → the reports' ``since`` (an ISO date ``days`` back)."""
    if "days" not in data:
        return data
    from datetime import UTC, datetime, timedelta

    since = (datetime.now(UTC) - timedelta(days=data["days"])).strftime("%Y-%m-%dT%H:00:00Z")
    return {"since": since}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,1000000", help="project sizes (calls)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="", help="only pages whose label contains this")
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        raise SystemExit("bench/pages.py needs PostgreSQL (DATABASE_URL)")
    settings.ALLOWED_HOSTS = ["*"]
    sizes = [int(s) for s in args.sizes.split(",")]
    projects = [project_of_size(n) for n in sizes]
    User = get_user_model()
    user = User.objects.filter(username=USER).first() or User.objects.create_user(USER)
    client, api = Client(), Client()
    client.force_login(user)
    plans, keys = {}, {}
    for project in projects:
        Membership.objects.update_or_create(
            user=user, project=project, defaults={"role": Membership.Role.ADMIN}
        )
        keys[project.pk] = api_key_issue(agent=sample_call(project).agent).plain
        plans[project.pk] = [t for t in targets(project) if not args.only or args.only in t[0]]

    def rows_of(response) -> str:
        """What the page shows, to read a ratio by: the table rows of an HTML page (headers
        included), the items of a JSON answer's first list, the items a bulk action took."""
        if response.status_code in (301, 302):
            done = [m.message for m in response.wsgi_request._messages]
            found = re.search(r"\d[\d,]*", done[0]) if done else None
            return found.group().replace(",", "") if found else "-"
        if response["Content-Type"].startswith("application/json"):
            body = response.json()
            lists = (
                [v for v in body.values() if isinstance(v, list)] if isinstance(body, dict) else []
            )
            return str(len(lists[0])) if lists else "-"
        return str(response.content.count(b"<tr"))

    def load(project: Project, target):
        _label, method, path, data = target
        data = with_range(data)
        if method == "GET":
            response = client.get(path, data)
        elif method == "POST":  # rolled back: every round (and every page after it) sees
            with transaction.atomic():  # the same queue, not one the last round claimed
                response = client.post(path, data)
                transaction.set_rollback(True)
        else:
            response = api.get(path, data, HTTP_AUTHORIZATION=f"Bearer {keys[project.pk]}")
        if response.status_code >= 400:
            raise SystemExit(f"{target[0]} at {project.slug}: HTTP {response.status_code}")
        return response

    times: dict[tuple[str, int], list[float]] = {}
    statements: dict[tuple[str, int], int] = {}
    shown: dict[tuple[str, int], str] = {}
    for project in projects:  # warm-up, statement counts and rows shown
        for target in plans[project.pk]:
            with CaptureQueriesContext(connection) as queries:
                shown[(target[0], project.pk)] = rows_of(load(project, target))
            statements[(target[0], project.pk)] = len(queries)
    for _ in range(args.rounds):
        for index in range(len(plans[projects[0].pk])):
            for project in projects:
                target = plans[project.pk][index]
                started = time.perf_counter()
                load(project, target)
                times.setdefault((target[0], project.pk), []).append(time.perf_counter() - started)

    head = "".join(f"{'p50 @' + f'{n:,}':>16}" for n in sizes)
    print(f"{'page / API':<38}{head}{'ratio':>8}{'SQL':>8}{'rows':>10}")
    worst = 0.0
    for target in plans[projects[0].pk]:
        label = target[0]
        medians = [statistics.median(times[(label, p.pk)]) for p in projects]
        ratio = medians[-1] / medians[0] if medians[0] else float("nan")
        worst = max(worst, ratio)
        cells = "".join(f"{m * 1000:>13.1f} ms" for m in medians)
        sql = "/".join(str(statements[(label, p.pk)]) for p in projects)
        rows = "/".join(shown[(label, p.pk)] for p in projects)
        print(f"{label:<38}{cells}{ratio:>8.2f}{sql:>8}{rows:>10}")
    print(f"\nworst ratio {worst:.2f} (target <= 1.5); rounds {args.rounds}; {os.cpu_count()} CPUs")
    print("rows: what each size's page shows (HTML table rows with their headers, a JSON")
    print("answer's first list, the items a bulk action took): a page that shows more rows at")
    print("the larger size renders more, whatever its queries cost")


if __name__ == "__main__":
    main()
