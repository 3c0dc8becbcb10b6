"""A client run's lifecycle: graceful stop, stop timeouts and their escalation, stop-and-cancel,
shared shutdowns, stops during start, body exceptions, hard stops, ``run_client``.

Every test runs on both loops and both databases and reads the rows back.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import anyio
import pytest

import river_anyio as river
from river_anyio._client import Client
from river_anyio._config import ClientConfig
from river_anyio._events import EventHub
from river_anyio._runtime import _lag
from river_anyio._runtime._clock import SystemClock
from river_anyio._runtime._supervisor import ClientRun

from .lifecycle_support import (
    SOON,
    Blocker,
    Gate,
    drain,
    next_event,
    other_driver,
    param,
    queues,
    read_job,
    wait_until,
)

pytestmark = pytest.mark.anyio

CLIENT = "lifecycle-client"


class BodyError(Exception):
    pass


def assert_interrupted(row: river.JobRow, attempt: int = 0) -> None:
    """River's interrupted job: available again, attempt given back, no error recorded."""
    assert row.state is river.JobState.AVAILABLE
    assert row.attempt == attempt
    assert row.errors == ()
    assert row.finalized_at is None
    assert row.attempted_by[-1:] == (CLIENT,)


def interrupted_ids(events: list[river.Event]) -> list[int]:
    return [e.job.id for e in events if e.kind is river.EventKind.JOB_INTERRUPTED and e.job]


async def release_when_stopping(run: river.ClientRun, event: anyio.Event) -> None:
    await run.wait_stopping()
    event.set()


@pytest.mark.parametrize("soft_stop_timeout", [None, 30.0])
async def test_leaving_the_body_lets_running_jobs_finish(
    database_url: str, soft_stop_timeout: float | None
) -> None:
    gate = Gate()
    async with anyio.create_task_group() as tg:
        async with river.open_client(
            database_url,
            id=CLIENT,
            queues=queues(),
            workers=gate.workers(),
            soft_stop_timeout=soft_stop_timeout,
        ) as run:
            sub = run.subscribe()
            job = (await run.client.insert(Blocker())).job
            with anyio.fail_after(SOON):
                await gate.started_event(job.id).wait()
            assert run.diagnostics.queues["default"].active_jobs == 1
            # the worker may finish only once the stop has begun
            tg.start_soon(release_when_stopping, run, gate.release)
        assert run.stopping
    assert gate.finished == [job.id] and gate.cancelled == []
    events = drain(sub)
    assert [e.kind for e in events if e.job and e.job.id == job.id] == [
        river.EventKind.JOB_COMPLETED
    ]
    row = await read_job(database_url, job.id)
    assert row.state is river.JobState.COMPLETED
    assert row.attempt == 1 and row.finalized_at is not None


async def test_stop_timeout_interrupts_jobs_still_running(database_url: str) -> None:
    gate = Gate(mode="forever")
    async with river.open_client(
        database_url, id=CLIENT, queues=queues(), workers=gate.workers()
    ) as run:
        sub = run.subscribe()
        job = (await run.client.insert(Blocker())).job
        with anyio.fail_after(SOON):
            await gate.started_event(job.id).wait()
        before = anyio.current_time()
        run.stop(0.3)
        assert run.stopping and run.diagnostics.stopping
        with anyio.fail_after(SOON):
            await run.wait()
        elapsed = anyio.current_time() - before
    assert elapsed >= 0.3
    assert gate.cancelled == [job.id]
    assert interrupted_ids(drain(sub)) == [job.id]
    assert_interrupted(await read_job(database_url, job.id))


async def test_soft_stop_timeout_option_escalates_when_the_body_is_left(
    database_url: str,
) -> None:
    gate = Gate(mode="forever")
    async with river.open_client(
        database_url, id=CLIENT, queues=queues(), workers=gate.workers(), soft_stop_timeout=0.2
    ) as run:
        sub = run.subscribe()
        jobs = [r.job for r in await run.client.insert_many([Blocker("a"), Blocker("b")])]
        with anyio.fail_after(SOON):
            for job in jobs:
                await gate.started_event(job.id).wait()
    assert sorted(gate.cancelled) == sorted(j.id for j in jobs)
    assert sorted(interrupted_ids(drain(sub))) == sorted(j.id for j in jobs)
    for job in jobs:
        assert_interrupted(await read_job(database_url, job.id))


