"""Client and queue configuration, validated when constructed (every rule a specific error).

:class:`Config` is the client's configuration (public); :class:`ConfigOptions` the same
fields as ``open_client`` keyword options; :class:`ClientConfig` what a run reads (private).
River's defaults are the field defaults here, and nowhere else.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import attrs

from ._errors import ConfigError, ValidationError
from ._health import HealthConfig
from ._job import MAX_ATTEMPTS_DEFAULT, MAX_ATTEMPTS_LIMIT, validate_queue_name
from ._periodic import PeriodicJob, PeriodicJobs
from ._queue_limits import RateLimit
from ._retry import DefaultRetryPolicy, RetryPolicy
from ._runtime._clock import Clock
from ._work import Workers

__all__ = [
    "CONFIG_OPTIONS",
    "JOB_TIMEOUT_DEFAULT",
    "MAX_ATTEMPTS_DEFAULT",
    "ClientConfig",
    "Config",
    "ConfigOptions",
    "MaintenanceConfig",
    "QueueConfig",
    "client_config",
    "seconds",
]

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


def _global_max_workers(_inst: object, _attr: object, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            "global_max_workers", f"must be an int or None, not {type(value).__name__}", value
        )
    if not 1 <= value <= QUEUE_MAX_WORKERS * 1000:
        raise ConfigError(
            "global_max_workers",
            f"must be between 1 and {QUEUE_MAX_WORKERS * 1000:,}, got {value}",
            value,
        )


def _rate_limit(_inst: object, _attr: object, value: Any) -> None:
    if value is not None and not isinstance(value, RateLimit):
        raise ConfigError(
            "rate_limit",
            f"must be a river_anyio.RateLimit(count, per=...) or None, not {type(value).__name__}",
            value,
        )


def _opt_cooldown(value: object) -> float | None:
    return seconds(value, "fetch_cooldown", allow_none=True, minimum=FETCH_COOLDOWN_MIN)


def _opt_poll(value: object) -> float | None:
    return seconds(value, "fetch_poll_interval", allow_none=True, minimum=FETCH_COOLDOWN_MIN)


@attrs.frozen(kw_only=True)
class QueueConfig:
    """One queue this client works: how many jobs at once, and optional fetch overrides.

    ``rate_limit`` and ``global_max_workers`` are global limits, shared by every river_anyio
    client working the queue (each must configure the same): at most ``rate_limit.count``
    jobs start per ``rate_limit.per``, and at most ``global_max_workers`` run at once, while
    ``max_workers`` stays this client's own. They need migration line ``river_anyio``.
    """

    max_workers: int = attrs.field(validator=_max_workers)
    fetch_cooldown: float | None = attrs.field(default=None, converter=_opt_cooldown)
    fetch_poll_interval: float | None = attrs.field(default=None, converter=_opt_poll)
    rate_limit: RateLimit | None = attrs.field(default=None, validator=_rate_limit)
    global_max_workers: int | None = attrs.field(default=None, validator=_global_max_workers)

    @property
    def limited(self) -> bool:
        """Whether the queue has a global limit (its claims take the limited path)."""
        return self.rate_limit is not None or self.global_max_workers is not None

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


# --- the client's configuration -------------------------------------------------------------

#: River's defaults for the client options (``client.go``); :class:`Config` holds them.
THREAD_WORKERS_DEFAULT = 16
PROCESS_WORKERS_DEFAULT = 4
#: Bound River puts on a client ID.
ID_MAX_LENGTH = 100


def _id(value: str | None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError("id", "must be a non-empty str", value)
    if len(value) > ID_MAX_LENGTH:
        raise ConfigError("id", f"ID cannot be longer than {ID_MAX_LENGTH} characters", value)
    return value


def _schema(value: str | None) -> str | None:
    if value is not None and (
        not isinstance(value, str) or not _SCHEMA_RE.match(value) or len(value) > 46
    ):
        raise ConfigError(
            "schema", "must match ^[a-zA-Z_][a-zA-Z0-9_]*$ and be at most 46 characters", value
        )
    return value


def _max_attempts(_inst: object, _attr: object, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (1 <= value <= MAX_ATTEMPTS_LIMIT)
    ):
        raise ConfigError("max_attempts", "must be an int between 1 and 2**63 - 1", value)


def _bool(_inst: object, attribute: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(attribute.name, "must be a bool", value)


def _pool_size(_inst: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1024:
        raise ConfigError(attribute.name, "must be an int between 1 and 1024", value)


def _job_timeout(value: Duration | None) -> float | None:
    return seconds(value, "job_timeout", allow_none=True, strictly_positive=True)


def _soft_stop_timeout(value: Duration | None) -> float | None:
    return seconds(value, "soft_stop_timeout", allow_none=True)


def _fetch_cooldown(value: Duration) -> float:
    return _required(seconds(value, "fetch_cooldown", minimum=FETCH_COOLDOWN_MIN))


def _fetch_poll_interval(value: Duration) -> float:
    return _required(seconds(value, "fetch_poll_interval", minimum=FETCH_COOLDOWN_MIN))


def _job_stuck_threshold(value: Duration) -> float:
    return _required(seconds(value, "job_stuck_threshold"))


def _required(value: float | None) -> float:
    assert value is not None  # seconds() without allow_none never returns None
    return value


def _queues(value: Mapping[str, QueueConfig] | None) -> dict[str, QueueConfig]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError("queues", "must be a mapping of queue name to QueueConfig", value)
    for name, qc in value.items():
        try:
            validate_queue_name(name, f"queues[{name!r}]")
        except ValidationError as exc:
            raise ConfigError(exc.field, exc.rule, name) from None
        if not isinstance(qc, QueueConfig):
            raise ConfigError(
                f"queues[{name!r}]", f"must be a QueueConfig, not {type(qc).__name__}", qc
            )
    return dict(value)


def _workers(value: Workers | None) -> Workers:
    if value is None:
        return Workers()
    if not isinstance(value, Workers):
        raise ConfigError("workers", f"must be a river_anyio.Workers, not {type(value).__name__}")
    return value


def _has_method(value: object, field: str, method: str) -> None:
    if not callable(getattr(value, method, None)):
        raise ConfigError(field, f"must be an object with a {method}() method", value)


def _retry_policy(value: RetryPolicy | None) -> RetryPolicy:
    if value is None:
        return DefaultRetryPolicy()
    _has_method(value, "retry_policy", "next_retry")
    return value


def _error_handler(_inst: object, _attr: object, value: object) -> None:
    if value is not None:
        _has_method(value, "error_handler", "handle_error")


def _list(value: object, field: str) -> tuple[Any, ...]:
    if value is None:
        return ()
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ConfigError(field, "must be a list", value)
    return tuple(value)


def _middleware(value: Sequence[Any] | None) -> tuple[Any, ...]:
    out = _list(value, "middleware")
    for i, mw in enumerate(out):
        if not any(callable(getattr(mw, m, None)) for m in ("work", "insert")):
            raise ConfigError(f"middleware[{i}]", "must have a work() and/or insert() method", mw)
    return out


#: The methods a hook may have (at least one).
HOOK_METHODS = ("insert_begin", "work_begin", "work_end", "jobs_claimed", "periodic_jobs_start")


def _hooks(value: Sequence[Any] | None) -> tuple[Any, ...]:
    out = _list(value, "hooks")
    for i, hook in enumerate(out):
        if not any(callable(getattr(hook, m, None)) for m in HOOK_METHODS):
            raise ConfigError(
                f"hooks[{i}]", f"must have at least one of {', '.join(HOOK_METHODS)}", hook
            )
    return out


def _periodic_jobs(value: Sequence[PeriodicJob] | None) -> tuple[PeriodicJob, ...]:
    out = _list(value, "periodic_jobs")
    PeriodicJobs(out)  # every entry a PeriodicJob, IDs unique: ConfigError naming the entry
    return out


def _maintenance(value: MaintenanceConfig | None) -> MaintenanceConfig:
    if value is None:
        return MaintenanceConfig()
    if not isinstance(value, MaintenanceConfig):
        raise ConfigError("maintenance", f"must be a MaintenanceConfig, not {type(value).__name__}")
    return value


def _driver_options(value: Mapping[str, Any] | None) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError("driver_options", "must be a dict of driver keyword arguments")
    if "schema" in value:
        raise ConfigError("driver_options", "use open_client's schema option, not schema")
    return dict(value)


def _health(value: HealthConfig | None) -> HealthConfig:
    if value is None:
        return HealthConfig()
    if not isinstance(value, HealthConfig):
        raise ConfigError("health", f"must be a HealthConfig, not {type(value).__name__}", value)
    return value


def _clock(value: Clock | None) -> Clock | None:
    if value is not None and not callable(getattr(value, "now", None)):
        raise ConfigError("clock", "must be an object with a now() method", value)
    return value


@attrs.frozen(kw_only=True)
class Config:
    """Everything a client is configured with, validated when built; River's defaults.

    Pass it to :func:`open_client` or :func:`run_client`, or give :func:`open_client` the
    same names as keyword options (they are applied over ``config``). Every invalid value is a
    :class:`ConfigError` naming its field, raised here, before anything connects. Durations are
    seconds or :class:`~datetime.timedelta` and read back as float seconds.

    Attributes:
        queues: ``{name: QueueConfig}``, the queues this client works (``workers`` needed).
            Without queues the client only inserts and manages jobs, and never leads.
        workers: The :class:`Workers` that run each job kind.
        id: This client's ID, at most 100 characters (``None``: host name and start time,
            made when the client starts).
        schema: The schema holding River's tables (PostgreSQL), or the attached database
            (SQLite; attach it with ``driver_options={"attach": {name: path}}``). With a
            driver of the caller's, the client uses ``driver.with_schema(schema)``: the
            same pool under this schema, as River Go's clients share one driver.
        max_attempts: Attempts of jobs inserted without their own (River's 25). Above
            32,767, PostgreSQL stores 32,767 (its column is a ``smallint``), as River does.
        job_timeout: How long an attempt may run unless its worker says otherwise, ``None``
            for no limit (60 s).
        soft_stop_timeout: How long a graceful stop lets running jobs finish before they are
            cancelled (``None``: as long as they take).
        fetch_cooldown: The guard against notification storms (0.1 s): fetches prompted by
            notifications or the poll are limited to 25 at once and 25 per cooldown, except
            that one may follow a claim that got rows by a hundredth of it.
        fetch_poll_interval: How often a queue is fetched without notifications (1 s).
        poll_only: Poll instead of listening for notifications (False).
        fetch_only_known_kinds: Claim only jobs of kinds that have a worker here, their
            ``kind_aliases`` included (False: a job of an unknown kind is claimed and fails,
            as in River).
        claim_ahead: While a backlog of quick jobs lasts, claim rows ahead of the free
            slots, so the next claim's round trip overlaps the jobs being run (beyond River,
            see the performance discussion): faster drains of very short jobs, but a row
            claimed ahead is ``running``, its ``attempted_at`` stamped, before a worker takes
            it. False (the default) claims only for free slots, as River does: a claimed row
            is a started attempt, and one worker runs its queue's jobs in claim order.
        retry_policy: An object with ``next_retry(job_row, now) -> datetime``
            (:class:`DefaultRetryPolicy`, River's).
        error_handler: An object with ``handle_error(job_row, exc)`` (may be async), called
            when an attempt raises; a result with a true ``set_cancelled`` cancels the job.
        middleware: Objects with ``async insert(params, next)`` and/or
            ``async work(ctx, job, next)`` methods, outermost first.
        hooks: Objects with any of ``insert_begin(params)``, ``work_begin(ctx, job)``,
            ``work_end(ctx, job, error)``, ``jobs_claimed(rows)`` (after a claim commits,
            before its jobs start) and ``periodic_jobs_start(params)`` (each time this client's
            periodic job enqueuer starts, on becoming leader); sync or async; a hook that
            raises is logged and ignored.
        job_stuck_threshold: How long a ``run_in="process"`` worker may ignore cancellation
            before its process is killed (10 s).
        thread_workers: Threads shared by ``run_in="thread"`` workers (16).
        process_workers: Child processes shared by ``run_in="process"`` workers (4).
        periodic_jobs: :class:`PeriodicJob` instances the client inserts while it leads.
        maintenance: The leader's maintenance services (:class:`MaintenanceConfig`).
        leader_election_disabled: Never take part in leader elections (False).
        auto_migrate: Migrate line ``main``, then line ``river_anyio`` (river_anyio's own
            tables, e.g. leases), up to the latest version before starting, under
            the migrator's lock (False: a missing or outdated schema is a
            :class:`MigrationError` naming the command that fixes it). The zero-config
            default for an embedded SQLite file; on PostgreSQL a development convenience
            (in production, migrate as a deployment step).
        driver_options: Keyword arguments for the driver opened from a database URL:
            PostgreSQL's ``pool_max_size``, ``acquire_timeout``, ``connect_timeout``,
            ``prepare_threshold``; SQLite's ``busy_timeout``, ``attach``, ``sqlite_module``.
        clock: The wall clock rows are stamped with (an object with ``now()``; for tests).
        health: When :meth:`ClientRun.health` reports the client not ok
            (:class:`HealthConfig`).
        wait_for_database: Start even while the database cannot be reached (False: River's
            fail-fast start). The ``open_client`` block is entered at once; the client logs
            an error for each failed attempt (with back-off, up to 5 s apart), reports itself
            not ok, and starts working as soon as the database answers.
    """

    queues: Mapping[str, QueueConfig] = attrs.field(factory=dict, converter=_queues)
    workers: Workers = attrs.field(factory=Workers, converter=_workers)
    id: str | None = attrs.field(default=None, converter=_id)
    schema: str | None = attrs.field(default=None, converter=_schema)
    max_attempts: int = attrs.field(default=MAX_ATTEMPTS_DEFAULT, validator=_max_attempts)
    job_timeout: float | None = attrs.field(default=JOB_TIMEOUT_DEFAULT, converter=_job_timeout)
    soft_stop_timeout: float | None = attrs.field(default=None, converter=_soft_stop_timeout)
    fetch_cooldown: float = attrs.field(default=FETCH_COOLDOWN_DEFAULT, converter=_fetch_cooldown)
    fetch_poll_interval: float = attrs.field(
        default=FETCH_POLL_INTERVAL_DEFAULT, converter=_fetch_poll_interval
    )
    poll_only: bool = attrs.field(default=False, validator=_bool)
    fetch_only_known_kinds: bool = attrs.field(default=False, validator=_bool)
    claim_ahead: bool = attrs.field(default=False, validator=_bool)
    retry_policy: RetryPolicy = attrs.field(factory=DefaultRetryPolicy, converter=_retry_policy)
    error_handler: Any = attrs.field(default=None, validator=_error_handler)
    middleware: tuple[Any, ...] = attrs.field(default=(), converter=_middleware)
    hooks: tuple[Any, ...] = attrs.field(default=(), converter=_hooks)
    job_stuck_threshold: float = attrs.field(
        default=JOB_STUCK_THRESHOLD_DEFAULT, converter=_job_stuck_threshold
    )
    thread_workers: int = attrs.field(default=THREAD_WORKERS_DEFAULT, validator=_pool_size)
    process_workers: int = attrs.field(default=PROCESS_WORKERS_DEFAULT, validator=_pool_size)
    periodic_jobs: tuple[PeriodicJob, ...] = attrs.field(default=(), converter=_periodic_jobs)
    maintenance: MaintenanceConfig = attrs.field(factory=MaintenanceConfig, converter=_maintenance)
    leader_election_disabled: bool = attrs.field(default=False, validator=_bool)
    auto_migrate: bool = attrs.field(default=False, validator=_bool)
    driver_options: Mapping[str, Any] = attrs.field(factory=dict, converter=_driver_options)
    clock: Clock | None = attrs.field(default=None, converter=_clock)
    health: HealthConfig = attrs.field(factory=HealthConfig, converter=_health)
    wait_for_database: bool = attrs.field(default=False, validator=_bool)

    def __attrs_post_init__(self) -> None:
        cooldown, poll = self.fetch_cooldown, self.fetch_poll_interval
        if poll < cooldown:
            raise ConfigError(
                "fetch_poll_interval",
                f"cannot be shorter than fetch_cooldown ({cooldown:g}s)",
                poll,
            )
        for name in self.queues:
            eff_cool, eff_poll = self.queue_cooldown(name), self.queue_poll_interval(name)
            if eff_poll < eff_cool:
                raise ConfigError(
                    f"queues[{name!r}].fetch_poll_interval",
                    f"cannot be shorter than the queue's fetch_cooldown ({eff_cool:g}s)",
                    eff_poll,
                )
        if self.queues and len(self.workers) == 0:
            raise ConfigError(
                "workers", "queues are configured but no workers are registered: add at least one"
            )
        PeriodicJobs(self.periodic_jobs, never_leader=self.leader_election_disabled)
        rescue_after = self.maintenance.rescue_after
        timeout = self.job_timeout
        if rescue_after is not None and timeout is not None and rescue_after < timeout:
            raise ConfigError(
                "maintenance.rescue_after",
                f"cannot be less than job_timeout ({timeout:g}s)",
                rescue_after,
            )

    def queue_cooldown(self, name: str) -> float:
        """The fetch cooldown of queue ``name``: its own, else the client's."""
        q = self.queues[name]
        return q.fetch_cooldown if q.fetch_cooldown is not None else self.fetch_cooldown

    def queue_poll_interval(self, name: str) -> float:
        """The fetch poll interval of queue ``name``: its own, else the client's."""
        q = self.queues[name]
        return (
            q.fetch_poll_interval if q.fetch_poll_interval is not None else self.fetch_poll_interval
        )

    @property
    def rescue_after(self) -> float:
        """``maintenance.rescue_after`` resolved: as given, else River's default of one hour,
        plus ``job_timeout`` when that is longer than the default minute."""
        if self.maintenance.rescue_after is not None:
            return self.maintenance.rescue_after
        timeout = self.job_timeout
        long = timeout is not None and timeout > JOB_TIMEOUT_DEFAULT
        return HOUR + (timeout if long and timeout is not None else 0.0)

    def unused_settings_warning(self) -> str | None:
        """Why some of these settings would have no effect, if they would not."""
        if self.leader_election_disabled and self.maintenance != MaintenanceConfig():
            return (
                "maintenance settings are ignored: leader_election_disabled=True means this "
                "client never leads, so it never runs maintenance"
            )
        return None


