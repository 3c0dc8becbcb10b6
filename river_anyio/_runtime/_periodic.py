"""The periodic job enqueuer: a leader-only service inserting the client's periodic jobs.

It follows River's ``PeriodicJobEnqueuer``. A run of :meth:`PeriodicEnqueuer.run` is one
leadership term: it starts every schedule afresh from now (inserting ``run_on_start`` jobs at
once), sleeps until the soonest run, then inserts every job due within 100 ms in one
transaction, through the client's insert path (unique options, middleware, hooks and insert
notifications apply), with ``scheduled_at`` set to the planned run time and River's periodic
metadata. The next run is computed from the planned time, not from now, so schedules do not
drift. Jobs added or removed while it runs wake it up.

Faults never end the service: a transient database error (connection lost, pool timeout,
SQLite busy, a statement or the 30 s batch timeout) retries the same batch with back-off; any
other failure skips that batch, as River does. Both are logged and reported as
``maintenance_failed`` events.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import zoneinfo
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio
import attrs
from anyio.abc import TaskStatus

from .._errors import DatabaseError, ValidationError
from .._events import Event, EventHub, EventKind
from .._insert import build_insert_params
from .._job import InsertOpts
from .._logging import client_extra
from .._periodic import PeriodicJob, PeriodicJobHandle, PeriodicJobs, PeriodicJobsStartParams
from ._clock import Clock, SystemClock, sleep_until
from ._util import Backoff, call_hook

if TYPE_CHECKING:
    from .._client import Client
    from ..drivers import JobInsertParams

__all__ = ["PeriodicEnqueuer", "local_zone"]

logger = logging.getLogger("river_anyio.maintenance.periodic")

SERVICE = "periodic_job_enqueuer"
#: Jobs due within this margin of now are inserted in the same batch (River: 100 ms).
DUE_MARGIN = dt.timedelta(milliseconds=100)
#: How long to sleep when no job has a next run (River: 24 h).
IDLE_WAIT = dt.timedelta(hours=24)
#: Time allowed for one batch's transaction (River's maintenance TimeoutDefault).
BATCH_TIMEOUT = 30.0
_UTC = dt.UTC


@functools.cache
def local_zone() -> dt.tzinfo:
    """The process's local zone as Go's ``time.Local`` finds it: ``$TZ`` (empty → UTC, unknown →
    UTC), else /etc/localtime, else the current UTC offset. Reads files: call off the loop."""
    if "TZ" in os.environ:
        name = os.environ["TZ"].removeprefix(":")
        if not name:
            return _UTC
        try:
            if name.startswith("/"):
                with open(name, "rb") as f:
                    return zoneinfo.ZoneInfo.from_file(f, key=name)
            return zoneinfo.ZoneInfo(name)
        except (OSError, ValueError, zoneinfo.ZoneInfoNotFoundError):
            return _UTC
    try:
        with open("/etc/localtime", "rb") as f:
            return zoneinfo.ZoneInfo.from_file(f, key="localtime")
    except (OSError, ValueError):
        pass
    # no zone database entry for the local zone (Windows): its current fixed offset
    return dt.datetime.now().astimezone().tzinfo or _UTC


def _utc(t: dt.datetime) -> dt.datetime:
    # Aware datetimes sharing a tzinfo compare and subtract by wall time (ignoring fold):
    # everything the enqueuer compares is moved to UTC first.
    return t.astimezone(_UTC)


@attrs.define(eq=False)
class PeriodicEnqueuer:
    """Inserts ``client.periodic_jobs`` on their schedules while :meth:`run` runs (one
    leadership term per run; state does not carry over between runs)."""

    client: Client
    clock: Clock = attrs.field(factory=SystemClock)
    events: EventHub | None = None
    #: The first pause after a transient fault (doubling to 30 s).
    retry_first_pause: float = 0.25
    #: The service's name in logs and ``maintenance_failed`` events.
    name: str = SERVICE
    #: The client's hooks: their ``periodic_jobs_start`` methods are awaited as each run
    #: starts, before ``run_on_start`` jobs are inserted.
    hooks: Sequence[object] = ()

    _next: dict[PeriodicJobHandle, dt.datetime | None] = attrs.field(init=False, factory=dict)
    _last_seen: int = attrs.field(init=False, default=-1)
    _dirty: bool = attrs.field(init=False, default=False)
    _sleep_scope: anyio.CancelScope | None = attrs.field(init=False, default=None)
    _zone: dt.tzinfo = attrs.field(init=False, default=_UTC)
    #: Set (and replaced) each time the loop has caught up and goes to sleep: tests wait on it
    #: after changing the job set (River's test signals).
    _caught_up: anyio.Event | None = attrs.field(init=False, default=None)

    @property
    def jobs(self) -> PeriodicJobs:
        return self.client.periodic_jobs

    def next_runs(self) -> dict[PeriodicJobHandle, dt.datetime | None]:
        """This term's planned next run per job (None: the schedule never fires again)."""
        return dict(self._next)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._zone = await anyio.to_thread.run_sync(local_zone)
        self._next = {}
        self._last_seen = -1
        self._dirty = False
        self._caught_up = anyio.Event()
        unsubscribe = self.jobs._subscribe(self._on_change)
        logger.debug("periodic job enqueuer started (%d jobs)", len(self.jobs))
        try:
            await self._start_hooks()
            await self._schedule_new_jobs()
            task_status.started()
            while True:
                await self._sleep()
                await self._insert_due()
                await self._schedule_new_jobs()
        finally:
            unsubscribe()
            self._sleep_scope = None
            logger.debug("periodic job enqueuer stopped")

    async def _start_hooks(self) -> None:
        """River's HookPeriodicJobsStart: each hook's ``periodic_jobs_start(params)``, in
        order. One that raises is logged and ignored, as every river_anyio hook (River's
        aborts the enqueuer's start)."""
        params: PeriodicJobsStartParams | None = None
        for hook in self.hooks:
            fn = getattr(hook, "periodic_jobs_start", None)
            if not callable(fn):
                continue
            if params is None:
                jobs = tuple(job for _, job in self.jobs._items())
                params = PeriodicJobsStartParams(client_id=self.client.id, jobs=jobs)
            await call_hook(
                fn,
                params,
                logger=logger,
                what=f"hook {type(hook).__name__}.periodic_jobs_start",
                extra=client_extra("hook_failed", self.client.id),
            )

    # --- the loop ---------------------------------------------------------------------------

    def _on_change(self) -> None:
        self._dirty = True
        if self._sleep_scope is not None:
            self._sleep_scope.cancel("periodic jobs changed")

    async def _sleep(self) -> None:
        if not self._dirty:
            planned = [_utc(t) for t in self._next.values() if t is not None]
            until = min(planned) if planned else _utc(self.clock.now()) + IDLE_WAIT
            if self._caught_up is not None:
                self._caught_up.set()
                self._caught_up = anyio.Event()
            with anyio.CancelScope() as scope:
                self._sleep_scope = scope
                try:
                    await sleep_until(self.clock, until)
                finally:
                    self._sleep_scope = None
        self._dirty = False

    async def _schedule_new_jobs(self) -> None:
        """Forget removed jobs; give jobs not seen yet this term their first run time, and
        insert those that run on start."""
        now = self.clock.now().astimezone(self._zone)
        items = self.jobs._items()
        live = {handle for handle, _ in items}
        for handle in [h for h in self._next if h not in live]:
            del self._next[handle]
        batch: list[JobInsertParams] = []
        for handle, job in items:
            if handle.value <= self._last_seen:
                continue
            self._last_seen = handle.value
            self._next[handle] = self._next_after(job, now)
            if job.run_on_start:
                params = self._build(job, now)
                if params is not None:
                    batch.append(params)
        await self._insert(batch)

    async def _insert_due(self) -> None:
        horizon = _utc(self.clock.now()) + DUE_MARGIN
        batch: list[JobInsertParams] = []
        for handle, job in self.jobs._items():
            planned = self._next.get(handle)
            if planned is None or _utc(planned) >= horizon:
                continue
            params = self._build(job, planned)
            if params is not None:
                batch.append(params)
            self._next[handle] = self._next_after(job, planned)
        await self._insert(batch)

    def _next_after(self, job: PeriodicJob, after: dt.datetime) -> dt.datetime | None:
        try:
            nxt = job.schedule.next(after)
        except Exception:
            logger.exception(
                "periodic job %s: its schedule raised; no further runs this term",
                job.id or "(no id)",
                extra=client_extra("periodic_schedule_failed", self.client.id),
            )
            return None
        if nxt is not None and (
            not isinstance(nxt, dt.datetime) or nxt.utcoffset() is None or _utc(nxt) <= _utc(after)
        ):
            logger.error(
                "periodic job %s: schedule returned %r for a time after %s; "
                "no further runs this term",
                job.id or "(no id)",
                nxt,
                after,
                extra=client_extra("periodic_schedule_failed", self.client.id),
            )
            return None
        return nxt

    # --- building and inserting -------------------------------------------------------------

    def _build(self, job: PeriodicJob, planned: dt.datetime) -> JobInsertParams | None:
        """One run's row, or None when make_args skips it or fails (logged)."""
        extra = client_extra("periodic_job_skipped", self.client.id)
        try:
            made = job.make_args()
        except Exception:
            logger.exception("periodic job %s: make_args raised; run skipped", job.id, extra=extra)
            return None
        opts = job.opts
        if isinstance(made, tuple):
            if len(made) != 2 or not (made[1] is None or isinstance(made[1], InsertOpts)):
                logger.error(
                    "periodic job %s: make_args must return args, (args, InsertOpts) or None; "
                    "run skipped",
                    job.id,
                    extra=extra,
                )
                return None
            made, run_opts = made
            if run_opts is not None:
                opts = run_opts
        if made is None:
            logger.info(
                "periodic job %s: make_args returned None; run skipped", job.id, extra=extra
            )
            return None
        opts = opts or InsertOpts()
        metadata = dict(opts.metadata or {})
        if job.id is not None:
            metadata["river:periodic_job_id"] = job.id
        metadata["periodic"] = True
        try:
            params = build_insert_params(
                made,
                attrs.evolve(opts, metadata=metadata),
                client_max_attempts=self.client._max_attempts,
                now=self.clock.now,
            )
        except ValidationError as exc:
            logger.error("periodic job %s: %s; run skipped", job.id, exc, extra=extra)
            return None
        if params.scheduled_at is None:
            # River keeps the state it computed (available) and stamps the planned time
            params = attrs.evolve(params, scheduled_at=_utc(planned))
        return params

    async def _insert(self, batch: Sequence[JobInsertParams]) -> None:
        if not batch:
            return
        backoff = Backoff(first=self.retry_first_pause)
        client = self.client
        while True:
            try:
                with anyio.fail_after(BATCH_TIMEOUT):
                    async with client.driver.transaction() as tx:
                        await client._insert_many_on(tx, batch)
            except (DatabaseError, TimeoutError) as exc:
                transient = isinstance(exc, TimeoutError) or exc.transient
                self._failed(exc, len(batch), transient=transient, attempt=backoff.failures + 1)
                if not transient:
                    return
                await anyio.sleep(backoff.next_delay())
                continue
            except Exception as exc:  # middleware or a hook failing: skip, as River
                self._failed(exc, len(batch), transient=False, attempt=backoff.failures + 1)
                return
            client._committed(batch)
            logger.debug("inserted %d periodic jobs", len(batch))
            return

    def _failed(self, exc: BaseException, count: int, *, transient: bool, attempt: int) -> None:
        extra = client_extra("periodic_insert_failed", self.client.id)
        if transient:
            logger.warning(
                "inserting %d periodic jobs failed (attempt %d), retrying: %s",
                count,
                attempt,
                exc,
                extra=extra,
            )
        else:
            logger.error(
                "inserting %d periodic jobs failed; these runs are skipped: %s",
                count,
                exc,
                exc_info=exc,
                extra=extra,
            )
        if self.events is not None:
            self.events.publish(
                Event(
                    kind=EventKind.MAINTENANCE_FAILED,
                    error=f"{type(exc).__name__}: {exc}",
                    details={
                        "service": SERVICE,
                        "jobs": count,
                        "transient": transient,
                        "attempt": attempt,
                    },
                )
            )
