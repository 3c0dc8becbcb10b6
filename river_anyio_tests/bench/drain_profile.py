"""Benchmark aid: where a drain's time goes, between the claims, the completions and the
client's CPU.

    python -m river_anyio_tests.bench.drain_profile --database-url URL --yes [-n 20000]
        [--loop asyncio|trio] [--max-workers 50]

Deletes every job in the database, inserts ``-n`` no-op jobs, then drains them with a client
at its defaults (as ``river-anyio bench -n`` does) through a driver that times each claim and
each completion statement. Over the drain (from the first claim's start to the end of the
completion that wrote the last job) it reports:

- the claims: how many, their rows and milliseconds, the gap from one claim's reply to the
  next claim's start (p50), and the share of the drain with a claim in flight;
- the completions: the same shares, the most jobs claimed and not yet written when a
  completion began, and how long after the last claim's reply the last one ended;
- the client: its CPU per job and in cores (the process's, so SQLite's own threads count
  too), and the share of it the cyclic garbage collector took (``gc.callbacks``).

Claims back to back with the client below one core: the drain waits for the database (or
for a core the database has). Gaps between claims with the client near a core: the drain
waits for the client.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import anyio
import attrs

from river_anyio import Config, QueueConfig, Workers, open_client
from river_anyio._bench import BenchArgs, _noop, clear_jobs, insert_noop_jobs
from river_anyio.drivers import Driver, Executor, open_driver


@attrs.frozen
class Statement:
    """One timed statement: its start and end (``time.perf_counter``) and its jobs."""

    start: float
    end: float
    jobs: int


@attrs.frozen
class Profile:
    jobs: int
    seconds: float
    claims: tuple[Statement, ...]
    completions: tuple[Statement, ...]
    cpu_seconds: float
    gc_seconds: float
    full_collections: int

    @property
    def claim_gap_p50(self) -> float:
        """Seconds from a claim's reply to the next claim's start, the median."""
        gaps = [b.start - a.end for a, b in zip(self.claims, self.claims[1:], strict=False)]
        return statistics.median(gaps) if gaps else 0.0

    @property
    def claiming(self) -> float:
        """The share of the drain with a claim in flight (a producer claims one at a time)."""
        return sum(s.end - s.start for s in self.claims) / self.seconds

    @property
    def writing(self) -> float:
        """The share of the drain with a completion in flight (one at a time)."""
        return sum(s.end - s.start for s in self.completions) / self.seconds

    @property
    def most_unwritten(self) -> int:
        """The most jobs claimed and not yet written when a completion began."""
        most = 0
        for c in self.completions:
            claimed = sum(s.jobs for s in self.claims if s.end <= c.start)
            written = sum(s.jobs for s in self.completions if s.end <= c.start)
            most = max(most, claimed - written)
        return most

    @property
    def tail(self) -> float:
        """Seconds from the last claim's reply to the end of the drain."""
        return self.completions[-1].end - self.claims[-1].end

    def report(self, loop: str, max_workers: int) -> str:
        claims, completions = self.claims, self.completions
        cpu_per_job = self.cpu_seconds / self.jobs
        gc_share = self.gc_seconds / self.cpu_seconds if self.cpu_seconds else 0.0
        return "\n".join(
            [
                f"drain of {self.jobs:,} jobs ({loop}, {max_workers} workers): "
                f"{self.seconds:.2f}s, {self.jobs / self.seconds:,.0f} jobs/s",
                f"claims: {len(claims)} of {self.jobs / len(claims):.0f} jobs on average, "
                f"{_mean_ms(claims):.2f} ms each; {self.claim_gap_p50 * 1e3:.2f} ms from one's "
                f"reply to the next (p50); a claim in flight {self.claiming:.0%} of the drain",
                f"completions: {len(completions)} of {self.jobs / len(completions):.0f} jobs "
                f"on average, {_mean_ms(completions):.2f} ms each; one in flight "
                f"{self.writing:.0%} of the drain; claimed and not yet written: at most "
                f"{self.most_unwritten:,}; the last ended {self.tail * 1e3:.0f} ms after the "
                "last claim's reply",
                f"client: {cpu_per_job * 1e6:.0f} µs of CPU per job "
                f"({self.cpu_seconds / self.seconds:.2f} cores); the cyclic garbage collector "
                f"{gc_share:.0%} of it ({self.full_collections} full collections)",
            ]
        )


