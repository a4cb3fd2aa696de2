"""Review queue pages (htmx). Views parse, call a service, render; one view serves a page
and its fragments (``"page.html#fragment"`` when htmx asks for one).

Action answers: 200 with the fragment; 409 with the fragment and a conflict message when
someone else acted first; 422 with the fragment and the reason when the action is not
possible. Without htmx, actions redirect back with a message.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import UTC
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.template.defaultfilters import urlencode as urlencode_value
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from callgate import labels
from callgate.access import ProjectRequest, Role, project_view
from callgate.csvexport import csv_safe
from callgate.models import SavedView, ToolContract
from callgate.paths import PathOf
from callgate.selectors import open_review_count
from callgate.services import ArgumentsRefused, arguments_parse
from callgate.templatetags.callgate_tags import badge, moment, short_op
from callgate.timeparse import parse_time
from callgate.views import saved_views_menu
from reviews import selectors, services
from reviews.forms import BulkForm, CommentForm, DecisionForm, ExtendForm
from reviews.models import ReviewAudit, ReviewItem, WebhookDelivery

CONFIRMABLE = {"reject", "mark_failed", "mark_applied", "override", "approve_retry", "edit"}


def _can_act(request) -> bool:
    return request.membership.has_role(Role.OPERATOR)


def _get_item(request, pk: int) -> ReviewItem:
    item = selectors.item_for_project(project=request.project, pk=pk)
    if item is None:
        raise Http404("No such review item.")
    return item


# --- queue -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueRow:
    """What one queue row shows, ready to draw: its links, its badge and age, who holds the
    claim (``holder``: the assignee while the lease is live) and the one-key approve. Each
    value a row shows is read here once (a template's dotted look-up costs microseconds a
    step: a 50-row page spent more drawing its rows than reading them)."""

    item: ReviewItem
    is_open: bool
    tool: str
    agent: str
    attempts: str
    reconcilable: bool
    new: bool
    selected: bool
    url: str
    claim_url: str
    decide_url: str
    reconcile_url: str
    similar: int
    similar_url: str
    badge: str
    operation: str
    age: str
    holder: Any
    mine: bool
    approve: dict


def _queue_rows(
    request,
    items: list,
    *,
    filters: selectors.QueueFilters,
    similar: dict[tuple[str, str], int],
    seen=None,
    selected=frozenset(),
) -> list[QueueRow]:
    """The rows of ``items``: each URL pattern reversed once per page (``PathOf``), the
    filters' query string built once; ``similar``: open items per (tool, reason)
    (``QueueCounts.similar``)."""
    slug = request.project.slug
    item_path, claim_path, decide_path, reconcile_path = (
        PathOf(f"reviews:{name}", slug) for name in ("item", "claim", "decide", "reconcile")
    )
    similar_path = f"{reverse('reviews:queue', args=[slug])}?{filters.query_string}"
    now = timezone.now()
    rows = []
    for item in items:
        call, contract = item.call, item.call.contract
        holder = item.assignee if item.lease_active(now) else None
        decision, why = services.queue_approve_action(item, user=request.user)
        rows.append(
            QueueRow(
                item=item,
                is_open=item.is_open,
                tool=call.tool_name or "?",
                agent=call.agent.name,
                attempts=f"{call.attempts}/{contract.max_attempts}"
                if contract
                else str(call.attempts),
                reconcilable=contract is not None
                and contract.reconcile_method == ToolContract.ReconcileMethod.HTTP,
                new=bool(seen and item.created_at > seen),
                selected=item.pk in selected,
                url=item_path(item.pk),
                claim_url=claim_path(item.pk),
                decide_url=decide_path(item.pk),
                reconcile_url=reconcile_path(item.pk),
                similar=similar.get((item.tool_name, item.reason), 0) - 1,
                similar_url=f"{similar_path}&tool={urlencode_value(call.tool_name)}"
                f"&reason={urlencode_value(item.reason)}",
                badge=badge(item.reason),
                operation=short_op(call.operation_id),
                age=moment(item.created_at, True),
                holder=holder,
                mine=holder is not None and holder.pk == request.user.pk,
                approve={
                    "decision": decision,
                    "why": why,
                    "label": "Approve" if decision == "approve" else "Approve retry",
                },
            )
        )
    return rows


def _parse_seen(value: str | None):
    """The ``seen`` query value (an ISO 8601 time) as an aware datetime: a time without a UTC
    offset is taken as UTC; anything unparsable (bad format, day 32, month 13) is None."""
    if not value:
        return None
    try:
        return parse_time(value[:64])
    except ValueError:
        return None


def _queue_context(request, *, result=None, fragment: bool = False) -> dict:
    """The queue's context; ``fragment`` skips what only the full page shows (facets, progress)."""
    filters = selectors.QueueFilters.from_query(
        request.GET if request.method == "GET" else request.POST
    )
    now = timezone.now()
    page = selectors.queue_page(
        project=request.project,
        filters=filters,
        user=request.user,
        now=now,
        after=selectors.QueueCursor.decode(request.GET.get("after")),
        before=selectors.QueueCursor.decode(request.GET.get("before")),
        last=request.GET.get("last") == "1",
    )
    counts = selectors.QueueCounts.read(
        project=request.project, filters=filters, user=request.user, now=now
    )
    seen = _parse_seen(request.GET.get("seen"))
    selected = {int(v) for v in request.GET.getlist("ids") if v.isdigit()}
    return {
        "nav_active": "review",
        "queue_url": reverse("reviews:queue", args=[request.project.slug]),
        "filters": filters,
        "page": page,
        "matching": counts.matching,
        "rows": _queue_rows(
            request,
            page.rows,
            filters=filters,
            similar=counts.similar(),
            seen=seen,
            selected=selected,
        ),
        "all_matching": request.GET.get("all_matching") == "1",
        # the poll reloads the same page
        "cursor_query": urlencode(
            {k: request.GET[k] for k in ("after", "before", "last") if request.GET.get(k)}
        ),
        "facets": {} if fragment else counts.facets(),
        "progress": [] if fragment else selectors.queue_progress(project=request.project, now=now),
        "operators": selectors.operators(project=request.project),
        "presets": services.REJECT_PRESETS,
        "now": now,
        "can_act": _can_act(request),
        "result": result,
        "age_choices": list(selectors.AGE_CHOICES),
        "fragment": fragment,
        **(
            {}
            if fragment
            else saved_views_menu(request, page=SavedView.Page.QUEUE, query=filters.query_string)
        ),
    }