class ConfigOptions(TypedDict, total=False):
    """:class:`Config`'s fields as keyword options of :func:`open_client` (each typed as
    :class:`Config` accepts it; a test keeps the two in step)."""

    queues: Mapping[str, QueueConfig] | None
    workers: Workers | None
    id: str | None
    schema: str | None
    max_attempts: int
    job_timeout: Duration | None
    soft_stop_timeout: Duration | None
    fetch_cooldown: Duration
    fetch_poll_interval: Duration
    poll_only: bool
    fetch_only_known_kinds: bool
    claim_ahead: bool
    retry_policy: RetryPolicy | None
    error_handler: Any
    middleware: Sequence[Any] | None
    hooks: Sequence[Any] | None
    job_stuck_threshold: Duration
    thread_workers: int
    process_workers: int
    periodic_jobs: Sequence[PeriodicJob] | None
    maintenance: MaintenanceConfig | None
    leader_election_disabled: bool
    auto_migrate: bool
    driver_options: Mapping[str, Any] | None
    clock: Clock | None
    health: HealthConfig | None
    wait_for_database: bool


#: The option names :func:`open_client` takes (unknown ones are a ConfigError at run time too,
#: for callers that are not type-checked).
CONFIG_OPTIONS = ConfigOptions.__optional_keys__


