"""The completer on its own: asleep while nothing is pending (an idle client's completer does
not wake), on both loops and both databases."""

from __future__ import annotations

import contextlib
import datetime as dt
import sys
import time
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from river_anyio import EventKind, JobRow, JobState
from river_anyio._events import EventHub
from river_anyio._runtime._completer import Completer, Finished
from river_anyio.drivers import open_driver

pytestmark = pytest.mark.anyio

IDLE = 0.6


def completed(row: JobRow) -> Finished:
    """A successful attempt of a claimed ``row``, ready for the completer."""
    now = dt.datetime.now(dt.UTC)
    return Finished(
        id=row.id,
        attempt=row.attempt,
        state=JobState.COMPLETED,
        finalized_at=now,
        row=row,
        kind=EventKind.JOB_COMPLETED,
        message=None,
        start=now.timestamp(),
        started=time.monotonic(),
    )


async def claimed_blockers(database_url: str, driver: Any, n: int, client_id: str) -> list[JobRow]:
    """``n`` blocker jobs, inserted and then claimed by ``client_id`` on ``driver``: running
    rows whose results a completer can write."""
    import river_anyio as river

    from .lifecycle_support import Blocker

    async with river.open_client(database_url) as inserter:
        await inserter.client.insert_many([Blocker(f"{client_id}-{i}") for i in range(n)])
    rows = await driver.executor().job_get_available(
        queue="default", max_to_lock=n, client_id=client_id, max_attempted_by=100
    )
    assert len(rows) == n
    return list(rows)


class _Wakeups:
    count = 0


