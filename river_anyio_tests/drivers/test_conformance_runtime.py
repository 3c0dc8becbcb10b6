"""Conformance of the runtime's driver operations (claim, complete, cancel, queues), run against
every driver (PostgreSQL and SQLite) on both loops, through the public protocol only.

Backend differences that are part of the contract are tested with ``if``: SQLite rows carry
``river:unique_nonce`` in metadata. The metadata merge is River 0.51's on both backends: top-level
keys replaced, nulls kept.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

import river_anyio as river
from river_anyio._timeutil import format_rfc3339nano, parse_rfc3339
from river_anyio.drivers import (
    TOPIC_CONTROL,
    CompletionResult,
    Driver,
    Executor,
    JobCompletion,
    JobInsertParams,
    Listener,
)

from .support import open_driver, ph
from .support import params as _params

pytestmark = pytest.mark.anyio
UTC = dt.UTC
params = functools.partial(_params, kind="runtime")
S = river.JobState
CLIENT = "client-a"
#: Slack for comparing the database's now() with this process's clock.
SLACK = dt.timedelta(seconds=5)


def meta(job: river.JobRow) -> dict[str, Any]:
    """Metadata without SQLite's insert nonce."""
    return {k: v for k, v in job.metadata.items() if k != "river:unique_nonce"}


def now() -> dt.datetime:
    return dt.datetime.now(UTC)


def ms(value: dt.datetime) -> dt.datetime:
    """``value`` truncated to milliseconds (every backend keeps at least that)."""
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def error_bytes(attempt: int, message: str, at: dt.datetime | None = None) -> bytes:
    obj = {
        "at": format_rfc3339nano(at or ms(now())),
        "attempt": attempt,
        "error": message,
        "trace": "",
    }
    return json.dumps(obj).encode()


def near_now(value: dt.datetime | None, before: dt.datetime) -> bool:
    return value is not None and before - SLACK <= value <= now() + SLACK


async def insert(driver: Driver, *ps: JobInsertParams) -> list[river.JobRow]:
    async with driver.transaction() as tx:
        rows = await tx.job_insert_fast_many(list(ps))
    return [r.job for r in rows]


async def claim(
    ex: Executor, n: int = 100, *, queue: str = "default", client_id: str = CLIENT, **kw: Any
) -> list[river.JobRow]:
    return await ex.job_get_available(queue=queue, max_to_lock=n, client_id=client_id, **kw)


async def get(ex: Executor, job_id: int) -> river.JobRow:
    job = await ex.job_get_by_id(job_id)
    assert job is not None
    return job


async def complete_one(ex: Executor, c: JobCompletion, client_id: str = CLIENT) -> CompletionResult:
    (res,) = await ex.job_set_state_if_running_many([c], client_id=client_id)
    assert res.job.id == c.id
    return res


@asynccontextmanager
async def control_listener(driver: Driver) -> AsyncIterator[Listener]:
    async with driver.listener() as listener:
        await listener.listen(TOPIC_CONTROL)
        yield listener


async def receive(listener: Listener, n: int) -> list[Mapping[str, Any]]:
    """The next ``n`` control payloads, decoded."""
    got: list[Mapping[str, Any]] = []
    if n == 0:
        return got
    with anyio.fail_after(10):
        async for note in listener:
            assert note.topic == TOPIC_CONTROL
            got.append(json.loads(note.payload))
            if len(got) == n:
                break
    return got


async def expect_nothing_more(driver: Driver, listener: Listener) -> None:
    """Nothing was sent before a sentinel notification sent now."""
    await driver.executor().notify_many(TOPIC_CONTROL, ['{"action":"sentinel"}'])
    assert await receive(listener, 1) == [{"action": "sentinel"}]


# ---------------------------------------------------------------------------------------------
# claiming


