from __future__ import annotations

import datetime as dt

import pytest

from river_anyio._timeutil import (
    format_rfc3339,
    format_rfc3339nano,
    format_sqlite_timestamp,
    parse_rfc3339,
    parse_rfc3339_ns,
    parse_sqlite_timestamp,
)

UTC = dt.UTC


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-03-04 05:06:07", dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)),
        ("2026-03-04 05:06:07.1", dt.datetime(2026, 3, 4, 5, 6, 7, 100000, tzinfo=UTC)),
        ("2026-03-04 05:06:07.123", dt.datetime(2026, 3, 4, 5, 6, 7, 123000, tzinfo=UTC)),
        ("2026-03-04 05:06:07.123456", dt.datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)),
        (
            "2026-03-04 05:06:07.123456789 +0000 UTC",
            dt.datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=UTC),
        ),
        (
            "2026-03-04 07:06:07.5 +0200 CEST m=+12.345678901",
            dt.datetime(2026, 3, 4, 5, 6, 7, 500000, tzinfo=UTC),
        ),
        (
            "2026-03-04 00:06:07 -0500 EST",
            dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC),
        ),
        ("2026-03-04T05:06:07Z", dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)),
        ("2026-03-04T06:06:07.25+01:00", dt.datetime(2026, 3, 4, 5, 6, 7, 250000, tzinfo=UTC)),
        (
            "2026-03-04 05:06:07.999999999 +0000 UTC m=-0.001",
            dt.datetime(2026, 3, 4, 5, 6, 7, 999999, tzinfo=UTC),
        ),
    ],
)
def test_parse_sqlite_timestamp_formats(text: str, expected: dt.datetime) -> None:
    got = parse_sqlite_timestamp(text)
    assert got == expected
    assert got.utcoffset() == dt.timedelta(0)


@pytest.mark.parametrize("bad", ["", "yesterday", "2026-13-01 00:00:00", "2026-01-01", "12:00:00"])
def test_parse_sqlite_timestamp_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="timestamp"):
        parse_sqlite_timestamp(bad)


def test_parse_rfc3339_keeps_offset_and_requires_one() -> None:
    d = parse_rfc3339("2026-03-04T05:06:07.123456789-07:00")
    assert d.utcoffset() == dt.timedelta(hours=-7)
    assert d.microsecond == 123456
    with pytest.raises(ValueError, match="not a timestamp"):
        parse_rfc3339("2026-03-04 05:06:07")


@pytest.mark.parametrize(
    ("text", "nanosecond"),
    [
        ("2026-03-04T05:06:07.123456789Z", 789),
        ("2026-03-04T05:06:07.1234567+01:00", 700),
        ("2026-03-04T05:06:07.12345678Z", 780),
        ("2026-03-04T05:06:07.123456Z", 0),
        ("2026-03-04T05:06:07.12Z", 0),
        ("2026-03-04T05:06:07Z", 0),
    ],
)
def test_nanoseconds_go_wrote_survive_a_round_trip(text: str, nanosecond: int) -> None:
    """A datetime holds microseconds; the rest of Go's nanoseconds is returned beside it and
    written back, so the text comes back as Go wrote it."""
    at, ns = parse_rfc3339_ns(text)
    assert (at, ns) == (parse_rfc3339(text), nanosecond)
    assert format_rfc3339nano(at, ns) == text
    with pytest.raises(ValueError, match="not a timestamp"):
        parse_rfc3339_ns("2026-03-04 05:06:07.123456789")


def test_format_rfc3339nano_trims_like_go() -> None:
    assert (
        format_rfc3339nano(dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02T03:04:05Z"
    )
    assert (
        format_rfc3339nano(dt.datetime(2026, 1, 2, 3, 4, 5, 120000, tzinfo=UTC))
        == "2026-01-02T03:04:05.12Z"
    )
    tz = dt.timezone(dt.timedelta(hours=5, minutes=30))
    assert (
        format_rfc3339nano(dt.datetime(2026, 1, 2, 3, 4, 5, 1, tzinfo=tz))
        == "2026-01-02T03:04:05.000001+05:30"
    )
    assert (
        format_rfc3339(dt.datetime(2026, 1, 2, 3, 4, 5, 999, tzinfo=UTC)) == "2026-01-02T03:04:05Z"
    )


def test_format_rejects_naive() -> None:
    with pytest.raises(ValueError, match="naive"):
        format_rfc3339nano(dt.datetime(2026, 1, 2))


def test_sqlite_format_sorts_with_rivers_text() -> None:
    ours = format_sqlite_timestamp(dt.datetime(2026, 1, 2, 3, 4, 5, 123400, tzinfo=UTC))
    assert ours == "2026-01-02 03:04:05.123"  # River's layout, milliseconds
    # River's own texts for slightly earlier/later instants compare correctly as text.
    assert "2026-01-02 03:04:05.122" < ours < "2026-01-02 03:04:05.124"
    assert "2026-01-02 03:04:05" < ours < "2026-01-02 03:04:06"
    local = dt.datetime(2026, 1, 2, 4, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert format_sqlite_timestamp(local) == "2026-01-02 03:04:05.000"
    assert parse_sqlite_timestamp(ours) == dt.datetime(2026, 1, 2, 3, 4, 5, 123000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # River Go rounds to the millisecond, halves up (Time.Round), also before 1970
        (dt.datetime(2026, 1, 2, 3, 4, 5, 123400, tzinfo=UTC), "2026-01-02 03:04:05.123"),
        (dt.datetime(2026, 1, 2, 3, 4, 5, 123800, tzinfo=UTC), "2026-01-02 03:04:05.124"),
        (dt.datetime(2026, 1, 2, 3, 4, 5, 499, tzinfo=UTC), "2026-01-02 03:04:05.000"),
        (dt.datetime(2026, 1, 2, 3, 4, 5, 500, tzinfo=UTC), "2026-01-02 03:04:05.001"),
        (dt.datetime(2026, 1, 2, 3, 4, 5, 999500, tzinfo=UTC), "2026-01-02 03:04:06.000"),
        (dt.datetime(1969, 12, 31, 23, 59, 59, 999500, tzinfo=UTC), "1970-01-01 00:00:00.000"),
        (dt.datetime(1969, 12, 31, 23, 59, 59, 997500, tzinfo=UTC), "1969-12-31 23:59:59.998"),
        # no room left to round up: truncated
        (dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), "9999-12-31 23:59:59.999"),
    ],
)
def test_sqlite_format_rounds_to_milliseconds_as_river_does(
    value: dt.datetime, expected: str
) -> None:
    assert format_sqlite_timestamp(value) == expected


def test_formats_pad_small_years() -> None:
    early = dt.datetime(1, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    assert format_sqlite_timestamp(early) == "0001-01-02 03:04:05.000"
    assert format_rfc3339(early) == "0001-01-02T03:04:05Z"
    assert format_rfc3339nano(early) == "0001-01-02T03:04:05.000006Z"
    assert format_sqlite_timestamp(early) < format_sqlite_timestamp(
        dt.datetime(2026, 1, 1, tzinfo=UTC)
    )
