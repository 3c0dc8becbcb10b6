"""Job execution end to end: outcomes, errors and retries, timeouts, remote cancel, pause,
error handler, hooks and middleware, metadata, thread and process workers, slow subscribers.

Every test runs on asyncio and trio, on PostgreSQL and SQLite, and asserts on rows read back
from the database. The wall clock is fixed a day ahead, so finalized_at, errors[].at and retry
times are exact (row columns as the database stores them: ``stored``), and a retry is never
claimed again while a test runs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import threading
import time
import traceback
import types
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio import _events
from river_anyio._timeutil import format_rfc3339nano
from river_anyio._work import Outcome
from river_anyio.drivers import TOPIC_CONTROL, JobInsertParams, open_driver

from ..faulty import open_faulty
from . import procworkers
from .conftest import (
    WAIT,
    FixedClock,
    events_for,
    get_row,
    next_event,
    raw_errors,
    running,
    stored,
    user_metadata,
)
from .lifecycle_support import wait_until

pytestmark = pytest.mark.anyio

S = river.JobState
K = river.EventKind
UNKNOWN_KIND = "job kind is not registered in the client's Workers bundle: "


def sec(seconds: float) -> dt.timedelta:
    return dt.timedelta(seconds=seconds)


def assert_default_retry(row: river.JobRow, now: dt.datetime, errors: int) -> None:
    """River's default: (errors + 1)^4 s ±10% from ``now`` (``errors`` recorded before)."""
    base = float((errors + 1) ** 4)
    assert now + sec(base * 0.9) <= row.scheduled_at <= now + sec(base * 1.1), (
        row.scheduled_at - now
    )


@attrs.frozen
class Task:
    kind: ClassVar[str] = "exec_task"
    n: int = 0


@attrs.frozen
class Other:
    kind: ClassVar[str] = "exec_other"
    n: int = 0


@attrs.frozen
class Third:
    kind: ClassVar[str] = "exec_third"
    n: int = 0


@attrs.frozen
class Fourth:
    kind: ClassVar[str] = "exec_fourth"
    n: int = 0


@attrs.frozen
class Unregistered:
    kind: ClassVar[str] = "exec_unregistered"


@attrs.frozen
class Decodable:
    kind: ClassVar[str] = "exec_decode"
    n: int


@attrs.frozen
class BadShape:
    """Inserted under ``Decodable``'s kind with args it cannot be built from."""

    kind: ClassVar[str] = "exec_decode"
    m: str


async def boom(ctx: river.WorkContext, job: river.Job[Any]) -> None:
    raise ValueError("boom")


def paused_flag(run: river.ClientRun) -> bool:
    return run.diagnostics.queues["default"].paused


# --- success and errors -----------------------------------------------------------------------


async def test_success_completes_with_clock_time_and_event(
    database_url: str, clock: FixedClock
) -> None:
    workers = river.Workers()
    seen: list[tuple[Any, ...]] = []

    @workers.register(Task)
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        seen.append((job.args, job.attempt, ctx.job_row.state, ctx.client is run.client))

    async with running(database_url, workers, clock=clock, id="exec-client") as run:
        with run.subscribe() as events:
            res = await run.client.insert(Task(n=7))
            ev = await next_event(events, K.JOB_COMPLETED, job_id=res.job.id)
            row = await get_row(run, res.job.id)

    assert seen == [(Task(n=7), 1, S.RUNNING, True)]
    assert row.state is S.COMPLETED
    assert row.finalized_at == stored(database_url, clock.at)
    assert row.attempt == 1
    assert row.attempted_by == ("exec-client",)
    assert row.errors == ()
    assert ev.job == row
    assert ev.queue == "default"
    assert ev.error is None
    t = ev.timings
    assert t is not None
    # queue wait is measured from the row's scheduled_at to the attempt's start (clock time)
    assert t.queue_wait == clock.at - res.job.scheduled_at
    assert dt.timedelta(0) <= t.run < sec(5)
    assert dt.timedelta(0) <= t.completion < sec(5)


async def test_error_recorded_and_retried_by_default_policy(
    database_url: str, clock: FixedClock
) -> None:
    workers = river.Workers()
    workers.add(Task, boom)
    async with running(database_url, workers, clock=clock) as run:
        with run.subscribe() as events:
            res = await run.client.insert(Task())
            ev = await next_event(events, K.JOB_FAILED, job_id=res.job.id)
            row = await get_row(run, res.job.id)
            raw = await raw_errors(run, res.job.id)

    assert row.state is S.AVAILABLE  # 1 s ±10% away: within the 5 s fast path
    assert row.attempt == 1
    assert row.finalized_at is None
    assert_default_retry(row, clock.at, errors=0)
    [err] = row.errors
    # River's text for an error (Go's err.Error(): the message alone) and no trace (River
    # records one only for a panic; the traceback is logged)
    assert (err.at, err.attempt, err.error, err.trace) == (clock.at, 1, "boom", "")
    # stored as River writes it: RFC 3339 (UTC, "Z") and exactly these keys
    assert set(raw[0]) == {"at", "attempt", "error", "trace"}
    assert raw[0]["at"] == format_rfc3339nano(clock.at)
    assert raw[0]["at"].endswith(".123456Z")
    assert ev.job == row
    assert ev.error == "boom"


async def test_an_error_without_text_is_recorded_by_its_class_name(
    database_url: str, clock: FixedClock
) -> None:
    """Go's errors always have text; a Python exception raised bare has none (and a broken
    ``__str__`` gives none): the class name is recorded so the attempt says what happened. An
    exception's own text is recorded as is, however it reads (``KeyError``'s is a repr)."""

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    def raises(exc: BaseException) -> Any:
        async def work(ctx: river.WorkContext, job: river.Job[Any]) -> None:
            raise exc

        return work

    workers = river.Workers()
    workers.add(Task, raises(TimeoutError()))
    workers.add(Other, raises(Unprintable("x")))
    workers.add(Third, raises(KeyError("missing")))
    async with running(database_url, workers, clock=clock) as run:
        with run.subscribe(K.JOB_FAILED) as events:
            results = await run.client.insert_many([Task(), Other(), Third()])
            got = await events_for(events, [r.job.id for r in results])
    errors = [got[r.job.id].job.errors for r in results]  # type: ignore[union-attr]
    assert [[(e.error, e.trace) for e in errs] for errs in errors] == [
        [("TimeoutError", "")],
        [("Unprintable", "")],
        [("'missing'", "")],
    ]
    assert [got[r.job.id].error for r in results] == ["TimeoutError", "Unprintable", "'missing'"]