# --- what reaches the run: a Config, its ID resolved, plus private tuning for tests ----------------


def _client_id(value: str | None) -> str:
    from ._client import default_client_id  # _client imports this module

    resolved = _id(value)
    return default_client_id() if resolved is None else resolved


def _completer_pauses(value: Sequence[Duration] | None) -> tuple[float, ...] | None:
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ConfigError("_completer_pauses", "must be a sequence of seconds", value)
    if not value:
        raise ConfigError("_completer_pauses", "must not be empty", value)
    return tuple(_required(seconds(p, "_completer_pauses")) for p in value)


def _completer_try_timeout(value: Duration | None) -> float | None:
    return seconds(value, "_completer_try_timeout", allow_none=True, strictly_positive=True)


def _elect_interval(value: Duration) -> float:
    return _required(seconds(value, "_elect_interval", strictly_positive=True))


def _health_listen(value: tuple[str, int] | None) -> tuple[str, int] | None:
    if value is None:
        return None
    host, port = value
    if not isinstance(host, str) or not host:
        raise ConfigError("health_listen", "the host must be a non-empty str", host)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError("health_listen", "the port must be an int from 0 to 65535", port)
    return host, port


def _maintenance_stagger(_inst: object, _attr: object, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError("_maintenance_stagger", "must be a bool", value)


def _fixed_prefetch(value: object) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ConfigError("_fixed_prefetch", "must be None or an int ≥ 0", value)
    return value


@attrs.frozen(kw_only=True)
class ClientConfig(Config):
    """The configuration a client run reads: a :class:`Config` with its ``id`` resolved
    (River's default when none was given), and timings only tests change.

    Private: tests pass one as ``open_client(url, ClientConfig(elect_interval=0.2), ...)``;
    everyone else passes a :class:`Config`, which :func:`client_config` turns into one with
    the tuning at River's values.
    """

    id: str = attrs.field(default=None, converter=_client_id)
    #: The completer's pauses between write tries and its per-try timeout; ``None`` keeps
    #: River's 1 s/2 s/4 s and 10 s.
    completer_pauses: tuple[float, ...] | None = attrs.field(
        default=None, converter=_completer_pauses
    )
    completer_try_timeout: float | None = attrs.field(
        default=None, converter=_completer_try_timeout
    )
    #: River's 5 s; the leadership TTL and the followers' jitter scale with it.
    elect_interval: float = attrs.field(default=ELECT_INTERVAL_DEFAULT, converter=_elect_interval)
    #: River's TestOnly switch: each maintenance service waits a random 0–1 s before it
    #: starts unless this is False.
    maintenance_stagger: bool = attrs.field(default=True, validator=_maintenance_stagger)
    #: Rows each producer claims ahead after a claim that meets a backlog, instead of the
    #: number measured from the jobs' pace (``None``); tests use it to hold claimed rows.
    fixed_prefetch: int | None = attrs.field(default=None, converter=_fixed_prefetch)
    #: ``(host, port)`` the run answers ``GET /health`` on while it runs (the worker's
    #: ``--health-port``; port 0 picks a free one).
    health_listen: tuple[str, int] | None = attrs.field(default=None, converter=_health_listen)


def client_config(config: Config | None, options: Mapping[str, Any]) -> ClientConfig:
    """The configuration a run reads: ``config``'s fields (``Config()``'s when it is None)
    with ``options`` applied over them, built once. With no config, that one construction is
    the only validation; a caller's Config was validated when it was built, and is checked
    again here with the options applied (the checks are pure, and cost microseconds)."""
    if isinstance(config, ClientConfig):
        return attrs.evolve(config, **options) if options else config
    fields: dict[str, Any] = {}
    if config is not None:
        fields = {f.name: getattr(config, f.name) for f in attrs.fields(Config)}
    return ClientConfig(**{**fields, **options})
