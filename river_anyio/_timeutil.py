"""Timestamp text formats shared with River Go.

River writes RFC 3339 strings inside JSON (``errors[].at``, ``cancel_attempted_at``) and, on
SQLite, stores timestamps as text in several formats depending on which code path wrote them
(River's own writes are milliseconds, which is all :func:`format_sqlite_timestamp` keeps too).
Everything here returns aware datetimes; Python keeps microseconds, so Go's nanoseconds are
truncated when read.
"""

from __future__ import annotations

import datetime as dt
import re

__all__ = [
    "format_rfc3339",
    "format_rfc3339nano",
    "format_sqlite_timestamp",
    "parse_rfc3339",
    "parse_rfc3339_ns",
    "parse_sqlite_timestamp",
    "utc_now",
]

UTC = dt.UTC
_HALF_MILLISECOND = dt.timedelta(microseconds=500)
_ROUNDS_UP_TO_MAX = dt.datetime.max - _HALF_MILLISECOND

# One pattern covers RFC 3339 and every text format River's SQLite rows can hold:
#   2006-01-02 15:04:05           (CURRENT_TIMESTAMP)
#   2006-01-02 15:04:05.123       (datetime('now','subsec'), River's timeString)
#   2006-01-02T15:04:05.123456789Z / +02:00   (RFC 3339, JSON)
#   2006-01-02 15:04:05.999999999 -0700 MST m=+1.234   (Go's Time.String())
_TS_RE = re.compile(
    r"""
    \A\s*
    (?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})
    [T\x20t]
    (?P<h>\d{2}):(?P<mi>\d{2})(?::(?P<s>\d{2}))?
    (?:[.,](?P<frac>\d{1,9}))?
    \s*
    (?P<tz>[Zz]|[+-]\d{2}(?::?\d{2})?)?
    (?:\s+(?P<abbr>[A-Za-z][A-Za-z0-9_+\-]*|[+-]\d{2,4}))?
    (?:\s+m=[+-]\d+(?:\.\d+)?)?
    \s*\Z
    """,
    re.VERBOSE,
)


def _offset(tz: str | None) -> dt.tzinfo:
    if tz is None or tz in ("Z", "z"):
        return UTC
    sign = -1 if tz[0] == "-" else 1
    digits = tz[1:].replace(":", "")
    hours = int(digits[:2])
    minutes = int(digits[2:4]) if len(digits) > 2 else 0
    if hours > 23 or minutes > 59:
        raise ValueError(f"invalid UTC offset {tz!r}")
    if hours == 0 and minutes == 0:
        return UTC
    return dt.timezone(sign * dt.timedelta(hours=hours, minutes=minutes))


def _parse(text: str, *, require_offset: bool) -> dt.datetime:
    return _parse_match(_match(text, require_offset=require_offset), text)


def _match(text: str, *, require_offset: bool) -> re.Match[str]:
    m = _TS_RE.match(text)
    if m is None or (require_offset and m["tz"] is None):
        raise ValueError(f"not a timestamp River writes: {text!r}")
    return m


def _parse_match(m: re.Match[str], text: str) -> dt.datetime:
    frac = (m["frac"] or "").ljust(6, "0")[:6]
    try:
        return dt.datetime(
            int(m["y"]),
            int(m["mo"]),
            int(m["d"]),
            int(m["h"]),
            int(m["mi"]),
            int(m["s"] or 0),
            int(frac),
            tzinfo=_offset(m["tz"]),
        )
    except ValueError as exc:
        raise ValueError(f"not a timestamp River writes: {text!r} ({exc})") from None


def parse_rfc3339(text: str) -> dt.datetime:
    """Parse an RFC 3339 timestamp (up to 9 fractional digits), keeping its offset."""
    return _parse(text, require_offset=True)


def parse_rfc3339_ns(text: str) -> tuple[dt.datetime, int]:
    """:func:`parse_rfc3339`, and the nanoseconds past the datetime's microseconds (0-999):
    Go writes nanoseconds, which a datetime cannot hold."""
    m = _match(text, require_offset=True)
    frac = m["frac"]
    return _parse_match(m, text), int(frac[6:].ljust(3, "0")) if frac and len(frac) > 6 else 0


def parse_sqlite_timestamp(text: str) -> dt.datetime:
    """Parse any timestamp text River's SQLite rows can hold; the result is aware, in UTC.

    Text without an offset is UTC (that is what every River writer stores).
    """
    return _parse(text, require_offset=False).astimezone(UTC)


def _require_aware(value: dt.datetime) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value!r}: river_anyio only handles aware datetimes")


def _offset_suffix(value: dt.datetime) -> str:
    off = value.utcoffset()
    assert off is not None
    if not off:
        return "Z"
    total = int(off.total_seconds())
    sign = "-" if total < 0 else "+"
    total = abs(total)
    return f"{sign}{total // 3600:02d}:{total % 3600 // 60:02d}"


def format_rfc3339(value: dt.datetime) -> str:
    """Go's ``time.RFC3339``: seconds precision, ``Z`` or ``±hh:mm`` in the value's own offset."""
    _require_aware(value)
    return value.replace(tzinfo=None).isoformat("T", "seconds") + _offset_suffix(value)


def format_rfc3339nano(value: dt.datetime, nanosecond: int = 0) -> str:
    """Go's ``time.RFC3339Nano`` (also its JSON form): fraction with trailing zeros trimmed.

    ``nanosecond`` (0-999) is added past the datetime's microseconds (see
    :func:`parse_rfc3339_ns`).
    """
    _require_aware(value)
    frac = f"{value.microsecond:06d}{nanosecond:03d}".rstrip("0")
    return (
        value.replace(tzinfo=None).isoformat("T", "seconds")
        + (f".{frac}" if frac else "")
        + _offset_suffix(value)
    )


def format_sqlite_timestamp(value: dt.datetime) -> str:
    """UTC ``YYYY-MM-DD HH:MM:SS.fff``, the one text layout River Go writes and parses on SQLite.

    Comparisons on River's SQLite columns are textual, so every time is written in this one
    layout, rounded to the millisecond (halves up) as River does: River cannot parse more
    fractional digits, and a shorter text would sort before an equal longer one.
    """
    _require_aware(value)
    value = value.astimezone(UTC).replace(tzinfo=None)
    if value < _ROUNDS_UP_TO_MAX:  # beyond it there is no room to round up: truncated
        value += _HALF_MILLISECOND  # then truncated by isoformat: rounded, halves up
    # isoformat zero-pads years below 1000 (strftime's %Y does not); text order needs it
    return value.isoformat(" ", "milliseconds")


def utc_now() -> dt.datetime:
    return dt.datetime.now(UTC)
