"""One definition of each number people read: the time windows, "not ok", "unknown
outcome", "refused" and the pseudo-filters a drill-down needs (shared/UI.md: "One number,
one definition").

The overview (``callgate.selectors``/``views``), the reports (``callgate.reports``), the
calls list the numbers link to, the CSV exports and the reports API all take their windows
and sets from here, so a count means the same calls wherever it appears:

- **Window.** "The last 24 hours" (or 7 days, …) is 24 (or 168, …) whole UTC hours, the
  last of them the current hour so far: ``[start of the hour 23 hours before the current
  one, end of the current hour)``. The rollups count by creation hour
  (``callgate.reports.rollups``), so only whole hours can be counted from them and matched
  exactly by the calls list; the pages say the window they show ("since 17:00 yesterday,
  this hour so far"). "The last hour" is the exception that keeps it honest: the previous
  whole hour and the current one (60 to 120 minutes of calls), as the current hour alone
  holds almost nothing in its first minutes (``metrics.window``). The calls list, which
  reads calls rather than rollups, takes it exactly: the past 60 minutes (``list_since``).
- **Not ok.** A call whose current category is neither ``ok`` nor ``empty_result`` and that
  has a category at all: a call still in flight (no classification yet) is not a failure.
- **Unclassified.** A call with no category yet (in flight, or proposed and waiting).
- **Outcome unknown now.** A call whose *current* category is ``unknown_outcome`` (still
  unsettled). The reliability report's "had an unknown outcome" (now or earlier, settled by
  reconciliation or a human since) is a different number with its own name and filter.
- **Refused.** A call whose route is ``deny``: callgate or a human refused it at the gate.
- **Duplicate calls** (category ``duplicate``) and **repeats answered with the earlier
  receipt** (proposals of an operation already done, answered with its stored receipt and
  counted on the call they repeat, ``duplicates_suppressed``) are two numbers with two names.

``NUMBERS`` holds each number's label (the words every page, CSV header and API help text
use for it) and its definition. The calls list accepts the sets as values of its
``category`` filter (``none``, ``not_ok``, ``unknown_ever``, ``retried``, ``repeated``) and
``tool=(none)`` for calls without a tool name, so every drill-down lands on exactly the
calls it counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from callgate.lifecycle import State
from callgate.taxonomy import TABLE, Category, Reason, Route

#: States in which a call still waits for something (not finished): "still open" of the
#: unknown outcomes (``unknown_settled_q``) and of the rollups' ``unknown_open``.
OPEN_STATES = (
    State.PENDING_APPROVAL,
    State.ALLOWED,
    State.RETRY_WAIT,
    State.RECONCILING,
    State.IN_REVIEW,
)

#: Categories that mean "nothing went wrong".
GOOD_CATEGORIES: tuple[str, ...] = (Category.OK.value, Category.EMPTY_RESULT.value)
#: The category of a call not classified yet.
UNCLASSIFIED = ""
#: Categories that count as "not ok" (every classified category but the good ones).
NOT_OK_CATEGORIES: tuple[str, ...] = tuple(
    c.value for c in Category if c.value not in GOOD_CATEGORIES
)
#: The route of a refused call.
REFUSED_ROUTE = Route.DENY.value


@dataclass(frozen=True)
class Number:
    """A number people read: ``label`` says exactly what it counts (lower case, used on
    pages, in CSV headers and in API help texts), ``definition`` how, and ``drill`` the
    calls-list filter of the calls it counts (``{}``: every call of the window)."""

    key: str
    label: str
    definition: str
    drill: dict[str, str]


#: Every number of the overview, the reports and their CSV and API: key -> ``Number``.
NUMBERS: dict[str, Number] = {
    n.key: n
    for n in (
        Number("calls", "tool calls", "Calls created in the window.", {}),
        Number(
            "not_ok",
            "not ok",
            "Classified calls whose current category is neither ok nor empty result.",
            {"category": "not_ok"},
        ),
        Number(
            "unknown_now",
            "outcome unknown now",
            "Calls whose current category is unknown_outcome: still unsettled.",
            {"category": "unknown_outcome"},
        ),
        Number(
            "unknown_ever",
            "had an unknown outcome",
            "Calls whose outcome was unknown at some point, settled since or not.",
            {"category": "unknown_ever"},
        ),
        Number(
            "unknown_by_reconciliation",
            "settled by reconciliation",
            "Of the calls that had an unknown outcome: finished without a human decision.",
            {"category": "unknown_by_reconciliation"},
        ),
        Number(
            "unknown_by_human",
            "settled by a human",
            "Of the calls that had an unknown outcome: a human decided them.",
            {"category": "unknown_by_human"},
        ),
        Number(
            "unknown_open",
            "still open",
            "Of the calls that had an unknown outcome: not decided and not finished.",
            {"category": "unknown_open"},
        ),
        Number(
            "refused",
            "refused at the gate",
            "Calls whose route is deny: callgate or a human refused them.",
            {"route": "deny"},
        ),
        Number(
            "bad_arguments",
            "argument errors + hallucinations",
            "Calls whose current category is argument_error or hallucination: the "
            "contract's or the model's part.",
            {"category": "bad_arguments"},
        ),
        Number(
            "duplicate_calls",
            "duplicate calls",
            "Calls in the duplicate category: answered with an earlier receipt, the same "
            "write twice in one turn, or an operation ID re-used with other arguments.",
            {"category": "duplicate"},
        ),
        Number(
            "repeats_answered",
            "repeats answered with the earlier receipt",
            "Proposals of an operation already done, answered with its stored receipt "
            "instead of a second write; counted on the call they repeat "
            "(duplicates_suppressed), so the calls list shows those calls and their sum.",
            {"category": "repeated"},
        ),
        Number(
            "retried",
            "needed a retry",
            "Calls that met a retryable failure: waiting to retry, retries exhausted, or "
            "more than one attempt used.",
            {"category": "retried"},
        ),
        Number(
            "retried_succeeded",
            "succeeded later",
            "Of the calls that needed a retry: now ok, empty result or found applied.",
            {"category": "retried_succeeded"},
        ),
        Number(
            "retried_other",
            "ended otherwise",
            "Of the calls that needed a retry: neither succeeded, still retrying nor "
            "retries exhausted.",
            {"category": "retried_other"},
        ),
        Number(
            "retry_exhausted",
            "retries exhausted",
            "Calls whose reason is retry_exhausted.",
            {"reason": "retry_exhausted"},
        ),
    )
}


def label(key: str) -> str:
    """The label of number ``key`` (``NUMBERS``); raises ``KeyError`` for an unknown key."""
    return NUMBERS[key].label


#: Pseudo-values of the calls list's ``category`` filter: value -> label.
CATEGORY_SETS = {
    "none": "Unclassified",
    "not_ok": "Not ok",
    "unknown_ever": "Had an unknown outcome",
    "unknown_by_reconciliation": "Had an unknown outcome, settled by reconciliation",
    "unknown_by_human": "Had an unknown outcome, settled by a human",
    "unknown_open": "Had an unknown outcome, still open",
    "bad_arguments": "Argument error or hallucination",
    "retried": "Needed a retry",
    "retried_succeeded": "Needed a retry, succeeded later",
    "retried_other": "Needed a retry, ended otherwise",
    "repeated": "Answered a repeat with its receipt",
}
#: The calls list's ``tool`` value for calls without a tool name (no provider allows
#: parentheses in a tool name).
NO_TOOL = "(none)"

#: Window presets: value -> length.
WINDOWS = {
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}


def hour_floor(moment: datetime) -> datetime:
    """The start of the UTC hour ``moment`` falls in (aware, UTC)."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def hour_ceil(moment: datetime) -> datetime:
    """``moment`` rounded up to a whole UTC hour (itself when it is one)."""
    floor = hour_floor(moment)
    return floor if floor == moment else floor + timedelta(hours=1)


