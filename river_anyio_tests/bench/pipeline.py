"""Benchmark aid: the client's work per job between a claim's rows and the completion's
parameters, with no database.

    python -m river_anyio_tests.bench.pipeline [--loop asyncio|trio] [--rounds 200]
    valgrind --tool=cachegrind --cache-sim=no python -m river_anyio_tests.bench.pipeline ...

Claimed rows, built as the PostgreSQL driver loads them (``_queries.JOB_COLUMNS``), go through
``rows_to_jobs``, a queue's ``WorkerPool`` of 50 workers and the ``JobRunner`` (no-op jobs
with the default job timeout) to a consumer that builds the completion statement's
parameters as the completer does. Prints the process CPU per job of the timed rounds.

CPU time on a shared machine wanders; instructions do not. Under cachegrind, run it with two
``--rounds`` values (``PYTHONHASHSEED=0``) and divide the difference of the ``I refs`` totals
by the difference in jobs (``--batch`` × rounds): the instructions per job, repeatable to a
few in a hundred thousand, so a change of 1% shows.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

import anyio
import anyio.lowlevel

import river_anyio as river
from river_anyio._bench import BenchArgs, _noop
from river_anyio._config import client_config
from river_anyio._runtime._clock import SystemClock
from river_anyio._runtime._completer import Finished
from river_anyio._runtime._pool import WorkerPool
from river_anyio._runtime._runner import JobRunner
from river_anyio.drivers.postgres._executor import _completion_columns, rows_to_jobs
from river_anyio.drivers.postgres._queries import JOB_COLUMNS

#: distinct batches of rows, reused in turn (their ids are long finished when they return)
DISTINCT = 10


def claimed_rows(batch: int, first_id: int) -> list[tuple[object, ...]]:
    """Rows as a claim returns them: running, attempt 1, a no-op bench job each."""
    now = dt.datetime.now(dt.UTC)
    rows = []
    for i in range(batch):
        values: dict[str, object] = {
            "id": first_id + i,
            "args::text": f'{{"n": {first_id + i}}}',
            "attempt": 1,
            "attempted_at": now,
            "attempted_by": ["bench_client"],
            "created_at": now,
            "errors::text[]": None,
            "finalized_at": None,
            "kind": BenchArgs.kind,
            "max_attempts": 25,
            "metadata::text": "{}",
            "priority": 1,
            "queue": "default",
            "scheduled_at": now,
            "state::text": "running",
            "tags::text[]": [],
            "unique_key": None,
            "unique_states::integer": None,
        }
        rows.append(tuple(values[column] for column in JOB_COLUMNS))
    return rows


async def run(rounds: int, batch: int) -> float:
    """CPU seconds per job over ``rounds`` claims of ``batch`` rows."""
    workers = river.Workers()
    workers.add(BenchArgs, _noop)
    config = client_config(
        river.Config(queues={"default": river.QueueConfig(max_workers=50)}, workers=workers), {}
    )
    batches = [claimed_rows(batch, 1 + r * batch) for r in range(DISTINCT)]
    send, receive = anyio.create_memory_object_stream[Finished](10_000)
    runner = JobRunner(
        config=config,
        client=None,  # type: ignore[arg-type]
        clock=SystemClock(),
        send=send,
        thread_limiter=anyio.CapacityLimiter(1),
    )
    pool = WorkerPool(runner=runner, max_workers=50, name="pipeline")
    total = rounds * batch
    finished = anyio.Event()
    done = 0

    async def complete() -> None:
        nonlocal done
        with receive:
            async for item in receive:
                taken = [item]
                while True:
                    try:
                        taken.append(receive.receive_nowait())
                    except anyio.WouldBlock:
                        break
                _completion_columns(taken, "bench_client")
                done += len(taken)
                if done >= total:
                    finished.set()

    with send:
        async with anyio.create_task_group() as tg:
            tg.start_soon(complete)
            await tg.start(pool.run)
            start = time.process_time()
            for r in range(rounds):
                pool.dispatch(rows_to_jobs(batches[r % DISTINCT]))
                while len(pool) > batch // 2:  # the next claim when half is worked, as a refill
                    await anyio.lowlevel.checkpoint()
            await finished.wait()
            cpu = time.process_time() - start
            pool.close()
            tg.cancel_scope.cancel("pipeline measured")
    return cpu / total


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--rounds", type=_positive, default=200, help="claims to time")
    parser.add_argument("--batch", type=_positive, default=100, help="rows a claim")
    args = parser.parse_args(argv)
    per_job = anyio.run(run, args.rounds, args.batch, backend=args.loop)
    print(f"{args.loop}: {per_job * 1e6:.2f} µs of CPU per job ({args.rounds} × {args.batch})")


if __name__ == "__main__":
    main()
