"""Global queue limits across clients in separate processes (asyncio and trio mixed) on one
database: three on PostgreSQL, two on SQLite, all working a rate-limited queue and a queue
with ``global_max_workers`` at once.

- ``RateLimit(20, per=1 s)``: no window of one second, wherever it begins, holds more than
  20 ``attempted_at`` (the design has no burst), so 60 jobs take at least two seconds from
  the first start to the last (and the queue drains);
- ``global_max_workers=4`` with 10 local workers per process and jobs of 100–200 ms: the
  test samples the queue's ``running`` rows every 50 ms and never sees more than 4.
"""

from __future__ import annotations

import datetime as dt
import random
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process, TaskGroup
from anyio.streams.text import TextReceiveStream

import river_anyio as river
from river_anyio.drivers import Driver, open_driver
from river_anyio.migrate import LINE_RIVER_ANYIO, Migrator

from .limits_child import CAP, RATE, Quick, Slow

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

ROOT = Path(__file__).resolve().parents[2]
RATED_JOBS = 60
CAPPED_JOBS = 40
DRAIN = 30.0


async def spawn(
    tg: TaskGroup, url: str, client_id: str, backend: str
) -> tuple[Process, anyio.Event]:
    proc = await anyio.open_process(
        [sys.executable, "-m", "river_anyio_tests.runtime.limits_child", url, client_id, backend],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    ready = anyio.Event()
    output: list[str] = []

    async def read() -> None:
        assert proc.stdout is not None
        async for chunk in TextReceiveStream(proc.stdout):
            output.append(chunk)
            if "ready" in "".join(output):
                ready.set()
        if not ready.is_set():
            raise AssertionError(f"{client_id} exited before it was ready:\n{''.join(output)}")

    tg.start_soon(read)
    return proc, ready


async def count(driver: Driver, sql: str) -> int:
    rows = await driver.executor().fetch_all(sql)
    return int(rows[0][0])


async def scenario(url: str, backends: list[str]) -> None:
    async with open_driver(url) as driver:
        await Migrator(driver, line=LINE_RIVER_ANYIO).up()
        async with anyio.create_task_group() as tg:
            children = [
                await spawn(tg, url, f"limits-{i}-{backend}", backend)
                for i, backend in enumerate(backends)
            ]
            try:
                with anyio.fail_after(30):
                    for _, ready in children:
                        await ready.wait()
                await insert_and_watch(url, driver)
            finally:
                for proc, _ in children:
                    if proc.returncode is None:
                        proc.send_signal(signal.SIGTERM)
                with anyio.fail_after(15):
                    for proc, _ in children:
                        await proc.wait()


async def insert_and_watch(url: str, driver: Driver) -> None:
    rng = random.Random(13)
    params = [
        river.InsertManyParams(Quick(), river.InsertOpts(queue="rated")) for _ in range(RATED_JOBS)
    ] + [
        river.InsertManyParams(Slow(ms=rng.randint(100, 200)), river.InsertOpts(queue="capped"))
        for _ in range(CAPPED_JOBS)
    ]
    async with river.open_client(url) as run:
        await run.client.insert_many(params)
    running_capped = "SELECT count(*) FROM river_job WHERE queue = 'capped' AND state = 'running'"
    unfinished = "SELECT count(*) FROM river_job WHERE state <> 'completed'"
    samples: list[int] = []
    with anyio.fail_after(DRAIN):
        while True:
            samples.append(await count(driver, running_capped))
            if await count(driver, unfinished) == 0:
                break
            await anyio.sleep(0.05)
    assert max(samples) <= CAP, samples
    assert max(samples) >= 1, samples  # the sampling saw the queue at work

    rows = await driver.executor().job_list(queues=["rated"], limit=1000)
    assert len(rows) == RATED_JOBS
    starts = sorted(r.attempted_at for r in rows if r.attempted_at is not None)
    assert len(starts) == RATED_JOBS
    second = dt.timedelta(seconds=1)
    worst = max(sum(1 for t in starts if s <= t < s + second) for s in starts)
    assert worst <= RATE, f"{worst} starts within one second"
    # 60 starts at 20 per second: the third batch cannot begin before two seconds passed
    assert starts[-1] - starts[0] >= 2 * second - dt.timedelta(milliseconds=5)
    claimed_by = {r.attempted_by[-1] for r in await driver.executor().job_list(limit=1000)}
    assert len(claimed_by) >= 2, claimed_by  # the limits were shared, not one client's


async def test_three_processes_share_the_limits_on_postgres(pg_url: str) -> None:
    await scenario(pg_url, ["asyncio", "trio", "asyncio"])


async def test_two_processes_share_the_limits_on_sqlite(sqlite_url: str) -> None:
    await scenario(sqlite_url, ["trio", "asyncio"])
