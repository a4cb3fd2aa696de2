"""``{% firing_alerts %}``: the panel of firing alerts, with their actions, on any project
page (the overview, the alert history). Operators and above; nothing for others."""

from __future__ import annotations

from django import template

from alerts.selectors import firing_panel
from callgate.access import Role

register = template.Library()


@register.inclusion_tag("alerts/_firing_panel.html", takes_context=True)
def firing_alerts(context: template.Context) -> dict:
    request = context["request"]
    membership = getattr(request, "membership", None)
    if membership is None or not membership.has_role(Role.OPERATOR):
        return {"show": False}
    return {
        "show": True,
        "project": request.project,
        "rows": firing_panel(project=request.project),
        "next": request.get_full_path(),
        "csrf_token": context.get("csrf_token"),
    }
