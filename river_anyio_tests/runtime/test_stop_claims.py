"""Once a run is told to stop, no claim is sent: a job inserted right after ``stop()`` (with
or without a timeout) or ``stop_and_cancel()`` stays available and untouched.

The stop arrives right after the run has started, and the insert's notification wakes the
stopping run's producer: a wake-up that reached the fetch loop without a checkpoint used to
send one more claim. Each repetition uses a queue of its own, and a poll interval longer than
the test, so the only claim a run may send is its start-up claim (done before it counts as
started). Repeated, since it depends on how the loop schedules the tasks.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

import river_anyio as river

from .lifecycle_support import SOON, Blocker, other_driver, queues

pytestmark = pytest.mark.anyio

REPETITIONS = 50

STOPS: dict[str, Callable[[river.ClientRun], None]] = {
    "graceful": lambda run: run.stop(),
    "graceful_with_timeout": lambda run: run.stop(timeout=5),
    "stop_and_cancel": lambda run: run.stop_and_cancel(),
}


@pytest.mark.parametrize("mode", list(STOPS))
async def test_a_job_inserted_right_after_stop_is_never_claimed(
    database_url: str, mode: str
) -> None:
    stop = STOPS[mode]
    workers = river.Workers()
    ran: list[int] = []

    @workers.register(Blocker)
    async def work(ctx: river.WorkContext, job: river.Job[Blocker]) -> None:
        ran.append(job.id)

    ids = []
    # Inserts go through a client of their own: a stopping run may close its driver as soon as
    # it has stopped. Its insert notification wakes the stopping run's producer.
    async with river.open_client(database_url) as inserter:
        for i in range(REPETITIONS):
            queue = f"stop_{i}"  # a queue of its own: no later run claims this job at start
            with anyio.fail_after(SOON):
                async with river.open_client(
                    database_url,
                    queues=queues(5, queue),
                    workers=workers,
                    leader_election_disabled=True,
                    fetch_cooldown=0.001,
                    fetch_poll_interval=5,
                ) as run:
                    stop(run)
                    opts = river.InsertOpts(queue=queue)
                    ids.append((await inserter.client.insert(Blocker(), opts)).job.id)
                    await run.wait()
    async with other_driver(database_url) as driver:
        rows = await driver.executor().job_list(ids=ids, limit=len(ids))
    assert len(rows) == REPETITIONS
    untouched = (river.JobState.AVAILABLE, 0, ())
    claimed = [
        (r.id, r.state, r.attempt, r.attempted_by)
        for r in rows
        if (r.state, r.attempt, r.attempted_by) != untouched
    ]
    assert claimed == []
    assert ran == []
