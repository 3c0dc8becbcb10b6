"""Client and queue configuration, validated when constructed (every rule a specific error)."""

from __future__ import annotations

import datetime as dt
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ._errors import ConfigError, ValidationError
from ._job import MAX_ATTEMPTS_DEFAULT, validate_queue_name
from ._periodic import PeriodicJob, PeriodicJobs
from ._retry import DefaultRetryPolicy, RetryPolicy
from ._work import Workers

__all__ = ["ClientConfig", "MaintenanceConfig", "QueueConfig"]

QUEUE_MAX_WORKERS = 10_000
FETCH_COOLDOWN_DEFAULT = 0.1
FETCH_COOLDOWN_MIN = 0.001
FETCH_POLL_INTERVAL_DEFAULT = 1.0
JOB_TIMEOUT_DEFAULT = 60.0
JOB_STUCK_THRESHOLD_DEFAULT = 10.0
_SCHEMA_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def seconds(value: object, field: str, *, allow_none: bool = False, minimum: float = 0.0,
            strictly_positive: bool = False) -> float | None:  # fmt: skip
    """A duration in seconds from a number or a timedelta, validated."""
    if value is None:
        if allow_none:
            return None
        raise ConfigError(field, "must be a duration (seconds or timedelta), not None")
    if isinstance(value, dt.timedelta):
        value = float(value.total_seconds())
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(
            field, f"must be a number of seconds or a timedelta, not {type(value).__name__}", value
        )
    if not math.isfinite(value):
        raise ConfigError(field, "must be finite", value)
    if strictly_positive and value <= 0:
        raise ConfigError(field, "must be greater than zero", value)
    if value < minimum:
        raise ConfigError(field, f"must be at least {minimum:g}s", value)
    return float(value)


