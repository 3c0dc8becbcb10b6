"""The SQLite writer thread: URLs, opening, hops, cancellation, busy handling, transactions."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.lowlevel
import apsw
import pytest

from river_anyio._errors import (
    ConfigError,
    ConnectionLostError,
    DatabaseBusyError,
    DatabaseError,
    IntegrityError,
    QueryCanceledError,
    UniqueViolationError,
)
from river_anyio.drivers.sqlite import open_sqlite
from river_anyio.drivers.sqlite._connection import ConnectionThread, path_from_url, write_unit

pytestmark = pytest.mark.anyio


def _path(url: str) -> str:
    return path_from_url(url)


def _count(path: str, table: str = "river_notification") -> int:
    conn = apsw.Connection(path)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])  # type: ignore[index]
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# URLs and opening


async def test_open_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        async with open_sqlite(f"sqlite://{tmp_path}/nope/river.db"):
            pass


async def test_open_creates_file_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    async with open_sqlite(str(path)) as driver:
        rows = await driver.executor().fetch_all("PRAGMA journal_mode")
        assert rows == [("wal",)]
        assert await driver.executor().fetch_all("PRAGMA foreign_keys") == [(1,)]
        assert await driver.executor().fetch_all("PRAGMA synchronous") == [(1,)]  # NORMAL
        assert driver.path == str(path)
    assert path.exists()


async def test_open_rejects_old_sqlite(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apsw, "sqlite_lib_version", lambda: "3.46.1")  # apsw 3.46.1.0's
    with pytest.raises(ConfigError, match=r"SQLite >= 3\.47\.0.*uses SQLite 3\.46\.1"):
        open_sqlite(sqlite_url)


async def test_open_validates_arguments(sqlite_url: str) -> None:
    with pytest.raises(ConfigError):
        open_sqlite(sqlite_url, schema="bad-name")
    with pytest.raises(ConfigError):
        open_sqlite(sqlite_url, schema="x" * 47)
    with pytest.raises(ConfigError):
        open_sqlite(sqlite_url, busy_timeout=-1)
    with pytest.raises(ConfigError):
        open_sqlite(sqlite_url, busy_timeout=float("inf"))
    with pytest.raises(ConfigError):
        open_sqlite(sqlite_url, busy_timeout=True)
    with pytest.raises(ConfigError):
        open_sqlite(sqlite_url, attach={"main": "x.db"})
    with pytest.raises(ConfigError, match="no attached database"):
        async with open_sqlite(sqlite_url, schema="river"):
            pass


async def test_close_is_idempotent_and_final(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        assert await ex.fetch_all("SELECT 1") == [(1,)]
        await driver.aclose()
        await driver.aclose()
        with pytest.raises(ConnectionLostError):
            await ex.fetch_all("SELECT 1")


async def test_close_finishes_queued_work_and_stops_thread(sqlite_url: str) -> None:
    before = {t.name for t in threading.enumerate()}
    async with open_sqlite(sqlite_url) as driver:
        assert "river-sqlite-writer" in {t.name for t in threading.enumerate()} - before
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(driver.executor().notify_many, "river_insert", ["{}"])
    assert "river-sqlite-writer" not in {t.name for t in threading.enumerate()} - before
    assert _count(_path(sqlite_url)) == 20


# ---------------------------------------------------------------------------------------------
# hops and errors


async def test_run_hop_and_error_translation(sqlite_url: str) -> None:
    writer = ConnectionThread(_path(sqlite_url))
    await writer.start()
    try:
        assert await writer.run(
            lambda c, a, b: c.execute("SELECT ?+?", (a, b)).fetchall(), 1, 2
        ) == [(3,)]
        with pytest.raises(DatabaseError, match="no such table") as info:
            await writer.run(lambda c: c.execute("SELECT * FROM nope").fetchall())
        assert isinstance(info.value.__cause__, apsw.SQLError)
        with pytest.raises(ValueError, match="plain"):  # non-apsw errors pass through

            def boom(_c: apsw.Connection) -> None:
                raise ValueError("plain")

            await writer.run(boom)

        # a unit of work that leaves a transaction open is rolled back
        await writer.run(
            lambda c: c.execute(
                "BEGIN IMMEDIATE; INSERT INTO river_notification (topic, payload) VALUES ('t', 'p')"
            )
        )
        assert await writer.run(lambda c: c.in_transaction) is False
        assert await writer.run(
            lambda c: c.execute("SELECT count(*) FROM river_notification").fetchall()
        ) == [(0,)]
    finally:
        await writer.aclose()


async def test_constraint_errors_translated(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        await ex.execute("INSERT INTO river_queue (name) VALUES ('q1')")
        with pytest.raises(UniqueViolationError) as info:
            await ex.execute("INSERT INTO river_queue (name) VALUES ('q1')")
        assert isinstance(info.value.__cause__, apsw.ConstraintError)
        with pytest.raises(IntegrityError) as info2:
            await ex.execute("INSERT INTO river_notification (topic, payload) VALUES ('', 'x')")
        assert not isinstance(info2.value, UniqueViolationError)


# ---------------------------------------------------------------------------------------------
# cancellation

_LONG_INSERT = (
    "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 200000000) "
    "INSERT INTO river_notification (topic, payload) SELECT 't', x FROM r"
)


async def test_cancel_mid_statement_rolls_back(sqlite_url: str) -> None:
    path = _path(sqlite_url)
    writer = ConnectionThread(path)
    await writer.start()
    try:
        await writer.run(
            write_unit,
            lambda c: c.execute(
                "INSERT INTO river_notification (topic, payload) VALUES ('t', 'keep')"
            ),
        )
        token = anyio.lowlevel.current_token()
        started = anyio.Event()

        def long_insert(conn: apsw.Connection) -> None:
            anyio.from_thread.run_sync(started.set, token=token)
            conn.execute(_LONG_INSERT)

        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cancel_when_started() -> None:
                    await started.wait()
                    scope.cancel()

                tg.start_soon(cancel_when_started)
                t0 = time.monotonic()
                await writer.run(write_unit, long_insert)
        elapsed = time.monotonic() - t0
        assert scope.cancelled_caught
        assert elapsed < 2.0
        # interrupted, rolled back, reusable
        assert await writer.run(lambda c: c.in_transaction) is False
        assert await writer.run(
            lambda c: c.execute("SELECT count(*) FROM river_notification").fetchall()
        ) == [(1,)]
    finally:
        await writer.aclose()
    assert _count(path) == 1


async def test_interrupted_statement_is_query_canceled_for_the_unit(sqlite_url: str) -> None:
    # An interrupt that is not our own cancellation surfaces as QueryCanceledError.
    writer = ConnectionThread(_path(sqlite_url))
    await writer.start()
    try:

        def self_interrupting(conn: apsw.Connection) -> None:
            conn.interrupt()
            cur = conn.execute(
                "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM r WHERE x < 10) "
                "SELECT x FROM r"
            )
            conn.interrupt()
            cur.fetchall()

        with pytest.raises(QueryCanceledError):
            await writer.run(self_interrupting)
    finally:
        await writer.aclose()


class _LockHolder:
    """Another connection (as another process would) holding the write lock."""

    def __init__(self, path: str) -> None:
        self.conn = apsw.Connection(path)
        self.conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        self.conn.execute("ROLLBACK")
        self.conn.close()


@pytest.fixture
def busy_spy(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set when a driver connection first waits for a lock in its busy handler."""
    waiting = threading.Event()
    original = ConnectionThread._busy

    def spy(self: ConnectionThread, count: int) -> bool:
        waiting.set()
        return original(self, count)

    monkeypatch.setattr(ConnectionThread, "_busy", spy)
    return waiting


