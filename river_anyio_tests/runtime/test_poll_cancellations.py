"""A client without notifications (``poll_only`` here; a database without LISTEN/NOTIFY alike)
learns of another client's cancellation of its running job by polling for it, every two
seconds as River's producer polls, on asyncio and trio, PostgreSQL and SQLite."""

from __future__ import annotations

from typing import ClassVar

import anyio
import attrs
import pytest

import river_anyio as river

from ..api.support import client_on
from .conftest import WAIT, FixedClock, get_row, next_event, running

pytestmark = pytest.mark.anyio
S = river.JobState
K = river.EventKind


@attrs.frozen
class Waits:
    kind: ClassVar[str] = "poll_cancel_waits"
    n: int = 0


async def test_a_poll_only_client_notices_another_clients_cancel(
    database_url: str, clock: FixedClock
) -> None:
    started = anyio.Event()
    workers = river.Workers()

    @workers.register(Waits)
    async def work(ctx: river.WorkContext, job: river.Job[Waits]) -> None:
        started.set()
        await anyio.sleep_forever()

    async with (
        running(database_url, workers, clock=clock, job_timeout=None, poll_only=True) as run,
        client_on(database_url, id="outsider") as other,
    ):
        with run.subscribe(K.JOB_CANCELLED, K.JOB_COMPLETED, K.JOB_FAILED) as events:
            job = (await run.client.insert(Waits())).job
            with anyio.fail_after(WAIT):
                await started.wait()
            flagged = await other.jobs.cancel(job.id)  # nothing tells the worker's client
            assert flagged.state is S.RUNNING
            ev = await next_event(events, job_id=job.id, within=6)  # the 2 s poll
        row = await get_row(run, job.id)
    assert ev.kind is K.JOB_CANCELLED
    assert row.state is S.CANCELLED
    assert [e.error for e in row.errors] == ["JobCancelError: job cancelled remotely"]
