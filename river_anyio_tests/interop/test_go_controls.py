"""Queue and job controls across languages: pausing a queue from one language stops the
other's producer for it and resuming restarts it; cancelling a running job from one language
stops it in the other."""

from __future__ import annotations

import datetime as dt

import anyio
import pytest

import river_anyio as river

from ._river_go import RiverGo
from ._shared import CLIENT_OPTIONS, QUEUE, ScriptedWorker, Task, collect, task_json, workers

pytestmark = pytest.mark.anyio

E = river.EventKind
#: How long a paused producer is given to (wrongly) start a job: many fetch polls of both
#: clients (0.2 s), and several SQLite outbox polls.
PAUSED_FOR = 1.5


async def next_queue_event(sub: river.Subscription) -> river.Event:
    with anyio.fail_after(30):
        async for event in sub:
            if event.kind in (E.QUEUE_PAUSED, E.QUEUE_RESUMED):
                return event
    raise AssertionError("subscription ended")


async def test_pause_and_resume_from_go_control_river_anyio(
    river_go: RiverGo, database_url: str
) -> None:
    url = database_url
    worker = ScriptedWorker()
    async with river.open_client(
        url,
        queues={QUEUE: river.QueueConfig(max_workers=5), "other": river.QueueConfig(max_workers=5)},
        workers=workers(worker),
        **CLIENT_OPTIONS,
    ) as run:
        with run.subscribe() as sub:
            await river_go.call("pause", url, "-queue", QUEUE)
            event = await next_queue_event(sub)
            assert (event.kind, event.queue) == (E.QUEUE_PAUSED, QUEUE)
            assert run.diagnostics.queues[QUEUE].paused
            assert not run.diagnostics.queues["other"].paused

            inserted = await river_go.call(
                "insert", url, stdin=[task_json(), {**task_json(), "queue": "other"}]
            )
            held, other = (r["id"] for r in inserted)
            await collect(sub, [other], {E.JOB_COMPLETED})  # the other queue still works
            with anyio.move_on_after(PAUSED_FOR):
                await worker.wait_started(held)
            assert held not in {j.id for j in worker.jobs}, "worked while paused"

            await river_go.call("resume", url, "-queue", QUEUE)
            event = await next_queue_event(sub)
            assert (event.kind, event.queue) == (E.QUEUE_RESUMED, QUEUE)
            done = await collect(sub, [held], {E.JOB_COMPLETED})
            assert done[held].job is not None and done[held].job.state is river.JobState.COMPLETED


async def test_pause_and_resume_from_river_anyio_control_go(
    river_go: RiverGo, database_url: str
) -> None:
    url = database_url
    async with (
        river.open_client(url) as run,
        river_go.run(url, queues={QUEUE: 5, "other": 5}, kinds=[Task.kind]) as go,
    ):
        ex = run.client.driver.executor()
        assert await ex.queue_pause(QUEUE) == 1
        await go.wait_for("queue_paused", queue=QUEUE)
        held = (await run.client.insert(Task(), river.InsertOpts(queue=QUEUE))).job.id
        other = (await run.client.insert(Task(), river.InsertOpts(queue="other"))).job.id
        await go.wait_for("job_completed", id=other)
        with anyio.move_on_after(PAUSED_FOR):
            await go.wait_for("job_started", id=held, within=PAUSED_FOR * 2)
        assert not go.find("job_started", id=held), "River Go worked a job of a paused queue"
        assert not go.find("queue_paused", queue="other")

        assert await ex.queue_resume(QUEUE) == 1
        await go.wait_for("queue_resumed", queue=QUEUE)
        await go.wait_for("job_completed", id=held)


async def test_river_anyio_cancels_a_job_running_in_go(
    river_go: RiverGo, database_url: str
) -> None:
    url = database_url
    async with river.open_client(url) as run:
        job = (await run.client.insert(Task(action="sleep"), river.InsertOpts(queue=QUEUE))).job
        async with river_go.run(url, queues={QUEUE: 5}, kinds=[Task.kind]) as go:
            await go.wait_for("job_started", id=job.id)
            row = await run.client.driver.executor().job_cancel(
                job_id=job.id, cancel_attempted_at=dt.datetime.now(dt.UTC)
            )
            assert row is not None and row.state is river.JobState.RUNNING
            done = await go.wait_for("job_context_done", id=job.id)
            cancelled = await go.wait_for("job_cancelled", id=job.id)
    assert "cancel" in done["cause"]
    assert cancelled["job"]["state"] == "cancelled"
    assert "cancel_attempted_at" in cancelled["job"]["metadata"]


async def test_go_cancels_a_job_running_in_river_anyio(river_go: RiverGo, pg_url: str) -> None:
    """PostgreSQL only: River Go's SQLite driver sends no notification for a cancel, so a job
    running in another SQLite client is only stopped when it finishes (as between two River
    Go clients on SQLite)."""
    url = pg_url
    worker = ScriptedWorker()
    async with river.open_client(
        url,
        queues={QUEUE: river.QueueConfig(max_workers=5)},
        workers=workers(worker),
        **CLIENT_OPTIONS,
    ) as run:
        with run.subscribe(E.JOB_CANCELLED) as sub:
            job = (await run.client.insert(Task(action="sleep"), river.InsertOpts(queue=QUEUE))).job
            with anyio.fail_after(30):
                await worker.wait_started(job.id)
            row = await river_go.call("cancel", url, "-id", str(job.id))
            assert row["state"] == "running"
            events = await collect(sub, [job.id])
    cancelled = events[job.id].job
    assert cancelled is not None and cancelled.state is river.JobState.CANCELLED
    assert "cancel_attempted_at" in cancelled.metadata
    assert cancelled.finalized_at is not None
