"""Decisions outside the dashboard (issue 31): Slack's interaction endpoint, the email
decision links' confirmation page, and the Notifications settings page. The rules live in
``reviews.notifications`` and ``reviews.slack``; these views parse, call and answer.

- ``POST /integrations/slack/actions``: Slack's ``block_actions`` interactions (form field
  ``payload``, JSON). 401 for a missing or bad signature or a timestamp more than five
  minutes off (nothing decided), 400 naming the field for a payload callgate cannot read,
  else 200 with an empty body; the reply goes to the payload's ``response_url`` from a
  worker (``reviews.tasks.slack_respond``).
- ``GET|HEAD /integrations/email/<token>/``: the confirmation page of a decision link (never
  decides: mail scanners prefetch links); ``POST`` decides once. 400 tampered, 410 used or
  expired, 403 the link's user lost the role, 409 someone decided first, 422 a rejection
  without a reason; each with a page that says so.
- ``GET|HEAD /integrations/slack/link/<token>/``: the confirmation page of a Slack link (the
  one-time link an unlinked Slack member gets when they click a callgate message); ``POST``
  links that Slack member to the logged-in user. 400 tampered, 410 used or expired, 409
  the member is linked to another user.
- ``/p/<project>/review/notifications/``: the user's Slack link (shown, and unlinked) and
  email subscription; the project's Slack webhook and addresses for managers.
"""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST

from callgate.access import ProjectRequest, Role, project_view
from callgate.celery import enqueue_on_commit
from reviews import notifications, slack
from reviews.forms import EmailDecisionForm, ProjectNotificationsForm
from reviews.models import ProjectNotifications
from reviews.services import REJECT_PRESETS, ReviewConflict, ReviewError

# --- Slack -------------------------------------------------------------------------------------


@csrf_exempt  # Slack signs its requests instead (slack_request_verified)
@require_POST
def slack_actions(request: HttpRequest) -> HttpResponse:
    """Slack's interaction requests (see the module docstring for the answers)."""
    if not slack.slack_request_verified(body=request.body, headers=request.headers):
        return JsonResponse(
            {
                "error": "signature",
                "detail": "Bad or missing Slack signature, or an old timestamp.",
            },
            status=401,
        )
    try:
        payload = json.loads(request.POST.get("payload", ""))
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json can read
        return JsonResponse(
            {"error": "payload", "detail": "payload must be a JSON object."}, status=400
        )
    if not isinstance(payload, dict):
        return JsonResponse(
            {"error": "payload", "detail": "payload must be a JSON object."}, status=400
        )
    try:
        reply = slack.slack_action(payload)
    except slack.SlackPayloadError as exc:
        return JsonResponse({"error": "payload", "detail": str(exc)}, status=400)
    enqueue_on_commit("reviews.tasks.slack_respond", reply.response_url, reply.body)
    return HttpResponse(status=200)


# --- email decision links ---------------------------------------------------------------------


def _link_page(
    request: HttpRequest,
    *,
    status: int = 200,
    link=None,
    item=None,
    error: str = "",
    done: str = "",
    form=None,
) -> HttpResponse:
    """The decision link's page: what it decides (``link``), or its result (``done``), or
    why it cannot (``error``), with the item's link when the item is known."""
    item = item or (link.item if link else None)
    return render(
        request,
        "reviews/email_decision.html",
        {
            "link": link,
            "item": item,
            "decision_label": notifications.LINK_DECISIONS.get(link.decision, "") if link else "",
            "item_url": notifications.item_url(item) if item else "",
            "arguments": notifications.arguments_full(item.call.arguments) if item else "",
            "error": error,
            "done": done,
            "form": form,
            "presets": REJECT_PRESETS,
        },
        status=status,
    )


@never_cache  # the page shows a decision's state, and its URL is a credential
@require_http_methods(["GET", "HEAD", "POST"])
def email_decision(request: HttpRequest, token: str) -> HttpResponse:
    """An email decision link: GET/HEAD shows what it will decide and a button; POST (with
    ``reason``/``preset`` for a rejection) decides as the link's user, once."""
    try:
        link = notifications.decision_link_read(token)
    except notifications.LinkError as exc:
        return _link_page(request, status=exc.status, error=str(exc), item=exc.item)
    if request.method != "POST":
        return _link_page(request, link=link)
    form = EmailDecisionForm(request.POST)
    if not form.is_valid():
        return _link_page(
            request, link=link, status=422, form=form, error="The reason is too long."
        )
    try:
        item = notifications.decision_link_use(token=token, reason=form.reason_text())
    except notifications.LinkError as exc:
        return _link_page(request, status=exc.status, error=str(exc))
    except ReviewConflict as exc:
        return _link_page(request, link=link, item=exc.item, status=409, error=str(exc))
    except ReviewError as exc:
        return _link_page(request, link=link, status=422, form=form, error=str(exc))
    return _link_page(request, item=item, done=notifications.outcome(item))


