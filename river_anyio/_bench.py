"""``river-anyio bench``: how fast this machine inserts and works River jobs.

Like River's own bench it empties ``river_job`` of the database given (so it refuses without
``--yes``, except on the temporary SQLite file it makes by default). Three modes:

- drain (``-n``): inserts that many no-op jobs up front, before the working client starts, and
  times their drain (jobs finished while the client was starting are left out of the rate and
  of the CPU per job);
- steady rate (``--duration`` with ``--rate``): ``--rate`` jobs a second are inserted on a fixed
  schedule while the client works them, either by the working client itself (``--inserter
  client``) or by a separate OS process with its own client on the same database (``--inserter
  process``, as in real applications); ``--insert`` picks one ``insert`` per job (up to 16 in
  flight), bursts of ``--insert-size`` concurrent ``insert`` calls, or one ``insert_many`` of
  ``--insert-size`` jobs; ``--in-flight 1`` makes each call wait for the one before, as the
  peers' benchmarks insert (a late call delays the next one's start instead of running beside
  it, so the inserter's own queueing stays out of the figures). Each job carries
  ``time.time()`` taken just before the call that inserts it and the worker reads
  ``time.time()`` when the job's body starts: enqueue-to-start with one clock (the
  machine's), whichever process inserted, also reported in parts (the insert call, inserted
  to claimed, claimed to the body's start);
- continuous (``--duration`` alone): River's ``river bench`` method: a backlog of ``--backlog``
  jobs (River's 75,000) is inserted before the client starts, then every 250 ms topped up in
  batches of 5,000 by the working process; the rate is the jobs worked over the run.

Progress is printed every few seconds; the end shows jobs/s and latency percentiles read back
from the rows: pickup (``attempted_at − scheduled_at``) and end-to-end
(``finalized_at − created_at``), plus enqueue-to-start in the steady-rate mode.
"""

from __future__ import annotations

import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Literal, TextIO

import anyio
import attrs

from ._client import Client
from ._config import Config, ConfigOptions, QueueConfig
from ._errors import DatabaseError
from ._insert import InsertManyParams
from ._job import JobState
from ._runtime._entry import open_client
from ._work import Job, WorkContext, Workers
from .drivers import Driver, dialect_of_url, open_driver, redact_url
from .migrate import Migrator
from .migrate._migrator import quote_schema

__all__ = ["BenchResult", "run_bench"]

PROGRESS_EVERY = 2.0
INSERT_CHUNK = 5_000
#: River's bench: the continuous mode tops the backlog up to this many jobs ...
BACKLOG = 75_000
#: ... in batches of this many, checking every REFILL_EVERY seconds.
REFILL_BATCH = 5_000
REFILL_EVERY = 0.25
#: How long the end of a run waits for the jobs still in flight.
FINISH_TIMEOUT = 30.0
#: The separate inserter process reads the database URL from here (not argv: ``ps`` shows it).
URL_VARIABLE = "RIVER_ANYIO_BENCH_URL"

Inserter = Literal["client", "process"]
InsertStyle = Literal["one", "burst", "many"]
#: The steady-rate mode's ceiling on insert calls in flight at once (bursts bigger than half of
#: it excepted: two of them may overlap).
IN_FLIGHT = 16
#: ``--in-flight`` at most (each insert call in flight holds a connection).
MAX_IN_FLIGHT = 100
#: ``--insert-size`` when not given: ``one`` inserts a job per call, the others this many.
DEFAULT_INSERT_SIZE = 10