async def test_cancel_while_waiting_for_lock(sqlite_url: str, busy_spy: threading.Event) -> None:
    path = _path(sqlite_url)
    async with open_sqlite(sqlite_url, busy_timeout=30) as driver:
        holder = _LockHolder(path)
        try:
            with anyio.CancelScope() as scope:
                async with anyio.create_task_group() as tg:

                    async def cancel_when_waiting() -> None:
                        await anyio.to_thread.run_sync(busy_spy.wait)
                        scope.cancel()

                    tg.start_soon(cancel_when_waiting)
                    t0 = time.monotonic()
                    await driver.executor().notify_many("river_insert", ["{}"])
            assert scope.cancelled_caught
            assert time.monotonic() - t0 < 2.0
        finally:
            holder.release()
        await driver.executor().notify_many("river_insert", ["{}"])  # reusable
    assert _count(path) == 1


async def test_busy_timeout_raises_database_busy(
    sqlite_url: str, busy_spy: threading.Event
) -> None:
    path = _path(sqlite_url)
    async with open_sqlite(sqlite_url, busy_timeout=0.2) as driver:
        holder = _LockHolder(path)
        try:
            t0 = time.monotonic()
            with pytest.raises(DatabaseBusyError) as info:
                await driver.executor().notify_many("river_insert", ["{}"])
            assert 0.15 < time.monotonic() - t0 < 3.0
            assert info.value.transient
            assert isinstance(info.value.__cause__, apsw.BusyError)
        finally:
            holder.release()


