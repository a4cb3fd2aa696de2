"""Alert pages: the rules (managers edit, operators read) and the alert history."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict, cast

from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
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


def _rules_page(request: ProjectRequest, *, form=None, editing=None, status: int = 200):
    rules = cast(  # each rule gets its texts below
        "list[WithAnnotations[AlertRule, _RuleTexts]]",
        list(AlertRule.objects.filter(project=request.project).select_related("agent")),
    )
    for rule in rules:
        rule.condition = services.describe(rule)
        rule.value_text = services.format_value(rule, rule.last_value)
        rule.threshold_text = services.format_value(rule, rule.threshold)
        rule.clear_text = services.format_value(rule, rule.clear_threshold)
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


@require_GET
@project_view(role=Role.OPERATOR)
def history(request: ProjectRequest) -> HttpResponse:
    """Every time a rule fired or resolved, newest first, with its deliveries."""
    events = (
        AlertEvent.objects.filter(project=request.project)
        .select_related("rule")
        .prefetch_related("deliveries")[:200]
    )
    return render(request, "alerts/history.html", {"nav_active": "alerts", "events": events})
