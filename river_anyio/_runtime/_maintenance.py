"""The leader's maintenance services (River's ``internal/maintenance``).

They run only in the leader scope (see ``_elector``): elected, they start one after another,
each after a random 0–1 s stagger; leadership lost, their scope is cancelled. An interval
service runs once at start and then every interval (ticks are dropped when a run overruns).
Each run works in batches of 10,000 rows, 1,000 once three queries of the last ten minutes
timed out (for the rest of the term), sleeping 50 ms–1 s between full batches.

A failed run is logged (a warning for database faults, an error otherwise), reported as a
``maintenance_failed`` event naming the service, and retried at the next interval: it never
stops the client.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskStatus

from .._convert import structure_args
from .._errors import DatabaseError
from .._events import Event, EventHub, EventKind
from .._job import JobRow, JobState
from .._retry import DefaultRetryPolicy
from .._timeutil import format_rfc3339nano, parse_rfc3339
from .._wait import JobWaiters
from .._work import Job, Registration, _Unset
from ..drivers import Driver, Executor, JobRescue

if TYPE_CHECKING:
    from .._config import ClientConfig
    from ._clock import Clock

__all__ = [
    "JobCleaner",
    "JobRescuer",
    "JobScheduler",
    "MaintenanceService",
    "NotificationCleaner",
    "QueueCleaner",
    "Reindexer",
]

#: River's maintenance constants (``riversharedmaintenance``).
BATCH_SIZE_DEFAULT = 10_000
BATCH_SIZE_REDUCED = 1_000
BREAKER_LIMIT = 3
BREAKER_WINDOW = 600.0
BATCH_PAUSE = (0.05, 1.0)
QUERY_TIMEOUT = 30.0
STAGGER = 1.0
#: The scheduler notifies queues of jobs due within this (River: 5 ms).
NOTIFY_HORIZON = dt.timedelta(milliseconds=5)
RESCUE_ERROR = "Stuck job rescued by JobRescuer"
#: River's metadata key counting a job's rescues (its rescue statement increments it).
RESCUE_COUNT_KEY = "river:rescue_count"
_RESCUE_OUTCOMES = {
    JobState.RETRYABLE: "retried",
    JobState.DISCARDED: "discarded",
    JobState.CANCELLED: "cancelled",
}
#: How long the reindexer may spend dropping a rebuild's leftovers once interrupted.
REINDEX_CLEANUP_TIMEOUT = 15.0

_default_policy = DefaultRetryPolicy()


class BatchSizes:
    """River's reduced-batch-size circuit breaker: after ``BREAKER_LIMIT`` query timeouts
    within ``BREAKER_WINDOW`` seconds, batches shrink for good (until the term ends); a
    success while closed forgets earlier timeouts."""

    def __init__(self) -> None:
        self._timeouts: list[float] = []
        self.reduced = False

    @property
    def size(self) -> int:
        return BATCH_SIZE_REDUCED if self.reduced else BATCH_SIZE_DEFAULT

    def trip(self) -> None:
        now = time.monotonic()
        self._timeouts = [t for t in self._timeouts if now - t < BREAKER_WINDOW] + [now]
        if len(self._timeouts) >= BREAKER_LIMIT:
            self.reduced = True

    def success(self) -> None:
        if not self.reduced:
            self._timeouts.clear()


class MaintenanceService:
    """Base of the services: stagger, then a run every ``interval``; failures reported."""

    #: The service's name in logs and ``maintenance_failed`` events.
    name = "maintenance"
    #: Each service logs on ``river_anyio.maintenance.<name>`` (fixed names: see _logging).
    logger: logging.Logger

    def __init__(
        self,
        *,
        driver: Driver,
        clock: Clock,
        events: EventHub,
        config: ClientConfig,
        interval: float,
    ) -> None:
        self._driver = driver
        self._clock = clock
        self._events = events
        self._config = config
        self.interval = interval
        self.batches = BatchSizes()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        if self._config.maintenance_stagger:
            await anyio.sleep(random.uniform(0, STAGGER))
        task_status.started()
        self.logger.debug("%s: run loop started", self.name)
        next_tick = anyio.current_time()
        while True:
            await self.run_and_report()
            now = anyio.current_time()
            next_tick += self.interval
            if next_tick < now:  # overran: drop the missed ticks
                next_tick += ((now - next_tick) // self.interval + 1) * self.interval
            await anyio.sleep_until(next_tick)

    async def run_and_report(self) -> bool:
        """One run; a failure is logged and reported. Returns whether it succeeded."""
        try:
            await self.run_once()
        except Exception as exc:
            self.failed(exc)
            return False
        return True

    def failed(self, exc: BaseException, **details: Any) -> None:
        transient = isinstance(exc, DatabaseError | TimeoutError)
        self.logger.log(
            logging.WARNING if transient else logging.ERROR,
            "%s failed (runs again at its next interval): %s: %s",
            self.name,
            type(exc).__name__,
            exc,
            exc_info=None if transient else exc,
            extra={"river_event": "maintenance_failed", "river_service": self.name},
        )
        self._events.publish(
            Event(
                kind=EventKind.MAINTENANCE_FAILED,
                error=f"{type(exc).__name__}: {exc}",
                details={"service": self.name, **details},
            )
        )

    async def run_once(self) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def _batch_query(self, seconds: float | None) -> Iterator[None]:
        """One batch query within ``seconds``; timeouts feed the batch-size breaker."""
        try:
            with anyio.fail_after(seconds):
                yield
        except TimeoutError:
            self.batches.trip()
            raise
        self.batches.success()

    async def _pause_between_batches(self) -> None:
        await anyio.sleep(random.uniform(*BATCH_PAUSE))


class JobScheduler(MaintenanceService):
    """``scheduled``/``retryable`` jobs due within one interval → ``available`` (River's
    JobScheduler), with insert notifications for queues whose jobs are due now."""

    name = "scheduler"
    logger = logging.getLogger("river_anyio.maintenance.scheduler")

    def __init__(
        self,
        *,
        notify_insert: Callable[[Executor, set[str]], Awaitable[None]],
        after_commit: Callable[[set[str]], None],
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self._notify_insert = notify_insert
        self._after_commit = after_commit
        self.scheduled = 0

    async def run_once(self) -> None:
        while True:
            size = self.batches.size
            with self._batch_query(QUERY_TIMEOUT):
                async with self._driver.transaction() as tx:
                    now = self._clock.now()
                    moved = await tx.job_schedule(
                        horizon=now + dt.timedelta(seconds=self.interval), now=now, limit=size
                    )
                    due = self._clock.now() + NOTIFY_HORIZON
                    queues = {
                        r.job.queue
                        for r in moved
                        if not r.conflict_discarded and r.job.scheduled_at <= due
                    }
                    if queues:
                        await self._notify_insert(tx, queues)
            n = len(moved)
            if queues:
                self._after_commit(queues)
            if self._events.active:
                for r in moved:
                    if r.conflict_discarded:
                        self._events.publish(
                            Event(
                                kind=EventKind.JOB_DISCARDED,
                                job=r.job,
                                queue=r.job.queue,
                                details={"cause": "unique_conflict"},
                            )
                        )
            self.scheduled += n
            if n:
                self.logger.info("scheduler: %d jobs made available", n)
            if n < size:
                return
            await self._pause_between_batches()


class JobRescuer(MaintenanceService):
    """``running`` jobs attempted longer than ``rescue_after`` ago (and past their timeout) →
    ``retryable``, or ``discarded`` when out of attempts or of a kind this client does not
    know; ``cancelled`` when their cancellation was requested (River's JobRescuer)."""

    name = "rescuer"
    logger = logging.getLogger("river_anyio.maintenance.rescuer")

    def __init__(self, *, waiters: JobWaiters | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.rescued = 0
        #: the client's ``jobs.wait`` calls, woken for the jobs this finalizes
        self._waiters = waiters

    async def run_once(self) -> None:
        ex = self._driver.executor()
        horizon = self._clock.now() - dt.timedelta(seconds=self._config.rescue_after)
        after_id = 0
        while True:
            size = self.batches.size
            with self._batch_query(QUERY_TIMEOUT):
                stuck = await ex.job_get_stuck(stuck_horizon=horizon, after_id=after_id, limit=size)
            if stuck:
                after_id = stuck[-1].id
            now = self._clock.now()
            rescues = [r for r in (self._decide(job, now) for job in stuck) if r is not None]
            if rescues:
                rows: list[JobRow] | None = None
                with self._batch_query(QUERY_TIMEOUT):
                    if self._events.active:  # the rows as written, only for events
                        rows = await ex.job_rescue_many_returning(rescues, stuck_horizon=horizon)
                    else:
                        await ex.job_rescue_many(rescues, stuck_horizon=horizon)
                self.rescued += len(rescues)
                self.logger.info("rescuer: %d stuck jobs rescued", len(rescues))
                if self._waiters:
                    self._waiters.wake(r.id for r in rescues if r.finalized_at is not None)
                if rows:
                    self._report(rows)
            if len(stuck) < size:
                return
            await self._pause_between_batches()

    def _report(self, rows: list[JobRow]) -> None:
        """``job_rescued`` for each rescued row (and ``job_discarded`` for a discarded one)."""
        for row in sorted(rows, key=lambda r: r.id):
            count = row.metadata.get(RESCUE_COUNT_KEY) if isinstance(row.metadata, Mapping) else 0
            outcome = _RESCUE_OUTCOMES.get(row.state, str(row.state))
            self._events.publish(
                Event(
                    kind=EventKind.JOB_RESCUED,
                    job=row,
                    queue=row.queue,
                    error=RESCUE_ERROR,
                    details={"rescue_count": count, "outcome": outcome},
                )
            )
            if row.state == JobState.DISCARDED:
                self._events.publish(
                    Event(
                        kind=EventKind.JOB_DISCARDED,
                        job=row,
                        queue=row.queue,
                        error=RESCUE_ERROR,
                        details={"cause": "rescuer"},
                    )
                )

    def _decide(self, job: JobRow, now: dt.datetime) -> JobRescue | None:
        error = json.dumps(
            {
                "at": format_rfc3339nano(now),
                "attempt": max(job.attempt, 0),
                "error": RESCUE_ERROR,
                "trace": "",
            },
            separators=(",", ":"),
        ).encode()

        def rescue(state: JobState, scheduled_at: dt.datetime | None = None) -> JobRescue:
            final = state in (JobState.CANCELLED, JobState.DISCARDED)
            return JobRescue(
                id=job.id,
                state=state,
                error=error,
                scheduled_at=scheduled_at or job.scheduled_at,
                finalized_at=now if final else None,
            )

        if _cancel_requested(job, self.logger):
            return rescue(JobState.CANCELLED)
        reg = self._config.workers.get(job.kind)
        if reg is None:
            self.logger.error(
                "rescuer: attempted to rescue unhandled job kind %r (job %d); discarding",
                job.kind,
                job.id,
            )
            return rescue(JobState.DISCARDED)
        try:
            typed: Job[Any] | None = Job(job, structure_args(job.args, reg.args_cls))
        except Exception as exc:
            self.logger.error("rescuer: cannot decode args of job %d: %s", job.id, exc)
            typed = None
        if typed is not None:
            timeout = self._timeout(reg, typed)
            if timeout is None:
                return None  # no timeout: never rescued
            if job.attempted_at is not None and now - job.attempted_at < dt.timedelta(
                seconds=timeout
            ):
                return None  # still within its own timeout
        if job.attempt < max(job.max_attempts, 0):
            return rescue(JobState.RETRYABLE, self._next_retry(job, reg, typed, now))
        return rescue(JobState.DISCARDED)

    def _timeout(self, reg: Registration, job: Job[Any]) -> float | None:
        try:
            own = reg.job_timeout(job)
        except Exception:
            self.logger.exception("rescuer: timeout() of %s raised; using job_timeout", job.kind)
            own = None if self._config.job_timeout is None else self._config.job_timeout
        return self._config.job_timeout if isinstance(own, _Unset) else own

    def _next_retry(
        self, job: JobRow, reg: Registration, typed: Job[Any] | None, now: dt.datetime
    ) -> dt.datetime:
        nxt: dt.datetime | None = None
        if typed is not None:
            try:
                nxt = reg.next_retry(typed)
            except Exception:
                self.logger.exception("rescuer: next_retry of %s raised", job.kind)
        if nxt is None:
            policy = reg.retry_policy if reg.retry_policy is not None else self._config.retry_policy
            try:
                nxt = policy.next_retry(job, now)
            except Exception:
                self.logger.exception("rescuer: retry policy raised; using River's default")
        if nxt is None or nxt.tzinfo is None:
            nxt = _default_policy.next_retry(job, now)
        return nxt


def _cancel_requested(job: JobRow, logger: logging.Logger) -> bool:
    """Whether the job carries a (non-zero) ``cancel_attempted_at``, as River reads it."""
    value = job.metadata.get("cancel_attempted_at") if isinstance(job.metadata, Mapping) else None
    if value is None:
        return False
    try:
        at = parse_rfc3339(str(value))
    except ValueError:
        # River fails the whole run here; a flag we cannot read still asks for a cancel
        logger.warning("rescuer: job %d has an unreadable cancel_attempted_at %r", job.id, value)
        return True
    return at.year > 1  # Go's zero time means "not set"


class JobCleaner(MaintenanceService):
    """Deletes finalized jobs past their state's retention (River's JobCleaner)."""

    name = "job_cleaner"
    logger = logging.getLogger("river_anyio.maintenance.job_cleaner")

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.deleted = 0

    async def run_once(self) -> None:
        m = self._config.maintenance
        now = self._clock.now()

        def horizon(retention: float | None) -> dt.datetime | None:
            return None if retention is None else now - dt.timedelta(seconds=retention)

        cancelled = horizon(m.cancelled_job_retention)
        completed = horizon(m.completed_job_retention)
        discarded = horizon(m.discarded_job_retention)
        if cancelled is None and completed is None and discarded is None:
            return
        ex = self._driver.executor()
        while True:
            size = self.batches.size
            with self._batch_query(m.job_cleaner_timeout):
                n = await ex.job_delete_before(
                    cancelled_before=cancelled,
                    completed_before=completed,
                    discarded_before=discarded,
                    limit=size,
                )
            self.deleted += n
            if n:
                self.logger.info("job_cleaner: %d finalized jobs deleted", n)
            if n < size:
                return
            await self._pause_between_batches()


class QueueCleaner(MaintenanceService):
    """Deletes ``river_queue`` rows no client has touched for the retention (River's
    QueueCleaner; working clients touch theirs every 10 minutes)."""

    name = "queue_cleaner"
    logger = logging.getLogger("river_anyio.maintenance.queue_cleaner")

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.deleted: list[str] = []

    async def run_once(self) -> None:
        horizon = self._clock.now() - dt.timedelta(seconds=self._config.maintenance.queue_retention)
        ex = self._driver.executor()
        while True:
            size = self.batches.size
            with self._batch_query(QUERY_TIMEOUT):
                names = await ex.queue_delete_expired(updated_before=horizon, limit=size)
            self.deleted.extend(names)
            if names:
                self.logger.info("queue_cleaner: deleted queues %s", ", ".join(names))
            if len(names) < size:
                return
            await self._pause_between_batches()


class NotificationCleaner(MaintenanceService):
    """SQLite only: deletes ``river_notification`` outbox rows past their retention."""

    name = "notification_cleaner"
    logger = logging.getLogger("river_anyio.maintenance.notification_cleaner")

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.deleted = 0

    async def run_once(self) -> None:
        retention = dt.timedelta(seconds=self._config.maintenance.notification_retention)
        horizon = self._clock.now() - retention
        ex = self._driver.executor()
        while True:
            size = self.batches.size
            with self._batch_query(QUERY_TIMEOUT):
                n = await ex.notification_delete_before(created_before=horizon, limit=size)
            self.deleted += n
            if n < size:
                return
            await self._pause_between_batches()


class Reindexer(MaintenanceService):
    """PostgreSQL only: rebuilds River's indexes concurrently on a schedule (River's
    Reindexer: daily at midnight UTC by default), each under a timeout. An index with leftovers
    of an interrupted rebuild is skipped; a rebuild interrupted here has its leftovers
    dropped."""

    name = "reindexer"
    logger = logging.getLogger("river_anyio.maintenance.reindexer")

    def __init__(self, **kw: Any) -> None:
        super().__init__(interval=0.0, **kw)
        self.reindexed: list[str] = []

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        if self._config.maintenance_stagger:
            await anyio.sleep(random.uniform(0, STAGGER))
        task_status.started()
        maintenance = self._config.maintenance
        next_run = maintenance.next_reindex(self._clock.now())
        while True:
            await anyio.sleep(max(0.0, (next_run - self._clock.now()).total_seconds()))
            await self.run_and_report()
            following = maintenance.next_reindex(next_run)
            if following <= next_run:
                self.failed(ValueError(f"reindexer_schedule did not move past {next_run}"))
                return
            next_run = following

    async def run_once(self) -> None:
        ex = self._driver.executor()
        failures: list[str] = []
        missing: list[str] = []
        for name in self._config.maintenance.reindexer_index_names:
            if not await ex.index_exists(name):
                missing.append(name)
                continue
            try:
                await self._reindex(ex, name)
            except Exception as exc:
                self.logger.error("reindexer: rebuilding %s failed: %s", name, exc)
                failures.append(f"{name}: {type(exc).__name__}: {exc}")
        if missing:
            self.logger.warning(
                "reindexer: configured indexes do not exist (run migrations or change "
                "reindexer_index_names): %s",
                ", ".join(missing),
            )
        if failures:
            raise RuntimeError("; ".join(failures))

    async def _reindex(self, ex: Executor, name: str) -> None:
        leftovers = await ex.index_reindex_artifacts(name)
        if leftovers:
            self.logger.warning(
                "reindexer: %s has leftovers of an interrupted rebuild (%s); skipped",
                name,
                ", ".join(leftovers),
            )
            return
        try:
            with anyio.fail_after(self._config.maintenance.reindexer_timeout):
                await ex.index_reindex(name)
        except BaseException:
            with anyio.CancelScope(shield=True), anyio.move_on_after(REINDEX_CLEANUP_TIMEOUT):
                try:
                    for artifact in await ex.index_reindex_artifacts(name):
                        await ex.index_drop_if_exists(artifact)
                except DatabaseError as exc:
                    self.logger.error("reindexer: dropping leftovers of %s failed: %s", name, exc)
            raise
        self.reindexed.append(name)
        self.logger.info("reindexer: rebuilt %s", name)
