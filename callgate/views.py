"""Browser pages of the core app (htmx). Review pages live in ``reviews.views``.

Views parse the request, call selectors (reads) or services (writes) and render; the
calls list serves both the full page and its rows fragment (htmx polling) from one view.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from callgate import selectors
from callgate.access import Role, project_view, user_projects
from callgate.auth import api_key_issue, api_key_revoke
from callgate.models import Agent, ApiKey, ToolCall
from callgate.selectors import TIME_PRESETS, CallFilters, Cursor
from callgate.taxonomy import Category, Reason, Route

#: query parameters of the calls list that narrow it (the reports link with these)
FILTER_PARAMS = ("reason", "category", "route", "tool", "agent", "state", "since", "until", "q")


@require_GET
@login_required
def home(request: HttpRequest) -> HttpResponse:
    """Send the user to their first project, or explain that they have none."""
    project = user_projects(request.user).first()
    if project is not None:
        return redirect("callgate:overview", project.slug)
    return render(request, "callgate/no_project.html")


@require_GET
@project_view()
def overview(request: HttpRequest) -> HttpResponse:
    """The project's front page: counts of the last 24 hours and where to go next."""
    return render(
        request,
        "callgate/overview.html",
        {"nav_active": "overview", "stats": selectors.project_overview(project=request.project)},
    )


# --- calls list -------------------------------------------------------------------------


def _parse_time(raw: str, *, end: bool = False) -> datetime | None:
    """An ISO date-time (aware, or naive in the current time zone) or a date (its start,
    or with ``end`` the start of the next day). None when ``raw`` is neither. A ``+`` of
    an offset that arrived unescaped (decoded to a space) is put back."""
    if "T" in raw:
        raw = raw.replace(" ", "+")
    try:
        value = parse_datetime(raw)
        day = None if value is not None else parse_date(raw)
    except ValueError:
        return None
    if value is None:
        if day is None:
            return None
        value = datetime.combine(day, time.min) + (timedelta(days=1) if end else timedelta())
    if timezone.is_naive(value):
        value = timezone.make_aware(value)
    return value


def _parse_call_filters(params: QueryDict) -> tuple[CallFilters, list[str]]:
    """The filters in the query string and a message for each value that was ignored."""
    errors: list[str] = []
    values: dict = {}

    def choice(name: str, allowed) -> None:
        raw = params.get(name, "").strip()
        if raw and raw in allowed:
            values[name] = raw
        elif raw:
            errors.append(f"Unknown {name} {raw!r}: ignored.")

    choice("reason", Reason.values)
    choice("category", Category.values)
    choice("route", Route.values)
    choice("state", ToolCall.State.values)
    values["tool"] = params.get("tool", "").strip()[:128]
    values["q"] = params.get("q", "").strip()[:200]
    raw_agent = params.get("agent", "").strip()
    if raw_agent:
        if raw_agent.isdigit() and len(raw_agent) < 19:  # fits a bigint
            values["agent"] = int(raw_agent)
        else:
            errors.append(f"Unknown agent {raw_agent!r}: ignored.")
    raw_since = params.get("since", "").strip()
    if raw_since in TIME_PRESETS:
        values["since"] = timezone.now() - TIME_PRESETS[raw_since]
    elif raw_since:
        values["since"] = _parse_time(raw_since)
        if values["since"] is None:
            errors.append(
                f"'since' must be 1h, 24h, 7d, 30d or an ISO date-time, got {raw_since!r}: ignored."
            )
    raw_until = params.get("until", "").strip()
    if raw_until:
        values["until"] = _parse_time(raw_until, end=True)
        if values["until"] is None:
            errors.append(f"'until' must be an ISO date-time, got {raw_until!r}: ignored.")
    return CallFilters(**values), errors


def _query(params: QueryDict, *, drop: tuple[str, ...] = (), **override: str) -> str:
    """The filter part of ``params`` as a query string, without ``drop``, with ``override``."""
    pairs = {k: params.get(k) for k in FILTER_PARAMS if params.get(k) and k not in drop}
    pairs.update({k: v for k, v in override.items() if v})
    return urlencode(pairs)