@require_GET
@vary_on_headers("HX-Request")
@project_view()
def queue(request: ProjectRequest) -> HttpResponse:
    """The queue: filters in the URL, most urgent first; ``#queue-table`` polls every 5 s,
    ``#queue-counts`` (the operators' chips and the filters' counts) is fetched again after
    every action (``REVIEW_CHANGED``), so no count is older than the last claim or decision."""
    target = request.htmx.target if request.htmx else None
    if target == "queue-counts":
        return render(request, "reviews/queue.html#queue-counts", _queue_context(request))
    fragment = target == "queue-table"
    template = "reviews/queue.html#queue-table" if fragment else "reviews/queue.html"
    context = _queue_context(request, fragment=bool(fragment))
    # a malformed search is the request's fault: 400, the page naming the term
    return render(
        request, template, context, status=400 if context["filters"].search_error else 200
    )


@require_POST
@project_view(role=Role.OPERATOR)
def bulk(request: ProjectRequest) -> HttpResponse:
    """Bulk reject / assign / claim: the checked ids, or "all matching", which re-applies
    the posted filters now and acts on exactly that set."""
    form = BulkForm(request.POST)
    queue_url = reverse("reviews:queue", args=[request.project.slug])
    filters = selectors.QueueFilters.from_query(request.POST)
    result: dict[str, Any]
    if not form.is_valid():
        result = {"error": "Choose an action."}
    else:
        if form.cleaned_data["all_matching"]:
            items = selectors.queue_items(
                project=request.project, filters=filters, user=request.user
            )
        else:
            items = ReviewItem.objects.filter(pk__in=form.ids())
        assignee, username = None, form.cleaned_data["assignee"]
        if form.cleaned_data["action"] == "assign" and username:
            assignee = services.operator_by_username(
                project_id=request.project.pk, username=username
            )
        try:
            if form.cleaned_data["action"] == "assign" and username and assignee is None:
                raise services.ReviewError(services.no_such_operator(username))
            outcome = services.review_items_bulk(
                project=request.project,
                user=request.user,
                action=form.cleaned_data["action"],
                items=items,
                reason=form.reason_text(),
                assignee=assignee,
            )
            result = {"outcome": outcome, "action": form.cleaned_data["action"]}
        except services.ReviewError as exc:
            result = {"error": str(exc)}
    if not request.htmx:
        if "error" in result:
            messages.error(request, result["error"])
        else:
            o = result["outcome"]
            messages.success(
                request, f"{o.done} done, {o.conflicts} conflicts, {len(o.errors)} failed."
            )
        return HttpResponseRedirect(f"{queue_url}?{filters.query()}")
    query = request.GET.copy()
    for name, value in filters.as_dict().items():
        query[name] = value
    # django-stubs types request.GET as immutable, so it cannot take the mutable copy
    request.GET = query  # type: ignore[assignment]
    response = render(
        request,
        "reviews/queue.html#queue-table",
        _queue_context(request, result=result, fragment=True),
        status=422 if "error" in result else 200,
    )
    response["HX-Trigger"] = REVIEW_CHANGED
    return response


