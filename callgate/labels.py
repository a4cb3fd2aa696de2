"""The one table of labels people read for the machine words callgate stores: reasons,
categories and routes (``callgate.taxonomy``), call states and event kinds
(``callgate.models``), operator decisions and review resolutions (shared/UI.md: words for
people, codes for machines). Pages show the label with the slug in a tooltip (the
``label`` filter and ``{% labelled %}`` tag of ``callgate_tags``); CSV and the API keep
the slug."""

from __future__ import annotations

from callgate.models import CallEvent, ToolCall
from callgate.taxonomy import Category, Reason, Route

#: operator decisions (``callgate.lifecycle.ALLOWED_DECISIONS``) and review resolutions
DECISIONS = {
    "approve": "Approved",
    "approve_retry": "Approved retry",
    "reject": "Rejected",
    "mark_applied": "Marked applied",
    "mark_failed": "Marked failed",
    "expired": "Expired",
    "settled": "Settled by a later event",
}

TABLES: dict[str, dict[str, str]] = {
    "reason": dict(Reason.choices),
    "category": dict(Category.choices),
    "route": dict(Route.choices),
    "state": dict(ToolCall.State.choices),
    "event": dict(CallEvent.Kind.choices),
    "decision": DECISIONS,
}
#: what a blank value means, per kind
BLANK = {"reason": "Not classified yet", "category": "Unclassified", "route": "No route yet"}


def label(value: str | None, kind: str) -> str:
    """The human label of ``value`` (a slug of ``kind``: reason, category, route, state,
    event, decision). An unknown slug reads as itself with underscores as spaces, so a value
    from a newer version still reads; a blank one as ``BLANK[kind]`` or "—". Raises
    ``KeyError`` for an unknown ``kind``."""
    table = TABLES[kind]
    if not value:
        return BLANK.get(kind, "—")
    return table.get(value) or str(value).replace("_", " ").capitalize()
