"""Browser pages of the core app (htmx). Review pages live in ``reviews.views``.

Views parse the request, call selectors (reads) or services (writes) and render; the
calls list serves both the full page and its rows fragment (htmx polling) from one view.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers
from pydantic import ValidationError

from callgate import labels, metrics, search, selectors, services
from callgate.access import ProjectRequest, Role, project_view, user_projects
from callgate.auth import api_key_issue, api_key_revoke
from callgate.models import Agent, ApiKey, SavedView, ToolCall
from callgate.paths import PathOf
from callgate.reports import overview as overview_selectors
from callgate.reports.overview import project_overview
from callgate.reports.views import Links
from callgate.schemas import ContractIn, error_list
from callgate.search import QueryError
from callgate.selectors import TIME_PRESETS, CallFilters, Cursor
from callgate.taxonomy import Category, Reason, Route
from callgate.templatetags.callgate_tags import badge, moment, short_op
from callgate.timeparse import parse_time

#: query parameters of the calls list that narrow it (the reports link with these)
FILTER_PARAMS = (
    "reason",
    "category",
    "route",
    "tool",
    "agent",
    "state",
    "since",
    "until",
    "q",
    "trace_id",
    "request_id",
    "conversation_id",
)


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
def overview(request: ProjectRequest) -> HttpResponse:
    """The project's front page, "what needs me now": counts of the last 24 hours (the
    reports' numbers, each linking to exactly its calls), per category a 7-day sparkline
    with the change against the 7 days before, the reasons new or rising fastest, the
    oldest open review item, approvals about to expire and the inbox lag."""
    project = request.project
    stats = project_overview(project=project)
    link = Links(project.slug, stats["filters"])
    trends = overview_selectors.category_trends(project=project)
    trend_link = Links(project.slug, trends["filters"])
    rising = overview_selectors.rising_reasons(project=project)
    return render(
        request,
        "callgate/overview.html",
        {
            "nav_active": "overview",
            "stats": stats,
            "numbers": metrics.NUMBERS,
            "links": {
                "calls": link.number("calls"),
                "not_ok": link.number("not_ok"),
                "unknown_now": link.number("unknown_now"),
                "refused": link.number("refused"),
                "by_category": [
                    (c, n, link(category=c.value if c else metrics.UNCLASSIFIED))
                    for c, n in stats["by_category"]
                ],
            },
            "trends": [
                {**row, "href": trend_link(category=row["category"])} for row in trends["rows"]
            ],
            "trend_filters": trends["filters"],
            "rising": [{**row, "href": trend_link(reason=row["reason"])} for row in rising],
            "attention": overview_selectors.attention(project=project),
        },
    )


# --- calls list -------------------------------------------------------------------------


def _parse_time(raw: str, *, end: bool = False) -> datetime | None:
    """``timeparse.parse_time`` with naive times in the current time zone; None when ``raw``
    is no date or date-time."""
    try:
        return parse_time(raw, end=end, naive=timezone.get_current_timezone())
    except ValueError:
        return None


def _parse_call_filters(params: QueryDict) -> tuple[CallFilters, list[str], bool]:
    """The filters in the query string, a message for each value that was ignored, and
    whether the search query ``q`` was malformed (ignored, its message naming the term)."""
    errors: list[str] = []
    values: dict = {}

    def choice(name: str, allowed) -> None:
        raw = params.get(name, "").strip()
        if raw and raw in allowed:
            values[name] = raw
        elif raw:
            errors.append(f"Unknown {name} {raw!r}: ignored.")

    choice("reason", Reason.values)
    choice("category", [*Category.values, *metrics.CATEGORY_SETS])
    choice("route", Route.values)
    choice("state", ToolCall.State.values)
    values["tool"] = params.get("tool", "").strip()[:128]
    bad_search = False
    try:
        values["search"] = selectors.search_parse(params.get("q", ""))
    except QueryError as exc:
        errors.append(f"Search term {exc.term!r}: {exc.message}. The search was ignored.")
        bad_search = True
    for name in ("trace_id", "request_id", "conversation_id"):
        values[name] = params.get(name, "").strip()[:200]
    raw_agent = params.get("agent", "").strip()
    if raw_agent:
        if raw_agent.isdigit() and len(raw_agent) < 19:  # fits a bigint
            values["agent"] = int(raw_agent)
        else:
            errors.append(f"Unknown agent {raw_agent!r}: ignored.")
    raw_since = params.get("since", "").strip()
    if raw_since in TIME_PRESETS:
        values["since"] = metrics.list_since(TIME_PRESETS[raw_since])
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
    return CallFilters(**values), errors, bad_search


def _searches_items(query: str) -> bool:
    """Does the search ``query`` hold a term only review items have (``is:``,
    ``assignee:``)? Then it is the review queue's search."""
    try:
        terms = search.query_parse(query, choices=selectors.SEARCH_CHOICES)
    except QueryError:
        return False
    return any(term.key in selectors.SEARCH_ITEM_KEYS for term in terms)


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
            value = metrics.CATEGORY_SETS.get(filters.category) or Category(filters.category).label
        elif name == "tool" and raw == metrics.NO_TOOL:
            value = "(no tool name)"
        elif name in ("state", "reason", "route"):  # words for people, the slug in the URL
            value = labels.label(raw, name)
        label = {
            "q": "search",
            "tool": "tool",
            "trace_id": "trace",
            "request_id": "request",
            "conversation_id": "conversation",
        }.get(name, name)
        chips.append(
            {
                "name": name,
                "label": label,
                "value": value,
                "clear_query": _query(params, drop=(name,)),
            }
        )
    return chips


