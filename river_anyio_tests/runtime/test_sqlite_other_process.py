"""SQLite across processes: a job inserted by another process on the same file is picked up
through its notification (the listener notices the other process's commit), not by the poll."""

from __future__ import annotations

import sys
from typing import ClassVar

import anyio
import attrs
import pytest

import river_anyio as river

pytestmark = pytest.mark.anyio

#: Far beyond the test's deadline: only the notification can start the jobs in time.
POLL = 60.0
#: From the inserting process's exit to the last job's start (a loaded machine).
PROMPT = 5.0

CHILD = """
import sys
from typing import ClassVar

import anyio
import attrs

import river_anyio as river


@attrs.frozen
class Ping:
    kind: ClassVar[str] = "cross_process_ping"
    n: int


async def main() -> None:
    async with river.open_client(sys.argv[1]) as run:
        await run.client.insert(Ping(n=0))
        await run.client.insert(Ping(n=1))
        await run.client.insert_many([Ping(n=2), Ping(n=3), Ping(n=4)])


anyio.run(main, backend=sys.argv[2])
"""
JOBS = 5


@attrs.frozen
class Ping:
    kind: ClassVar[str] = "cross_process_ping"
    n: int


async def test_job_inserted_by_another_process_starts_promptly(
    sqlite_url: str, anyio_backend: str
) -> None:
    seen: set[int] = set()
    all_started = anyio.Event()

    async def work(ctx: river.WorkContext, job: river.Job[Ping]) -> None:
        seen.add(job.args.n)
        if len(seen) == JOBS:
            all_started.set()

    workers = river.Workers()
    workers.add(Ping, work)
    async with river.open_client(
        sqlite_url,
        queues={"default": river.QueueConfig(max_workers=5)},
        workers=workers,
        fetch_poll_interval=POLL,
    ):
        await anyio.run_process(
            [sys.executable, "-c", CHILD, sqlite_url, anyio_backend],
            check=True,
            stdout=None,
            stderr=None,
        )
        with anyio.fail_after(PROMPT):
            await all_started.wait()
    assert seen == set(range(JOBS))