@contextlib.contextmanager
def completer_wakeups(backend: str) -> Iterator[_Wakeups]:
    """Counts the completer's wake-ups: on trio the steps its tasks take (an instrument), on
    asyncio the timers its code schedules (asyncio has no per-task hook)."""
    seen = _Wakeups()
    if backend == "trio":
        import trio

        class Steps(trio.abc.Instrument):
            def before_task_step(self, task: trio.lowlevel.Task) -> None:
                if "completer" in task.name.lower():
                    seen.count += 1

        instrument = Steps()
        trio.lowlevel.add_instrument(instrument)
        try:
            yield seen
        finally:
            trio.lowlevel.remove_instrument(instrument)
        return
    import asyncio

    loop = asyncio.get_running_loop()
    call_at = loop.call_at

    def counting_call_at(when: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
        frame: Any = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_filename.endswith("_completer.py"):
                seen.count += 1
                break
            frame = frame.f_back
        return call_at(when, callback, *args, **kwargs)

    loop.call_at = counting_call_at  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del loop.call_at


async def test_an_idle_completer_sleeps(database_url: str, anyio_backend: str) -> None:
    async with open_driver(database_url) as driver:
        completer = Completer(driver, client_id="idle-completer", events=EventHub())
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                send = await tg.start(completer.run, name="river completer")
                with send:
                    await anyio.wait_all_tasks_blocked()
                    with completer_wakeups(anyio_backend) as wakeups:
                        # waited in a thread: the test's own task sets no timer meanwhile
                        await anyio.to_thread.run_sync(time.sleep, IDLE)
                    # a ticking completer (every 50 ms) would have woken about 12 times
                    assert wakeups.count == 0
                # the last stream closed: the completer returns
    assert completer.statistics().pending == 0


async def test_a_completion_after_an_idle_spell_is_written(database_url: str) -> None:
    """Asleep, the completer still wakes for a completion, and writes it within its quiet
    flush window (no producer asked for a flush here)."""
    import river_anyio as river

    from .lifecycle_support import Blocker, read_job, wait_until

    async with river.open_client(database_url) as inserter:
        job = (await inserter.client.insert(Blocker())).job
    async with open_driver(database_url) as driver:
        [row] = await driver.executor().job_get_available(
            queue=job.queue, max_to_lock=1, client_id="idle-completer", max_attempted_by=100
        )
        completer = Completer(driver, client_id="idle-completer", events=EventHub())
        async with anyio.create_task_group() as tg:
            send = await tg.start(completer.run)
            with send:
                await anyio.wait_all_tasks_blocked()
                await anyio.to_thread.run_sync(time.sleep, 0.2)  # idle for a while
                await send.send(completed(row))
                sent = anyio.current_time()
                await wait_until(lambda: completer.statistics().written == 1, within=5)
                # the fifth 50 ms tick after it arrived, not a later poll
                assert anyio.current_time() - sent < 1.0
    assert (await read_job(database_url, job.id)).state is river.JobState.COMPLETED


class _RecordingDriver:
    """The real driver; each completion write is recorded in ``order`` as it is called."""

    def __init__(self, inner: Any, order: list[str]) -> None:
        self._inner = inner
        self._order = order

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def executor(self) -> Any:
        return _RecordingExecutor(self._inner.executor(), self._order)


class _RecordingExecutor:
    def __init__(self, inner: Any, order: list[str]) -> None:
        self._inner = inner
        self._order = order

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def job_set_state_if_running_many(self, *args: Any, **kwargs: Any) -> Any:
        self._order.append("write")
        return await self._inner.job_set_state_if_running_many(*args, **kwargs)


async def test_a_flush_asked_for_lets_the_woken_workers_start_first(database_url: str) -> None:
    """A producer that finds its queue drained hands its workers the rows, then asks for a
    flush, in one step: the workers start before the write is sent, whatever order the loop
    runs the woken tasks in (trio varies it; a write sent first can hand the core to the
    database for a while)."""

    from .lifecycle_support import wait_until

    rounds = 16
    order: list[str] = []
    async with open_driver(database_url) as inner:
        rows = await claimed_blockers(database_url, inner, rounds, "flush-order")
        driver = _RecordingDriver(inner, order)
        completer = Completer(driver, client_id="flush-order", events=EventHub())  # type: ignore[arg-type]
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                send = await tg.start(completer.run)
                with send:
                    for n, row in enumerate(rows, 1):
                        await send.send(completed(row))
                        await wait_until(lambda: completer.statistics().pending == 1, within=5)
                        waiting = anyio.Event()
                        woken = anyio.Event()

                        async def worker() -> None:
                            waiting.set()  # noqa: B023 (each round awaits its worker)
                            await woken.wait()  # noqa: B023
                            order.append("job")

                        tg.start_soon(worker)
                        await waiting.wait()
                        woken.set()
                        completer.flush_soon()
                        await wait_until(lambda: completer.statistics().written == n, within=5)  # noqa: B023
    assert order == ["job", "write"] * rounds, order


class _TimedDriver(_RecordingDriver):
    """The real driver; the loop's time at each completion write is recorded in ``times``,
    and ``written`` is set when a write has returned."""

    def __init__(self, inner: Any, times: list[float]) -> None:
        super().__init__(inner, [])
        self._times = times
        self.written = anyio.Event()

    def executor(self) -> Any:
        return _TimedExecutor(self._inner.executor(), self)


class _TimedExecutor(_RecordingExecutor):
    def __init__(self, inner: Any, driver: _TimedDriver) -> None:
        super().__init__(inner, [])
        self._driver = driver

    async def job_set_state_if_running_many(self, *args: Any, **kwargs: Any) -> Any:
        self._driver._times.append(anyio.current_time())
        try:
            return await self._inner.job_set_state_if_running_many(*args, **kwargs)
        finally:
            self._driver.written.set()


async def test_flushes_asked_for_in_a_row_are_spaced(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a steady flow every claim drains its queue and asks for a flush: one asked for
    within SOON_SPACING of the previous flush is not made at once, but at the next tick
    (or the next request past the spacing), so writes are not one per claim."""
    from river_anyio._runtime import _completer

    from .lifecycle_support import wait_until

    # ten times the usual tick and spacing: a slow write cannot make the test's premise
    # (the third request comes within the spacing) fail
    tick, spacing = 10 * _completer.TICK, 10 * _completer.SOON_SPACING
    monkeypatch.setattr(_completer, "TICK", tick)
    monkeypatch.setattr(_completer, "SOON_SPACING", spacing)
    times: list[float] = []
    async with open_driver(database_url) as inner:
        rows = await claimed_blockers(database_url, inner, 3, "spaced")
        driver = _TimedDriver(inner, times)
        completer = Completer(driver, client_id="spaced", events=EventHub())  # type: ignore[arg-type]
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                send = await tg.start(completer.run)
                with send:
                    # the first write prepares its statement; the second is timed
                    for row in rows[:2]:
                        driver.written = anyio.Event()
                        await send.send(completed(row))
                        await wait_until(lambda: completer.statistics().pending == 1, within=5)
                        completer.flush_soon()
                        await driver.written.wait()
                    # at once: the third request comes well within the spacing
                    await send.send(completed(rows[2]))
                    while completer.statistics().pending != 1:  # taken: no timer involved
                        await anyio.lowlevel.checkpoint()
                    asked = anyio.current_time()
                    completer.flush_soon()
                    await wait_until(lambda: completer.statistics().written == 3, within=10)
    assert asked - times[1] < spacing  # the test's premise
    assert times[2] - times[1] >= spacing
    # made at the next tick, not left for the quiet flush of the IDLE_TICKS-th
    assert times[2] - asked < _completer.IDLE_TICKS * tick


async def test_the_last_result_of_a_burst_is_written_without_the_quiet_ticks(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer asks for a flush when a claim finds its queue drained, but the jobs that
    claim took finish later: when the last of them ends, its result is written as soon as it
    reaches the completer, not on the quiet flush of the 5th tick."""
    import river_anyio as river
    from river_anyio._runtime import _completer

    from .lifecycle_support import Blocker, Gate, queues, wait_until

    tick = 4.0  # the quiet flush would come 20 s after the result
    monkeypatch.setattr(_completer, "TICK", tick)
    gate = Gate()
    async with river.open_client(database_url) as inserter:
        job = (await inserter.client.insert(Blocker())).job
    async with river.open_client(
        database_url,
        id="burst-end",
        queues=queues(5),
        workers=gate.workers(),
        fetch_poll_interval=60,  # no poll finds the queue drained meanwhile
    ) as run:
        # the start-up claim took the job and found the queue drained, with nothing pending
        with anyio.fail_after(10):
            await gate.started_event(job.id).wait()
        gate.release.set()

        def written() -> bool:
            completer = run.diagnostics.completer
            return completer is not None and completer.written == 1

        await wait_until(written, within=_completer.IDLE_TICKS * tick / 2)