def _chips(params: QueryDict, *, filters: CallFilters, agents: dict[int, str]) -> list[dict]:
    """One removable chip per active filter: ``{"name", "label", "value", "clear_query"}``."""
    chips = []
    for name in FILTER_PARAMS:
        raw = params.get(name, "").strip()
        if not raw:
            continue
        value = raw
        if name == "agent":
            value = agents.get(filters.agent, raw) if filters.agent else raw
        elif name == "category" and filters.category:
            value = Category(filters.category).label
        elif name == "state" and filters.state:
            value = ToolCall.State(filters.state).label
        label = {"q": "operation ID", "tool": "tool"}.get(name, name)
        chips.append(
            {
                "name": name,
                "label": label,
                "value": value,
                "clear_query": _query(params, drop=(name,)),
            }
        )
    return chips


@require_GET
@vary_on_headers("HX-Request")
@project_view()
def calls(request: HttpRequest) -> HttpResponse:
    """Calls of the project, newest first, filtered by the query string; keyset-paginated
    with ``before``/``after`` cursors. An htmx request (the 5 s poll) gets only the rows;
    rows newer than ``seen`` (a call id) are marked new."""
    project = request.project
    filters, errors = _parse_call_filters(request.GET)
    before = Cursor.decode(request.GET["before"]) if request.GET.get("before") else None
    after = Cursor.decode(request.GET["after"]) if request.GET.get("after") and not before else None
    page = selectors.calls_page(project=project, filters=filters, before=before, after=after)
    seen_raw = request.GET.get("seen", "")
    seen = int(seen_raw) if seen_raw.isdigit() else None
    newest = max([row.id for row in page.rows] + [seen or 0])
    live = before is None and after is None
    query = _query(request.GET)
    context = {
        "page": page,
        "seen": seen,
        "newest_id": newest,
        "live": live,
        "query": query,
        "nav_active": "calls",
    }
    if request.htmx and not request.htmx.boosted:
        return render(request, "callgate/calls.html#call-rows", context)

    choices = selectors.call_filter_choices(project=project)
    agents = dict(choices["agents"])
    category_counts = selectors.calls_category_counts(project=project, filters=filters)
    counts = category_counts.counts
    total = counts.get(filters.category, 0) if filters.category else sum(counts.values())
    context.update(
        {
            "filters": filters,
            "errors": errors,
            "chips": _chips(request.GET, filters=filters, agents=agents),
            "category_counts": [
                {
                    "value": c.value,
                    "label": c.label,
                    "n": counts.get(c.value, 0),
                    "query": _query(request.GET, drop=("category",), category=c.value),
                    "clear_query": _query(request.GET, drop=("category",)),
                }
                for c in Category
                if counts.get(c.value)
            ],
            "total": total,
            "capped": category_counts.capped,
            "choices": choices,
            "reasons": Reason.values,
            "routes": Route.choices,
            "states": ToolCall.State.choices,
            "presets": list(TIME_PRESETS),
            "params": request.GET,
            "before": request.GET.get("before", ""),
            "after": request.GET.get("after", ""),
        }
    )
    return render(request, "callgate/calls.html", context)


@require_GET
@project_view()
def call_detail(request: HttpRequest, operation_id: str) -> HttpResponse:
    """One call: arguments, contract and its lint findings, the timeline, the outcome."""
    call = selectors.call_for_detail(project=request.project, operation_id=operation_id)
    if call is None:
        raise Http404("No such call in this project.")
    return render(
        request,
        "callgate/call_detail.html",
        {
            "call": call,
            "events": selectors.call_timeline(call=call),
            "review_item": selectors.call_open_review_item(call=call),
            "nav_active": "calls",
        },
    )


# --- contracts ---------------------------------------------------------------------------