def _calls_total(*, project, filters: CallFilters, counts: dict[str, int]) -> int:
    """How many calls match ``filters``, from the per-category ``counts`` (which ignore the
    category filter) where they suffice, else counted."""
    category = filters.category
    if not category:
        return sum(counts.values())
    if category == "none":
        return counts.get(metrics.UNCLASSIFIED, 0)
    if category == "not_ok":
        return sum(counts.get(c, 0) for c in metrics.NOT_OK_CATEGORIES)
    if category in Category.values:
        return counts.get(category, 0)
    return selectors.calls_filtered(project=project, filters=filters).count()


@dataclass(frozen=True)
class CallRow:
    """What one row of the calls list shows, ready to draw (as the review queue's
    ``QueueRow``): its link, badge, state label, operation ID and time."""

    call: ToolCall
    url: str
    badge: str
    state: str
    operation: str
    created: str
    new: bool


def _call_rows(project, calls: list[ToolCall], *, seen: int | None) -> list[CallRow]:
    """The rows of ``calls``: the detail path reversed once per page (``PathOf``); rows
    with an ID above ``seen`` (the newest the browser has shown) are new."""
    detail_path = PathOf("callgate:call_detail", project.slug)
    return [
        CallRow(
            call=call,
            url=detail_path(call.operation_id),
            badge=badge(call.reason, call.category),
            state=labels.label(call.state, "state"),
            operation=short_op(call.operation_id),
            created=moment(call.created_at, True),
            new=bool(seen and call.pk > seen),
        )
        for call in calls
    ]