# --- linking a Slack member -----------------------------------------------------------------------


@never_cache  # the URL is a credential
@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def slack_link(request: HttpRequest, token: str) -> HttpResponse:
    """A Slack link (sent to an unlinked Slack member in the ephemeral reply to their click):
    GET/HEAD shows which Slack member it links to the logged-in user and a button; POST
    links them, once. 400 tampered, 410 used or expired, 409 the member is linked to another
    user; each with a page that says so. Not logged in: the login page, then back here."""
    try:
        link = notifications.slack_link_read(token)
    except notifications.LinkError as exc:
        return render(request, "reviews/slack_link.html", {"error": str(exc)}, status=exc.status)
    identity = notifications.slack_identity_of(request.user)
    context: dict[str, object] = {
        "link": link,
        "identity": identity,
        "replaces": identity is not None
        and (identity.team_id, identity.slack_user_id) != (link.team_id, link.slack_user_id),
    }
    if request.method != "POST":
        if notifications.slack_member_taken(request=link, user=request.user):
            context["error"] = notifications.SLACK_MEMBER_TAKEN
            return render(request, "reviews/slack_link.html", context, status=409)
        return render(request, "reviews/slack_link.html", context)
    try:
        linked = notifications.slack_link_use(token=token, user=request.user)
    except notifications.LinkError as exc:
        return render(
            request, "reviews/slack_link.html", {**context, "error": str(exc)}, status=exc.status
        )
    return render(request, "reviews/slack_link.html", {"done": linked})


# --- the Notifications page ---------------------------------------------------------------------


def _settings_page(request: ProjectRequest, *, status: int = 200, **forms) -> HttpResponse:
    identity = notifications.slack_identity_of(request.user)
    can_manage = request.membership.has_role(Role.MANAGER)
    config = ProjectNotifications.objects.filter(project=request.project).first()
    context = {
        "nav_active": "notifications",
        "identity": identity,
        "slack_link_minutes": notifications.SLACK_LINK_MAX_AGE // 60,
        "can_decide": request.membership.has_role(Role.OPERATOR),
        "subscribed": notifications.email_subscribed(
            user=request.user, project_id=request.project.pk
        ),
        "can_manage": can_manage,
        "config": config,
        "project_form": forms.get("project_form")
        or (ProjectNotificationsForm(instance=config) if can_manage else None),
    }
    return render(request, "reviews/notifications.html", context, status=status)


@require_http_methods(["GET", "POST"])
@project_view()
def notification_settings(request: ProjectRequest) -> HttpResponse:
    """GET the page; POST one of its forms (``form``: ``slack_remove``, ``email``,
    ``project``), 422 with the form's errors beside its fields. A Slack member is linked
    only through ``slack_link`` (a link Slack's signed click earned), never typed here."""
    if request.method == "GET":
        return _settings_page(request)
    which = request.POST.get("form", "")
    if which == "slack_remove":
        notifications.slack_identity_remove(user=request.user)
        messages.success(request, "Your Slack account is unlinked.")
    elif which == "email":
        if not request.membership.has_role(Role.OPERATOR):
            return HttpResponse("Email decisions need the operator role.", status=403)
        subscribed = request.POST.get("subscribed") == "on"
        notifications.email_subscription_set(
            user=request.user, project_id=request.project.pk, subscribed=subscribed
        )
        messages.success(
            request,
            "You will get an email for each new review item."
            if subscribed
            else "You will get no more review item emails.",
        )
    elif which == "project":
        if not request.membership.has_role(Role.MANAGER):
            return HttpResponse("Project notifications need the manager role.", status=403)
        config = ProjectNotifications.objects.filter(project=request.project).first()
        project_form = ProjectNotificationsForm(
            request.POST, instance=config or ProjectNotifications(project=request.project)
        )
        if not project_form.is_valid():
            return _settings_page(request, status=422, project_form=project_form)
        project_form.save()
        messages.success(request, "The project's notifications are saved.")
    else:
        return HttpResponse("form must be slack_remove, email or project.", status=400)
    return redirect("reviews:notifications", request.project.slug)