def _max_workers(_inst: object, _attr: object, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError("max_workers", f"must be an int, not {type(value).__name__}", value)
    if not 1 <= value <= QUEUE_MAX_WORKERS:
        raise ConfigError(
            "max_workers", f"must be between 1 and {QUEUE_MAX_WORKERS:,}, got {value}", value
        )


def _opt_cooldown(value: object) -> float | None:
    return seconds(value, "fetch_cooldown", allow_none=True, minimum=FETCH_COOLDOWN_MIN)


def _opt_poll(value: object) -> float | None:
    return seconds(value, "fetch_poll_interval", allow_none=True, minimum=FETCH_COOLDOWN_MIN)


@attrs.frozen(kw_only=True)
class QueueConfig:
    """One queue this client works: how many jobs at once, and optional fetch overrides."""

    max_workers: int = attrs.field(validator=_max_workers)
    fetch_cooldown: float | None = attrs.field(default=None, converter=_opt_cooldown)
    fetch_poll_interval: float | None = attrs.field(default=None, converter=_opt_poll)

    def __attrs_post_init__(self) -> None:
        if (
            self.fetch_cooldown is not None
            and self.fetch_poll_interval is not None
            and self.fetch_poll_interval < self.fetch_cooldown
        ):
            raise ConfigError(
                "fetch_poll_interval",
                f"cannot be shorter than fetch_cooldown ({self.fetch_cooldown:g}s)",
                self.fetch_poll_interval,
            )


# --- leadership and maintenance -------------------------------------------------------------

#: River's defaults (``internal/maintenance``, ``rivershared/riversharedmaintenance``).
HOUR = 3600.0
DAY = 24 * HOUR
#: The indexes River's reindexer rebuilds (``reindexer.go``).
REINDEXER_INDEX_NAMES_DEFAULT = (
    "river_job_args_index",
    "river_job_kind",
    "river_job_metadata_index",
    "river_job_pkey",
    "river_job_prioritized_fetching_index",
    "river_job_state_and_finalized_at_index",
    "river_job_unique_idx",
)
#: River's elect interval; the TTL is three of them (5 s + 10 s padding) and the follower
#: jitter a fifth of one (0–1 s).
ELECT_INTERVAL_DEFAULT = 5.0


Duration = float | int | dt.timedelta


def _interval(value: object, field: str) -> float:
    out = seconds(value, field, strictly_positive=True)
    assert out is not None
    return out


def _retention(value: object, field: str) -> float | None:
    """A retention: seconds (>= 0, finite) or None for "keep forever" (River's -1)."""
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
        raise ConfigError(field, "cannot be negative (use None to keep these jobs forever)", value)
    return seconds(value, field, allow_none=True)


def _opt_timeout(value: object, field: str) -> float | None:
    return seconds(value, field, allow_none=True, strictly_positive=True)


def _schedule(value: object) -> object:
    if value is None or callable(getattr(value, "next", None)) or callable(value):
        return value
    raise ConfigError(
        "reindexer_schedule", "must be a callable next(datetime) -> datetime or have next()", value
    )


def _index_names(value: object) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ConfigError("reindexer_index_names", "must be a list of index names", value)
    for name in value:
        if not isinstance(name, str) or not name:
            raise ConfigError("reindexer_index_names", "must contain non-empty str names", name)
    return tuple(value)


@attrs.frozen(init=False)
class MaintenanceConfig:
    """What the elected leader's maintenance services do, and how often (River's defaults).

    Durations are seconds or timedeltas. A retention of ``None`` keeps those jobs forever.
    ``rescue_after`` of ``None`` is River's default: one hour, or the client's ``job_timeout``
    plus one hour when a job timeout was given. ``reindexer_schedule`` maps a UTC datetime to
    the next run (a callable or an object with ``next()``; default: every midnight UTC);
    ``reindexer_timeout`` of ``None`` means no timeout.
    """

    scheduler_interval: float
    rescuer_interval: float
    rescue_after: float | None
    job_cleaner_interval: float
    job_cleaner_timeout: float
    completed_job_retention: float | None
    cancelled_job_retention: float | None
    discarded_job_retention: float | None
    queue_cleaner_interval: float
    queue_retention: float
    reindexer_schedule: Any
    reindexer_index_names: tuple[str, ...]
    reindexer_timeout: float | None
    notification_cleaner_interval: float
    notification_retention: float

    def __init__(
        self,
        *,
        scheduler_interval: Duration = 5.0,
        rescuer_interval: Duration = 30.0,
        rescue_after: Duration | None = None,
        job_cleaner_interval: Duration = 30.0,
        job_cleaner_timeout: Duration = 30.0,
        completed_job_retention: Duration | None = DAY,
        cancelled_job_retention: Duration | None = DAY,
        discarded_job_retention: Duration | None = 7 * DAY,
        queue_cleaner_interval: Duration = HOUR,
        queue_retention: Duration = DAY,
        reindexer_schedule: Any = None,
        reindexer_index_names: Sequence[str] = REINDEXER_INDEX_NAMES_DEFAULT,
        reindexer_timeout: Duration | None = 60.0,
        notification_cleaner_interval: Duration = 60.0,
        notification_retention: Duration = 300.0,
    ) -> None:
        self.__attrs_init__(
            scheduler_interval=_interval(scheduler_interval, "scheduler_interval"),
            rescuer_interval=_interval(rescuer_interval, "rescuer_interval"),
            rescue_after=_opt_timeout(rescue_after, "rescue_after"),
            job_cleaner_interval=_interval(job_cleaner_interval, "job_cleaner_interval"),
            job_cleaner_timeout=_interval(job_cleaner_timeout, "job_cleaner_timeout"),
            completed_job_retention=_retention(completed_job_retention, "completed_job_retention"),
            cancelled_job_retention=_retention(cancelled_job_retention, "cancelled_job_retention"),
            discarded_job_retention=_retention(discarded_job_retention, "discarded_job_retention"),
            queue_cleaner_interval=_interval(queue_cleaner_interval, "queue_cleaner_interval"),
            queue_retention=_interval(queue_retention, "queue_retention"),
            reindexer_schedule=_schedule(reindexer_schedule),
            reindexer_index_names=_index_names(reindexer_index_names),
            reindexer_timeout=_opt_timeout(reindexer_timeout, "reindexer_timeout"),
            notification_cleaner_interval=_interval(
                notification_cleaner_interval, "notification_cleaner_interval"
            ),
            notification_retention=_interval(notification_retention, "notification_retention"),
        )

    def next_reindex(self, after: dt.datetime) -> dt.datetime:
        """When the reindexer runs next after ``after`` (River: the next midnight UTC)."""
        schedule = self.reindexer_schedule
        if schedule is None:
            day = after.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
            return day + dt.timedelta(days=1)
        fn = getattr(schedule, "next", None)
        result = fn(after) if callable(fn) else schedule(after)
        if not isinstance(result, dt.datetime) or result.tzinfo is None:
            raise TypeError(f"reindexer_schedule returned {result!r}, not an aware datetime")
        return result


def _callable_or_none(value: object, field: str, method: str | None = None) -> None:
    if value is None:
        return
    if method is not None and callable(getattr(value, method, None)):
        return
    if method is None and callable(value):
        return
    want = f"an object with a {method}() method" if method else "callable"
    raise ConfigError(field, f"must be {want}", value)


@attrs.frozen(kw_only=True)
class ClientConfig:
    """Everything ``open_client`` was given, validated and defaulted."""

    id: str
    schema: str | None
    max_attempts: int
    queues: Mapping[str, QueueConfig]
    workers: Workers
    job_timeout: float | None
    soft_stop_timeout: float | None
    fetch_cooldown: float
    fetch_poll_interval: float
    poll_only: bool
    fetch_only_known_kinds: bool
    retry_policy: RetryPolicy
    error_handler: Any
    middleware: tuple[Any, ...]
    hooks: tuple[Any, ...]
    job_stuck_threshold: float
    thread_workers: int
    process_workers: int
    periodic_jobs: tuple[PeriodicJob, ...] = ()
    #: Private, for tests (``open_client(_completer_pauses=..., _completer_try_timeout=...)``):
    #: the completer's pauses between write tries and its per-try timeout. ``None`` keeps
    #: River's 1 s/2 s/4 s and 10 s.
    completer_pauses: tuple[float, ...] | None = None
    completer_try_timeout: float | None = None
    # --- leadership and maintenance
    maintenance: MaintenanceConfig = attrs.field(factory=MaintenanceConfig)
    leader_election_disabled: bool = False
    #: ``maintenance.rescue_after`` resolved (River's default when not given).
    rescue_after: float = HOUR
    #: Private, for tests (``_elect_interval``): River's 5 s; TTL and jitter scale with it.
    elect_interval: float = ELECT_INTERVAL_DEFAULT
    #: Private, for tests (``_maintenance_stagger=False``, River's TestOnly): each service
    #: waits a random 0–1 s before it starts.
    maintenance_stagger: bool = True

    def queue_cooldown(self, name: str) -> float:
        q = self.queues[name]
        return q.fetch_cooldown if q.fetch_cooldown is not None else self.fetch_cooldown

    def queue_poll_interval(self, name: str) -> float:
        q = self.queues[name]
        return (
            q.fetch_poll_interval if q.fetch_poll_interval is not None else self.fetch_poll_interval
        )


def build_config(
    *,
    id: str,
    schema: str | None,
    max_attempts: object,
    queues: object,
    workers: object,
    job_timeout: object,
    soft_stop_timeout: object,
    fetch_cooldown: object,
    fetch_poll_interval: object,
    poll_only: object,
    fetch_only_known_kinds: object,
    retry_policy: object,
    error_handler: object,
    middleware: object,
    hooks: object,
    job_stuck_threshold: object,
    thread_workers: object,
    process_workers: object,
    periodic_jobs: object = None,
    completer_pauses: object = None,
    completer_try_timeout: object = None,
    maintenance: object = None,
    leader_election_disabled: object = False,
    job_timeout_given: bool = False,
    elect_interval: object = ELECT_INTERVAL_DEFAULT,
    maintenance_stagger: object = True,
) -> ClientConfig:
    """Validate ``open_client``'s options; raise ConfigError naming the first bad one."""
    if schema is not None and (
        not isinstance(schema, str) or not _SCHEMA_RE.match(schema) or len(schema) > 46
    ):
        raise ConfigError(
            "schema", "must match ^[a-zA-Z_][a-zA-Z0-9_]*$ and be at most 46 characters", schema
        )
    if not isinstance(id, str) or not id:
        raise ConfigError("id", "must be a non-empty str", id)
    if len(id) > 100:
        raise ConfigError("id", "ID cannot be longer than 100 characters", id)
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not (1 <= max_attempts <= 32767)
    ):
        raise ConfigError("max_attempts", "must be an int between 1 and 32767", max_attempts)

    for name, value in (
        ("poll_only", poll_only),
        ("fetch_only_known_kinds", fetch_only_known_kinds),
    ):
        if not isinstance(value, bool):
            raise ConfigError(name, "must be a bool", value)

    cooldown = seconds(fetch_cooldown, "fetch_cooldown", minimum=FETCH_COOLDOWN_MIN)
    poll = seconds(fetch_poll_interval, "fetch_poll_interval", minimum=FETCH_COOLDOWN_MIN)
    assert cooldown is not None
    assert poll is not None
    if poll < cooldown:
        raise ConfigError(
            "fetch_poll_interval", f"cannot be shorter than fetch_cooldown ({cooldown:g}s)", poll
        )
    timeout = seconds(job_timeout, "job_timeout", allow_none=True, strictly_positive=True)
    soft = seconds(soft_stop_timeout, "soft_stop_timeout", allow_none=True)
    stuck = seconds(job_stuck_threshold, "job_stuck_threshold")
    assert stuck is not None

    if workers is None:
        workers = Workers()
    if not isinstance(workers, Workers):
        raise ConfigError("workers", f"must be a river_anyio.Workers, not {type(workers).__name__}")
    if queues is None:
        queues = {}
    if not isinstance(queues, Mapping):
        raise ConfigError("queues", "must be a mapping of queue name to QueueConfig", queues)
    for name, qc in queues.items():
        try:
            validate_queue_name(name, f"queues[{name!r}]")
        except ValidationError as exc:
            raise ConfigError(exc.field, exc.rule, name) from None
        if not isinstance(qc, QueueConfig):
            raise ConfigError(
                f"queues[{name!r}]", f"must be a QueueConfig, not {type(qc).__name__}", qc
            )
        eff_cool = qc.fetch_cooldown if qc.fetch_cooldown is not None else cooldown
        eff_poll = qc.fetch_poll_interval if qc.fetch_poll_interval is not None else poll
        if eff_poll < eff_cool:
            raise ConfigError(
                f"queues[{name!r}].fetch_poll_interval",
                f"cannot be shorter than the queue's fetch_cooldown ({eff_cool:g}s)",
                eff_poll,
            )
    if queues and len(workers) == 0:
        raise ConfigError(
            "workers", "queues are configured but no workers are registered: add at least one"
        )

    if retry_policy is None:
        retry_policy = DefaultRetryPolicy()
    _callable_or_none(retry_policy, "retry_policy", "next_retry")
    _callable_or_none(error_handler, "error_handler", "handle_error")

    def seq(value: object, field: str) -> tuple[Any, ...]:
        if value is None:
            return ()
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise ConfigError(field, "must be a list", value)
        return tuple(value)

    mws = seq(middleware, "middleware")
    for i, mw in enumerate(mws):
        if not any(callable(getattr(mw, m, None)) for m in ("work", "insert")):
            raise ConfigError(f"middleware[{i}]", "must have a work() and/or insert() method", mw)
    hks = seq(hooks, "hooks")
    for i, hook in enumerate(hks):
        if not any(
            callable(getattr(hook, m, None)) for m in ("insert_begin", "work_begin", "work_end")
        ):
            raise ConfigError(
                f"hooks[{i}]", "must have insert_begin(), work_begin() and/or work_end()", hook
            )
    for name, value in (("thread_workers", thread_workers), ("process_workers", process_workers)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1024:
            raise ConfigError(name, "must be an int between 1 and 1024", value)
    periodic = seq(periodic_jobs, "periodic_jobs")
    PeriodicJobs(periodic)  # every entry a PeriodicJob, IDs unique: ConfigError naming the entry
    pauses: tuple[float, ...] | None = None
    if completer_pauses is not None:
        if isinstance(completer_pauses, str | bytes) or not isinstance(completer_pauses, Sequence):
            raise ConfigError(
                "_completer_pauses", "must be a sequence of seconds", completer_pauses
            )
        if not completer_pauses:
            raise ConfigError("_completer_pauses", "must not be empty", completer_pauses)
        pauses = tuple(float(seconds(p, "_completer_pauses") or 0.0) for p in completer_pauses)
    try_timeout = seconds(
        completer_try_timeout, "_completer_try_timeout", allow_none=True, strictly_positive=True
    )

    if not isinstance(leader_election_disabled, bool):
        raise ConfigError("leader_election_disabled", "must be a bool", leader_election_disabled)
    PeriodicJobs(periodic, never_leader=leader_election_disabled)
    if not isinstance(maintenance_stagger, bool):
        raise ConfigError("_maintenance_stagger", "must be a bool", maintenance_stagger)
    if maintenance is None:
        maint = MaintenanceConfig()
    elif isinstance(maintenance, MaintenanceConfig):
        maint = maintenance
        if leader_election_disabled:
            warnings.warn(
                "maintenance settings are ignored: leader_election_disabled=True means this "
                "client never leads, so it never runs maintenance",
                UserWarning,
                stacklevel=2,
            )
    else:
        raise ConfigError(
            "maintenance", f"must be a MaintenanceConfig, not {type(maintenance).__name__}"
        )
    if maint.rescue_after is not None:
        rescue_after = maint.rescue_after
        if timeout is not None and rescue_after < timeout:
            raise ConfigError(
                "maintenance.rescue_after",
                f"cannot be less than job_timeout ({timeout:g}s)",
                rescue_after,
            )
    else:
        # River: one hour, or the job timeout plus one hour when a job timeout was given
        rescue_after = HOUR + (timeout if job_timeout_given and timeout is not None else 0.0)
    elect = seconds(elect_interval, "_elect_interval", strictly_positive=True)
    assert elect is not None

    return ClientConfig(
        id=id,
        schema=schema,
        max_attempts=max_attempts,
        queues=dict(queues),
        workers=workers,
        job_timeout=timeout,
        soft_stop_timeout=soft,
        fetch_cooldown=cooldown,
        fetch_poll_interval=poll,
        poll_only=poll_only,  # type: ignore[arg-type]
        fetch_only_known_kinds=fetch_only_known_kinds,  # type: ignore[arg-type]
        retry_policy=retry_policy,  # type: ignore[arg-type]
        error_handler=error_handler,
        middleware=mws,
        hooks=hks,
        job_stuck_threshold=stuck,
        thread_workers=thread_workers,  # type: ignore[arg-type]
        process_workers=process_workers,  # type: ignore[arg-type]
        periodic_jobs=periodic,
        completer_pauses=pauses,
        completer_try_timeout=try_timeout,
        maintenance=maint,
        leader_election_disabled=leader_election_disabled,
        rescue_after=rescue_after,
        elect_interval=elect,
        maintenance_stagger=maintenance_stagger,
    )


__all__ += ["JOB_TIMEOUT_DEFAULT", "MAX_ATTEMPTS_DEFAULT", "build_config", "seconds"]