# --- item page -----------------------------------------------------------------------------------


def _item_context(
    request,
    item: ReviewItem,
    *,
    flash: str = "",
    flash_kind: str = "",
    confirm: str = "",
    confirm_error: str = "",
    edit_problems: list[dict] | None = None,
) -> dict:
    """The item page's context. ``flash_kind`` is "ok", "error" or "conflict" (someone
    else acted first: the banner offers a reload); ``confirm_error`` is shown inside the
    open ``confirm`` form, which keeps what was typed (``reason``, ``preset`` of the POST);
    ``edit_problems`` (``{"path", "msg"}``) beside the open "approve with edits" form, which
    keeps the typed ``arguments``."""
    call = item.call
    args_json, redacted = selectors.call_arguments_display(call)
    progress = selectors.reconcile_progress(item=item)
    audit = list(selectors.audit_rows(item=item))
    reconcile_why = services.reconcile_unavailable_reason(call)
    primary, primary_why = services.primary_action(item, reconcile_why=reconcile_why)
    return {
        "nav_active": "review",
        "item": item,
        "call": call,
        "contract": call.contract,
        "args_json": args_json,
        "redacted": redacted,
        "timeline": selectors.item_timeline(item=item),
        "reconciliations": selectors.item_reconciliations(item=item),
        "reconcile_progress": progress,
        "reconcile_why": reconcile_why,
        "primary": primary,
        "primary_why": primary_why,
        "comments": [a for a in audit if a.is_comment],
        "audit": audit,
        "deliveries": WebhookDelivery.objects.filter(item=item).order_by("created_at", "pk"),
        "allowed": services.allowed_decisions(item),
        "guard": services.approve_retry_guard(call)
        if item.kind == ReviewItem.Kind.ESCALATION
        else "",
        "lease_active": item.lease_active(),
        "mine": item.lease_active() and item.assignee_id == request.user.pk,
        "can_act": _can_act(request),
        "presets": services.REJECT_PRESETS,
        "operators": selectors.operators(project=request.project),
        "next": selectors.item_neighbours(item=item, user=request.user)["next"],
        "flash": flash,
        "flash_kind": flash_kind,
        "confirm": confirm if confirm in CONFIRMABLE else "",
        "confirm_error": confirm_error,
        "confirm_reason": request.POST.get("reason", "") if confirm_error else "",
        "confirm_preset": request.POST.get("preset", "") if confirm_error else "",
        "edit_problems": edit_problems or [],
        "edit_text": request.POST.get("arguments", "") if edit_problems else args_json,
        "edit_reason": request.POST.get("reason", "") if edit_problems else "",
        "edit_decision": "approve" if item.kind == ReviewItem.Kind.APPROVAL else "approve_retry",
    }


@require_GET
@vary_on_headers("HX-Request")
@project_view()
def item_detail(request: ProjectRequest, pk: int) -> HttpResponse:
    """The item page; ``?confirm=<decision>`` opens the inline reason form of that action."""
    item = _get_item(request, pk)
    confirm = request.GET.get("confirm", "") if _can_act(request) else ""
    fragment = request.htmx and request.htmx.target == "item"
    template = "reviews/item_detail.html#item" if fragment else "reviews/item_detail.html"
    return render(request, template, _item_context(request, item, confirm=confirm))


