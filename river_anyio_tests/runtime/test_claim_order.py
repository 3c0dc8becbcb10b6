"""Which jobs a producer claims, in which order, and how many at a time: River's order
(priority, then scheduled_at, then id), and with ``claim_ahead=False`` one claim per free slot,
so a job is ``running`` only once a worker has taken it.

Every test runs on asyncio and trio, on PostgreSQL and SQLite.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, ClassVar

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio.drivers import JobInsertParams, open_driver

from .conftest import WAIT, running

pytestmark = pytest.mark.anyio
S = river.JobState


@attrs.frozen
class Step:
    kind: ClassVar[str] = "claim_order_step"
    name: str = ""


#: In insertion (id) order: (name, priority, scheduled this long ago), as River's
#: conformance harness orders them.
JOBS = [
    ("priority 1, latest", 1, dt.timedelta(seconds=30)),
    ("priority 4", 4, dt.timedelta(minutes=1)),
    ("priority 1, later", 1, dt.timedelta(minutes=1)),
    ("priority 3, earliest", 3, dt.timedelta(minutes=3)),
    ("priority 1, earliest, lower id", 1, dt.timedelta(minutes=2)),
    ("priority 1, earliest, higher id", 1, dt.timedelta(minutes=2)),
]
RIVER_ORDER = [
    "priority 1, earliest, lower id",
    "priority 1, earliest, higher id",
    "priority 1, later",
    "priority 1, latest",
    "priority 3, earliest",
    "priority 4",
]


async def test_one_worker_claims_one_job_at_a_time_in_rivers_order(database_url: str) -> None:
    base = dt.datetime.now(dt.UTC).replace(microsecond=0)
    async with open_driver(database_url) as driver, driver.transaction() as tx:
        await tx.job_insert_fast_many(
            [
                JobInsertParams(
                    encoded_args=json.dumps({"name": name}).encode(),
                    kind=Step.kind,
                    max_attempts=25,
                    metadata=b"{}",
                    priority=priority,
                    queue="default",
                    scheduled_at=base - ago,
                    state=S.AVAILABLE,
                    tags=(),
                )
                for name, priority, ago in JOBS
            ]
        )
    worked: list[str] = []
    claimed_unworked: list[int] = []
    done = anyio.Event()
    workers = river.Workers()

    @workers.register(Step)
    async def work(ctx: river.WorkContext, job: river.Job[Step]) -> None:
        # running in the database and not yet worked here: this job, and any claimed ahead
        # (finished jobs stay running until the completer writes their results)
        held = await ctx.client.jobs.list(states=[S.RUNNING], kinds=[Step.kind])
        names = {json.loads(row.encoded_args)["name"] for row in held.jobs}
        claimed_unworked.append(len(names - set(worked)))
        worked.append(job.args.name)
        if len(worked) == len(JOBS):
            done.set()

    async with running(
        database_url,
        workers,
        queues={"default": river.QueueConfig(max_workers=1)},
        claim_ahead=False,
        fetch_cooldown=0.001,
    ) as run:
        with anyio.fail_after(WAIT):
            await done.wait()
        rows: list[Any] = (await run.client.jobs.list(kinds=[Step.kind])).jobs

    assert worked == RIVER_ORDER
    # no row was claimed ahead of the one worker
    assert claimed_unworked == [1] * len(JOBS)
    by_name = {json.loads(row.encoded_args)["name"]: row for row in rows}
    attempted = [by_name[name].attempted_at for name in RIVER_ORDER]
    assert attempted == sorted(attempted)  # each claimed when its turn came


async def test_claim_ahead_is_a_bool() -> None:
    with pytest.raises(river.ConfigError) as info:
        river.Config(claim_ahead=1)  # type: ignore[arg-type]
    assert info.value.field == "claim_ahead"