def _mean_ms(statements: Sequence[Statement]) -> float:
    return statistics.fmean(s.end - s.start for s in statements) * 1e3


class _GarbageClock:
    """Time in the cyclic garbage collector while ``on``, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.on = False
        self.seconds = 0.0
        self.full = 0
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._began = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._began
        if info["generation"] == 2:
            self.full += 1


class TimedDriver:
    """A :class:`~river_anyio.drivers.Driver` around ``inner`` that times every claim and
    completion statement, and notes the process's CPU time and the collector's from the
    first claim until ``total`` jobs are written."""

    def __init__(self, inner: Driver, total: int, garbage: _GarbageClock) -> None:
        self.inner = inner
        self.total = total
        self.claims: list[Statement] = []
        self.completions: list[Statement] = []
        self.written = 0
        self.cpu_start = 0.0
        self.cpu_end = 0.0
        self.done = anyio.Event()
        self._garbage = garbage

    def executor(self) -> Executor:
        return _TimedExecutor(self.inner.executor(), self)  # type: ignore[return-value]

    def __getattr__(self, name: str) -> Any:  # the rest of the Driver protocol
        return getattr(self.inner, name)

    def claiming(self) -> None:
        """A claim begins: the first one starts the drain's clocks."""
        if not self._garbage.on and not self.done.is_set():
            self.cpu_start = time.process_time()
            self._garbage.on = True

    def claimed(self, start: float, jobs: int) -> None:
        if jobs and not self.done.is_set():
            self.claims.append(Statement(start, time.perf_counter(), jobs))

    def wrote(self, start: float, jobs: int) -> None:
        if self.done.is_set():
            return
        self.completions.append(Statement(start, time.perf_counter(), jobs))
        self.written += jobs
        if self.written >= self.total:
            self.cpu_end = time.process_time()
            self._garbage.on = False
            self.done.set()


class _TimedExecutor:
    def __init__(self, inner: Executor, driver: TimedDriver) -> None:
        self._inner = inner
        self._driver = driver

    async def job_get_available(self, **kwargs: Any) -> Any:
        self._driver.claiming()
        start = time.perf_counter()
        rows = await self._inner.job_get_available(**kwargs)
        self._driver.claimed(start, len(rows))
        return rows

    async def job_set_state_if_running_many(self, completions: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        results = await self._inner.job_set_state_if_running_many(completions, **kwargs)
        self._driver.wrote(start, len(completions))
        return results

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def profile(url: str, *, total: int, max_workers: int = 50) -> Profile:
    """Drain ``total`` no-op jobs from the database at ``url`` (every job in it is deleted
    first) and profile the drain."""
    async with open_driver(url) as driver:
        await clear_jobs(driver, None, sys.stdout)
        await insert_noop_jobs(driver, None, total)
        workers = Workers()
        workers.add(BenchArgs, _noop)
        config = Config(queues={"default": QueueConfig(max_workers=max_workers)}, workers=workers)
        garbage = _GarbageClock()
        timed = TimedDriver(driver, total, garbage)
        gc.callbacks.append(garbage)
        try:
            async with open_client(timed, config):
                await timed.done.wait()
        finally:
            gc.callbacks.remove(garbage)
    claims, completions = timed.claims, timed.completions
    return Profile(
        jobs=timed.written,
        seconds=completions[-1].end - claims[0].start,
        claims=tuple(claims),
        completions=tuple(completions),
        cpu_seconds=timed.cpu_end - timed.cpu_start,
        gc_seconds=garbage.seconds,
        full_collections=garbage.full,
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m river_anyio_tests.bench.drain_profile")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--yes", action="store_true", help="confirm: every job is deleted")
    parser.add_argument("-n", type=_positive, default=20_000)
    parser.add_argument("--loop", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--max-workers", type=_positive, default=50)
    args = parser.parse_args(argv)
    if not args.yes:
        parser.error("every job in the database is deleted; pass --yes to confirm")
    result = anyio.run(
        lambda: profile(args.database_url, total=args.n, max_workers=args.max_workers),
        backend=args.loop,
    )
    print(result.report(args.loop, args.max_workers))


if __name__ == "__main__":
    main()