HOUR = timedelta(hours=1)
#: The fewest whole hours in a window: the previous hour and the current one, so "the last
#: hour" always holds the past 60 minutes (the current hour alone is empty at :00).
MIN_WINDOW_HOURS = 2
#: Presets shorter than this are exact on the calls list (``list_since``).
EXACT_BELOW = timedelta(days=1)


def window(length: timedelta, *, now: datetime | None = None) -> tuple[datetime, datetime]:
    """``(since, until)`` of "the last ``length``": ``length`` in whole UTC hours (rounded
    up, at least ``MIN_WINDOW_HOURS``), ending with the current hour (``until`` exclusive,
    the end of the current hour). So "the last 24 hours" is 24 hourly periods: it spans
    exactly 24 hours, of which the current one has only run so far, and holds the calls of
    the last 23 to 24 hours, never older ones; "the last hour" is the previous whole hour
    and the current one: the calls of the last 60 to 120 minutes. The pages show ``since``
    beside the number."""
    now = now or timezone.now()
    hours = max(MIN_WINDOW_HOURS, math.ceil(length / HOUR))
    until = hour_floor(now) + HOUR
    return until - hours * HOUR, until


def list_since(length: timedelta, *, now: datetime | None = None) -> datetime:
    """Where the calls list's preset ``since=<length>`` starts. The list reads calls, not
    rollups, so a preset shorter than ``EXACT_BELOW`` ("the last hour") is exact: the past
    ``length``, rolling. Longer ones start where ``window`` does, so the list shows exactly
    the calls the numbers linking to it counted (the agents page's "calls in 24 h")."""
    now = now or timezone.now()
    return now - length if length < EXACT_BELOW else window(length, now=now)[0]


