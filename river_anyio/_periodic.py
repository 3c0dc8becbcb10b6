"""Periodic jobs: schedules, the job definition, and the client's set of them.

As in River, only the elected leader inserts periodic jobs, and it keeps their next run times
in memory only: every leadership term starts each schedule afresh from "now". The set of jobs
lives on the client (``run.client.periodic_jobs``) and can change while it runs; a change
matters only on the leader, so make the same change on every client that can be elected.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

import attrs

from ._cron import CronSchedule
from ._errors import ConfigError, ValidationError
from ._job import _KIND_RE, InsertOpts

__all__ = [
    "IntervalSchedule",
    "PeriodicJob",
    "PeriodicJobHandle",
    "PeriodicJobs",
    "PeriodicJobsStartParams",
    "PeriodicSchedule",
    "every",
]

#: River's limit on a periodic job ID, in UTF-8 bytes (it must be shorter than this).
ID_MAX_BYTES = 128


@runtime_checkable
class PeriodicSchedule(Protocol):
    """When a periodic job runs: ``next(after)`` is its first run strictly after ``after``
    (timezone-aware), or None for never. River's ``PeriodicSchedule``."""

    def next(self, after: dt.datetime) -> dt.datetime | None: ...


def _positive_interval(value: object) -> dt.timedelta:
    if isinstance(value, dt.timedelta):
        interval = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ConfigError("interval", "must be finite", value)
        interval = dt.timedelta(seconds=value)
    else:
        raise ConfigError(
            "interval", f"must be a timedelta or a number of seconds, not {type(value).__name__}"
        )
    if interval <= dt.timedelta(0):
        raise ConfigError("interval", "must be greater than zero", value)
    return interval


@attrs.frozen
class IntervalSchedule:
    """Runs every ``interval``, measured from the previous planned run (River's
    ``PeriodicInterval``). Made by :func:`every`."""

    interval: dt.timedelta = attrs.field(converter=_positive_interval)

    def next(self, after: dt.datetime) -> dt.datetime:
        if not isinstance(after, dt.datetime) or after.utcoffset() is None:
            raise ValidationError("after", "must be a timezone-aware datetime", after)
        # absolute time: aware arithmetic in Python is wall-clock arithmetic
        return (after.astimezone(dt.UTC) + self.interval).astimezone(after.tzinfo)


def every(interval: dt.timedelta | float) -> IntervalSchedule:
    """A fixed interval (a timedelta or seconds), such as ``every(dt.timedelta(minutes=15))``."""
    return IntervalSchedule(interval)


def _to_schedule(value: object) -> PeriodicSchedule:
    if isinstance(value, str):
        return CronSchedule(value)
    if isinstance(value, dt.timedelta):
        return IntervalSchedule(value)
    if isinstance(value, PeriodicSchedule):
        return value
    raise ConfigError(
        "schedule",
        "must be a cron expression, a timedelta, or an object with a next(after) method, "
        f"not {type(value).__name__}",
        value,
    )


