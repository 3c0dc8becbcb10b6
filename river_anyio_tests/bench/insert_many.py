"""Benchmark: ``insert_many`` (and the no-returning bulk path) of N jobs, one process.

    python -m river_anyio_tests.bench.insert_many --database-url URL [--loop trio] [--jobs 20000]

Without ``--database-url`` a temporary SQLite file is used. The database's ``river_job`` table
is emptied before every round, so point it only at a throwaway database. Prints the median and
best jobs/s over the rounds, and the client CPU time per job.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import ClassVar

import anyio
import attrs

import river_anyio as river
from river_anyio.drivers import open_driver
from river_anyio.migrate import Migrator


@attrs.frozen
class NoOp:
    kind: ClassVar[str] = "bench_noop"
    n: int
    name: str = "benchmark"


async def bench(url: str, jobs: int, rounds: int, fast: bool) -> None:
    async with open_driver(url) as driver:
        await Migrator(driver).up()
    args = [NoOp(n=i) for i in range(jobs)]
    rates, cpu = [], []
    async with river.open_client(url) as run:
        for _ in range(rounds):
            async with run.client.transaction() as tx:
                await tx.execute("DELETE FROM river_job")
            wall0, cpu0 = time.perf_counter(), time.process_time()
            if fast:
                n = await run.client.insert_many_fast(args)
            else:
                n = len(await run.client.insert_many(args))
            wall, used = time.perf_counter() - wall0, time.process_time() - cpu0
            assert n == jobs
            rates.append(jobs / wall)
            cpu.append(used / jobs * 1e6)
    label = "insert_many_fast" if fast else "insert_many"
    print(
        f"{label} {jobs} jobs x {rounds}: median {statistics.median(rates):,.0f} jobs/s, "
        f"best {max(rates):,.0f} jobs/s, client CPU {statistics.median(cpu):.1f} µs/job"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--database-url")
    p.add_argument("--loop", choices=("asyncio", "trio"), default="asyncio")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--fast", action="store_true", help="the no-returning bulk path")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = a.database_url or f"sqlite://{Path(tmp) / 'bench.sqlite3'}"
        anyio.run(bench, url, a.jobs, a.rounds, a.fast, backend=a.loop)


if __name__ == "__main__":
    main()
