"""AnyioConnection's direct path (``execute_direct``): placeholders, adaptation, prepared
statements, transactions, errors and cancellation, under asyncio and trio."""

from __future__ import annotations

import datetime as dt

import anyio
import psycopg
import pytest
from psycopg import pq

from river_anyio.drivers.postgres import AnyioConnection
from river_anyio.drivers.postgres._connection import _numbered

UTC = dt.UTC


async def direct_statements(conn: AnyioConnection) -> list[tuple[str, str]]:
    """The direct path's prepared statements on the server: (name, statement), by statement."""
    cur = await conn.execute(
        "SELECT name, statement FROM pg_prepared_statements WHERE name LIKE %s ORDER BY 2, 1",
        ("_river_%",),
    )
    return [(row[0], row[1]) for row in await cur.fetchall()]


def test_placeholders_are_numbered_as_psycopg_binds_them() -> None:
    assert _numbered("SELECT %s, %s, 100%%") == (b"SELECT $1, $2, 100%", None)
    assert _numbered("SELECT %(a)s, %(b)s, %(a)s") == (b"SELECT $1, $2, $1", ("a", "b"))
    with pytest.raises(ValueError, match="mixes named and positional"):
        _numbered("SELECT %(a)s, %s")
    with pytest.raises(ValueError, match="unsupported placeholder '%d'"):
        _numbered("SELECT %d")


@pytest.mark.anyio
async def test_values_round_trip_as_a_cursor_returns_them(pg_url: str) -> None:
    """Parameters are adapted by the connection's adapters and rows loaded in binary, as a
    binary cursor would: the same tuples, in order or by name."""
    at = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    query = "SELECT %s::bigint, %s::text, %s::timestamptz, %s::text[], %s::jsonb, 100 %% 7"
    params = (2**40, "é,\"'", at, ["a", "b c"], '{"k": [1]}')
    async with await AnyioConnection.connect(pg_url) as conn:
        cur = await conn.cursor(binary=True).execute(query, params)
        expected = await cur.fetchall()
        assert await conn.execute_direct(query, params) == expected
        assert await conn.execute_direct(query, params) == expected  # prepared now
        named = "SELECT %(n)s::bigint + %(n)s::bigint, %(t)s::text"
        assert await conn.execute_direct(named, {"n": 20, "t": "x"}) == [(40, "x")]
        with pytest.raises(TypeError, match="by name"):
            await conn.execute_direct(query, {"n": 1})
        assert await conn.execute_direct("CREATE TEMP TABLE d (a int)", ()) == []
        assert await conn.execute_direct("INSERT INTO d VALUES (%s)", (1,)) == []
        assert await conn.execute_direct("SELECT a FROM d WHERE a = %s", (2,)) == []


@pytest.mark.anyio
async def test_inside_a_transaction_and_after_an_error(pg_url: str) -> None:
    """In a transaction the statement is part of it; an error is raised as psycopg's, aborts
    the transaction as usual, and leaves the connection usable once it is rolled back."""
    async with await AnyioConnection.connect(pg_url) as conn:
        await conn.execute("CREATE TABLE dt (a int PRIMARY KEY)")
        with pytest.raises(psycopg.errors.UniqueViolation):
            async with conn.transaction():
                await conn.execute_direct("INSERT INTO dt VALUES (%s)", (1,))
                assert conn.pgconn.transaction_status == pq.TransactionStatus.INTRANS
                await conn.execute_direct("INSERT INTO dt VALUES (%s)", (1,))
        assert await conn.execute_direct("SELECT count(*) FROM dt WHERE a > %s", (0,)) == [(0,)]
        with pytest.raises(psycopg.errors.DivisionByZero):
            await conn.execute_direct("SELECT 1 / %s::int", (0,))
        assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
        assert await conn.execute_direct("SELECT 1 / %s::int", (1,)) == [(1,)]