async def test_claim_order_and_limit(database_url: str) -> None:
    t0 = ms(now()) - dt.timedelta(hours=1)
    async with open_driver(database_url) as driver:
        a, b, c, d, e, f = await insert(
            driver,
            params(0, priority=2, scheduled_at=t0),
            params(1, priority=1, scheduled_at=t0 + dt.timedelta(minutes=2)),
            params(2, priority=1, scheduled_at=t0 + dt.timedelta(minutes=1)),
            params(3, priority=4, scheduled_at=t0 - dt.timedelta(minutes=9)),
            params(4, priority=1, scheduled_at=t0 + dt.timedelta(minutes=1)),
            params(5, priority=2, scheduled_at=t0),
        )
        ex = driver.executor()
        assert await claim(ex, 0) == []
        first = await claim(ex, 3)
        assert [j.id for j in first] == [c.id, e.id, b.id]
        assert all(j.state is S.RUNNING for j in first)
        rest = await claim(ex, 10)
        assert [j.id for j in rest] == [a.id, f.id, d.id]
        assert await claim(ex, 10) == []


async def test_claim_only_available_and_due_jobs_of_the_queue(database_url: str) -> None:
    past = ms(now()) - dt.timedelta(minutes=5)
    future = ms(now()) + dt.timedelta(hours=1)
    async with open_driver(database_url) as driver:
        due, *_ = await insert(
            driver,
            params(0, scheduled_at=past),
            params(1, scheduled_at=future),
            params(2, queue="other", scheduled_at=past),
            params(3, state=S.SCHEDULED, scheduled_at=past),
            params(4, state=S.RETRYABLE, scheduled_at=past),
            params(5, state=S.PENDING, scheduled_at=past),
        )
        ex = driver.executor()
        assert [j.id for j in await claim(ex)] == [due.id]
        assert await claim(ex) == []
        (other,) = await claim(ex, queue="other")
        assert other.args == {"n": 2}
        # the not-yet-due job is untouched
        (waiting,) = await ex.job_list(states=[S.AVAILABLE])
        assert waiting.args == {"n": 1} and waiting.attempt == 0 and waiting.attempted_by == ()


