"""Writes of the core domain. Views, commands and tasks call these; nothing else writes.

Services take keyword-only arguments, validate, and keep their transactions short.
"""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils.text import slugify

from callgate.models import Agent, Membership, Project


def project_create(*, slug: str, name: str) -> tuple[Project, bool]:
    """Create a project, or return the existing one with this slug. Raises ValueError on a bad slug."""
    if slugify(slug) != slug or not slug:
        raise ValueError(f"project slug must be lowercase letters, digits and hyphens, got {slug!r}")
    return Project.objects.get_or_create(slug=slug, defaults={"name": name})


def project_by_slug(slug: str) -> Project:
    project = Project.objects.filter(slug=slug).first()
    if project is None:
        raise ValueError(f"no project with slug {slug!r}")
    return project


@transaction.atomic
def membership_set(*, project_slug: str, username: str, role: str, password: str | None = None) -> Membership:
    """Give ``username`` the ``role`` in the project (created or changed). With ``password`` a
    missing user is created. Raises ValueError for an unknown project or user."""
    project = project_by_slug(project_slug)
    if role not in Membership.Role.values:
        raise ValueError(f"role must be one of {', '.join(Membership.Role.values)}, got {role!r}")
    User = get_user_model()
    user = User.objects.filter(username=username).first()
    if user is None:
        if not password:
            raise ValueError(f"no user {username!r}; pass --password to create one")
        user = User.objects.create_user(username=username, password=password)
    membership, _ = Membership.objects.update_or_create(user=user, project=project, defaults={"role": role})
    return membership


def agent_get_or_create(*, project_slug: str, name: str) -> Agent:
    project = project_by_slug(project_slug)
    agent, _ = Agent.objects.get_or_create(project=project, name=name)
    return agent
