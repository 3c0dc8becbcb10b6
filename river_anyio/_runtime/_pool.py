"""A queue's worker pool: the one owner of its attempts, their cancel scopes and deadlines.

Claimed rows become :class:`~._attempt.Attempt` records in one mapping (job id -> attempt) and
wait in one ready queue. At most ``max_workers`` long-lived worker tasks run them (spawning a
task per job costs more than a short job); the task that owns the jobs nursery spawns them on
request. Workers wake one another in a chain, so jobs that wait still run concurrently while
jobs that never wait run back to back on one worker, and each worker keeps one cancel scope
across its jobs until a cancellation spends it. A remote cancel, a job's timeout and the
client's stop set the attempt's reason and cancel its scope; timeouts come from one watchdog
task that sleeps until the earliest deadline it knows of, then looks at each worker's current
attempt (a job beginning with an earlier deadline wakes it). Nothing is kept per job: with
one timeout for every job, each deadline is later than the ones before it, so the watchdog
wakes about once per timeout however many jobs run.

Shutdown: :meth:`WorkerPool.close` says no more rows come; the workers finish what is ready
and leave, and :meth:`WorkerPool.run` returns. Cancellation (a stop timeout, stop-and-cancel)
comes from the enclosing scope: running attempts are interrupted and rows never begun are
given back.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus

from ._attempt import Attempt, CancelReason
from ._pacing import NO_LOW_WATER
from ._util import Wakeup

if TYPE_CHECKING:
    from .._job import JobRow
    from ._runner import JobRunner

__all__ = ["WorkerPool"]


class _Slot:
    """A worker: its wake-up when idle, and its current attempt's deadline."""

    __slots__ = ("attempt", "deadline", "wake")

    def __init__(self) -> None:
        self.wake = anyio.Event()
        #: the attempt begun last (possibly finished since) and its deadline
        self.attempt: Attempt | None = None
        self.deadline = math.inf


