"""Benchmark: ``insert_many`` (and the no-returning bulk path) of N jobs, one process.

    python -m river_anyio_tests.bench.insert_many --database-url URL [--loop trio] [--jobs 20000]
        [--client async|blocking|riverqueue|all]

Without ``--database-url`` a temporary SQLite file is used. The database's ``river_job`` table
is emptied before every round, so point it only at a throwaway database. Prints the median and
best jobs/s over the rounds, and the client CPU time per job.

``--client``: the async ``river_anyio.Client`` (the default), the blocking
``river_anyio.blocking.Client``, River's own Python client ``riverqueue`` (its SQLAlchemy
driver on ``postgresql+psycopg``; PostgreSQL only, and ``insert_many`` only: it has no
returning batch insert, its ``insert_many`` returns a count), or ``all`` of them one after
the other on the same database and jobs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import anyio
import attrs

import river_anyio as river
from river_anyio import blocking
from river_anyio.drivers import open_driver
from river_anyio.migrate import Migrator

CLIENTS = ("async", "blocking", "riverqueue")


@attrs.frozen
class NoOp:
    kind: ClassVar[str] = "bench_noop"
    n: int
    name: str = "benchmark"


@attrs.frozen
class RiverqueueNoOp:
    """The same job for riverqueue (its args: a ``kind`` and ``to_json()``)."""

    n: int
    name: str = "benchmark"
    kind: str = "bench_noop"

    def to_json(self) -> str:
        return json.dumps({"n": self.n, "name": self.name})


def report(client: str, label: str, jobs: int, rates: list[float], cpu: list[float]) -> None:
    print(
        f"{client:10} {label} {jobs} jobs x {len(rates)}: "
        f"median {statistics.median(rates):,.0f} jobs/s, best {max(rates):,.0f} jobs/s, "
        f"client CPU {statistics.median(cpu):.1f} µs/job"
    )


def timed(
    insert: Callable[[], int], clear: Callable[[], object], jobs: int, rounds: int
) -> tuple[list[float], list[float]]:
    rates, cpu = [], []
    for _ in range(rounds):
        clear()
        wall0, cpu0 = time.perf_counter(), time.process_time()
        n = insert()
        wall, used = time.perf_counter() - wall0, time.process_time() - cpu0
        assert n == jobs, (n, jobs)
        rates.append(jobs / wall)
        cpu.append(used / jobs * 1e6)
    return rates, cpu


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
    report("async", "insert_many_fast" if fast else "insert_many", jobs, rates, cpu)


def bench_blocking(url: str, jobs: int, rounds: int, fast: bool) -> None:
    """The blocking client, in this thread (no event loop)."""
    args = [NoOp(n=i) for i in range(jobs)]
    with blocking.Client(url) as client:

        def clear() -> None:
            client.jobs.list()  # opens the pooled connection outside the timing
            _delete_all(url)

        def insert() -> int:
            if fast:
                return client.insert_many_fast(args)
            return len(client.insert_many(args))

        rates, cpu = timed(insert, clear, jobs, rounds)
    report("blocking", "insert_many_fast" if fast else "insert_many", jobs, rates, cpu)


def bench_riverqueue(url: str, jobs: int, rounds: int) -> None:
    """riverqueue 0.7's blocking client on its SQLAlchemy driver (PostgreSQL only)."""
    import riverqueue
    import sqlalchemy
    from riverqueue.driver import riversqlalchemy

    if not url.startswith(("postgres://", "postgresql://")):
        print(f"{'riverqueue':10} skipped: PostgreSQL only")
        return
    engine = sqlalchemy.create_engine("postgresql+psycopg://" + url.split("://", 1)[1])
    client: Any = riverqueue.Client(riversqlalchemy.Driver(engine))
    args = [RiverqueueNoOp(n=i) for i in range(jobs)]
    try:
        rates, cpu = timed(
            lambda: int(client.insert_many(args)), lambda: _delete_all(url), jobs, rounds
        )
    finally:
        engine.dispose()
    report("riverqueue", "insert_many", jobs, rates, cpu)


def _delete_all(url: str) -> None:
    async def delete() -> None:
        async with open_driver(url) as driver:
            await driver.executor().execute("DELETE FROM river_job")

    anyio.run(delete)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--database-url")
    p.add_argument("--loop", choices=("asyncio", "trio"), default="asyncio")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--fast", action="store_true", help="the no-returning bulk path")
    p.add_argument("--client", choices=(*CLIENTS, "all"), default="async")
    a = p.parse_args()
    clients = CLIENTS if a.client == "all" else (a.client,)
    with tempfile.TemporaryDirectory() as tmp:
        url = a.database_url or f"sqlite://{Path(tmp) / 'bench.sqlite3'}"
        for client in clients:
            if client == "async":
                anyio.run(bench, url, a.jobs, a.rounds, a.fast, backend=a.loop)
            elif client == "blocking":
                if "async" not in clients:  # the async run migrates
                    anyio.run(_migrate, url)
                bench_blocking(url, a.jobs, a.rounds, a.fast)
            elif a.fast:
                print(f"{'riverqueue':10} skipped: it has no no-returning bulk path")
            else:
                if "async" not in clients:
                    anyio.run(_migrate, url)
                bench_riverqueue(url, a.jobs, a.rounds)


async def _migrate(url: str) -> None:
    async with open_driver(url) as driver:
        await Migrator(driver).up()


if __name__ == "__main__":
    main()
