"""The worker pool on its own (no database): workers spawned on demand up to max_workers,
cancel reasons on the attempt, timeouts, the low-water call, and what a cancelled pool gives
back. The job runner is a small stand-in keeping JobRunner's contract (the attempt's scope is
set only while its work runs); the real one runs under the pool in every client test."""

from __future__ import annotations

import time
import types
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, cast

import anyio
import anyio.lowlevel
import attrs
import pytest

from river_anyio import JobRow
from river_anyio._runtime._attempt import Attempt, CancelReason
from river_anyio._runtime._control import QueueControl
from river_anyio._runtime._pacing import NO_LOW_WATER
from river_anyio._runtime._pool import WorkerPool
from river_anyio._runtime._runner import JobRunner
from river_anyio.testing import build_job

from .lifecycle_support import wait_until

pytestmark = pytest.mark.anyio


@attrs.frozen
class Args:
    kind: ClassVar[str] = "pool_test"
    n: int = 0


def rows(count: int) -> list[JobRow]:
    return [build_job(Args(n=i), id=i + 1) for i in range(count)]


class StandInRunner:
    """Runs ``work(attempt)`` as the attempt's job, with an optional timeout."""

    def __init__(
        self,
        work: Callable[[Attempt], Awaitable[None]],
        timeout: float | None = None,
        timeouts: dict[int, float | None] | None = None,
    ) -> None:
        self.work = work
        self.timeout = timeout
        #: per job id, instead of ``timeout``
        self.timeouts = timeouts or {}
        self.running = 0
        self.most_running = 0
        self.ended: list[tuple[int, CancelReason | None]] = []
        self.interrupted: list[int] = []
        self.given_back: list[int] = []

    def begin(self, attempt: Attempt) -> None:
        attempt.start = time.time()
        attempt.started = time.monotonic()
        attempt.job = cast(Any, attempt.row)
        timeout = attempt.timeout = self.timeouts.get(attempt.row.id, self.timeout)
        if timeout is not None:
            attempt.deadline = anyio.current_time() + timeout

    async def run(self, attempt: Attempt, scope: anyio.CancelScope) -> bool:
        attempt.scope = scope
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await self.work(attempt)
        finally:
            self.running -= 1
            attempt.scope = None
        return attempt.reason is not None

    def end_nowait(self, attempt: Attempt) -> bool:
        return False  # every attempt concluded by end()

    async def end(self, attempt: Attempt) -> None:
        self.ended.append((attempt.row.id, attempt.reason))

    async def interrupt(self, attempt: Attempt) -> None:
        attempt.reason = CancelReason.STOP
        self.interrupted.append(attempt.row.id)

    async def give_back(self, row: JobRow) -> None:
        self.given_back.append(row.id)


def pool_of(runner: StandInRunner, max_workers: int, **kwargs: Any) -> WorkerPool:
    return WorkerPool(
        runner=cast(JobRunner, runner), max_workers=max_workers, name="test", **kwargs
    )


async def test_jobs_that_wait_run_concurrently_up_to_max_workers() -> None:
    release = anyio.Event()
    three_running = anyio.Event()
    runner: StandInRunner

    async def waits(attempt: Attempt) -> None:
        if runner.running == 3:
            three_running.set()
        await release.wait()

    runner = StandInRunner(waits)
    pool = pool_of(runner, 3)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            pool.dispatch(rows(7))
            await three_running.wait()
            assert len(pool) == 7
            release.set()
            pool.close()
    assert runner.most_running == 3
    assert sorted(i for i, _ in runner.ended) == list(range(1, 8))
    assert len(pool) == 0 and pool.finished == 7


async def test_a_remote_cancel_is_the_attempts_reason_and_ends_that_job_only() -> None:
    started = anyio.Event()

    async def first_hangs(attempt: Attempt) -> None:
        if attempt.row.id == 1:
            started.set()
            await anyio.sleep_forever()
        await anyio.lowlevel.checkpoint()  # the next job, on a fresh scope, may wait

    runner = StandInRunner(first_hangs)
    pool = pool_of(runner, 1)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            pool.dispatch(rows(2))
            await started.wait()
            # claimed, not begun: it begins cancelled (River's executor cancelled before it
            # runs)
            waiting = pool.cancel(2, CancelReason.REMOTE)
            assert waiting is not None and waiting.row.id == 2
            assert pool.cancel(99, CancelReason.REMOTE) is None
            cancelled = pool.cancel(1, CancelReason.REMOTE)
            assert cancelled is not None and cancelled.row.id == 1
            pool.close()
    assert runner.ended == [(1, CancelReason.REMOTE), (2, CancelReason.REMOTE)]