class WorkerPool:
    """Runs claimed rows on up to ``max_workers`` workers. Started with
    ``await tg.start(pool.run)``; ``on_low_water`` is called (from a worker, synchronously)
    when a finished job leaves at most :attr:`low_water` attempts, until the owner lowers
    the mark again, and ``on_empty`` when a finished job leaves none."""

    def __init__(
        self,
        *,
        runner: JobRunner,
        max_workers: int,
        name: str,
        on_low_water: Callable[[], None] | None = None,
        on_empty: Callable[[], None] | None = None,
    ) -> None:
        self._runner = runner
        self._max_workers = max_workers
        self._name = name
        self._on_low_water = on_low_water
        self._on_empty = on_empty
        #: every attempt claimed and not yet handed to the completer
        self._attempts: dict[int, Attempt] = {}
        #: attempts claimed and not begun, in claim order
        self._ready: deque[Attempt] = deque()
        #: attempts claimed and held back from the ready queue (see :meth:`hold`)
        self.held: list[Attempt] = []
        self._idle: list[_Slot] = []
        #: every worker, for the timeout watchdog
        self._slots: set[_Slot] = set()
        #: workers running or asked for
        self._workers = 0
        #: workers asked for that the owner task has not spawned yet
        self._to_spawn = 0
        #: a worker woken or spawned that has not run yet: the chain wakes one at a time
        self._on_its_way = 0
        self._spawn = Wakeup()
        self._closed = anyio.Event()
        #: when the watchdog wakes next
        self._watch_at = math.inf
        self._watch_wake = Wakeup()
        #: a finished job leaving at most this many attempts calls ``on_low_water`` and
        #: yields; the mark stays until the producer's fetch loop runs and lowers it, so every
        #: worker yields after each job until then (a worker woken earlier in the chain, ahead
        #: of the fetch loop in the run queue, would otherwise run every ready row first)
        self.low_water = NO_LOW_WATER
        #: jobs finished so far
        self.finished = 0

    def __len__(self) -> int:
        """Attempts held: claimed, running, or concluding."""
        return len(self._attempts)

    def job_ids(self) -> list[int]:
        """The ids of the attempts held."""
        return list(self._attempts)

    # --- what the producer (or a test) does -----------------------------------------------

    def dispatch(self, rows: list[JobRow]) -> None:
        """Take claimed rows and get a worker going on them."""
        attempts = self._attempts
        ready = self._ready
        for row in rows:
            attempt = Attempt(row)
            attempts[row.id] = attempt
            ready.append(attempt)
        self._kick()

    def hold(self, rows: list[JobRow]) -> None:
        """Take claimed rows without starting them: they are held (cancels reach them, see
        :meth:`cancel`) until :meth:`start_held`, or given back if the pool ends first."""
        attempts = self._attempts
        held = self.held
        for row in rows:
            attempt = Attempt(row)
            attempts[row.id] = attempt
            held.append(attempt)

    def start_held(self) -> None:
        """Make the attempts :meth:`hold` took ready, and get a worker going on them."""
        self._ready.extend(self.held)
        self.held.clear()
        self._kick()

    def attempts(self) -> dict[int, Attempt]:
        """The attempts held, by job id (a copy)."""
        return dict(self._attempts)

    def cancel(
        self, job_id: int, reason: CancelReason, attempt: Attempt | None = None
    ) -> Attempt | None:
        """Cancel an attempt (``attempt`` only: not a later attempt of the same job): a running
        one is interrupted, one claimed but not begun starts cancelled (River's pending
        cancellations). Returns it, or None when that job, or that attempt, is not held, has
        run already, or was cancelled for this reason already (a notification and a poll)."""
        held = self._attempts.get(job_id)
        if held is None or (attempt is not None and held is not attempt) or held.reason is reason:
            return None
        scope = held.scope
        if scope is None:
            if held.ctx is not None or held.job is not None:
                return None  # it ran: its result is being concluded
            held.reason = reason  # still ready: the runner starts it cancelled
            return held
        held.reason = reason
        scope.cancel(reason.value)
        return held

    def close(self) -> None:
        """No more rows come: workers finish what is ready and leave."""
        self._closed.set()
        while self._idle:
            self._idle.pop().wake.set()
        self._spawn.set()

    # --- the service ----------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Own the jobs nursery until closed and every worker has left; give back the rows
        never begun if cancelled."""
        try:
            async with anyio.create_task_group() as timers:
                timers.start_soon(self._watch_deadlines, name=f"{self._name} timeouts")
                async with anyio.create_task_group() as jobs:
                    task_status.started()
                    spawn = self._spawn
                    while True:
                        await spawn.wait()
                        while self._to_spawn:
                            self._to_spawn -= 1
                            jobs.start_soon(self._worker, name=self._name)
                        if self._closed.is_set() and not self._workers:
                            break
                timers.cancel_scope.cancel("worker pool closed")
        finally:
            await self.give_back()

    async def give_back(self) -> None:
        """Give back the rows claimed and never begun (the jobs nursery was cancelled, or a
        claim returned after it was): ``available`` again, attempt restored."""
        ready = self._ready
        if self.held:
            ready.extend(self.held)
            self.held.clear()
        if ready:
            with anyio.CancelScope(shield=True):
                while ready:
                    attempt = ready.popleft()
                    del self._attempts[attempt.row.id]
                    await self._runner.give_back(attempt.row)

    def _kick(self) -> None:
        """Get one more worker onto the ready rows, unless one is on its way already.

        Workers wake one another in a chain: a worker that takes a row while more are ready
        kicks the next worker before it begins its job. Jobs that wait run concurrently, one
        more starting each scheduling round, while jobs that never wait are run back to back
        by the first worker, without a task switch per job.
        """
        if self._on_its_way or not self._ready:
            return
        if self._idle:
            self._on_its_way = 1
            self._idle.pop().wake.set()
        elif self._workers < self._max_workers:
            self._on_its_way = 1
            self._workers += 1
            self._to_spawn += 1
            self._spawn.set()

    async def _worker(self) -> None:
        attempts = self._attempts
        ready = self._ready
        idle = self._idle
        closed = self._closed
        runner = self._runner
        begin = runner.begin
        run = runner.run
        end = runner.end
        end_nowait = runner.end_nowait
        slot = _Slot()
        self._slots.add(slot)
        self._on_its_way = 0
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
                                if closed.is_set():
                                    return
                                slot.wake = anyio.Event()
                                idle.append(slot)
                                await slot.wake.wait()
                                self._on_its_way = 0
                                continue
                            attempt = ready.popleft()
                            if ready:
                                self._kick()
                            begin(attempt)
                            if attempt.job is not None:
                                slot.attempt = attempt
                                deadline = slot.deadline = attempt.deadline  # inf: none
                                if deadline < self._watch_at:
                                    self._watch_at = deadline
                                    self._watch_wake.set()
                                if await run(attempt, scope):
                                    break  # the scope is spent: conclude the job outside it
                            done, attempt = attempt, None
                            try:
                                if not end_nowait(done):
                                    await end(done)
                            finally:
                                del attempts[done.row.id]
                                self.finished += 1
                                claim = len(attempts) <= self.low_water
                            if claim:
                                self._low_water()
                                # let the fetch loop send its claim now, so its round trip
                                # overlaps the jobs still ready (these may never yield)
                                await anyio.lowlevel.cancel_shielded_checkpoint()
                            elif not attempts:
                                self._empty()
                except anyio.get_cancelled_exc_class():
                    if attempt is not None:  # the client cancelled it
                        try:
                            await runner.interrupt(attempt)
                        finally:
                            self._done(attempt)
                    raise
                if attempt is not None:  # its own cancellation spent the scope
                    try:
                        await end(attempt)
                    finally:
                        self._done(attempt)
        finally:
            self._workers -= 1
            self._slots.discard(slot)
            if slot in idle:
                idle.remove(slot)
            if not self._workers:
                self._spawn.set()  # the owner may be waiting for the last one to leave

    def _done(self, attempt: Attempt) -> None:
        """Forget a finished attempt (off the hot path: after a cancellation)."""
        del self._attempts[attempt.row.id]
        self.finished += 1
        if len(self._attempts) <= self.low_water:
            self._low_water()
        elif not self._attempts:
            self._empty()

    def _low_water(self) -> None:
        if self._on_low_water is not None:
            self._on_low_water()

    def _empty(self) -> None:
        if self._on_empty is not None:
            self._on_empty()

    # --- timeouts -------------------------------------------------------------------------

    async def _watch_deadlines(self) -> None:
        """Cancel each running attempt whose deadline has passed; sleep until the earliest
        deadline of the workers' latest attempts (or until woken for an earlier one)."""
        slots = self._slots
        while True:
            now = anyio.current_time()
            earliest = math.inf
            for slot in slots:
                deadline = slot.deadline
                if deadline <= now:
                    attempt = slot.attempt
                    slot.deadline = math.inf
                    if attempt is not None and attempt.scope is not None:
                        attempt.reason = CancelReason.TIMEOUT
                        attempt.scope.cancel(CancelReason.TIMEOUT.value)
                elif deadline < earliest:
                    # a finished attempt's too: cleared when it passes, it costs one wake-up,
                    # while leaving it out would have every job begun wake the watchdog
                    earliest = deadline
            self._watch_at = earliest
            with anyio.CancelScope(deadline=earliest):
                await self._watch_wake.wait()
