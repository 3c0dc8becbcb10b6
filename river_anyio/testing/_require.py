"""Assertions on inserted jobs: River's ``rivertest.RequireInserted`` family.

Each reads the jobs of the asked-for kinds (ordered by id) through a client, a driver, or (the
``_tx`` variants) an open transaction, so jobs inserted but not yet committed are seen. A
failed expectation raises :class:`RiverAssertionError` with River's message.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, TypeVar

import attrs

from .._client import Client
from .._convert import structure_args
from .._errors import ValidationError
from .._insert import class_kind
from .._job import JobRow, JobState
from .._runtime._supervisor import ClientRun
from .._timeutil import format_rfc3339nano
from .._work import Job
from ..drivers import Driver, Executor

__all__ = [
    "ExpectedJob",
    "RiverAssertionError",
    "require_inserted",
    "require_inserted_tx",
    "require_many_inserted",
    "require_many_inserted_tx",
    "require_not_inserted",
    "require_not_inserted_tx",
]

A = TypeVar("A")

#: What the assertions read through: a client, a running client, or a driver.
JobSource = Client | ClientRun | Driver

_PAGE = 1000


class RiverAssertionError(AssertionError):
    """An inserted-jobs expectation did not hold. The message is River's, after a
    ``River assertion failure:`` header."""

    def __init__(self, message: str) -> None:
        self.detail = message
        super().__init__(f"River assertion failure:\n    {message}")


def _args_kind(args_cls: object, field: str = "args_cls") -> str:
    if not isinstance(args_cls, type):
        raise TypeError(
            f"{field}: pass the job args class ({type(args_cls).__name__}), not an instance; "
            "as in River only the kind is matched: assert on the returned job's args"
        )
    try:
        return class_kind(args_cls, field)
    except ValidationError as exc:
        raise TypeError(str(exc)) from None


def _utc(value: dt.datetime, field: str) -> dt.datetime:
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise TypeError(f"{field} must be a timezone-aware datetime, got {value!r}")
    return value.astimezone(dt.UTC)


def _fmt_time(value: dt.datetime) -> str:
    return format_rfc3339nano(value.astimezone(dt.UTC))


@attrs.frozen(kw_only=True)
class ExpectedJob:
    """One job expected by :func:`require_many_inserted`: its args class and, optionally, the
    properties it must have (``None``: not checked)."""

    args_cls: type
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    state: JobState | str | None = None
    scheduled_at: dt.datetime | None = None
    tags: Sequence[str] | None = None

    def __attrs_post_init__(self) -> None:
        _args_kind(self.args_cls)
        if self.state is not None:
            JobState(self.state)  # ValueError for a state that does not exist
        if self.scheduled_at is not None:
            _utc(self.scheduled_at, "scheduled_at")
        if isinstance(self.tags, str):
            raise TypeError("tags must be a sequence of strings, not a str")

    @property
    def kind(self) -> str:
        return _args_kind(self.args_cls)

    def mismatches(self, row: JobRow, *, excluded: bool) -> list[str] | None:
        """River's comparison. ``excluded=False`` (require_inserted): the properties that
        differ. ``excluded=True`` (require_not_inserted): ``None`` as soon as one property
        differs (the row is not a match), else every property that matched."""
        checks: list[tuple[str, Any, Any, str, str]] = []
        if self.max_attempts is not None:
            checks.append(("max attempts", row.max_attempts, self.max_attempts, "%s", "%s"))
        if self.priority is not None:
            checks.append(("priority", row.priority, self.priority, "%s", "%s"))
        if self.queue is not None:
            checks.append(("queue", row.queue, self.queue, "'%s'", "'%s'"))
        if self.scheduled_at is not None:
            actual = row.scheduled_at.astimezone(dt.UTC)
            expected = _utc(self.scheduled_at, "scheduled_at")
            checks.append(("scheduled at", _fmt_time(actual), _fmt_time(expected), "%s", "%s"))
        if self.state is not None:
            checks.append(("state", str(row.state), str(JobState(self.state)), "'%s'", "'%s'"))
        if self.tags is not None:
            checks.append(("tags", list(row.tags), list(self.tags), "%s", "%s"))
        out: list[str] = []
        for name, actual_value, expected_value, afmt, efmt in checks:
            equal = actual_value == expected_value
            if excluded:
                if not equal:
                    return None  # one differing property: not a match
                out.append(f"{name} equal to excluded {efmt % (expected_value,)}")
            elif not equal:
                out.append(
                    f"{name} {afmt % (actual_value,)} not equal to expected "
                    f"{efmt % (expected_value,)}"
                )
        return out

    @property
    def has_properties(self) -> bool:
        return any(
            v is not None
            for v in (
                self.queue,
                self.priority,
                self.max_attempts,
                self.state,
                self.scheduled_at,
                self.tags,
            )
        )


def _driver(source: object) -> Driver:
    if isinstance(source, ClientRun):
        return source.client.driver
    if isinstance(source, Client):
        return source.driver
    if callable(getattr(source, "executor", None)) and hasattr(source, "executor_for"):
        return source  # type: ignore[return-value]
    raise TypeError(
        f"expected a Client, ClientRun or driver to read jobs through, not {type(source).__name__}"
    )


def _executor(source: object) -> Executor:
    return _driver(source).executor()


def _tx_executor(source: object, tx: object) -> Executor:
    return _driver(source).executor_for(tx)


async def _rows_of_kinds(ex: Executor, kinds: Sequence[str]) -> list[JobRow]:
    rows: list[JobRow] = []
    after: int | None = None
    while True:
        page = await ex.job_list(kinds=sorted(set(kinds)), after_id=after, limit=_PAGE)
        rows.extend(page)
        if len(page) < _PAGE:
            return rows
        after = page[-1].id


def _fail_mismatch(row: JobRow, failures: list[str], index: int | None) -> RiverAssertionError:
    position = f" (expected job slice index {index})" if index is not None else ""
    return RiverAssertionError(f"Job with kind '{row.kind}'{position} {', '.join(failures)}")


async def _require_inserted(ex: Executor, expected: ExpectedJob) -> Job[Any]:
    kind = expected.kind
    rows = await _rows_of_kinds(ex, [kind])
    if not rows:
        raise RiverAssertionError(f"No jobs found with kind: {kind}")
    if len(rows) > 1:
        raise RiverAssertionError(
            f"More than one job found with kind: {kind} "
            "(you might want require_many_inserted instead)"
        )
    row = rows[0]
    try:
        args: Any = structure_args(row.args, expected.args_cls)
    except Exception as exc:
        raise RiverAssertionError(
            f"Internal failure: error decoding job args of kind {kind}: {exc}"
        ) from exc
    failures = expected.mismatches(row, excluded=False)
    if failures:
        raise _fail_mismatch(row, failures, None)
    return Job(row, args)


async def _require_not_inserted(ex: Executor, expected: ExpectedJob) -> None:
    kind = expected.kind
    rows = await _rows_of_kinds(ex, [kind])
    if not rows:
        return
    if not expected.has_properties:
        raise RiverAssertionError(
            f"{len(rows)} jobs found with kind, but expected to find none: {kind}"
        )
    for row in rows:
        matched = expected.mismatches(row, excluded=True)
        if matched is not None:
            raise _fail_mismatch(row, matched, None)


def _expected_list(expected: object) -> list[ExpectedJob]:
    if isinstance(expected, str | bytes) or not isinstance(expected, Sequence):
        raise TypeError("expected must be a sequence of ExpectedJob or args classes")
    return [e if isinstance(e, ExpectedJob) else ExpectedJob(args_cls=e) for e in expected]


async def _require_many_inserted(
    ex: Executor, expected: Sequence[ExpectedJob | type]
) -> list[JobRow]:
    wanted = _expected_list(expected)
    expected_kinds = [e.kind for e in wanted]
    rows = await _rows_of_kinds(ex, expected_kinds) if wanted else []
    actual_kinds = [r.kind for r in rows]
    if actual_kinds != expected_kinds:
        raise RiverAssertionError(
            "Inserted jobs didn't match expectation; "
            f"expected: {expected_kinds}, actual: {actual_kinds}"
        )
    for i, (row, exp) in enumerate(zip(rows, wanted, strict=True)):
        failures = exp.mismatches(row, excluded=False)
        if failures:
            raise _fail_mismatch(row, failures, i)
    return rows


# --- public functions ---------------------------------------------------------------------------


async def require_inserted(
    source: JobSource,
    args_cls: type[A],
    *,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    state: JobState | str | None = None,
    scheduled_at: dt.datetime | None = None,
    tags: Sequence[str] | None = None,
) -> Job[A]:
    """Exactly one job of ``args_cls``'s kind exists (and has the given properties); returns
    it with its args decoded. ``None`` options are not checked; ``tags=()`` checks for no
    tags. ``scheduled_at`` compares to the microsecond."""
    expected = ExpectedJob(
        args_cls=args_cls, queue=queue, priority=priority, max_attempts=max_attempts,
        state=state, scheduled_at=scheduled_at, tags=tags,
    )  # fmt: skip
    return await _require_inserted(_executor(source), expected)


async def require_inserted_tx(
    source: JobSource,
    tx: object,
    args_cls: type[A],
    *,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    state: JobState | str | None = None,
    scheduled_at: dt.datetime | None = None,
    tags: Sequence[str] | None = None,
) -> Job[A]:
    """:func:`require_inserted` read through ``tx`` (``client.transaction()``'s executor or
    your own connection), so jobs inserted in that uncommitted transaction are seen."""
    expected = ExpectedJob(
        args_cls=args_cls, queue=queue, priority=priority, max_attempts=max_attempts,
        state=state, scheduled_at=scheduled_at, tags=tags,
    )  # fmt: skip
    return await _require_inserted(_tx_executor(source, tx), expected)


async def require_not_inserted(
    source: JobSource,
    args_cls: type,
    *,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    state: JobState | str | None = None,
    scheduled_at: dt.datetime | None = None,
    tags: Sequence[str] | None = None,
) -> None:
    """No job of ``args_cls``'s kind exists; with properties given, no job of the kind has
    *all* of them (a job differing in any one of them does not count)."""
    expected = ExpectedJob(
        args_cls=args_cls, queue=queue, priority=priority, max_attempts=max_attempts,
        state=state, scheduled_at=scheduled_at, tags=tags,
    )  # fmt: skip
    await _require_not_inserted(_executor(source), expected)


async def require_not_inserted_tx(
    source: JobSource,
    tx: object,
    args_cls: type,
    *,
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    state: JobState | str | None = None,
    scheduled_at: dt.datetime | None = None,
    tags: Sequence[str] | None = None,
) -> None:
    """:func:`require_not_inserted` read through an open transaction."""
    expected = ExpectedJob(
        args_cls=args_cls, queue=queue, priority=priority, max_attempts=max_attempts,
        state=state, scheduled_at=scheduled_at, tags=tags,
    )  # fmt: skip
    await _require_not_inserted(_tx_executor(source, tx), expected)


async def require_many_inserted(
    source: JobSource, expected: Sequence[ExpectedJob | type]
) -> list[JobRow]:
    """The jobs of the mentioned kinds, in id order, are exactly ``expected`` (a kind inserted
    twice must be listed twice), each with its given properties; returns their rows."""
    return await _require_many_inserted(_executor(source), expected)


async def require_many_inserted_tx(
    source: JobSource, tx: object, expected: Sequence[ExpectedJob | type]
) -> list[JobRow]:
    """:func:`require_many_inserted` read through an open transaction."""
    return await _require_many_inserted(_tx_executor(source, tx), expected)
