from __future__ import annotations

from functools import partial

from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse

from callgate.access import user_projects
from callgate.selectors import open_review_count

#: (key, label, url name) of the main navigation; a page's view sets ``nav_active`` to its key.
NAV = [
    ("calls", "Calls", "callgate:calls"),
    ("review", "Review", "reviews:queue"),
    ("reports", "Reports", "callgate:reports"),
    ("contracts", "Contracts", "callgate:contracts"),
    ("agents", "Agents", "callgate:agents"),
    ("gateway", "MCP gateway", "mcp_gateway:gateway"),
    ("alerts", "Alerts", "alerts:rules"),
]


def navigation(request: HttpRequest) -> dict:
    """The project switcher's list, the current project (set by ``project_view``) and the
    main navigation with the open review count."""
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    project = getattr(request, "project", None)
    links = []
    if project is not None:
        for key, label, name in NAV:
            try:
                url = reverse(name, args=[project.slug])
            except NoReverseMatch:  # a page that this installation does not serve
                continue
            # the count is a callable: templates that show no navigation (htmx fragments) never query it
            links.append(
                {
                    "key": key,
                    "label": label,
                    "url": url,
                    "count": partial(open_review_count, project=project) if key == "review" else 0,
                }
            )
    return {
        "nav_projects": user_projects(request.user).only("slug", "name"),
        "project": project,
        "membership": getattr(request, "membership", None),
        "nav_links": links,
    }
