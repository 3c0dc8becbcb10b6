"""Numbers in a job's metadata that Python's floats cannot hold (beyond int64, beyond float
range, more digits than a double keeps) are stored unchanged by the runtime's writes: an
output, a snooze and a remote cancel merge their keys into the row on the database, never
re-encoding the row's metadata through Python values. On both databases and both loops."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, ClassVar

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio._job import JobState
from river_anyio.drivers import Driver
from river_anyio.drivers._protocol import JobInsertParams

from .conftest import WAIT, next_event, running

pytestmark = pytest.mark.anyio

K = river.EventKind
NUMBERS = (
    '{"negative":-9223372036854775808,"big_integer":123456789012345678901234567890,'
    '"beyond_float":1e400,"long_decimal":0.1000000000000000055511151231257827}'
)


def exact(text: str) -> dict[str, Decimal]:
    """A JSON object's numbers as exact decimals (1e400 equals PostgreSQL's 401 digits)."""
    value: dict[str, Decimal] = json.loads(text, parse_float=Decimal, parse_int=Decimal)
    return value


EXPECTED = exact(NUMBERS)


@attrs.frozen
class Outputs:
    kind: ClassVar[str] = "numbers_output"


@attrs.frozen
class Snoozes:
    kind: ClassVar[str] = "numbers_snooze"


@attrs.frozen
class Waits:
    kind: ClassVar[str] = "numbers_cancel"


async def insert_raw(driver: Driver, kind: str) -> int:
    """A job whose metadata is ``NUMBERS`` as written by another client (not through Python
    values)."""
    params = JobInsertParams(
        encoded_args=b"{}",
        kind=kind,
        max_attempts=25,
        metadata=NUMBERS.encode(),
        priority=1,
        queue="default",
        state=JobState.AVAILABLE,
        tags=(),
    )
    async with driver.transaction() as tx:
        (res,) = await tx.job_insert_fast_many([params])
    return res.job.id


async def stored_numbers(driver: Driver, job_id: int) -> dict[str, Decimal]:
    ex = driver.executor()
    if driver.dialect == "postgres":
        sql = "SELECT metadata::text FROM river_job WHERE id = %s"
    else:
        sql = "SELECT json(metadata) FROM river_job WHERE id = ?"
    rows = await ex.fetch_all(sql, (job_id,))
    return {k: v for k, v in exact(rows[0][0]).items() if k in EXPECTED}


async def test_numbers_beyond_python_floats_survive_output_snooze_and_cancel(
    database_url: str,
) -> None:
    started = anyio.Event()

    async def outputs(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        ctx.record_output({"ok": True})

    async def snoozes(ctx: river.WorkContext, job: river.Job[Any]) -> river.Outcome:
        return river.snooze(3600)

    async def waits(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        started.set()
        await anyio.sleep_forever()

    workers = river.Workers()
    workers.add(Outputs, outputs)
    workers.add(Snoozes, snoozes)
    workers.add(Waits, waits)
    async with river.open_client(database_url) as setup:
        driver = setup.client.driver
        ids = [await insert_raw(driver, k) for k in (Outputs.kind, Snoozes.kind, Waits.kind)]
        for job_id in ids:
            assert await stored_numbers(driver, job_id) == EXPECTED
    async with running(database_url, workers, job_timeout=None) as run:
        with run.subscribe(K.JOB_COMPLETED, K.JOB_SNOOZED, K.JOB_CANCELLED) as events:
            with anyio.fail_after(WAIT):
                await started.wait()
            flagged = await run.client.jobs.cancel(ids[2])
            assert flagged.state is JobState.RUNNING
            assert "cancel_attempted_at" in flagged.metadata
            seen = {(await next_event(events, where=lambda e: e.job is not None)).kind for _ in ids}
        assert seen == {K.JOB_COMPLETED, K.JOB_SNOOZED, K.JOB_CANCELLED}
        driver = run.client.driver
        states = [(await driver.executor().job_get_by_id(i)) for i in ids]
        assert [s.state if s else None for s in states] == [
            JobState.COMPLETED,
            JobState.SCHEDULED,
            JobState.CANCELLED,
        ]
        for job_id in ids:
            assert await stored_numbers(driver, job_id) == EXPECTED, job_id
