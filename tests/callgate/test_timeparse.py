"""``callgate.timeparse.parse_time``: the one parser of typed times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from callgate.timeparse import format_time, parse_time

PARIS = timezone(timedelta(hours=1))


@pytest.mark.parametrize(
    ("raw", "kwargs", "expected"),
    [
        ("2026-11-29T10:00:00Z", {}, datetime(2026, 11, 29, 10, tzinfo=UTC)),
        ("2026-11-29t10:00:00z", {}, datetime(2026, 11, 29, 10, tzinfo=UTC)),
        ("2026-11-29T11:00:00+01:00", {}, datetime(2026, 11, 29, 10, tzinfo=UTC)),
        # an unescaped "+" in a query string arrives as a space
        ("2026-11-29T11:00:00 01:00", {}, datetime(2026, 11, 29, 10, tzinfo=UTC)),
        ("2026-11-29T10:00", {}, datetime(2026, 11, 29, 10, tzinfo=UTC)),
        ("2026-11-29T11:00", {"naive": PARIS}, datetime(2026, 11, 29, 10, tzinfo=UTC)),
        ("2026-11-29", {}, datetime(2026, 11, 29, tzinfo=UTC)),
        ("2026-11-29", {"end": True}, datetime(2026, 11, 30, tzinfo=UTC)),
        (" 2026-11-29 ", {}, datetime(2026, 11, 29, tzinfo=UTC)),
    ],
)
def test_it_reads_dates_and_date_times(raw, kwargs, expected):
    moment = parse_time(raw, **kwargs)
    assert moment == expected and moment.tzinfo == UTC


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("yesterday", "not a date"),
        ("2026-13-01", "not a date"),
        ("2026-02-30T10:00:00Z", "not a date"),
        ("1969-12-31T23:00:00Z", "between the years"),
        ("9999-12-31", "between the years"),
        ("", "not a date"),
    ],
)
def test_it_refuses_what_is_no_moment_with_a_message(raw, words):
    with pytest.raises(ValueError, match=words):
        parse_time(raw)


def test_format_time_is_rfc3339_in_utc():
    assert (
        format_time(datetime(2026, 11, 29, 11, 0, 5, 123, tzinfo=PARIS)) == "2026-11-29T10:00:05Z"
    )
