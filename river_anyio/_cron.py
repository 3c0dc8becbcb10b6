"""Cron schedules, parsed and evaluated exactly as robfig/cron v3's ``ParseStandard`` does.

River has no cron parser of its own; its documentation pairs periodic jobs with robfig/cron, so
that is the behaviour a River user expects, including its answers inside DST gaps and overlaps
(they fall out of its time-walking ``Next``, which this module reproduces step by step, down to
how Go's ``time.Date`` resolves a wall time that does not exist or exists twice).

Accepted: 5 fields (minute, hour, day of month, month, day of week) with ``*``/``?``, lists,
ranges, steps and month/day names; the descriptors ``@yearly``/``@annually``, ``@monthly``,
``@weekly``, ``@daily``/``@midnight``, ``@hourly`` and ``@every <Go duration>``; an optional
``CRON_TZ=<zone>`` or ``TZ=<zone>`` prefix. Without a zone an expression is evaluated in the
zone of the time passed to :meth:`CronSchedule.next`.

Two deliberate differences: an expression robfig accepts but that can never fire
(``0 0 30 2 *``, an empty list) is rejected here, because a periodic job that silently never
runs is a bug; and where a whole calendar day is missing from a zone (Pacific/Apia skipped
2011-12-30) robfig's ``Next`` never returns, while this one steps over the missing day.
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo

from ._errors import CronError, ValidationError

__all__ = ["CronSchedule", "cron"]

_UTC = dt.UTC
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_ONE_SECOND = dt.timedelta(seconds=1)

#: Go's unicode.IsSpace, which strings.Fields and strings.TrimSpace split and trim on.
_GO_SPACE_CHARS = (
    "\t\n\v\f\r \x85\xa0\u1680"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000"
)
_FIELDS_RE = re.compile(f"[{re.escape(_GO_SPACE_CHARS)}]+")
#: strconv.Atoi's syntax (decimal, optional sign); its range is int64.
_ATOI_RE = re.compile(r"\A[+-]?[0-9]+\Z")
_INT64_MAX = 2**63 - 1

_STAR = 1 << 63

_MONTH_NAMES = {
    name: i + 1
    for i, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
    )
}
_DOW_NAMES = {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}

# (name in errors, minimum, maximum, names)
_FIELDS: tuple[tuple[str, int, int, dict[str, int] | None], ...] = (
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day of month", 1, 31, None),
    ("month", 1, 12, _MONTH_NAMES),
    ("day of week", 0, 6, _DOW_NAMES),
)

#: Days each month can have (February: 29), for rejecting day-of-month sets that never occur.
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _bits(lo: int, hi: int, step: int = 1) -> int:
    out = 0
    for i in range(lo, hi + 1, step):
        out |= 1 << i
    return out


def _all(lo: int, hi: int) -> int:
    return _bits(lo, hi) | _STAR


class _Spec:
    """Bit sets per field, as robfig's SpecSchedule (seconds are always 0 here)."""

    __slots__ = ("dom", "dow", "hour", "minute", "month", "zone")

    def __init__(
        self, minute: int, hour: int, dom: int, month: int, dow: int, zone: dt.tzinfo | None
    ) -> None:
        self.minute = minute
        self.hour = hour
        self.dom = dom
        self.month = month
        self.dow = dow
        self.zone = zone

    def fires(self) -> bool:
        """Whether some instant matches (robfig would return the zero time forever otherwise)."""
        if not (self.minute & ~_STAR and self.hour & ~_STAR and self.month & ~_STAR):
            return False
        dom_possible = any(
            self.month >> m & 1 and self.dom & _bits(1, _MONTH_DAYS[m - 1]) for m in range(1, 13)
        )
        dow_any = bool(self.dow & ~_STAR)
        if self.dom & _STAR or self.dow & _STAR:
            return dom_possible and dow_any
        return dom_possible or dow_any


def _descriptor(name: str, zone: dt.tzinfo | None) -> _Spec | None:
    days, months, weekdays = _all(1, 31), _all(1, 12), _all(0, 6)
    if name in ("@yearly", "@annually"):
        return _Spec(1, 1, 1 << 1, 1 << 1, weekdays, zone)
    if name == "@monthly":
        return _Spec(1, 1, 1 << 1, months, weekdays, zone)
    if name == "@weekly":
        return _Spec(1, 1, days, months, 1, zone)
    if name in ("@daily", "@midnight"):
        return _Spec(1, 1, days, months, weekdays, zone)
    if name == "@hourly":
        return _Spec(1, _all(0, 23), days, months, weekdays, zone)
    return None


