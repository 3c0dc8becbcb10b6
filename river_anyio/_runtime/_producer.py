"""One producer per queue: claims jobs into free worker slots and runs them on its workers.

Fetch triggers (River's): start-up; an insert notification for this queue; the poll timer
every ``fetch_poll_interval`` plus jitter ``U[0, max(interval/10, 10 ms))``; a resume.
Notification- and poll-triggered fetches are rate limited by ``fetch_cooldown``, the guard
against notification storms: up to ``FETCH_BURST`` fetches per cooldown window, so a job
inserted a few milliseconds after another is still picked up at once, while a storm is capped
at ``FETCH_BURST / fetch_cooldown`` fetches per second. Beyond River, freed slots are refilled
promptly while a backlog exists (the last claim filled every free slot): once a worthwhile
share of the slots is free (half of them, at most 25) a claim runs without waiting for the
cooldown, so a busy queue is not capped at one claim per cooldown. While that backlog lasts and
jobs finish quickly, the producer also claims ahead: up to ``PREFETCH_MAX × max_workers``
extra rows, no more than the workers get through in ``PREFETCH_HORIZON`` at the rate measured
between claims, may wait in the ready queue, so the next claim's round trip (several
milliseconds while the database also writes completions) overlaps the jobs being run instead
of following them. Long jobs measure a low rate and get no prefetch.

Claimed jobs run on a pool of at most ``max_workers`` long-lived worker tasks (spawning a
task per job costs more than a short job). Claimed rows wait in one ready queue; workers wake
one another in a chain, so jobs that wait still run concurrently while jobs that never wait
run back to back on one worker, and each worker keeps one cancel scope across its jobs until
a cancellation spends it. Shutdown: ``stop_fetching()`` ends the fetch loop;
the workers then finish what was claimed and leave, and the job nursery waits for them; their
cancellation (timeout escalation or stop-and-cancel) comes from the enclosing scope, and jobs
claimed but not yet started by then are given back as interrupted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._errors import DatabaseError
from .._events import Event, EventHub, EventKind
from .._job import JobRow
from .._limiter import BurstLimiter
from .._logging import job_extra, queue_extra
from ..drivers import TOPIC_CONTROL, TOPIC_INSERT, Driver, Notification
from ._completer import Completer, Finished
from ._executor import Attempt, JobExecutor
from ._recovery import LostClaims
from ._util import REMOTE_CANCEL_REASON, Backoff, Wakeup

if TYPE_CHECKING:
    from .._config import ClientConfig
    from ._notifier import Notifier

__all__ = ["Producer"]

logger = logging.getLogger("river_anyio.producer")

HOT_OPERATION_TIMEOUT = 10.0
MAX_ATTEMPTED_BY = 100
QUEUE_REPORT_INTERVAL = 600.0
QUEUE_SETTINGS_POLL = 2.0
#: Notification- and poll-triggered fetches allowed per ``fetch_cooldown`` window.
FETCH_BURST = 25
#: Claimed-ahead rows are limited to what the workers start within this many seconds...
PREFETCH_HORIZON = 0.05
#: ...and to this many times ``max_workers``.
PREFETCH_MAX = 2


class _Slot:
    """An idle worker's wake-up."""

    __slots__ = ("wake",)

    def __init__(self) -> None:
        self.wake = anyio.Event()


