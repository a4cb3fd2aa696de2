"""The search language of the calls list and the review queue (pure: no Django import).

A query is terms separated by spaces, combined with AND, in the manner of GitHub's and
Sentry's search boxes:

- ``key:value`` narrows by a field: ``tool:``, ``agent:``, ``reason:``, ``category:``,
  ``route:``, ``state:``, ``request:``, ``operation:``, ``conversation:``, ``trace:``,
  ``is:`` (``open`` or ``claimed``: the call's review item) and ``assignee:`` (``me``,
  ``unassigned`` or a username);
- a word alone is free text: an exact ID (operation ID or its prefix, request ID, trace ID,
  conversation ID) or a piece of the call's error text (its observation);
- ``"double quotes"`` keep spaces (and colons) inside one value: ``"ticket closed"``,
  ``tool:"create ticket"``; ``\\"`` is a quote inside quotes;
- ``-`` before a term negates it: ``-tool:search``, ``-"rate limit"``.

``query_parse`` turns the text into ``Term``\\ s or raises ``QueryError`` naming the term that
is malformed (an unknown key, an unclosed quote, an empty or unknown value). What each term
means for the calls list is ``callgate.selectors.search_q``; for the queue,
``reviews.selectors.search_q``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from callgate.lifecycle import State
from callgate.taxonomy import Category, Reason, Route

#: The longest query taken (characters); a longer one is refused, not cut.
MAX_QUERY = 500
#: The most terms one query may hold.
MAX_TERMS = 20
#: The longest value of one term (the ID columns hold 200 characters).
MAX_VALUE = 200
#: Every key, with what it narrows by (the search box's help lists these).
KEYS = {
    "tool": "tool name",
    "agent": "agent name",
    "reason": "reason (slug)",
    "category": "category (slug)",
    "route": "route (slug)",
    "state": "call state (slug)",
    "request": "request ID",
    "operation": "operation ID (or its prefix)",
    "conversation": "conversation ID",
    "trace": "trace ID",
    "is": "open or claimed (its review item)",
    "assignee": "me, unassigned or a username (its claimed review item)",
}
#: The values a key takes when they are a closed set (other keys take any text). Callers
#: may widen a set (the calls list's category pseudo-values: ``metrics.CATEGORY_SETS``).
CHOICES: dict[str, Collection[str]] = {
    "reason": Reason.values,
    "category": Category.values,
    "route": Route.values,
    "state": State.values,
    "is": ("open", "claimed"),
}


class QueryError(ValueError):
    """A malformed query. ``term`` is the offending term as typed (the whole query when no
    single term is at fault), ``message`` says what is wrong with it in words for people."""

    def __init__(self, term: str, message: str):
        super().__init__(f"{term}: {message}")
        self.term = term
        self.message = message


@dataclass(frozen=True)
class Term:
    """One term of a query. ``key`` is one of ``KEYS``, or ``""`` for free text; ``value``
    is unquoted; ``negated``: the term had a leading ``-``."""

    key: str
    value: str
    negated: bool = False

    def __str__(self) -> str:
        """The term as it can be typed again (quoted when it needs to be)."""
        value = self.value
        if not value or any(c.isspace() or c in '":\\' for c in value) or value.startswith("-"):
            value = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return ("-" if self.negated else "") + (f"{self.key}:" if self.key else "") + value


def _tokens(query: str) -> list[tuple[str, str, bool]]:
    """The raw terms of ``query``: ``(as typed, body without the leading "-", negated)``
    where the body keeps its quotes. Raises ``QueryError`` for an unclosed quote."""
    out = []
    i, n = 0, len(query)
    while i < n:
        if query[i].isspace():
            i += 1
            continue
        start = i
        quoted = False
        while i < n and (quoted or not query[i].isspace()):
            if query[i] == "\\" and quoted and i + 1 < n:
                i += 2
                continue
            if query[i] == '"':
                quoted = not quoted
            i += 1
        raw = query[start:i]
        if quoted:
            raise QueryError(raw, 'the quote is not closed; add a closing "')
        negated = raw.startswith("-") and len(raw) > 1
        out.append((raw, raw[1:] if negated else raw, negated))
    return out


def _unquote(text: str, raw: str) -> str:
    """``text`` with its double quotes removed (``\\"`` and ``\\\\`` kept as characters)."""
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in '"\\':
            out.append(text[i + 1])
            i += 2
            continue
        if c != '"':
            out.append(c)
        i += 1
    return "".join(out)


def query_parse(query: str, *, choices: Mapping[str, Collection[str]] = CHOICES) -> list[Term]:
    """The terms of ``query`` in the order typed (an empty or blank query has none).

    ``choices`` maps a key to the values it accepts (default ``CHOICES``). Raises
    ``QueryError`` for a query longer than ``MAX_QUERY`` or with more than ``MAX_TERMS``
    terms, an unclosed quote, an unknown key, an empty value, a value longer than
    ``MAX_VALUE`` or a value outside the key's ``choices``."""
    if len(query) > MAX_QUERY:
        raise QueryError(query[:40] + "…", f"the query is longer than {MAX_QUERY} characters")
    terms = []
    for raw, body, negated in _tokens(query):
        key = ""
        colon = body.find(":")
        quote = body.find('"')
        if colon > 0 and (quote == -1 or colon < quote):
            key, body = body[:colon].lower(), body[colon + 1 :]
            if key not in KEYS:
                raise QueryError(
                    raw, f"unknown key {key!r}; use one of {', '.join(KEYS)}, or quote the text"
                )
        value = _unquote(body, raw)
        if not value.strip():
            raise QueryError(raw, f"{key or 'the text'} needs a value")
        if len(value) > MAX_VALUE:
            raise QueryError(raw, f"the value is longer than {MAX_VALUE} characters")
        allowed = choices.get(key)
        if allowed is not None:
            value = value.lower() if key == "is" else value
            if value not in allowed:
                raise QueryError(raw, f"{key} must be one of {', '.join(allowed)}")
        terms.append(Term(key=key, value=value, negated=negated))
        if len(terms) > MAX_TERMS:
            raise QueryError(raw, f"a query holds at most {MAX_TERMS} terms")
    return terms


def query_text(terms: list[Term]) -> str:
    """``terms`` as one query that ``query_parse`` reads back into the same terms."""
    return " ".join(str(term) for term in terms)
