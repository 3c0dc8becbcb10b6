"""JSON encoding byte-identical to Go's ``encoding/json`` ``json.Marshal``.

River computes unique keys from the encoded args bytes, so args inserted from
Python must encode exactly as the equivalent Go value would. The mapping:

* attrs instance -> Go struct: fields in declaration order; the key is the
  field name or ``metadata["json"]`` (``"-"`` skips the field); a field with
  ``metadata["omitempty"]`` true is left out when its value is empty by Go's
  rules (None, False, 0, 0.0, "", empty list/tuple/dict/bytes).
* dict -> Go map (str keys, sorted by UTF-8 bytes); list/tuple -> array;
  None -> null; bool; int -> decimal; float -> Go's float64 format;
  str -> Go string escaping (HTML characters, U+2028/U+2029, control
  characters; a lone surrogate stands for invalid UTF-8 and becomes ``\\ufffd``).
* aware datetime -> RFC 3339 with nanosecond-style trimmed fraction (Go
  ``time.Time``); uuid.UUID -> canonical string; enum.Enum -> its value;
  bytes/bytearray -> standard base64 (Go ``[]byte``).

Anything else raises TypeError naming the path of the offending value.
"""

from __future__ import annotations

import base64
import datetime as dt
import enum
import json
import math
import re
import uuid
from collections.abc import Callable
from typing import Any, Final

import attrs

__all__ = ["MAX_DEPTH", "encode", "encode_str", "format_float", "format_time"]

MAX_DEPTH: Final = 256
"""Deepest container nesting accepted (two frames per level stay well under the default
recursion limit; Go has no limit, but args this deep are a bug)."""

_escape_str: Callable[[str], str] = json.encoder.encode_basestring
# Python's ensure_ascii=False string escaper (C-accelerated) already matches Go
# for '"', '\\', the short escapes \b \f \n \r \t and \u00XX (lowercase hex) for
# other control characters, and leaves DEL raw. What Go additionally escapes
# is applied to the whole output afterwards: those characters cannot occur in
# JSON outside string literals, so a global substitution is exact.
_GO_EXTRA_ESCAPES: Final = re.compile("[<>&\u2028\u2029]")
_GO_EXTRA_TABLE: Final = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_ZERO_OFFSET: Final = dt.timedelta(0)


class _PathError(Exception):
    """Carries the failing path outwards while the recursion unwinds."""

    def __init__(self, exc_type: type[Exception], message: str) -> None:
        super().__init__(message)
        self.exc_type = exc_type
        self.message = message
        self.path: list[str] = []


def encode(value: object) -> bytes:
    """Encode ``value`` as Go's ``json.Marshal`` would encode the equivalent Go value."""
    out: list[str] = []
    try:
        if type(value) in _plans:  # an args struct already seen: straight to its plan
            _encode_struct(value, out, 0)
        else:
            _encode(value, out, 0)
    except _PathError as err:
        path = "$" + "".join(reversed(err.path))
        raise err.exc_type(f"{err.message} at {path}") from None
    except RecursionError:
        raise ValueError("value nested too deeply to encode") from None
    return _finish("".join(out))


def encode_str(value: str) -> bytes:
    """Encode one string as a Go JSON string literal."""
    return _finish(_escape_str(value))


def _finish(text: str) -> bytes:
    """Apply Go's extra escapes and turn lone surrogates into ``\\ufffd``."""
    if _GO_EXTRA_ESCAPES.search(text) is not None:
        text = text.translate(_GO_EXTRA_TABLE)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\\\\ufffd", text).encode("utf-8")


def format_float(value: float) -> str:
    """Format a float64 as Go's encoder does (ES6 number-to-string style)."""
    if value != value or value in (math.inf, -math.inf):
        raise ValueError(f"json: unsupported value: {value!r}")
    if value == 0.0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    text = repr(value)  # shortest round-trip digits, like strconv's -1 precision
    magnitude = abs(value)
    if 1e-6 <= magnitude < 1e21:
        if "e" not in text:
            return text[:-2] if text.endswith(".0") else text
        return _positional(text)
    mantissa, _, exp_text = text.partition("e")
    exponent = int(exp_text)
    if exponent < 0:
        return f"{mantissa}e-{-exponent}"
    return f"{mantissa}e+{exponent:02d}"


def _positional(sci: str) -> str:
    """Rewrite Python's scientific repr (``1.5e-05``) in plain positional form."""
    mantissa, _, exp_text = sci.partition("e")
    sign = ""
    if mantissa.startswith("-"):
        sign, mantissa = "-", mantissa[1:]
    digits = mantissa.replace(".", "")
    point = (mantissa.find(".") if "." in mantissa else len(mantissa)) + int(exp_text)
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


def format_time(value: dt.datetime) -> str:
    """RFC 3339 with trimmed fraction, as Go's ``time.Time.MarshalJSON`` (unquoted)."""
    offset = value.utcoffset()
    if offset is None:
        raise ValueError("naive datetime: Go times always carry a zone; attach a tzinfo")
    text = (
        f"{value.year:04d}-{value.month:02d}-{value.day:02d}T"
        f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}"
    )
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    if offset == _ZERO_OFFSET:
        return text + "Z"
    # Go keeps whole seconds of offset and prints whole minutes, truncating towards zero.
    # The sign is that of the truncated minutes, so -00:00:59 prints as +00:00.
    offset_seconds = int(offset.total_seconds())
    if offset_seconds == 0:
        return text + "Z"
    minutes = abs(offset_seconds) // 60
    sign = "-" if offset_seconds < 0 and minutes else "+"
    return f"{text}{sign}{minutes // 60:02d}:{minutes % 60:02d}"