async def test_claim_sets_attempt_attempted_at_and_attempted_by(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        (job,) = await insert(driver, params(1))
        assert job.attempt == 0 and job.attempted_at is None
        ex = driver.executor()
        before = now()
        (got,) = await claim(ex, client_id="client-a")
        assert got.id == job.id
        assert got.state is S.RUNNING
        assert got.attempt == 1
        assert got.attempted_by == ("client-a",)
        assert near_now(got.attempted_at, before)
        assert got.args == {"n": 1} and got.kind == "runtime" and got.max_attempts == 25
        assert (await get(ex, job.id)) == got
        # give it back for a retry, due now; the next claim appends the next client
        res = await complete_one(
            ex,
            JobCompletion(
                id=job.id,
                attempt=1,
                state=S.AVAILABLE,
                scheduled_at=ms(now()) - dt.timedelta(seconds=1),
                error=error_bytes(1, "boom"),
            ),
            client_id="client-a",
        )
        assert res.applied
        (again,) = await claim(ex, client_id="client-b")
        assert again.attempt == 2
        assert again.attempted_by == ("client-a", "client-b")
        assert len(again.errors) == 1


async def test_claim_caps_attempted_by(database_url: str) -> None:
    p = ph(database_url)
    async with open_driver(database_url) as driver:
        a, b = await insert(driver, params(1), params(2, queue="small"))
        ex = driver.executor()
        full = [f"old-{i}" for i in range(100)]
        five = [f"old-{i}" for i in range(5)]
        for job_id, value in ((a.id, full), (b.id, five)):
            arg: Any = json.dumps(value) if p == "?" else value
            n = await ex.execute(
                f"UPDATE river_job SET attempted_by = {p} WHERE id = {p}", (arg, job_id)
            )
            assert n == 1
        (got,) = await claim(ex, client_id="ours")
        assert len(got.attempted_by) == 100
        assert got.attempted_by == (*full[1:], "ours")
        (small,) = await claim(ex, queue="small", client_id="ours", max_attempted_by=3)
        assert small.attempted_by == ("old-3", "old-4", "ours")


async def test_concurrent_claims_never_share_a_job(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        jobs = await insert(driver, *(params(i) for i in range(120)))
        claimed: list[list[int]] = []

        async def worker(name: str) -> None:
            ex = driver.executor()
            while True:
                got = await claim(ex, 7, client_id=name)
                if not got:
                    return
                claimed.append([j.id for j in got])

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(worker, f"w{i}")
        ids = [i for batch in claimed for i in batch]
        assert len(ids) == len(set(ids))
        assert sorted(ids) == sorted(j.id for j in jobs)


async def test_claim_kinds_filter(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        a, b, c, d = await insert(
            driver,
            params(0, kind="k_a"),
            params(1, kind="k_b"),
            params(2, kind="k_c"),
            params(3, kind="k_a"),
        )
        ex = driver.executor()
        assert await claim(ex, kinds=[]) == []
        assert [j.id for j in await claim(ex, kinds=["k_a", "k_c", "k_none"])] == [a.id, c.id, d.id]
        assert await claim(ex, kinds=["k_a"]) == []
        assert [j.id for j in await claim(ex, kinds=None)] == [b.id]


async def test_claim_inside_a_transaction_rolls_back(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        (job,) = await insert(driver, params(1))
        with pytest.raises(RuntimeError):
            async with driver.transaction() as tx:
                assert [j.id for j in await claim(tx)] == [job.id]
                raise RuntimeError
        got = await get(driver.executor(), job.id)
        assert got.state is S.AVAILABLE and got.attempt == 0


# ---------------------------------------------------------------------------------------------
# completing


async def running(
    driver: Driver, *ps: JobInsertParams, client_id: str = CLIENT
) -> list[river.JobRow]:
    """Insert jobs and claim them all (in the order given: priorities are left equal)."""
    ids = [j.id for j in await insert(driver, *ps)]
    queues = sorted({p.queue for p in ps})
    got: dict[int, river.JobRow] = {}
    for q in queues:
        for j in await claim(driver.executor(), len(ps), queue=q, client_id=client_id):
            got[j.id] = j
    assert sorted(got) == sorted(ids)
    return [got[i] for i in ids]


async def test_complete_to_completed(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        (job,) = await running(driver, params(1))
        ex = driver.executor()
        at = ms(now())
        res = await complete_one(
            ex,
            JobCompletion(
                id=job.id,
                attempt=1,
                state=S.COMPLETED,
                finalized_at=at,
                metadata_updates=b'{"output":{"x":1}}',
            ),
        )
        assert res.applied
        got = res.job
        assert got.state is S.COMPLETED
        assert got.finalized_at == at
        assert got.attempt == 1 and got.errors == ()
        assert got.scheduled_at == job.scheduled_at
        assert got.attempted_by == (CLIENT,)
        assert meta(got) == {"output": {"x": 1}}
        assert await get(ex, job.id) == got
        assert await ex.job_set_state_if_running_many([], client_id=CLIENT) == []


async def test_complete_to_retryable_appends_the_error(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        (job,) = await running(driver, params(1))
        ex = driver.executor()
        retry_at = ms(now()) + dt.timedelta(minutes=10)
        started = ms(now()) - dt.timedelta(seconds=3)
        res = await complete_one(
            ex,
            JobCompletion(
                id=job.id,
                attempt=1,
                state=S.RETRYABLE,
                scheduled_at=retry_at,
                error=error_bytes(1, "first", started),
            ),
        )
        assert res.applied
        got = res.job
        assert got.state is S.RETRYABLE
        assert got.scheduled_at == retry_at
        assert got.finalized_at is None
        assert got.attempt == 1
        assert got.errors == (river.AttemptError(at=started, attempt=1, error="first", trace=""),)
        assert await claim(ex) == []  # retryable is the scheduler's business
        # a second error is appended after the first
        p = ph(database_url)
        await ex.execute(
            f"UPDATE river_job SET state = 'running', attempt = 2 WHERE id = {p}", (job.id,)
        )
        res = await complete_one(
            ex,
            JobCompletion(
                id=job.id,
                attempt=2,
                state=S.DISCARDED,
                finalized_at=ms(now()),
                error=error_bytes(2, "second"),
            ),
        )
        assert res.applied
        assert [e.error for e in res.job.errors] == ["first", "second"]
        assert [e.attempt for e in res.job.errors] == [1, 2]
        assert res.job.state is S.DISCARDED and res.job.finalized_at is not None


async def test_complete_to_available_in_the_future(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        (job,) = await running(driver, params(1))
        ex = driver.executor()
        # a non-UTC offset is the same instant
        retry_at = ms(now() + dt.timedelta(minutes=30)).astimezone(
            dt.timezone(dt.timedelta(hours=2))
        )
        res = await complete_one(
            ex,
            JobCompletion(
                id=job.id,
                attempt=1,
                state=S.AVAILABLE,
                scheduled_at=retry_at,
                error=error_bytes(1, "soon"),
            ),
        )
        assert res.applied
        assert res.job.state is S.AVAILABLE
        assert res.job.scheduled_at == retry_at
        assert res.job.finalized_at is None
        assert len(res.job.errors) == 1
        assert await claim(ex) == []  # not due yet


async def test_snooze(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        (job,) = await running(driver, params(1, metadata=b'{"keep":true}'))
        ex = driver.executor()
        wake = ms(now()) + dt.timedelta(minutes=1)
        res = await complete_one(
            ex,
            JobCompletion(
                id=job.id,
                attempt=1,
                state=S.SCHEDULED,
                scheduled_at=wake,
                attempt_new=0,
                metadata_updates=b'{"snoozes":1}',
            ),
        )
        assert res.applied
        got = res.job
        assert (got.state, got.attempt, got.scheduled_at, got.finalized_at, got.errors) == (
            S.SCHEDULED,
            0,
            wake,
            None,
            (),
        )
        assert meta(got) == {"keep": True, "snoozes": 1}
        # a snooze to the near future stays available
        (job2,) = await running(driver, params(2))
        res = await complete_one(
            ex,
            JobCompletion(
                id=job2.id,
                attempt=1,
                state=S.AVAILABLE,
                scheduled_at=ms(now()) - dt.timedelta(seconds=1),
                attempt_new=0,
                metadata_updates=b'{"snoozes":1}',
            ),
        )
        assert res.applied and res.job.state is S.AVAILABLE and res.job.attempt == 0
        (again,) = await claim(ex)
        assert again.id == job2.id and again.attempt == 1 and meta(again) == {"snoozes": 1}


@pytest.mark.parametrize("state", [S.CANCELLED, S.DISCARDED])
async def test_complete_to_cancelled_or_discarded(database_url: str, state: river.JobState) -> None:
    async with open_driver(database_url) as driver:
        (job,) = await running(driver, params(1))
        ex = driver.executor()
        at = ms(now())
        res = await complete_one(
            ex,
            JobCompletion(
                id=job.id, attempt=1, state=state, finalized_at=at, error=error_bytes(1, "bad")
            ),
        )
        assert res.applied
        assert res.job.state is state
        assert res.job.finalized_at == at
        assert res.job.scheduled_at == job.scheduled_at
        assert [e.error for e in res.job.errors] == ["bad"]


async def test_metadata_merge(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        (job,) = await running(driver, params(1, metadata=b'{"a":{"x":1},"n":1,"keep":"yes"}'))
        ex = driver.executor()
        res = await complete_one(
            ex,
            JobCompletion(
                id=job.id,
                attempt=1,
                state=S.COMPLETED,
                finalized_at=ms(now()),
                metadata_updates=b'{"a":{"y":2},"n":null,"new":[1,2]}',
            ),
        )
        assert res.applied
        # River 0.51 on both backends: top-level keys replaced, nulls stored
        assert meta(res.job) == {"a": {"y": 2}, "n": None, "keep": "yes", "new": [1, 2]}


async def test_metadata_merged_even_when_not_running(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        (job,) = await running(driver, params(1, metadata=b'{"k":1}'))
        ex = driver.executor()
        at = ms(now())
        assert (
            await complete_one(
                ex, JobCompletion(id=job.id, attempt=1, state=S.COMPLETED, finalized_at=at)
            )
        ).applied
        res = await complete_one(
            ex,
            JobCompletion(
                id=job.id,
                attempt=1,
                state=S.RETRYABLE,
                scheduled_at=ms(now()) + dt.timedelta(hours=1),
                error=error_bytes(1, "late"),
                metadata_updates=b'{"late":true}',
            ),
        )
        assert not res.applied
        assert res.job.state is S.COMPLETED and res.job.finalized_at == at and res.job.errors == ()
        assert meta(res.job) == {"k": 1, "late": True}
        # without updates the row comes back unchanged
        res2 = await complete_one(
            ex, JobCompletion(id=job.id, attempt=1, state=S.COMPLETED, finalized_at=ms(now()))
        )
        assert not res2.applied and res2.job == res.job


async def test_should_cancel_converts_available_retryable_and_scheduled(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        retry, snooze, soon = await running(driver, params(1), params(2), params(3))
        ex = driver.executor()
        for job in (retry, snooze, soon):
            got = await ex.job_cancel(job_id=job.id, cancel_attempted_at=ms(now()), notify=False)
            assert (
                got is not None and got.state is S.RUNNING and "cancel_attempted_at" in got.metadata
            )
        later = ms(now()) + dt.timedelta(hours=1)
        before = now()
        results = await ex.job_set_state_if_running_many(
            [
                JobCompletion(
                    id=retry.id,
                    attempt=1,
                    state=S.RETRYABLE,
                    scheduled_at=later,
                    error=error_bytes(1, "x"),
                ),
                JobCompletion(
                    id=snooze.id,
                    attempt=1,
                    state=S.SCHEDULED,
                    scheduled_at=later,
                    attempt_new=0,
                    metadata_updates=b'{"snoozes":1}',
                ),
                # River 0.51 converts a near-future (available) retry too
                JobCompletion(
                    id=soon.id,
                    attempt=1,
                    state=S.AVAILABLE,
                    scheduled_at=later,
                    error=error_bytes(1, "y"),
                ),
            ],
            client_id=CLIENT,
        )
        r1, r2, r3 = results
        assert all(r.applied for r in results)
        for r, job in ((r1, retry), (r2, snooze), (r3, soon)):
            assert r.job.state is S.CANCELLED
            assert near_now(r.job.finalized_at, before)
            assert r.job.scheduled_at == job.scheduled_at
            assert r.job.attempt == 1
        assert [e.error for e in r1.job.errors] == ["x"]
        assert [e.error for e in r3.job.errors] == ["y"]
        assert meta(r2.job)["snoozes"] == 1


async def test_attempt_guard(database_url: str) -> None:
    p = ph(database_url)
    async with open_driver(database_url) as driver:
        wrong_attempt, wrong_client, not_running, ok = await running(
            driver, params(1), params(2), params(3), params(4)
        )
        ex = driver.executor()
        await ex.execute(
            f"UPDATE river_job SET state = 'retryable' WHERE id = {p}", (not_running.id,)
        )
        at = ms(now())

        def done(job: river.JobRow, attempt: int = 1) -> JobCompletion:
            return JobCompletion(
                id=job.id,
                attempt=attempt,
                state=S.RETRYABLE,
                scheduled_at=at + dt.timedelta(hours=1),
                error=error_bytes(attempt, "e"),
                attempt_new=7,
                metadata_updates=b'{"merged":1}',
            )

        r = await ex.job_set_state_if_running_many([done(wrong_attempt, 2)], client_id=CLIENT)
        r += await ex.job_set_state_if_running_many([done(wrong_client)], client_id="someone-else")
        r += await ex.job_set_state_if_running_many([done(not_running), done(ok)], client_id=CLIENT)
        assert [x.applied for x in r] == [False, False, False, True]
        for res, job, state in zip(
            r[:3],
            (wrong_attempt, wrong_client, not_running),
            (S.RUNNING, S.RUNNING, S.RETRYABLE),
            strict=True,
        ):
            assert res.job.id == job.id
            assert res.job.state is state
            assert res.job.attempt == 1
            assert res.job.errors == ()
            assert res.job.scheduled_at == job.scheduled_at
            assert meta(res.job) == {"merged": 1}
            assert await get(ex, job.id) == res.job
        assert (
            r[3].job.state is S.RETRYABLE
            and r[3].job.attempt == 7
            and meta(r[3].job) == {"merged": 1}
        )
        # a job re-claimed by another client is not finalized by the first client's completion
        await ex.execute(
            f"UPDATE river_job SET state = 'available' WHERE id = {p}", (wrong_client.id,)
        )
        (reclaimed,) = await claim(ex, client_id="client-b")
        assert reclaimed.attempt == 2
        stale = JobCompletion(id=reclaimed.id, attempt=1, state=S.COMPLETED, finalized_at=at)
        assert not (await complete_one(ex, stale)).applied
        stale_client = JobCompletion(id=reclaimed.id, attempt=2, state=S.COMPLETED, finalized_at=at)
        assert not (await complete_one(ex, stale_client, client_id=CLIENT)).applied
        res = await complete_one(ex, stale_client, client_id="client-b")
        assert res.applied and res.job.state is S.COMPLETED


async def test_results_in_input_order_and_deleted_rows_absent(database_url: str) -> None:
    p = ph(database_url)
    async with open_driver(database_url) as driver:
        jobs = await running(driver, *(params(i) for i in range(6)))
        ex = driver.executor()
        gone = jobs[2]
        assert await ex.execute(f"DELETE FROM river_job WHERE id = {p}", (gone.id,)) == 1
        order = [jobs[4], jobs[0], gone, jobs[5], jobs[1], jobs[3]]
        at = ms(now())
        completions = [
            JobCompletion(id=j.id, attempt=1, state=S.COMPLETED, finalized_at=at) for j in order
        ]
        completions.append(JobCompletion(id=10**12, attempt=1, state=S.COMPLETED, finalized_at=at))
        results = await ex.job_set_state_if_running_many(completions, client_id=CLIENT)
        assert [r.job.id for r in results] == [j.id for j in order if j is not gone]
        assert all(r.applied and r.job.state is S.COMPLETED for r in results)


async def test_large_batch(database_url: str) -> None:
    n = 5000
    async with open_driver(database_url) as driver:
        await insert(driver, *(params(i) for i in range(n)))
        ex = driver.executor()
        jobs = await claim(ex, n)
        assert len(jobs) == n
        at = ms(now())
        completions = [
            JobCompletion(id=j.id, attempt=1, state=S.COMPLETED, finalized_at=at)
            if j.id % 2
            else JobCompletion(
                id=j.id,
                attempt=1,
                state=S.RETRYABLE,
                scheduled_at=at + dt.timedelta(hours=1),
                error=error_bytes(1, "e"),
            )
            for j in reversed(jobs)
        ]
        results = await ex.job_set_state_if_running_many(completions, client_id=CLIENT)
        assert [r.job.id for r in results] == [c.id for c in completions]
        assert all(r.applied for r in results)
        assert all(r.job.state is (S.COMPLETED if r.job.id % 2 else S.RETRYABLE) for r in results)


async def test_completion_inside_a_transaction(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        (job,) = await running(driver, params(1))
        with pytest.raises(RuntimeError):
            async with driver.transaction() as tx:
                res = await complete_one(
                    tx,
                    JobCompletion(id=job.id, attempt=1, state=S.COMPLETED, finalized_at=ms(now())),
                )
                assert res.applied
                raise RuntimeError
        assert (await get(driver.executor(), job.id)).state is S.RUNNING
        async with driver.transaction() as tx:
            res = await complete_one(
                tx, JobCompletion(id=job.id, attempt=1, state=S.COMPLETED, finalized_at=ms(now()))
            )
        assert (await get(driver.executor(), job.id)).state is S.COMPLETED


# ---------------------------------------------------------------------------------------------
# cancelling


async def test_job_cancel(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        (run,) = await running(driver, params(1, queue="cq"))
        avail, sched = await insert(
            driver,
            params(2, queue="cq"),
            params(
                3, queue="cq", state=S.SCHEDULED, scheduled_at=ms(now()) + dt.timedelta(hours=1)
            ),
        )
        (done,) = await running(driver, params(4))
        ex = driver.executor()
        done_at = ms(now())
        await complete_one(
            ex, JobCompletion(id=done.id, attempt=1, state=S.COMPLETED, finalized_at=done_at)
        )
        done = await get(ex, done.id)
        async with control_listener(driver) as listener:
            at = ms(now())
            got = await ex.job_cancel(job_id=run.id, cancel_attempted_at=at)
            assert got is not None
            assert got.state is S.RUNNING and got.finalized_at is None
            assert parse_rfc3339(got.metadata["cancel_attempted_at"]) == at
            assert await receive(listener, 1) == [
                {"action": "cancel", "job_id": run.id, "queue": "cq"}
            ]

            before = now()
            for job in (avail, sched):
                got = await ex.job_cancel(job_id=job.id, cancel_attempted_at=at)
                assert got is not None and got.id == job.id
                assert got.state is S.CANCELLED
                assert near_now(got.finalized_at, before)
                assert parse_rfc3339(got.metadata["cancel_attempted_at"]) == at
                assert await get(ex, job.id) == got
            assert await receive(listener, 2) == [
                {"action": "cancel", "job_id": avail.id, "queue": "cq"},
                {"action": "cancel", "job_id": sched.id, "queue": "cq"},
            ]

            # finalized jobs come back unchanged, without a notification; missing ones are None
            assert await ex.job_cancel(job_id=done.id, cancel_attempted_at=at) == done
            assert await ex.job_cancel(job_id=10**12, cancel_attempted_at=at) is None
            await expect_nothing_more(driver, listener)

            # notify=False cancels without notifying
            (quiet,) = await insert(driver, params(5, queue="cq"))
            got = await ex.job_cancel(job_id=quiet.id, cancel_attempted_at=at, notify=False)
            assert got is not None and got.state is S.CANCELLED
            await expect_nothing_more(driver, listener)

            # inside a rolled-back transaction: neither the change nor the notification
            (kept,) = await insert(driver, params(6, queue="cq"))
            with pytest.raises(RuntimeError):
                async with driver.transaction() as tx:
                    assert await tx.job_cancel(job_id=kept.id, cancel_attempted_at=at) is not None
                    raise RuntimeError
            assert (await get(ex, kept.id)).state is S.AVAILABLE
            await expect_nothing_more(driver, listener)
        # the running job, once it fails with a retry, ends cancelled (should_cancel)
        res = await complete_one(
            ex,
            JobCompletion(
                id=run.id,
                attempt=1,
                state=S.RETRYABLE,
                scheduled_at=at + dt.timedelta(hours=1),
                error=error_bytes(1, "x"),
            ),
        )
        assert res.applied and res.job.state is S.CANCELLED


async def test_job_get_cancel_requested(database_url: str) -> None:
    """Of the ids asked about, the running jobs with a cancellation request, ascending."""
    async with open_driver(database_url) as driver:
        ex = driver.executor()
        requested = await running(driver, params(1), params(2))
        (plain,) = await running(driver, params(3))
        (waiting,) = await insert(driver, params(4, queue="wq"))
        (other,) = await running(driver, params(5))
        at = ms(now())
        for job in (*requested, waiting, other):
            await ex.job_cancel(job_id=job.id, cancel_attempted_at=at, notify=False)
        ids = [plain.id, requested[1].id, waiting.id, requested[0].id, 10**12]
        assert await ex.job_get_cancel_requested(ids) == sorted(j.id for j in requested)
        assert await ex.job_get_cancel_requested([plain.id]) == []
        assert await ex.job_get_cancel_requested([]) == []
        # a job whose attempt ended is no longer running: no request to act on
        await complete_one(
            ex, JobCompletion(id=requested[0].id, attempt=1, state=S.CANCELLED, finalized_at=at)
        )
        assert await ex.job_get_cancel_requested(ids) == [requested[1].id]


# ---------------------------------------------------------------------------------------------
# queues


async def test_queue_create_get_list(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        ex = driver.executor()
        assert await ex.queue_get("alpha") is None
        assert await ex.queue_list() == []
        before = now()
        alpha = await ex.queue_create_or_set_updated_at(name="alpha", metadata=b'{"k":1}')
        assert alpha.name == "alpha"
        assert alpha.metadata == {"k": 1}
        assert alpha.paused_at is None
        assert near_now(alpha.created_at, before) and near_now(alpha.updated_at, before)
        assert await ex.queue_get("alpha") == alpha
        # again: only updated_at moves (metadata is kept)
        again = await ex.queue_create_or_set_updated_at(name="alpha", metadata=b'{"other":2}')
        assert again.created_at == alpha.created_at
        assert again.updated_at >= alpha.updated_at
        assert again.metadata == {"k": 1}
        await ex.queue_create_or_set_updated_at(name="gamma")
        beta = await ex.queue_create_or_set_updated_at(name="beta")
        assert beta.metadata == {}
        assert [q.name for q in await ex.queue_list()] == ["alpha", "beta", "gamma"]
        assert [q.name for q in await ex.queue_list(limit=2)] == ["alpha", "beta"]
        assert (await ex.queue_list())[1] == beta


async def test_queue_pause_resume(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        ex = driver.executor()
        for name in ("q1", "q2", "q3"):
            await ex.queue_create_or_set_updated_at(name=name)
        async with control_listener(driver) as listener:
            before = now()
            assert await ex.queue_pause("q1") == 1
            q1 = await ex.queue_get("q1")
            assert q1 is not None and near_now(q1.paused_at, before)
            assert q1.updated_at == q1.paused_at
            assert await receive(listener, 1) == [{"action": "pause", "queue": "q1"}]

            # already paused: matched, unchanged
            assert await ex.queue_pause("q1") == 1
            assert await ex.queue_get("q1") == q1
            assert await receive(listener, 1) == [{"action": "pause", "queue": "q1"}]

            assert await ex.queue_pause("*") == 3
            assert await receive(listener, 1) == [{"action": "pause", "queue": "*"}]
            assert await ex.queue_get("q1") == q1  # still the first pause
            assert all(q.paused_at is not None for q in await ex.queue_list())

            assert await ex.queue_resume("q2") == 1
            q2 = await ex.queue_get("q2")
            assert q2 is not None and q2.paused_at is None
            assert await receive(listener, 1) == [{"action": "resume", "queue": "q2"}]
            # resuming a running queue matches and leaves it as is
            assert await ex.queue_resume("q2") == 1
            assert await ex.queue_get("q2") == q2
            assert await receive(listener, 1) == [{"action": "resume", "queue": "q2"}]

            assert await ex.queue_resume("*") == 3
            assert await receive(listener, 1) == [{"action": "resume", "queue": "*"}]
            assert all(q.paused_at is None for q in await ex.queue_list())

            # unknown queue: nothing matched
            assert await ex.queue_pause("missing") == 0
            assert await ex.queue_resume("missing") == 0
            assert await ex.queue_get("missing") is None

            # in a rolled-back transaction: no change, no notification
            with pytest.raises(RuntimeError):
                async with driver.transaction() as tx:
                    assert await tx.queue_pause("q3") == 1
                    raise RuntimeError
            q3 = await ex.queue_get("q3")
            assert q3 is not None and q3.paused_at is None
            await expect_nothing_more(driver, listener)


async def test_completion_without_rows(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        a, b = await running(driver, params(1), params(2))
        ex = driver.executor()
        results = await ex.job_set_state_if_running_many(
            [
                JobCompletion(id=b.id, attempt=1, state=S.COMPLETED, finalized_at=ms(now())),
                JobCompletion(id=a.id, attempt=7, state=S.COMPLETED, finalized_at=ms(now())),
                JobCompletion(id=10**12, attempt=1, state=S.COMPLETED, finalized_at=ms(now())),
            ],
            client_id=CLIENT,
            return_rows=False,
        )
        # only what was not applied (a's guard failed; the missing id is left out)
        assert [(r.id, r.applied, r.job) for r in results] == [(a.id, False, None)]
        got = await ex.job_get_by_id(b.id)
        assert got is not None and got.state is S.COMPLETED