async def test_second_error_backs_off_by_error_count_into_retryable(database_url: str) -> None:
    """The first failure (clock in the past) is due at once and claimed again; the second
    attempt moves the clock before failing: 2 errors -> 16 s ±10%, which is `retryable`."""
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).replace(microsecond=0)
    later = past + dt.timedelta(days=2)
    clock = FixedClock(past)
    workers = river.Workers()

    @workers.register(Task)
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        if job.attempt == 2:
            clock.at = later  # the attempt started at `past`; it ends at `later`
        raise ValueError(f"boom {job.attempt}")

    async with running(database_url, workers, clock=clock, fetch_poll_interval=0.05) as run:
        with run.subscribe(K.JOB_FAILED) as events:
            res = await run.client.insert(Task())
            first = await next_event(events, job_id=res.job.id)
            second = await next_event(events, job_id=res.job.id)
            row = await get_row(run, res.job.id)

    assert first.job is not None and first.job.state is S.AVAILABLE
    assert_default_retry(first.job, past, errors=0)
    assert second.job == row
    assert row.state is S.RETRYABLE
    assert row.attempt == 2
    assert_default_retry(row, later, errors=1)
    assert [(e.at, e.attempt, e.error) for e in row.errors] == [
        (past, 1, "boom 1"),
        (past, 2, "boom 2"),
    ]


async def test_out_of_attempts_discards_and_long_errors_are_truncated(
    database_url: str, clock: FixedClock
) -> None:
    workers = river.Workers()

    @workers.register(Task)
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        raise ValueError("x" * 40_000)

    async with running(database_url, workers, clock=clock) as run:
        with run.subscribe(K.JOB_FAILED) as events:
            res = await run.client.insert(Task(), river.InsertOpts(max_attempts=1))
            ev = await next_event(events, job_id=res.job.id)
            row = await get_row(run, res.job.id)

    assert row.state is S.DISCARDED
    assert row.finalized_at == stored(database_url, clock.at)
    [err] = row.errors
    assert err.attempt == 1
    assert len(err.error) == 32_768
    assert err.error == "x" * 32_768
    assert err.trace == ""
    assert ev.job == row


async def test_worker_next_retry_and_retry_policy(database_url: str, clock: FixedClock) -> None:
    """Worker next_retry() first, then the client policy; a past time from either falls back
    to River's default."""
    policy_calls: list[tuple[str, int, int, dt.datetime]] = []

    class Policy:
        def next_retry(self, job: river.JobRow, now: dt.datetime) -> dt.datetime:
            policy_calls.append((job.kind, job.attempt, len(job.errors), now))
            if job.kind == Third.kind:
                return now - dt.timedelta(hours=1)
            return now + sec(5)  # exactly at the fast-path bound: still `available`

    class RetryWorker:
        def __init__(self, delta: dt.timedelta) -> None:
            self.delta = delta

        async def work(self, ctx: river.WorkContext, job: river.Job[Any]) -> None:
            raise ValueError("boom")

        def next_retry(self, job: river.Job[Any]) -> dt.datetime:
            return clock.at + self.delta

    workers = river.Workers()
    workers.add(Task, RetryWorker(sec(30)))  # its own time wins over the policy
    workers.add(Other, boom)  # the policy's +5 s
    workers.add(Third, boom)  # the policy's past time -> default
    workers.add(Fourth, RetryWorker(-sec(10)))  # the worker's past time -> default
    async with running(database_url, workers, clock=clock, retry_policy=Policy()) as run:
        with run.subscribe(K.JOB_FAILED) as events:
            ids = [
                r.job.id for r in await run.client.insert_many([Task(), Other(), Third(), Fourth()])
            ]
            for _ in ids:
                await next_event(events)
            task, other, third, fourth = [await get_row(run, i) for i in ids]

    assert (task.state, task.scheduled_at) == (
        S.RETRYABLE,
        stored(database_url, clock.at + sec(30)),
    )
    assert (other.state, other.scheduled_at) == (
        S.AVAILABLE,
        stored(database_url, clock.at + sec(5)),
    )
    assert third.state is S.AVAILABLE
    assert_default_retry(third, clock.at, errors=0)
    assert fourth.state is S.AVAILABLE
    assert_default_retry(fourth, clock.at, errors=0)
    # the policy saw the row before the new error was appended, and the clock's now
    assert sorted(policy_calls) == [(Other.kind, 1, 0, clock.at), (Third.kind, 1, 0, clock.at)]


async def test_the_near_future_horizon_follows_the_scheduler_interval(
    database_url: str, clock: FixedClock
) -> None:
    """Retries and snoozes due within ``maintenance.scheduler_interval`` are written
    ``available`` (River's executor does the same); later ones wait for the scheduler."""

    class Policy:
        def next_retry(self, job: river.JobRow, now: dt.datetime) -> dt.datetime:
            return now + sec(job.args["n"] if isinstance(job.args, dict) else 0)

    workers = river.Workers()

    @workers.register(Task)
    async def snoozer(ctx: river.WorkContext, job: river.Job[Task]) -> Outcome:
        return river.snooze(sec(job.args.n))

    workers.add(Other, boom)
    with warnings.catch_warnings():  # maintenance settings of a client that never leads
        warnings.simplefilter("ignore")
        client = running(
            database_url,
            workers,
            clock=clock,
            retry_policy=Policy(),
            maintenance=river.MaintenanceConfig(scheduler_interval=30),
        )
        async with client as run:
            with run.subscribe(K.JOB_SNOOZED, K.JOB_FAILED) as events:
                args = [Task(n=30), Task(n=31), Other(n=30), Other(n=31)]
                ids = [r.job.id for r in await run.client.insert_many(args)]
                for _ in ids:
                    await next_event(events)
                rows = [await get_row(run, i) for i in ids]
    assert [(r.state, r.scheduled_at) for r in rows] == [
        (S.AVAILABLE, stored(database_url, clock.at + sec(30))),
        (S.SCHEDULED, stored(database_url, clock.at + sec(31))),
        (S.AVAILABLE, stored(database_url, clock.at + sec(30))),
        (S.RETRYABLE, stored(database_url, clock.at + sec(31))),
    ]


# --- snooze, discard, cancel ------------------------------------------------------------------


async def test_snooze_gives_the_attempt_back(database_url: str, clock: FixedClock) -> None:
    workers = river.Workers()

    @workers.register(Task)
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> Outcome:
        return river.snooze(dt.timedelta(seconds=job.args.n))

    async with running(database_url, workers, clock=clock) as run:
        with run.subscribe(K.JOB_SNOOZED) as events:
            near = await run.client.insert(Task(n=5))  # exactly 5 s: still the fast path
            far = await run.client.insert(Task(n=6), river.InsertOpts(metadata={"snoozes": 2}))
            evs = {(await next_event(events)).job.id for _ in range(2)}  # type: ignore[union-attr]
            near_row = await get_row(run, near.job.id)
            far_row = await get_row(run, far.job.id)

    assert evs == {near.job.id, far.job.id}
    assert (near_row.state, near_row.scheduled_at) == (
        S.AVAILABLE,
        stored(database_url, clock.at + sec(5)),
    )
    assert (far_row.state, far_row.scheduled_at) == (
        S.SCHEDULED,
        stored(database_url, clock.at + sec(6)),
    )
    for row in (near_row, far_row):
        assert row.attempt == 0
        assert row.errors == ()
        assert row.finalized_at is None
    assert user_metadata(near_row) == {"snoozes": 1}
    assert user_metadata(far_row) == {"snoozes": 3}