#: htmx event an answer triggers after anything that may change the open-item count; the
#: navigation's Review count listens for it (``_base.html``) and refreshes.
REVIEW_CHANGED = "review-changed"


def _answer(
    request, item: ReviewItem, *, ok: str = "", error: str = "", status: int = 200
) -> HttpResponse:
    """The action's answer: the item fragment (or queue row) for htmx, a redirect otherwise.
    Every htmx answer triggers ``REVIEW_CHANGED``."""
    response = _answer_body(request, item, ok=ok, error=error, status=status)
    if request.htmx:
        response["HX-Trigger"] = REVIEW_CHANGED
    return response


def _answer_body(request, item: ReviewItem, *, ok: str, error: str, status: int) -> HttpResponse:
    from_queue = request.POST.get("from") == "queue"
    if not request.htmx:
        (messages.error if error else messages.success)(request, error or ok)
        if from_queue:
            return HttpResponseRedirect(reverse("reviews:queue", args=[request.project.slug]))
        return HttpResponseRedirect(reverse("reviews:item", args=[request.project.slug, item.pk]))
    item = selectors.item_for_project(project=request.project, pk=item.pk)
    if from_queue:
        row = selectors.queue_items(
            project=request.project, filters=selectors.QueueFilters(status="all"), user=request.user
        ).get(pk=item.pk)
        selectors.annotate_rows(project=request.project, rows=[row])
        counts = selectors.QueueCounts.read(
            project=request.project, filters=selectors.QueueFilters(), user=request.user
        )
        context = {
            "row": _queue_rows(
                request, [row], filters=selectors.QueueFilters(), similar=counts.similar()
            )[0],
            "now": timezone.now(),
            "can_act": True,
            "row_flash": error or ok,
            "row_flash_kind": "error" if error else "ok",
            "project": request.project,
        }
        return render(request, "reviews/queue.html#queue-row", context, status=status)
    kind = ("conflict" if status == 409 else "error") if error else "ok"
    context = _item_context(request, item, flash=error or ok, flash_kind=kind)
    return render(request, "reviews/item_detail.html#item", context, status=status)


def _run(request, item, action, ok: str) -> HttpResponse:
    try:
        action()
    except services.ReviewConflict as exc:
        return _answer(request, exc.item, error=str(exc), status=409)
    except services.ReviewError as exc:
        return _answer(request, item, error=str(exc), status=422)
    return _answer(request, item, ok=ok)


@require_POST
@project_view(role=Role.OPERATOR)
def claim(request: ProjectRequest, pk: int) -> HttpResponse:
    item = _get_item(request, pk)
    return _run(
        request,
        item,
        lambda: services.review_item_claim(item=item, user=request.user),
        "Claimed. The claim lapses after a while without activity.",
    )


@require_POST
@project_view(role=Role.OPERATOR)
def release(request: ProjectRequest, pk: int) -> HttpResponse:
    item = _get_item(request, pk)
    return _run(
        request,
        item,
        lambda: services.review_item_release(item=item, user=request.user),
        "Released.",
    )


@require_POST
@project_view(role=Role.OPERATOR)
def assign(request: ProjectRequest, pk: int) -> HttpResponse:
    item = _get_item(request, pk)
    username = request.POST.get("assignee", "")
    assignee = (
        services.operator_by_username(project_id=request.project.pk, username=username)
        if username
        else None
    )
    if username and assignee is None:
        return _answer(request, item, error=services.no_such_operator(username), status=422)
    return _run(
        request,
        item,
        lambda: services.review_item_assign(item=item, user=request.user, assignee=assignee),
        f"Assigned to {username}." if username else "Unassigned.",
    )


@require_POST
@project_view(role=Role.OPERATOR)
def comment(request: ProjectRequest, pk: int) -> HttpResponse:
    item = _get_item(request, pk)
    form = CommentForm(request.POST)
    text = form.data.get("text", "")
    return _run(
        request,
        item,
        lambda: services.review_item_comment(item=item, user=request.user, text=text),
        "Comment added.",
    )


