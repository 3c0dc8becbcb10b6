"""Conformance of the driver operations behind the client's job and queue APIs (River's
JobList with filters, order and cursor; JobRetry; JobDelete; JobDeleteMany; JobUpdate;
QueueUpdate), run against every driver on both loops, through the public protocol only."""

from __future__ import annotations

import datetime as dt
import functools
import json
from typing import Any

import pytest

import river_anyio as river
from river_anyio.drivers import (
    Driver,
    Executor,
    JobCompletion,
    JobInsertParams,
    JobListQuery,
)

from .support import open_driver
from .support import params as _params

pytestmark = pytest.mark.anyio
UTC = dt.UTC
S = river.JobState
params = functools.partial(_params, kind="api")
CLIENT = "client-a"


def now() -> dt.datetime:
    return dt.datetime.now(UTC)


async def insert(driver: Driver, *ps: JobInsertParams) -> list[river.JobRow]:
    async with driver.transaction() as tx:
        rows = await tx.job_insert_fast_many(list(ps))
    return [r.job for r in rows]


async def claim(ex: Executor, queue: str = "default", n: int = 100) -> list[river.JobRow]:
    return await ex.job_get_available(queue=queue, max_to_lock=n, client_id=CLIENT)


async def finish(ex: Executor, job: river.JobRow, state: river.JobState) -> river.JobRow:
    at = now()
    (res,) = await ex.job_set_state_if_running_many(
        [JobCompletion(id=job.id, attempt=job.attempt, state=state, finalized_at=at)],
        client_id=CLIENT,
    )
    assert res.applied and res.job is not None
    return res.job


def ids(jobs: list[river.JobRow]) -> list[int]:
    return [j.id for j in jobs]


def user_meta(job: river.JobRow) -> dict[str, Any]:
    return {k: v for k, v in job.metadata.items() if not k.startswith("river:")}


# ---------------------------------------------------------------------------------------------
# listing