class Producer:
    """Works one queue. Started with ``await tg.start(producer.run)``."""

    def __init__(
        self,
        *,
        queue: str,
        config: ClientConfig,
        driver: Driver,
        executor: JobExecutor,
        completer: Completer,
        send: MemoryObjectSendStream[Finished],
        events: EventHub,
        notifier: Notifier | None,
    ) -> None:
        self.queue = queue
        self._config = config
        self._driver = driver
        self._executor = executor
        self._completer = completer
        self._send = send
        self._events = events
        self._notifier = notifier
        self._max_workers = config.queues[queue].max_workers
        self._cooldown = config.queue_cooldown(queue)
        self._poll_interval = config.queue_poll_interval(queue)
        self._refill_at = max(1, min(25, math.ceil(self._max_workers / 2)))
        self._fetch_limiter = BurstLimiter(self._cooldown, FETCH_BURST, clock=anyio.current_time)
        self._kinds = config.workers.kinds() if config.fetch_only_known_kinds else None
        self._active: dict[int, JobRow] = {}
        self._scopes: dict[int, anyio.CancelScope] = {}
        # the job nursery's workers: claimed rows wait in ``_ready`` (and in ``_unstarted``)
        # until a worker begins them
        self._unstarted: dict[int, JobRow] = {}
        self._ready: deque[JobRow] = deque()
        self._idle: list[_Slot] = []
        self._workers = 0
        self._kicked = False
        self._jobs: TaskGroup | None = None
        self._closing = False
        self._wake = Wakeup()
        self._urgent = False
        self._backlog = False
        # rows that may be claimed beyond the free slots (see the module docstring), and the
        # measurements behind it: jobs finished, at the previous claim's end
        self._prefetch = 0
        self._finished = 0
        self._last_claim: tuple[float, int] | None = None
        self._paused = False
        self._fetch_scope: anyio.CancelScope | None = None
        self._stopping = False
        self._backoff = Backoff()
        self._lost_claims = LostClaims(driver, queue=queue, client_id=config.id)
        self.fetches = 0

    # --- controls (called by the supervisor and the notifier) ---------------------------------

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def active_jobs(self) -> int:
        return len(self._active)

    def stop_fetching(self) -> None:
        """Stop claiming jobs; running jobs carry on."""
        self._stopping = True
        if self._fetch_scope is not None:
            self._fetch_scope.cancel("client stopping")

    def trigger(self) -> None:
        """Ask for a fetch (subject to the cooldown)."""
        self._wake.set()

    def cancel_job(self, job_id: int) -> bool:
        """Cancel a running job of this producer (a remote cancel); True if it was running."""
        scope = self._scopes.get(job_id)
        if scope is None:
            return False
        self._executor.remote_cancelled.add(job_id)
        self._executor.spent.add(job_id)
        scope.cancel(REMOTE_CANCEL_REASON)
        row = self._active.get(job_id)
        if row is not None:
            extra = job_extra("job_cancel_remote", row, self._client_id)
        else:
            extra = queue_extra("job_cancel_remote", self.queue, self._client_id)
            extra["river_job_id"] = job_id
        logger.warning("job %d cancelled remotely", job_id, extra=extra)
        return True

    def set_paused(self, paused: bool) -> None:
        if paused == self._paused:
            return
        self._paused = paused
        kind = EventKind.QUEUE_PAUSED if paused else EventKind.QUEUE_RESUMED
        logger.info(
            "queue %s %s",
            self.queue,
            "paused" if paused else "resumed",
            extra=queue_extra(kind.value, self.queue, self._client_id),
        )
        self._events.publish(Event(kind=kind, queue=self.queue))
        if not paused:
            self._urgent = True
            self._wake.set()

    async def reconcile(self) -> None:
        """After missed notifications: re-poll the queue, and cancel running jobs that were
        cancelled remotely meanwhile."""
        self.trigger()
        if not self._active:
            return
        try:
            rows = await self._driver.executor().job_list(
                ids=list(self._active), limit=len(self._active)
            )
        except DatabaseError as exc:
            logger.warning(
                "producer %s: reconciling cancellations failed: %s",
                self.queue,
                exc,
                extra=queue_extra("reconcile_failed", self.queue, self._client_id),
            )
            return
        for row in rows:
            if "cancel_attempted_at" in row.metadata:
                self.cancel_job(row.id)
        if not self._config.poll_only:
            await self._poll_settings_once()

    # --- the service --------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        # The completer returns once every producer has closed its stream: close it however
        # this ends, even when the start fails.
        with self._send:
            with anyio.fail_after(HOT_OPERATION_TIMEOUT):
                row = await self._driver.executor().queue_create_or_set_updated_at(name=self.queue)
            self._paused = row.paused_at is not None
            receive = self._notifier.subscribe(self) if self._notifier is not None else None
            # This frame closes ``receive`` too: a notification task cancelled before it first
            # runs (asyncio) would leave it open.
            with receive if receive is not None else contextlib.nullcontext():
                await self._serve(receive, task_status)
            if self._notifier is not None:
                self._notifier.unsubscribe(self)

    async def _serve(
        self,
        receive: MemoryObjectReceiveStream[Notification] | None,
        task_status: TaskStatus[None],
    ) -> None:
        async with anyio.create_task_group() as services:
            if receive is not None:
                services.start_soon(self._notifications, receive)
            elif self._config.poll_only:
                services.start_soon(self._poll_settings)
            services.start_soon(self._report_queue)
            services.start_soon(self._executor.watch_timeouts)
            try:
                async with anyio.create_task_group() as jobs:
                    try:
                        with anyio.CancelScope() as self._fetch_scope:
                            task_status.started()
                            if not self._stopping:
                                await self._fetch_loop(jobs)
                    finally:
                        # no more claims: idle workers leave, busy ones finish what is claimed
                        self._closing = True
                        while self._idle:
                            self._idle.pop().wake.set()
            finally:
                if self._unstarted:  # claimed but never started: the job nursery was cancelled
                    with anyio.CancelScope(shield=True):
                        for row in list(self._unstarted.values()):
                            del self._unstarted[row.id]
                            self._active.pop(row.id, None)
                            await self._executor.give_back(row)
            # every job has finished and been handed to the completer
            services.cancel_scope.cancel("producer stopped")

    def _poll_delay(self) -> float:
        p = self._poll_interval
        return p + random.uniform(0, max(p / 10, 0.01))

    async def _fetch_loop(self, jobs: TaskGroup) -> None:
        next_poll = anyio.current_time() + self._poll_delay()
        self._urgent = True  # fetch at start
        while True:
            if not self._urgent:
                with anyio.move_on_after(max(0.0, next_poll - anyio.current_time())):
                    await self._wake.wait()
            now = anyio.current_time()
            if now >= next_poll:
                next_poll = now + self._poll_delay()
            if not self._urgent:
                # the guard against notification storms (refills of freed slots bypass it)
                if (wait := self._fetch_limiter.delay()) > 0:
                    await anyio.sleep(wait)
                self._fetch_limiter.record()
            self._urgent = False
            self._wake.clear()
            delay = await self._fetch_once(jobs)
            if delay:
                next_poll = anyio.current_time() + delay
                self._wake.clear()
                self._urgent = False
                await anyio.sleep(delay)

    async def _fetch_once(self, jobs: TaskGroup) -> float:
        """Claim into free slots; returns a back-off delay after a failure, else 0."""
        lost = self._lost_claims
        if lost.pending_since is not None and not await lost.recover(self._active):
            return self._backoff.next_delay()  # a failed claim is not recovered yet
        if self._paused:
            return 0.0
        # rows claimed ahead may make a claim up to (1 + PREFETCH_MAX) × max_workers: fewer,
        # larger claims
        limit = self._max_workers + self._prefetch - len(self._active)
        if limit <= 0:
            self._backlog = True
            return 0.0
        self.fetches += 1
        try:
            # Shielded: a claim cut short after the server committed would strand its jobs.
            with anyio.CancelScope(shield=True), anyio.fail_after(HOT_OPERATION_TIMEOUT):
                rows = await self._driver.executor().job_get_available(
                    queue=self.queue,
                    max_to_lock=limit,
                    client_id=self._client_id,
                    max_attempted_by=MAX_ATTEMPTED_BY,
                    kinds=self._kinds,
                )
        except (DatabaseError, TimeoutError) as exc:
            delay = self._backoff.next_delay()
            transient = isinstance(exc, TimeoutError) or exc.transient
            logger.log(
                logging.WARNING if transient else logging.ERROR,
                "producer %s: fetching jobs failed (retrying in %.2fs): %s",
                self.queue,
                delay,
                exc,
                extra=queue_extra("fetch_failed", self.queue, self._client_id),
            )
            if transient:  # it may have committed: give its rows back, at once if possible
                # (it began at most HOT_OPERATION_TIMEOUT ago: no clock read per claim)
                lost.failed(anyio.current_time() - HOT_OPERATION_TIMEOUT)
                await lost.recover(self._active)
            return delay
        lost.claimed(rows)
        self._backoff.reset()
        self._dispatch(jobs, rows)
        self._backlog = len(rows) == limit
        self._plan_prefetch()
        if not self._backlog:
            self._completer.flush_soon()  # the queue is drained: write results promptly
        elif not self._stopping and self._room_to_claim():
            # room to claim ahead already: the next claim overlaps the jobs just claimed
            self._backlog = False
            self._urgent = True
        return 0.0

    def _room_to_claim(self) -> bool:
        """Whether a claim is worthwhile: half the slots free (at most 25), or while rows
        are claimed ahead, room for as many rows as may be claimed ahead, so the claim's round
        trip runs while that many rows are still ready."""
        room = self._max_workers + self._prefetch - len(self._active)
        return room >= max(self._refill_at, self._prefetch)

    def _plan_prefetch(self) -> None:
        """After a claim: how many rows the next claims may take beyond the free slots.

        Only while a backlog lasts, and only as many as the workers finish within
        ``PREFETCH_HORIZON`` at the rate measured since the previous claim, so rows claimed
        ahead start promptly and slow jobs get none.
        """
        now = anyio.current_time()
        previous, self._last_claim = self._last_claim, (now, self._finished)
        self._prefetch = 0
        if not self._backlog or previous is None:
            return
        elapsed = now - previous[0]
        if elapsed <= 0:
            return
        rate = (self._finished - previous[1]) / elapsed
        self._prefetch = min(PREFETCH_MAX * self._max_workers, int(rate * PREFETCH_HORIZON))

    @property
    def _client_id(self) -> str:
        return self._config.id

    def _dispatch(self, jobs: TaskGroup, rows: list[JobRow]) -> None:
        """Queue claimed rows for the workers and get one worker going on them."""
        active = self._active
        unstarted = self._unstarted
        for row in rows:
            active[row.id] = row
            unstarted[row.id] = row
        self._ready.extend(rows)
        self._jobs = jobs
        self._kick()

    def _kick(self) -> None:
        """Get one more worker onto the ready rows, unless one is on its way already.

        Workers wake one another in a chain: a worker that takes a row while more are ready
        kicks the next worker before it begins its job. Jobs that wait run concurrently, one
        more starting each scheduling round, while jobs that never wait are run back to back
        by the first worker, without a task switch per job.
        """
        if self._kicked or not self._ready:
            return
        if self._idle:
            self._kicked = True
            self._idle.pop().wake.set()
        elif self._workers < self._max_workers and self._jobs is not None:
            self._kicked = True
            self._workers += 1
            self._jobs.start_soon(self._worker, name=f"river worker {self.queue}")

    async def _worker(self) -> None:
        unstarted = self._unstarted
        ready = self._ready
        idle = self._idle
        executor = self._executor
        begin = executor.begin
        run = executor.run
        end = executor.end
        scopes = self._scopes
        slot = _Slot()
        self._kicked = False
        try:
            while True:
                # One cancel scope serves this worker's jobs one after the other, until a
                # remote cancel or a timeout cancels it for the job it is running: that job
                # is then concluded outside it and the next job gets a fresh scope.
                attempt: Attempt | None = None
                try:
                    with anyio.CancelScope() as scope:
                        while True:
                            if not ready:
                                if self._closing:
                                    return
                                slot.wake = anyio.Event()
                                idle.append(slot)
                                await slot.wake.wait()
                                self._kicked = False
                                continue
                            row = ready.popleft()
                            # not there: given back already (the nursery was cancelled)
                            if unstarted.pop(row.id, None) is None:
                                continue
                            if ready:
                                self._kick()
                            attempt = begin(row)
                            if attempt.job is not None and await run(attempt, scope, scopes):
                                break  # the scope is spent: conclude the job outside it
                            done, attempt = attempt, None
                            try:
                                await end(done)
                            finally:
                                claim = self._job_done(row.id)
                            if claim:
                                # let the fetch loop send its claim now, so its round trip
                                # overlaps the jobs still ready (these may never yield)
                                await anyio.lowlevel.cancel_shielded_checkpoint()
                except anyio.get_cancelled_exc_class():
                    if attempt is not None:  # the client cancelled it
                        try:
                            await executor.interrupt(attempt)
                        finally:
                            self._job_done(attempt.row.id)
                    raise
                if attempt is not None:  # its own cancellation spent the scope
                    try:
                        await end(attempt)
                    finally:
                        self._job_done(attempt.row.id)
        finally:
            self._workers -= 1
            if slot in idle:
                idle.remove(slot)

    def _job_done(self, job_id: int) -> bool:
        """Forget a finished job; True if that asked the fetch loop for a claim."""
        self._active.pop(job_id, None)
        self._finished += 1
        if self._backlog and not self._stopping and self._room_to_claim():
            self._backlog = False
            self._urgent = True
            self._wake.set()
            return True
        return False

    # --- notifications and periodic work ------------------------------------------------------

    async def _notifications(self, receive: MemoryObjectReceiveStream[Notification]) -> None:
        async with receive:
            async for note in receive:
                try:
                    payload: Any = json.loads(note.payload)
                except ValueError:
                    logger.warning(
                        "producer %s: malformed notification %r",
                        self.queue,
                        note.payload,
                        extra=queue_extra("notification_malformed", self.queue, self._client_id),
                    )
                    continue
                if not isinstance(payload, dict):
                    continue
                if note.topic == TOPIC_INSERT:
                    if payload.get("queue") == self.queue and not self._stopping:
                        self.trigger()
                elif note.topic == TOPIC_CONTROL:
                    self._control(payload)

    def _control(self, payload: dict[str, Any]) -> None:
        action = payload.get("action")
        queue = payload.get("queue")
        if action == "cancel":
            job_id = payload.get("job_id")
            if queue == self.queue and isinstance(job_id, int):
                self.cancel_job(job_id)
        elif action in ("pause", "resume") and queue in (self.queue, "*"):
            self.set_paused(action == "pause")
        # metadata_changed and unknown actions: nothing to do in the open-source runtime

    async def _poll_settings(self) -> None:
        while True:
            await anyio.sleep(QUEUE_SETTINGS_POLL)
            await self._poll_settings_once()

    async def _poll_settings_once(self) -> None:
        try:
            with anyio.fail_after(HOT_OPERATION_TIMEOUT):
                row = await self._driver.executor().queue_get(self.queue)
        except (DatabaseError, TimeoutError) as exc:
            logger.warning(
                "producer %s: reading queue settings failed: %s",
                self.queue,
                exc,
                extra=queue_extra("queue_settings_failed", self.queue, self._client_id),
            )
            return
        if row is not None:
            self.set_paused(row.paused_at is not None)

    async def _report_queue(self) -> None:
        await anyio.sleep(random.uniform(0, 1))
        while True:
            await anyio.sleep(QUEUE_REPORT_INTERVAL)
            try:
                with anyio.fail_after(HOT_OPERATION_TIMEOUT):
                    await self._driver.executor().queue_create_or_set_updated_at(name=self.queue)
            except (DatabaseError, TimeoutError) as exc:
                logger.warning(
                    "producer %s: queue keep-alive failed: %s",
                    self.queue,
                    exc,
                    extra=queue_extra("queue_keepalive_failed", self.queue, self._client_id),
                )