async def test_stop_and_cancel_interrupts_at_once_and_restores_the_attempt(
    database_url: str,
) -> None:
    gate = Gate(mode="forever")
    # a job on its third attempt: interrupted, it is back to attempt 2
    async with river.open_client(database_url) as inserter:
        job = (await inserter.client.insert(Blocker())).job
        await inserter.client.driver.executor().execute(
            f"UPDATE river_job SET attempt = 2 WHERE id = {param(database_url)}", [job.id]
        )
    async with river.open_client(
        database_url, id=CLIENT, queues=queues(), workers=gate.workers(), soft_stop_timeout=60
    ) as run:
        sub = run.subscribe()
        with anyio.fail_after(SOON):
            await gate.started_event(job.id).wait()
        run.stop_and_cancel()
        with anyio.fail_after(5):  # not the 60 s soft stop timeout
            await run.wait()
    assert gate.cancelled == [job.id]
    [event] = [e for e in drain(sub) if e.kind is river.EventKind.JOB_INTERRUPTED]
    assert event.job is not None and event.job.id == job.id
    assert event.job.state is river.JobState.AVAILABLE and event.job.attempt == 2
    assert_interrupted(await read_job(database_url, job.id), attempt=2)


async def test_many_stop_calls_share_one_shutdown(database_url: str) -> None:
    gate = Gate()
    waited: list[int] = []
    async with river.open_client(
        database_url, id=CLIENT, queues=queues(), workers=gate.workers()
    ) as run:
        job = (await run.client.insert(Blocker())).job
        with anyio.fail_after(SOON):
            await gate.started_event(job.id).wait()

        async def stopper(i: int) -> None:
            run.stop()
            await run.wait()
            waited.append(i)

        with anyio.fail_after(SOON):
            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(stopper, i)
                with anyio.fail_after(SOON):
                    await run.wait_stopping()
                run.stop()  # and once more from here
                assert waited == []  # the job is still running: nobody is done waiting
                gate.release.set()
        assert sorted(waited) == [0, 1, 2]
        run.stop()  # stopping a stopped run is harmless
        await run.wait()
    assert gate.finished == [job.id]
    assert (await read_job(database_url, job.id)).state is river.JobState.COMPLETED


async def test_a_later_stop_can_shorten_the_timeout(database_url: str) -> None:
    gate = Gate(mode="forever")
    async with river.open_client(
        database_url, id=CLIENT, queues=queues(), workers=gate.workers()
    ) as run:
        job = (await run.client.insert(Blocker())).job
        with anyio.fail_after(SOON):
            await gate.started_event(job.id).wait()
        run.stop()  # wait as long as it takes ...
        run.stop(0.1)  # ... no: 0.1 s
        with anyio.fail_after(SOON):
            await run.wait()
    assert_interrupted(await read_job(database_url, job.id))


async def test_repeating_a_stop_does_not_postpone_its_deadline(sqlite_url: str) -> None:
    gate = Gate(mode="forever")
    async with river.open_client(
        sqlite_url, id=CLIENT, queues=queues(), workers=gate.workers()
    ) as run:
        job = (await run.client.insert(Blocker())).job
        with anyio.fail_after(SOON):
            await gate.started_event(job.id).wait()
        before = anyio.current_time()
        run.stop(1.0)
        await anyio.sleep(0.7)  # not synchronisation: time passing is the point
        run.stop(1.0)  # the deadline stays 1.0 s after the first call, not 1.7 s
        with anyio.fail_after(SOON):
            await run.wait()
        elapsed = anyio.current_time() - before
    assert 1.0 <= elapsed < 1.5
    assert_interrupted(await read_job(sqlite_url, job.id))


async def test_stop_timeout_must_be_a_non_negative_number(sqlite_url: str) -> None:
    async with river.open_client(sqlite_url) as run:
        for bad in (-1, -0.5, "1", True, float("nan")):
            with pytest.raises(river.ConfigError) as info:
                run.stop(bad)  # type: ignore[arg-type]
            assert info.value.field == "timeout"
            assert "non-negative number of seconds or None" in str(info.value)
        assert not run.stopping  # a rejected stop is no stop


