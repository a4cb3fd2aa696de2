"""Alert pages: the rules (managers edit, operators read), the alert history, and the
operators' actions on a firing alert (acknowledge, snooze, unsnooze, resolve)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, TypedDict, cast

from django.contrib import messages
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from alerts import services
from alerts.forms import AlertRuleForm
from alerts.models import AlertEvent, AlertRule
from callgate.access import ProjectRequest, Role, project_view

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


class _RuleTexts(TypedDict):
    """What the rules page sets on each rule for its table."""

    condition: str
    value_text: str
    threshold_text: str
    clear_text: str
    calls_link: str | None


def _rules_page(request: ProjectRequest, *, form=None, editing=None, status: int = 200):
    rules = cast(  # each rule gets its texts below
        "list[WithAnnotations[AlertRule, _RuleTexts]]",
        list(AlertRule.objects.filter(project=request.project).select_related("agent", "project")),
    )
    for rule in rules:
        rule.condition = services.describe(rule)
        rule.value_text = services.format_value(rule, rule.last_value)
        rule.threshold_text = services.format_value(rule, rule.threshold)
        rule.clear_text = services.format_value(rule, rule.clear_threshold)
        rule.calls_link = (
            services.alert_calls_link(rule, at=rule.last_evaluated_at)
            if rule.last_evaluated_at
            else None
        )
    can_manage = request.membership.has_role(Role.MANAGER)
    if form is None and can_manage:
        form = AlertRuleForm(project=request.project, instance=editing)
    return render(
        request,
        "alerts/rules.html",
        {
            "nav_active": "alerts",
            "rules": rules,
            "form": form,
            "editing": editing,
            "can_manage": can_manage,
        },
        status=status,
    )


@require_GET
@project_view(role=Role.OPERATOR)
def rules(request: ProjectRequest) -> HttpResponse:
    """The project's alert rules with their state and last value; managers get the form."""
    editing = None
    if request.GET.get("edit", "").isdigit() and request.membership.has_role(Role.MANAGER):
        editing = AlertRule.objects.filter(project=request.project, pk=request.GET["edit"]).first()
    return _rules_page(request, editing=editing)


@require_POST
@project_view(role=Role.MANAGER)
def rule_save(request: ProjectRequest) -> HttpResponse:
    """Create a rule, or update the one named by ``pk``; 422 with the form's errors."""
    instance = None
    if request.POST.get("pk", "").isdigit():
        instance = AlertRule.objects.filter(project=request.project, pk=request.POST["pk"]).first()
        if instance is None:
            raise Http404("No such rule in this project.")
    form = AlertRuleForm(request.POST, project=request.project, instance=instance)
    if not form.is_valid():
        return _rules_page(request, form=form, editing=instance, status=422)
    rule = form.save(commit=False)
    rule.project = request.project
    if instance is None:
        rule.created_by = request.user
    if (
        AlertRule.objects.filter(project=request.project, name=rule.name)
        .exclude(pk=rule.pk)
        .exists()
    ):
        form.add_error("name", "Another rule has this name.")
        return _rules_page(request, form=form, editing=instance, status=422)
    rule.save()
    return redirect("alerts:rules", request.project.slug)


@require_POST
@project_view(role=Role.MANAGER)
def rule_delete(request: ProjectRequest, pk: int) -> HttpResponse:
    AlertRule.objects.filter(project=request.project, pk=pk).delete()
    return redirect("alerts:rules", request.project.slug)


@require_http_methods(["POST"])
@project_view(role=Role.MANAGER)
def rule_evaluate(request: ProjectRequest, pk: int) -> HttpResponse:
    """Evaluate one rule now (what beat does every minute)."""
    rule = AlertRule.objects.filter(project=request.project, pk=pk).first()
    if rule is None:
        raise Http404("No such rule in this project.")
    services.alert_rule_evaluate(rule)
    return redirect("alerts:rules", request.project.slug)


#: rows of the alert history page
HISTORY_ROWS = 200