@require_POST
@project_view(role=Role.OPERATOR)
def reconcile(request: ProjectRequest, pk: int) -> HttpResponse:
    item = _get_item(request, pk)
    try:
        services.review_item_reconcile(item=item, user=request.user)
    except services.ReviewConflict as exc:
        return _answer(request, exc.item, error=str(exc), status=409)
    except services.ReviewError as exc:
        return _answer(request, item, error=str(exc), status=422)
    # the look-up may have finished already (an eager or fast worker): say so, not "looking…"
    progress = selectors.reconcile_progress(item=item)
    done = progress is not None and progress["done"]
    return _answer(
        request,
        item,
        ok="Reconciliation finished: the result is under Reconciliation."
        if done
        else "Reconciliation requested: looking the operation up in the target…",
    )


@require_POST
@project_view(role=Role.OPERATOR)
def extend(request: ProjectRequest, pk: int) -> HttpResponse:
    item = _get_item(request, pk)
    form = ExtendForm(request.POST)
    if not form.is_valid():
        return _answer(request, item, error="Choose how long to extend by.", status=422)
    seconds = form.cleaned_data["seconds"]
    return _run(
        request,
        item,
        lambda: services.review_item_extend(item=item, user=request.user, seconds=seconds),
        f"Approval timeout extended by {seconds // 60} min.",
    )


DECISION_DONE = {
    "approve": "Approved: the agent may execute the call.",
    "approve_retry": "Retry approved: the agent retries under the same operation ID.",
    "reject": "Rejected: the agent gets your reason as the observation.",
    "mark_applied": "Marked applied: the call has a receipt.",
    "mark_failed": "Marked failed: the call stops.",
}


DECISION_DONE_WITH_EDITS = {
    "approve": "Approved with your edits: the agent executes the call with the edited arguments",
    "approve_retry": "Retry approved with your edits: the agent retries with the edited arguments",
}


def _edit_refused(request, item: ReviewItem, problems: list[dict]) -> HttpResponse:
    """The "approve with edits" form again, with what was typed and each problem by path
    (422; without htmx the problems are a message on the page)."""
    if not request.htmx:
        return _answer(
            request, item, error=str(services.ReviewArgumentsRefused(problems)), status=422
        )
    context = _item_context(request, item, confirm="edit", edit_problems=problems)
    return render(request, "reviews/item_detail.html#item", context, status=422)


@require_POST
@project_view(role=Role.OPERATOR)
def decide(request: ProjectRequest, pk: int) -> HttpResponse:
    """Approve / approve retry / reject / mark applied / mark failed (``decision`` in the form).

    ``arguments`` (approve and approve retry): "approve with edits", the call's arguments
    as a JSON object text. Text that is not strict JSON (NaN, Infinity, 1e400, an integer
    of more than 4,300 digits: ``arguments_parse``), a NUL or unpaired surrogate, or
    arguments the contract refuses, answer 422 with the form kept and each problem by JSON
    path (``$`` and line/column for JSON syntax); nothing changes."""
    item = _get_item(request, pk)
    form = DecisionForm(request.POST)
    if not form.is_valid():
        return _answer(request, item, error="Unknown decision.", status=422)
    decision = form.cleaned_data["decision"]
    arguments = None
    if "arguments" in request.POST:
        try:
            arguments = arguments_parse(request.POST["arguments"])
        except ArgumentsRefused as exc:
            return _edit_refused(request, item, exc.problems)
        if not isinstance(arguments, dict):
            return _edit_refused(request, item, [{"path": "$", "msg": "must be a JSON object"}])
    override = form.cleaned_data["override"]
    needs_reason = decision in services.DECISIONS_NEEDING_REASON or (
        decision == "approve_retry" and override
    )
    if needs_reason and not form.reason_text() and request.htmx and item.is_open:
        if request.POST.get("from") != "queue":
            # keep the form open with what was typed and say what is missing, beside the field
            context = _item_context(
                request,
                item,
                confirm="override" if override else decision,
                confirm_error="Give a reason: the agent reads it as the observation."
                if not override
                else "Give a reason for the override: it is recorded in the audit trail.",
            )
            return render(request, "reviews/item_detail.html#item", context, status=422)
    if (
        request.POST.get("from") == "queue"
        and decision == "approve"
        and item.is_open
        and item.kind == ReviewItem.Kind.APPROVAL
        and not (item.lease_active() and item.assignee_id == request.user.pk)
    ):
        # the list's one-key approve acts only on an approval request the operator claimed
        return _answer(request, item, error=services.QUEUE_APPROVE_NEEDS_CLAIM, status=422)
    if (
        request.POST.get("from") == "queue"
        and decision == "approve_retry"
        and item.is_open
        and services.queue_approve_action(item)[1] == services.QUEUE_NO_RETRY
    ):
        # nor does it retry what the observation says not to retry (the item page can)
        return _answer(request, item, error=services.QUEUE_NO_RETRY, status=422)
    if arguments is None:
        return _run(
            request,
            item,
            lambda: services.review_item_decide(
                item=item,
                user=request.user,
                decision=decision,
                reason=form.reason_text(),
                override=form.cleaned_data["override"],
            ),
            DECISION_DONE[decision],
        )
    before = item.call.operation_id
    try:
        decided = services.review_item_decide(
            item=item,
            user=request.user,
            decision=decision,
            reason=form.reason_text(),
            override=form.cleaned_data["override"],
            arguments=arguments,
        )
    except services.ReviewArgumentsRefused as exc:
        return _edit_refused(request, item, exc.problems)
    except services.ReviewConflict as exc:
        return _answer(request, exc.item, error=str(exc), status=409)
    except services.ReviewError as exc:
        return _answer(request, item, error=str(exc), status=422)
    after = decided.call.operation_id
    if decided.call.decision_arguments is None:
        return _answer(
            request, decided, ok=DECISION_DONE[decision] + " (the arguments were unchanged)"
        )
    new_op = f" under the new operation ID {after}" if after != before else ""
    return _answer(request, decided, ok=f"{DECISION_DONE_WITH_EDITS[decision]}{new_op}.")