# --- parsing ---------------------------------------------------------------------------------


def _atoi(expr: str, text: str, field: str) -> int:
    if not _ATOI_RE.match(text):
        raise CronError(expr, field, f"{text!r} is not a number")
    value = int(text)
    if value > _INT64_MAX or value < -_INT64_MAX - 1:
        raise CronError(expr, field, f"{text!r} is out of range")
    if value < 0:
        raise CronError(expr, field, f"negative number {value} not allowed")
    return value


def _int_or_name(expr: str, text: str, field: str, names: dict[str, int] | None) -> int:
    if names is not None and text.lower() in names:
        return names[text.lower()]
    return _atoi(expr, text, field)


def _range_bits(expr: str, part: str, field: str, lo: int, hi: int, names: dict[str, int] | None) -> int:  # fmt: skip
    range_and_step = part.split("/")
    low_and_high = range_and_step[0].split("-")
    single = len(low_and_high) == 1
    extra = 0
    if low_and_high[0] in ("*", "?"):
        # as robfig: anything after a star's hyphen is ignored ("*-5" is "*")
        start, end, extra = lo, hi, _STAR
    else:
        start = _int_or_name(expr, low_and_high[0], field, names)
        if len(low_and_high) == 1:
            end = start
        elif len(low_and_high) == 2:
            end = _int_or_name(expr, low_and_high[1], field, names)
        else:
            raise CronError(expr, field, f"too many hyphens in {part!r}")
    if len(range_and_step) == 1:
        step = 1
    elif len(range_and_step) == 2:
        step = _atoi(expr, range_and_step[1], field)
        if single:  # "N/step" means "N-max/step"
            end = hi
        if step > 1:
            extra = 0
    else:
        raise CronError(expr, field, f"too many slashes in {part!r}")
    if start < lo:
        raise CronError(expr, field, f"{start} is below the minimum {lo} in {part!r}")
    if end > hi:
        raise CronError(expr, field, f"{end} is above the maximum {hi} in {part!r}")
    if start > end:
        raise CronError(expr, field, f"range start {start} is beyond its end {end} in {part!r}")
    if step == 0:
        raise CronError(expr, field, f"step must be a positive number in {part!r}")
    return _bits(start, end, step) | extra


def _field_bits(expr: str, text: str, index: int) -> int:
    field, lo, hi, names = _FIELDS[index]
    bits = 0
    for part in text.split(","):
        if part:  # as robfig: empty list items are skipped
            bits |= _range_bits(expr, part, field, lo, hi, names)
    return bits


def _load_zone(expr: str, name: str) -> dt.tzinfo | None:
    """The zone named by a CRON_TZ=/TZ= prefix; None for "Local" (the caller's zone), as Go."""
    if name in ("", "UTC"):
        return _UTC
    if name == "Local":
        return None
    if ".." in name or name.startswith(("/", "\\")):
        raise CronError(expr, "time zone", f"invalid location name {name!r}")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise CronError(expr, "time zone", f"unknown time zone {name!r}") from None


def _parse(expr: str) -> _Spec | dt.timedelta:
    if not isinstance(expr, str):
        raise CronError(repr(expr), "expression", f"must be a str, not {type(expr).__name__}")
    spec = expr
    if not spec:
        raise CronError(expr, "expression", "is empty")
    zone: dt.tzinfo | None = None
    if spec.startswith(("TZ=", "CRON_TZ=")):
        space = spec.find(" ")
        if space < 0:
            raise CronError(expr, "time zone", "the zone must be followed by a schedule")
        zone = _load_zone(expr, spec[spec.index("=") + 1 : space])
        spec = spec[space:].strip(_GO_SPACE_CHARS)
    if spec.startswith("@"):
        named = _descriptor(spec, zone)
        if named is not None:
            return named
        if spec.startswith("@every "):
            return _every_delay(expr, spec[len("@every ") :])
        raise CronError(expr, "descriptor", f"unrecognized descriptor {spec!r}")
    fields = [f for f in _FIELDS_RE.split(spec) if f]
    if len(fields) != 5:
        raise CronError(
            expr,
            "expression",
            f"expected exactly 5 fields (minute hour day-of-month month day-of-week), "
            f"found {len(fields)}",
        )
    minute, hour, dom, month, dow = (_field_bits(expr, text, i) for i, text in enumerate(fields))
    result = _Spec(minute, hour, dom, month, dow, zone)
    if not result.fires():
        raise CronError(expr, "expression", "never matches any date (the schedule would never run)")
    return result


