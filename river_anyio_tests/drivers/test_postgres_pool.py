"""The AnyIO connection pool: reuse, limits, timeouts, health checks, cancellation."""

from __future__ import annotations

import anyio
import psycopg
import pytest
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from river_anyio import _errors
from river_anyio.drivers.postgres import AnyioConnection, Pool, PostgresExecutor, open_postgres

pytestmark = pytest.mark.anyio


async def _wait_until_active(url: str, pid: int, needle: str) -> None:
    async with await AnyioConnection.connect(url) as watcher:
        with anyio.fail_after(10):
            while True:
                cur = await watcher.execute(
                    "SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,)
                )
                row = await cur.fetchone()
                if row and row[0] == "active" and needle in row[1]:
                    return
                await anyio.sleep(0.01)


async def _count_sleepers(url: str) -> int:
    async with await AnyioConnection.connect(url) as watcher:
        cur = await watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
            " AND query LIKE 'SELECT pg_sleep%%'"
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def test_lifo_reuse_and_statistics(pg_url: str) -> None:
    async with Pool(pg_url, max_size=3) as pool:
        a = await pool.getconn()
        b = await pool.getconn()
        stats = pool.statistics()
        assert (stats.size, stats.in_use, stats.idle, stats.connects) == (2, 2, 0, 2)
        await pool.putconn(a)
        await pool.putconn(b)
        assert pool.statistics().idle == 2
        assert await pool.getconn() is b  # most recently returned first
        assert await pool.getconn() is a
        await pool.putconn(a)
        await pool.putconn(b)
        stats = pool.statistics()
        assert (stats.size, stats.idle, stats.in_use, stats.discarded, stats.waiting) == (
            2, 2, 0, 0, 0,
        )  # fmt: skip
        assert stats.max_size == 3


async def test_exhaustion_times_out(pg_url: str) -> None:
    async with Pool(pg_url, max_size=1, acquire_timeout=0.2) as pool:
        async with pool.connection():
            started = anyio.current_time()
            with pytest.raises(_errors.PoolTimeoutError) as info:
                await pool.getconn()
            assert 0.15 < anyio.current_time() - started < 5
            assert info.value.transient
        assert pool.statistics().waiting == 0
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT 1")
            assert await cur.fetchone() == (1,)


async def test_waiter_is_served_when_a_connection_returns(pg_url: str) -> None:
    async with Pool(pg_url, max_size=1, acquire_timeout=10) as pool:
        first = await pool.getconn()
        got: list[AnyioConnection] = []
        async with anyio.create_task_group() as tg:

            async def waiter() -> None:
                got.append(await pool.getconn())

            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert pool.statistics().waiting == 1
            await pool.putconn(first)
        assert got == [first]
        await pool.putconn(got[0])


async def test_cancelled_waiter_leaks_nothing(pg_url: str) -> None:
    async with Pool(pg_url, max_size=1, acquire_timeout=30) as pool:
        held = await pool.getconn()
        async with anyio.create_task_group() as tg:

            async def waiter(*, task_status: anyio.abc.TaskStatus[anyio.CancelScope]) -> None:
                with anyio.CancelScope() as scope:
                    task_status.started(scope)
                    await pool.getconn()
                    pytest.fail("the waiter should not get a connection")

            scope = await tg.start(waiter)
            await anyio.wait_all_tasks_blocked()
            assert pool.statistics().waiting == 1
            scope.cancel()
        stats = pool.statistics()
        assert (stats.waiting, stats.in_use) == (0, 1)
        await pool.putconn(held)
        # The slot came back: the connection can be taken again at once.
        again = await pool.getconn()
        assert again is held
        await pool.putconn(again)


async def test_cancelled_query_keeps_connection(pg_url: str) -> None:
    async with Pool(pg_url, max_size=1) as pool:
        async with pool.connection() as conn:
            pid = conn.info.backend_pid
        async with anyio.create_task_group() as tg:

            async def work(*, task_status: anyio.abc.TaskStatus[anyio.CancelScope]) -> None:
                with anyio.CancelScope() as scope:
                    task_status.started(scope)
                    async with pool.connection() as conn:
                        await conn.execute("SELECT pg_sleep(30)")

            scope = await tg.start(work)
            await _wait_until_active(pg_url, pid, "pg_sleep(30)")
            scope.cancel()
        assert await _count_sleepers(pg_url) == 0
        async with pool.connection() as conn:
            assert conn.info.backend_pid == pid
        assert pool.statistics().discarded == 0


async def test_cancelled_transaction_does_not_poison_pool(pg_url: str) -> None:
    async with open_postgres(pg_url, pool_max_size=1) as driver:
        async with driver.pool.connection() as conn:
            pid = conn.info.backend_pid
        await driver.executor().execute("CREATE TABLE tx_probe (id int)")
        async with anyio.create_task_group() as tg:

            async def work(*, task_status: anyio.abc.TaskStatus[anyio.CancelScope]) -> None:
                with anyio.CancelScope() as scope:
                    task_status.started(scope)
                    async with driver.transaction() as tx:
                        await tx.execute("INSERT INTO tx_probe VALUES (1)")
                        await tx.execute("SELECT pg_sleep(30)")

            scope = await tg.start(work)
            await _wait_until_active(pg_url, pid, "pg_sleep(30)")
            scope.cancel()
        assert await _count_sleepers(pg_url) == 0
        async with driver.transaction() as tx:
            await tx.execute("INSERT INTO tx_probe VALUES (2)")
            rows = await tx.fetch_all("SELECT txid_current_if_assigned() IS NOT NULL")
            assert rows == [(True,)]
        assert await driver.executor().fetch_all("SELECT array_agg(id) FROM tx_probe") == [([2],)]
        async with driver.pool.connection() as conn:
            assert conn.info.backend_pid == pid  # the same connection survived


