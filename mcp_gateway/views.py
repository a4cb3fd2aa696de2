"""The gateway page of a project: its upstream MCP servers, their tools, health and last
error; project admins add and change upstreams (target, timeout, per-tool overrides)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TypedDict, cast

from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from callgate.access import ProjectRequest, Role, project_view
from mcp_gateway import services
from mcp_gateway.models import Upstream

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


class _OverridesText(TypedDict):
    """What the gateway page sets on each upstream for its form."""

    overrides_json: str


def _page(request: ProjectRequest, *, status: int = 200, error: str = "", form: dict | None = None):
    upstreams = cast(  # each upstream gets its overrides_json below
        "list[WithAnnotations[Upstream, _OverridesText]]",
        list(Upstream.objects.filter(project=request.project)),
    )
    for upstream in upstreams:
        upstream.overrides_json = (
            json.dumps(upstream.tool_overrides) if upstream.tool_overrides else ""
        )
    return render(
        request,
        "mcp_gateway/gateway.html",
        {
            "upstreams": upstreams,
            "can_manage": request.membership.has_role(Role.ADMIN),
            "error": error,
            "form": form or {},
            "nav_active": "gateway",
        },
        status=status,
    )


@require_GET
@project_view()
def gateway(request: ProjectRequest) -> HttpResponse:
    """Upstreams with their tools (as last listed), health and last error."""
    return _page(request)


@require_POST
@project_view(role=Role.ADMIN)
def upstream_save(request: ProjectRequest) -> HttpResponse:
    """Add an upstream, or change the one named in the form. Answers 400 with the field's
    problem (the form keeps what was typed)."""
    form: dict[str, Any] = {
        key: request.POST.get(key, "").strip() for key in ("name", "target", "timeout", "overrides")
    }
    form["enabled"] = request.POST.get("enabled", "on") == "on"
    try:
        timeout = float(form["timeout"] or 30)
    except ValueError:
        return _page(request, status=400, error="timeout: must be a number of seconds", form=form)
    try:
        overrides = json.loads(form["overrides"] or "{}")
    except ValueError as exc:
        return _page(request, status=400, error=f"tool overrides: not JSON ({exc})", form=form)
    try:
        services.upstream_configure(
            project=request.project,
            name=form["name"],
            target=form["target"],
            timeout_seconds=timeout,
            enabled=form["enabled"],
            tool_overrides=overrides,
        )
    except ValueError as exc:
        return _page(request, status=400, error=str(exc), form=form)
    return redirect("mcp_gateway:gateway", request.project.slug)


@require_POST
@project_view(role=Role.ADMIN)
def upstream_delete(request: ProjectRequest, pk: int) -> HttpResponse:
    """Remove an upstream (its tools' contracts stay: calls keep pointing at them)."""
    get_object_or_404(Upstream, pk=pk, project=request.project).delete()
    return redirect("mcp_gateway:gateway", request.project.slug)
