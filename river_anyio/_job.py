"""Job vocabulary: states, rows, insert options and results (pure data, no I/O)."""

from __future__ import annotations

import datetime as dt
import enum
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import attrs

from ._errors import ValidationError

__all__ = [
    "MAX_ATTEMPTS_DEFAULT",
    "PRIORITY_DEFAULT",
    "QUEUE_DEFAULT",
    "AttemptError",
    "InsertOpts",
    "InsertResult",
    "JobArgs",
    "JobRow",
    "JobState",
    "UndecodableJobRow",
    "UniqueOpts",
]

MAX_ATTEMPTS_DEFAULT = 25
PRIORITY_DEFAULT = 1
QUEUE_DEFAULT = "default"
#: The widest ``max_attempts`` River takes (Go's ``int``). SQLite stores it as given;
#: PostgreSQL's ``smallint`` column holds 32,767 at most, and its driver clamps to that on
#: insert, as River's does.
MAX_ATTEMPTS_LIMIT = 2**63 - 1

_QUEUE_RE = re.compile(r"^(?:[a-z0-9])+(?:[_|\-]?[a-z0-9]+)*$")
_QUEUE_MAX = 64
# \w in Go's RE2 is ASCII-only; Python's would accept any Unicode letter.
_KIND_RE = re.compile(r"\A[\w][\w\-\[\]<>/.·:+]+\Z", re.ASCII)
_KIND_MAX = 127
_TAG_RE = re.compile(r"\A\w[\w\-]+\w\Z", re.ASCII)
_TAG_MAX = 255


class JobState(enum.StrEnum):
    """A job's state, stored as River's ``river_job_state`` enum (or text on SQLite)."""

    AVAILABLE = "available"
    CANCELLED = "cancelled"
    COMPLETED = "completed"
    DISCARDED = "discarded"
    PENDING = "pending"
    RETRYABLE = "retryable"
    RUNNING = "running"
    SCHEDULED = "scheduled"


FINALIZED_STATES = frozenset({JobState.CANCELLED, JobState.COMPLETED, JobState.DISCARDED})


@attrs.frozen(kw_only=True)
class AttemptError:
    """One element of a job's ``errors``: what went wrong in one attempt.

    ``error`` is the error's text and ``trace`` a stack trace, as River records them: River Go
    writes ``err.Error()`` and a trace only for a panic; river_anyio writes ``str(exc)`` (the
    exception's class name when that is empty) and no trace (the traceback is in the log).
    ``at`` holds microseconds; ``at_nanosecond`` (0-999) the nanoseconds past them that River
    Go records, so the time can be written back or compared exactly.
    """

    at: dt.datetime
    attempt: int
    error: str
    trace: str = ""
    at_nanosecond: int = 0


@attrs.frozen(kw_only=True)
class JobRow:
    """A ``river_job`` row, every column typed.

    ``encoded_args`` is the args JSON as stored (PostgreSQL normalises key order and spacing);
    ``unique_states`` is the unique-state bitmask expanded into states.
    """

    id: int
    args: Mapping[str, Any] = attrs.field(eq=False, repr=False)
    encoded_args: bytes
    attempt: int
    attempted_at: dt.datetime | None
    attempted_by: tuple[str, ...]
    created_at: dt.datetime
    errors: tuple[AttemptError, ...]
    finalized_at: dt.datetime | None
    kind: str
    max_attempts: int
    metadata: Mapping[str, Any]
    priority: int
    queue: str
    scheduled_at: dt.datetime
    state: JobState
    tags: tuple[str, ...]
    unique_key: bytes | None
    unique_states: frozenset[JobState] | None

    @property
    def output(self) -> Any:
        """The output the worker recorded (``ctx.record_output``, River's ``RecordOutput``),
        decoded from the ``output`` metadata key; None when none was recorded."""
        return self.metadata.get("output") if isinstance(self.metadata, Mapping) else None


@attrs.frozen(kw_only=True)
class UndecodableJobRow(JobRow):
    """A row some of whose columns could not be decoded (a JSON column changed out of band,
    metadata that is not an object): those fields are left empty and ``decode_error`` says
    which and why. A client fails such a claimed job's attempt without working it, as River
    Go does; the undecodable values stay in the database as they are."""

    decode_error: str


@attrs.frozen(kw_only=True)
class InsertResult:
    """What an insert returns: the row, and whether an existing unique job was returned instead."""

    job: JobRow
    unique_skipped_as_duplicate: bool = False


