"""Unique job keys and state masks, byte-identical to River Go (v0.51).

River stores ``unique_key = SHA-256(key string)`` where the key string is the
concatenation of the enabled parts ``&kind=<kind>``, ``&args=<json>``,
``&period=<RFC 3339 UTC>`` and ``&queue=<queue>``. Python and Go clients share
one table, so every byte must match: the args part is rebuilt from the raw
bytes of the encoded args (values are copied verbatim, never re-encoded).

Field paths for ``by_args`` are the Python form of Go's ``river:"unique"``
struct tags: JSON field names joined by ``.`` for nested objects. A backslash
escapes the next character, so a key containing a dot is written ``a\\.b``
(the same form River uses internally, so River's own paths work verbatim).
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Union

from . import _gojson
from ._job import JobState

__all__ = [
    "DEFAULT_UNIQUE_STATES",
    "DEFAULT_UNIQUE_STATES_MASK",
    "JOB_STATES",
    "REQUIRED_UNIQUE_STATES",
    "UNIQUE_STATES_BY_MASK",
    "unique_key",
    "unique_key_string",
    "unique_states_mask",
    "validate_by_period",
    "validate_unique_opts",
    "validate_unique_states",
]

JOB_STATES: Final = (
    "available",
    "cancelled",
    "completed",
    "discarded",
    "pending",
    "retryable",
    "running",
    "scheduled",
)
"""All job states; a state's bit in ``unique_states`` is ``1 << index``: River's layout, the
one table of it (both drivers' SQL and row decoding derive theirs from it)."""

_STATE_BITS: Final = {state: 1 << index for index, state in enumerate(JOB_STATES)}
UNIQUE_STATES_BY_MASK: Final = tuple(
    frozenset(JobState(s) for s, bit in _STATE_BITS.items() if mask & bit) for mask in range(256)
)
"""The states of each stored ``unique_states`` value (0 to 255), for decoding rows."""


DEFAULT_UNIQUE_STATES: Final = frozenset(
    {"available", "completed", "pending", "retryable", "running", "scheduled"}
)
DEFAULT_UNIQUE_STATES_MASK: Final = 0xF5

REQUIRED_UNIQUE_STATES: Final = ("available", "pending", "running", "scheduled")
"""States a custom ``by_state`` must keep (River rejects the options otherwise)."""

_GO_ZERO_TIME: Final = dt.datetime(1, 1, 1, tzinfo=dt.UTC)
_ONE_MICROSECOND: Final = dt.timedelta(microseconds=1)


# -- states -------------------------------------------------------------------------


def _state_name(state: object) -> str:
    value = state.value if isinstance(state, enum.Enum) else state
    if not isinstance(value, str):
        raise TypeError(f"job state must be a str, got {type(state).__name__}")
    return str(value)


def _go_quote(text: str) -> str:
    """Approximately Go's ``%q`` (exact for printable text), for error messages."""
    return json.dumps(text, ensure_ascii=False)


def unique_states_mask(states: Iterable[str]) -> int:
    """The ``unique_states`` bit(8) value for ``states`` (available=bit 0 ... scheduled=bit 7).

    As in River, an empty collection means the default states (0xF5), so a unique
    job never gets a mask of 0 (which the insert would store as NULL).
    """
    mask = 0
    for state in states:
        name = _state_name(state)
        bit = _STATE_BITS.get(name)
        if bit is None:
            raise ValueError(f"UniqueOpts.ByState contains invalid state {_go_quote(name)}")
        mask |= bit
    return mask or DEFAULT_UNIQUE_STATES_MASK


def validate_unique_states(states: Iterable[str] | None) -> None:
    """Raise ValueError (River's message) unless ``states`` is a valid custom ``by_state``."""
    if states is None:
        return
    names = [_state_name(state) for state in states]
    for name in names:
        if name not in _STATE_BITS:
            raise ValueError(f"UniqueOpts.ByState contains invalid state {_go_quote(name)}")
    if not names:
        return
    missing = [state for state in REQUIRED_UNIQUE_STATES if state not in names]
    if missing:
        raise ValueError(
            "UniqueOpts.ByState must contain all required states, missing: " + ", ".join(missing)
        )


def validate_by_period(by_period: dt.timedelta | None) -> None:
    """Raise ValueError (River's message) for a set period shorter than one second."""
    if by_period is not None and by_period and by_period < dt.timedelta(seconds=1):
        raise ValueError("UniqueOpts.ByPeriod should not be less than 1 second")


def validate_unique_opts(
    *,
    by_args: bool | Sequence[str] = False,
    by_period: dt.timedelta | None = None,
    by_queue: bool = False,
    by_state: Iterable[str] | None = None,
    exclude_kind: bool = False,
) -> None:
    """River's ``UniqueOpts.validate``, checks in River's order, same messages."""
    states = None if by_state is None else list(by_state)
    if by_args is False and not by_period and not by_queue and states is None and not exclude_kind:
        return
    validate_by_period(by_period)
    if exclude_kind and by_args is False and not by_queue and not by_period:
        raise ValueError("UniqueOpts.ExcludeKind requires ByArgs, ByQueue, or ByPeriod")
    validate_unique_states(states)


# -- key ------------------------------------------------------------------------------


def unique_key(
    *,
    kind: str,
    encoded_args: bytes,
    by_args: bool | Sequence[str],
    by_period: dt.timedelta | None,
    by_queue: bool,
    exclude_kind: bool,
    queue: str,
    period_time: dt.datetime | None = None,
) -> bytes:
    """The 32-byte ``unique_key`` River stores for these options."""
    key = unique_key_string(
        kind=kind,
        encoded_args=encoded_args,
        by_args=by_args,
        by_period=by_period,
        by_queue=by_queue,
        exclude_kind=exclude_kind,
        queue=queue,
        period_time=period_time,
    )
    return hashlib.sha256(_to_go_bytes(key)).digest()


def unique_key_string(
    *,
    kind: str,
    encoded_args: bytes,
    by_args: bool | Sequence[str],
    by_period: dt.timedelta | None,
    by_queue: bool,
    exclude_kind: bool,
    queue: str,
    period_time: dt.datetime | None = None,
) -> str:
    """The key string before hashing (for debugging and tests).

    ``by_args``: False, True (all top-level keys), or field paths (an empty list
    behaves like True, as an args struct without tagged fields does in Go).
    ``by_period``: None or zero disables it; ``period_time`` (the job's
    scheduled time, else now) is then required and must be timezone-aware.
    """
    parts: list[str] = []
    if not exclude_kind:
        parts.append("&kind=" + kind)
    if isinstance(by_args, str):
        raise TypeError("by_args must be a bool or a sequence of paths, not a str")
    if by_args is not False:
        text = encoded_args.decode("utf-8", "surrogateescape")
        if by_args is True or len(by_args) == 0:
            parts.append("&args=" + _sorted_object(text))
        else:
            parts.append("&args=" + _object_from_paths(text, by_args))
    if by_period:
        if by_period < dt.timedelta(0):
            raise ValueError("by_period must not be negative")
        if period_time is None:
            raise ValueError("period_time is required when by_period is set")
        parts.append("&period=" + _period_bound(period_time, by_period))
    if by_queue:
        parts.append("&queue=" + queue)
    return "".join(parts)


def _to_go_bytes(text: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _period_bound(moment: dt.datetime, period: dt.timedelta) -> str:
    """Start of the period containing ``moment``, counted from Go's zero time, as UTC RFC 3339."""
    if moment.utcoffset() is None:
        raise ValueError("period_time must be timezone-aware")
    since_zero = (moment - _GO_ZERO_TIME) // _ONE_MICROSECOND
    step = period // _ONE_MICROSECOND
    try:
        bound = _GO_ZERO_TIME + dt.timedelta(microseconds=since_zero - since_zero % step)
    except OverflowError:
        raise ValueError("period_time is out of range") from None
    return (
        f"{bound.year:04d}-{bound.month:02d}-{bound.day:02d}T"
        f"{bound.hour:02d}:{bound.minute:02d}:{bound.second:02d}Z"
    )


# -- JSON scanning over the encoded args -------------------------------------------

_scan_value: Callable[[str, int], tuple[object, int]] = getattr(json.JSONDecoder(), "scan_once")  # noqa: B009
_scan_string = json.decoder.scanstring  # type: ignore[attr-defined]
_WS: Final = " \t\n\r"
_NEEDS_GO_ESCAPE: Final = re.compile('[\x00-\x1f\x80-\U0010ffff"\\\\]')


class _JSONError(ValueError):
    pass


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    return pos


def _value_end(text: str, pos: int) -> int:
    try:
        _, end = _scan_value(text, pos)
    except (StopIteration, ValueError):
        raise _JSONError(f"encoded args are not valid JSON (at offset {pos})") from None
    return int(end)


_ITEM_RE: Final = re.compile(
    r'[ \t\n\r]*("[^"\\]*(?:\\.[^"\\]*)*")[ \t\n\r]*:[ \t\n\r]*'
    r'(?:("[^"\\]*(?:\\.[^"\\]*)*"|-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|true|false|null)'
    r"[ \t\n\r]*([,}]))?",
    re.DOTALL,
)
"""One object member: key, then (for scalar values) the value and the separator after it."""
_SEP_RE: Final = re.compile(r"[ \t\n\r]*([,}])")


def _object_items(text: str, pos: int) -> list[tuple[str, str, str]]:
    """(key, raw key text, raw value text) of the object starting at ``pos``."""
    items: list[tuple[str, str, str]] = []
    pos = _skip_ws(text, pos + 1)
    if text.startswith("}", pos):
        return items
    match_item = _ITEM_RE.match
    append = items.append
    while True:
        match = match_item(text, pos)
        if match is None:
            raise _JSONError(f"encoded args are not valid JSON (at offset {pos})")
        raw_key, value, separator = match.group(1, 2, 3)
        key = raw_key[1:-1] if "\\" not in raw_key else _scan_string(raw_key, 1)[0]
        if value is not None:
            pos = match.end()
        else:
            start = match.end()
            end = _value_end(text, start)
            value = text[start:end]
            sep_match = _SEP_RE.match(text, end)
            if sep_match is None:
                raise _JSONError(f"encoded args are not valid JSON (at offset {end})")
            separator = sep_match.group(1)
            pos = sep_match.end()
        append((key, raw_key, value))
        if separator == "}":
            return items


def _array_items(text: str, pos: int) -> list[tuple[int, int]]:
    """(start, end) of each element of the array starting at ``pos``."""
    items: list[tuple[int, int]] = []
    pos = _skip_ws(text, pos + 1)
    if text.startswith("]", pos):
        return items
    while True:
        end = _value_end(text, pos)
        items.append((pos, end))
        pos = _skip_ws(text, end)
        if text.startswith(",", pos):
            pos = _skip_ws(text, pos + 1)
        elif text.startswith("]", pos):
            return items
        else:
            raise _JSONError(f"encoded args are not valid JSON (at offset {pos})")


def _go_key(key: str) -> str:
    """An object key as River writes it: verbatim in quotes unless it needs JSON escaping."""
    if _NEEDS_GO_ESCAPE.search(key) is None:
        return '"' + key + '"'
    return _gojson.encode_str(key).decode("utf-8")


def _sorted_object(text: str) -> str:
    """All top-level keys, sorted, first value of each copied raw."""
    pos = _skip_ws(text, 0)
    if pos == len(text):
        return "{}"
    if text[pos] == "[" and not _array_items(text, pos):
        return "{}"
    if text[pos] != "{":
        raise ValueError("unique args must encode a JSON object")
    values: dict[str, str] = {}
    for key, _raw_key, value in _object_items(text, pos):
        if key not in values:
            values[key] = value
    body = ",".join(_go_key(key) + ":" + values[key] for key in sorted(values))
    return "{" + body + "}"


# -- tagged field paths ---------------------------------------------------------------


def _split_path(path: str) -> tuple[str, ...]:
    """Components of a dotted path; a backslash makes the next character literal."""
    components: list[str] = []
    current: list[str] = []
    chars = iter(path)
    for char in chars:
        if char == "\\":
            escaped = next(chars, None)
            if escaped is not None:
                current.append(escaped)
        elif char == ".":
            components.append("".join(current))
            current = []
        else:
            current.append(char)
    components.append("".join(current))
    return tuple(components)


def _is_safe_path_char(char: str) -> bool:
    return (char.isascii() and (char.isalnum() or char in "_-:")) or char <= " " or char > "~"


def _escaped_path(components: tuple[str, ...]) -> str:
    """The path as River spells it internally (used to break sort ties like River)."""
    escaped = []
    for component in components:
        text = "".join(c if _is_safe_path_char(c) else "\\" + c for c in component)
        escaped.append("\\" + text if text.startswith(":") else text)
    return ".".join(escaped)


def _lookup(current: str, components: Sequence[str]) -> str | None:
    """Raw text of the value at ``components`` inside the raw value ``current``, or None."""
    for component in components:
        opener = current[:1]
        if opener == "{":
            for key, _raw_key, value in _object_items(current, 0):
                if key == component:
                    current = value
                    break
            else:
                return None
        elif opener == "[" and _is_index(component):
            elements = _array_items(current, 0)
            index = int(component)
            if index >= len(elements):
                return None
            start, end = elements[index]
            current = current[start:end]
        else:
            return None
    return current


def _is_index(component: str) -> bool:
    return component.isascii() and component.isdigit()


class _Null:
    """Array padding written as ``null``."""


_NULL: Final = _Null()

# A node of the object being built: raw JSON text, an object (key -> (written
# key text, node), in insertion order), an array, or null padding.
_Node = Union[str, "dict[str, tuple[str, _Node]]", "list[_Node]", _Null, None]


def _expand(raw: str) -> _Node:
    """Turn a raw object/array into an editable node, keeping its key spellings."""
    if raw.startswith("{"):
        obj: dict[str, tuple[str, _Node]] = {}
        for key, raw_key, value in _object_items(raw, 0):
            obj.setdefault(key, (raw_key, value))
        return obj
    if raw.startswith("["):
        return [raw[start:end] for start, end in _array_items(raw, 0)]
    return None  # scalars are replaced by a new container


def _build(components: tuple[str, ...], raw: str) -> _Node:
    """A fresh node holding ``raw`` at ``components`` (digits or -1 make arrays)."""
    if not components:
        return raw
    head, rest = components[0], components[1:]
    if _is_index(head) or head == "-1":
        count = int(head) if _is_index(head) else 0
        return [*([_NULL] * count), _build(rest, raw)]
    return {head: (_go_key(head), _build(rest, raw))}


def _set(node: _Node, components: tuple[str, ...], raw: str) -> _Node:
    """Set ``raw`` at ``components`` in ``node``; new keys go at the end, as River does."""
    head, rest = components[0], components[1:]
    if isinstance(node, str):
        node = _expand(node)
    if isinstance(node, dict):
        if head in node:
            written, child = node[head]
            node[head] = (written, _set(child, rest, raw) if rest else raw)
        else:
            node[head] = (_go_key(head), _build(rest, raw))
        return node
    if isinstance(node, list):
        if _is_index(head):
            index = int(head)
            if index < len(node):
                node[index] = _set(node[index], rest, raw) if rest else raw
                return node
            node.extend([_NULL] * (index - len(node)))
        elif head != "-1":
            raise ValueError(f"cannot set array element for non-numeric key {head!r}")
        node.append(_build(rest, raw))
        return node
    if _is_index(head):
        return [*([_NULL] * int(head)), _build(rest, raw)]
    return {head: (_go_key(head), _build(rest, raw))}


def _dump(node: _Node) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, dict):
        return (
            "{" + ",".join(written + ":" + _dump(child) for written, child in node.values()) + "}"
        )
    if isinstance(node, list):
        return "[" + ",".join(_dump(child) for child in node) + "]"
    return "null"


@functools.lru_cache(maxsize=512)
def _sorted_paths(paths: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """Parsed paths in River's order (cached: one args class reuses one path list)."""
    components = [_split_path(path) for path in paths]
    components.sort(key=lambda parts: (".".join(parts), _escaped_path(parts)))
    return tuple(components)


def _object_from_paths(text: str, paths: Sequence[str]) -> str:
    """River's args part for tagged fields: sorted paths, missing ones skipped."""
    components = _sorted_paths(tuple(paths))
    text = text.strip(_WS)
    top: dict[str, str] | None = None
    if text.startswith("{"):
        top = {}
        for key, _raw_key, value in _object_items(text, 0):
            top.setdefault(key, value)
    root: _Node = None
    for parts in components:
        if top is not None:
            raw = top.get(parts[0])
            if raw is not None and len(parts) > 1:
                raw = _lookup(raw, parts[1:])
        else:
            raw = _lookup(text, parts)
        if raw is not None:
            root = _set(root, parts, raw)
    return "" if root is None else _dump(root)