@pytest.mark.anyio
async def test_a_cancelled_statement_is_cancelled_on_the_server(pg_url: str) -> None:
    """Cancelled while the server runs it: the server stops it and the connection stays
    usable (no prepared statement or result left half-read)."""
    async with await AnyioConnection.connect(pg_url) as conn:
        pid = conn.info.backend_pid
        async with await AnyioConnection.connect(pg_url) as watcher:
            async with anyio.create_task_group() as tg:

                async def sleeper(*, task_status: anyio.abc.TaskStatus[anyio.CancelScope]) -> None:
                    with anyio.CancelScope() as scope:
                        task_status.started(scope)
                        await conn.execute_direct("SELECT pg_sleep(%s)", (30,))
                    assert scope.cancelled_caught

                scope = await tg.start(sleeper)
                with anyio.fail_after(10):
                    while True:
                        cur = await watcher.execute(
                            "SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,)
                        )
                        row = await cur.fetchone()
                        if row and row[0] == "active" and "pg_sleep" in row[1]:
                            break
                        await anyio.sleep(0.01)
                scope.cancel("test: cancel the running statement")
            cur = await watcher.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,))
            assert await cur.fetchone() == ("idle",)
        assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
        assert await conn.execute_direct("SELECT %s::int", (7,)) == [(7,)]


@pytest.mark.anyio
async def test_prepares_no_more_statements_than_prepared_max(pg_url: str) -> None:
    """Statements beyond psycopg's ``prepared_max`` run unprepared (each with its text), so
    arbitrary statements cannot fill the server's memory with prepared ones."""
    async with await AnyioConnection.connect(pg_url) as conn:
        conn.prepared_max = 2
        for i in range(4):
            assert await conn.execute_direct(f"SELECT %s::int + {i}", (1,)) == [(1 + i,)]
            assert await conn.execute_direct(f"SELECT %s::int + {i}", (2,)) == [(2 + i,)]
        assert len(await direct_statements(conn)) == 2


@pytest.mark.anyio
async def test_a_statement_is_prepared_anew_as_it_ages(pg_url: str) -> None:
    """A direct statement is prepared again a quarter of a second after it was first
    prepared, then at doubling intervals, and the old one is dropped: PostgreSQL settles a
    prepared statement's generic plan on the table as it was, and a plan made while the table
    was nearly empty must not outlive the table's growth."""
    query = "SELECT %s::int + 1"
    async with await AnyioConnection.connect(pg_url) as conn:

        async def names() -> list[str]:
            return [n for n, text in await direct_statements(conn) if text == "SELECT $1::int + 1"]

        assert await conn.execute_direct(query, (1,)) == [(2,)]
        [first] = await names()
        with anyio.fail_after(5):
            while (current := await names()) == [first]:
                assert await conn.execute_direct(query, (2,)) == [(3,)]
        assert len(current) == 1 and current != [first]  # the old one was dropped


@pytest.mark.anyio
async def test_only_the_missing_statement_is_prepared_again(pg_url: str) -> None:
    """After ``DEALLOCATE ALL`` behind the direct path's back, each statement is prepared
    again when it next runs, and one prepared since is kept: no statement is prepared twice
    (a forgotten one would stay on the server until the connection closes)."""
    first, second = "SELECT %s::int + 10", "SELECT %s::int + 20"
    async with await AnyioConnection.connect(pg_url) as conn:
        assert await conn.execute_direct(second, (1,)) == [(21,)]
        await conn.execute("DEALLOCATE ALL")
        assert await conn.execute_direct(first, (1,)) == [(11,)]  # prepared since
        assert await conn.execute_direct(second, (2,)) == [(22,)]  # missing: prepared again
        assert await conn.execute_direct(first, (2,)) == [(12,)]  # still prepared
        assert [text for _, text in await direct_statements(conn)] == [
            "SELECT $1::int + 10",
            "SELECT $1::int + 20",
        ]
