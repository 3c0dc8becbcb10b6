"""Claimed rows the client cannot decode, as River Go handles them: the attempt fails without
the worker running, the error handler sees it, the client's retry policy (or the attempts
running out) decides what follows, and the undecodable value stays as it was. Attempt errors
in shapes River doesn't write decode leniently and are never rewritten by a client that only
reads them.

Every test runs on asyncio and trio; the SQLite ones replace a JSON column with text that is
not JSON, which only SQLite can hold.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

import attrs
import pytest

import river_anyio as river

from .conftest import FixedClock, events_for, get_row, running
from .conftest import stored as as_stored

pytestmark = pytest.mark.anyio

S = river.JobState
K = river.EventKind
UNDECODABLE = "job row couldn't be decoded: "


@attrs.frozen
class Task:
    kind: ClassVar[str] = "undecodable_task"
    n: int = 0


def _sql(run: river.ClientRun, text: str) -> str:
    """``text`` with ``?`` placeholders, in the driver's own placeholder style."""
    return text.replace("?", "%s") if run.client.driver.dialect == "postgres" else text


async def _insert_and_set(
    run: river.ClientRun, assignments: list[tuple[Task, river.InsertOpts | None, str, str]]
) -> list[int]:
    """Insert each job and set one column's stored value in the same transaction, so the
    client never sees the job as it was inserted. ``(args, opts, column, value)``; an empty
    column leaves the job alone."""
    ids = []
    async with run.client.driver.transaction() as tx:
        for args, opts, column, value in assignments:
            res = await run.client.insert_tx(tx, args, opts)
            if column:
                sql = _sql(run, f"UPDATE river_job SET {column} = ? WHERE id = ?")
                await tx.execute(sql, (value, res.job.id))
            ids.append(res.job.id)
    return ids


async def _stored(run: river.ClientRun, job_id: int, column: str) -> Any:
    """A column's value as stored, as text (``typeof`` too on SQLite)."""
    ex = run.client.driver.executor()
    if run.client.driver.dialect == "postgres":
        rows = await ex.fetch_all(f"SELECT {column}::text FROM river_job WHERE id = %s", (job_id,))
        return rows[0][0]
    rows = await ex.fetch_all(
        f"SELECT CASE WHEN typeof({column}) = 'text' THEN {column} ELSE json({column}) END, "
        f"typeof({column}) FROM river_job WHERE id = ?",
        (job_id,),
    )
    return tuple(rows[0])


def _recorder() -> tuple[river.Workers, list[int]]:
    workers = river.Workers()
    ran: list[int] = []

    @workers.register(Task)
    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> None:
        ran.append(job.id)

    return workers, ran


class _Handler:
    def __init__(self, cancel: bool = False) -> None:
        self.cancel = cancel
        self.calls: list[tuple[int, str]] = []

    @attrs.frozen
    class Cancel:
        set_cancelled: bool = True

    def handle_error(self, job: river.JobRow, exc: BaseException) -> Any:
        self.calls.append((job.id, str(exc)))
        return self.Cancel() if self.cancel else None


class _Retry:
    """Retries every failed attempt an hour later (the client's retry policy)."""

    def next_retry(self, job: river.JobRow, now: dt.datetime) -> dt.datetime:
        return now + dt.timedelta(hours=1)


async def test_metadata_that_is_not_an_object_fails_the_attempt_unworked(
    database_url: str, clock: FixedClock
) -> None:
    workers, ran = _recorder()
    handler = _Handler()
    async with running(
        database_url, workers, clock=clock, error_handler=handler, retry_policy=_Retry()
    ) as run:
        with run.subscribe(K.JOB_COMPLETED, K.JOB_FAILED) as events:
            ordinary, retried, discarded = await _insert_and_set(
                run,
                [
                    (Task(n=1), None, "", ""),
                    (Task(n=2), None, "metadata", "[1]"),
                    (Task(n=3), river.InsertOpts(max_attempts=1), "metadata", "[1]"),
                ],
            )
            got = await events_for(events, [ordinary, retried, discarded])
        rows = {i: await get_row(run, i) for i in (ordinary, retried, discarded)}
        stored = [await _stored(run, i, "metadata") for i in (retried, discarded)]

    assert ran == [ordinary]
    assert got[ordinary].kind is K.JOB_COMPLETED
    assert got[retried].kind is K.JOB_FAILED and got[discarded].kind is K.JOB_FAILED
    assert sorted(i for i, _ in handler.calls) == sorted([retried, discarded])
    for _, message in handler.calls:
        assert message.startswith(UNDECODABLE + "error unmarshaling `metadata`"), message
    retry, discard = rows[retried], rows[discarded]
    assert (retry.state, retry.attempt) == (S.RETRYABLE, 1)
    assert retry.scheduled_at == as_stored(database_url, clock.at + dt.timedelta(hours=1))
    assert (discard.state, discard.attempt) == (S.DISCARDED, 1)
    assert discard.finalized_at is not None
    for row in (retry, discard):
        [error] = row.errors
        assert error.error.startswith(UNDECODABLE) and error.attempt == 1
        assert isinstance(row, river.JobRow) and row.metadata == {}
    # the value it couldn't decode is left as it was
    if run.client.driver.dialect == "postgres":
        assert stored == ["[1]", "[1]"]
    else:
        assert stored == [("[1]", "text"), ("[1]", "text")]