# ---------------------------------------------------------------------------------------------
# validation helpers, shared by InsertOpts and the client


def validate_queue_name(value: object, field: str = "queue") -> str:
    """River's queue-name rule: lowercase letters and digits separated by ``_``, ``-`` (or ``|``)."""
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a str, not {type(value).__name__}", value)
    if not value:
        raise ValidationError(field, "queue name cannot be empty", value)
    if len(value) > _QUEUE_MAX:
        raise ValidationError(
            field, f"queue name cannot be longer than {_QUEUE_MAX} characters", value
        )
    if not _QUEUE_RE.match(value):
        raise ValidationError(
            field,
            "queue name is invalid, expected letters and numbers separated by underscores or "
            f"hyphens: {value!r}",
            value,
        )
    return value


def validate_kind(value: object, field: str = "kind") -> str:
    """River's job-kind rule: at least 2 characters of ``[\\w\\-\\[\\]<>/.·:+]``, word first."""
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a str, not {type(value).__name__}", value)
    if len(value) > _KIND_MAX:
        raise ValidationError(field, f"kind cannot be longer than {_KIND_MAX} characters", value)
    if not _KIND_RE.match(value):
        raise ValidationError(
            field,
            f"job kind {value!r} should match the pattern \\A[\\w][\\w\\-\\[\\]<>\\/.·:+]+\\z "
            "(at least 2 characters, starting with a letter, digit or underscore)",
            value,
        )
    return value


def _validate_tags(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValidationError("tags", "must be a sequence of strings (not a single string)", value)
    out = []
    for i, tag in enumerate(value):
        if not isinstance(tag, str):
            raise ValidationError(f"tags[{i}]", f"must be a str, not {type(tag).__name__}", tag)
        if len(tag) > _TAG_MAX:
            raise ValidationError(
                f"tags[{i}]", f"tag cannot be longer than {_TAG_MAX} characters", tag
            )
        if not _TAG_RE.match(tag):
            raise ValidationError(
                f"tags[{i}]",
                f"tag {tag!r} should match \\A[\\w][\\w\\-]+[\\w]\\z (at least 3 characters of "
                "letters, digits, '_' and '-', not starting or ending with '-')",
                tag,
            )
        out.append(tag)
    return tuple(out)


def _validate_metadata(value: object) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValidationError("metadata", "must be a JSON object (a mapping)", value)
    for key in value:
        if not isinstance(key, str):
            raise ValidationError("metadata", f"keys must be str, found {key!r}", value)
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError("metadata", f"must be JSON-encodable: {exc}", value) from None
    return value


def _validate_aware(field: str) -> Any:
    def check(_inst: object, _attr: object, value: dt.datetime | None) -> None:
        if value is None:
            return
        if not isinstance(value, dt.datetime):
            raise ValidationError(field, f"must be a datetime, not {type(value).__name__}", value)
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValidationError(
                field, "must be timezone-aware (naive datetimes are ambiguous)", value
            )

    return check


def _validate_int_range(field: str, lo: int, hi: int) -> Any:
    def check(_inst: object, _attr: object, value: int | None) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError(field, f"must be an int, not {type(value).__name__}", value)
        if not lo <= value <= hi:
            raise ValidationError(field, f"must be between {lo} and {hi}, got {value}", value)

    return check


def _optional_queue(_inst: object, _attr: object, value: str | None) -> None:
    if value is not None:
        validate_queue_name(value)


def _by_args_converter(value: object) -> bool | tuple[str, ...]:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValidationError(
            "unique.by_args", "must be a bool or a sequence of JSON field paths", value
        )
    paths = []
    for path in value:
        if not isinstance(path, str) or not path or any(not p for p in path.split(".")):
            raise ValidationError(
                "unique.by_args",
                f"field path {path!r} must be a non-empty dotted JSON path like 'a' or 'a.b'",
                value,
            )
        paths.append(path)
    if not paths:
        raise ValidationError(
            "unique.by_args", "an empty list of fields is not allowed; use True or False", value
        )
    return tuple(paths)


def _by_state_converter(value: object) -> frozenset[JobState] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence | frozenset | set):
        raise ValidationError("unique.by_state", "must be a collection of job states", value)
    states: set[JobState] = set()
    for s in value:
        try:
            states.add(JobState(s))
        except ValueError:
            raise ValidationError(
                "unique.by_state", f"UniqueOpts.ByState contains invalid state {s!r}", value
            ) from None
    required = {JobState.AVAILABLE, JobState.PENDING, JobState.RUNNING, JobState.SCHEDULED}
    missing = sorted(required - states)
    if states and missing:  # an empty collection means River's default states
        raise ValidationError(
            "unique.by_state",
            "UniqueOpts.ByState must contain all required states, missing: " + ", ".join(missing),
            value,
        )
    return frozenset(states)


