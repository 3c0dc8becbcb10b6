"""Decoding the JSON a job row holds as River Go decodes it, leniently where River is lenient.

River Go reads a row's attempt errors leniently: an element it did not write (a missing or
malformed ``at``, an ``attempt`` as a string, an ``error`` that is an object, a bare number)
still decodes, as its zero values or its compacted JSON text, and is never rewritten. What
cannot decode at all (a JSON column changed out of band to text that is not JSON, tags that are
not strings) makes the row *undecodable*: the drivers return it as an
:class:`~river_anyio._job.UndecodableJobRow`, and the runtime fails its attempt without working
it (see ``_runtime._runner``).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from typing import Any, Final

from .._job import AttemptError

__all__ = [
    "ZERO_TIME",
    "attempt_error_json",
    "attempt_error_value",
    "attempt_errors_json",
    "decode_failure",
    "json_type",
    "string_list",
]

#: Go's zero ``time.Time`` (0001-01-01T00:00:00Z): the ``at`` of an error that has none.
ZERO_TIME: Final = dt.datetime(1, 1, 1, tzinfo=dt.UTC)

_decode = json.JSONDecoder().decode
_raw_decode = json.JSONDecoder().raw_decode
_scanstring: Any = json.decoder.scanstring  # type: ignore[attr-defined]
_WS: Final = re.compile(r"[ \t\n\r]*")
_COMPACT: Final = re.compile(r'"(?:[^"\\]|\\.)*"|[ \t\n\r]+', re.DOTALL)
#: Go's strict RFC 3339 (``time.Time``'s JSON form): ``T``, and ``Z`` or ``±hh:mm``.
_RFC3339: Final = re.compile(
    r"\A(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:Z|([+-])(\d{2}):(\d{2}))\Z"
)
_INT: Final = re.compile(r"\A[+-]?\d+\Z")
_FLOAT: Final = re.compile(r"\A[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\Z")
_INT64: Final = 1 << 63
_FIELDS: Final = frozenset({"at", "attempt", "error", "trace"})


def decode_failure(column: str, exc: BaseException | str) -> str:
    """The decode error of one column, worded as River Go words it."""
    return f"error unmarshaling `{column}`: {exc}"


def string_list(value: object) -> tuple[str, ...] | None:
    """A JSON array of strings (``attempted_by``, ``tags``) as a tuple; JSON null as ``()``;
    None when the value is anything else (the column cannot be decoded)."""
    if value is None:
        return ()
    if type(value) is list and all(type(v) is str for v in value):
        return tuple(value)
    return None


def _time(value: object) -> tuple[dt.datetime, int]:
    """``at`` as Go's ``time.Time`` decodes it, and its nanoseconds past the microseconds
    (0-999: Go writes nanoseconds, which a datetime cannot hold; see
    ``AttemptError.at_nanosecond``); the zero time when it cannot be decoded."""
    if type(value) is not str:
        return ZERO_TIME, 0
    m = _RFC3339.match(value)
    if m is None:
        return ZERO_TIME, 0
    y, mo, d, h, mi, s, frac, sign, oh, om = m.groups()
    tz: dt.tzinfo = dt.UTC
    if sign is not None:
        if int(oh) > 23 or int(om) > 59:
            return ZERO_TIME, 0
        offset = dt.timedelta(hours=int(oh), minutes=int(om))
        if offset:
            tz = dt.timezone(-offset if sign == "-" else offset)
    try:
        when = dt.datetime(
            int(y),
            int(mo),
            int(d),
            int(h),
            int(mi),
            int(s),
            int((frac or "").ljust(6, "0")[:6]),
            tzinfo=tz,
        )
    except ValueError:  # out of range (day 31 of a short month, second 60, year 0)
        return ZERO_TIME, 0
    return when, int(frac[6:9].ljust(3, "0")) if frac and len(frac) > 6 else 0


def _int(value: object) -> int:
    """``attempt`` read leniently: a number or a numeric string, when it is an integer."""
    if type(value) is str:
        text = value.strip()
        if _INT.match(text):
            value = int(text)
        elif _FLOAT.match(text):
            value = float(text)
        else:
            return 0
    if type(value) is int:
        if -_INT64 <= value < _INT64:
            return value
        value = float(value)
    if (
        type(value) is float
        and math.isfinite(value)
        and value == math.trunc(value)
        and abs(value) <= 1 << 53
    ):
        return int(value)
    return 0


def _string(value: object, raw: str | None) -> str:
    """``error`` or ``trace`` read leniently: a string as it is, null or absent as "", any
    other JSON as its compacted text."""
    if raw is None or value is None:
        return ""
    if type(value) is str:
        return value
    return _compact(raw)


def _compact(raw: str) -> str:
    """JSON text without the whitespace between its tokens (Go's ``json.Compact``)."""
    return _COMPACT.sub(lambda m: m[0] if m[0][0] == '"' else "", raw).strip()


def attempt_error_value(value: object) -> AttemptError | None:
    """An element River wrote (an object of ``at``, ``attempt``, ``error`` and ``trace`` of
    their own types), decoded from its JSON value; None for any other shape (decode its text
    with :func:`attempt_error_json`)."""
    if type(value) is not dict or not _FIELDS.issuperset(value):
        return None
    attempt = value.get("attempt", 0)
    error = value.get("error", "")
    trace = value.get("trace", "")
    if (
        type(attempt) is not int
        or not -_INT64 <= attempt < _INT64
        or (error is not None and type(error) is not str)
        or (trace is not None and type(trace) is not str)
    ):
        return None
    at, nanosecond = _time(value.get("at"))
    return AttemptError(
        at=at, attempt=attempt, error=error or "", trace=trace or "", at_nanosecond=nanosecond
    )


def attempt_error_json(text: str) -> AttemptError:
    """One element of a row's ``errors`` from its JSON text, as River Go decodes it.

    An element River wrote decodes as written. Otherwise an object's fields are matched
    case-insensitively (the last of a repeated field wins) and read leniently: ``at`` that is
    not RFC 3339 is the zero time, ``attempt`` may be a numeric string, ``error`` and
    ``trace`` that are not strings are their compacted JSON text. Any other JSON value is an
    error whose text is its own (a string's value, else its compacted JSON).
    Raises ValueError when ``text`` is not JSON.
    """
    value = _decode(text)
    fast = attempt_error_value(value)
    if fast is not None:
        return fast
    if type(value) is not dict:
        return AttemptError(at=ZERO_TIME, attempt=0, error=_string(value, text), trace="")
    fields: dict[str, tuple[Any, str]] = {}
    for key, raw in _members(text):
        name = key.lower() if key.isascii() else key
        if name in _FIELDS:
            fields[name] = (_decode(raw), raw)
    at = fields.get("at", (None, None))[0]
    attempt = fields.get("attempt", (None, None))[0]
    error, error_raw = fields.get("error", (None, None))
    trace, trace_raw = fields.get("trace", (None, None))
    when, nanosecond = _time(at)
    return AttemptError(
        at=when,
        attempt=_int(attempt),
        error=_string(error, error_raw),
        trace=_string(trace, trace_raw),
        at_nanosecond=nanosecond,
    )


def attempt_errors_json(text: str) -> tuple[AttemptError, ...]:
    """A whole ``errors`` array from its JSON text (SQLite's column), each element as
    :func:`attempt_error_json` decodes it; JSON null is no errors. Raises ValueError when the
    text is not JSON or not an array."""
    value = _decode(text)
    if value is None:
        return ()
    if type(value) is not list:
        raise ValueError(f"cannot unmarshal {json_type(value)} into an array of attempt errors")
    out = [attempt_error_value(v) for v in value]
    if all(e is not None for e in out):
        return tuple(out)  # type: ignore[arg-type]
    return tuple(attempt_error_json(raw) for raw in _elements(text))


def json_type(value: object) -> str:
    """The JSON type of a decoded value, in Go's words (for decode errors)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    return "array" if isinstance(value, list) else "null"


def _skip(text: str, i: int) -> int:
    m = _WS.match(text, i)
    assert m is not None
    return m.end()


def _members(text: str) -> list[tuple[str, str]]:
    """The members of a JSON object's text, each key with its value's raw text, in order."""
    i = _skip(text, 0)
    if text[i : i + 1] != "{":
        raise ValueError("not a JSON object")
    i = _skip(text, i + 1)
    out: list[tuple[str, str]] = []
    if text[i : i + 1] == "}":
        return out
    while True:
        if text[i : i + 1] != '"':
            raise ValueError("expected a key")
        key, i = _scanstring(text, i + 1)
        i = _skip(text, i)
        if text[i : i + 1] != ":":
            raise ValueError("expected ':'")
        start = _skip(text, i + 1)
        _, end = _raw_decode(text, start)
        out.append((key, text[start:end]))
        i = _skip(text, end)
        if text[i : i + 1] == ",":
            i = _skip(text, i + 1)
            continue
        if text[i : i + 1] == "}":
            return out
        raise ValueError("expected ',' or '}'")


def _elements(text: str) -> list[str]:
    """The raw text of each element of a JSON array's text."""
    i = _skip(text, 0)
    if text[i : i + 1] != "[":
        raise ValueError("not a JSON array")
    i = _skip(text, i + 1)
    out: list[str] = []
    if text[i : i + 1] == "]":
        return out
    while True:
        _, end = _raw_decode(text, i)
        out.append(text[i:end])
        i = _skip(text, end)
        if text[i : i + 1] == ",":
            i = _skip(text, i + 1)
            continue
        if text[i : i + 1] == "]":
            return out
        raise ValueError("expected ',' or ']'")
