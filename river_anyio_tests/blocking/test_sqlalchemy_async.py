"""The async client's ``insert_tx``/``insert_many_tx``/``insert_many_fast_tx`` inside an
SQLAlchemy ``AsyncConnection``/``AsyncSession`` transaction on ``postgresql+psycopg``.

SQLAlchemy's asyncio layer runs on asyncio only: these run under asyncio, and under trio the
client says so. Committed: a running client picks the jobs up through the insert
notification (its poll interval is far beyond the test's patience). Rolled back: nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import anyio
import attrs
import pytest

import river_anyio as river

from ..runtime.conftest import WAIT, running

pytest.importorskip("greenlet")
sa_asyncio = pytest.importorskip("sqlalchemy.ext.asyncio")

pytestmark = pytest.mark.anyio

POLL = 60.0


@attrs.frozen
class Ping:
    kind: ClassVar[str] = "blk_sa_ping"
    tag: str = ""


def sa_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def recording_workers(expected: int) -> tuple[river.Workers, list[str], anyio.Event]:
    seen: list[str] = []
    done = anyio.Event()

    async def work(ctx: river.WorkContext, job: river.Job[Ping]) -> None:
        seen.append(job.args.tag)
        if len(seen) == expected:
            done.set()

    workers = river.Workers()
    workers.add(Ping, work)
    return workers, seen, done


@pytest.fixture
async def engine(pg_url: str) -> AsyncIterator[Any]:
    eng = sa_asyncio.create_async_engine(sa_url(pg_url))
    yield eng
    await eng.dispose()


async def insert_all(client: river.Client, tx: Any, prefix: str) -> None:
    await client.insert_tx(tx, Ping(tag=f"{prefix}-one"))
    await client.insert_many_tx(tx, [Ping(tag=f"{prefix}-many")])
    assert await client.insert_many_fast_tx(tx, [Ping(tag=f"{prefix}-fast")]) == 1


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("form", ["connection", "session"])
async def test_committed_inserts_are_picked_up_rolled_back_ones_never(
    pg_url: str, engine: Any, form: str
) -> None:
    workers, seen, done = recording_workers(3)
    open_tx: Callable[[], Any] = (
        engine.connect if form == "connection" else lambda: sa_asyncio.AsyncSession(engine)
    )
    async with running(pg_url, workers, fetch_poll_interval=POLL) as run:
        client = run.client
        async with open_tx() as tx:
            await insert_all(client, tx, "undone")
            assert tx.in_transaction()  # begun for the inserts, as SQLAlchemy's execute() does
            await tx.rollback()
        async with open_tx() as tx:
            await insert_all(client, tx, "kept")
            await tx.commit()
        with anyio.fail_after(WAIT):
            await done.wait()
        rows = await client.jobs.list()
    assert sorted(seen) == ["kept-fast", "kept-many", "kept-one"]
    assert sorted(r.args["tag"] for r in rows.jobs) == sorted(seen)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_callers_open_transaction_is_used(pg_url: str, engine: Any) -> None:
    """Inside ``begin()``: the job commits or rolls back with the caller's own row."""
    from sqlalchemy import text

    workers, _, _ = recording_workers(1)
    async with running(pg_url, workers, queues={}, fetch_poll_interval=POLL) as run:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE orders (id int)"))
        with pytest.raises(RuntimeError, match="undo"):
            async with engine.begin() as conn:
                await conn.execute(text("INSERT INTO orders VALUES (1)"))
                await run.client.insert_tx(conn, Ping(tag="undone"))
                raise RuntimeError("undo")
        async with sa_asyncio.AsyncSession(engine) as session, session.begin():
            await session.execute(text("INSERT INTO orders VALUES (2)"))
            await run.client.insert_tx(session, Ping(tag="kept"))
        async with engine.connect() as conn:
            orders = (await conn.execute(text("SELECT id FROM orders"))).scalars().all()
        rows = (await run.client.jobs.list()).jobs
    assert orders == [2]
    assert [r.args["tag"] for r in rows] == ["kept"]


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_under_trio_the_error_says_asyncio_only(pg_url: str) -> None:
    engine = sa_asyncio.create_async_engine(sa_url(pg_url))  # connects on first use only
    async with river.open_client(pg_url) as run:
        for tx in (sa_asyncio.AsyncSession(engine), engine.connect()):
            with pytest.raises(TypeError, match="only under asyncio"):
                await run.client.insert_tx(tx, Ping())
            with pytest.raises(TypeError, match="only under asyncio"):
                await run.client.insert_many_fast_tx(tx, [Ping()])
        assert (await run.client.jobs.list()).jobs == []