class _QueueStartExecutor:
    """A driver executor that calls ``on_start()`` when a producer registers its queue (the
    first thing a starting producer does), then does it."""

    def __init__(self, inner: Any, on_start: Any) -> None:
        self._inner = inner
        self._on_start = on_start

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def queue_create_or_set_updated_at(self, **kwargs: Any) -> Any:
        self._on_start()
        return await self._inner.queue_create_or_set_updated_at(**kwargs)


class OnQueueStart:
    """A driver (the protocol, delegating to a real one) whose executors call ``on_start()``
    as a producer starts."""

    def __init__(self, driver: Any, on_start: Any) -> None:
        self._driver = driver
        self._on_start = on_start

    def __getattr__(self, name: str) -> Any:
        return getattr(self._driver, name)

    def executor(self) -> Any:
        return _QueueStartExecutor(self._driver.executor(), self._on_start)


@pytest.mark.parametrize("how", ["stop", "stop_and_cancel"])
async def test_a_stop_during_start(database_url: str, how: str) -> None:
    """A stop requested while the producers are starting: the run still starts and reports
    started, claims nothing, and stops cleanly. (No public handle exists before the start:
    the run is built as ``run_client`` builds it, and stopped as each producer starts.)"""
    async with river.open_client(database_url) as inserter:
        job = (await inserter.client.insert(Blocker())).job
    gate = Gate()
    config = ClientConfig(id=CLIENT, queues=queues(5, "default", "other"), workers=gate.workers())
    stops: list[str] = []

    def stop_now() -> None:
        stops.append(how)
        getattr(run, how)()

    async with other_driver(database_url) as real:
        driver = OnQueueStart(real, stop_now)
        client = Client(driver, id=CLIENT, max_attempts=config.max_attempts)
        run = ClientRun(client, config, EventHub())
        with anyio.fail_after(SOON):
            async with anyio.create_task_group() as tg:
                started = await tg.start(functools.partial(run._run, driver, SystemClock()))
                assert started is run
                assert run.stopping
                await run.wait()
    assert stops  # the stop came during the start
    assert not gate.any_started.is_set()
    row = await read_job(database_url, job.id)
    assert row.state is river.JobState.AVAILABLE and row.attempt == 0


async def test_no_queue_is_added_once_a_stop_has_begun(database_url: str) -> None:
    gate = Gate(mode="forever")
    async with river.open_client(
        database_url, id=CLIENT, queues=queues(), workers=gate.workers()
    ) as run:
        job = (await run.client.insert(Blocker())).job
        with anyio.fail_after(SOON):
            await gate.started_event(job.id).wait()
        run.stop(0.2)
        with pytest.raises(river.ValidationError, match="not running"):
            await run.client.local_queues.add("late", river.QueueConfig(max_workers=1))
        assert "late" not in run.diagnostics.queues and "late" not in run.config.queues
        with anyio.fail_after(SOON):
            await run.wait()
    assert_interrupted(await read_job(database_url, job.id))


async def test_a_body_exception_cancels_jobs_and_propagates_unchanged(database_url: str) -> None:
    gate = Gate(mode="forever")
    root = ValueError("root cause")
    with pytest.raises(BodyError) as info:
        async with river.open_client(
            database_url, id=CLIENT, queues=queues(), workers=gate.workers(), soft_stop_timeout=60
        ) as run:
            sub = run.subscribe()
            job = (await run.client.insert(Blocker())).job
            with anyio.fail_after(SOON):
                await gate.started_event(job.id).wait()
            err = BodyError("from the body")
            raise err from root
    # the very same object, not a group, its own cause kept
    assert info.value is err
    assert info.value.__cause__ is root
    assert gate.cancelled == [job.id]
    assert interrupted_ids(drain(sub)) == [job.id]
    assert_interrupted(await read_job(database_url, job.id))


async def test_cancelling_the_enclosing_scope_is_a_hard_stop(database_url: str) -> None:
    gate = Gate(mode="forever")
    with anyio.fail_after(SOON):
        with anyio.CancelScope() as outer:
            async with river.open_client(
                database_url,
                id=CLIENT,
                queues=queues(),
                workers=gate.workers(),
                soft_stop_timeout=60,
            ) as run:
                sub = run.subscribe()
                job = (await run.client.insert(Blocker())).job
                await gate.started_event(job.id).wait()
                outer.cancel()
                await anyio.sleep_forever()
    assert outer.cancelled_caught
    assert gate.cancelled == [job.id]
    assert interrupted_ids(drain(sub)) == [job.id]
    assert_interrupted(await read_job(database_url, job.id))