@require_GET
@project_view()
def reconcile_status(request: ProjectRequest, pk: int) -> HttpResponse:
    """The "Reconcile now" progress fragment, polled until the ``reconciled`` event arrives;
    then it answers with the result and triggers ``reconciled`` so the page refreshes."""
    item = _get_item(request, pk)
    context: dict[str, Any] = {
        "item": item,
        "reconcile_progress": selectors.reconcile_progress(item=item),
        "project": request.project,
    }
    response = render(request, "reviews/item_detail.html#reconcile-status", context)
    if (
        context["reconcile_progress"]
        and context["reconcile_progress"]["done"]
        and request.GET.get("polling")
    ):
        response["HX-Trigger"] = "reconciled"
    return response


@require_GET
@project_view()
def open_count(request: ProjectRequest) -> HttpResponse:
    """The navigation's Review count (a fragment), refreshed on ``REVIEW_CHANGED``."""
    return render(
        request,
        "reviews/_nav_count.html",
        {"count": open_review_count(project=request.project), "project": request.project},
    )


@require_GET
@project_view()
def audit_csv(request: ProjectRequest, pk: int) -> HttpResponse:
    """The item's audit trail as CSV: when (UTC, ISO 8601), who, what, the item's and the
    call's state before and after, reason; every cell a label people read, never a code."""
    item = _get_item(request, pk)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="review-{item.pk}-audit.csv"'
    writer = csv.writer(response)
    writer.writerow(
        [
            "When (UTC)",
            "Who",
            "What",
            "Item before",
            "Item after",
            "Call before",
            "Call after",
            "Reason",
            "Override",
        ]
    )
    actions = dict(ReviewAudit.Action.choices)
    statuses = dict(ReviewItem.Status.choices)
    for row in selectors.audit_rows(item=item):
        writer.writerow(
            [
                csv_safe(value)
                for value in (
                    row.created_at.astimezone(UTC).isoformat(),
                    row.actor.get_username() if row.actor else "callgate",
                    actions.get(row.action, row.action),
                    statuses.get(row.state_before, row.state_before),
                    statuses.get(row.state_after, row.state_after),
                    labels.label(row.call_state_before, "state") if row.call_state_before else "",
                    labels.label(row.call_state_after, "state") if row.call_state_after else "",
                    row.reason,
                    "yes" if row.override else "",
                )
            ]
        )
    return response