# --- Go durations (@every) -------------------------------------------------------------------

_UNITS_NS = {
    b"ns": 1,
    b"us": 1_000,
    "µs".encode(): 1_000,  # U+00B5 micro sign
    "μs".encode(): 1_000,  # U+03BC Greek mu
    b"ms": 1_000_000,
    b"s": 1_000_000_000,
    b"m": 60_000_000_000,
    b"h": 3_600_000_000_000,
}


def _parse_go_duration(text: str) -> int | None:
    """Go's time.ParseDuration in nanoseconds (same overflow and float rounding), or None."""
    s = text.encode()
    neg = False
    if s[:1] in (b"-", b"+"):
        neg = s[:1] == b"-"
        s = s[1:]
    if s == b"0":
        return 0
    if not s:
        return None
    total = 0
    digits = b"0123456789"
    while s:
        if not (s[:1] == b"." or s[:1] in (b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8", b"9")):  # fmt: skip
            return None
        i = 0
        v = 0
        while i < len(s) and s[i] in digits:
            if v > (1 << 63) // 10:
                return None
            v = v * 10 + s[i] - 48
            if v > 1 << 63:
                return None
            i += 1
        pre = i > 0
        s = s[i:]
        f, scale, post = 0, 1.0, False
        if s[:1] == b".":
            s = s[1:]
            i = 0
            overflow = False
            while i < len(s) and s[i] in digits:
                if not overflow:
                    if f > ((1 << 63) - 1) // 10:
                        overflow = True
                    else:
                        y = f * 10 + s[i] - 48
                        if y > 1 << 63:
                            overflow = True
                        else:
                            f = y
                            scale *= 10
                i += 1
            post = i > 0
            s = s[i:]
        if not pre and not post:
            return None
        i = 0
        while i < len(s) and s[i] not in b".0123456789":
            i += 1
        if i == 0:
            return None
        unit = _UNITS_NS.get(s[:i])
        s = s[i:]
        if unit is None:
            return None
        if v > (1 << 63) // unit:
            return None
        v *= unit
        if f > 0:
            v += int(float(f) * (float(unit) / scale))
            if v > 1 << 63:
                return None
        total += v
        if total > 1 << 63:
            return None
    if neg:
        return -total
    if total > (1 << 63) - 1:
        return None
    return total


def _every_delay(expr: str, text: str) -> dt.timedelta:
    ns = _parse_go_duration(text)
    if ns is None:
        raise CronError(expr, "@every", f"{text!r} is not a Go duration such as 90s or 1h30m")
    # robfig's Every: at least one second, fractions of a second dropped
    seconds = max(ns, 1_000_000_000) // 1_000_000_000
    return dt.timedelta(seconds=seconds)


# --- evaluation: robfig's SpecSchedule.Next over Go's time arithmetic ------------------------


def _offset(unix: int, zone: dt.tzinfo) -> int:
    off = dt.datetime.fromtimestamp(unix, zone).utcoffset()
    return int(off.total_seconds()) if off is not None else 0


def _go_date(year: int, month: int, day: int, hour: int, minute: int, second: int, zone: dt.tzinfo) -> int:  # fmt: skip
    """Go's time.Date as a Unix time: out-of-range fields normalised; a wall time in a gap or
    an overlap resolved as Go does (the offset in force at wall-as-UTC, corrected once)."""
    year += (month - 1) // 12
    month = (month - 1) % 12 + 1
    days = dt.date(year, month, 1).toordinal() - _EPOCH_ORDINAL + day - 1
    wall = days * 86400 + hour * 3600 + minute * 60 + second
    return wall - _offset(wall - _offset(wall, zone), zone)


def _add_date(unix: int, zone: dt.tzinfo, months: int = 0, days: int = 0) -> int:
    w = dt.datetime.fromtimestamp(unix, zone)
    return _go_date(w.year, w.month + months, w.day + days, w.hour, w.minute, w.second, zone)


def _day_matches(spec: _Spec, w: dt.datetime) -> bool:
    dom_match = bool(spec.dom >> w.day & 1)
    dow_match = bool(spec.dow >> ((w.weekday() + 1) % 7) & 1)
    if spec.dom & _STAR or spec.dow & _STAR:
        return dom_match and dow_match
    return dom_match or dow_match


def _spec_next(spec: _Spec, after: dt.datetime) -> dt.datetime | None:
    orig = after.tzinfo
    assert orig is not None
    zone = spec.zone if spec.zone is not None else orig
    # the upcoming whole second
    t = (after - _EPOCH) // _ONE_SECOND + 1
    added = False
    w = dt.datetime.fromtimestamp(t, zone)
    year_limit = w.year + 5

    def wall(unix: int) -> dt.datetime:
        return dt.datetime.fromtimestamp(unix, zone)

    while True:  # robfig's WRAP label
        w = wall(t)
        if w.year > year_limit:
            return None
        wrapped = False
        while not spec.month >> w.month & 1:
            if not added:
                added = True
                t = _go_date(w.year, w.month, 1, 0, 0, 0, zone)
            t = _add_date(t, zone, months=1)
            w = wall(t)
            if w.month == 1:
                wrapped = True
                break
        if wrapped:
            continue
        while not _day_matches(spec, w):
            if not added:
                added = True
                t = _go_date(w.year, w.month, w.day, 0, 0, 0, zone)
            before = t
            t = _add_date(t, zone, days=1)
            w = wall(t)
            # midnight may not exist (DST at 00:00): pull back to (or push on to) the day's start
            if w.hour != 0:
                t += (24 - w.hour) * 3600 if w.hour > 12 else -w.hour * 3600
                w = wall(t)
            if t <= before:
                # The next day does not exist at all (Pacific/Apia skipped 2011-12-30): robfig
                # loops here forever; step over it instead.
                t = before + 86400
                w = wall(t)
            if w.day == 1:
                wrapped = True
                break
        if wrapped:
            continue
        while not spec.hour >> w.hour & 1:
            if not added:
                added = True
                t = _go_date(w.year, w.month, w.day, w.hour, 0, 0, zone)
            t += 3600
            w = wall(t)
            if w.hour == 0:
                wrapped = True
                break
        if wrapped:
            continue
        while not spec.minute >> w.minute & 1:
            if not added:
                added = True
                t -= t % 60  # Go's Truncate works on absolute time
            t += 60
            w = wall(t)
            if w.minute == 0:
                wrapped = True
                break
        if wrapped:
            continue
        # the seconds field is always 0 in a 5-field expression
        while w.second != 0:
            added = True
            t += 1
            w = wall(t)
            if w.second == 0:
                wrapped = True
                break
        if wrapped:
            continue
        return dt.datetime.fromtimestamp(t, orig)


class CronSchedule:
    """A cron expression as a periodic-job schedule (see :func:`cron`)."""

    __slots__ = ("_impl", "expression")

    def __init__(self, expression: str) -> None:
        self._impl = _parse(expression)
        self.expression = expression

    def next(self, after: dt.datetime) -> dt.datetime | None:
        """The first fire time strictly after ``after`` (whole seconds), in ``after``'s zone;
        None when there is none within five years (robfig's zero time)."""
        if not isinstance(after, dt.datetime) or after.utcoffset() is None:
            raise ValidationError("after", "must be a timezone-aware datetime", after)
        if isinstance(self._impl, dt.timedelta):
            # robfig's Every: an absolute step, landing on a whole second
            utc = after.astimezone(_UTC)
            step = self._impl - dt.timedelta(microseconds=utc.microsecond)
            return (utc + step).astimezone(after.tzinfo)
        return _spec_next(self._impl, after)

    def __repr__(self) -> str:
        return f"cron({self.expression!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CronSchedule):
            return NotImplemented
        return self.expression == other.expression

    def __hash__(self) -> int:
        return hash(("cron", self.expression))


def cron(expression: str) -> CronSchedule:
    """Parse a cron expression, raising :class:`CronError` naming the bad part.

    ``"*/15 * * * *"``, ``"0 9 * * MON-FRI"``, ``"CRON_TZ=Europe/Paris 0 9 * * *"``,
    ``"@daily"``, ``"@every 90s"``. Without ``CRON_TZ=``/``TZ=`` the expression is evaluated in
    the zone of the time it is asked about (a client asks in the process's local zone, as River
    does).
    """
    return CronSchedule(expression)