async def test_lock_wait_does_not_block_event_loop(
    sqlite_url: str, busy_spy: threading.Event
) -> None:
    path = _path(sqlite_url)
    ticks = 0
    async with open_sqlite(sqlite_url, busy_timeout=0.5) as driver:
        holder = _LockHolder(path)
        try:
            async with anyio.create_task_group() as tg:

                async def ticker() -> None:
                    nonlocal ticks
                    while True:
                        ticks += 1
                        await anyio.sleep(0.01)

                tg.start_soon(ticker)
                with pytest.raises(DatabaseBusyError):
                    await driver.executor().notify_many("river_insert", ["{}"])
                tg.cancel_scope.cancel()
        finally:
            holder.release()
    assert busy_spy.is_set()
    assert ticks >= 15  # ~50 if never blocked; zero if the loop froze


async def test_waiter_gets_lock_when_released(sqlite_url: str, busy_spy: threading.Event) -> None:
    path = _path(sqlite_url)
    async with open_sqlite(sqlite_url, busy_timeout=30) as driver:
        holder = _LockHolder(path)
        async with anyio.create_task_group() as tg:
            tg.start_soon(driver.executor().notify_many, "river_insert", ["{}"])
            await anyio.to_thread.run_sync(busy_spy.wait)
            holder.release()
    assert _count(path) == 1


# ---------------------------------------------------------------------------------------------
# transactions


async def test_transaction_commits_and_rolls_back(sqlite_url: str) -> None:
    path = _path(sqlite_url)
    async with open_sqlite(sqlite_url) as driver:
        async with driver.transaction() as tx:
            assert tx.in_transaction
            await tx.notify_many("river_insert", ["a"])
            await tx.notify_many("river_insert", ["b"])
        with pytest.raises(ZeroDivisionError):
            async with driver.transaction() as tx:
                await tx.notify_many("river_insert", ["c"])
                1 / 0  # noqa: B018
        # cancelled body: rolled back
        with anyio.CancelScope() as scope:
            async with driver.transaction() as tx:
                await tx.notify_many("river_insert", ["d"])
                scope.cancel()
                await anyio.sleep_forever()
        assert await driver.executor().fetch_all(
            "SELECT payload FROM river_notification ORDER BY id"
        ) == [("a",), ("b",)]
        with pytest.raises(RuntimeError, match="transaction has ended"):
            await tx.fetch_all("SELECT 1")
        # an empty transaction never begins
        async with driver.transaction():
            pass
    assert _count(path) == 2


async def test_transaction_isolated_from_other_tasks(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver:
        inserted = anyio.Event()
        go = anyio.Event()
        order: list[str] = []
        seen: list[int] = []

        async def writer_task() -> None:
            async with driver.transaction() as tx:
                await tx.notify_many("river_insert", ["x"])
                inserted.set()
                await go.wait()
                order.append("tx-body-done")
            order.append("committed")

        async def other_task() -> None:
            await inserted.wait()
            rows = await driver.executor().fetch_all("SELECT count(*) FROM river_notification")
            order.append("other-read")
            seen.append(rows[0][0])

        async with anyio.create_task_group() as tg:
            tg.start_soon(writer_task)
            tg.start_soon(other_task)
            await inserted.wait()
            await anyio.wait_all_tasks_blocked()
            assert order == []  # the other task is waiting for the transaction to end
            go.set()
        assert order == ["tx-body-done", "committed", "other-read"]
        assert seen == [1]


async def test_executor_inside_own_transaction_is_refused(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver:
        async with driver.transaction() as tx:
            with pytest.raises(RuntimeError, match="deadlock"):
                await driver.executor().fetch_all("SELECT 1")
            with pytest.raises(RuntimeError, match="nested"):
                async with driver.transaction():
                    pass
            assert driver.executor_for(tx) is tx


async def test_transaction_lost_after_interrupted_write(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver:
        with pytest.raises(DatabaseError, match="no longer open"):
            async with driver.transaction() as tx:
                await tx.notify_many("river_insert", ["x"])
                await tx.execute("ROLLBACK")  # the transaction ends behind the driver's back
                await tx.notify_many("river_insert", ["y"])
        assert await driver.executor().fetch_all("SELECT count(*) FROM river_notification") == [
            (0,)
        ]


async def test_concurrent_units_all_apply(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver:
        async with anyio.create_task_group() as tg:
            for i in range(50):
                if i % 5 == 0:

                    async def in_tx(i: int = i) -> None:
                        async with driver.transaction() as tx:
                            await tx.notify_many("river_insert", [f"tx{i}"])
                            await tx.notify_many("river_insert", [f"tx{i}b"])

                    tg.start_soon(in_tx)
                else:
                    tg.start_soon(driver.executor().notify_many, "river_insert", [str(i)])
        rows = await driver.executor().fetch_all(
            "SELECT payload FROM river_notification ORDER BY id"
        )
        payloads = [r[0] for r in rows]
        assert len(payloads) == 60
        for i in range(0, 50, 5):  # a transaction's two rows are adjacent
            j = payloads.index(f"tx{i}")
            assert payloads[j + 1] == f"tx{i}b"
