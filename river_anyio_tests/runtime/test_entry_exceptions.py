"""The exception policy, the same at both entry points (``open_client`` and ``run_client``):
a service failing while running is a :class:`river_anyio.ClientCrashedError` with the group as
its cause; a failed start is one plain exception; the caller's cancellation is not wrapped.

Faults are injected by a driver that passes everything to a real one (the driver protocol),
not by patching the runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

import river_anyio as river
from river_anyio.drivers import open_driver

from .lifecycle_support import SOON, Blocker, Gate, queues, read_job

pytestmark = pytest.mark.anyio


class _BrokenFetch:
    """An executor whose ``job_get_available`` raises a bug (not a database error) once its
    driver is armed."""

    def __init__(self, inner: Any, driver: BreakingDriver) -> None:
        self._inner = inner
        self._driver = driver

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def job_get_available(self, **kw: Any) -> Any:
        driver = self._driver
        if driver.armed:
            driver.raised.set()
            raise RuntimeError("driver bug")
        driver.in_flight += 1
        try:
            return await self._inner.job_get_available(**kw)
        finally:
            driver.in_flight -= 1
            if not driver.in_flight:
                driver.settled.set()


class BreakingDriver:
    """The real driver, except that fetches fail once ``armed`` (a bug in a background
    service: not a database fault, so it is not retried)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.armed = False
        self.raised = anyio.Event()
        #: claims begun before arming and not returned yet
        self.in_flight = 0
        self.settled = anyio.Event()

    async def arm(self) -> None:
        """Fail every claim from now on; returns once the claims begun earlier returned (one
        of them, still waiting for a connection, could take a job inserted after this)."""
        self.armed = True
        while self.in_flight:
            self.settled = anyio.Event()
            await self.settled.wait()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def executor(self) -> Any:
        return _BrokenFetch(self._inner.executor(), self)


def _crash_cause_is_the_bug(exc: river.ClientCrashedError) -> None:
    assert "RuntimeError: driver bug" in str(exc)
    assert pytest.RaisesGroup(
        pytest.RaisesExc(RuntimeError, match="^driver bug$"), flatten_subgroups=True
    ).matches(exc.__cause__)


async def test_open_client_raises_client_crashed_when_a_service_fails(database_url: str) -> None:
    gate = Gate(mode="forever")
    async with open_driver(database_url) as inner:
        driver = BreakingDriver(inner)
        config = river.Config(queues=queues(), workers=gate.workers(), soft_stop_timeout=60)
        with anyio.fail_after(SOON), pytest.raises(river.ClientCrashedError) as info:
            async with river.open_client(driver, config) as run:
                job = (await run.client.insert(Blocker())).job
                await gate.started_event(job.id).wait()
                await driver.arm()
                await run.client.insert(Blocker("second"))  # its fetch fails
                await anyio.sleep_forever()  # cancelled by the crash
    _crash_cause_is_the_bug(info.value)
    assert gate.cancelled == [job.id]  # cleaned up: the running job was interrupted
    assert (await read_job(database_url, job.id)).state is river.JobState.AVAILABLE


async def test_run_client_raises_client_crashed_when_a_service_fails(database_url: str) -> None:
    """``run_client`` applies the same policy: the caller's task group gets the
    ClientCrashedError (in the group task groups raise), not the run's internal group."""
    gate = Gate(mode="forever")
    async with open_driver(database_url) as inner:
        driver = BreakingDriver(inner)
        config = river.Config(queues=queues(), workers=gate.workers(), soft_stop_timeout=60)
        with anyio.fail_after(SOON), pytest.RaisesGroup(river.ClientCrashedError) as info:
            async with anyio.create_task_group() as tg:
                run: river.ClientRun = await tg.start(river.run_client, driver, config)
                job = (await run.client.insert(Blocker())).job
                await gate.started_event(job.id).wait()
                await driver.arm()
                await run.client.insert(Blocker("second"))
                await anyio.sleep_forever()
    (crash,) = info.value.exceptions
    assert isinstance(crash, river.ClientCrashedError)
    _crash_cause_is_the_bug(crash)
    assert gate.cancelled == [job.id]
    assert (await read_job(database_url, job.id)).state is river.JobState.AVAILABLE
    await run.wait()


async def test_run_client_start_failure_is_one_plain_exception(tmp_path: Path) -> None:
    config = river.Config(queues=queues(), workers=Gate().workers())
    url = f"sqlite:///{tmp_path}/missing/river.sqlite3"
    async with anyio.create_task_group() as tg:
        with pytest.raises(river.RiverError) as info:
            await tg.start(river.run_client, url, config)
    assert not isinstance(info.value, BaseExceptionGroup)
    assert not isinstance(info.value, river.ClientCrashedError)


async def test_cancelling_run_client_is_not_wrapped(database_url: str) -> None:
    gate = Gate(mode="forever")
    config = river.Config(queues=queues(), workers=gate.workers())
    with anyio.fail_after(SOON):
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                run: river.ClientRun = await tg.start(river.run_client, database_url, config)
                job = (await run.client.insert(Blocker())).job
                await gate.started_event(job.id).wait()
                scope.cancel()
        assert scope.cancelled_caught  # the cancellation reached its scope as itself
        await run.wait()
    assert gate.cancelled == [job.id]
