"""AnyioConnection: psycopg's async API under asyncio and trio, cancellation, close."""

from __future__ import annotations

import datetime as dt

import anyio
import psycopg
import pytest
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from river_anyio.drivers.postgres import AnyioConnection, shielded_transaction

pytestmark = pytest.mark.anyio


async def _wait_until_active(pid: int, url: str, needle: str) -> None:
    """Poll pg_stat_activity until backend ``pid`` runs a query containing ``needle``."""
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


async def _backend_state(url: str, pid: int) -> tuple[str, str] | None:
    async with await AnyioConnection.connect(url) as watcher:
        cur = await watcher.execute(
            "SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,)
        )
        row = await cur.fetchone()
        return (row[0], row[1]) if row else None


async def test_api_surface(pg_url: str) -> None:
    async with await AnyioConnection.connect(pg_url) as conn:
        assert conn.autocommit
        cur = await conn.execute("SELECT %s::int + 1, %s::text", (41, "x"))
        assert await cur.fetchone() == (42, "x")

        await conn.execute("CREATE TEMP TABLE t (id int PRIMARY KEY, v text)")
        async with shielded_transaction(conn):
            await conn.cursor().executemany(
                "INSERT INTO t VALUES (%s, %s)", [(i, f"v{i}") for i in range(10)]
            )
        cur = conn.cursor()
        async with cur.copy("COPY t (id, v) FROM STDIN") as copy:
            for i in range(10, 20):
                await copy.write_row((i, f"v{i}"))
        async with conn.pipeline():
            c1 = await conn.execute("SELECT count(*) FROM t")
            c2 = await conn.execute("SELECT max(id) FROM t")
        assert await c1.fetchone() == (20,)
        assert await c2.fetchone() == (19,)
        async with conn.cursor(binary=True) as bcur:
            await bcur.execute("SELECT id FROM t ORDER BY id LIMIT 3")
            assert await bcur.fetchall() == [(0,), (1,), (2,)]
        async with shielded_transaction(conn):
            async with conn.cursor(name="server_side") as scur:
                await scur.execute("SELECT id FROM t ORDER BY id")
                assert [r[0] async for r in scur] == list(range(20))
        assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE


@pytest.mark.parametrize("autocommit", [True, False])
async def test_sessions_run_in_utc_whatever_the_server_default(
    pg_url: str, autocommit: bool
) -> None:
    """Timestamps load as UTC datetimes (River's drivers return UTC) even when the server's or
    the caller's time zone is another one."""
    params = conninfo_to_dict(pg_url)
    params["options"] = "-c TimeZone=Asia/Kolkata"
    async with await AnyioConnection.connect(
        make_conninfo("", **params), autocommit=autocommit
    ) as conn:
        assert conn.autocommit is autocommit
        assert conn.pgconn.parameter_status(b"TimeZone") == b"UTC"
        cur = await conn.cursor(binary=True).execute(
            "SELECT timestamptz '2026-01-02 03:04:05.678901+05:30', current_setting('TimeZone')"
        )
        at, zone = await cur.fetchone() or (None, None)
        assert zone == "UTC"
        assert at == dt.datetime(2026, 1, 1, 21, 34, 5, 678901, tzinfo=dt.UTC)
        assert at.tzinfo is dt.UTC
        if not autocommit:
            assert conn.pgconn.transaction_status == pq.TransactionStatus.INTRANS
            await conn.rollback()


async def test_connect_by_hostname(pg_url: str) -> None:
    params = conninfo_to_dict(pg_url)
    params["host"] = "localhost"
    async with await AnyioConnection.connect(make_conninfo("", **params)) as conn:
        cur = await conn.execute("SELECT 1")
        assert await cur.fetchone() == (1,)


async def test_connect_refused_raises_operational_error(pg_url: str) -> None:
    params = conninfo_to_dict(pg_url)
    with anyio.fail_after(10):
        # Nothing listens on port 1.
        params["port"] = "1"
        with pytest.raises(psycopg.OperationalError):
            await AnyioConnection.connect(make_conninfo("", **params), connect_timeout=2)


async def test_cancel_query_midflight(pg_url: str) -> None:
    async with await AnyioConnection.connect(pg_url) as conn:
        pid = conn.info.backend_pid
        started = anyio.current_time()
        async with anyio.create_task_group() as tg:

            async def sleeper(*, task_status: anyio.abc.TaskStatus[anyio.CancelScope]) -> None:
                with anyio.CancelScope() as scope:
                    task_status.started(scope)
                    await conn.execute("SELECT pg_sleep(30)")
                assert scope.cancelled_caught

            scope = await tg.start(sleeper)
            await _wait_until_active(pid, pg_url, "pg_sleep(30)")
            scope.cancel()
        assert anyio.current_time() - started < 10
        # The server-side query is gone, and the connection is reusable.
        state = await _backend_state(pg_url, pid)
        assert state is not None
        assert state[0] == "idle"
        assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
        cur = await conn.execute("SELECT 7")
        assert await cur.fetchone() == (7,)