async def test_a_hard_stop_during_a_graceful_stop_interrupts_the_jobs(database_url: str) -> None:
    gate = Gate(mode="forever")
    with anyio.fail_after(SOON):
        with anyio.CancelScope() as outer:
            async with river.open_client(
                database_url, id=CLIENT, queues=queues(), workers=gate.workers()
            ) as run:
                job = (await run.client.insert(Blocker())).job
                await gate.started_event(job.id).wait()
                run.stop()  # would wait for the job forever ...
                outer.cancel()  # ... until the caller cancels
                await run.wait()
    assert outer.cancelled_caught
    assert_interrupted(await read_job(database_url, job.id))


async def test_run_client_in_the_callers_task_group(database_url: str) -> None:
    gate = Gate()
    gate.release.set()
    async with anyio.create_task_group() as tg:
        config = river.Config(id=CLIENT, queues=queues(), workers=gate.workers())
        run: river.ClientRun = await tg.start(river.run_client, database_url, config)
        assert isinstance(run, river.ClientRun) and run.client.id == CLIENT
        with run.subscribe(river.EventKind.JOB_COMPLETED) as sub:
            job = (await run.client.insert(Blocker())).job
            event = await next_event(sub, river.EventKind.JOB_COMPLETED, job.id)
        assert event.job is not None and event.job.state is river.JobState.COMPLETED
        run.stop()
    # run_client returned: the task group could exit
    assert run.stopping
    await run.wait()
    assert (await read_job(database_url, job.id)).state is river.JobState.COMPLETED


async def test_cancelling_the_callers_task_group_hard_stops_run_client(
    database_url: str,
) -> None:
    gate = Gate(mode="forever")
    with anyio.fail_after(SOON):
        async with anyio.create_task_group() as tg:
            config = river.Config(id=CLIENT, queues=queues(), workers=gate.workers())
            run: river.ClientRun = await tg.start(river.run_client, database_url, config)
            job = (await run.client.insert(Blocker())).job
            await gate.started_event(job.id).wait()
            tg.cancel_scope.cancel()
    await run.wait()
    assert gate.cancelled == [job.id]
    assert_interrupted(await read_job(database_url, job.id))


async def test_an_insert_only_client_needs_no_stop(database_url: str) -> None:
    with anyio.fail_after(SOON):
        async with river.open_client(database_url) as run:
            job = (await run.client.insert(Blocker())).job
            assert run.diagnostics.queues == {}
        await run.wait()
    async with other_driver(database_url) as driver:
        row = await driver.executor().job_get_by_id(job.id)
    assert row is not None and row.state is river.JobState.AVAILABLE


# --- event-loop lag monitor -------------------------------------------------------------------