def covering_window(length: timedelta, *, now: datetime | None = None) -> tuple[datetime, datetime]:
    """The whole UTC hours holding all of the last ``length`` (up to an hour more): what an
    alert rule judges, so a rule over "1 hour" always sees a full hour of calls."""
    now = now or timezone.now()
    return hour_floor(now - length), hour_ceil(now)


def category_q(value: str) -> Q:
    """The ``ToolCall`` condition of a ``category`` filter value: a category slug or one of
    ``CATEGORY_SETS``. Raises ``ValueError`` for anything else."""
    if value in Category.values:  # by its reasons: the (project, reason) index serves it
        return Q(reason__in=[r.value for r, (c, _) in TABLE.items() if c == value])
    if value == "none":
        return Q(category=UNCLASSIFIED)
    if value == "not_ok":
        return Q(category__in=NOT_OK_CATEGORIES)
    if value == "unknown_ever":
        return unknown_ever_q()
    if value.startswith("unknown_"):
        return unknown_settled_q(value)
    if value == "bad_arguments":
        return Q(category__in=[Category.ARGUMENT_ERROR, Category.HALLUCINATION])
    if value.startswith("retried"):
        return retried_q(value)
    if value == "repeated":
        return Q(duplicates_suppressed__gt=0)
    raise ValueError(f"unknown category {value!r}")


def unknown_ever_q() -> Q:
    """Calls whose outcome was unknown at some point: the current category is
    ``unknown_outcome`` or ``reconciliation`` (only an unknown outcome is reconciled), or an
    event classified ``unknown_outcome`` (since settled by a human or a later event)."""
    from callgate.models import CallEvent

    return Q(category__in=[Category.UNKNOWN_OUTCOME, Category.RECONCILIATION]) | Q(
        Exists(
            CallEvent.objects.filter(
                call_id=OuterRef("pk"),
                project_id=OuterRef("project_id"),
                category=Category.UNKNOWN_OUTCOME,
            )
        )
    )


def retried_q(value: str) -> Q:
    """Calls that needed a retry (``report_retries``: now transient, retries exhausted, or
    more than one attempt used): ``retried`` all of them, ``retried_succeeded`` those now
    good or found applied, ``retried_other`` those neither succeeded, still retrying nor
    exhausted. Raises ``ValueError`` for another value."""
    transient, exhausted = Q(category=Category.TRANSIENT), Q(reason=Reason.RETRY_EXHAUSTED)
    retried = transient | exhausted | Q(attempts__gte=2)
    succeeded = Q(category__in=GOOD_CATEGORIES) | Q(reason=Reason.RECONCILED_APPLIED)
    sets = {
        "retried": retried,
        "retried_succeeded": retried & succeeded,
        "retried_other": retried & ~succeeded & ~transient & ~exhausted,
    }
    if value not in sets:
        raise ValueError(f"unknown category {value!r}")
    return sets[value]


def unknown_settled_q(value: str) -> Q:
    """How a call that had an unknown outcome stands (the rollups' ``unknown_decided`` and
    ``unknown_open``): ``unknown_by_human`` (a decision recorded), ``unknown_open`` (no
    decision, still waiting) or ``unknown_by_reconciliation`` (no decision, finished).
    Raises ``ValueError`` for another value."""
    undecided = Q(decided_at__isnull=True)
    sets = {
        "unknown_by_human": Q(decided_at__isnull=False),
        "unknown_open": undecided & Q(state__in=OPEN_STATES),
        "unknown_by_reconciliation": undecided & ~Q(state__in=OPEN_STATES),
    }
    if value not in sets:
        raise ValueError(f"unknown category {value!r}")
    return unknown_ever_q() & sets[value]


def tool_q(value: str) -> Q:
    """The ``ToolCall`` condition of a ``tool`` filter value (``NO_TOOL``: no tool name)."""
    return Q(tool_name="") if value == NO_TOOL else Q(tool_name=value)


def is_not_ok(category: str) -> bool:
    return category in NOT_OK_CATEGORIES