async def test_cancelled_transaction_is_rolled_back(pg_url: str) -> None:
    async with await AnyioConnection.connect(pg_url) as conn:
        await conn.execute("CREATE TABLE tx_probe (id int)")
        pid = conn.info.backend_pid
        async with anyio.create_task_group() as tg:

            async def work(*, task_status: anyio.abc.TaskStatus[anyio.CancelScope]) -> None:
                with anyio.CancelScope() as scope:
                    task_status.started(scope)
                    async with shielded_transaction(conn):
                        await conn.execute("INSERT INTO tx_probe VALUES (1)")
                        await conn.execute("SELECT pg_sleep(30)")

            scope = await tg.start(work)
            await _wait_until_active(pid, pg_url, "pg_sleep(30)")
            scope.cancel()
        assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
        assert conn._num_transactions == 0
        cur = await conn.execute("SELECT count(*) FROM tx_probe")
        assert await cur.fetchone() == (0,)
        # The next transaction is a real one (not a savepoint in an aborted transaction).
        async with shielded_transaction(conn):
            await conn.execute("INSERT INTO tx_probe VALUES (2)")
        cur = await conn.execute("SELECT array_agg(id) FROM tx_probe")
        assert await cur.fetchone() == ([2],)


def _roll_back() -> None:
    raise psycopg.Rollback


async def test_shielded_transaction_commit_rollback_and_rollback_exception(pg_url: str) -> None:
    async with await AnyioConnection.connect(pg_url) as conn:
        await conn.execute("CREATE TABLE tx_probe (id int)")
        async with shielded_transaction(conn):
            await conn.execute("INSERT INTO tx_probe VALUES (1)")
        with pytest.raises(ZeroDivisionError):
            async with shielded_transaction(conn):
                await conn.execute("INSERT INTO tx_probe VALUES (2)")
                raise ZeroDivisionError
        async with shielded_transaction(conn):
            await conn.execute("INSERT INTO tx_probe VALUES (3)")
            _roll_back()  # psycopg.Rollback is swallowed, as psycopg's transaction() does
        cur = await conn.execute("SELECT array_agg(id) FROM tx_probe")
        assert await cur.fetchone() == ([1],)


async def test_cancel_safe_interrupts_other_task(pg_url: str) -> None:
    async with await AnyioConnection.connect(pg_url) as conn:
        pid = conn.info.backend_pid
        outcome: list[BaseException] = []
        async with anyio.create_task_group() as tg:

            async def sleeper() -> None:
                try:
                    await conn.execute("SELECT pg_sleep(30)")
                except psycopg.errors.QueryCanceled as exc:
                    outcome.append(exc)

            tg.start_soon(sleeper)
            await _wait_until_active(pid, pg_url, "pg_sleep(30)")
            await conn.cancel_safe()
        assert len(outcome) == 1
        cur = await conn.execute("SELECT 1")
        assert await cur.fetchone() == (1,)


async def test_notifies_with_timeout_returns(pg_url: str) -> None:
    async with await AnyioConnection.connect(pg_url) as conn:
        await conn.execute('LISTEN "probe"')
        received = [n async for n in conn.notifies(timeout=0.05)]
        assert received == []
        await conn.execute("NOTIFY probe, 'x'")
        received = [n async for n in conn.notifies(timeout=5, stop_after=1)]
        assert [n.payload for n in received] == ["x"]


async def test_close_wakes_blocked_notifies(pg_url: str) -> None:
    conn = await AnyioConnection.connect(pg_url)
    await conn.execute('LISTEN "probe"')
    failures: list[BaseException] = []
    waiting = anyio.Event()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def listen() -> None:
                waiting.set()
                try:
                    async for _ in conn.notifies():
                        pass
                except psycopg.OperationalError as exc:
                    failures.append(exc)

            tg.start_soon(listen)
            await waiting.wait()
            await anyio.wait_all_tasks_blocked()
            await conn.close()
    assert len(failures) == 1
    assert conn.closed


async def test_owner_less_lock_across_tasks(pg_url: str) -> None:
    # notifies() async generator finalised by a different task must not break the lock.
    async with await AnyioConnection.connect(pg_url) as conn:
        await conn.execute('LISTEN "probe"')
        await conn.execute("NOTIFY probe, 'a'")
        gen = conn.notifies(stop_after=1)
        first = await gen.__anext__()
        assert first.payload == "a"
        async with anyio.create_task_group() as tg:
            tg.start_soon(gen.aclose)
        cur = await conn.execute("SELECT 1")
        assert await cur.fetchone() == (1,)
