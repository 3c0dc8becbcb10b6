"""glibc's allocator thresholds and SQLite's writes (``drivers/sqlite/_malloc.py``).

The check runs in a fresh interpreter: the thresholds belong to the process, and this one's
were settled by the tests before."""

from __future__ import annotations

import ctypes
import sys

import anyio
import pytest

pytestmark = pytest.mark.anyio


def _glibc() -> bool:
    try:
        ctypes.CDLL(None).gnu_get_libc_version  # noqa: B018
    except (OSError, AttributeError, TypeError):
        return False
    return True


glibc_only = pytest.mark.skipif(not _glibc(), reason="glibc's allocator only")

#: A client on a SQLite file works 200 jobs it inserts one at a time; prints the process's
#: page faults per job.
WORKER = """
import resource, sys
from typing import ClassVar

import anyio
import attrs

import river_anyio as river


@attrs.frozen
class Ping:
    kind: ClassVar[str] = "malloc_ping"
    n: int


def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


async def main():
    done = [anyio.Event()]

    async def work(ctx, job):
        done[0].set()

    workers = river.Workers()
    workers.add(Ping, work)
    queues = {"default": river.QueueConfig(max_workers=5)}
    async with river.open_client(sys.argv[1], workers=workers, queues=queues) as run:

        async def one(n):
            done[0] = anyio.Event()
            await run.client.insert(Ping(n))
            await done[0].wait()

        for n in range(30):
            await one(n)
        start = faults()
        for n in range(200):
            await one(n)
        print((faults() - start) / 200)


anyio.run(main, backend=sys.argv[2])
"""


async def _run(*args: str) -> str:
    with anyio.fail_after(60):
        result = await anyio.run_process([sys.executable, "-c", *args], check=True)
    return result.stdout.decode()


@glibc_only
async def test_a_sqlite_worker_does_not_fault_memory_in_for_every_job(
    sqlite_url: str, anyio_backend: str
) -> None:
    """Claims and completions write ``state``: without settled thresholds a job cost 4 to 40
    page faults on this project's machines, with them well under one."""
    per_job = float(await _run(WORKER, sqlite_url, anyio_backend))
    assert per_job < 2, per_job