async def test_open_transaction_is_rolled_back_on_return(pg_url: str) -> None:
    async with Pool(pg_url, max_size=1) as pool:
        async with pool.connection() as conn:
            await conn.execute("CREATE TABLE t (id int)")
        async with pool.connection() as conn:
            await conn.execute("BEGIN")
            await conn.execute("INSERT INTO t VALUES (1)")
            first = conn
        async with pool.connection() as conn:
            assert conn is first
            assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
            cur = await conn.execute("SELECT count(*) FROM t")
            assert await cur.fetchone() == (0,)
        async with pool.connection() as conn:
            await conn.execute("BEGIN")
            with pytest.raises(psycopg.errors.DivisionByZero):
                await conn.execute("SELECT 1/0")
            assert conn.pgconn.transaction_status == pq.TransactionStatus.INERROR
        async with pool.connection() as conn:
            assert conn is first
            assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
        assert pool.statistics().discarded == 0


async def test_unfinished_transaction_block_and_closed_connections_are_discarded(
    pg_url: str,
) -> None:
    async with Pool(pg_url, max_size=1) as pool:
        conn = await pool.getconn()
        tx = psycopg.AsyncTransaction(conn)
        await tx.__aenter__()  # a transaction block the caller never left
        await pool.putconn(conn)
        assert conn.closed
        conn2 = await pool.getconn()
        assert conn2 is not conn
        await conn2.close()
        await pool.putconn(conn2)
        stats = pool.statistics()
        assert (stats.discarded, stats.size) == (2, 0)
        async with pool.connection() as conn3:
            cur = await conn3.execute("SELECT 1")
            assert await cur.fetchone() == (1,)
        assert pool.statistics().connects == 3


async def test_connect_failure_releases_the_slot(pg_url: str) -> None:
    params = conninfo_to_dict(pg_url)
    params["port"] = "1"
    async with Pool(make_conninfo("", **params), max_size=1, connect_timeout=2) as pool:
        for _ in range(2):
            with pytest.raises(psycopg.OperationalError):
                await pool.getconn()
        stats = pool.statistics()
        assert (stats.in_use, stats.size, stats.connects) == (0, 0, 0)


async def test_closed_pool(pg_url: str) -> None:
    pool = Pool(pg_url, max_size=2)
    held = await pool.getconn()
    idle = await pool.getconn()
    await pool.putconn(idle)
    await pool.aclose()
    assert idle.closed
    assert not held.closed
    await pool.putconn(held)  # returned after close: closed, not kept
    assert held.pgconn.status == pq.ConnStatus.BAD
    with pytest.raises(psycopg.OperationalError):
        await pool.getconn()


async def test_stale_prepared_statement_recovers(pg_url: str) -> None:
    async with open_postgres(pg_url, pool_max_size=1, prepare_threshold=0) as driver:
        ex = driver.executor()
        await ex.execute("CREATE TABLE p4 (a int)")
        await ex.execute("INSERT INTO p4 VALUES (1)")
        for _ in range(3):
            assert await ex.fetch_all("SELECT * FROM p4") == [(1,)]
        async with await AnyioConnection.connect(pg_url) as other:
            await other.execute("ALTER TABLE p4 ADD COLUMN b int DEFAULT 2")
        # The cached plan is stale; the executor deallocates and retries.
        assert await ex.fetch_all("SELECT * FROM p4") == [(1, 2)]
        assert await ex.fetch_all("SELECT * FROM p4") == [(1, 2)]
        # Inside a transaction the error surfaces; the pool resets the connection after.
        async with await AnyioConnection.connect(pg_url) as other:
            await other.execute("ALTER TABLE p4 ADD COLUMN c int DEFAULT 3")
        with pytest.raises(_errors.DatabaseError) as info:
            async with driver.transaction() as tx:
                await tx.fetch_all("SELECT * FROM p4")
        assert info.value.sqlstate == "0A000"
        assert await ex.fetch_all("SELECT * FROM p4") == [(1, 2, 3)]
        assert driver.statistics().discarded == 0


async def test_stale_prepared_statement_recovers_on_the_direct_path(pg_url: str) -> None:
    """The hot statements' direct path prepares its own statements: one gone stale after
    DDL is dropped and prepared again, as psycopg's are."""
    async with open_postgres(pg_url, pool_max_size=1) as driver:
        ex = driver.executor()
        assert isinstance(ex, PostgresExecutor)
        await ex.execute("CREATE TABLE p5 (a int)")
        await ex.execute("INSERT INTO p5 VALUES (1)")
        query = "SELECT * FROM p5 WHERE a = %s"
        assert await ex._rows(query, [1], binary=True) == [(1,)]
        async with await AnyioConnection.connect(pg_url) as other:
            await other.execute("ALTER TABLE p5 ADD COLUMN b int DEFAULT 2")
        assert await ex._rows(query, [1], binary=True) == [(1, 2)]
        assert await ex._rows(query, [1], binary=True) == [(1, 2)]
        assert driver.statistics().discarded == 0
