"""The one table of labels people read for the machine words callgate stores: reasons,
categories and routes (``callgate.taxonomy``), call states and event kinds
(``callgate.models``), operator decisions and review resolutions (shared/UI.md: words for
people, codes for machines). Pages show the label with the slug in a tooltip (the
``label`` filter and ``{% labelled %}`` tag of ``callgate_tags``) and CSV exports show the
label (issue 31: a spreadsheet is read by people); the API keeps the slug."""

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

#: the provider formats a proposal arrives in (``callgate.schemas.Format``)
FORMATS = {
    "openai": "OpenAI",
    "openai_responses": "OpenAI Responses",
    "anthropic": "Anthropic",
    "gemini": "Gemini",
    "bedrock": "Bedrock",
    "ollama": "Ollama",
    "mcp": "MCP",
    "plain": "plain JSON",
}
#: what an attempt's ``outcome`` means, as the end of "Attempt 2 …"
OUTCOMES = {
    "success": "succeeded",
    "error": "failed",
    "timeout": "timed out",
    "connection_reset": "lost its connection",
    "circuit_open": "was held back: circuit open",
}
#: a review item's priority (0 is the most urgent)
PRIORITIES = {"0": "Urgent", "1": "High", "2": "Normal", "3": "Low"}

TABLES: dict[str, dict[str, str]] = {
    "reason": dict(Reason.choices),
    "category": dict(Category.choices),
    "route": dict(Route.choices),
    "state": dict(ToolCall.State.choices),
    "event": dict(CallEvent.Kind.choices),
    "decision": DECISIONS,
    "format": FORMATS,
    "outcome": OUTCOMES,
    "priority": PRIORITIES,
}
#: what a blank value means, per kind
BLANK = {"reason": "Not classified yet", "category": "Unclassified", "route": "No route yet"}


def label(value: str | None, kind: str) -> str:
    """The human label of ``value`` (a slug of ``kind``: reason, category, route, state,
    event, decision, format, outcome, priority). An unknown slug reads as itself with underscores as spaces, so a value
    from a newer version still reads; a blank one as ``BLANK[kind]`` or "—". Raises
    ``KeyError`` for an unknown ``kind``."""
    table = TABLES[kind]
    if value is None or value == "":
        return BLANK.get(kind, "—")
    return table.get(str(value)) or str(value).replace("_", " ").capitalize()