@require_GET
@project_view()
def contracts(request: HttpRequest) -> HttpResponse:
    """Every tool's latest contract with its lint score and how often calls to it fail
    on arguments or hallucinations."""
    return render(
        request,
        "callgate/contracts.html",
        {
            "rows": selectors.contracts_latest(project=request.project),
            "nav_active": "contracts",
        },
    )


@require_GET
@project_view()
def contract_detail(request: HttpRequest, name: str) -> HttpResponse:
    """All versions of one tool's contract, newest first."""
    versions = selectors.contract_versions(project=request.project, name=name)
    if not versions:
        raise Http404("No such contract in this project.")
    pairs = list(zip(versions, versions[1:] + [None], strict=True))
    return render(
        request,
        "callgate/contract_detail.html",
        {
            "name": name,
            "latest": versions[0],
            "versions": [
                {"contract": c, "previous": previous, "changes": _contract_changes(c, previous)}
                for c, previous in pairs
            ],
            "nav_active": "contracts",
        },
    )


#: contract fields compared between versions, with their plain-words names
_DIFF_FIELDS = [
    ("description", "description"),
    ("effect", "effect"),
    ("idempotent", "idempotent"),
    ("reconcile_method", "reconcile method"),
    ("reconcile_url", "reconcile URL"),
    ("max_attempts", "max attempts"),
    ("max_reasks", "max re-asks"),
    ("requires_approval", "requires approval"),
    ("sensitive_fields", "sensitive fields"),
    ("deadline_seconds", "deadline"),
]


def _contract_changes(contract, previous) -> list[str]:
    """What changed from ``previous`` to ``contract``, in plain words (a diff hint)."""
    if previous is None:
        return []
    changes = [
        f"{label} changed"
        for field, label in _DIFF_FIELDS
        if getattr(contract, field) != getattr(previous, field)
    ]
    old_props = set((previous.parameters or {}).get("properties", {}))
    new_props = set((contract.parameters or {}).get("properties", {}))
    if new_props - old_props:
        changes.append("added " + ", ".join(sorted(new_props - old_props)))
    if old_props - new_props:
        changes.append("removed " + ", ".join(sorted(old_props - new_props)))
    if not changes and contract.parameters != previous.parameters:
        changes.append("parameter schema changed")
    return changes


# --- agents ------------------------------------------------------------------------------


def _agents_page(
    request: HttpRequest, *, issued=None, error: str = "", status: int = 200
) -> HttpResponse:
    response = render(
        request,
        "callgate/agents.html",
        {
            "agents": selectors.agents_with_keys(project=request.project),
            "can_manage": request.membership.has_role(Role.ADMIN),
            "issued": issued,
            "error": error,
            "nav_active": "agents",
        },
        status=status,
    )
    if issued is not None:
        response["Cache-Control"] = "no-store"  # the plain key must not be kept anywhere
    return response


@require_GET
@project_view()
def agents(request: HttpRequest) -> HttpResponse:
    """Agents with their keys, registered tools and calls of the last 24 hours."""
    return _agents_page(request)


@require_POST
@project_view(role=Role.ADMIN)
def agent_key_create(request: HttpRequest, agent_id: int) -> HttpResponse:
    """Issue a key for the agent; the response is the only place the plain key appears."""
    agent = get_object_or_404(Agent, pk=agent_id, project=request.project)
    issued = api_key_issue(agent=agent, name=request.POST.get("name", "").strip()[:100])
    return _agents_page(request, issued=issued)


@require_POST
@project_view(role=Role.ADMIN)
def agent_key_revoke(request: HttpRequest, key_id: int) -> HttpResponse:
    """Revoke a key once the admin typed its prefix into the confirmation field."""
    api_key = get_object_or_404(ApiKey, pk=key_id, project=request.project)
    if request.POST.get("confirm", "").strip() != api_key.prefix:
        return _agents_page(
            request,
            status=400,
            error=f"Key cg_{api_key.prefix}_… was not revoked: type its prefix {api_key.prefix} to confirm.",
        )
    api_key_revoke(api_key=api_key)
    return redirect("callgate:agents", request.project.slug)
