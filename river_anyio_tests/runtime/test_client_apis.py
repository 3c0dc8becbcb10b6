"""The client APIs against running clients, on asyncio and trio, PostgreSQL and SQLite:
``jobs.cancel`` stopping a running job on another client, ``queues.pause/resume("*")``
reaching producers, ``local_queues.add/remove``, and in workers ``record_output`` and
``complete_tx``."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from typing import Any, ClassVar

import anyio
import attrs
import pytest

import river_anyio as river

from ..api.support import client_on
from .conftest import (
    WAIT,
    FixedClock,
    events_for,
    get_row,
    next_event,
    running,
    user_metadata,
)

pytestmark = pytest.mark.anyio
S = river.JobState
K = river.EventKind


@attrs.frozen
class Task:
    kind: ClassVar[str] = "capi_task"
    n: int = 0


@attrs.frozen
class FollowUp:
    kind: ClassVar[str] = "capi_follow_up"
    parent: int = 0


def waiting_workers() -> tuple[river.Workers, anyio.Event]:
    """Workers whose ``Task`` worker waits until cancelled, and the event it sets on starting."""
    started = anyio.Event()

    async def waits(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        started.set()
        await anyio.sleep_forever()

    workers = river.Workers()
    workers.add(Task, waits)
    return workers, started


# --- cancel ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("poll_only", [False, True])
async def test_cancel_stops_a_running_job_promptly(
    database_url: str, clock: FixedClock, poll_only: bool
) -> None:
    """A worker that waits forever is stopped by ``jobs.cancel``: from another client through
    River's control notification, or (poll-only, nothing to listen to) from the client
    running it, which applies it to its own producers at once."""
    workers, started = waiting_workers()
    async with (
        running(database_url, workers, clock=clock, job_timeout=None, poll_only=poll_only) as run,
        client_on(database_url, id="outsider") as other,
    ):
        canceller = run.client if poll_only else other
        with run.subscribe(K.JOB_CANCELLED, K.JOB_COMPLETED, K.JOB_FAILED) as events:
            job = (await run.client.insert(Task())).job
            with anyio.fail_after(WAIT):
                await started.wait()
            flagged = await canceller.jobs.cancel(job.id)
            assert flagged.state is S.RUNNING
            with anyio.fail_after(5):  # promptly: no poll, no timeout involved
                ev = await next_event(events, job_id=job.id)
        row = await get_row(run, job.id)
    assert ev.kind is K.JOB_CANCELLED
    assert row.state is S.CANCELLED
    assert [e.error for e in row.errors] == ["JobCancelError: job cancelled remotely"]


# --- pause and resume -----------------------------------------------------------------------------


async def test_pause_and_resume_all_reach_running_producers(database_url: str) -> None:
    done: list[int] = []

    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        done.append(job.args.n)

    workers = river.Workers()
    workers.add(Task, work)
    queues = {"default": river.QueueConfig(max_workers=2), "q2": river.QueueConfig(max_workers=2)}
    async with (
        running(database_url, workers, queues=queues) as run,
        client_on(database_url, id="outsider") as other,
    ):
        with run.subscribe(K.QUEUE_PAUSED, K.QUEUE_RESUMED, K.JOB_COMPLETED) as events:
            await other.queues.pause("*")
            paused = {(await next_event(events, K.QUEUE_PAUSED)).queue for _ in range(2)}
            assert paused == {"default", "q2"}
            assert all(q.paused for q in run.diagnostics.queues.values())
            assert all(q.paused_at is not None for q in await other.queues.list())
            job = (await other.insert(Task(1), river.InsertOpts(queue="q2"))).job
            await other.queues.resume("*")
            resumed = {(await next_event(events, K.QUEUE_RESUMED)).queue for _ in range(2)}
            assert resumed == {"default", "q2"}
            ev = await next_event(events, K.JOB_COMPLETED, job_id=job.id)
            # one queue only
            await other.queues.pause("default")
            assert (await next_event(events, K.QUEUE_PAUSED)).queue == "default"
            assert run.diagnostics.queues["default"].paused
            assert not run.diagnostics.queues["q2"].paused
    assert ev.job is not None and ev.job.state is S.COMPLETED
    assert done == [1]


async def test_pause_on_a_poll_only_client_applies_at_once(database_url: str) -> None:
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        pass

    workers = river.Workers()
    workers.add(Task, work)
    async with running(database_url, workers, poll_only=True) as run:
        with run.subscribe(K.QUEUE_PAUSED, K.QUEUE_RESUMED) as events:
            await run.client.queues.pause("default")
            assert run.diagnostics.queues["default"].paused  # no wait for the settings poll
            assert (await next_event(events)).kind is K.QUEUE_PAUSED
            await run.client.queues.resume("*")
            assert not run.diagnostics.queues["default"].paused
            assert (await next_event(events)).kind is K.QUEUE_RESUMED


# --- local queues ---------------------------------------------------------------------------------


async def test_local_queues_add_and_remove(database_url: str) -> None:
    release = anyio.Event()
    started = anyio.Event()
    done: list[tuple[str, int]] = []

    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        if job.args.n == 2:
            started.set()
            await release.wait()
        done.append((job.queue, job.args.n))

    workers = river.Workers()
    workers.add(Task, work)
    async with running(database_url, workers) as run:
        client = run.client
        with run.subscribe(K.JOB_COMPLETED) as events:
            await client.local_queues.add("extra", river.QueueConfig(max_workers=2))
            assert "extra" in run.diagnostics.queues
            assert "extra" in run.config.queues
            assert (await client.queues.get("extra")).name == "extra"
            first = (await client.insert(Task(1), river.InsertOpts(queue="extra"))).job
            await next_event(events, job_id=first.id)
            with pytest.raises(river.ValidationError, match="already added"):
                await client.local_queues.add("extra", river.QueueConfig(max_workers=1))
            with pytest.raises(river.ValidationError):
                await client.local_queues.add("bad name!", river.QueueConfig(max_workers=1))
            with pytest.raises(river.ValidationError):
                await client.local_queues.add("x", 3)  # type: ignore[arg-type]
            with pytest.raises(river.NotFoundError):
                await client.local_queues.remove("nope")

            # removing waits for the running job, which then finishes normally
            second = (await client.insert(Task(2), river.InsertOpts(queue="extra"))).job
            with anyio.fail_after(WAIT):
                await started.wait()
            removed = anyio.Event()

            async def remove() -> None:
                await client.local_queues.remove("extra")
                removed.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(remove)
                await anyio.wait_all_tasks_blocked()
                assert not removed.is_set()
                release.set()
            ev = await next_event(events, job_id=second.id)
            assert "extra" not in run.diagnostics.queues
            assert "extra" not in run.config.queues
            # nothing claims the queue any more
            third = (await client.insert(Task(3), river.InsertOpts(queue="extra"))).job
            # a job of a queue still worked completes, and the removed one stays available
            fourth = (await client.insert(Task(4))).job
            await next_event(events, job_id=fourth.id)
            assert (await client.jobs.get(third.id)).state is S.AVAILABLE
            # and it can be added again
            await client.local_queues.add("extra", river.QueueConfig(max_workers=1))
            await next_event(events, job_id=third.id)
    assert ev.job is not None and ev.job.state is S.COMPLETED
    assert done == [("extra", 1), ("extra", 2), ("default", 4), ("extra", 3)]


async def test_local_queue_added_to_a_client_started_without_queues(database_url: str) -> None:
    """A client with workers but no queues at start listens anyway, so a queue added later
    hears control notifications (here a remote cancel)."""
    workers, started = waiting_workers()
    async with (
        river.open_client(
            database_url, workers=workers, job_timeout=None, fetch_cooldown=0.01
        ) as run,
        client_on(database_url, id="outsider") as other,
    ):
        await run.client.local_queues.add("late", river.QueueConfig(max_workers=1))
        with run.subscribe(K.JOB_CANCELLED) as events:
            job = (await other.insert(Task(), river.InsertOpts(queue="late"))).job
            with anyio.fail_after(WAIT):
                await started.wait()
            await other.jobs.cancel(job.id)
            await next_event(events, job_id=job.id, within=5)


# --- in workers: output, completion in the worker's transaction -----------------------------------


async def test_record_output(database_url: str) -> None:
    errors: list[BaseException] = []

    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        ctx.record_output({"first": True})
        ctx.record_output({"rows": job.args.n, "note": "<&>"})  # the last call wins
        ctx.set_metadata("extra", 1)
        try:
            ctx.record_output("x" * (32 * 1024 * 1024))
        except river.ValidationError as exc:
            errors.append(exc)
        if job.args.n == 2:
            raise ValueError("failed, output kept")

    workers = river.Workers()
    workers.add(Task, work)
    async with running(database_url, workers) as run:
        with run.subscribe(K.JOB_COMPLETED, K.JOB_FAILED) as events:
            ok = (await run.client.insert(Task(1))).job
            failed = (await run.client.insert(Task(2), river.InsertOpts(max_attempts=1))).job
            await events_for(events, [ok.id, failed.id])
        ok_row = await get_row(run, ok.id)
        failed_row = await get_row(run, failed.id)
    assert user_metadata(ok_row) == {"extra": 1, "output": {"rows": 1, "note": "<&>"}}
    assert ok_row.state is S.COMPLETED
    assert failed_row.state is S.DISCARDED
    assert failed_row.metadata["output"] == {"rows": 2, "note": "<&>"}
    assert [str(e) for e in errors] == [
        "output: output is too large: 33554434 bytes (max 32 MB)"
    ] * 2


async def test_complete_tx_commits_with_the_worker_transaction(
    database_url: str, clock: FixedClock
) -> None:
    """The worker inserts a follow-up job and completes its own job in one transaction; the
    attempt's own completion then changes nothing and still reports ``job_completed``. When
    that transaction rolls back, so does the completion."""
    completed_rows: list[river.JobRow] = []

    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        ctx.set_metadata("staged", job.args.n)
        try:
            async with ctx.client.transaction() as tx:
                await ctx.client.insert_tx(tx, FollowUp(parent=job.id))
                completed_rows.append(await ctx.complete_tx(tx))
                if job.args.n == 2:
                    raise RuntimeError("undo the transaction")
        except RuntimeError:
            raise ValueError("rolled back") from None

    async def follow_up(ctx: river.WorkContext, job: river.Job[FollowUp]) -> None:
        pass

    workers = river.Workers()
    workers.add(Task, work)
    workers.add(FollowUp, follow_up)
    async with running(database_url, workers, clock=clock) as run:
        with run.subscribe(K.JOB_COMPLETED, K.JOB_FAILED, K.JOB_RACE) as events:
            ok = (await run.client.insert(Task(1))).job
            ev = await next_event(events, job_id=ok.id)
            undone = (await run.client.insert(Task(2), river.InsertOpts(max_attempts=1))).job
            undone_ev = await next_event(events, job_id=undone.id)
        ok_row = await get_row(run, ok.id)
        undone_row = await get_row(run, undone.id)
        follow_ups = (await run.client.jobs.list(kinds=[FollowUp.kind])).jobs
        assert run.diagnostics.completer is not None
        races = run.diagnostics.completer.races
    assert ev.kind is K.JOB_COMPLETED
    assert ok_row.state is S.COMPLETED and ok_row.errors == ()
    assert user_metadata(ok_row) == {"staged": 1}
    assert completed_rows[0].state is S.COMPLETED and completed_rows[0].id == ok.id
    assert undone_ev.kind is K.JOB_FAILED
    assert undone_row.state is S.DISCARDED
    assert [e.error for e in undone_row.errors] == ["rolled back"]
    assert [j.args for j in follow_ups] == [{"parent": ok.id}]
    assert races == 0


async def test_complete_tx_needs_a_running_job(database_url: str) -> None:
    async with client_on(database_url, id="outsider") as client:
        job = (await client.insert(Task())).job
        ctx = river.WorkContext(client=client, job=job, deadline=None)
        with pytest.raises(river.ValidationError, match="job must be running"):
            async with client.transaction() as tx:
                await ctx.complete_tx(tx)
        (claimed,) = await client.driver.executor().job_get_available(
            queue="default", max_to_lock=1, client_id=client.id
        )
        await client.jobs.delete_many(ids=[claimed.id])  # running: left alone
        ctx = river.WorkContext(client=client, job=claimed, deadline=None)
        ctx.record_output([1, 2])
        async with client.transaction() as tx:
            row = await ctx.complete_tx(tx)
        assert row.state is S.COMPLETED and row.metadata["output"] == [1, 2]
        assert json.loads(json.dumps(row.metadata["output"])) == [1, 2]
        assert row.finalized_at is not None
        assert row.finalized_at <= dt.datetime.now(dt.UTC)
        gone = river.WorkContext(client=client, job=attrs.evolve(claimed, id=10**9), deadline=None)
        with pytest.raises(river.NotFoundError):
            async with client.transaction() as tx:
                await gone.complete_tx(tx)


# --- resumable steps --------------------------------------------------------------------------


@attrs.frozen
class Steps:
    kind: ClassVar[str] = "capi_steps"
    mode: str = "steps"


class RetryNow:
    """A worker whose failed attempts are due again at once (so a test sees the next one)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    async def work(self, ctx: river.WorkContext, job: river.Job[Steps]) -> None:
        await self.fn(ctx, job)

    def next_retry(self, job: river.Job[Steps]) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


