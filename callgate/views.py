"""Browser pages of the core app (htmx). Review pages live in ``reviews.views``."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from callgate import selectors
from callgate.access import project_view, user_projects


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