@pytest.mark.parametrize("wait", ["known", "unknown"])
async def test_every_stall_of_the_loop_is_reported(
    database_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, wait: str
) -> None:
    """Blocking the loop (here: a synchronous sleep in the test's own task, which shares the
    loop with the client) is reported once per stall, each within 50 ms of its length: in a
    ``loop_lag`` event, a warning and the diagnostics (the longest stall, and a histogram).
    So it is on a loop whose wait for I/O the monitor does not know (every look a probe)."""
    if wait == "unknown":
        monkeypatch.setattr(_lag, "_idle_waits", lambda cancelled: frozenset())
    blocks = [0.3] * 5 + [1.2]
    caplog.set_level(logging.WARNING, logger="river_anyio")
    lags: list[float] = []
    with anyio.fail_after(SOON):
        async with river.open_client(
            database_url, id=CLIENT, queues=queues(), workers=Gate().workers()
        ) as run:
            with run.subscribe(river.EventKind.LOOP_LAG) as sub:
                for block in blocks:
                    time.sleep(block)  # noqa: ASYNC251 - blocks the event loop, on purpose
                    event = await next_event(sub, river.EventKind.LOOP_LAG)
                    lags.append(event.details["lag"])
            diagnostics = run.diagnostics
    for block, lag in zip(blocks, lags, strict=True):
        assert abs(lag - block) < 0.05, (block, lags)
    assert diagnostics.loop_lag_max == pytest.approx(max(lags))
    histogram = diagnostics.loop_lag_histogram
    assert histogram[0.25] + histogram[0.5] >= 5 and histogram[2.5] >= 1
    warnings = [r for r in caplog.records if getattr(r, "river_event", None) == "loop_lag"]
    assert warnings and all(r.levelno == logging.WARNING for r in warnings)
    messages = {r.getMessage() for r in warnings}
    assert all(f"event loop lag {lag * 1000:.0f} ms" in messages for lag in lags)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_idle_loop_is_not_probed(database_url: str, backend: str) -> None:
    """The lag monitor's thread looks at the loop every tick and runs a probe on it only when
    it is not waiting for I/O: an idle client's loop is not woken 20 times a second. (Run by
    ``anyio.run`` itself: the test runner drives trio as a guest of its own loop, whose wait
    the monitor does not know.)"""

    async def idle() -> tuple[int, int, float]:
        with anyio.fail_after(SOON):
            async with river.open_client(
                database_url, id=CLIENT, queues=queues(), workers=Gate().workers()
            ) as run:
                monitor = run._lag
                looks, probes = monitor.looks, monitor.probes
                await wait_until(lambda: monitor.looks >= looks + 40)
                return monitor.looks - looks, monitor.probes - probes, monitor.last

    looked, probed, last = anyio.run(idle, backend=backend)
    # a look may fall on the loop's brief work (start-up's last steps, a poll, this test's
    # own checks); a monitor that does not know the wait probes at every look
    assert probed <= looked // 4, (probed, looked)
    assert last < 0.05


# --- rows claimed ahead of free slots ----------------------------------------------------------


#: Every claim that meets a backlog claims ``max_workers`` rows ahead (as quick jobs measure),
#: so rows wait in the ready queue behind busy workers.
CLAIM_AHEAD = ClientConfig(fixed_prefetch=2, claim_ahead=True)


async def test_stop_and_cancel_gives_back_rows_claimed_ahead(database_url: str) -> None:
    gate = Gate(mode="forever")
    async with river.open_client(database_url) as inserter:
        jobs = [r.job for r in await inserter.client.insert_many([Blocker()] * 5)]
    async with river.open_client(
        database_url,
        CLAIM_AHEAD,
        id=CLIENT,
        queues=queues(2),
        workers=gate.workers(),
        soft_stop_timeout=60,
    ) as run:
        sub = run.subscribe()
        # two running, two claimed ahead waiting for a worker, and no more than that
        await wait_until(lambda: run.diagnostics.queues["default"].active_jobs == 4)
        with anyio.fail_after(SOON):
            await gate.started_event(jobs[0].id).wait()
            await gate.started_event(jobs[1].id).wait()
        run.stop_and_cancel()
        with anyio.fail_after(5):
            await run.wait()
    assert sorted(gate.cancelled) == [jobs[0].id, jobs[1].id]
    assert sorted(interrupted_ids(drain(sub))) == [j.id for j in jobs[:4]]
    for job in jobs[:4]:
        assert_interrupted(await read_job(database_url, job.id))
    never = await read_job(database_url, jobs[4].id)
    assert never.state is river.JobState.AVAILABLE and never.attempted_by == ()


async def test_a_graceful_stop_works_rows_claimed_ahead(database_url: str) -> None:
    gate = Gate()
    async with river.open_client(database_url) as inserter:
        jobs = [r.job for r in await inserter.client.insert_many([Blocker()] * 5)]
    async with anyio.create_task_group() as tg:
        async with river.open_client(
            database_url, CLAIM_AHEAD, id=CLIENT, queues=queues(2), workers=gate.workers()
        ) as run:
            await wait_until(lambda: run.diagnostics.queues["default"].active_jobs == 4)
            tg.start_soon(release_when_stopping, run, gate.release)
    assert sorted(gate.finished) == [j.id for j in jobs[:4]] and gate.cancelled == []
    for job in jobs[:4]:
        assert (await read_job(database_url, job.id)).state is river.JobState.COMPLETED
    never = await read_job(database_url, jobs[4].id)
    assert never.state is river.JobState.AVAILABLE and never.attempted_by == ()