async def test_the_error_handler_decides_for_an_undecodable_row(
    database_url: str, clock: FixedClock
) -> None:
    workers, ran = _recorder()
    handler = _Handler(cancel=True)
    async with running(database_url, workers, clock=clock, error_handler=handler) as run:
        with run.subscribe(K.JOB_CANCELLED, K.JOB_COMPLETED) as events:
            handled, after = await _insert_and_set(
                run, [(Task(n=1), None, "metadata", "[1]"), (Task(n=2), None, "", "")]
            )
            got = await events_for(events, [handled, after])
        row = await get_row(run, handled)

    assert ran == [after]
    assert got[handled].kind is K.JOB_CANCELLED
    assert [i for i, _ in handler.calls] == [handled]
    assert (row.state, row.attempt) == (S.CANCELLED, 1)
    assert row.errors[-1].error.startswith(UNDECODABLE)


#: Attempt errors in shapes River doesn't write, and how River Go reads them.
_ODD_ERRORS = [
    '{"at": "2024-01-02 03:04:05+00", "attempt": "1", "error": {"message": "boom"}, '
    '"trace": ["frame"]}',
    "42",
]
_ODD_DECODED = [
    ("0001-01-01T00:00:00+00:00", 1, '{"message":"boom"}', '["frame"]'),
    ("0001-01-01T00:00:00+00:00", 0, "42", ""),
]


async def test_odd_attempt_errors_decode_leniently_and_are_not_rewritten(
    database_url: str, clock: FixedClock
) -> None:
    workers, ran = _recorder()
    async with running(database_url, workers, clock=clock) as run:
        postgres = run.client.driver.dialect == "postgres"
        value: Any = _ODD_ERRORS if postgres else "[" + ",".join(_ODD_ERRORS) + "]"
        cast = "?::text[]::jsonb[]" if postgres else "jsonb(?)"
        with run.subscribe(K.JOB_COMPLETED) as events:
            async with run.client.driver.transaction() as tx:
                res = await run.client.insert_tx(tx, Task(n=1))
                await tx.execute(
                    _sql(run, f"UPDATE river_job SET errors = {cast} WHERE id = ?"),
                    (value, res.job.id),
                )
            before = await _stored(run, res.job.id, "errors")
            await events_for(events, [res.job.id])
        row = await get_row(run, res.job.id)
        after = await _stored(run, res.job.id, "errors")

    assert ran == [res.job.id]
    assert (row.state, row.attempt) == (S.COMPLETED, 1)
    assert [(e.at.isoformat(), e.attempt, e.error, e.trace) for e in row.errors] == _ODD_DECODED
    assert after == before


@pytest.mark.parametrize("column", ["args", "attempted_by", "errors", "metadata", "tags"])
async def test_sqlite_json_column_that_is_not_json(
    sqlite_url: str, clock: FixedClock, column: str
) -> None:
    workers, ran = _recorder()
    handler = _Handler()
    async with running(sqlite_url, workers, clock=clock, error_handler=handler) as run:
        with run.subscribe(K.JOB_COMPLETED, K.JOB_FAILED) as events:
            invalid, ordinary = await _insert_and_set(
                run, [(Task(n=1), None, column, "not json"), (Task(n=2), None, "", "")]
            )
            got = await events_for(events, [invalid, ordinary])
        row = await get_row(run, invalid)
        stored = await _stored(run, invalid, column)
        listed = await run.client.jobs.list(ids=[invalid])

    assert ran == [ordinary]
    assert got[invalid].kind is K.JOB_FAILED
    assert [i for i, _ in handler.calls] == [invalid]
    assert handler.calls[0][1].startswith(UNDECODABLE + f"error unmarshaling `{column}`: ")
    assert (row.state, row.attempt) == (S.AVAILABLE, 1)
    assert row.errors[-1].error.startswith(UNDECODABLE)
    assert [j.id for j in listed.jobs] == [invalid]
    if column == "errors":  # wrapped in an array, as a string, for the error to be appended
        assert [e.error for e in row.errors[:-1]] == ["not json"]
        assert stored[1] == "blob"
    else:
        assert stored == ("not json", "text")