@require_GET
@vary_on_headers("HX-Request")
@project_view()
def calls(request: ProjectRequest) -> HttpResponse:
    """Calls of the project, newest first, filtered by the query string; keyset-paginated
    with ``before``/``after`` cursors. An htmx request (the 5 s poll) gets only the rows;
    rows newer than ``seen`` (a call id) are marked new."""
    project = request.project
    if _searches_items(request.GET.get("q", "")):  # the header's box: is:claimed, assignee:me
        queue = reverse("reviews:queue", args=[project.slug])
        return redirect(f"{queue}?{urlencode({'q': request.GET['q']})}")
    filters, errors, bad_search = _parse_call_filters(request.GET)
    before = Cursor.decode(request.GET["before"]) if request.GET.get("before") else None
    after = Cursor.decode(request.GET["after"]) if request.GET.get("after") and not before else None
    page = selectors.calls_page(project=project, filters=filters, before=before, after=after)
    seen_raw = request.GET.get("seen", "")
    seen = int(seen_raw) if seen_raw.isdigit() else None
    newest = max([row.id for row in page.rows] + [seen or 0])
    live = before is None and after is None
    query = _query(request.GET)
    context: dict[str, Any] = {
        "page": page,
        "rows": _call_rows(project, page.rows, seen=seen),
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
    total = _calls_total(project=project, filters=filters, counts=counts)
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
            ]
            + (
                [
                    {
                        "value": "none",
                        "label": metrics.CATEGORY_SETS["none"],
                        "n": counts[metrics.UNCLASSIFIED],
                        "query": _query(request.GET, drop=("category",), category="none"),
                        "clear_query": _query(request.GET, drop=("category",)),
                    }
                ]
                if counts.get(metrics.UNCLASSIFIED)
                else []
            ),
            "total": total,
            "category_listed": filters.category in counts
            or (filters.category == "none" and metrics.UNCLASSIFIED in counts),
            "category_label": metrics.CATEGORY_SETS.get(filters.category)
            or (Category(filters.category).label if filters.category else ""),
            "capped": category_counts.capped,
            "repeats": selectors.calls_repeats_answered(project=project, filters=filters)
            if filters.category == "repeated"
            else None,
            "repeats_label": metrics.label("repeats_answered"),
            "choices": choices,
            "reasons": Reason.choices,
            "routes": Route.choices,
            "states": ToolCall.State.choices,
            "presets": list(TIME_PRESETS),
            "params": request.GET,
            "before": request.GET.get("before", ""),
            "after": request.GET.get("after", ""),
            **saved_views_menu(request, page=SavedView.Page.CALLS, query=query),
        }
    )
    # a malformed search is the request's fault: 400, the page naming the term
    return render(request, "callgate/calls.html", context, status=400 if bad_search else 200)


@require_GET
@project_view()
def call_detail(request: ProjectRequest, operation_id: str) -> HttpResponse:
    """One call: arguments, contract and its lint findings, the timeline, the outcome, and
    the model turn it came from (its sibling calls with their verdicts)."""
    call = selectors.call_for_detail(project=request.project, operation_id=operation_id)
    if call is None:
        raise Http404("No such call in this project.")
    events = selectors.call_timeline(call=call)
    return render(
        request,
        "callgate/call_detail.html",
        {
            "call": call,
            "events": events,
            # the latest execution whose failure was read: what the reader found, shown apart
            "cause_event": next((e for e in reversed(events) if e.cause), None),
            "turn": selectors.call_turn(events=events),
            "review_item": selectors.call_open_review_item(call=call),
            "nav_active": "calls",
        },
    )


# --- contracts ---------------------------------------------------------------------------


@require_GET
@project_view()
def contracts(request: ProjectRequest) -> HttpResponse:
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
def contract_detail(request: ProjectRequest, name: str) -> HttpResponse:
    """All versions of one tool's contract, newest first; project admins may publish a
    version (the agent that created the tool publishes through the API)."""
    return _contract_page(request, name)


def _contract_page(
    request: ProjectRequest, name: str, *, draft: str = "", error: str = "", status: int = 200
) -> HttpResponse:
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
            "can_publish": request.membership.has_role(Role.ADMIN),
            "draft": draft
            or json.dumps(selectors.contract_as_input(versions[0]), indent=2, ensure_ascii=False),
            "error": error,
            "nav_active": "contracts",
        },
        status=status,
    )


