"""Turning job args and insert options into rows ready to write, exactly as River Go does.

Precedence for each option: call site > the args class's own ``insert_opts`` > client > River's
default. Everything is validated here, before any database work, and every failure names the
field and the rule.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import attrs

from . import _gojson, _unique
from ._errors import ValidationError
from ._fastinit import positional_constructor
from ._job import (
    PRIORITY_DEFAULT,
    QUEUE_DEFAULT,
    InsertOpts,
    JobState,
    UniqueOpts,
    validate_kind,
    validate_queue_name,
)
from .drivers import JobInsertParams

__all__ = ["InsertManyParams", "build_insert_params", "kind_insert_opts"]


@attrs.frozen
class InsertManyParams:
    """One entry of an ``insert_many`` batch: args plus optional per-job options."""

    args: object
    opts: InsertOpts | None = None


#: No options: the default of every level (frozen, so one instance serves every insert).
_NO_OPTS = InsertOpts()
#: args class -> its validated kind (an insert of many jobs of one class checks it once)
_KINDS: dict[type, str] = {}
#: ``make_params(*values)``: a :class:`JobInsertParams` from its fields in order
_make_params = positional_constructor(JobInsertParams)
#: args class -> its kind, for the classes whose every instance takes River's defaults (no
#: ``insert_opts``, no instance ``__dict__`` that could hold one); False for the others
_PLAIN: dict[type, str | bool] = {}
#: River's default queue, validated once
_QUEUE_DEFAULT = validate_queue_name(QUEUE_DEFAULT)


def _plain_kind(args: object, field: str) -> str | bool:
    """The kind of ``args`` when its class sets no insert defaults of its own, else False."""
    cls = type(args)
    kind = args_kind(args, field)
    plain = (
        getattr(cls, "insert_opts", None) is None
        and cls.__dictoffset__ == 0  # slotted: no instance can carry an ``insert_opts``
        and not any(f.name == "insert_opts" for f in attrs.fields(cls))  # type: ignore[arg-type]
    )
    _PLAIN[cls] = kind if plain else False
    return _PLAIN[cls]


def args_kind(args: object, field: str = "args") -> str:
    """The kind of an args object: an attrs instance whose class has a ``kind`` str."""
    cls = type(args)
    kind = _KINDS.get(cls)
    if kind is not None:
        return kind
    if not attrs.has(cls):
        raise ValidationError(
            field,
            f"job args must be an attrs class instance with a `kind` class attribute, "
            f"got {cls.__name__}",
            args,
        )
    kind = _KINDS[cls] = class_kind(cls, field)
    return kind


def class_kind(cls: type, field: str = "args") -> str:
    """The validated ``kind`` class attribute of an args class."""
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str):
        raise ValidationError(
            field, f"{cls.__name__} needs a `kind` class attribute (a str naming the job kind)"
        )
    return validate_kind(kind, f"{field}.kind")


def kind_insert_opts(args: object, field: str = "args") -> InsertOpts:
    """The args class's own insert defaults (``insert_opts`` attribute or method), if any."""
    raw = getattr(args, "insert_opts", None)
    if raw is None:
        return _NO_OPTS
    if callable(raw):
        raw = raw()
    if not isinstance(raw, InsertOpts):
        raise ValidationError(
            f"{field}.insert_opts",
            f"must be an InsertOpts (or a method returning one), got {type(raw).__name__}",
        )
    return raw


def encode_args(args: object, field: str = "args") -> bytes:
    """Args as River Go would encode the equivalent struct (byte-identical for unique keys)."""
    try:
        encoded = _gojson.encode(args)
    except (TypeError, ValueError) as exc:
        raise ValidationError(field, f"args must encode to a JSON object: {exc}", args) from None
    if not encoded.startswith(b"{"):
        raise ValidationError(field, "args must encode to a JSON object", args)
    return encoded


def _encode_metadata(metadata: Any) -> bytes:
    if not metadata:
        return b"{}"
    return json.dumps(metadata, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def build_insert_params(
    args: object,
    opts: InsertOpts | None,
    *,
    client_max_attempts: int,
    now: Callable[[], dt.datetime],
    field: str = "args",
) -> JobInsertParams:
    """Resolve one job's row, computing its unique key when it is unique."""
    if opts is None or opts is _NO_OPTS:
        kind = _PLAIN.get(type(args))
        if kind is None:
            kind = _plain_kind(args, field)
        if kind:
            # no option at any level: River's defaults, the client's max attempts
            return _make_params(
                encode_args(args, field), kind, client_max_attempts, b"{}", PRIORITY_DEFAULT,
                _QUEUE_DEFAULT, JobState.AVAILABLE, (), None, None, None, None,
            )  # fmt: skip
    if opts is not None and not isinstance(opts, InsertOpts):
        raise ValidationError("opts", f"must be an InsertOpts or None, got {type(opts).__name__}")
    opts = opts or _NO_OPTS
    kind = args_kind(args, field)
    kind_opts = kind_insert_opts(args, field)
    encoded = encode_args(args, field)

    max_attempts = opts.max_attempts or kind_opts.max_attempts or client_max_attempts
    priority = opts.priority or kind_opts.priority or PRIORITY_DEFAULT
    queue = validate_queue_name(opts.queue or kind_opts.queue or QUEUE_DEFAULT)
    tags = opts.tags if opts.tags is not None else (kind_opts.tags or ())
    scheduled_at = opts.scheduled_at or kind_opts.scheduled_at
    state = JobState.SCHEDULED if scheduled_at is not None else JobState.AVAILABLE
    if opts.pending:  # River reads `pending` from the call site only
        state = JobState.PENDING
    unique: UniqueOpts | None = opts.unique
    if unique is None or unique.is_empty():
        unique = kind_opts.unique

    unique_key: bytes | None = None
    unique_states: int | None = None
    if unique is not None and not unique.is_empty():
        period_time = scheduled_at if scheduled_at is not None else now()
        unique_key = _unique.unique_key(
            kind=kind,
            encoded_args=encoded,
            by_args=unique.by_args,
            by_period=unique.by_period,
            by_queue=unique.by_queue,
            exclude_kind=unique.exclude_kind,
            queue=queue,
            period_time=period_time,
        )
        unique_states = _unique.unique_states_mask(unique.states)

    # positional, in JobInsertParams' field order
    return _make_params(
        encoded,
        kind,
        max_attempts,
        _encode_metadata(opts.metadata),  # River reads metadata from the call site only
        priority,
        queue,
        state,
        tuple(tags),
        scheduled_at.astimezone(dt.UTC) if scheduled_at is not None else None,
        None,
        unique_key,
        unique_states,
    )
