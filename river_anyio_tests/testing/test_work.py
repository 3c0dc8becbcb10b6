"""work_once (no database) and work_with_client (through a client), under asyncio and trio;
work_with_client on PostgreSQL and SQLite."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any, ClassVar

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio.testing import (
    build_job,
    require_not_inserted,
    work_once,
    work_with_client,
)

pytestmark = pytest.mark.anyio

UTC = dt.UTC
NEAR = dt.timedelta(seconds=5)


@attrs.frozen
class Task:
    kind: ClassVar[str] = "task"
    name: str
    when: dt.datetime | None = None


@attrs.frozen
class Other:
    kind: ClassVar[str] = "other"


@attrs.frozen
class Spawn:
    kind: ClassVar[str] = "spawn"


class Boom(Exception):
    pass


def task_workers(behaviour: Any) -> river.Workers:
    workers = river.Workers()
    workers.add(Task, behaviour)
    return workers


# --- build_job ----------------------------------------------------------------------------------


async def test_build_job_resolves_like_an_insert() -> None:
    at = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    row = build_job(
        Task(name="n", when=at),
        river.InsertOpts(queue="q", priority=3, max_attempts=4, tags=["tag1"], metadata={"m": 1}),
        id=42,
        attempt=2,
    )
    assert (row.id, row.kind, row.queue, row.priority, row.max_attempts) == (42, "task", "q", 3, 4)
    assert (row.state, row.attempt, row.tags, dict(row.metadata)) == (
        river.JobState.RUNNING, 2, ("tag1",), {"m": 1},
    )  # fmt: skip
    assert row.args == {"name": "n", "when": "2030-01-02T03:04:05Z"}  # the JSON form
    assert row.attempted_by == ("river_anyio_test",)
    unique = build_job(Task(name="u"), river.InsertOpts(unique=river.UniqueOpts(by_args=True)))
    assert unique.unique_key is not None
    assert unique.unique_states is not None and river.JobState.AVAILABLE in unique.unique_states
    with pytest.raises(ValueError, match="attempt"):
        build_job(Task(name="n"), attempt=0)


# --- work_once ----------------------------------------------------------------------------------


async def test_work_once_completes_and_reports_metadata_and_output() -> None:
    seen: list[river.Job[Task]] = []

    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        seen.append(job)
        ctx.set_metadata("progress", 100)
        ctx.set_metadata("output", {"sent": 3})

    at = dt.datetime(2030, 1, 2, tzinfo=UTC)
    result = await work_once(task_workers(work), Task(name="a", when=at))
    assert result.kind is river.EventKind.JOB_COMPLETED
    assert result.state is river.JobState.COMPLETED
    assert (result.outcome, result.error, result.error_text) == (None, None, None)
    assert result.metadata_updates == {"progress": 100, "output": {"sent": 3}}
    assert result.output == {"sent": 3}
    # the worker got args decoded from their JSON, as from the database
    assert seen[0].args == Task(name="a", when=at)
    assert result.job is seen[0].row


async def test_work_once_reports_errors_and_the_retry_decision() -> None:
    err = Boom("it broke")

    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        raise err

    workers = task_workers(work)
    result = await work_once(workers, Task(name="a"))
    assert result.kind is river.EventKind.JOB_FAILED
    assert result.error is err
    assert result.error_text == "it broke"  # River's text: the message alone
    # River's first retry is seconds away: written available
    assert result.state is river.JobState.AVAILABLE
    # River's retry policy counts the errors already recorded: the 5th is 5**4 s away
    past = [
        river.AttemptError(at=dt.datetime.now(UTC), attempt=i, error="earlier") for i in range(1, 5)
    ]
    later = await work_once(workers, build_job(Task(name="a"), attempt=5, errors=past))
    assert later.state is river.JobState.RETRYABLE
    last = await work_once(
        workers, build_job(Task(name="a"), river.InsertOpts(max_attempts=2), attempt=2)
    )
    assert last.state is river.JobState.DISCARDED
    assert last.error is err


@pytest.mark.parametrize(
    ("outcome", "kind", "state"),
    [
        (river.snooze(60), river.EventKind.JOB_SNOOZED, river.JobState.SCHEDULED),
        (river.snooze(1), river.EventKind.JOB_SNOOZED, river.JobState.AVAILABLE),
        (river.cancel("no"), river.EventKind.JOB_CANCELLED, river.JobState.CANCELLED),
        (river.discard("no"), river.EventKind.JOB_FAILED, river.JobState.DISCARDED),
    ],
)
async def test_work_once_outcomes(
    outcome: Any, kind: river.EventKind, state: river.JobState
) -> None:
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> Any:
        return outcome

    result = await work_once(task_workers(work), Task(name="a"))
    assert (result.outcome, result.kind, result.state, result.error) == (outcome, kind, state, None)


async def test_work_once_applies_the_timeout() -> None:
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        await anyio.sleep_forever()

    with anyio.fail_after(10):
        result = await work_once(task_workers(work), Task(name="a"), job_timeout=0.05)
    assert result.kind is river.EventKind.JOB_FAILED
    assert result.error_text == "job timed out after 0.05s"
    assert type(result.error).__name__ == "JobTimeoutError"


async def test_work_once_runs_thread_workers_off_the_loop() -> None:
    threads: list[int] = []

    def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        threads.append(threading.get_ident())

    workers = river.Workers()
    workers.add(Task, work, run_in="thread")
    result = await work_once(workers, Task(name="a"))
    assert result.state is river.JobState.COMPLETED
    assert threads and threads[0] != threading.get_ident()


async def test_work_once_middleware_only_when_given() -> None:
    class Tagging:
        async def work(self, ctx: river.WorkContext, job: river.Job[Any], nxt: Any) -> Any:
            ctx.set_metadata("wrapped", True)
            return await nxt(ctx, job)

    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        pass

    workers = task_workers(work)
    assert (await work_once(workers, Task(name="a"))).metadata_updates == {}
    wrapped = await work_once(workers, Task(name="a"), middleware=[Tagging()])
    assert wrapped.metadata_updates == {"wrapped": True}


async def test_work_once_client_is_absent_unless_given(sqlite_url: str) -> None:
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        await ctx.client.insert(Other())

    workers = task_workers(work)
    result = await work_once(workers, Task(name="a"))
    assert isinstance(result.error, RuntimeError)
    assert "work_once runs the worker without a database" in str(result.error)
    async with river.open_client(sqlite_url) as run:
        assert (await work_once(workers, Task(name="a"), client=run)).error is None
        rows = await run.client.driver.executor().job_list(kinds=["other"])
        assert len(rows) == 1


async def test_work_once_claims_a_row_that_is_not_running(sqlite_url: str) -> None:
    seen: list[river.JobRow] = []

    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        seen.append(job.row)

    async with river.open_client(sqlite_url) as run:
        inserted = (await run.client.insert(Task(name="a"))).job
    result = await work_once(task_workers(work), inserted)
    assert (seen[0].state, seen[0].attempt, seen[0].attempted_by) == (
        river.JobState.RUNNING, 1, ("river_anyio_test",),
    )  # fmt: skip
    assert seen[0].attempted_at is not None and seen[0].id == inserted.id
    assert result.job is seen[0] and result.state is river.JobState.COMPLETED
    # a running row is worked as it is
    again = await work_once(task_workers(work), seen[0])
    assert again.job is seen[0]


async def test_work_once_rejects_an_unregistered_kind() -> None:
    with pytest.raises(river.ConfigError, match="no worker is registered for kind 'other'"):
        await work_once(river.Workers(), Other())
    with pytest.raises(TypeError, match="opts only applies"):
        await work_once(river.Workers(), build_job(Other()), river.InsertOpts())


# --- work_with_client ---------------------------------------------------------------------------


async def test_work_with_client_completes_the_job_in_the_database(database_url: str) -> None:
    calls: list[river.Job[Task]] = []

    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        calls.append(job)
        ctx.set_metadata("output", "done")
        await ctx.client.insert(Other())  # a real context: the client works

    async with river.open_client(database_url, id="tester") as run:
        result = await work_with_client(run, Task(name="a"), workers=task_workers(work))
        row = result.job
        assert result.kind is river.EventKind.JOB_COMPLETED
        assert (row.state, row.attempt, row.attempted_by) == (
            river.JobState.COMPLETED, 1, ("tester",),
        )  # fmt: skip
        assert row.finalized_at is not None and row.attempted_at is not None
        assert row.metadata["output"] == "done" and result.output == "done"
        # the worker saw the claimed row: running, first attempt
        assert (calls[0].row.state, calls[0].row.attempt) == (river.JobState.RUNNING, 1)
        assert len(await run.client.driver.executor().job_list(kinds=["other"])) == 1


async def test_work_with_client_records_a_failure(database_url: str) -> None:
    err = Boom("nope")

    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        raise err

    async with river.open_client(database_url) as run:
        result = await work_with_client(
            run.client, Task(name="a"), river.InsertOpts(max_attempts=1), workers=task_workers(work)
        )
    assert result.error is err
    assert result.kind is river.EventKind.JOB_FAILED
    assert result.state is river.JobState.DISCARDED
    assert [e.error for e in result.job.errors] == ["nope"]


async def test_work_with_client_uses_the_running_clients_configuration(database_url: str) -> None:
    """A running client's middleware applies, and its producers never see the job."""
    calls = 0

    class Stamp:
        async def work(self, ctx: river.WorkContext, job: river.Job[Any], nxt: Any) -> Any:
            ctx.set_metadata("stamped", True)
            return await nxt(ctx, job)

    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        nonlocal calls
        calls += 1

    async with river.open_client(
        database_url,
        queues={"default": river.QueueConfig(max_workers=5)},
        workers=task_workers(work),
        middleware=[Stamp()],
        fetch_cooldown=0.01,
    ) as run:
        result = await work_with_client(run, Task(name="a"))
    assert calls == 1
    assert result.state is river.JobState.COMPLETED
    assert result.job.metadata["stamped"] is True
    assert result.job.attempted_by == (run.config.id,)


