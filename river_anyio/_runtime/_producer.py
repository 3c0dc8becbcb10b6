"""One producer per queue: claims jobs for its worker pool, and follows the queue's controls.

A producer composes three parts, each with one responsibility:

- the fetch loop here, paced by a :class:`~._pacing.FetchPacer` (pure logic: when to claim
  and how many rows, cooldowns, refills of freed slots, rows claimed ahead);
- the queue's :class:`~._pool.WorkerPool`, which runs what was claimed and is the one owner
  of the attempts;
- the queue's :class:`~._control.QueueControl`: control messages pause, resume and cancel,
  settings polls and the queue's keep-alive. Insert notifications for the queue wake the
  fetch loop directly: the notifier routes them to :meth:`Producer.trigger`.

Remote cancels heard while a claim is in flight are kept for the jobs it returns, and
``jobs_claimed`` hooks hold a claim's rows in the pool (where cancels reach them) until they
return: such jobs start cancelled, as River's executors cancelled before they run.

Its lifetime is nested scopes: services (notifications, settings, keep-alive) ⊃ the worker
pool ⊃ the fetch scope. ``stop_fetching()`` cancels the fetch scope, and the loop checks it
before every claim, so no claim begins afterwards; the pool then finishes what was claimed
and returns, and the services are cancelled. Cancellation of the enclosing scope (timeout
escalation, stop-and-cancel) reaches the pool, which interrupts running jobs and gives back
the rows never begun.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._errors import DatabaseError, MigrationError
from .._events import EventHub
from .._job import JobRow
from .._logging import queue_extra
from .._queue_limits import LIMITS_TABLE, limits_table_missing
from ..drivers import Driver, Notification
from ._completer import Completer, Finished
from ._control import HOT_OPERATION_TIMEOUT, NOTIFICATION_POLL, QUEUE_POLL, QueueControl
from ._health import Contact
from ._pacing import NO_LOW_WATER, FetchPacer
from ._pool import WorkerPool
from ._recovery import LostClaims
from ._runner import JobRunner
from ._util import Backoff, Wakeup, call_hook

if TYPE_CHECKING:
    from .._config import ClientConfig
    from ._notifier import Notifier

__all__ = ["Producer"]

logger = logging.getLogger("river_anyio.producer")

MAX_ATTEMPTED_BY = 100


def _bounded_shield() -> anyio.CancelScope:
    """A scope shielded from outside cancellation that cancels itself after
    ``HOT_OPERATION_TIMEOUT``: a claim is never cut short by a stop, and never hangs."""
    return anyio.CancelScope(shield=True, deadline=anyio.current_time() + HOT_OPERATION_TIMEOUT)


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
        #: the ``jobs_claimed`` hooks: a claim's rows are held until they return
        self._claim_hooks = tuple(
            (type(h).__name__, h.jobs_claimed)
            for h in config.hooks
            if callable(getattr(h, "jobs_claimed", None))
        )
        queue_config = config.queues[queue]
        #: the queue's global limits, when it has any (its claims take the limited path)
        self._limits = queue_config if queue_config.limited else None
        self._pacer = FetchPacer(
            max_workers=queue_config.max_workers,
            cooldown=config.queue_cooldown(queue),
            poll_interval=config.queue_poll_interval(queue),
            clock=anyio.current_time,
            fixed_prefetch=config.fixed_prefetch,
            prefetch=config.claim_ahead and self._limits is None,
        )
        self._pool = WorkerPool(
            runner=runner,
            max_workers=config.queues[queue].max_workers,
            name=f"river worker {queue}",
            on_low_water=self._refill,
            on_empty=self._emptied,
        )
        self._queue_control = QueueControl(
            queue=queue,
            config=config,
            driver=driver,
            events=events,
            pool=self._pool,
            trigger=self.trigger,
            resumed=self._resumed,
        )
        self._wake = Wakeup()
        #: the listener is back after losing its connection: a back-off ends early
        self._reconnected = Wakeup()
        #: the fetch loop's lifetime: cancelled by ``stop_fetching()``
        self._fetching = anyio.CancelScope()
        self._backoff = Backoff()
        self._lost_claims = LostClaims(driver, queue=queue, client_id=config.id)
        self.fetches = 0
        self.fetch_turns = 0
        #: claims failing (its successes are the pacer's ``last_claim_at``)
        self.contact = Contact()

    # --- controls (called by the supervisor and the notifier) ---------------------------------

    @property
    def paused(self) -> bool:
        return self._queue_control.paused

    @property
    def last_claim_at(self) -> float | None:
        return self._pacer.last_claim_at

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

    def _emptied(self) -> None:
        """The pool's last attempt ended: after a claim that found the queue drained, its
        result is the last of the burst; have it written without waiting for a quiet tick."""
        if self._pacer.drained:
            self._completer.flush_on_arrival()

    def _resumed(self) -> None:
        self._pacer.resumed()
        self._wake.set()

    def cancel_job(self, job_id: int) -> bool:
        """Cancel a running job of this producer (a remote cancel); True if it was held and not
        finished (one not begun starts cancelled)."""
        return self._queue_control.cancel_job(job_id)

    def set_paused(self, paused: bool) -> None:
        self._queue_control.set_paused(paused)

    async def reconcile(self) -> None:
        """After missed notifications: re-poll the queue, and cancel running jobs that were
        cancelled remotely meanwhile. The listener reconnected, so the database answers
        again: a claim backing off after failures is retried now."""
        self._reconnected.set()
        await self._queue_control.reconcile()

    def _control(self, payload: dict[str, Any]) -> None:
        """A control action (a notification, or taken locally without a listener)."""
        self._queue_control.control(payload)

    # --- the service --------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        # The completer returns once every producer has closed its stream: close it however
        # this ends, even when the start fails.
        with self._send:
            with anyio.fail_after(HOT_OPERATION_TIMEOUT):
                executor = self._driver.executor()
                if self._limits is not None and not await executor.table_exists(LIMITS_TABLE):
                    raise MigrationError(limits_table_missing(self.queue))
                row = await executor.queue_create_or_set_updated_at(name=self.queue)
            self._queue_control.paused = row.paused_at is not None
            notifier = self._notifier
            receive = None
            if notifier is not None:
                receive = notifier.subscribe(self)
                notifier.route_inserts(self.queue, self.trigger)
            try:
                # This frame closes ``receive`` too: a notification task cancelled before it
                # first runs (asyncio) would leave it open.
                with receive if receive is not None else contextlib.nullcontext():
                    await self._serve(receive, task_status)
            finally:
                if notifier is not None:
                    notifier.unroute_inserts(self.queue)
                    notifier.unsubscribe(self)

    async def _serve(
        self,
        receive: MemoryObjectReceiveStream[Notification] | None,
        task_status: TaskStatus[None],
    ) -> None:
        async with anyio.create_task_group() as services:
            control = self._queue_control
            if receive is not None:
                services.start_soon(control.notifications, receive)
            # River's polls of cancellation requests and settings: the only way without
            # notifications, a fallback for those lost with them
            services.start_soon(control.poll, QUEUE_POLL if receive is None else NOTIFICATION_POLL)
            services.start_soon(control.report_queue)
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
                        # hooks holding the start-up claim's rows do not hold up the start
                        await self._start_held()
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
                with anyio.move_on_after(delay):
                    await self._reconnected.wait()
            if (idle := pacer.idle_time()) > 0:
                with anyio.move_on_after(idle):
                    await wake.wait()
            # the loop runs: the workers stop asking for a claim (and yielding for it)
            self._pool.low_water = NO_LOW_WATER
            # the guard against notification storms (refills of freed slots bypass it)
            if (wait := pacer.cooldown()) > 0:
                await anyio.sleep(wait)
            pacer.fetching()
            wake.clear()
            # A wake-up may return without a checkpoint: once fetching was stopped, no claim.
            await anyio.lowlevel.checkpoint_if_cancelled()
            delay = await self._fetch_once()
            if self._pool.held:
                await self._start_held()

    async def _fetch_once(self) -> float:
        """Claim into free slots; returns a back-off delay after a failure, else 0."""
        try:
            return await self._fetch_turn()
        finally:
            self.fetch_turns += 1

    async def _fetch_turn(self) -> float:
        lost = self._lost_claims
        if lost.pending_since is not None and not await lost.recover(self._pool.job_ids()):
            if self.contact.failing_since is None:
                self.contact.failing_since = anyio.current_time()
            return self._backoff.next_delay()  # a failed claim is not recovered yet
        if self._queue_control.paused:
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
        hold = 0.0
        with self._queue_control.claiming():
            try:
                if self._limits is None:
                    rows = await self._claim(limit)
                else:
                    rows, hold = await self._claim_limited(limit)
            except (DatabaseError, TimeoutError, MigrationError) as exc:
                return await self._claim_failed(exc)
            self._lost_claims.claimed(rows)
            self._backoff.reset()
            self.contact.failing_since = None
            self._reconnected.clear()
            if self._claim_hooks and rows:
                pool.hold(rows)  # started by _start_held once the hooks return
            else:
                pool.dispatch(rows)
        pool.low_water = pacer.claimed(len(rows), limit, len(pool), pool.finished)
        if hold > 0:
            pacer.hold(hold)
        # the queue is drained, or a limit cut the claim (global_max_workers counts rows
        # until their results are written)
        if len(rows) < limit:
            self._completer.flush_soon()  # write results promptly
        return 0.0

    async def _start_held(self) -> None:
        """Await the ``jobs_claimed`` hooks on the rows the last claim holds, then start them,
        however the hooks end (a stop cancelling them starts them too, and a stop that
        cancels jobs gives them back). Cancels arriving meanwhile reach the held jobs, which
        then start cancelled. A hook that raises is logged and ignored."""
        pool = self._pool
        if not pool.held:
            return
        rows = [attempt.row for attempt in pool.held]
        try:
            for name, hook in self._claim_hooks:
                await call_hook(
                    hook,
                    rows,
                    logger=logger,
                    what=f"hook {name}.jobs_claimed",
                    extra=queue_extra("hook_failed", self.queue, self._client_id),
                )
        finally:
            pool.start_held()

    async def _claim(self, limit: int) -> list[JobRow]:
        # Shielded: a claim cut short after the server committed would strand its jobs. One
        # scope, shielded and bounded (the claim's cost per job at low rates matters).
        with _bounded_shield() as scope:
            rows = await self._driver.executor().job_get_available(
                queue=self.queue,
                max_to_lock=limit,
                client_id=self._client_id,
                max_attempted_by=MAX_ATTEMPTED_BY,
                kinds=self._kinds,
            )
        if scope.cancelled_caught:
            raise TimeoutError(f"claim took longer than {HOT_OPERATION_TIMEOUT:g}s")
        return rows

    async def _claim_limited(self, limit: int) -> tuple[list[JobRow], float]:
        """A claim bounded by the queue's global limits: the rows, and how long the next
        claim must wait (0: as usual). Until the rate window reopens when the rate limit is
        used up; one cooldown when ``global_max_workers`` cut the claim short (other clients'
        jobs free those slots, and nothing tells this one when)."""
        limits = self._limits
        assert limits is not None
        with _bounded_shield() as scope:
            claim = await self._driver.executor().job_get_available_limited(
                queue=self.queue,
                max_to_lock=limit,
                client_id=self._client_id,
                max_attempted_by=MAX_ATTEMPTED_BY,
                kinds=self._kinds,
                rate_limit=limits.rate_limit,
                global_max_workers=limits.global_max_workers,
            )
        if scope.cancelled_caught:
            raise TimeoutError(f"claim took longer than {HOT_OPERATION_TIMEOUT:g}s")
        rows = claim.jobs
        if claim.reopens_in > 0:
            return rows, claim.reopens_in
        if claim.allowed < limit and len(rows) == claim.allowed:
            return rows, self._pacer.cooldown_interval
        return rows, 0.0

    async def _claim_failed(self, exc: DatabaseError | TimeoutError | MigrationError) -> float:
        """A claim failed (its rows may or may not be claimed): log it, give back what it may
        have claimed when the failure leaves that open, and return the back-off delay before
        the next claim."""
        delay = self._backoff.next_delay()
        self.contact.failed(exc)
        transient = isinstance(exc, TimeoutError) or getattr(exc, "transient", False)
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
            lost = self._lost_claims
            lost.failed(anyio.current_time() - HOT_OPERATION_TIMEOUT)
            await lost.recover(self._pool.job_ids())
        return delay

    @property
    def _client_id(self) -> str:
        return self._config.id