async def test_discard_and_cancel_outcomes(database_url: str, clock: FixedClock) -> None:
    handled: list[int] = []

    class Handler:
        def handle_error(self, job: river.JobRow, exc: BaseException) -> None:
            handled.append(job.id)

    workers = river.Workers()

    @workers.register(Task)
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> Any:
        return [river.discard("nope"), river.cancel("stop it"), 42][job.args.n]

    async with running(database_url, workers, clock=clock, error_handler=Handler()) as run:
        with run.subscribe(K.JOB_FAILED, K.JOB_CANCELLED) as events:
            d = await run.client.insert(Task(n=0))
            c = await run.client.insert(Task(n=1))
            odd = await run.client.insert(Task(n=2))
            got = await events_for(events, [d.job.id, c.job.id, odd.job.id])
            d_ev, c_ev = got[d.job.id], got[c.job.id]
            d_row = await get_row(run, d.job.id)
            c_row = await get_row(run, c.job.id)
            odd_row = await get_row(run, odd.job.id)

    assert d_row.state is S.DISCARDED and d_row.finalized_at == stored(database_url, clock.at)
    [d_err] = d_row.errors
    assert (d_err.at, d_err.attempt, d_err.trace) == (clock.at, 1, "")
    assert d_err.error == "JobDiscardError: nope"
    assert d_ev.kind is K.JOB_FAILED and d_ev.job == d_row

    assert c_row.state is S.CANCELLED and c_row.finalized_at == stored(database_url, clock.at)
    [c_err] = c_row.errors
    assert (c_err.at, c_err.attempt, c_err.error, c_err.trace) == (
        clock.at,
        1,
        "JobCancelError: stop it",
        "",
    )
    assert c_ev.kind is K.JOB_CANCELLED and c_ev.job == c_row
    assert c_ev.error == "JobCancelError: stop it"
    # a return value that is not an outcome is a failed attempt (and does reach the handler)
    assert odd_row.state is S.AVAILABLE
    [odd_err] = odd_row.errors
    assert odd_err.error.startswith("worker for 'exec_task' returned int"), odd_err
    assert handled == [odd.job.id]  # explicit outcomes never reach the error handler


# --- timeouts ---------------------------------------------------------------------------------