def validate_periodic_id(value: object, field: str = "id") -> str | None:
    """River's rule for periodic job IDs: shorter than 128 bytes, matching the kind pattern."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(field, f"must be a str or None, not {type(value).__name__}", value)
    if not value:
        raise ConfigError(field, "must not be empty (use None for a job without an ID)", value)
    if len(value.encode()) >= ID_MAX_BYTES:
        raise ConfigError(field, f"PeriodicJob.ID must be less than {ID_MAX_BYTES} characters")
    if not _KIND_RE.match(value):
        raise ConfigError(
            field,
            f"PeriodicJob.ID {value!r} should match the pattern \\A[\\w][\\w\\-\\[\\]<>\\/.·:+]+\\z",
            value,
        )
    return value


def _check_id(_inst: object, _attr: object, value: Any) -> None:
    validate_periodic_id(value)


def _check_callable(_inst: object, _attr: object, value: Any) -> None:
    if not callable(value):
        raise ConfigError("make_args", "must be callable (it builds each run's job args)", value)


def _check_opts(_inst: object, _attr: object, value: Any) -> None:
    if value is not None and not isinstance(value, InsertOpts):
        raise ConfigError("opts", f"must be an InsertOpts or None, not {type(value).__name__}")


def _check_bool(_inst: object, attr: attrs.Attribute[bool], value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(attr.name, "must be a bool", value)


@attrs.frozen
class PeriodicJob:
    """A job inserted on a schedule by the leader (River's ``PeriodicJob``).

    ``schedule`` is a cron expression (see :func:`cron`), a timedelta, or any
    :class:`PeriodicSchedule`. ``make_args`` is called at each run, without arguments, and
    returns the job args, or ``(args, InsertOpts)`` (those options replace ``opts`` for that
    run), or None to skip the run. It must not block; if it raises, that run is skipped and
    logged. ``id`` (optional, unique per client) lets the job be removed by ID and is written
    to each row's metadata as ``river:periodic_job_id``; every row also gets
    ``"periodic": true``. ``run_on_start`` inserts one job as soon as a leadership term
    starts (or when the job is added to a running leader), then follows the schedule.
    """

    schedule: PeriodicSchedule = attrs.field(converter=_to_schedule)
    make_args: Callable[[], object] = attrs.field(validator=_check_callable)
    opts: InsertOpts | None = attrs.field(default=None, kw_only=True, validator=_check_opts)
    id: str | None = attrs.field(default=None, kw_only=True, validator=_check_id)
    run_on_start: bool = attrs.field(default=False, kw_only=True, validator=_check_bool)


@attrs.frozen(order=True)
class PeriodicJobHandle:
    """Identifies one added periodic job (River's ``PeriodicJobHandle``); never reused."""

    value: int


@attrs.frozen
class PeriodicJobsStartParams:
    """What a hook's ``periodic_jobs_start(params)`` is given each time the client's periodic
    job enqueuer starts, that is each time the client is elected leader (River's
    ``HookPeriodicJobsStartParams``; River's durable jobs are not part of open-source River).
    """

    #: The client whose enqueuer starts.
    client_id: str
    #: The periodic jobs it starts with (``run_on_start`` ones are inserted after the hooks).
    jobs: tuple[PeriodicJob, ...]


class PeriodicJobs:
    """The periodic jobs of a client (``run.client.periodic_jobs``), River's
    ``PeriodicJobBundle``.

    Changes take effect at once on a leader (a job with ``run_on_start`` added to a leader is
    inserted immediately); on other clients they are kept for when they are elected. Use from
    the event loop the client runs on.
    """

    def __init__(self, jobs: Iterable[PeriodicJob] = (), *, never_leader: bool = False) -> None:
        #: A client with ``leader_election_disabled=True`` never enqueues, so it takes none.
        self._never_leader = never_leader
        self._jobs: dict[PeriodicJobHandle, PeriodicJob] = {}
        self._ids: dict[str, PeriodicJobHandle] = {}
        self._next_handle = 0
        self._listeners: list[Callable[[], None]] = []
        self.add_many(list(jobs))

    def add(self, job: PeriodicJob) -> PeriodicJobHandle:
        """Add a job; raises :class:`ConfigError` if its ID is already registered."""
        return self.add_many([job])[0]

    def add_many(self, jobs: Iterable[PeriodicJob]) -> list[PeriodicJobHandle]:
        """Add several jobs, all or none (a duplicate ID rejects the whole batch)."""
        batch = list(jobs)
        if batch and self._never_leader:
            raise ConfigError(
                "periodic_jobs",
                "a client with leader_election_disabled=True never leads, so it never inserts "
                "periodic jobs; add them to a client that can be elected",
            )
        seen: set[str] = set()
        for i, job in enumerate(batch):
            if not isinstance(job, PeriodicJob):
                raise ConfigError(
                    f"periodic_jobs[{i}]", f"must be a PeriodicJob, not {type(job).__name__}"
                )
            if job.id is not None:
                if job.id in self._ids or job.id in seen:
                    raise ConfigError(
                        f"periodic_jobs[{i}].id",
                        f"periodic job with ID already registered: {job.id}",
                        job.id,
                    )
                seen.add(job.id)
        handles = []
        for job in batch:
            handle = PeriodicJobHandle(self._next_handle)
            self._next_handle += 1
            self._jobs[handle] = job
            if job.id is not None:
                self._ids[job.id] = handle
            handles.append(handle)
        if handles:
            self._changed()
        return handles

    def remove(self, handle_or_id: PeriodicJobHandle | str) -> bool:
        """Remove a job by handle or ID, cancelling its future runs; False if it was not here."""
        if isinstance(handle_or_id, str):
            handle = self._ids.get(handle_or_id)
        elif isinstance(handle_or_id, PeriodicJobHandle):
            handle = handle_or_id
        else:
            raise ValidationError(
                "handle_or_id", "must be a PeriodicJobHandle or a periodic job ID", handle_or_id
            )
        job = self._jobs.pop(handle, None) if handle is not None else None
        if job is None:
            return False
        if job.id is not None:
            self._ids.pop(job.id, None)
        self._changed()
        return True

    def remove_many(self, handles_or_ids: Iterable[PeriodicJobHandle | str]) -> None:
        for item in list(handles_or_ids):
            self.remove(item)

    def remove_by_id(self, id: str) -> bool:
        """River's ``RemoveByID``: the same as ``remove(id)``."""
        if not isinstance(id, str):
            raise ValidationError("id", "must be a str", id)
        return self.remove(id)

    def remove_many_by_id(self, ids: Iterable[str]) -> None:
        for id in list(ids):
            self.remove_by_id(id)

    def clear(self) -> None:
        """Remove every job (handles are still never reused)."""
        self._jobs.clear()
        self._ids.clear()
        self._changed()

    def get(self, handle_or_id: PeriodicJobHandle | str) -> PeriodicJob | None:
        if isinstance(handle_or_id, str):
            handle = self._ids.get(handle_or_id)
            return self._jobs.get(handle) if handle is not None else None
        return self._jobs.get(handle_or_id)

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[PeriodicJobHandle]:
        return iter(list(self._jobs))

    def __contains__(self, handle_or_id: object) -> bool:
        if isinstance(handle_or_id, str):
            return handle_or_id in self._ids
        return handle_or_id in self._jobs

    def __repr__(self) -> str:
        return f"<PeriodicJobs {len(self._jobs)} jobs>"

    # --- for the enqueuer ---------------------------------------------------------------

    def _items(self) -> list[tuple[PeriodicJobHandle, PeriodicJob]]:
        return sorted(self._jobs.items())

    def _subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` after every change; returns the unsubscribe function."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()
