"""Awaiting a job (``client.jobs.wait``) and per-kind retry policies, on both loops and both
databases."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

import anyio
import attrs
import pytest

import river_anyio as river
import river_anyio._jobs_api as jobs_api
from river_anyio.drivers import open_driver

from ..faulty import open_faulty
from .conftest import WAIT, next_event
from .lifecycle_support import wait_until

pytestmark = pytest.mark.anyio
S = river.JobState
E = river.EventKind
UTC = dt.UTC
LATER = river.InsertOpts(scheduled_at=dt.datetime.now(UTC) + dt.timedelta(days=1))


@attrs.frozen
class Answer:
    kind: ClassVar[str] = "wait_answer"
    mode: str = "complete"


@attrs.define(eq=False)
class Held:
    """A worker that waits for ``release`` before it records its output and finishes."""

    release: anyio.Event = attrs.field(factory=anyio.Event)
    started: anyio.Event = attrs.field(factory=anyio.Event)

    async def work(self, ctx: river.WorkContext, job: river.Job[Answer]) -> Any:
        self.started.set()
        await self.release.wait()
        ctx.record_output({"answer": 42, "mode": job.args.mode})
        if job.args.mode == "discard":
            return river.discard("no answer")
        return None

    def workers(self) -> river.Workers:
        workers = river.Workers()
        workers.add(Answer, self.work)
        return workers


def working(url: Any, held: Held, **options: Any) -> Any:
    return river.open_client(
        url,
        queues={"default": river.QueueConfig(max_workers=5)},
        workers=held.workers(),
        leader_election_disabled=True,
        fetch_cooldown=0.01,
        **options,
    )


async def test_wait_is_woken_by_its_own_client_finalizing_the_job(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # after its first read the wait would sleep a minute: only a wake-up returns it in time
    monkeypatch.setattr(jobs_api, "WAIT_FIRST_POLL", 60.0)
    held = Held()
    async with open_faulty(database_url) as driver, working(driver, held) as run:
        jobs = run.client.jobs
        done = (await run.client.insert(Answer())).job
        dead = (await run.client.insert(Answer("discard"))).job
        later = (await run.client.insert(Answer(), LATER)).job
        rows: dict[int, river.JobRow] = {}

        async def wait_for(job_id: int) -> None:
            rows[job_id] = await jobs.wait(job_id, poll_interval=60)

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                for job in (done, dead, later):
                    tg.start_soon(wait_for, job.id)
                await held.started.wait()
                # every wait has read its job once (running or scheduled) and sleeps
                await wait_until(lambda: driver.calls["job_get_by_id"] >= 3)
                held.release.set()  # the completer finalizes two of them
                await run.client.jobs.cancel(later.id)  # this client cancels the third
        assert rows[done.id].state is S.COMPLETED
        assert rows[done.id].output == {"answer": 42, "mode": "complete"}
        assert rows[dead.id].state is S.DISCARDED
        assert rows[dead.id].output == {"answer": 42, "mode": "discard"}  # whatever the outcome
        assert rows[later.id].state is S.CANCELLED and rows[later.id].output is None
        assert not run.client._job_waiters  # nothing left registered


async def test_wait_on_insert_only_clients_for_a_job_another_client_finishes(
    database_url: str,
) -> None:
    held = Held()
    held.release.set()
    async with river.open_client(database_url) as inserter:
        job = (await inserter.client.insert(Answer())).job
        async with open_driver(database_url) as driver, working(database_url, held):
            bare = river.Client(driver, id="bare", max_attempts=25)  # not running at all
            row = await inserter.client.jobs.wait(job.id, timeout=WAIT)
            assert row.state is S.COMPLETED and row.output == {"answer": 42, "mode": "complete"}
            again = await bare.jobs.wait(job.id, timeout=WAIT)  # finalized: returns at once
            assert again == row


async def test_wait_times_out_and_survives_transient_failures(database_url: str) -> None:
    async with open_faulty(database_url) as driver:
        client = river.Client(driver, id="waiter", max_attempts=25)
        job = (await client.insert(Answer(), LATER)).job
        lost = driver.fail("job_get_by_id")  # the first read fails, transiently
        with pytest.raises(river.JobWaitTimeoutError) as info:
            await client.jobs.wait(job.id, timeout=0.3, poll_interval=0.05)
        assert lost.hits == 1
        assert isinstance(info.value, TimeoutError)
        assert info.value.job_id == job.id and info.value.timeout == 0.3
        assert info.value.job is not None and info.value.job.state is S.SCHEDULED
        assert "scheduled" in str(info.value)

        driver.fail("job_get_by_id", river.DatabaseError("permanent"))
        with pytest.raises(river.DatabaseError, match="permanent"):
            await client.jobs.wait(job.id, timeout=WAIT)
        with pytest.raises(river.NotFoundError):
            await client.jobs.wait(job.id + 1000, timeout=WAIT)
        for bad in ({"timeout": 0}, {"timeout": float("inf")}, {"poll_interval": -1}):
            with pytest.raises(river.ValidationError) as bad_info:
                await client.jobs.wait(job.id, **bad)
            assert bad_info.value.field == next(iter(bad))
        assert not client._job_waiters


# --- per-kind retry policies -----------------------------------------------------------------


@attrs.frozen
class Flaky:
    kind: ClassVar[str] = "wait_flaky"


@attrs.frozen
class Flakier:
    kind: ClassVar[str] = "wait_flakier"


@attrs.frozen
class Plain:
    kind: ClassVar[str] = "wait_plain"


@attrs.frozen
class In:
    """A retry policy ``delay`` ahead."""

    delay: dt.timedelta

    def next_retry(self, job: river.JobRow, now: dt.datetime) -> dt.datetime:
        return now + self.delay


async def fail(ctx: river.WorkContext, job: river.Job[Any]) -> None:
    raise RuntimeError("try again")


async def test_retry_policy_per_kind_overrides_the_clients(database_url: str) -> None:
    workers = river.Workers()
    workers.add(Flaky, fail, retry_policy=In(dt.timedelta(hours=2)))
    workers.register(Flakier, retry_policy=In(dt.timedelta(hours=3)))(fail)
    workers.add(Plain, fail)
    async with river.open_client(
        database_url,
        queues={"default": river.QueueConfig(max_workers=5)},
        workers=workers,
        retry_policy=In(dt.timedelta(days=1)),
        leader_election_disabled=True,
        fetch_cooldown=0.01,
    ) as run:
        with run.subscribe(E.JOB_FAILED) as sub:
            before = dt.datetime.now(UTC)
            ids = [(await run.client.insert(a)).job.id for a in (Flaky(), Flakier(), Plain())]
            delays = {}
            for job_id in ids:
                ev = await next_event(sub, E.JOB_FAILED, job_id=job_id)
                assert ev.job is not None and ev.job.state is S.RETRYABLE
                delays[ev.job.kind] = round((ev.job.scheduled_at - before) / dt.timedelta(hours=1))
    assert delays == {Flaky.kind: 2, Flakier.kind: 3, Plain.kind: 24}


def test_retry_policy_must_have_next_retry() -> None:
    with pytest.raises(river.ConfigError) as info:
        river.Workers().add(Plain, fail, retry_policy=object())  # type: ignore[arg-type]
    assert info.value.field == "workers[wait_plain].retry_policy"
