"""``river-anyio demo``: a small workload with real workers on an embedded SQLite database.

Migrates a temporary SQLite file (or the URL given), inserts a batch of jobs of three kinds,
works them with a running client, then prints what happened. Some outcomes are deliberate, and
the output says so: one job fails once and is retried, one is snoozed, one is cancelled by its
worker, a unique job is deduplicated. A database that already exists (a SQLite file, any
PostgreSQL database) is written to only with ``yes=True`` (``--yes``).
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import ClassVar, TextIO

import anyio
import anyio.lowlevel
import attrs

from ._config import QueueConfig
from ._events import EventKind
from ._insert import InsertManyParams
from ._job import InsertOpts, JobState, UniqueOpts
from ._runtime._entry import open_client
from ._work import Job, Outcome, WorkContext, Workers, cancel, snooze
from .drivers import dialect_of_url, open_driver, redact_url
from .migrate import Migrator


@attrs.frozen
class SendEmail:
    kind: ClassVar[str] = "send_email"
    to: str
    subject: str


@attrs.frozen
class RebuildReport:
    kind: ClassVar[str] = "rebuild_report"
    insert_opts: ClassVar[InsertOpts] = InsertOpts(queue="reports", priority=2)
    report_id: int


@attrs.frozen
class Flaky:
    kind: ClassVar[str] = "flaky"
    behaviour: str


def _workers() -> Workers:
    workers = Workers()

    @workers.register(SendEmail)
    async def send_email(ctx: WorkContext, job: Job[SendEmail]) -> None:
        await anyio.lowlevel.checkpoint()  # a real worker would talk to an SMTP server here

    @workers.register(RebuildReport)
    async def rebuild(ctx: WorkContext, job: Job[RebuildReport]) -> None:
        ctx.set_metadata("rows", job.args.report_id * 10)

    @workers.register(Flaky)
    async def flaky(ctx: WorkContext, job: Job[Flaky]) -> Outcome | None:
        if job.args.behaviour == "fail_once" and job.attempt == 1:
            raise RuntimeError("temporary failure (retried in about a second)")
        if job.args.behaviour == "snooze" and not job.metadata.get("snoozes"):
            return snooze(dt.timedelta(milliseconds=200))
        if job.args.behaviour == "cancel":
            return cancel("nothing to do for this one")
        return None

    return workers


_DELIBERATE = (
    "deliberate outcomes: one flaky job fails once and is retried, one snoozes for 200 ms, "
    "one cancels itself, and a second insert of a unique report job is skipped as a duplicate"
)


async def _demo(url: str, jobs: int, out: TextIO) -> None:
    async with open_driver(url) as driver:
        res = await Migrator(driver).up()
        print(f"migrated {redact_url(url)}: {len(res.versions)} versions applied", file=out)
    print(_DELIBERATE, file=out)

    queues = {"default": QueueConfig(max_workers=20), "reports": QueueConfig(max_workers=2)}
    async with open_client(url, queues=queues, workers=_workers()) as run:
        client = run.client
        with run.subscribe() as events:
            start = time.perf_counter()
            await client.insert_many(
                [
                    InsertManyParams(SendEmail(to=f"user{i}@example.com", subject="Hi"))
                    for i in range(jobs)
                ]
            )
            unique = InsertOpts(unique=UniqueOpts(by_args=True, by_period=dt.timedelta(hours=1)))
            first = await client.insert(RebuildReport(report_id=7), unique)
            second = await client.insert(RebuildReport(report_id=7), unique)
            print(
                f"unique report job {first.job.id}: second insert skipped as duplicate = "
                f"{second.unique_skipped_as_duplicate}",
                file=out,
            )
            for behaviour in ("fail_once", "snooze", "cancel"):
                await client.insert(Flaky(behaviour=behaviour))
            expected = jobs + 4
            finished: Counter[str] = Counter()
            with anyio.fail_after(30):
                async for event in events:
                    if event.kind in (EventKind.JOB_FAILED, EventKind.JOB_SNOOZED):
                        assert event.job is not None
                        print(
                            f"  job {event.job.id} ({event.job.kind}): {event.kind} (deliberate)",
                            file=out,
                        )
                    if event.kind in (EventKind.JOB_COMPLETED, EventKind.JOB_CANCELLED):
                        finished[event.kind] += 1
                    if sum(finished.values()) >= expected:
                        break
            elapsed = time.perf_counter() - start
        print(f"worked {expected} jobs in {elapsed:.2f}s", file=out)
        rows = await client.driver.executor().job_list(limit=expected + 10)
    counts = Counter((r.queue, r.kind, r.state.value) for r in rows)
    print("jobs by queue / kind / state:", file=out)
    for (queue, kind, state), n in sorted(counts.items()):
        print(f"  {queue:<10} {kind:<16} {state:<10} {n}", file=out)
    retried = [r for r in rows if r.kind == "flaky" and r.errors and r.state == JobState.COMPLETED]
    for r in retried:
        print(f"job {r.id} completed on attempt {r.attempt} after: {r.errors[0].error}", file=out)


def _existing(url: str) -> bool:
    """Whether ``url`` names a database that is already there (so may be someone's)."""
    if dialect_of_url(url) == "postgres":
        return True
    from .drivers.sqlite import path_from_url

    path = path_from_url(url)
    return path != ":memory:" and os.path.exists(path)


def run_demo(
    *, database_url: str | None, jobs: int, loop: str, out: TextIO, yes: bool = False
) -> int:
    if jobs < 1:
        raise ValueError("--jobs must be at least 1")
    if database_url is not None and not yes and _existing(database_url):
        raise ValueError(
            f"the demo adds jobs to {redact_url(database_url)}, which already exists; "
            "pass --yes to confirm, or leave out --database-url to use a temporary file"
        )
    with tempfile.TemporaryDirectory(prefix="river_anyio_demo_") as tmp:
        url = database_url or f"sqlite://{Path(tmp) / 'demo.sqlite3'}"
        anyio.run(_demo, url, jobs, out, backend=loop)
    return 0
