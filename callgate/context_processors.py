from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial

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


#: Counts beside navigation links that other apps provide, by NAV key: (the least role that
#: sees it, ``count(project=...) -> int``). An app registers its own in ``AppConfig.ready``
#: (callgate imports none of them); each is queried at most once a page.
NAV_COUNTS: dict[str, tuple[str, Callable[..., int]]] = {}


def navigation(request: HttpRequest) -> dict:
    """The project switcher's list, the current project (set by ``project_view``) and the
    main navigation with the open review count and the counts of ``NAV_COUNTS``."""
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    project = getattr(request, "project", None)
    membership = getattr(request, "membership", None)
    links = []
    if project is not None:
        for key, label, name in NAV:
            try:
                url = reverse(name, args=[project.slug])
            except NoReverseMatch:  # a page that this installation does not serve
                continue
            # the count is a callable: templates that show no navigation (htmx fragments) never query it
            count: Callable[[], int] | int = (
                partial(open_review_count, project=project) if key == "review" else 0
            )
            if key in NAV_COUNTS and membership is not None:
                role, counter = NAV_COUNTS[key]
                if membership.has_role(role):
                    count = cache(partial(counter, project=project))
            links.append({"key": key, "label": label, "url": url, "count": count})
    return {
        "nav_projects": user_projects(request.user).only("slug", "name"),
        "project": project,
        "membership": membership,
        "nav_links": links,
    }