async def test_timeouts(database_url: str, clock: FixedClock) -> None:
    """Client job_timeout, a worker's own timeout (shorter or none), and a worker that swallows
    the cancellation and so completes."""
    saw_cancelled: list[bool] = []
    deadlines: list[float | None] = []

    async def forever(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        await anyio.sleep_forever()

    async def outlives_client_timeout(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        deadlines.append(ctx.deadline)
        await anyio.sleep(0.4)

    async def swallows(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            saw_cancelled.append(True)
            return None

    class OwnTimeout:
        async def work(self, ctx: river.WorkContext, job: river.Job[Any]) -> None:
            await forever(ctx, job)

        def timeout(self, job: river.Job[Any]) -> float:
            return 0.05

    workers = river.Workers()
    workers.add(Task, forever)  # client job_timeout
    workers.add(Other, OwnTimeout())  # its own, shorter, from its timeout() method
    workers.add(Third, outlives_client_timeout, timeout=None)  # none at all
    workers.add(Fourth, swallows, timeout=dt.timedelta(milliseconds=50))
    async with running(database_url, workers, clock=clock, job_timeout=0.2) as run:
        with run.subscribe(K.JOB_FAILED, K.JOB_COMPLETED) as events:
            results = await run.client.insert_many([Task(), Other(), Third(), Fourth()])
            ids = [r.job.id for r in results]
            got = {}
            for _ in ids:
                ev = await next_event(events)
                assert ev.job is not None
                got[ev.job.id] = ev.kind
            task, other, third, fourth = [await get_row(run, i) for i in ids]

    assert [got[i] for i in ids] == [K.JOB_FAILED, K.JOB_FAILED, K.JOB_COMPLETED, K.JOB_COMPLETED]
    for row, text in ((task, "0.2s"), (other, "0.05s")):
        assert row.state is S.AVAILABLE  # retried
        assert_default_retry(row, clock.at, errors=0)
        [err] = row.errors
        assert err.error == f"job timed out after {text}", err.error
        assert err.attempt == 1
    assert third.state is S.COMPLETED and third.errors == ()
    assert fourth.state is S.COMPLETED and fourth.errors == ()
    assert saw_cancelled == [True]
    assert deadlines == [None]


# --- unknown kinds and bad args ---------------------------------------------------------------


async def test_unknown_kind_is_a_failed_attempt(database_url: str, clock: FixedClock) -> None:
    handled: list[str] = []

    class Handler:
        def handle_error(self, job: river.JobRow, exc: BaseException) -> None:
            handled.append(str(exc))

    workers = river.Workers()
    workers.add(Task, boom)
    async with running(database_url, workers, clock=clock, error_handler=Handler()) as run:
        with run.subscribe(K.JOB_FAILED) as events:
            res = await run.client.insert(Unregistered())
            ev = await next_event(events, job_id=res.job.id)
            row = await get_row(run, res.job.id)

    assert row.state is S.AVAILABLE and row.attempt == 1
    assert_default_retry(row, clock.at, errors=0)
    [err] = row.errors
    assert (err.at, err.attempt, err.error, err.trace) == (
        clock.at,
        1,
        UNKNOWN_KIND + "exec_unregistered",
        "",
    )
    assert ev.error == UNKNOWN_KIND + "exec_unregistered"
    assert handled == [UNKNOWN_KIND + "exec_unregistered"]  # River calls the handler here too


async def test_fetch_only_known_kinds_leaves_unknown_kinds_alone(
    database_url: str, clock: FixedClock
) -> None:
    workers = river.Workers()
    ran: list[int] = []

    @workers.register(Task)
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        ran.append(job.id)

    async with running(database_url, workers, clock=clock, fetch_only_known_kinds=True) as run:
        with run.subscribe(K.JOB_COMPLETED, K.JOB_FAILED) as events:
            # one transaction: the claim that finds the known job also sees the unknown one
            unknown, known = await run.client.insert_many([Unregistered(), Task()])
            ev = await next_event(events)
            row = await get_row(run, unknown.job.id)

    assert ev.kind is K.JOB_COMPLETED
    assert ev.job is not None and ev.job.id == known.job.id
    assert ran == [known.job.id]
    assert row.state is S.AVAILABLE
    assert (row.attempt, row.attempted_by, row.errors) == (0, (), ())


async def test_undecodable_args_fail_the_attempt(database_url: str, clock: FixedClock) -> None:
    ran: list[int] = []

    class Worker:
        async def work(self, ctx: river.WorkContext, job: river.Job[Decodable]) -> None:
            ran.append(job.id)

        def next_retry(self, job: river.Job[Decodable]) -> dt.datetime:
            return clock.at + sec(100)  # not consulted: the args never decoded

    workers = river.Workers()
    workers.add(Decodable, Worker())
    async with running(database_url, workers, clock=clock) as run:
        with run.subscribe(K.JOB_FAILED) as events:
            res = await run.client.insert(BadShape(m="x"))
            await next_event(events, job_id=res.job.id)
            row = await get_row(run, res.job.id)

    assert ran == []
    assert row.state is S.AVAILABLE
    assert_default_retry(row, clock.at, errors=0)
    [err] = row.errors
    assert err.error.startswith("cannot decode args of 'exec_decode'"), err.error
    assert err.trace == ""
    assert err.attempt == 1


# --- remote cancel ----------------------------------------------------------------------------


async def test_remote_cancel(database_url: str, clock: FixedClock) -> None:
    handled: list[int] = []
    started = {Task.kind: anyio.Event(), Other.kind: anyio.Event()}

    class Handler:
        def handle_error(self, job: river.JobRow, exc: BaseException) -> None:
            handled.append(job.id)

    async def waits(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        started[job.kind].set()
        await anyio.sleep_forever()

    async def finishes_anyway(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        started[job.kind].set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            return None

    workers = river.Workers()
    workers.add(Task, waits)
    workers.add(Other, finishes_anyway)
    async with running(
        database_url, workers, clock=clock, job_timeout=None, error_handler=Handler()
    ) as run:
        ex = run.client.driver.executor()
        with run.subscribe(K.JOB_CANCELLED, K.JOB_COMPLETED, K.JOB_FAILED) as events:
            task = await run.client.insert(Task())
            other = await run.client.insert(Other())
            with anyio.fail_after(10):
                await started[Task.kind].wait()
                await started[Other.kind].wait()
            flagged = await ex.job_cancel(job_id=task.job.id, cancel_attempted_at=clock.at)
            assert flagged is not None and flagged.state is S.RUNNING
            t0 = time.monotonic()
            task_ev = await next_event(events, job_id=task.job.id)
            elapsed = time.monotonic() - t0
            await ex.job_cancel(job_id=other.job.id, cancel_attempted_at=clock.at)
            other_ev = await next_event(events, job_id=other.job.id)
            task_row = await get_row(run, task.job.id)
            other_row = await get_row(run, other.job.id)

    assert elapsed < 5.0
    assert task_ev.kind is K.JOB_CANCELLED and task_ev.job == task_row
    assert task_row.state is S.CANCELLED
    assert task_row.finalized_at == stored(database_url, clock.at)
    [err] = task_row.errors
    assert (err.at, err.attempt, err.error) == (
        clock.at,
        1,
        "JobCancelError: job cancelled remotely",
    )
    assert "cancel_attempted_at" in task_row.metadata
    assert other_ev.kind is K.JOB_COMPLETED
    assert other_row.state is S.COMPLETED and other_row.errors == ()
    assert handled == []


@pytest.mark.parametrize("poll_only", [True, False], ids=["poll_only", "listening"])
async def test_a_remote_cancel_is_also_found_by_polling(
    database_url: str, clock: FixedClock, monkeypatch: pytest.MonkeyPatch, poll_only: bool
) -> None:
    """River's cancellation poll: without notifications (poll only) it is how a running job
    learns of its remote cancel; with them it catches a cancel whose notification was lost
    (here: never sent). Jobs without a request run on."""
    from river_anyio._runtime import _producer

    # River's 2 s and 1 min, shortened
    monkeypatch.setattr(_producer, "QUEUE_POLL" if poll_only else "NOTIFICATION_POLL", 0.05)
    started = {Task.kind: anyio.Event(), Other.kind: anyio.Event()}
    release = anyio.Event()

    async def waits(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        started[job.kind].set()
        if job.kind == Other.kind:
            await release.wait()
            return
        await anyio.sleep_forever()

    workers = river.Workers()
    workers.add(Task, waits)
    workers.add(Other, waits)
    async with running(
        database_url, workers, clock=clock, job_timeout=None, poll_only=poll_only
    ) as run:
        ex = run.client.driver.executor()
        with run.subscribe(K.JOB_CANCELLED, K.JOB_COMPLETED, K.JOB_FAILED) as events:
            task = await run.client.insert(Task())
            other = await run.client.insert(Other())
            with anyio.fail_after(10):
                await started[Task.kind].wait()
                await started[Other.kind].wait()
            # another client's cancel, sent without a notification
            flagged = await ex.job_cancel(
                job_id=task.job.id, cancel_attempted_at=clock.at, notify=False
            )
            assert flagged is not None and flagged.state is S.RUNNING
            task_ev = await next_event(events, job_id=task.job.id)
            release.set()
            other_ev = await next_event(events, job_id=other.job.id)
            task_row = await get_row(run, task.job.id)

    assert task_ev.kind is K.JOB_CANCELLED
    assert task_row.state is S.CANCELLED
    assert [e.error for e in task_row.errors] == ["JobCancelError: job cancelled remotely"]
    assert other_ev.kind is K.JOB_COMPLETED


@pytest.mark.parametrize("poll_only", [True, False], ids=["poll_only", "listening"])
async def test_a_claimed_job_cancelled_before_it_begins_starts_cancelled(
    database_url: str,
    clock: FixedClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    poll_only: bool,
) -> None:
    """River's pending cancellations: a remote cancel (by notification, or found by the
    poll) of a job claimed but still waiting for a worker is not lost; the job starts with
    its context cancelled, and ends cancelled."""
    from river_anyio._config import ClientConfig
    from river_anyio._runtime import _producer

    monkeypatch.setattr(_producer, "QUEUE_POLL", 0.05)
    caplog.set_level(logging.WARNING, logger="river_anyio.producer")
    release = anyio.Event()
    started: dict[int, bool] = {}  # job id -> its context was cancelled at the start

    async def work(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        started[job.id] = ctx.cancelled.is_set()
        if job.args.n == 0:
            await release.wait()
            return
        await anyio.sleep_forever()

    workers = river.Workers()
    workers.add(Task, work)
    async with open_driver(database_url) as driver, driver.transaction() as tx:
        first, waiting = (r.job for r in await tx.job_insert_fast_many([_task(0), _task(1)]))
    async with river.open_client(
        database_url,
        ClientConfig(
            fixed_prefetch=1, claim_ahead=True
        ),  # the second row is claimed behind the busy worker
        queues={"default": river.QueueConfig(max_workers=1)},
        workers=workers,
        clock=clock,
        job_timeout=None,
        poll_only=poll_only,
        leader_election_disabled=True,
        fetch_cooldown=0.01,
        soft_stop_timeout=2.0,
    ) as run:
        with run.subscribe(K.JOB_CANCELLED, K.JOB_COMPLETED) as events:
            await wait_until(lambda: run.diagnostics.queues["default"].active_jobs == 2)
            assert list(started) == [first.id]
            ex = run.client.driver.executor()
            await ex.job_cancel(job_id=waiting.id, cancel_attempted_at=clock.at)

            def noticed() -> bool:
                return any(
                    getattr(r, "river_event", None) == "job_cancel_remote"
                    and getattr(r, "river_job_id", None) == waiting.id
                    for r in caplog.records
                )

            await wait_until(noticed)
            assert list(started) == [first.id]  # still waiting for the worker
            release.set()
            first_ev = await next_event(events, job_id=first.id)
            waiting_ev = await next_event(events, job_id=waiting.id)
            row = await get_row(run, waiting.id)

    assert first_ev.kind is K.JOB_COMPLETED
    assert started == {first.id: False, waiting.id: True}
    assert waiting_ev.kind is K.JOB_CANCELLED
    assert row.state is S.CANCELLED and row.attempt == 1
    assert [e.error for e in row.errors] == ["JobCancelError: job cancelled remotely"]


def _task(n: int) -> JobInsertParams:
    return JobInsertParams(
        encoded_args=json.dumps({"n": n}).encode(),
        kind=Task.kind,
        max_attempts=25,
        metadata=b"{}",
        priority=1,
        queue="default",
        state=S.AVAILABLE,
        tags=(),
    )


class _LogEvent(logging.Handler):
    """Sets an event when a record containing ``text`` is logged (on the event loop's thread,
    where the runtime logs)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.text = text
        self.seen = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


@contextlib.contextmanager
def logged(logger: str, text: str) -> Iterator[anyio.Event]:
    handler = _LogEvent(text)
    log = logging.getLogger(logger)
    log.addHandler(handler)
    try:
        yield handler.seen
    finally:
        log.removeHandler(handler)


async def test_a_jobs_claimed_hook_holds_a_claim_and_a_cancel_meanwhile_starts_it_cancelled(
    database_url: str, clock: FixedClock, caplog: pytest.LogCaptureFixture
) -> None:
    """``jobs_claimed`` hooks run after a claim commits and before its jobs start (sync or
    async, in order; one raising is logged). A remote cancel while a hook holds the claim
    reaches the held job: its worker starts with ``ctx.cancelled`` set, in a cancelled scope,
    and the job ends cancelled remotely (River's executor cancelled before it runs)."""
    calls: list[tuple[str, list[int]]] = []
    held = anyio.Event()
    release = anyio.Event()
    cancelled_at_start: list[bool] = []

    class Holder:
        async def jobs_claimed(self, rows: Sequence[river.JobRow]) -> None:
            calls.append(("holder", [r.id for r in rows]))
            if not held.is_set():
                held.set()
                await release.wait()

    class Counter:
        def jobs_claimed(self, rows: Sequence[river.JobRow]) -> None:
            calls.append(("counter", [r.id for r in rows]))

    class Broken:
        def jobs_claimed(self, rows: Sequence[river.JobRow]) -> None:
            raise RuntimeError("claim hook broke")

    async def cooperative(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        cancelled_at_start.append(ctx.cancelled.is_set())
        await anyio.sleep_forever()

    async def quick(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        pass

    workers = river.Workers()
    workers.add(Task, cooperative)
    workers.add(Other, quick)
    caplog.set_level(logging.WARNING, logger="river_anyio")
    async with running(
        database_url, workers, clock=clock, job_timeout=None, hooks=[Holder(), Broken(), Counter()]
    ) as run:
        with run.subscribe(K.JOB_CANCELLED, K.JOB_COMPLETED) as events:
            with logged("river_anyio.producer", "cancelled remotely") as heard:
                task = await run.client.insert(Task())
                with anyio.fail_after(WAIT):
                    await held.wait()
                flagged = await run.client.jobs.cancel(task.job.id)
                assert flagged.state is S.RUNNING  # claimed: only flagged
                with anyio.fail_after(WAIT):
                    await heard.wait()  # the client heard of it while holding the claim
            assert cancelled_at_start == []  # nothing started while held
            release.set()
            ev = await next_event(events, job_id=task.job.id)
            # later claims go through the hooks too, and start once they return
            other = await run.client.insert(Other())
            other_ev = await next_event(events, job_id=other.job.id)
            row = await get_row(run, task.job.id)

    assert ev.kind is K.JOB_CANCELLED and row.state is S.CANCELLED
    assert [(e.attempt, e.error) for e in row.errors] == [
        (1, "JobCancelError: job cancelled remotely")
    ]
    assert cancelled_at_start == [True]
    assert other_ev.kind is K.JOB_COMPLETED
    assert calls == [
        ("holder", [task.job.id]),
        ("counter", [task.job.id]),
        ("holder", [other.job.id]),
        ("counter", [other.job.id]),
    ]
    assert any("Broken.jobs_claimed raised" in r.getMessage() for r in caplog.records)


async def test_a_cancel_heard_while_a_claim_is_in_flight_reaches_the_claimed_job(
    database_url: str, clock: FixedClock
) -> None:
    """A claim has committed but its reply has not arrived when the job's cancel is heard:
    the producer keeps the cancel for the claim's jobs, and the job starts cancelled."""
    release = anyio.Event()
    cancelled_at_start: list[bool] = []

    async def cooperative(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        cancelled_at_start.append(ctx.cancelled.is_set())
        await anyio.sleep_forever()

    workers = river.Workers()
    workers.add(Task, cooperative)
    async with open_faulty(database_url) as faulty:
        # the claim after the start-up one: it commits, its reply waits for ``release``
        claim = faulty.delay_reply("job_get_available", until=release, skip=1)
        heard = faulty.delay(
            "notification",
            where=lambda call: (
                call.args[0].topic == TOPIC_CONTROL and '"cancel"' in call.args[0].payload
            ),
        )
        async with running(
            cast(Any, faulty), workers, clock=clock, job_timeout=None, fetch_poll_interval=60
        ) as run:
            with run.subscribe(K.JOB_CANCELLED) as events:
                task = await run.client.insert(Task())
                with anyio.fail_after(WAIT):
                    await claim.hit.wait()
                assert [r.id for r in claim.replies[0]] == [task.job.id]
                flagged = await run.client.jobs.cancel(task.job.id)
                assert flagged.state is S.RUNNING
                with anyio.fail_after(WAIT):
                    await heard.hit.wait()
                await anyio.wait_all_tasks_blocked()  # the producer has handled it
                release.set()
                ev = await next_event(events, job_id=task.job.id)
                row = await get_row(run, task.job.id)
    assert ev.kind is K.JOB_CANCELLED
    assert [e.error for e in row.errors] == ["JobCancelError: job cancelled remotely"]
    assert cancelled_at_start == [True]


async def test_a_stop_while_a_hook_holds_a_claim_works_the_claimed_jobs(
    database_url: str, clock: FixedClock
) -> None:
    """A graceful stop cancels the hook's wait; the claimed jobs start and finish."""
    held = anyio.Event()
    worked: list[int] = []

    class Holder:
        async def jobs_claimed(self, rows: Sequence[river.JobRow]) -> None:
            held.set()
            await anyio.sleep_forever()

    async def work(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        worked.append(job.id)

    workers = river.Workers()
    workers.add(Task, work)
    async with running(database_url, workers, clock=clock, hooks=[Holder()]) as run:
        with run.subscribe(K.JOB_COMPLETED, K.JOB_INTERRUPTED) as events:
            task = await run.client.insert(Task())
            with anyio.fail_after(WAIT):
                await held.wait()
            run.stop()
            ev = await next_event(events, job_id=task.job.id)
    assert worked == [task.job.id]
    assert ev.kind is K.JOB_COMPLETED


# --- pause and resume -------------------------------------------------------------------------


async def test_pause_stops_claiming_and_resume_picks_up(
    database_url: str, clock: FixedClock
) -> None:
    workers = river.Workers()
    ran: list[int] = []

    @workers.register(Task)
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        ran.append(job.id)

    async with running(database_url, workers, clock=clock) as run:
        ex = run.client.driver.executor()
        with run.subscribe() as events:
            await ex.queue_pause("default")
            paused = await next_event(events, K.QUEUE_PAUSED)
            assert paused.queue == "default"
            assert paused_flag(run)

            # A turn of the fetch loop that began after the insert would have claimed the
            # job: it is the second turn to end after the insert returned.
            def turns() -> int:
                return run.diagnostics.queues["default"].fetch_turns

            res = await run.client.insert(Task())
            inserted_at_turn = turns()
            await wait_until(lambda: turns() >= inserted_at_turn + 2)
            held = await get_row(run, res.job.id)
            assert (held.state, held.attempt, held.attempted_by) == (S.AVAILABLE, 0, ())
            assert not ran

            await ex.queue_resume("default")
            resumed = await next_event(events, K.QUEUE_RESUMED)
            assert resumed.queue == "default"
            await next_event(events, K.JOB_COMPLETED, job_id=res.job.id)
            assert not paused_flag(run)
    assert ran == [res.job.id]


# --- error handler, hooks, middleware ---------------------------------------------------------


async def test_error_handler_cancels_or_is_ignored_when_it_raises(
    database_url: str, clock: FixedClock, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[tuple[str, int, str]] = []

    class Handler:
        async def handle_error(self, job: river.JobRow, exc: BaseException) -> Any:
            calls.append((job.kind, job.attempt, f"{type(exc).__name__}: {exc}"))
            if job.kind == Task.kind:
                return types.SimpleNamespace(set_cancelled=True)
            if job.kind == Other.kind:
                raise RuntimeError("handler broke")
            return None

    workers = river.Workers()
    workers.add(Task, boom)
    workers.add(Other, boom)
    workers.add(Third, boom)
    caplog.set_level(logging.ERROR, logger="river_anyio")
    async with running(database_url, workers, clock=clock, error_handler=Handler()) as run:
        with run.subscribe(K.JOB_FAILED, K.JOB_CANCELLED) as events:
            results = await run.client.insert_many([Task(), Other(), Third()])
            kinds = {}
            for _ in results:
                ev = await next_event(events)
                assert ev.job is not None
                kinds[ev.job.id] = ev.kind
            task, other, third = [await get_row(run, r.job.id) for r in results]

    assert sorted(calls) == sorted(
        [(k, 1, "ValueError: boom") for k in (Task.kind, Other.kind, Third.kind)]
    )
    assert kinds[task.id] is K.JOB_CANCELLED
    assert task.state is S.CANCELLED and task.finalized_at == stored(database_url, clock.at)
    assert [e.error for e in task.errors] == ["boom"]  # the error that cancelled it
    for row in (other, third):
        assert kinds[row.id] is K.JOB_FAILED
        assert row.state is S.AVAILABLE and [e.error for e in row.errors] == ["boom"]
    assert any("error handler raised" in r.getMessage() for r in caplog.records)


async def test_middleware_and_hooks_wrap_the_worker_in_order(
    database_url: str, clock: FixedClock, caplog: pytest.LogCaptureFixture
) -> None:
    log: list[str] = []

    class Middleware:
        def __init__(self, name: str) -> None:
            self.name = name

        async def work(self, ctx: river.WorkContext, job: river.Job[Any], nxt: Any) -> Any:
            log.append(f"{self.name}>")
            try:
                return await nxt(ctx, job)
            finally:
                log.append(f"<{self.name}")

    class Hook:
        def __init__(self, name: str) -> None:
            self.name = name

        def work_begin(self, ctx: river.WorkContext, job: river.Job[Any]) -> None:
            log.append(f"{self.name}.begin")

        async def work_end(
            self, ctx: river.WorkContext, job: river.Job[Any], error: BaseException | None
        ) -> None:
            await anyio.lowlevel.checkpoint()
            log.append(f"{self.name}.end:{type(error).__name__ if error else None}")

    class BrokenHook:
        def work_begin(self, ctx: river.WorkContext, job: river.Job[Any]) -> None:
            raise RuntimeError("begin broke")

        async def work_end(self, *args: Any) -> None:
            raise RuntimeError("end broke")

    workers = river.Workers()

    @workers.register(Task)
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        log.append("work")
        if job.args.n:
            raise ValueError("boom")

    caplog.set_level(logging.ERROR, logger="river_anyio")
    async with running(
        database_url,
        workers,
        clock=clock,
        middleware=[Middleware("m1"), Middleware("m2")],
        hooks=[Hook("h1"), BrokenHook(), Hook("h2")],
    ) as run:
        with run.subscribe(K.JOB_COMPLETED, K.JOB_FAILED) as events:
            ok = await run.client.insert(Task(n=0))
            ok_ev = await next_event(events, job_id=ok.job.id)
            ok_log, log[:] = list(log), []
            bad = await run.client.insert(Task(n=1))
            bad_ev = await next_event(events, job_id=bad.job.id)

    assert ok_ev.kind is K.JOB_COMPLETED  # a raising hook is swallowed
    assert ok_log == [
        "m1>", "m2>", "h1.begin", "h2.begin", "work", "h1.end:None", "h2.end:None", "<m2", "<m1",
    ]  # fmt: skip
    assert bad_ev.kind is K.JOB_FAILED
    assert log == [
        "m1>", "m2>", "h1.begin", "h2.begin", "work",
        "h1.end:ValueError", "h2.end:ValueError", "<m2", "<m1",
    ]  # fmt: skip
    messages = [r.getMessage() for r in caplog.records]
    assert any("BrokenHook.work_begin raised" in m for m in messages)
    assert any("BrokenHook.work_end raised" in m for m in messages)


# --- metadata ---------------------------------------------------------------------------------


async def test_set_metadata_is_merged_and_bad_keys_or_values_are_rejected(
    database_url: str, clock: FixedClock, caplog: pytest.LogCaptureFixture
) -> None:
    rejected: list[str] = []
    workers = river.Workers()

    @workers.register(Task)
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        ctx.set_metadata("progress", {"done": 3})
        ctx.set_metadata("keep", "replaced")
        for key, value in (("river:mine", 1), ("obj", object()), ("nan", float("nan"))):
            try:
                ctx.set_metadata(key, value)
            except ValueError as exc:
                rejected.append(str(exc))
        if job.args.n == 1:
            raise ValueError("boom")  # staged metadata is merged whatever the outcome
        if job.args.n == 2:
            late: list[Any] = []
            ctx.set_metadata("late", late)
            late.append(object())  # unencodable by the end: dropped, and the client lives on

    caplog.set_level(logging.ERROR, logger="river_anyio")
    async with running(database_url, workers, clock=clock) as run:
        with run.subscribe(K.JOB_COMPLETED, K.JOB_FAILED) as events:
            opts = river.InsertOpts(metadata={"keep": 1, "other": True})
            results = await run.client.insert_many(
                [river.InsertManyParams(Task(n=i), opts) for i in range(3)]
            )
            await events_for(events, [r.job.id for r in results])
            ok, bad, late = [await get_row(run, r.job.id) for r in results]

    expected = {"keep": "replaced", "other": True, "progress": {"done": 3}}
    assert (ok.state, user_metadata(ok)) == (S.COMPLETED, expected)
    assert (bad.state, user_metadata(bad)) == (S.AVAILABLE, expected)
    assert "river:mine" not in ok.metadata
    assert (late.state, user_metadata(late)) == (S.COMPLETED, {"keep": 1, "other": True})
    assert any("not JSON-encodable" in r.getMessage() for r in caplog.records)
    assert len(rejected) == 9
    assert "river:" in rejected[0]
    assert "'obj' is not JSON-encodable" in rejected[1]
    assert "'nan' is not JSON-encodable" in rejected[2]


# --- thread and process workers ---------------------------------------------------------------


async def test_thread_workers(database_url: str, clock: FixedClock) -> None:
    loop_thread = threading.get_ident()
    threads: dict[int, int] = {}
    cancelled_seen: list[bool] = []

    def sync_ok(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        threads[job.id] = threading.get_ident()
        time.sleep(0.01)  # blocking is fine here

    def sync_fail(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        raise ValueError("thread boom")

    def sync_cooperative(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        cancelled_seen.append(ctx.cancelled.wait(10))

    workers = river.Workers()
    workers.add(Task, sync_ok, run_in="thread")
    workers.add(Other, sync_fail, run_in="thread")
    workers.add(Third, sync_cooperative, run_in="thread", timeout=0.1)
    async with running(database_url, workers, clock=clock) as run:
        with run.subscribe(K.JOB_COMPLETED, K.JOB_FAILED) as events:
            results = await run.client.insert_many([Task(), Other(), Third()])
            for _ in results:
                await next_event(events)
            ok, fail, coop = [await get_row(run, r.job.id) for r in results]

    assert ok.state is S.COMPLETED
    assert threads[ok.id] != loop_thread
    assert fail.state is S.AVAILABLE
    assert [(e.error, e.trace) for e in fail.errors] == [("thread boom", "")]
    # told to stop by ctx.cancelled; the attempt still counts as timed out
    assert cancelled_seen == [True]
    assert coop.state is S.AVAILABLE
    [err] = coop.errors
    assert err.error == "job timed out after 0.1s"


async def test_thread_worker_told_to_stop_is_interrupted(
    database_url: str, clock: FixedClock
) -> None:
    """A thread worker that returns because ``ctx.cancelled`` was set by stop-and-cancel did not
    finish its job: it is interrupted (available again, attempt given back), not completed."""
    started = threading.Event()

    def cooperative(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        started.set()
        ctx.cancelled.wait(10)

    workers = river.Workers()
    workers.add(Task, cooperative, run_in="thread")
    async with running(database_url, workers, clock=clock, job_timeout=None) as run:
        with run.subscribe() as events:
            res = await run.client.insert(Task())
            with anyio.fail_after(WAIT):
                assert await anyio.to_thread.run_sync(started.wait, WAIT, abandon_on_cancel=True)
            run.stop_and_cancel()
            await run.wait()
            finished = [ev async for ev in events if ev.job is not None]

    assert [ev.kind for ev in finished] == [K.JOB_INTERRUPTED]
    row = finished[0].job
    assert row is not None and row.id == res.job.id
    assert (row.state, row.attempt, row.errors, row.finalized_at) == (S.AVAILABLE, 0, (), None)
    assert row.scheduled_at == stored(database_url, clock.at)


async def test_process_workers(
    database_url: str, clock: FixedClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="river_anyio.executor")
    workers = river.Workers()
    workers.add(procworkers.ProcRecord, procworkers.record, run_in="process")
    workers.add(procworkers.ProcFail, procworkers.fail, run_in="process")
    out = tmp_path / "record.json"
    snooze_out = tmp_path / "snooze.json"
    async with running(database_url, workers, clock=clock) as run:
        with run.subscribe(K.JOB_COMPLETED, K.JOB_FAILED, K.JOB_SNOOZED) as events:
            results = await run.client.insert_many(
                [
                    procworkers.ProcRecord(path=str(out), n=1, tags=["a", "b"]),
                    procworkers.ProcRecord(path=str(snooze_out), n=2),
                    procworkers.ProcFail(),
                ]
            )
            kinds = {}
            for _ in results:
                ev = await next_event(events)
                assert ev.job is not None
                kinds[ev.job.id] = ev.kind
            ok, snoozed, fail = [await get_row(run, r.job.id) for r in results]

    assert [kinds[r.id] for r in (ok, snoozed, fail)] == [
        K.JOB_COMPLETED,
        K.JOB_SNOOZED,
        K.JOB_FAILED,
    ]
    seen = json.loads(out.read_text())
    assert seen["pid"] != os.getpid()
    assert seen["args_type"] == "ProcRecord"
    assert seen["args"] == {"path": str(out), "n": 1, "tags": ["a", "b"]}
    assert seen["row_args"] == json.loads(ok.encoded_args)  # the persisted JSON
    assert (seen["id"], seen["attempt"], seen["kind"]) == (ok.id, 1, "exec_proc_record")
    assert ok.state is S.COMPLETED and ok.finalized_at == stored(database_url, clock.at)
    assert (snoozed.state, snoozed.attempt, snoozed.scheduled_at) == (
        S.SCHEDULED,
        0,
        stored(database_url, clock.at + sec(30)),
    )
    assert fail.state is S.AVAILABLE
    [err] = fail.errors
    assert (err.error, err.trace) == ("boom in child", "")
    # the child's traceback is in the failure's log record
    [logged] = [r for r in caplog.records if getattr(r, "river_job_id", None) == fail.id]
    assert logged.exc_info is not None
    text = "".join(traceback.format_exception(logged.exc_info[1]))
    assert "in fail" in text and "ValueError: boom in child" in text


async def test_process_worker_cancelled_by_sigterm_or_killed_when_stuck(
    database_url: str, clock: FixedClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Cancelling a process worker's job sends SIGTERM (which interrupts the function); a child
    that ignores it is killed after ``job_stuck_threshold`` (2 s: long enough for a loaded
    machine to see the obedient child exit first)."""
    workers = river.Workers()
    workers.add(procworkers.ProcSleepy, procworkers.sleepy, run_in="process")
    workers.add(procworkers.ProcStubborn, procworkers.stubborn, run_in="process")
    fifos = [tmp_path / "sleepy.fifo", tmp_path / "stubborn.fifo"]
    for fifo in fifos:
        os.mkfifo(fifo)  # each child writes its pid here once its function runs
    caplog.set_level(logging.WARNING, logger="river_anyio")
    async with running(
        database_url, workers, clock=clock, job_timeout=None, job_stuck_threshold=2.0
    ) as run:
        ex = run.client.driver.executor()
        with run.subscribe(K.JOB_CANCELLED, K.JOB_FAILED, K.JOB_COMPLETED) as events:
            results = await run.client.insert_many(
                [procworkers.ProcSleepy(path=str(fifos[0])),
                 procworkers.ProcStubborn(path=str(fifos[1]))]
            )  # fmt: skip
            ids = [r.job.id for r in results]
            with anyio.fail_after(WAIT):
                pids = [
                    int(await anyio.to_thread.run_sync(f.read_text, abandon_on_cancel=True))
                    for f in fifos
                ]
            t0 = time.monotonic()
            for job_id in ids:
                await ex.job_cancel(job_id=job_id, cancel_attempted_at=clock.at)
            got = await events_for(events, ids)
            elapsed = time.monotonic() - t0
            sleepy, stubborn = [await get_row(run, i) for i in ids]

    assert elapsed < 5.0  # neither ran out its 60 s
    for row in (sleepy, stubborn):
        assert got[row.id].kind is K.JOB_CANCELLED
        assert row.state is S.CANCELLED
        assert [e.error for e in row.errors] == ["JobCancelError: job cancelled remotely"]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # gone, and reaped
    killed = [r for r in caplog.records if getattr(r, "river_event", "") == "job_stuck_killed"]
    assert [getattr(r, "river_job_id", None) for r in killed] == [stubborn.id]


# --- events -----------------------------------------------------------------------------------


async def test_lagging_subscriber_does_not_block_and_learns_what_it_missed(
    database_url: str, clock: FixedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    workers = river.Workers()

    @workers.register(Task)
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        pass

    async with running(database_url, workers, clock=clock) as run:
        active = run.subscribe(K.JOB_COMPLETED)  # the usual buffer
        monkeypatch.setattr(_events, "SUBSCRIPTION_BUFFER", 3)
        with run.subscribe(K.JOB_COMPLETED) as lagging, active:
            await run.client.insert_many([Task(n=i) for i in range(10)])
            for _ in range(10):
                await next_event(active)  # every job completed: nobody waited for `lagging`
            assert lagging.dropped == 7
            first = await next_event(lagging)
            rest = [lagging.receive_nowait() for _ in range(3)]
            with pytest.raises(anyio.WouldBlock):
                lagging.receive_nowait()

    assert first.kind is K.EVENTS_DROPPED
    assert first.details == {"count": 7}
    assert [e.kind for e in rest] == [K.JOB_COMPLETED] * 3


# --- the worker pool ---------------------------------------------------------------------------


async def test_claimed_jobs_that_wait_all_run_at_once(database_url: str, clock: FixedClock) -> None:
    """A batch of jobs that wait runs concurrently up to ``max_workers`` (the workers wake
    one another), and a job that never waits does not hold the others back."""
    started: list[int] = []
    all_started = anyio.Event()
    gate = anyio.Event()

    async def waits(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        started.append(job.args.n)
        if len(started) == 10:
            all_started.set()
        await gate.wait()  # released only once all ten run at the same time

    async def quick(ctx: river.WorkContext, job: river.Job[Other]) -> None:
        return None

    workers = river.Workers()
    workers.add(Task, waits)
    workers.add(Other, quick)
    async with running(database_url, workers, clock=clock) as run:
        with run.subscribe(K.JOB_COMPLETED) as events:
            results = await run.client.insert_many(
                [Task(n=i) for i in range(10)] + [Other(n=i) for i in range(2)]
            )
            with anyio.fail_after(WAIT):
                await all_started.wait()
            assert sorted(started) == list(range(10))
            gate.set()
            got = await events_for(events, [r.job.id for r in results])
    assert all(ev.kind is K.JOB_COMPLETED for ev in got.values())


async def test_one_worker_runs_jobs_after_a_timeout_and_a_remote_cancel(
    database_url: str, clock: FixedClock
) -> None:
    """One worker runs every job: a timeout or a remote cancel of one job ends that job only,
    and the jobs after it run (and wait) uncancelled."""
    started = anyio.Event()

    class TimesOut:
        async def work(self, ctx: river.WorkContext, job: river.Job[Any]) -> None:
            await anyio.sleep_forever()

        def timeout(self, job: river.Job[Any]) -> float:
            return 0.05

    async def waits_a_little(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        await anyio.sleep(0.05)

    async def waits_for_cancel(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        started.set()
        await anyio.sleep_forever()

    async def swallows(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            return None  # completes despite the timeout

    workers = river.Workers()
    workers.add(Task, TimesOut())
    workers.add(Other, waits_a_little)
    workers.add(Third, waits_for_cancel)
    workers.add(Fourth, swallows, timeout=dt.timedelta(milliseconds=50))
    queues = {"default": river.QueueConfig(max_workers=1)}
    async with running(database_url, workers, clock=clock, queues=queues, job_timeout=None) as run:
        ex = run.client.driver.executor()
        with run.subscribe(K.JOB_FAILED, K.JOB_COMPLETED, K.JOB_CANCELLED) as events:
            first = await run.client.insert_many([Task(), Other(n=1), Fourth(), Other(n=3)])
            got = await events_for(events, [r.job.id for r in first])
            cancelled = await run.client.insert(Third())
            with anyio.fail_after(WAIT):
                await started.wait()
            later = await run.client.insert(Other(n=2))
            await ex.job_cancel(job_id=cancelled.job.id, cancel_attempted_at=clock.at)
            got |= await events_for(events, [cancelled.job.id, later.job.id])
    kinds = [got[r.job.id].kind for r in (*first, cancelled, later)]
    assert kinds == [K.JOB_FAILED, K.JOB_COMPLETED] + [K.JOB_COMPLETED] * 2 + [
        K.JOB_CANCELLED,
        K.JOB_COMPLETED,
    ]
    timed_out = got[first[0].job.id].job
    assert timed_out is not None
    [err] = timed_out.errors
    assert err.error == "job timed out after 0.05s"


async def test_timeouts_fire_in_deadline_order_after_many_finished_jobs(
    database_url: str, clock: FixedClock
) -> None:
    """Hundreds of quick jobs with a long timeout finish first (their deadlines outlive
    them); then a job with a long timeout and one with a short one, started in that order,
    both hang: the short one times out first and the long one still times out."""

    async def quick(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        return None

    async def hangs(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        await anyio.sleep_forever()

    workers = river.Workers()
    workers.add(Task, quick, timeout=dt.timedelta(seconds=60))
    workers.add(Other, hangs, timeout=dt.timedelta(seconds=0.6))
    workers.add(Third, hangs, timeout=dt.timedelta(seconds=0.1))
    async with running(database_url, workers, clock=clock) as run:
        with run.subscribe(K.JOB_COMPLETED, K.JOB_FAILED) as events:
            many = await run.client.insert_many([Task(n=i) for i in range(300)])
            await events_for(events, [r.job.id for r in many], within=30)
            slow = await run.client.insert(Other())
            fast = await run.client.insert(Third())
            first = await next_event(events, K.JOB_FAILED)
            second = await next_event(events, K.JOB_FAILED)
    assert [first.job.id, second.job.id] == [fast.job.id, slow.job.id]  # type: ignore[union-attr]
    assert [e.job.errors[-1].error for e in (first, second)] == [  # type: ignore[union-attr]
        "job timed out after 0.1s",
        "job timed out after 0.6s",
    ]
