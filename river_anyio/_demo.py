"""``river-anyio demo``: a small workload on an embedded SQLite database (or any URL given)."""

from __future__ import annotations

import datetime as dt
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import ClassVar, TextIO

import anyio
import attrs

from ._insert import InsertManyParams
from ._job import InsertOpts, UniqueOpts
from ._runtime._supervisor import open_client
from ._timeutil import utc_now
from .drivers import open_driver, redact_url
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


async def _demo(url: str, jobs: int, out: TextIO) -> None:
    async with open_driver(url) as driver:
        res = await Migrator(driver).up()
        print(f"migrated {redact_url(url)}: {len(res.versions)} versions applied", file=out)

    async with open_client(url) as run:
        client = run.client
        start = time.perf_counter()
        batch = [
            InsertManyParams(SendEmail(to=f"user{i}@example.com", subject="Welcome <3"))
            for i in range(jobs)
        ]
        results = await client.insert_many(batch)
        elapsed = time.perf_counter() - start
        print(
            f"inserted {len(results)} send_email jobs in {elapsed * 1000:.1f} ms "
            f"({len(results) / elapsed:,.0f} jobs/s)",
            file=out,
        )

        unique = InsertOpts(unique=UniqueOpts(by_args=True, by_period=dt.timedelta(hours=1)))
        first = await client.insert(RebuildReport(report_id=7), unique)
        second = await client.insert(RebuildReport(report_id=7), unique)
        print(
            f"unique job {first.job.id}: second insert skipped as duplicate = "
            f"{second.unique_skipped_as_duplicate} (returned job {second.job.id})",
            file=out,
        )
        later = await client.insert(
            SendEmail(to="later@example.com", subject="Reminder"),
            InsertOpts(scheduled_at=utc_now() + dt.timedelta(minutes=10), tags=["reminder"]),
        )
        print(f"scheduled job {later.job.id} for {later.job.scheduled_at.isoformat()}", file=out)

        rows = await client.driver.executor().job_list(limit=jobs + 10)
        counts = Counter((r.queue, r.kind, r.state.value) for r in rows)
        print("jobs by queue/kind/state:", file=out)
        for (queue, kind, state), n in sorted(counts.items()):
            print(f"  {queue:<10} {kind:<16} {state:<10} {n}", file=out)


def run_demo(*, database_url: str | None, jobs: int, loop: str, out: TextIO) -> int:
    if jobs < 1:
        raise ValueError("--jobs must be at least 1")
    with tempfile.TemporaryDirectory(prefix="river_anyio_demo_") as tmp:
        url = database_url or f"sqlite:///{Path(tmp) / 'demo.sqlite3'}"
        anyio.run(_demo, url, jobs, out, backend=loop)
    return 0
