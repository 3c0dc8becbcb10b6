"""The job API (``client.jobs``) on PostgreSQL and SQLite, under asyncio and trio: each call on
the client's pool and inside a caller's transaction (seen inside it, undone with it), bad input,
and River's list ordering and cursors."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import ClassVar

import anyio
import attrs
import pytest

import river_anyio as river

from .support import Undo, client_on

pytestmark = pytest.mark.anyio
S = river.JobState
UTC = dt.UTC


@attrs.frozen
class Task:
    kind: ClassVar[str] = "api_task"
    n: int = 0


@attrs.frozen
class Other:
    kind: ClassVar[str] = "api_other"
    n: int = 0


async def insert(client: river.Client, *args: object, **opts: object) -> list[river.JobRow]:
    o = river.InsertOpts(**opts) if opts else None  # type: ignore[arg-type]
    return [(await client.insert(a, o)).job for a in args]


async def claim(client: river.Client, queue: str = "default") -> river.JobRow:
    (row,) = await client.driver.executor().job_get_available(
        queue=queue, max_to_lock=1, client_id=client.id
    )
    return row


def ids(jobs: list[river.JobRow]) -> list[int]:
    return [j.id for j in jobs]


# --- get ---------------------------------------------------------------------------------------


async def test_get_and_get_tx(database_url: str) -> None:
    async with river.open_client(database_url) as run:
        client = run.client
        (job,) = await insert(client, Task(1))
        assert await client.jobs.get(job.id) == job
        with pytest.raises(river.NotFoundError):
            await client.jobs.get(job.id + 1000)
        with pytest.raises(river.ValidationError, match="job_id"):
            await client.jobs.get("1")  # type: ignore[arg-type]
        with pytest.raises(Undo):
            async with client.transaction() as tx:
                inner = (await client.insert_tx(tx, Task(2))).job
                assert await client.jobs.get_tx(tx, inner.id) == inner
                raise Undo
        with pytest.raises(river.NotFoundError):
            await client.jobs.get(inner.id)


async def test_works_on_a_client_built_on_a_driver(database_url: str) -> None:
    async with client_on(database_url) as client:
        (job,) = await insert(client, Task(1))
        assert (await client.jobs.get(job.id)).args == {"n": 1}
        assert ids((await client.jobs.list()).jobs) == [job.id]
        assert (await client.jobs.cancel(job.id)).state is S.CANCELLED


# --- list --------------------------------------------------------------------------------------


async def test_list_filters(database_url: str) -> None:
    async with client_on(database_url) as client:
        a, b = await insert(client, Task(1), Task(2), tags=["red", "blue"], priority=2)
        (c,) = await insert(client, Other(3), queue="q2", tags=["red"])
        (d,) = await insert(client, Other(4), pending=True)
        jobs = client.jobs

        async def listed(**kw: object) -> list[int]:
            return ids((await jobs.list(**kw)).jobs)  # type: ignore[arg-type]

        assert await listed() == [a.id, b.id, c.id, d.id]
        assert await listed(ids=[c.id, a.id]) == [a.id, c.id]
        assert await listed(kinds=["api_other"]) == [c.id, d.id]
        assert await listed(queues=["q2"]) == [c.id]
        assert await listed(priorities=[2]) == [a.id, b.id]
        assert await listed(states=["pending"]) == [d.id]
        assert await listed(states=[S.AVAILABLE, S.PENDING], kinds=["api_other"]) == [c.id, d.id]
        assert await listed(tags_all=["red", "blue"]) == [a.id, b.id]
        assert await listed(tags_any=["red"]) == [a.id, b.id, c.id]
        assert await listed(order="desc", limit=2) == [d.id, c.id]


async def test_list_metadata_containment(database_url: str) -> None:
    async with client_on(database_url) as client:
        (a,) = await insert(client, Task(1), metadata={"team": {"name": "x"}})
        await insert(client, Task(2), metadata={"team": {"name": "y"}})
        if client.driver.dialect == "postgres":
            res = await client.jobs.list(metadata={"team": {"name": "x"}})
            assert ids(res.jobs) == [a.id]
            res = await client.jobs.list(metadata='{"team": {}}')
            assert len(res.jobs) == 2
        else:
            with pytest.raises(river.ValidationError, match="PostgreSQL only"):
                await client.jobs.list(metadata={"team": {"name": "x"}})


async def test_list_pages_through_with_cursors(database_url: str) -> None:
    """More jobs than a page, walked with ``last_cursor`` (object and text) in every order."""
    async with client_on(database_url) as client:
        base = dt.datetime(2030, 1, 1, tzinfo=UTC)
        jobs = [
            (
                await client.insert(
                    Task(i), river.InsertOpts(scheduled_at=base + dt.timedelta(seconds=i % 4))
                )
            ).job
            for i in range(23)
        ]
        for order_by, order, key in (
            ("id", "asc", lambda j: j.id),
            ("id", "desc", lambda j: -j.id),
            ("time", "asc", lambda j: (j.scheduled_at, j.id)),
            ("scheduled_at", "desc", lambda j: (-j.scheduled_at.timestamp(), -j.id)),
        ):
            expected = ids(sorted(jobs, key=key))  # type: ignore[arg-type]
            got: list[int] = []
            after: river.JobListCursor | str | None = None
            pages = 0
            while True:
                res = await client.jobs.list(
                    order_by=order_by,  # type: ignore[arg-type]
                    order=order,  # type: ignore[arg-type]
                    states=[S.SCHEDULED],
                    limit=5,
                    after=after,
                )
                if not res.jobs:
                    assert res.last_cursor is None
                    break
                pages += 1
                got.extend(ids(res.jobs))
                assert res.last_cursor is not None
                assert res.last_cursor.id == res.jobs[-1].id
                # alternate between the cursor object and River's text form
                after = res.last_cursor if pages % 2 else str(res.last_cursor)
            assert got == expected, (order_by, order)
            assert pages == 5


async def test_list_after_a_job_row_and_finalized_order(database_url: str) -> None:
    async with client_on(database_url) as client:
        jobs = await insert(client, *(Task(i) for i in range(4)))
        for j in jobs[:3]:
            await client.jobs.cancel(j.id)
        # finalized_at ordering defaults to the final states
        res = await client.jobs.list(order_by="finalized_at")
        finals = [await client.jobs.get(j.id) for j in jobs[:3]]
        expected = ids(sorted(finals, key=lambda j: (j.finalized_at, j.id)))
        assert ids(res.jobs) == expected
        assert res.last_cursor is not None and res.last_cursor.time is not None
        first = next(j for j in finals if j.id == expected[0])
        rest = await client.jobs.list(order_by="finalized_at", after=first)
        assert ids(rest.jobs) == expected[1:]
        # after a row, by id
        assert ids((await client.jobs.list(after=jobs[1])).jobs) == ids(jobs[2:])


async def test_list_bad_input(database_url: str) -> None:
    async with client_on(database_url) as client:
        jobs = client.jobs
        bad: list[tuple[dict[str, object], str]] = [
            ({"states": ["nope"]}, "states"),
            ({"kinds": []}, "kinds"),
            ({"kinds": "api_task"}, "kinds"),
            ({"ids": ["1"]}, "ids"),
            ({"limit": 0}, "limit"),
            ({"limit": 10_001}, "limit"),
            ({"order_by": "kind"}, "order_by"),
            ({"order": "up"}, "order"),
            ({"order_by": "finalized_at", "states": ["available"]}, "order_by"),
            ({"after": "not a cursor!"}, "after"),
            ({"after": 5}, "after"),
        ]
        for kw, field in bad:
            with pytest.raises(river.ValidationError) as info:
                await jobs.list(**kw)  # type: ignore[arg-type]
            assert info.value.field == field, kw


def test_cursor_text_is_rivers() -> None:
    at = dt.datetime(2030, 1, 2, 3, 4, 5, 120000, tzinfo=UTC)
    cursor = river.JobListCursor(id=7, kind="k", queue="q", sort_field="time", time=at)
    doc = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    assert doc == {
        "id": 7,
        "kind": "k",
        "queue": "q",
        "sort_field": "time",
        "time": "2030-01-02T03:04:05.12Z",
    }
    assert river.JobListCursor.decode(str(cursor)) == cursor
    plain = river.JobListCursor(id=1, kind="k", queue="q", sort_field="id")
    text = plain.encode()
    assert json.loads(base64.urlsafe_b64decode(text))["time"] == "0001-01-01T00:00:00Z"
    assert river.JobListCursor.decode(text) == plain


def test_cursor_text_escapes_like_go() -> None:
    """River Go's cursor for a kind with characters its JSON encoder escapes (``<``, ``>``,
    ``&``, U+2028), byte for byte: both write the same text for the same page."""
    kind = "conformance_cursor<>&~~~\u2028é"
    cursor = river.JobListCursor(id=4, kind=kind, queue="default", sort_field="id")
    raw = base64.urlsafe_b64decode(cursor.encode())
    assert raw == (
        b'{"id":4,"kind":"conformance_cursor\\u003c\\u003e\\u0026~~~\\u2028\xc3\xa9",'
        b'"queue":"default","sort_field":"id","time":"0001-01-01T00:00:00Z"}'
    )
    # the text River Go's JobListCursor.MarshalText wrote for this kind's first page
    go = (
        "eyJpZCI6NCwia2luZCI6ImNvbmZvcm1hbmNlX2N1cnNvclx1MDAzY1x1MDAzZVx1MDAyNn5-fiIsInF1ZXVl"
        "IjoiZGVmYXVsdCIsInNvcnRfZmllbGQiOiJpZCIsInRpbWUiOiIwMDAxLTAxLTAxVDAwOjAwOjAwWiJ9"
    )
    first = river.JobListCursor(
        id=4, kind="conformance_cursor<>&~~~", queue="default", sort_field="id"
    )
    assert first.encode() == go
    assert river.JobListCursor.decode(go).kind == "conformance_cursor<>&~~~"
    assert river.JobListCursor.decode(cursor.encode()) == cursor


async def test_list_tx_sees_the_transaction(database_url: str) -> None:
    async with client_on(database_url) as client:
        with pytest.raises(Undo):
            async with client.transaction() as tx:
                job = (await client.insert_tx(tx, Task(1))).job
                res = await client.jobs.list_tx(tx, kinds=["api_task"])
                assert ids(res.jobs) == [job.id]
                raise Undo
        assert (await client.jobs.list()).jobs == []


# --- cancel, retry, delete, update -------------------------------------------------------------


async def test_cancel(database_url: str) -> None:
    async with client_on(database_url) as client:
        waiting, finished = await insert(client, Task(1), Task(2))
        got = await client.jobs.cancel(waiting.id)
        assert got.state is S.CANCELLED and got.finalized_at is not None
        assert "cancel_attempted_at" in got.metadata
        # a finalized job comes back unchanged
        assert await client.jobs.cancel(waiting.id) == got
        with pytest.raises(river.NotFoundError):
            await client.jobs.cancel(10**9)
        # a running job is only flagged (its worker is told)
        running = await claim(client)
        assert running.id == finished.id
        flagged = await client.jobs.cancel(running.id)
        assert flagged.state is S.RUNNING and "cancel_attempted_at" in flagged.metadata


async def test_cancel_tx_rolls_back(database_url: str) -> None:
    async with client_on(database_url) as client:
        (job,) = await insert(client, Task(1))
        with pytest.raises(Undo):
            async with client.transaction() as tx:
                assert (await client.jobs.cancel_tx(tx, job.id)).state is S.CANCELLED
                assert (await client.jobs.get_tx(tx, job.id)).state is S.CANCELLED
                raise Undo
        assert await client.jobs.get(job.id) == job
        async with client.transaction() as tx:
            await client.jobs.cancel_tx(tx, job.id)
        assert (await client.jobs.get(job.id)).state is S.CANCELLED


async def test_retry(database_url: str) -> None:
    async with client_on(database_url) as client:
        (job,) = await insert(client, Task(1), scheduled_at=dt.datetime(2040, 1, 1, tzinfo=UTC))
        assert job.state is S.SCHEDULED
        await client.jobs.cancel(job.id)
        with pytest.raises(Undo):
            async with client.transaction() as tx:
                got = await client.jobs.retry_tx(tx, job.id)
                assert got.state is S.AVAILABLE and got.finalized_at is None
                raise Undo
        assert (await client.jobs.get(job.id)).state is S.CANCELLED
        got = await client.jobs.retry(job.id)
        assert got.state is S.AVAILABLE and got.finalized_at is None
        assert got.scheduled_at < dt.datetime(2040, 1, 1, tzinfo=UTC)
        assert "cancel_attempted_at" not in got.metadata
        with pytest.raises(river.NotFoundError):
            await client.jobs.retry(10**9)


async def test_delete(database_url: str) -> None:
    async with client_on(database_url) as client:
        a, b = await insert(client, Task(1), Task(2))
        with pytest.raises(Undo):
            async with client.transaction() as tx:
                assert await client.jobs.delete_tx(tx, a.id) == a
                with pytest.raises(river.NotFoundError):
                    await client.jobs.get_tx(tx, a.id)
                raise Undo
        assert await client.jobs.get(a.id) == a
        assert await client.jobs.delete(a.id) == a
        with pytest.raises(river.NotFoundError):
            await client.jobs.delete(a.id)
        running = await claim(client)
        assert running.id == b.id
        with pytest.raises(river.JobRunningError):
            await client.jobs.delete(b.id)
        assert (await client.jobs.get(b.id)).state is S.RUNNING


async def test_delete_many(database_url: str) -> None:
    async with client_on(database_url) as client:
        tasks = await insert(client, *(Task(i) for i in range(5)))
        (other,) = await insert(client, Other(9), queue="q2")
        with pytest.raises(river.ValidationError, match="no filters"):
            await client.jobs.delete_many()
        with pytest.raises(river.ValidationError, match="unsafe_all"):
            await client.jobs.delete_many(kinds=["api_task"], unsafe_all=True)
        with pytest.raises(river.ValidationError, match="limit"):
            await client.jobs.delete_many(kinds=["api_task"], limit=0)
        assert ids(await client.jobs.delete_many(kinds=["api_task"], limit=2)) == ids(tasks[:2])
        with pytest.raises(Undo):
            async with client.transaction() as tx:
                gone = await client.jobs.delete_many_tx(tx, queues=["default"])
                assert ids(gone) == ids(tasks[2:])
                raise Undo
        assert ids((await client.jobs.list()).jobs) == [*ids(tasks[2:]), other.id]
        assert ids(await client.jobs.delete_many(unsafe_all=True)) == [*ids(tasks[2:]), other.id]


async def test_update(database_url: str) -> None:
    async with client_on(database_url) as client:
        (job,) = await insert(client, Task(1), metadata={"keep": 1})
        got = await client.jobs.update(job.id, output={"rows": 3}, metadata={"note": "x"})
        meta = {k: v for k, v in got.metadata.items() if not k.startswith("river:")}
        assert meta == {"keep": 1, "note": "x", "output": {"rows": 3}}
        with pytest.raises(Undo):
            async with client.transaction() as tx:
                inner = await client.jobs.update_tx(tx, job.id, output="changed")
                assert inner.metadata["output"] == "changed"
                raise Undo
        assert (await client.jobs.get(job.id)).metadata["output"] == {"rows": 3}
        assert await client.jobs.update(job.id) == got  # nothing to write: the row
        with pytest.raises(river.NotFoundError):
            await client.jobs.update(10**9, output=1)
        with pytest.raises(river.ValidationError, match="river:"):
            await client.jobs.update(job.id, metadata={"river:x": 1})
        with pytest.raises(river.ValidationError, match="JSON"):
            await client.jobs.update(job.id, output=object())
        too_big = "x" * (32 * 1024 * 1024)  # plus its quotes
        with pytest.raises(river.ValidationError, match=r"output is too large: 33554434 bytes"):
            await client.jobs.update(job.id, output=too_big)


@pytest.mark.parametrize("anyio_backend", ["asyncio"], indirect=True)
async def test_tx_variants_on_a_stock_psycopg_connection(pg_url: str, anyio_backend: str) -> None:
    """Under asyncio the ``*_tx`` calls also take the caller's own psycopg connection, and
    act inside its transaction."""
    import psycopg

    async with client_on(pg_url) as client:
        (job,) = await insert(client, Task(1))
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            async with conn.transaction(force_rollback=True):
                assert (await client.jobs.cancel_tx(conn, job.id)).state is S.CANCELLED
                assert ids((await client.jobs.list_tx(conn, states=["cancelled"])).jobs) == [job.id]
                ex = client.driver.executor_for(conn)
                await ex.queue_create_or_set_updated_at(name="q")
                assert (await client.queues.update_tx(conn, "q", metadata={"x": 1})).metadata == {
                    "x": 1
                }
            with pytest.raises(river.NotFoundError):
                await client.queues.get("q")
            assert (await client.jobs.get(job.id)).state is S.AVAILABLE
            async with conn.transaction():
                await client.jobs.delete_tx(conn, job.id)
        with pytest.raises(river.NotFoundError):
            await client.jobs.get(job.id)


# --- a cancel or retry that waits for another transaction's --------------------------------


@pytest.mark.parametrize("action", ["cancel", "retry"])
async def test_a_cancel_or_retry_that_lost_a_race_returns_the_committed_row(
    pg_url: str, action: str
) -> None:
    """PostgreSQL only (SQLite has one writer): a cancel (or a retry) that waited on the row
    lock of another transaction's returns the row as that transaction committed it, as River
    does, not the row as it was when the statement began (its snapshot)."""
    async with river.open_client(pg_url) as run:
        client = run.client
        later = dt.datetime.now(UTC) + dt.timedelta(hours=1)
        (job,) = await insert(client, Task(1), scheduled_at=later)
        if action == "retry":
            await client.jobs.cancel(job.id)
        lost: list[river.JobRow] = []

        async def loser() -> None:
            call = client.jobs.cancel if action == "cancel" else client.jobs.retry
            lost.append(await call(job.id))

        async with anyio.create_task_group() as tg:
            async with client.driver.transaction() as tx:
                won = await (client.jobs.cancel_tx if action == "cancel" else client.jobs.retry_tx)(
                    tx, job.id
                )
                tg.start_soon(loser)
                with anyio.fail_after(10):
                    while not await client.driver.executor().fetch_all(  # noqa: ASYNC110
                        # the server's lock table has no event: polled
                        "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND datname = current_database()"
                    ):
                        await anyio.sleep(0.01)
                assert not lost  # it waits for this transaction
        assert lost[0].state is won.state
        assert lost[0] == await client.jobs.get(job.id)
