"""Workers: what runs a job of each kind, and what a worker may return.

A worker is an async function ``async def work(ctx, job) -> None | Outcome`` or an object with
such a ``work`` method and optional ``timeout(job)`` and ``next_retry(job)``. Returning ``None``
completes the job; returning :func:`snooze`, :func:`discard` or :func:`cancel` does what they
say; raising records an error and retries per the retry policy.

Blocking or CPU-bound work can run off the event loop: ``run_in="thread"`` (a sync function in
a bounded thread pool; ``ctx.cancelled`` tells it to stop) or ``run_in="process"`` (a sync,
importable module-level function in a child process; it receives the args as the persisted JSON
and is killed if it ignores cancellation for longer than ``job_stuck_threshold``).
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import logging
import math
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

import attrs

from ._errors import ConfigError, NotFoundError, ValidationError
from ._insert import class_kind
from ._job import JobRow, JobState
from ._jobs_api import encode_output
from ._resumable import ResumableState
from ._retry import RetryPolicy
from ._timeutil import utc_now
from .drivers import JobCompletion

if TYPE_CHECKING:
    from ._client import Client

__all__ = [
    "UNSET",
    "CancelOutcome",
    "DiscardOutcome",
    "Job",
    "Outcome",
    "SnoozeOutcome",
    "WorkContext",
    "Worker",
    "Workers",
    "cancel",
    "discard",
    "snooze",
]

A = TypeVar("A")
A_co = TypeVar("A_co", covariant=True)
A_contra = TypeVar("A_contra", contravariant=True)
RunIn = Literal["loop", "thread", "process"]


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: "Not configured here": the next level's value applies.
UNSET: Any = _Unset()


# --- outcomes -----------------------------------------------------------------------------


@attrs.frozen
class SnoozeOutcome:
    duration: dt.timedelta


@attrs.frozen
class DiscardOutcome:
    reason: str


@attrs.frozen
class CancelOutcome:
    reason: str


Outcome = SnoozeOutcome | DiscardOutcome | CancelOutcome


def snooze(duration: dt.timedelta | float) -> SnoozeOutcome:
    """Run the job again after ``duration`` without using up an attempt (River's JobSnooze)."""
    if isinstance(duration, int | float) and not isinstance(duration, bool):
        if not math.isfinite(duration):
            raise ValueError("snooze duration must be finite")
        duration = dt.timedelta(seconds=duration)
    if not isinstance(duration, dt.timedelta):
        raise TypeError("snooze duration must be a timedelta or a number of seconds")
    if duration < dt.timedelta(0):
        raise ValueError("snooze duration cannot be negative")
    return SnoozeOutcome(duration)


def discard(reason: str) -> DiscardOutcome:
    """Finalize the job as ``discarded`` now, without further retries; the reason is recorded."""
    return DiscardOutcome(str(reason))


def cancel(reason: str) -> CancelOutcome:
    """Finalize the job as ``cancelled`` (River's JobCancel); the reason is recorded."""
    return CancelOutcome(str(reason))


# --- jobs and contexts --------------------------------------------------------------------


@attrs.frozen
class Job(Generic[A_co]):
    """A job being worked: its row and its decoded args."""

    row: JobRow
    args: A_co

    @property
    def id(self) -> int:
        return self.row.id

    @property
    def kind(self) -> str:
        return self.row.kind

    @property
    def attempt(self) -> int:
        return self.row.attempt

    @property
    def max_attempts(self) -> int:
        return self.row.max_attempts

    @property
    def queue(self) -> str:
        return self.row.queue

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self.row.metadata


_worker_logger = logging.getLogger("river_anyio.worker")


class WorkContext:
    """What a worker gets besides its job: the client, the deadline, a logger, cancellation."""

    __slots__ = (
        "_cancelled",
        "_completed_tx",
        "_logger",
        "_metadata_updates",
        "_output",
        "_resumable",
        "client",
        "deadline",
        "job_row",
    )

    def __init__(self, *, client: Client, job: JobRow, deadline: float | None) -> None:
        self.client = client
        self.job_row = job
        #: ``anyio.current_time()`` by which the job times out, if it has a timeout.
        self.deadline = deadline
        # created on first use: most jobs need neither (this is the per-job hot path)
        self._cancelled: threading.Event | None = None
        self._logger: logging.LoggerAdapter[logging.Logger] | None = None
        self._metadata_updates: dict[str, Any] | None = None
        self._output: bytes | None = None  # encoded, see record_output
        self._completed_tx = False
        self._resumable: ResumableState | None = None

    @property
    def cancelled(self) -> threading.Event:
        """Set when the job is cancelled (timeout, remote cancel, stop); for thread workers,
        which cannot be interrupted and should check it."""
        if self._cancelled is None:
            self._cancelled = threading.Event()
        return self._cancelled

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger (``river_anyio.worker``) whose records carry the job's fields
        (``river_job_id``, ``river_job_kind``, ``river_queue``, ``river_attempt``,
        ``river_client_id``)."""
        if self._logger is None:
            row = self.job_row
            self._logger = logging.LoggerAdapter(
                _worker_logger,
                {
                    "river_client_id": getattr(self.client, "id", None),
                    "river_queue": row.queue,
                    "river_job_id": row.id,
                    "river_job_kind": row.kind,
                    "river_attempt": row.attempt,
                },
            )
        return self._logger

    def set_metadata(self, key: str, value: Any) -> None:
        """Stage a metadata key, merged into the row when this attempt finishes.

        The value must be JSON-encodable (checked now, as River's MetadataSet marshals it).
        """
        if not isinstance(key, str) or key.startswith("river:"):
            raise ValueError("metadata keys must be str and may not start with 'river:'")
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"metadata value for {key!r} is not JSON-encodable: {exc}") from None
        if self._metadata_updates is None:
            self._metadata_updates = {}
        self._metadata_updates[key] = value

    # --- output, and completion in the worker's own transaction -------------------------------

    def record_output(self, value: Any) -> None:
        """Record the job's output (River's RecordOutput): any JSON value, encoded now, at
        most 32 MiB encoded (:class:`~river_anyio.ValidationError` otherwise). Stored under the
        ``output`` metadata key when the attempt finishes, whatever its outcome; the last call
        wins."""
        self._output = encode_output(value)

    def metadata_updates_json(self, extra: Mapping[str, Any] | None = None) -> bytes | None:
        """The staged metadata updates (and ``extra``, and the output) as one JSON object, or
        None when there are none."""
        own = self._metadata_updates or {}
        updates = {**own, **extra} if extra else own
        if not updates and self._output is None:
            return None
        encoded = json.dumps(updates, separators=(",", ":"), allow_nan=False).encode()
        if self._output is None:
            return encoded
        if "output" in updates:
            updates = {k: v for k, v in updates.items() if k != "output"}
            encoded = json.dumps(updates, separators=(",", ":"), allow_nan=False).encode()
        # spliced in, so a large output is not encoded again
        return encoded[:-1] + (b',"output":' if updates else b'"output":') + self._output + b"}"

    async def complete_tx(self, tx: object) -> JobRow:
        """Mark this job ``completed`` inside the caller's transaction (River's JobCompleteTx),
        so the job's effects and its completion commit, or roll back, together.

        The metadata staged so far (and the output) is written with it. Once that commits,
        the attempt's own completion changes nothing but still reports ``job_completed``.
        Returns the row after the update: if this client's attempt no longer owns the job
        (it was rescued and claimed again) nothing changes and the row says so.
        :class:`~river_anyio.NotFoundError` if the job is gone.
        """
        row = self.job_row
        if row.state is not JobState.RUNNING:
            raise ValidationError("job", "job must be running", row.state)
        completion = JobCompletion(
            id=row.id,
            attempt=row.attempt,
            state=JobState.COMPLETED,
            finalized_at=utc_now(),
            metadata_updates=self.metadata_updates_json(),
        )
        ex = self.client.driver.executor_for(tx)
        results = await ex.job_set_state_if_running_many([completion], client_id=self.client.id)
        if not results or results[0].job is None:
            raise NotFoundError(f"job {row.id} not found")
        self._completed_tx = True
        return results[0].job

    # --- resumable steps (River's ResumableStep and friends; see river_anyio._resumable) ----

    def _resumable_state(self) -> ResumableState:
        if self._resumable is None:
            self._resumable = ResumableState(self.job_row.metadata)
        return self._resumable

    async def step(self, name: str, fn: Callable[[], Awaitable[Any]]) -> None:
        """Run ``await fn()`` as the resumable step ``name``, unless an earlier attempt
        completed it (River's ResumableStep). Names are unique within an attempt; steps do not
        nest. The step's exception propagates, and no further step runs."""
        await self._resumable_state().step(name, fn)

    async def step_cursor(self, name: str, fn: Callable[[Any], Awaitable[Any]]) -> None:
        """Run ``await fn(cursor)`` as the resumable step ``name`` (River's
        ResumableStepCursor): ``cursor`` is what an earlier attempt saved with
        :meth:`set_cursor` in this step (None at first), so a partly done step resumes."""
        await self._resumable_state().step_cursor(name, fn)

    def set_cursor(self, value: Any) -> None:
        """Save the running step's cursor (any JSON value), recorded if the attempt fails
        (River's ResumableSetCursor)."""
        self._resumable_state().set_cursor(value)

    async def set_step_tx(self, tx: object) -> JobRow:
        """Record the running step as done inside the caller's transaction, now (River's
        ResumableSetStepTx): committed with the step's own writes."""
        return await self._checkpoint(tx, None, with_cursor=False)

    async def set_step_cursor_tx(self, tx: object, cursor: Any) -> JobRow:
        """Record the running step with ``cursor`` inside the caller's transaction, now
        (River's ResumableSetStepCursorTx): a later attempt resumes the step from it."""
        return await self._checkpoint(tx, cursor, with_cursor=True)

    async def _checkpoint(self, tx: object, cursor: Any, *, with_cursor: bool) -> JobRow:
        if self.job_row.state is not JobState.RUNNING:
            raise ValidationError("job", "job must be running", self.job_row.state)
        state = self._resumable_state()
        updates = state.checkpoint_updates(cursor, with_cursor=with_cursor)
        ex = self.client.driver.executor_for(tx)
        row = await ex.job_update_metadata(self.job_row.id, updates)
        if row is None:
            raise NotFoundError(f"job {self.job_row.id} not found")
        state.checkpointed(updates)
        return row


@runtime_checkable
class Worker(Protocol[A_contra]):
    """A worker object. ``timeout`` and ``next_retry`` are optional extras."""

    async def work(self, ctx: WorkContext, job: Job[A_contra]) -> Outcome | None: ...


WorkFunc = Callable[[WorkContext, "Job[Any]"], Awaitable["Outcome | None"]]


@attrs.frozen(kw_only=True)
class Registration:
    """One registered kind."""

    kind: str
    args_cls: type
    work: Callable[..., Any]
    worker: object | None
    run_in: RunIn
    timeout: float | _Unset | None
    #: the kind's own retry policy (None: the client's)
    retry_policy: RetryPolicy | None = None
    #: the args class's ``kind_aliases``: older kinds this worker also works
    kind_aliases: tuple[str, ...] = ()

    def job_timeout(self, job: Job[Any]) -> float | _Unset | None:
        """The worker's own timeout for this job: seconds, None for none, UNSET to inherit."""
        fn = getattr(self.worker, "timeout", None)
        if fn is not None:
            value: object = fn(job)
            if isinstance(value, _Unset) or value is None:
                return value
            if isinstance(value, dt.timedelta):
                return value.total_seconds()
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
            raise TypeError(f"timeout() of {self.kind!r} returned {value!r}")
        return self.timeout

    def next_retry(self, job: Job[Any]) -> dt.datetime | None:
        fn = getattr(self.worker, "next_retry", None)
        return fn(job) if fn is not None else None


def _check_timeout(value: object, field: str) -> float | _Unset | None:
    if isinstance(value, _Unset) or value is None:
        return value
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(field, "must be a positive number of seconds, a timedelta or None", value)
    if value <= 0:
        raise ConfigError(field, "must be positive (use None for no timeout)", value)
    return float(value)


def _kind_aliases(args_cls: type, kind: str) -> tuple[str, ...]:
    """The args class's ``kind_aliases`` (River's ``KindAliases``), checked: strings, none of
    them the kind itself or listed twice."""
    raw = getattr(args_cls, "kind_aliases", ())
    name = args_cls.__name__
    if isinstance(raw, str) or not isinstance(raw, Iterable):
        raise ConfigError(
            "workers", f"{name}.kind_aliases must be a tuple of kinds (str), not {raw!r}", kind
        )
    aliases = tuple(raw)
    seen = {kind}
    for alias in aliases:
        if not isinstance(alias, str) or not alias:
            raise ConfigError(
                "workers", f"{name}.kind_aliases must hold non-empty strings, not {alias!r}", kind
            )
        if alias in seen:
            raise ConfigError(
                "workers", f"{name} lists kind {alias!r} more than once (kind, kind_aliases)", kind
            )
        seen.add(alias)
    return aliases


class Workers:
    """The registry of workers, by args class (and so by kind).

    ``workers.add(Args, work)`` or, as a decorator, ``@workers.register(Args)``.

    An args class may list older kinds in a ``kind_aliases`` class attribute (River's
    ``KindAliases``): its worker then also works jobs stored under those kinds, so a kind can
    be renamed while jobs inserted under the old name are still waiting. Inserts always use
    ``kind``. Every kind and alias belongs to one registration.
    """

    def __init__(self) -> None:
        #: every kind and alias -> its registration
        self._by_kind: dict[str, Registration] = {}
        #: the registrations, in the order they were added
        self._registrations: list[Registration] = []

    def add(
        self,
        args_cls: type,
        work: Callable[..., Any] | object,
        *,
        run_in: RunIn = "loop",
        timeout: float | dt.timedelta | None = UNSET,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        """Register the worker for ``args_cls``'s kind, and for each of its ``kind_aliases``.
        A kind or alias may be registered once (:class:`ConfigError` naming both claims).

        ``timeout`` overrides the client's ``job_timeout`` for this kind (None: no timeout).
        ``retry_policy`` (an object with ``next_retry(job_row, now) -> datetime``) overrides
        the client's ``retry_policy`` for this kind, on the attempts this client works and on
        the ones its rescuer retries; a worker's own ``next_retry(job)`` still comes first.
        """
        if not isinstance(args_cls, type) or not attrs.has(args_cls):
            raise ConfigError("workers", f"{args_cls!r} is not an attrs class (job args class)")
        kind = getattr(args_cls, "kind", None)
        if not isinstance(kind, str):
            raise ConfigError(
                "workers", f"{args_cls.__name__} needs a `kind` class attribute (str)"
            )
        try:
            class_kind(args_cls)
        except ValidationError as exc:
            raise ConfigError("workers", exc.rule, kind) from None
        aliases = _kind_aliases(args_cls, kind)
        for claimed in (kind, *aliases):
            existing = self._by_kind.get(claimed)
            if existing is not None:
                raise ConfigError(
                    "workers", _already_registered(claimed, args_cls, existing), claimed
                )
        if run_in not in ("loop", "thread", "process"):
            raise ConfigError("run_in", "must be 'loop', 'thread' or 'process'", run_in)
        if retry_policy is not None and not callable(getattr(retry_policy, "next_retry", None)):
            raise ConfigError(
                f"workers[{kind}].retry_policy",
                "must be an object with a next_retry(job, now) method",
                retry_policy,
            )
        worker: object | None = None
        if callable(work) and not hasattr(work, "work"):
            fn = work
        elif hasattr(work, "work") and callable(work.work):
            worker = work
            fn = work.work
        else:
            raise ConfigError(
                "workers", f"worker for {kind!r} must be a function or an object with work()"
            )
        is_async = inspect.iscoroutinefunction(fn)
        if run_in == "loop" and not is_async:
            raise ConfigError(
                "workers",
                f"worker for {kind!r} must be an async function (or use run_in='thread' or "
                "'process' for blocking code)",
            )
        if run_in != "loop" and is_async:
            raise ConfigError(
                "workers", f"run_in={run_in!r} needs a plain (sync) function for {kind!r}"
            )
        if run_in == "process" and (
            getattr(fn, "__qualname__", "").count("<locals>") or not hasattr(fn, "__module__")
        ):
            raise ConfigError(
                "workers",
                f"run_in='process' needs an importable module-level function for {kind!r}",
            )
        registration = Registration(
            kind=kind,
            args_cls=args_cls,
            work=fn,
            kind_aliases=aliases,
            worker=worker,
            run_in=run_in,
            timeout=_check_timeout(timeout, f"workers[{kind}].timeout"),
            retry_policy=retry_policy,
        )
        self._registrations.append(registration)
        for claimed in (kind, *aliases):
            self._by_kind[claimed] = registration

    def register(
        self,
        args_cls: type,
        *,
        run_in: RunIn = "loop",
        timeout: float | None = UNSET,
        retry_policy: RetryPolicy | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of :meth:`add`."""

        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add(args_cls, fn, run_in=run_in, timeout=timeout, retry_policy=retry_policy)
            return fn

        return deco

    def get(self, kind: str) -> Registration | None:
        """The registration that works jobs of ``kind`` (its kind or one of its aliases)."""
        return self._by_kind.get(kind)

    def kinds(self) -> list[str]:
        """Every kind a job may have for a worker here, aliases included, sorted (what
        ``fetch_only_known_kinds`` claims)."""
        return sorted(self._by_kind)

    def __len__(self) -> int:
        """The number of registrations (an alias is not one of its own)."""
        return len(self._registrations)

    def __iter__(self) -> Iterator[Registration]:
        return iter(self._registrations)

    def __contains__(self, kind: object) -> bool:
        """Whether a job of ``kind`` has a worker here (by its kind or an alias)."""
        return kind in self._by_kind


def _already_registered(kind: str, args_cls: type, existing: Registration) -> str:
    """Why ``kind`` of ``args_cls`` cannot be registered: ``existing`` claims it."""
    if kind == getattr(args_cls, "kind", None) and kind == existing.kind:
        return f"worker for kind {kind!r} is already registered"  # River's words
    new = "" if kind == getattr(args_cls, "kind", None) else f" ({args_cls.__name__}.kind_aliases)"
    old = existing.args_cls.__name__
    by = (
        f"as the kind of {old}"
        if kind == existing.kind
        else f"as an alias of {existing.kind!r} ({old}.kind_aliases)"
    )
    return f"worker for kind {kind!r}{new} is already registered {by}"
