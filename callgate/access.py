"""The one place where users and keys are scoped to their projects.

Every page and API view that serves project data goes through ``project_view`` (browser)
or ``request.auth.project`` (API keys, see ``callgate.auth``). An object of a project the
caller cannot see is a 404, never a 403: its existence is not revealed. A member whose
role is too low for an action gets a 403.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import cast

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django_htmx.middleware import HtmxDetails

from callgate.models import Membership, Project

Role = Membership.Role


class ProjectRequest(HttpRequest):
    """The request a ``project_view`` hands to its view (for type checking): the project
    and the caller's membership resolved, and django-htmx's ``htmx`` details."""

    project: Project
    membership: Membership
    htmx: HtmxDetails


def user_projects(user) -> QuerySet[Project]:
    """The projects ``user`` is a member of."""
    if not getattr(user, "is_authenticated", False):
        return Project.objects.none()
    return Project.objects.filter(memberships__user=user).distinct()


def membership_for(user, project_slug: str) -> Membership:
    """The user's membership of the project, or Http404 when there is none."""
    membership = (
        Membership.objects.select_related("project")
        .filter(user=user, project__slug=project_slug)
        .first()
    )
    if membership is None:
        raise Http404("No such project.")
    return membership


def require_role(request: ProjectRequest, role: str) -> None:
    """403 unless the request's membership has ``role`` or a higher one."""
    if not request.membership.has_role(role):
        raise PermissionDenied(f"This needs the {role} role in {request.project.name}.")


def project_view(role: str = Role.VIEWER) -> Callable:
    """Decorator for views under ``/p/<project>/``: sets ``request.project`` and
    ``request.membership`` (404 for non-members, 403 for a too-low role)."""

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @login_required
        @functools.wraps(view)
        def wrapper(request: HttpRequest, project: str, *args, **kwargs) -> HttpResponse:
            scoped = cast(ProjectRequest, request)
            scoped.membership = membership_for(request.user, project)
            scoped.project = scoped.membership.project
            require_role(scoped, role)
            return view(scoped, *args, **kwargs)

        return wrapper

    return decorator