async def test_a_cancel_after_the_job_ran_changes_nothing() -> None:
    """An attempt whose work returned, still held while it concludes, is not cancelled."""
    concluding = anyio.Event()
    release = anyio.Event()

    class SlowEnd(StandInRunner):
        async def end(self, attempt: Attempt) -> None:
            concluding.set()
            await release.wait()
            await super().end(attempt)

    runner = SlowEnd(lambda attempt: anyio.lowlevel.checkpoint())
    pool = pool_of(runner, 1)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            pool.dispatch(rows(1))
            await concluding.wait()
            assert pool.cancel(1, CancelReason.REMOTE) is None
            release.set()
            pool.close()
    assert runner.ended == [(1, None)]


async def test_held_rows_start_when_released_and_are_given_back_if_never_released() -> None:
    runner = StandInRunner(lambda attempt: anyio.lowlevel.checkpoint())
    pool = pool_of(runner, 2)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            pool.hold(rows(2))
            assert len(pool) == 2 and sorted(pool.job_ids()) == [1, 2]
            held = pool.cancel(2, CancelReason.REMOTE)  # reaches a held row
            assert held is not None
            await anyio.wait_all_tasks_blocked()
            assert runner.ended == []  # nothing starts while held
            pool.start_held()
            pool.close()
    assert sorted(runner.ended, key=lambda e: e[0]) == [(1, None), (2, CancelReason.REMOTE)]

    runner = StandInRunner(lambda attempt: anyio.lowlevel.checkpoint())
    pool = pool_of(runner, 2)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            pool.hold(rows(2))
            tg.cancel_scope.cancel("stop and cancel")
    assert runner.ended == [] and runner.given_back == [1, 2] and len(pool) == 0


async def test_a_claimed_attempt_cancelled_before_it_begins_keeps_the_reason() -> None:
    """River's pending cancellations: the attempt begins with its reason set (the job runner
    then starts it cancelled); one that ran already, or a later attempt, is left alone."""
    started = anyio.Event()
    release = anyio.Event()

    async def first_waits(attempt: Attempt) -> None:
        if attempt.row.id == 1:
            started.set()
            await release.wait()

    runner = StandInRunner(first_waits)
    pool = pool_of(runner, 1)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            pool.dispatch(rows(3))
            await started.wait()
            held = pool.attempts()
            assert sorted(held) == [1, 2, 3]
            assert pool.cancel(3, CancelReason.REMOTE, Attempt(held[3].row)) is None
            pending = pool.cancel(2, CancelReason.REMOTE, held[2])
            assert pending is held[2] and pending.reason is CancelReason.REMOTE
            assert pool.cancel(2, CancelReason.REMOTE) is None  # nothing new: no second log
            release.set()
            pool.close()
    assert runner.ended == [(1, None), (2, CancelReason.REMOTE), (3, None)]


async def test_a_cancel_during_a_claim_reaches_the_rows_it_claims() -> None:
    """A remote cancel that arrives while a claim is in flight, for a row the pool does not
    hold yet, is applied once the claim's rows are dispatched (River's pending cancels)."""
    release = anyio.Event()

    async def waits(attempt: Attempt) -> None:
        await release.wait()

    runner = StandInRunner(waits)
    pool = pool_of(runner, 1)
    control = QueueControl(
        queue="default",
        config=cast(Any, types.SimpleNamespace(id="c")),
        driver=cast(Any, None),
        events=cast(Any, None),
        pool=pool,
        trigger=lambda: None,
        resumed=lambda: None,
    )
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            with control.claiming():
                assert not control.cancel_job(2)  # the claim has not returned yet
                assert not control.cancel_job(99)  # nor will it: a job of another client
                pool.dispatch(rows(2))
            assert pool.attempts()[2].reason is CancelReason.REMOTE
            assert not control.cancel_job(98)  # no claim in flight: nothing is kept
            release.set()
            pool.close()
    assert runner.ended == [(1, None), (2, CancelReason.REMOTE)]


async def test_a_timeout_is_the_attempts_reason() -> None:
    async def hangs_first(attempt: Attempt) -> None:
        if attempt.row.id == 1:
            await anyio.sleep_forever()

    runner = StandInRunner(hangs_first, timeout=0.05)
    pool = pool_of(runner, 2)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            pool.dispatch(rows(3))
            pool.close()
    assert sorted(runner.ended, key=lambda e: e[0]) == [
        (1, CancelReason.TIMEOUT),
        (2, None),
        (3, None),
    ]