@attrs.frozen(kw_only=True)
class InsertSchedule:
    """How the steady-rate mode inserts: ``rate`` jobs a second for ``duration`` seconds, in
    ticks of ``size`` jobs every ``size / rate`` seconds (``one``: ``size`` is 1)."""

    rate: float
    duration: float
    style: InsertStyle = "one"
    size: int = 1
    #: ticks in flight at most (``--in-flight``); None: IN_FLIGHT insert calls, but always
    #: two bursts, so one slow burst does not hold back the next
    max_ticks: int | None = None

    @property
    def lanes(self) -> int:
        """Ticks in flight at once."""
        if self.max_ticks is not None:
            return self.max_ticks
        return max(2, IN_FLIGHT // self.size) if self.style == "burst" else IN_FLIGHT

    @property
    def in_flight(self) -> int:
        """Insert calls in flight at most."""
        return self.lanes * self.size if self.style == "burst" else self.lanes

    def describe(self) -> str:
        what = {
            "one": "one insert each",
            "burst": f"bursts of {self.size} concurrent inserts",
            "many": f"insert_many of {self.size} each",
        }[self.style]
        burst = self.style == "burst"
        if self.lanes == 1:
            return f"{what}, one{' burst' if burst else ''} at a time"
        return f"{what}, up to {self.lanes}{' bursts' if burst else ''} at once"


@attrs.frozen
class BenchArgs:
    kind: ClassVar[str] = "river_anyio_bench"
    n: int


@attrs.frozen
class BenchTimedArgs:
    """A steady-rate job: ``t`` is ``time.time()`` just before it was inserted."""

    kind: ClassVar[str] = "river_anyio_bench_timed"
    n: int
    t: float


async def _noop(ctx: WorkContext, job: Job[BenchArgs]) -> None:
    return None


@attrs.frozen(kw_only=True)
class BenchResult:
    jobs: int
    seconds: float
    jobs_per_second: float
    pickup_p50_ms: float
    pickup_p95_ms: float
    pickup_p99_ms: float
    end_to_end_p50_ms: float
    end_to_end_p95_ms: float
    end_to_end_p99_ms: float
    cpu_us_per_job: float
    #: Steady-rate mode: how many jobs were inserted, in how long (the duration, or until the
    #: last insert returned if later), and the enqueue-to-start percentiles.
    inserted: int | None = None
    insert_seconds: float = math.nan
    start_p50_ms: float = math.nan
    start_p95_ms: float = math.nan
    start_p99_ms: float = math.nan
    #: Steady-rate mode: enqueue-to-start in its three parts (None when no job had all three)
    parts: Parts | None = None
    #: Continuous mode: no row latencies (jobs wait behind the backlog by design).
    backlog: int | None = None


@attrs.frozen(kw_only=True)
class Parts:
    """Enqueue-to-start of the steady-rate mode in its three parts, each in ms: the insert call
    (``time.time()`` before it to after it returned: the job is committed), inserted to
    claimed (to the row's ``attempted_at``, the database's time of the claim) and claimed to
    the job body's start. Each part's p50 and p99 over every job, and its mean over the
    slowest 1% of jobs (by enqueue-to-start): where the tail's time goes."""

    insert: tuple[float, float, float]
    to_claim: tuple[float, float, float]
    to_start: tuple[float, float, float]


def _parts(jobs: list[tuple[float, float, float]]) -> Parts | None:
    """The breakdown of ``(insert, to_claim, to_start)`` per job, in ms."""
    if not jobs:
        return None
    slowest = sorted(jobs, key=sum)[-max(1, len(jobs) // 100) :]

    def part(i: int) -> tuple[float, float, float]:
        values = [job[i] for job in jobs]
        tail = sum(job[i] for job in slowest) / len(slowest)
        return (_pct(values, 0.5), _pct(values, 0.99), tail)

    return Parts(insert=part(0), to_claim=part(1), to_start=part(2))


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


@attrs.frozen(kw_only=True)
class _Plan:
    url: str
    schema: str | None
    total: int | None
    duration: float | None
    rate: float | None
    inserter: Inserter
    #: the steady-rate mode's inserts (None in the other modes)
    schedule: InsertSchedule | None
    backlog: int
    max_workers: int
    loop: str
    options: ConfigOptions


async def _bench(plan: _Plan, out: TextIO) -> BenchResult:
    async with open_driver(plan.url, schema=plan.schema) as driver:
        await clear_jobs(driver, plan.schema, out)
        if getattr(driver, "path", None) == ":memory:":
            # the process's in-memory database lives while a driver has it open
            return await _work(plan, out)
    return await _work(plan, out)


async def clear_jobs(driver: Driver, schema: str | None, out: TextIO) -> None:
    """Migrate the database and delete every job, so each run starts from the same state."""
    await Migrator(driver).up()  # River's bench migrates too (an in-memory database)
    async with driver.transaction() as tx:
        await tx.execute(f"DELETE FROM {quote_schema(schema)}river_job")
    if driver.dialect == "postgres":
        # River's bench also VACUUM FULLs the table
        try:
            await driver.executor().execute(f"VACUUM FULL {quote_schema(schema)}river_job")
        except DatabaseError as exc:
            print(f"(VACUUM FULL river_job skipped: {exc})", file=out)


async def insert_noop_jobs(database: str | Driver, schema: str | None, total: int) -> None:
    """Insert ``total`` no-op jobs with a client of their own."""
    async with open_client(database, schema=schema) as inserter:
        for lo in range(0, total, INSERT_CHUNK):
            n = min(INSERT_CHUNK, total - lo)
            await inserter.client.insert_many_fast([BenchArgs(n=lo + i) for i in range(n)])


async def _insert_backlog(plan: _Plan, total: int, out: TextIO) -> None:
    """Insert ``total`` no-op jobs with a client of their own, before the working one starts."""
    insert_start = time.perf_counter()
    await insert_noop_jobs(plan.url, plan.schema, total)
    print(
        f"inserted {total:,} jobs in {time.perf_counter() - insert_start:.2f}s; working...",
        file=out,
    )


async def _work(plan: _Plan, out: TextIO) -> BenchResult:
    #: steady-rate jobs started: n -> (time.time() before its insert, at its body's start)
    started: dict[int, tuple[float, float]] = {}
    #: n -> time.time() when the insert call of job n returned
    returned: dict[int, float] = {}

    async def timed(ctx: WorkContext, job: Job[BenchTimedArgs]) -> None:
        started[job.args.n] = (job.args.t, time.time())

    workers = Workers()
    workers.add(BenchArgs, _noop)
    workers.add(BenchTimedArgs, timed)
    inserted = 0
    insert_seconds = math.nan
    if plan.total is not None:
        # Every job is inserted before the working client starts, so the drain is timed alone.
        await _insert_backlog(plan, plan.total, out)
        inserted = plan.total
    elif plan.rate is None:
        await _insert_backlog(plan, plan.backlog, out)  # River's bench waits for it too
        inserted = plan.backlog
    config = Config(
        queues={"default": QueueConfig(max_workers=plan.max_workers)},
        workers=workers,
        schema=plan.schema,
    )
    timed_out = False
    async with open_client(plan.url, config, **plan.options) as run:
        client = run.client

        def done() -> int:
            completer = run.diagnostics.completer  # (diagnostics are built on each read)
            return completer.written if completer else 0

        cpu0 = time.process_time()
        start = time.perf_counter()
        # jobs finished while the client started are not counted: rate and CPU per job cover
        # the same window
        before = done()
        next_report = start + PROGRESS_EVERY
        if plan.total is not None:
            while done() < plan.total:
                await anyio.sleep(0.005)
                now = time.perf_counter()
                if now >= next_report:
                    next_report = now + PROGRESS_EVERY
                    print(
                        f"  {done():,} / {plan.total:,} jobs "
                        f"({(done() - before) / (now - start):,.0f}/s)",
                        file=out,
                    )
        elif plan.rate is None:
            assert plan.duration is not None
            deadline = start + plan.duration
            last_worked = done()
            while (now := time.perf_counter()) < deadline:
                if inserted - done() < plan.backlog:
                    while inserted - done() < plan.backlog:
                        await client.insert_many_fast(
                            [
                                InsertManyParams(BenchArgs(n=inserted + k))
                                for k in range(REFILL_BATCH)
                            ]
                        )
                        inserted += REFILL_BATCH
                await anyio.sleep(min(REFILL_EVERY, max(0.0, deadline - time.perf_counter())))
                if now >= next_report:
                    next_report = now + PROGRESS_EVERY
                    worked = done()
                    print(
                        f"  {worked - last_worked:,} jobs worked in the last "
                        f"{PROGRESS_EVERY:g}s; {inserted:,} inserted in all",
                        file=out,
                    )
                    last_worked = worked
        else:
            schedule = plan.schedule
            assert schedule is not None
            if plan.inserter == "process":
                inserted, insert_seconds = await _insert_from_process(
                    plan, schedule, done, out, returned
                )
            else:
                inserted, insert_seconds = await _insert_at_rate(
                    client, schedule, lambda: done() - before, out, returned
                )
            with anyio.move_on_after(FINISH_TIMEOUT) as finish:
                while len(started) < inserted or done() - before < inserted:  # noqa: ASYNC110
                    await anyio.sleep(0.005)
            timed_out = finish.cancelled_caught
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu0
        worked = done() - before
    if timed_out:
        print(
            f"warning: {inserted - len(started):,} of {inserted:,} jobs had not started "
            f"{FINISH_TIMEOUT:g}s after the last insert",
            file=out,
        )
    pickup: list[float] = []
    e2e: list[float] = []
    parts: list[tuple[float, float, float]] = []
    if plan.total is not None or plan.rate is not None:
        async with open_driver(plan.url, schema=plan.schema) as driver:
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
        for r in rows:
            if r.kind != BenchTimedArgs.kind or r.attempted_at is None:
                continue
            n = r.args["n"]
            if n not in started or n not in returned:
                continue
            t, start = started[n]
            after = returned[n]
            claimed = r.attempted_at.timestamp()
            parts.append(((after - t) * 1000, (claimed - after) * 1000, (start - claimed) * 1000))
    started_ms = [(start - t) * 1000 for t, start in started.values()]
    return BenchResult(
        jobs=worked,
        seconds=elapsed,
        jobs_per_second=worked / elapsed if elapsed else 0.0,
        pickup_p50_ms=_pct(pickup, 0.5),
        pickup_p95_ms=_pct(pickup, 0.95),
        pickup_p99_ms=_pct(pickup, 0.99),
        end_to_end_p50_ms=_pct(e2e, 0.5),
        end_to_end_p95_ms=_pct(e2e, 0.95),
        end_to_end_p99_ms=_pct(e2e, 0.99),
        cpu_us_per_job=cpu / worked * 1e6 if worked else float("nan"),
        inserted=inserted if plan.rate is not None else None,
        insert_seconds=insert_seconds,
        start_p50_ms=_pct(started_ms, 0.5),
        start_p95_ms=_pct(started_ms, 0.95),
        start_p99_ms=_pct(started_ms, 0.99),
        parts=_parts(parts),
        backlog=plan.backlog if plan.total is None and plan.rate is None else None,
    )


async def _insert_at_rate(
    client: Client,
    schedule: InsertSchedule,
    worked: Callable[[], int] | None,
    out: TextIO | None,
    returned: dict[int, float],
) -> tuple[int, float]:
    """Insert ``schedule.rate`` stamped jobs a second for ``schedule.duration``; returns how many
    and the seconds they took (the duration, or longer if the last insert returned later).
    ``returned`` gets ``time.time()`` when each job's insert call returned, by job number.

    The connections the inserts use are opened first. The schedule is fixed: tick j (``size``
    jobs) is due at start + j * size / rate. A few tasks (``schedule.lanes``) each take the
    next due tick, so one slow insert does not delay the next (with one lane it does): a late
    tick is caught up, not dropped, until the duration is over.
    """
    await _open_connections(client, schedule.in_flight)
    size = schedule.size
    interval = size / schedule.rate
    start = time.perf_counter()
    deadline = start + schedule.duration
    next_tick = 0
    inserted = 0
    next_report = start + PROGRESS_EVERY

    async def insert_one(n: int) -> None:
        nonlocal inserted
        await client.insert(BenchTimedArgs(n=n, t=time.time()))
        returned[n] = time.time()
        inserted += 1

    async def insert_tick(first: int) -> None:
        nonlocal inserted
        if schedule.style == "many":
            t = time.time()
            await client.insert_many([BenchTimedArgs(n=first + k, t=t) for k in range(size)])
            after = time.time()
            for k in range(size):
                returned[first + k] = after
            inserted += size
        elif schedule.style == "burst":
            async with anyio.create_task_group() as burst:
                for k in range(size):
                    burst.start_soon(insert_one, first + k)
        else:
            await insert_one(first)

    async def take_ticks() -> None:
        nonlocal next_tick, next_report
        while (due := start + next_tick * interval) < deadline:
            first = next_tick * size
            next_tick += 1
            await anyio.sleep(max(0.0, due - time.perf_counter()))
            if (now := time.perf_counter()) >= deadline:
                return  # too far behind: the duration is over
            if out is not None and worked is not None and now >= next_report:
                next_report = now + PROGRESS_EVERY
                print(f"  {inserted:,} inserted, {worked():,} worked", file=out)
            await insert_tick(first)

    async with anyio.create_task_group() as lanes:
        for _ in range(schedule.lanes):
            lanes.start_soon(take_ticks)
    await anyio.sleep(max(0.0, deadline - time.perf_counter()))  # the schedule spans it all
    return inserted, time.perf_counter() - start


async def _open_connections(client: Client, wanted: int) -> None:
    """Open the connections the inserts will use before the schedule starts (PostgreSQL): a
    pool opens them on first use, and the first inserts of a run would otherwise wait for
    them, tens of milliseconds each, which an application's pool has long done by the time it
    runs steadily. Holds up to ``wanted`` pooled connections at once (no more than the pool's
    size), then gives them back."""
    if client.driver.dialect != "postgres":
        return
    from .drivers.postgres import PostgresDriver

    driver = client.driver
    assert isinstance(driver, PostgresDriver)
    count = min(wanted, driver.statistics().max_size)
    held = 0
    all_held = anyio.Event()

    async def hold() -> None:
        nonlocal held
        async with driver.transaction():
            held += 1
            if held == count:
                all_held.set()
            await all_held.wait()

    with anyio.fail_after(FINISH_TIMEOUT):
        async with anyio.create_task_group() as tg:
            for _ in range(count):
                tg.start_soon(hold)


async def _insert_from_process(
    plan: _Plan,
    schedule: InsertSchedule,
    done: Callable[[], int],
    out: TextIO,
    returned: dict[int, float],
) -> tuple[int, float]:
    """Run the steady-rate inserts in a separate OS process with its own client; returns how
    many jobs it inserted and in how many seconds (its last line: ``COUNT SECONDS``), and
    fills ``returned`` from the file where it wrote when each insert call returned."""
    with tempfile.TemporaryDirectory(prefix="river_anyio_bench_") as tmp:
        times = Path(tmp) / "returned.txt"
        result = await _run_inserter(plan, schedule, done, out, times)
        for line in (await anyio.Path(times).read_text()).splitlines():
            n, at = line.split()
            returned[int(n)] = float(at)
    return result


async def _run_inserter(
    plan: _Plan, schedule: InsertSchedule, done: Callable[[], int], out: TextIO, times: Path
) -> tuple[int, float]:
    argv = [sys.executable, "-m", "river_anyio._bench_inserter"]
    argv += ["--rate", repr(schedule.rate), "--duration", repr(schedule.duration)]
    argv += ["--insert", schedule.style, "--insert-size", str(schedule.size)]
    if schedule.max_ticks is not None:
        argv += ["--in-flight", str(schedule.max_ticks)]
    argv += ["--loop", plan.loop, "--returned", str(times)]
    if plan.schema:
        argv += ["--schema", plan.schema]
    env = {**os.environ, URL_VARIABLE: plan.url}
    start = time.perf_counter()
    next_report = start + PROGRESS_EVERY
    async with await anyio.open_process(argv, env=env, stderr=None) as process:
        assert process.stdout is not None
        while process.returncode is None:
            with anyio.move_on_after(0.05):
                await process.wait()
            if (now := time.perf_counter()) >= next_report:
                next_report = now + PROGRESS_EVERY
                print(f"  {done():,} worked", file=out)
        output = b""
        async for chunk in process.stdout:
            output += chunk
    lines = output.decode().splitlines()
    last = lines[-1].split() if lines else []
    if process.returncode != 0 or len(last) != 2 or not last[0].isdigit():
        raise RuntimeError(
            f"the inserter process failed (exit status {process.returncode}); see its errors above"
        )
    return int(last[0]), float(last[1])


async def insert_process_main(
    url: str, *, schema: str | None, schedule: InsertSchedule, returned: dict[int, float]
) -> tuple[int, float]:
    """The separate inserter's body (``python -m river_anyio._bench_inserter``); ``returned``
    gets when each job's insert call returned."""
    options: ConfigOptions = {"schema": schema}
    if dialect_of_url(url) == "postgres":
        # a connection for every insert in flight
        options["driver_options"] = {"pool_max_size": schedule.in_flight}
    async with open_client(url, **options) as run:
        return await _insert_at_rate(run.client, schedule, None, None, returned)


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
    fetch_poll_interval: float | None = None,
    claim_ahead: bool = False,
    inserter: Inserter = "client",
    insert: InsertStyle = "one",
    insert_size: int | None = None,
    in_flight: int | None = None,
    backlog: int = BACKLOG,
    out: TextIO = sys.stdout,
) -> int:
    if total is None and duration is None:
        total = 20_000
    in_memory = False  # nothing to lose: no --yes needed
    if database_url is not None and dialect_of_url(database_url) == "sqlite":
        from .drivers.sqlite import path_from_url

        in_memory = path_from_url(database_url) == ":memory:"
    if inserter == "process" and rate is None:
        raise ValueError("--inserter process needs --rate (and --duration)")
    if (insert != "one" or insert_size is not None) and rate is None:
        raise ValueError("--insert and --insert-size need --rate (and --duration)")
    if in_flight is not None:
        if rate is None:
            raise ValueError("--in-flight needs --rate (and --duration)")
        if not 1 <= in_flight <= MAX_IN_FLIGHT:
            raise ValueError(f"--in-flight must be between 1 and {MAX_IN_FLIGHT}")
    if insert_size is None:
        insert_size = 1 if insert == "one" else DEFAULT_INSERT_SIZE
    if insert_size < 1:
        raise ValueError("--insert-size must be at least 1")
    if insert == "one" and insert_size != 1:
        raise ValueError(
            "--insert-size is for --insert burst or many; --insert one inserts one job per call"
        )
    schedule: InsertSchedule | None = None
    if rate is not None:
        if duration is None:
            raise ValueError("--rate needs --duration")
        schedule = InsertSchedule(
            rate=rate, duration=duration, style=insert, size=insert_size, max_ticks=in_flight
        )
    if inserter == "process" and in_memory:
        raise ValueError(
            "--inserter process needs a database another process can open; "
            "sqlite://:memory: belongs to this process (use a file)"
        )
    if database_url is not None and not yes and not in_memory:
        raise ValueError(
            f"bench deletes every job in {label or redact_url(database_url)}; pass --yes to confirm"
        )
    options: ConfigOptions = {}
    if fetch_cooldown is not None:
        options["fetch_cooldown"] = fetch_cooldown
    if fetch_poll_interval is not None:
        options["fetch_poll_interval"] = fetch_poll_interval
    if claim_ahead:
        options["claim_ahead"] = True
    with tempfile.TemporaryDirectory(prefix="river_anyio_bench_") as tmp:
        url = database_url or f"sqlite://{Path(tmp) / 'bench.sqlite3'}"
        if total is not None:
            what = f"{total:,} jobs"
        elif schedule is not None:
            what = f"{duration:g}s at {rate:g} jobs/s inserted by the " + (
                "working client" if inserter == "client" else "separate inserter process"
            )
            what += f" ({schedule.describe()})"
        else:
            what = f"{duration:g}s continuous, backlog {backlog:,}"
        print(
            f"bench: {label or redact_url(url)}"
            + (f" (schema {schema})" if schema else "")
            + f", loop {loop}, max_workers {max_workers}"
            + (", claiming ahead" if claim_ahead else "")
            + f", {what}",
            file=out,
        )
        plan = _Plan(
            url=url,
            schema=schema,
            total=total,
            duration=duration,
            rate=rate,
            inserter=inserter,
            schedule=schedule,
            backlog=backlog,
            max_workers=max_workers,
            loop=loop,
            options=options,
        )
        res = anyio.run(lambda: _bench(plan, out), backend=loop)
    print(
        f"worked {res.jobs:,} jobs in {res.seconds:.2f}s: {res.jobs_per_second:,.0f} jobs/s; "
        f"client CPU {res.cpu_us_per_job:.0f} µs/job",
        file=out,
    )
    if res.backlog is None:
        print(
            f"pickup latency p50 {res.pickup_p50_ms:.1f} ms, p95 {res.pickup_p95_ms:.1f} ms, "
            f"p99 {res.pickup_p99_ms:.1f} ms; end-to-end p50 {res.end_to_end_p50_ms:.1f} ms, "
            f"p95 {res.end_to_end_p95_ms:.1f} ms, p99 {res.end_to_end_p99_ms:.1f} ms",
            file=out,
        )
    if res.inserted is not None:
        print(
            f"enqueue-to-start over {res.inserted:,} jobs: p50 {res.start_p50_ms:.2f} ms, "
            f"p95 {res.start_p95_ms:.2f} ms, p99 {res.start_p99_ms:.2f} ms "
            "(time.time() before the insert to time.time() at the job body's start; one clock)",
            file=out,
        )
        if res.parts is not None:
            print(_describe_parts(res.parts), file=out)
        assert schedule is not None
        achieved = res.inserted / res.insert_seconds if res.insert_seconds > 0 else 0.0
        print(
            f"inserted {res.inserted:,} jobs in {res.insert_seconds:.2f}s: {achieved:,.0f}/s "
            f"(asked {rate:,.6g}/s; {schedule.describe()})",
            file=out,
        )
    return 0


def _describe_parts(parts: Parts) -> str:
    def part(name: str, values: tuple[float, float, float]) -> str:
        p50, p99, tail = values
        return f"{name} {p50:.2f} / {p99:.2f} / {tail:.2f} ms"

    return (
        "  in parts (p50 / p99 / mean over the slowest 1%): "
        + "; ".join(
            (
                part("insert call", parts.insert),
                part("inserted to claimed", parts.to_claim),
                part("claimed to start", parts.to_start),
            )
        )
        + " (claimed: the row's attempted_at, the database's time)"
    )


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