async def test_list_filters(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        a, b, c, d = await insert(
            driver,
            params(0, kind="k1", priority=1, queue="q1", tags=("red", "blue")),
            params(1, kind="k2", priority=2, queue="q1", tags=("red",)),
            params(2, kind="k2", priority=3, queue="q2", tags=()),
            params(3, kind="k3", priority=1, queue="q2", state=S.SCHEDULED, tags=("blue",)),
        )
        ex = driver.executor()

        async def listed(**kw: Any) -> list[int]:
            return ids(await ex.job_list_query(JobListQuery(**kw)))

        assert await listed() == [a.id, b.id, c.id, d.id]
        assert await listed(ids=(d.id, b.id)) == [b.id, d.id]
        assert await listed(kinds=("k2",)) == [b.id, c.id]
        assert await listed(priorities=(1,)) == [a.id, d.id]
        assert await listed(queues=("q2",)) == [c.id, d.id]
        assert await listed(states=(S.SCHEDULED,)) == [d.id]
        assert await listed(tags_all=("red", "blue")) == [a.id]
        assert await listed(tags_all=("red",)) == [a.id, b.id]
        assert await listed(tags_any=("blue", "green")) == [a.id, d.id]
        assert await listed(tags_any=("green",)) == []
        assert await listed(kinds=("k2",), queues=("q1",), tags_any=("red",)) == [b.id]
        assert await listed(limit=2) == [a.id, b.id]
        assert await listed(descending=True, limit=3) == [d.id, c.id, b.id]
        assert await listed(after_id=b.id) == [c.id, d.id]
        assert await listed(after_id=c.id, descending=True) == [b.id, a.id]


async def test_list_metadata_containment(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        a, _b = await insert(
            driver,
            params(0, metadata=b'{"team": "x", "n": {"deep": 1}}'),
            params(1, metadata=b'{"team": "y"}'),
        )
        query = JobListQuery(metadata=b'{"n": {"deep": 1}}')
        if driver.dialect == "postgres":
            assert ids(await driver.executor().job_list_query(query)) == [a.id]
        else:
            with pytest.raises(river.ValidationError, match="PostgreSQL only"):
                await driver.executor().job_list_query(query)


async def test_list_by_time_pages_through_ties(database_url: str) -> None:
    """Ordered by a time column with ties; the cursor (id, time) resumes exactly."""
    t0 = (now() - dt.timedelta(hours=1)).replace(microsecond=250000)
    times = [t0 + dt.timedelta(seconds=s) for s in (2, 0, 1, 1, 0, 2, 1)]
    async with open_driver(database_url) as driver:
        jobs = await insert(
            driver, *(params(i, scheduled_at=t, state=S.SCHEDULED) for i, t in enumerate(times))
        )
        ex = driver.executor()
        for descending in (False, True):
            expected = sorted(jobs, key=lambda j: (j.scheduled_at, j.id), reverse=descending)
            got: list[river.JobRow] = []
            after: river.JobRow | None = None
            while True:
                page = await ex.job_list_query(
                    JobListQuery(
                        order_by="scheduled_at",
                        descending=descending,
                        limit=2,
                        after_id=None if after is None else after.id,
                        after_time=None if after is None else after.scheduled_at,
                    )
                )
                if not page:
                    break
                got.extend(page)
                after = page[-1]
            assert ids(got) == ids(expected)


async def test_list_by_nullable_time(database_url: str) -> None:
    """``finalized_at`` of non-final rows is NULL: NULLs come last ascending, first
    descending, and a cursor on a NULL-time row resumes among the NULLs by id."""
    async with open_driver(database_url) as driver:
        jobs = await insert(driver, *(params(i) for i in range(4)))
        ex = driver.executor()
        running = await claim(ex, n=2)
        done = [
            await finish(ex, running[0], S.COMPLETED),
            await finish(ex, running[1], S.CANCELLED),
        ]
        pending = [j for j in jobs if j.id not in ids(done)]

        def query(**kw: Any) -> JobListQuery:
            return JobListQuery(order_by="finalized_at", time_nullable=True, limit=100, **kw)

        asc = ids(await ex.job_list_query(query()))
        assert asc == ids(sorted(done, key=lambda j: (j.finalized_at, j.id))) + ids(pending)
        desc = ids(await ex.job_list_query(query(descending=True)))
        assert (
            desc
            == ids(pending)[::-1] + ids(sorted(done, key=lambda j: (j.finalized_at, j.id)))[::-1]
        )
        # resume after each row in turn
        for order, listed in ((False, asc), (True, desc)):
            by_id = {j.id: j for j in [*done, *pending]}
            for i, job_id in enumerate(listed):
                row = by_id[job_id]
                rest = await ex.job_list_query(
                    query(descending=order, after_id=row.id, after_time=row.finalized_at)
                )
                assert ids(rest) == listed[i + 1 :], (order, i)


# ---------------------------------------------------------------------------------------------
# retry, delete, update


async def test_job_retry(database_url: str) -> None:
    past = now() - dt.timedelta(minutes=5)
    future = now() + dt.timedelta(hours=1)
    async with open_driver(database_url) as driver:
        due, waiting, scheduled, _to_run, _to_finish, used_up = await insert(
            driver,
            params(0, scheduled_at=past),
            params(1, scheduled_at=future),
            params(2, state=S.SCHEDULED, scheduled_at=future),
            params(3, queue="run"),
            params(4, queue="fin"),
            params(5, queue="used", max_attempts=1),
        )
        ex = driver.executor()
        assert await ex.job_retry(10**9) is None
        # available and due: untouched
        assert await ex.job_retry(due.id) == due
        # available in the future, or scheduled: available now
        before = now() - dt.timedelta(seconds=5)
        for job in (waiting, scheduled):
            got = await ex.job_retry(job.id)
            assert got is not None and got.state is S.AVAILABLE
            assert before <= got.scheduled_at <= now() + dt.timedelta(seconds=5)
            assert got.max_attempts == job.max_attempts
        # running: untouched
        (running,) = await claim(ex, "run")
        assert await ex.job_retry(running.id) == running
        # finalized, with a cancel request recorded: available, finalized_at cleared, the
        # request dropped, errors and attempt kept
        (fin,) = await claim(ex, "fin")
        await ex.job_cancel(job_id=fin.id, cancel_attempted_at=now(), notify=False)
        cancelled = await finish(ex, fin, S.CANCELLED)
        assert "cancel_attempted_at" in cancelled.metadata and cancelled.finalized_at is not None
        got = await ex.job_retry(fin.id)
        assert got is not None
        assert got.state is S.AVAILABLE and got.finalized_at is None
        assert "cancel_attempted_at" not in got.metadata
        assert got.attempt == 1 and got.max_attempts == 25
        # every attempt used: one more allowed
        (used,) = await claim(ex, "used")
        await finish(ex, used, S.DISCARDED)
        got = await ex.job_retry(used_up.id)
        assert got is not None and got.state is S.AVAILABLE
        assert (got.attempt, got.max_attempts) == (1, 2)


async def test_job_delete(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        a, b = await insert(driver, params(0), params(1, queue="run"))
        ex = driver.executor()
        assert await ex.job_delete(10**9) is None
        deleted = await ex.job_delete(a.id)
        assert deleted == a
        assert await ex.job_get_by_id(a.id) is None
        (running,) = await claim(ex, "run")
        got = await ex.job_delete(b.id)
        assert got is not None and got.state is S.RUNNING
        assert await ex.job_get_by_id(b.id) == running


async def test_job_delete_many(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        jobs = await insert(
            driver,
            *(params(i, kind="del") for i in range(5)),
            params(9, kind="keep"),
            params(10, kind="del", queue="run"),
        )
        ex = driver.executor()
        (running,) = await claim(ex, "run")
        first = await ex.job_delete_many(JobListQuery(kinds=("del",), limit=2))
        assert ids(first) == ids(jobs[:2])
        rest = await ex.job_delete_many(JobListQuery(kinds=("del",)))
        assert ids(rest) == ids(jobs[2:5])  # never the running one
        left = await ex.job_list_query(JobListQuery())
        assert ids(left) == [jobs[5].id, running.id]
        assert await ex.job_delete_many(JobListQuery(states=(S.RUNNING,))) == []
        # inside a transaction that rolls back, nothing is deleted
        with pytest.raises(RuntimeError, match="undo"):
            async with driver.transaction() as tx:
                assert ids(await tx.job_delete_many(JobListQuery(kinds=("keep",)))) == [jobs[5].id]
                raise RuntimeError("undo")
        assert await ex.job_get_by_id(jobs[5].id) is not None


async def test_job_update_metadata(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        (job,) = await insert(driver, params(0, metadata=b'{"a": 1, "b": {"x": 1}}'))
        ex = driver.executor()
        assert await ex.job_update_metadata(10**9, b'{"a": 2}') is None
        got = await ex.job_update_metadata(job.id, b'{"b": {"y": 2}, "output": [1, "two"]}')
        assert got is not None
        assert user_meta(got) == {"a": 1, "b": {"y": 2}, "output": [1, "two"]}
        assert got.state is job.state and got.args == job.args


# ---------------------------------------------------------------------------------------------
# queues


async def test_queue_update(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        ex = driver.executor()
        assert await ex.queue_update("nope", metadata=b"{}") is None
        created = await ex.queue_create_or_set_updated_at(name="q", metadata=b'{"old": true}')
        updated = await ex.queue_update("q", metadata=b'{"new": 1}')
        assert updated is not None
        assert updated.metadata == {"new": 1}
        assert updated.updated_at >= created.updated_at
        kept = await ex.queue_update("q")
        assert kept is not None and kept.metadata == {"new": 1}
        assert json.dumps(kept.metadata) == '{"new": 1}'


async def test_list_cursor_on_database_written_times(database_url: str) -> None:
    """Times the database wrote itself (SQLite's millisecond texts) compare as instants with
    a cursor's time: jobs inserted in one statement share a ``scheduled_at`` and page by id."""
    async with open_driver(database_url) as driver:
        jobs = await insert(driver, *(params(i) for i in range(5)))
        assert len({j.scheduled_at for j in jobs}) == 1
        ex = driver.executor()
        got: list[river.JobRow] = []
        after: river.JobRow | None = None
        while page := await ex.job_list_query(
            JobListQuery(
                order_by="scheduled_at",
                limit=2,
                after_id=None if after is None else after.id,
                after_time=None if after is None else after.scheduled_at,
            )
        ):
            got.extend(page)
            after = page[-1]
        assert ids(got) == ids(jobs)