async def test_many_finished_deadlines_do_not_delay_a_later_timeout() -> None:
    async def quick_then_hangs(attempt: Attempt) -> None:
        if attempt.row.id == 1000:
            await anyio.sleep_forever()

    runner = StandInRunner(quick_then_hangs, timeout=0.2)
    pool = pool_of(runner, 4)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            pool.dispatch(rows(1000))
            pool.close()
    assert runner.ended[-1] == (1000, CancelReason.TIMEOUT)
    assert len(runner.ended) == 1000


async def test_a_job_with_an_earlier_deadline_wakes_the_watchdog() -> None:
    """The watchdog sleeps until the earliest deadline it knows of: a job beginning later
    with a shorter timeout still times out on time."""

    first_started = anyio.Event()

    async def hangs(attempt: Attempt) -> None:
        first_started.set()
        await anyio.sleep_forever()

    runner = StandInRunner(hangs, timeouts={1: 60.0, 2: 0.1})
    pool = pool_of(runner, 2)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            pool.dispatch(rows(1))
            await first_started.wait()  # the watchdog now sleeps until job 1's deadline
            pool.dispatch(rows(2)[1:])
            await wait_until(lambda: bool(runner.ended))
            tg.cancel_scope.cancel("test over")
    assert runner.ended == [(2, CancelReason.TIMEOUT)]


async def test_a_finished_jobs_deadline_spares_the_next_job() -> None:
    """A worker's next job (without a timeout) outlives the deadline of the job it ran before
    and is not cancelled when that deadline passes."""
    first_deadline: list[float] = []

    async def work(attempt: Attempt) -> None:
        if attempt.row.id == 1:
            first_deadline.append(attempt.deadline)
        else:  # run past the first job's deadline
            await anyio.sleep_until(first_deadline[0] + 0.1)

    runner = StandInRunner(work, timeouts={1: 0.05, 2: None})
    pool = pool_of(runner, 1)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            pool.dispatch(rows(2))
            pool.close()
    assert runner.ended == [(1, None), (2, None)]


async def test_the_low_water_mark_calls_back_until_lowered() -> None:
    calls: list[int] = []
    pool: WorkerPool

    async def quick(attempt: Attempt) -> None:
        return None

    pool = pool_of(StandInRunner(quick), 2, on_low_water=lambda: calls.append(len(pool)))
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            pool.low_water = 2
            pool.dispatch(rows(5))
            pool.close()
    assert calls == [2, 1, 0]


async def test_the_owner_runs_at_the_low_water_mark_before_the_ready_rows() -> None:
    """Jobs that never wait run back to back on one worker while the next worker, woken in
    the chain, waits in the run queue ahead of whoever the low-water call wakes. The owner
    still gets to run (and send its claim) while rows are left to overlap it."""
    seen: list[int] = []
    wanted = anyio.Event()
    release = anyio.Event()
    pool: WorkerPool

    async def work(attempt: Attempt) -> None:
        if attempt.row.id <= 4:  # the first rows hold every worker, so all four exist
            await release.wait()

    async def owner() -> None:
        await wanted.wait()
        seen.append(len(pool))
        pool.low_water = NO_LOW_WATER

    runner = StandInRunner(work)
    pool = pool_of(runner, 4, on_low_water=wanted.set)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            tg.start_soon(owner)
            pool.dispatch(rows(4))
            while runner.running < 4:
                await anyio.lowlevel.checkpoint()
            release.set()
            while len(pool):
                await anyio.lowlevel.checkpoint()
            # four idle workers; quick rows from here on
            pool.low_water = 30
            pool.dispatch([build_job(Args(n=i), id=i) for i in range(5, 45)])
            await wanted.wait()
            pool.close()
    assert len(runner.ended) == 44
    # the owner ran within a job or two of the mark, not after every ready row
    assert len(seen) == 1
    assert seen[0] >= 27


async def test_a_cancelled_pool_interrupts_running_jobs_and_gives_back_the_rest() -> None:
    started = anyio.Event()

    async def hangs(attempt: Attempt) -> None:
        started.set()
        await anyio.sleep_forever()

    runner = StandInRunner(hangs)
    pool = pool_of(runner, 1)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            pool.dispatch(rows(3))
            await started.wait()
            tg.cancel_scope.cancel("stop and cancel")
    assert runner.interrupted == [1]
    assert runner.given_back == [2, 3]
    assert runner.ended == []
    assert len(pool) == 0


async def test_rows_dispatched_after_the_pool_was_cancelled_are_given_back() -> None:
    async def quick(attempt: Attempt) -> None:
        return None

    runner = StandInRunner(quick)
    pool = pool_of(runner, 1)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            tg.cancel_scope.cancel("stop and cancel")
    pool.dispatch(rows(2))  # a claim that returned after the cancellation
    await pool.give_back()
    assert runner.given_back == [1, 2] and len(pool) == 0