@require_POST
@project_view(role=Role.ADMIN)
def contract_publish(request: ProjectRequest, name: str) -> HttpResponse:
    """A project admin publishes the posted contract (JSON, the API's shape) as the tool's
    next version. Bad JSON or an invalid contract re-renders the page with the error (400)."""
    draft = request.POST.get("contract", "")
    try:
        payload = ContractIn.model_validate_json(draft)
        services.contract_publish(
            project=request.project, name=name, payload=payload, user=request.user
        )
    except ValidationError as exc:
        first = error_list(exc)[0]
        error = f"{first['loc']}: {first['msg']}"
        return _contract_page(request, name, draft=draft, error=error, status=400)
    except services.ContractRejected as exc:
        return _contract_page(request, name, draft=draft, error=f"{exc.loc}: {exc.msg}", status=400)
    return redirect("callgate:contract_detail", request.project.slug, name)


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
    ("volatile_arguments", "volatile arguments"),
    ("max_identical", "max identical proposals"),
    ("not_found_may_hide_forbidden", "not-found may hide forbidden"),
    ("result_error_markers", "result error markers"),
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
    request: ProjectRequest, *, issued=None, error: str = "", status: int = 200
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
def agents(request: ProjectRequest) -> HttpResponse:
    """Agents with their keys, registered tools and calls of the last 24 hours."""
    return _agents_page(request)


@require_POST
@project_view(role=Role.ADMIN)
def agent_key_create(request: ProjectRequest, agent_id: int) -> HttpResponse:
    """Issue a key for the agent; the response is the only place the plain key appears."""
    agent = get_object_or_404(Agent, pk=agent_id, project=request.project)
    issued = api_key_issue(agent=agent, name=request.POST.get("name", "").strip()[:100])
    return _agents_page(request, issued=issued)


@require_POST
@project_view(role=Role.ADMIN)
def agent_key_revoke(request: ProjectRequest, key_id: int) -> HttpResponse:
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


# --- saved views -------------------------------------------------------------------------

#: The page each ``SavedView.Page`` opens (its URL name).
SAVED_VIEW_PAGES = {SavedView.Page.CALLS: "callgate:calls", SavedView.Page.QUEUE: "reviews:queue"}


def _saved_view_url(project, view: SavedView) -> str:
    url = reverse(SAVED_VIEW_PAGES[SavedView.Page(view.page)], args=[project.slug])
    return f"{url}?{view.query}" if view.query else url


def saved_views_menu(request: ProjectRequest, *, page: str, query: str) -> dict:
    """The context of ``callgate/_saved_views.html`` on ``page`` (``SavedView.Page``) whose
    current filters are ``query``: the user's views there, and what "Save" posts."""
    return {
        "saved_views": selectors.saved_views(user=request.user, project=request.project, page=page),
        "saved_page": page,
        "saved_query": query,
    }


@require_POST
@project_view()
def saved_view_create(request: ProjectRequest) -> HttpResponse:
    """Save the posted ``query`` (a page's filters and search) as ``name`` for ``page``
    (``calls`` or ``queue``), then open it. A bad field: 400 naming it."""
    try:
        view = services.saved_view_save(
            user=request.user,
            project=request.project,
            page=request.POST.get("page", ""),
            name=request.POST.get("name", ""),
            query=request.POST.get("query", ""),
        )
    except services.SavedViewRejected as exc:
        return HttpResponse(
            f"The view was not saved: {exc.field} {exc.message}.",
            status=400,
            content_type="text/plain; charset=utf-8",
        )
    messages.success(request, f"Saved the view “{view.name}”.")
    return redirect(_saved_view_url(request.project, view))


@require_GET
@project_view()
def saved_view_open(request: ProjectRequest, view_id: int) -> HttpResponse:
    """Open one of the user's saved views (another user's: 404)."""
    view = selectors.saved_view_for(user=request.user, project=request.project, pk=view_id)
    if view is None:
        raise Http404("No such saved view.")
    return redirect(_saved_view_url(request.project, view))


@require_POST
@project_view()
def saved_view_delete(request: ProjectRequest, view_id: int) -> HttpResponse:
    """Delete one of the user's saved views (another user's: 404), back to its page."""
    view = selectors.saved_view_for(user=request.user, project=request.project, pk=view_id)
    if view is None or not services.saved_view_delete(
        user=request.user, project=request.project, pk=view_id
    ):
        raise Http404("No such saved view.")
    messages.success(request, f"Deleted the view “{view.name}”.")
    return redirect(SAVED_VIEW_PAGES[SavedView.Page(view.page)], request.project.slug)
