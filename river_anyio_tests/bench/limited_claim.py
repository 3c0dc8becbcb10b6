"""Benchmark: what a claim costs on a queue with global limits, against an unlimited one.

    python -m river_anyio_tests.bench.limited_claim [--database-url URL] [--loop trio]
        [--claims 300] [--batch 10]

Claims ``--batch`` rows ``--claims`` times, one claim after another from one process, for an
unlimited queue (``job_get_available``, River's one statement) and for the limited claim
(``job_get_available_limited``) with ``global_max_workers``, with a ``rate_limit``, and with
both; the limits are set high so they never bind, so every claim does all of its work. Prints
the median and 95th percentile wall time per claim and the client CPU per claim. Without
``--database-url`` a temporary SQLite file is used. The database's ``river_job`` table is
emptied first: point it only at a throwaway database.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import anyio
import attrs

import river_anyio as river
from river_anyio.drivers import Executor, open_driver
from river_anyio.migrate import LINE_RIVER_ANYIO, Migrator

QUEUE = "bench_limited"


@attrs.frozen
class NoOp:
    kind: ClassVar[str] = "bench_noop"


VARIANTS: dict[str, dict[str, Any] | None] = {
    "unlimited": None,
    "global_max_workers": {"global_max_workers": 10_000_000},
    "rate_limit": {"rate_limit": river.RateLimit(1_000_000, per=1)},
    "both": {"global_max_workers": 10_000_000, "rate_limit": river.RateLimit(1_000_000, per=1)},
}


async def claim(ex: Executor, batch: int, limits: dict[str, Any] | None) -> int:
    if limits is None:
        rows = await ex.job_get_available(queue=QUEUE, max_to_lock=batch, client_id="bench")
        return len(rows)
    got = await ex.job_get_available_limited(
        queue=QUEUE, max_to_lock=batch, client_id="bench", **limits
    )
    return len(got.jobs)


async def bench(url: str, claims: int, batch: int) -> None:
    async with open_driver(url) as driver:
        await Migrator(driver).up()
        await Migrator(driver, line=LINE_RIVER_ANYIO).up()
        ex = driver.executor()
        args = [river.InsertManyParams(NoOp(), river.InsertOpts(queue=QUEUE))] * (claims * batch)
        base: float | None = None
        async with river.open_client(driver) as run:
            for name, limits in VARIANTS.items():
                await ex.execute("DELETE FROM river_job")
                await ex.execute("DELETE FROM river_anyio_queue_limit")
                await run.client.insert_many_fast(args)
                walls: list[float] = []
                cpu0 = time.process_time()
                for _ in range(claims):
                    t0 = time.perf_counter()
                    n = await claim(ex, batch, limits)
                    walls.append(time.perf_counter() - t0)
                    assert n == batch, (name, n)
                cpu = (time.process_time() - cpu0) / claims
                median = statistics.median(walls)
                p95 = statistics.quantiles(walls, n=20)[-1]
                base = median if base is None else base
                print(
                    f"{driver.dialect} {name:>18}: median {median * 1e3:.3f} ms/claim "
                    f"(x{median / base:.2f}), p95 {p95 * 1e3:.3f} ms, "
                    f"client CPU {cpu * 1e6:.0f} µs/claim ({claims} claims of {batch})"
                )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--database-url")
    p.add_argument("--loop", choices=("asyncio", "trio"), default="asyncio")
    p.add_argument("--claims", type=int, default=300)
    p.add_argument("--batch", type=int, default=10)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = a.database_url or f"sqlite://{Path(tmp) / 'bench.sqlite3'}"
        anyio.run(bench, url, a.claims, a.batch, backend=a.loop)


if __name__ == "__main__":
    main()