async def test_resumable_steps_and_cursors(database_url: str) -> None:
    calls: list[tuple[int, str]] = []
    snapshots: dict[int, dict[str, Any]] = {}

    async def work(ctx: river.WorkContext, job: river.Job[Steps]) -> None:
        attempt = job.attempt
        snapshots[attempt] = {k: v for k, v in job.metadata.items() if "resumable" in k}

        async def step(name: str) -> None:
            calls.append((attempt, name))
            if name == "b" and attempt == 1:
                raise ValueError("b failed")

        async def items(cursor: Any) -> None:
            start = 0 if cursor is None else cursor + 1
            for i in range(start, 6):
                if i == 4 and attempt == 2:
                    raise ValueError("item 4 failed")
                calls.append((attempt, f"item{i}"))
                ctx.set_cursor(i)

        await ctx.step("a", lambda: step("a"))
        await ctx.step("b", lambda: step("b"))
        await ctx.step_cursor("items", items)
        await ctx.step("c", lambda: step("c"))

    workers = river.Workers()
    workers.add(Steps, RetryNow(work))
    async with running(database_url, workers) as run:
        with run.subscribe(K.JOB_COMPLETED) as events:
            job = (await run.client.insert(Steps())).job
            await next_event(events, job_id=job.id)
        row = await get_row(run, job.id)
    assert calls == [
        (1, "a"), (1, "b"),  # b fails: "a" recorded
        (2, "b"), (2, "item0"), (2, "item1"), (2, "item2"), (2, "item3"),  # cursor 3 kept
        (3, "item4"), (3, "item5"), (3, "c"),
    ]  # fmt: skip
    assert snapshots[1] == {}
    assert snapshots[2] == {"river:resumable_step": "a"}
    assert snapshots[3] == {"river:resumable_step": "b", "river:resumable_cursor": {"items": 3}}
    assert row.state is S.COMPLETED and row.attempt == 3
    assert [e.error for e in row.errors] == ["b failed", "item 4 failed"]