@require_GET
@project_view(role=Role.OPERATOR)
def history(request: ProjectRequest) -> HttpResponse:
    """The firing alerts with their actions, then every event of every rule (fired, still
    firing, resolved, acknowledged, snoozed, snooze ended), newest first, with who acted,
    the link to the calls behind it (as counted then) and its deliveries."""
    events = list(
        AlertEvent.objects.filter(project=request.project)
        .select_related("rule__project", "rule__agent", "actor")
        .prefetch_related("deliveries")[:HISTORY_ROWS]
    )
    rows = [{"event": e, "link": services.alert_calls_link(e.rule, at=e.at)} for e in events]
    return render(request, "alerts/history.html", {"nav_active": "alerts", "rows": rows})


def _rule(request: ProjectRequest, pk: int) -> AlertRule:
    rule = (
        AlertRule.objects.filter(project=request.project, pk=pk)
        .select_related("project", "agent")
        .first()
    )
    if rule is None:
        raise Http404("No such rule in this project.")
    return rule


def _back(request: ProjectRequest) -> HttpResponseRedirect:
    """To ``next`` when it is a path on this site, else the alert history."""
    target = request.POST.get("next", "")
    if not target.startswith("/") or not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = reverse("alerts:history", args=[request.project.slug])
    return HttpResponseRedirect(target)


def _act(request: ProjectRequest, pk: int, action) -> HttpResponse:
    """Run a service action on the project's rule ``pk`` (404 for another project's) and go
    back; 409 with the reason when the rule's state does not allow it (someone acted
    first)."""
    rule = _rule(request, pk)
    try:
        event = action(rule)
    except services.AlertActionError as exc:
        return _refused(request, exc, status=409)
    messages.success(request, event.message)
    return _back(request)


def _refused(request: ProjectRequest, exc: Exception, *, status: int) -> HttpResponse:
    """The page of an alert action that was not done: why (``exc``'s text), and the way
    back; ``status`` 400 (bad input) or 409 (the rule's state does not allow it)."""
    return render(
        request,
        "alerts/action_refused.html",
        {"nav_active": "alerts", "error": str(exc), "back": _back(request).url},
        status=status,
    )


@require_POST
@project_view(role=Role.OPERATOR)
def rule_acknowledge(request: ProjectRequest, pk: int) -> HttpResponse:
    """Acknowledge a firing alert: no reminders until it resolves. 404 for another
    project's rule, 409 when it is not firing or acknowledged already."""
    return _act(request, pk, lambda rule: services.alert_acknowledge(rule=rule, actor=request.user))


def _positive_int(request: ProjectRequest, name: str, maximum: int) -> int | None:
    """The POST field ``name`` as a whole number 1..``maximum``; None when blank. Raises
    ``ValueError`` naming the field."""
    raw = request.POST.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= maximum:
        raise ValueError(f"{name}: a whole number from 1 to {maximum:,}, got {raw[:20]!r}.")
    return int(raw)


@require_POST
@project_view(role=Role.OPERATOR)
def rule_snooze(request: ProjectRequest, pk: int) -> HttpResponse:
    """Snooze an alert: POST ``minutes`` (1–43,200: for that long) and/or ``calls`` (1–
    1,000,000: until that many more matching calls). 400 naming the field for a bad or
    missing value, 404 for another project's rule."""
    rule = _rule(request, pk)
    try:
        minutes = _positive_int(request, "minutes", int(services.MAX_SNOOZE.total_seconds() // 60))
        calls = _positive_int(request, "calls", services.MAX_SNOOZE_CALLS)
        duration = timedelta(minutes=minutes) if minutes is not None else None
        event = services.alert_snooze(rule=rule, actor=request.user, duration=duration, calls=calls)
    except ValueError as exc:
        return _refused(request, exc, status=400)
    messages.success(request, event.message)
    return _back(request)


@require_POST
@project_view(role=Role.OPERATOR)
def rule_unsnooze(request: ProjectRequest, pk: int) -> HttpResponse:
    """End a snooze now. 404 for another project's rule, 409 when it is not snoozed."""
    return _act(request, pk, lambda rule: services.alert_unsnooze(rule=rule, actor=request.user))


@require_POST
@project_view(role=Role.OPERATOR)
def rule_resolve(request: ProjectRequest, pk: int) -> HttpResponse:
    """Resolve a firing alert by hand (it fires again at the next evaluation if its number
    is still at the threshold). 404 for another project's rule, 409 when it is not
    firing."""
    return _act(request, pk, lambda rule: services.alert_resolve(rule=rule, actor=request.user))