# -- struct plans ---------------------------------------------------------------

_Plan = tuple[tuple[str, str, str, bool], ...]
"""Per attrs class: (attribute, first-field key prefix, later-field prefix, omitempty)."""

_plans: dict[type, _Plan] = {}


def _plan_for(cls: type) -> _Plan:
    plan = _plans.get(cls)
    if plan is None:
        entries = []
        for field in attrs.fields(cls):
            meta = field.metadata
            name = meta.get("json", field.name)
            if name == "-":
                continue
            if not isinstance(name, str):
                raise TypeError(f"json name of {cls.__name__}.{field.name} must be a str")
            prefix = _escape_str(name) + ":"
            entries.append((field.name, prefix, "," + prefix, bool(meta.get("omitempty", False))))
        plan = tuple(entries)
        _plans[cls] = plan
    return plan


def _is_empty(value: object) -> bool:
    """Go's ``omitempty`` test for the Go value a Python value stands for."""
    if value is None or value is False:
        return True
    if isinstance(value, enum.Enum):
        return _is_empty(value.value)
    if isinstance(value, (str, list, tuple, dict, bytes, bytearray)):
        return len(value) == 0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value == 0
    return False


# -- the encoder ------------------------------------------------------------------


def _encode(value: Any, out: list[str], depth: int) -> None:
    kind = type(value)
    if kind is str:
        out.append(_escape_str(value))
    elif kind is int:
        out.append(int.__repr__(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif kind is float:
        if value - value != 0.0:  # NaN or ±Inf: Go's Marshal fails
            raise _PathError(ValueError, f"json: unsupported value: {value!r}")
        out.append(format_float(value))
    elif kind is dict:
        _encode_map(value, out, depth)
    elif kind is list or kind is tuple:
        _encode_list(value, out, depth)
    elif attrs.has(kind):
        _encode_struct(value, out, depth)
    else:
        _encode_other(value, out, depth)


def _encode_struct(value: Any, out: list[str], depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise _PathError(ValueError, f"nesting deeper than {MAX_DEPTH}")
    depth += 1
    out.append("{")
    first = True
    for attr, first_prefix, prefix, omitempty in _plan_for(type(value)):
        item = getattr(value, attr)
        if omitempty and _is_empty(item):
            continue
        out.append(first_prefix if first else prefix)
        first = False
        kind = type(item)
        if kind is str:  # the common scalars inline, saving a call per field
            out.append(_escape_str(item))
        elif kind is int:
            out.append(int.__repr__(item))
        else:
            try:
                _encode(item, out, depth)
            except _PathError as err:
                err.path.append("." + attr)
                raise
    out.append("}")


def _encode_map(value: dict[Any, Any], out: list[str], depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise _PathError(ValueError, f"nesting deeper than {MAX_DEPTH}")
    depth += 1
    for key in value:
        if not isinstance(key, str):
            raise _PathError(TypeError, f"map key {key!r} is not a str")
    # Code point order equals UTF-8 byte order, which is how Go sorts map keys.
    sep = "{"
    for key in sorted(value):
        out.append(sep)
        out.append(_escape_str(key))
        out.append(":")
        sep = ","
        item = value[key]
        kind = type(item)
        if kind is str:
            out.append(_escape_str(item))
        elif kind is int:
            out.append(int.__repr__(item))
        else:
            try:
                _encode(item, out, depth)
            except _PathError as err:
                err.path.append(f"[{key!r}]")
                raise
    out.append("}" if value else "{}")


def _encode_list(value: list[Any] | tuple[Any, ...], out: list[str], depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise _PathError(ValueError, f"nesting deeper than {MAX_DEPTH}")
    depth += 1
    sep = "["
    for index, item in enumerate(value):
        out.append(sep)
        sep = ","
        try:
            _encode(item, out, depth)
        except _PathError as err:
            err.path.append(f"[{index}]")
            raise
    out.append("]" if value else "[]")


def _encode_other(value: Any, out: list[str], depth: int) -> None:
    """Slower cases: subclasses, enums, times, UUIDs, bytes."""
    if isinstance(value, enum.Enum):
        _encode(value.value, out, depth)
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        try:
            out.append(format_float(value))
        except ValueError as exc:
            raise _PathError(ValueError, str(exc)) from None
    elif isinstance(value, str):
        out.append(_escape_str(value))
    elif isinstance(value, dt.datetime):
        try:
            out.append('"' + format_time(value) + '"')
        except ValueError as exc:
            raise _PathError(ValueError, str(exc)) from None
    elif isinstance(value, uuid.UUID):
        out.append('"' + str(value) + '"')
    elif isinstance(value, (bytes, bytearray)):
        out.append('"' + base64.b64encode(value).decode("ascii") + '"')
    elif isinstance(value, dict):
        _encode_map(value, out, depth)
    elif isinstance(value, (list, tuple)):
        _encode_list(value, out, depth)
    else:
        raise _PathError(TypeError, f"cannot encode {type(value).__qualname__} as Go JSON")
