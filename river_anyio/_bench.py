"""``river-anyio bench``: how fast this machine inserts and works River jobs.

Like River's own bench: it empties ``river_job`` of the database given (so it refuses without
``--yes``, except on the temporary SQLite file it makes by default), then either inserts
``--num-total-jobs`` no-op jobs up front, before the working client starts, and times their
drain (jobs finished while the client was starting are left out of the rate and of the CPU
per job), or for ``--duration`` keeps a
steady insert rate (``--rate`` jobs/s, from this process) while working them. Progress is
printed every few seconds; the end shows jobs/s and latency percentiles read back from the
rows: pickup (``attempted_at − scheduled_at``) and end-to-end (``finalized_at − created_at``).
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path
from typing import ClassVar, TextIO

import anyio
import attrs

from ._config import Config, ConfigOptions, QueueConfig
from ._insert import InsertManyParams
from ._job import JobState
from ._runtime._entry import open_client
from ._work import Job, WorkContext, Workers
from .drivers import dialect_of_url, open_driver, redact_url
from .migrate import Migrator
from .migrate._migrator import quote_schema

__all__ = ["BenchResult", "run_bench"]

PROGRESS_EVERY = 2.0
INSERT_CHUNK = 5_000


@attrs.frozen
class BenchArgs:
    kind: ClassVar[str] = "river_anyio_bench"
    n: int


async def _noop(ctx: WorkContext, job: Job[BenchArgs]) -> None:
    return None


@attrs.frozen(kw_only=True)
class BenchResult:
    jobs: int
    seconds: float
    jobs_per_second: float
    pickup_p50_ms: float
    pickup_p95_ms: float
    end_to_end_p50_ms: float
    end_to_end_p95_ms: float
    cpu_us_per_job: float


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _bench(
    url: str,
    *,
    total: int | None,
    duration: float | None,
    rate: float | None,
    max_workers: int,
    schema: str | None,
    options: ConfigOptions,
    out: TextIO,
) -> BenchResult:
    async with open_driver(url, schema=schema) as driver:
        await Migrator(driver).up()  # River's bench migrates too (an in-memory database)
        async with driver.transaction() as tx:
            await tx.execute(f"DELETE FROM {quote_schema(schema)}river_job")
        if getattr(driver, "path", None) == ":memory:":
            # the process's in-memory database lives while a driver has it open
            return await _work(url, total, duration, rate, max_workers, schema, options, out)
    return await _work(url, total, duration, rate, max_workers, schema, options, out)


async def _work(
    url: str,
    total: int | None,
    duration: float | None,
    rate: float | None,
    max_workers: int,
    schema: str | None,
    options: ConfigOptions,
    out: TextIO,
) -> BenchResult:
    workers = Workers()
    workers.add(BenchArgs, _noop)
    inserted = 0
    if total is not None:
        # Every job is inserted before the working client starts, so the drain is timed alone.
        insert_start = time.perf_counter()
        async with open_client(url, schema=schema) as inserter:
            for lo in range(0, total, INSERT_CHUNK):
                n = min(INSERT_CHUNK, total - lo)
                await inserter.client.insert_many_fast([BenchArgs(n=lo + i) for i in range(n)])
        inserted = total
        print(
            f"inserted {total:,} jobs in {time.perf_counter() - insert_start:.2f}s; working...",
            file=out,
        )
    config = Config(
        queues={"default": QueueConfig(max_workers=max_workers)}, workers=workers, schema=schema
    )
    async with open_client(url, config, **options) as run:
        client = run.client

        def done() -> int:
            return run.diagnostics.completer.written if run.diagnostics.completer else 0

        cpu0 = time.process_time()
        start = time.perf_counter()
        # jobs finished while the client started are not counted: rate and CPU per job cover
        # the same window
        before = done()
        if total is not None:
            next_report = start + PROGRESS_EVERY
            while done() < total:
                await anyio.sleep(0.005)
                now = time.perf_counter()
                if now >= next_report:
                    next_report = now + PROGRESS_EVERY
                    print(
                        f"  {done():,} / {total:,} jobs ({(done() - before) / (now - start):,.0f}/s)",
                        file=out,
                    )
        else:
            assert duration is not None
            deadline = start + duration
            next_report = start + PROGRESS_EVERY
            interval = 1.0 / rate if rate else 0.0
            i = 0
            next_insert = start
            while (now := time.perf_counter()) < deadline:
                if rate:
                    if now >= next_insert:
                        await client.insert(BenchArgs(n=i))
                        i += 1
                        next_insert += interval
                    await anyio.sleep(max(0.0, next_insert - time.perf_counter()))
                else:
                    # keep a backlog of about two seconds of work
                    if inserted - done() < 10_000:
                        await client.insert_many_fast(
                            [InsertManyParams(BenchArgs(n=inserted + k)) for k in range(2_000)]
                        )
                        inserted += 2_000
                    else:
                        await anyio.sleep(0.01)
                if now >= next_report:
                    next_report = now + PROGRESS_EVERY
                    print(f"  {done():,} jobs worked ({done() / (now - start):,.0f}/s)", file=out)
            inserted = max(inserted, i)
            with anyio.move_on_after(30):
                while done() < inserted:  # noqa: ASYNC110 - sampling progress
                    await anyio.sleep(0.005)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu0
        worked = done() - before
    async with open_driver(url, schema=schema) as driver:
        rows = await driver.executor().job_list(
            states=[JobState.COMPLETED], limit=worked + before + 10
        )
    pickup = [
        (r.attempted_at - r.scheduled_at).total_seconds() * 1000
        for r in rows
        if r.attempted_at is not None
    ]
    e2e = [
        (r.finalized_at - r.created_at).total_seconds() * 1000
        for r in rows
        if r.finalized_at is not None
    ]
    return BenchResult(
        jobs=worked,
        seconds=elapsed,
        jobs_per_second=worked / elapsed if elapsed else 0.0,
        pickup_p50_ms=_pct(pickup, 0.5),
        pickup_p95_ms=_pct(pickup, 0.95),
        end_to_end_p50_ms=_pct(e2e, 0.5),
        end_to_end_p95_ms=_pct(e2e, 0.95),
        cpu_us_per_job=cpu / worked * 1e6 if worked else float("nan"),
    )


def run_bench(
    *,
    database_url: str | None,
    label: str | None = None,
    schema: str | None = None,
    total: int | None,
    duration: float | None,
    rate: float | None,
    max_workers: int,
    loop: str,
    yes: bool,
    fetch_cooldown: float | None,
    out: TextIO = sys.stdout,
) -> int:
    if total is None and duration is None:
        total = 20_000
    in_memory = False  # nothing to lose: no --yes needed
    if database_url is not None and dialect_of_url(database_url) == "sqlite":
        from .drivers.sqlite import path_from_url

        in_memory = path_from_url(database_url) == ":memory:"
    if database_url is not None and not yes and not in_memory:
        raise ValueError(
            f"bench deletes every job in {label or redact_url(database_url)}; pass --yes to confirm"
        )
    options: ConfigOptions = {}
    if fetch_cooldown is not None:
        options["fetch_cooldown"] = fetch_cooldown
    with tempfile.TemporaryDirectory(prefix="river_anyio_bench_") as tmp:
        url = database_url or f"sqlite://{Path(tmp) / 'bench.sqlite3'}"
        print(
            f"bench: {label or redact_url(url)}"
            + (f" (schema {schema})" if schema else "")
            + f", loop {loop}, max_workers {max_workers}, "
            + (f"{total:,} jobs" if total is not None else f"{duration:g}s")
            + (f" at {rate:g} jobs/s" if rate else ""),
            file=out,
        )
        res = anyio.run(
            lambda: _bench(
                url,
                total=total,
                duration=duration,
                rate=rate,
                max_workers=max_workers,
                schema=schema,
                options=options,
                out=out,
            ),
            backend=loop,
        )
    print(
        f"worked {res.jobs:,} jobs in {res.seconds:.2f}s: {res.jobs_per_second:,.0f} jobs/s; "
        f"client CPU {res.cpu_us_per_job:.0f} µs/job\n"
        f"pickup latency p50 {res.pickup_p50_ms:.1f} ms, p95 {res.pickup_p95_ms:.1f} ms; "
        f"end-to-end p50 {res.end_to_end_p50_ms:.1f} ms, p95 {res.end_to_end_p95_ms:.1f} ms",
        file=out,
    )
    return 0


def parse_duration(text: str) -> float:
    """Seconds from ``30s``, ``1m``, ``1m30s``, ``500ms`` or a bare number of seconds."""

    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    total = 0.0
    pos = 0
    for m in re.finditer(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text):
        if m.start() != pos:
            break
        pos = m.end()
        total += float(m[1]) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m[2]]
    if pos != len(text) or total <= 0:
        raise ValueError(f"invalid duration {text!r} (use e.g. 30s, 1m30s, 500ms)")
    return total