def _by_period_validator(_inst: object, _attr: object, value: dt.timedelta | None) -> None:
    if value is None:
        return
    if not isinstance(value, dt.timedelta):
        raise ValidationError("unique.by_period", "must be a datetime.timedelta", value)
    if value < dt.timedelta(seconds=1):
        raise ValidationError(
            "unique.by_period", "UniqueOpts.ByPeriod should not be less than 1 second", value
        )


DEFAULT_UNIQUE_STATES: frozenset[JobState] = frozenset(
    {
        JobState.AVAILABLE,
        JobState.COMPLETED,
        JobState.PENDING,
        JobState.RETRYABLE,
        JobState.RUNNING,
        JobState.SCHEDULED,
    }
)


@attrs.frozen(kw_only=True)
class UniqueOpts:
    """How a job is unique, as River's ``UniqueOpts``.

    ``by_args`` is True for all top-level args fields, or a list of JSON field paths (dotted
    for nested objects), the equivalent of River Go's ``river:"unique"`` struct tags.
    """

    by_args: bool | tuple[str, ...] = attrs.field(default=False, converter=_by_args_converter)
    by_period: dt.timedelta | None = attrs.field(default=None, validator=_by_period_validator)
    by_queue: bool = False
    by_state: frozenset[JobState] | None = attrs.field(default=None, converter=_by_state_converter)
    exclude_kind: bool = False

    def __attrs_post_init__(self) -> None:
        if (
            self.exclude_kind
            and self.by_args is False
            and not self.by_queue
            and self.by_period is None
        ):
            raise ValidationError(
                "unique.exclude_kind",
                "UniqueOpts.ExcludeKind requires ByArgs, ByQueue, or ByPeriod",
                self.exclude_kind,
            )

    def is_empty(self) -> bool:
        """No uniqueness at all (then the args class's own unique options apply, if any)."""
        return (
            self.by_args is False
            and self.by_period is None
            and not self.by_queue
            and self.by_state is None
            and not self.exclude_kind
        )

    @property
    def states(self) -> frozenset[JobState]:
        """The states in which a duplicate blocks an insert (River's default when unset)."""
        return self.by_state if self.by_state else DEFAULT_UNIQUE_STATES


def _unique_validator(_inst: object, _attr: object, value: Any) -> None:
    if value is not None and not isinstance(value, UniqueOpts):
        raise ValidationError("unique", "must be a UniqueOpts", value)


@attrs.frozen(kw_only=True)
class InsertOpts:
    """Options for one insert. ``None`` means "take it from the next level": the args class's
    own insert options, then the client, then River's defaults.

    A ``max_attempts`` above 32,767 is stored as 32,767 on PostgreSQL (its column is a
    ``smallint``; River clamps the same way) and as given on SQLite.
    """

    max_attempts: int | None = attrs.field(
        default=None, validator=_validate_int_range("max_attempts", 1, MAX_ATTEMPTS_LIMIT)
    )
    priority: int | None = attrs.field(
        default=None, validator=_validate_int_range("priority", 1, 4)
    )
    queue: str | None = attrs.field(default=None, validator=_optional_queue)
    scheduled_at: dt.datetime | None = attrs.field(
        default=None, validator=_validate_aware("scheduled_at")
    )
    pending: bool = False
    tags: tuple[str, ...] | None = attrs.field(default=None, converter=_validate_tags)
    metadata: Mapping[str, Any] | None = attrs.field(default=None, converter=_validate_metadata)
    unique: UniqueOpts | None = attrs.field(default=None, validator=_unique_validator)


@runtime_checkable
class JobArgs(Protocol):
    """What an args class provides: a ``kind`` class attribute.

    Args classes are attrs classes; they may also define ``insert_opts`` (an
    :class:`InsertOpts`, or a method returning one) for per-kind defaults, and
    ``kind_aliases`` (a tuple of older kinds, River's ``KindAliases``) so that the worker
    registered for the class also works jobs stored under those kinds after a rename.
    """

    kind: ClassVar[str]