async def test_work_with_client_claims_only_its_own_job(database_url: str) -> None:
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        pass

    async with river.open_client(database_url) as run:
        earlier = (await run.client.insert(Task(name="earlier"))).job
        with pytest.raises(RuntimeError, match="would claim before job"):
            await work_with_client(run, Task(name="mine"), workers=task_workers(work))
        rows = await run.client.driver.executor().job_list(kinds=["task"])
        # rolled back: the earlier job is untouched and the new one was never kept
        assert [(r.id, r.state) for r in rows] == [(earlier.id, river.JobState.AVAILABLE)]
        # another queue is another claim
        result = await work_with_client(
            run, Task(name="mine"), river.InsertOpts(queue="own"), workers=task_workers(work)
        )
        assert result.state is river.JobState.COMPLETED


async def test_work_with_client_refuses_jobs_a_producer_would_not_claim(database_url: str) -> None:
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        pass

    workers = task_workers(work)
    later = dt.datetime.now(UTC) + dt.timedelta(hours=1)
    async with river.open_client(database_url) as run:
        with pytest.raises(ValueError, match="inserted scheduled, not available"):
            await work_with_client(
                run, Task(name="a"), river.InsertOpts(scheduled_at=later), workers=workers
            )
        await require_not_inserted(run, Task)
        unique = river.InsertOpts(unique=river.UniqueOpts(by_args=True))
        await work_with_client(run, Task(name="u"), unique, workers=workers)
        with pytest.raises(ValueError, match="a unique job like this one already exists"):
            await work_with_client(run, Task(name="u"), unique, workers=workers)
        with pytest.raises(TypeError, match="needs workers="):
            await work_with_client(run.client, Task(name="a"))
        with pytest.raises(river.ConfigError, match="no worker is registered for kind 'other'"):
            await work_with_client(run, Other(), workers=workers)
