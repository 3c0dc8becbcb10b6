"""One producer per queue: claims jobs for its worker pool, and follows the queue's controls.

A producer composes three parts, each with one responsibility:

- the fetch loop here, paced by a :class:`~._pacing.FetchPacer` (pure logic: when to claim
  and how many rows, cooldowns, refills of freed slots, rows claimed ahead);
- the queue's :class:`~._pool.WorkerPool`, which runs what was claimed and is the one owner
  of the attempts;
- control and notifications: insert notifications wake the fetch loop, control messages
  pause, resume and cancel, settings polls and the queue's keep-alive.

Its lifetime is nested scopes: services (notifications, settings, keep-alive) ⊃ the worker
pool ⊃ the fetch scope. ``stop_fetching()`` cancels the fetch scope, and the loop checks it
before every claim, so no claim begins afterwards; the pool then finishes what was claimed
and returns, and the services are cancelled. Cancellation of the enclosing scope (timeout
escalation, stop-and-cancel) reaches the pool, which interrupts running jobs and gives back
the rows never begun.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._errors import DatabaseError
from .._events import Event, EventHub, EventKind
from .._job import JobRow
from .._logging import job_extra, queue_extra
from ..drivers import TOPIC_CONTROL, TOPIC_INSERT, Driver, Notification
from ._attempt import CancelReason
from ._completer import Completer, Finished
from ._pacing import FetchPacer
from ._pool import WorkerPool
from ._runner import JobRunner
from ._util import Backoff, Wakeup

if TYPE_CHECKING:
    from .._config import ClientConfig
    from ._notifier import Notifier

__all__ = ["Producer"]

logger = logging.getLogger("river_anyio.producer")

HOT_OPERATION_TIMEOUT = 10.0
MAX_ATTEMPTED_BY = 100
QUEUE_REPORT_INTERVAL = 600.0
QUEUE_SETTINGS_POLL = 2.0


class Producer:
    """Works one queue. Started with ``await tg.start(producer.run)``."""

    def __init__(
        self,
        *,
        queue: str,
        config: ClientConfig,
        driver: Driver,
        runner: JobRunner,
        completer: Completer,
        send: MemoryObjectSendStream[Finished],
        events: EventHub,
        notifier: Notifier | None,
    ) -> None:
        self.queue = queue
        self._config = config
        self._driver = driver
        self._completer = completer
        self._send = send
        self._events = events
        self._notifier = notifier
        self._kinds = config.workers.kinds() if config.fetch_only_known_kinds else None
        self._pacer = FetchPacer(
            max_workers=config.queues[queue].max_workers,
            cooldown=config.queue_cooldown(queue),
            poll_interval=config.queue_poll_interval(queue),
            clock=anyio.current_time,
        )
        self._pool = WorkerPool(
            runner=runner,
            max_workers=config.queues[queue].max_workers,
            name=f"river worker {queue}",
            on_low_water=self._refill,
        )
        self._wake = Wakeup()
        #: the fetch loop's lifetime: cancelled by ``stop_fetching()``
        self._fetching = anyio.CancelScope()
        self._paused = False
        self._backoff = Backoff()
        self.fetches = 0

    # --- controls (called by the supervisor and the notifier) ---------------------------------

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def active_jobs(self) -> int:
        return len(self._pool)

    def stop_fetching(self) -> None:
        """Stop claiming jobs; running jobs carry on. No claim begins after this returns."""
        self._fetching.cancel("client stopping")

    def trigger(self) -> None:
        """Ask for a fetch (subject to the cooldown)."""
        self._wake.set()

    def _refill(self) -> None:
        """The pool has room worth a claim: ask for one now (bypassing the cooldown)."""
        self._pacer.refill()
        self._wake.set()

    def cancel_job(self, job_id: int) -> bool:
        """Cancel a running job of this producer (a remote cancel); True if it was running."""
        attempt = self._pool.cancel(job_id, CancelReason.REMOTE)
        if attempt is None:
            return False
        extra = job_extra("job_cancel_remote", attempt.row, self._client_id)
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
            self._pacer.resumed()
            self._wake.set()

    async def reconcile(self) -> None:
        """After missed notifications: re-poll the queue, and cancel running jobs that were
        cancelled remotely meanwhile."""
        self.trigger()
        ids = self._pool.job_ids()
        if not ids:
            return
        try:
            rows = await self._driver.executor().job_list(ids=ids, limit=len(ids))
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
            try:
                async with anyio.create_task_group() as work:
                    await work.start(self._pool.run, name=f"river jobs {self.queue}")
                    with self._fetching:
                        try:
                            # The start-up claim, before the producer counts as started: a
                            # stop that follows the start finds no claim of it in flight,
                            # which could take rows inserted after the stop.
                            self._pacer.fetching()
                            await anyio.lowlevel.checkpoint_if_cancelled()
                            delay = await self._fetch_once()
                        finally:
                            task_status.started()
                        await self._fetch_loop(delay)
                    # no more claims: idle workers leave, busy ones finish what is claimed
                    self._pool.close()
            finally:
                # a claim that returned after the pool was cancelled left its rows unbegun
                await self._pool.give_back()
            # every job has finished and been handed to the completer
            services.cancel_scope.cancel("producer stopped")

    async def _fetch_loop(self, delay: float) -> None:
        """Claim whenever the pacer says so, until the fetch scope is cancelled. ``delay``:
        the back-off after a failed claim, else 0."""
        pacer = self._pacer
        wake = self._wake
        while True:
            if delay:
                pacer.failed(delay)
                wake.clear()
                await anyio.sleep(delay)
            if (idle := pacer.idle_time()) > 0:
                with anyio.move_on_after(idle):
                    await wake.wait()
            # the guard against notification storms (refills of freed slots bypass it)
            if (wait := pacer.cooldown()) > 0:
                await anyio.sleep(wait)
            pacer.fetching()
            wake.clear()
            # A wake-up may return without a checkpoint: once fetching was stopped, no claim.
            await anyio.lowlevel.checkpoint_if_cancelled()
            delay = await self._fetch_once()

    async def _fetch_once(self) -> float:
        """Claim into free slots; returns a back-off delay after a failure, else 0."""
        if self._paused:
            return 0.0
        pool = self._pool
        pacer = self._pacer
        # rows claimed ahead may make a claim up to (1 + PREFETCH_MAX) × max_workers: fewer,
        # larger claims
        limit = pacer.claim_size(len(pool))
        if limit <= 0:
            pool.low_water = pacer.full()
            return 0.0
        self.fetches += 1
        try:
            rows = await self._claim(limit)
        except (DatabaseError, TimeoutError) as exc:
            return self._claim_failed(exc)
        self._backoff.reset()
        pool.dispatch(rows)
        pool.low_water = pacer.claimed(len(rows), limit, len(pool), pool.finished)
        if len(rows) < limit:
            self._completer.flush_soon()  # the queue is drained: write results promptly
        return 0.0

    async def _claim(self, limit: int) -> list[JobRow]:
        # Shielded: a claim cut short after the server committed would strand its jobs.
        with anyio.CancelScope(shield=True), anyio.fail_after(HOT_OPERATION_TIMEOUT):
            rows = await self._driver.executor().job_get_available(
                queue=self.queue,
                max_to_lock=limit,
                client_id=self._client_id,
                max_attempted_by=MAX_ATTEMPTED_BY,
                kinds=self._kinds,
            )
        return rows

    def _claim_failed(self, exc: DatabaseError | TimeoutError) -> float:
        """A claim failed (its rows may or may not be claimed): log it, and return the
        back-off delay before the next one."""
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
        return delay

    @property
    def _client_id(self) -> str:
        return self._config.id

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
                    if payload.get("queue") == self.queue:
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