async def test_resumable_errors(database_url: str) -> None:
    async def noop() -> None:
        pass

    async def work(ctx: river.WorkContext, job: river.Job[Steps]) -> None:
        if job.args.mode == "duplicate":
            await ctx.step("a", noop)
            with contextlib.suppress(river.ResumableStepError):  # and still the attempt fails
                await ctx.step("a", noop)
        elif job.args.mode == "nested":

            async def outer() -> None:
                await ctx.step("inner", noop)

            await ctx.step("outer", outer)
        elif job.args.mode == "cursor_outside":
            ctx.set_cursor(1)
        else:  # a recorded step this worker no longer has
            await ctx.step("other", noop)

    workers = river.Workers()
    workers.add(Steps, work)
    async with running(database_url, workers) as run:
        with run.subscribe(K.JOB_FAILED) as events:
            opts = river.InsertOpts(max_attempts=1)
            dup = (await run.client.insert(Steps("duplicate"), opts)).job
            nested = (await run.client.insert(Steps("nested"), opts)).job
            outside_step = (await run.client.insert(Steps("cursor_outside"), opts)).job
            gone = (await run.client.insert(Steps("gone"), attrs.evolve(opts, pending=True))).job
            await run.client.driver.executor().job_update_metadata(
                gone.id, b'{"river:resumable_step": "vanished"}'
            )
            await run.client.jobs.retry(gone.id)
            await events_for(events, [dup.id, nested.id, outside_step.id, gone.id])
        errors = {j: (await get_row(run, j)).errors[0].error for j in (dup.id, nested.id)}
        errors[outside_step.id] = (await get_row(run, outside_step.id)).errors[0].error
        errors[gone.id] = (await get_row(run, gone.id)).errors[0].error
    assert errors == {
        dup.id: "river: duplicate resumable step name 'a'",
        nested.id: "river: resumable steps cannot be nested",
        outside_step.id: "river: resumable cursor can only be used within a resumable step",
        gone.id: "river: resumable step 'vanished' not found in Worker",
    }


async def test_resumable_checkpoint_in_a_transaction(database_url: str) -> None:
    seen: list[dict[str, Any]] = []

    async def work(ctx: river.WorkContext, job: river.Job[Steps]) -> None:
        async def a() -> None:
            async with ctx.client.transaction() as tx:
                row = await ctx.set_step_cursor_tx(tx, {"page": 7})
                seen.append({k: v for k, v in row.metadata.items() if "resumable" in k})
            seen.append(
                {
                    k: v
                    for k, v in (await ctx.client.jobs.get(job.id)).metadata.items()
                    if "resumable" in k
                }
            )

        await ctx.step("a", a)
        with pytest.raises(RuntimeError, match="not inside a resumable step"):
            async with ctx.client.transaction() as tx:
                await ctx.set_step_tx(tx)

    workers = river.Workers()
    workers.add(Steps, work)
    async with running(database_url, workers) as run:
        with run.subscribe(K.JOB_COMPLETED) as events:
            job = (await run.client.insert(Steps())).job
            await next_event(events, job_id=job.id)
    expected = {"river:resumable_step": "a", "river:resumable_cursor": {"a": {"page": 7}}}
    assert seen == [expected, expected]
