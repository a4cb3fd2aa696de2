"""The one parser of times that people and scripts type: query strings, filters, command
options. Event times from agents are stricter (RFC 3339 only) and checked by
``callgate.schemas.Rfc3339``, with the pattern defined here.

Pure: no Django.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta, tzinfo

#: RFC 3339 §5.6 ``date-time`` (``T`` or, as §5.6 allows, a space between date and time).
RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", re.ASCII
)
#: The years a typed moment may fall in: wide enough for any real range, far enough from
#: ``datetime``'s limits (years 1 and 9999) that ranges, previous periods and week starts
#: computed from it cannot overflow.
MIN_YEAR, MAX_YEAR = 1970, 9000


def parse_time(raw: str, *, end: bool = False, naive: tzinfo = UTC) -> datetime:
    """An aware datetime in UTC from an ISO 8601 / RFC 3339 date-time or an ISO date.

    - ``2026-11-29T10:00:00Z``, ``2026-11-29T11:00:00+01:00``: that moment;
    - ``2026-11-29T10:00`` (no offset, as a browser's ``datetime-local`` sends it): taken
      in ``naive`` (UTC unless the caller knows the user's time zone);
    - ``2026-11-29``: the start of that day in ``naive``, or with ``end`` the start of the
      next day (so ``until=<date>`` includes the whole day);
    - a ``+`` of an offset that arrived unescaped in a query string (decoded to a space) is
      put back.

    Raises ``ValueError`` with a message for people: text that is no date, a day or month
    out of range, or a moment outside the years ``MIN_YEAR``–``MAX_YEAR``."""
    text = raw.strip().upper()  # RFC 3339 §5.6 allows "t" and "z"; fromisoformat does not
    if "T" in text:
        text = text.replace(" ", "+")
    try:
        if len(text) == 10:
            moment = datetime.combine(date.fromisoformat(text), time(0), tzinfo=naive)
            if end:
                moment += timedelta(days=1)
        else:
            moment = datetime.fromisoformat(text)
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=naive)
        if not MIN_YEAR <= moment.year <= MAX_YEAR:
            raise OverflowError
        moment = moment.astimezone(UTC)
    except OverflowError:
        raise ValueError(
            f"must fall between the years {MIN_YEAR} and {MAX_YEAR}, got {raw!r}"
        ) from None
    except ValueError:
        raise ValueError(
            f"not a date or date-time: {raw!r} (use e.g. 2026-11-29 or 2026-11-29T10:00:00Z)"
        ) from None
    if not MIN_YEAR <= moment.year <= MAX_YEAR:  # an offset moved it across the edge
        raise ValueError(f"must fall between the years {MIN_YEAR} and {MAX_YEAR}, got {raw!r}")
    return moment


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with a ``Z`` and whole seconds: ``2026-11-29T10:00:00Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
