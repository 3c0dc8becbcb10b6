"""WAL checkpoints off the commits' path: the checkpointer's thread copies, a committing
connection only finishes the WAL (or checkpoints when the thread is behind)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import apsw
import pytest

from river_anyio.drivers.sqlite import SQLiteDriver, open_sqlite
from river_anyio.drivers.sqlite._checkpoint import CHECKPOINT_PAGES, Checkpointer
from river_anyio.drivers.sqlite._connection import path_from_url

#: Upper bound for the checkpointer's thread to act on a commit's request.
PROMPTLY = 10.0


class _Writer:
    """A WAL database written one small commit at a time through a connection whose WAL hook
    is the checkpointer's, recording the WAL's size after each commit."""

    def __init__(self, path: Path, checkpointer: Checkpointer) -> None:
        self.conn = apsw.Connection(str(path))
        self.conn.pragma("journal_mode", "wal")
        self.conn.execute("CREATE TABLE IF NOT EXISTS t (x BLOB)")
        self.sizes: list[int] = []

        def hook(conn: apsw.Connection, dbname: str, pages: int) -> int:
            self.sizes.append(pages)
            return checkpointer.wal_hook(conn, dbname, pages)

        self.conn.set_wal_hook(hook)

    def commit(self, n: int = 1) -> None:
        for _ in range(n):
            self.conn.execute("INSERT INTO t VALUES (randomblob(3000))")  # a page or so


@pytest.fixture
def small(tmp_path: Path) -> Iterator[tuple[Checkpointer, _Writer]]:
    """A checkpointer with small thresholds (thread started) and its writer."""
    checkpointer = Checkpointer(
        str(tmp_path / "c.db"), checkpoint_pages=20, restart_pages=40, finish_pages=6,
        behind_pages=200,
    )  # fmt: skip
    writer = _Writer(tmp_path / "c.db", checkpointer)
    checkpointer.start()
    try:
        yield checkpointer, writer
    finally:
        thread = checkpointer.stop()
        if thread is not None:
            thread.join(PROMPTLY)
            assert not thread.is_alive()
        writer.conn.close()


def test_the_thread_copies_and_the_commit_only_finishes(
    small: tuple[Checkpointer, _Writer],
) -> None:
    """A commit wakes the thread once pages were added since the last copy; the thread
    copies them; a commit finishes a WAL that has little left to copy, after which the WAL
    starts over. The WAL never reaches the size at which commits checkpoint themselves."""
    checkpointer, writer = small
    for round in range(1, 7):
        writer.commit(25)
        # a pause while the thread copies, as a steady flow of commits gives it time to
        assert checkpointer.wait_checkpoints(round, PROMPTLY)
    assert checkpointer.in_commits >= 1
    assert max(writer.sizes) < 200
    starts_over = [b for a, b in zip(writer.sizes, writer.sizes[1:], strict=False) if b < a]
    assert starts_over, writer.sizes
    # an SQLite autocheckpoint would have run in the commits: the hook replaced it
    assert writer.conn.pragma("wal_autocheckpoint") == 0


def test_commits_bound_the_wal_when_the_thread_does_not_copy(tmp_path: Path) -> None:
    """Without the thread (stopped, failing, starved), the committing connection checkpoints
    once the WAL reaches ``behind_pages``: the WAL stays bounded."""
    checkpointer = Checkpointer(
        str(tmp_path / "c.db"), checkpoint_pages=20, restart_pages=40, finish_pages=6,
        behind_pages=100,
    )  # fmt: skip
    writer = _Writer(tmp_path / "c.db", checkpointer)  # the thread is never started
    try:
        writer.commit(400)
    finally:
        writer.conn.close()
    assert checkpointer.checkpoints == 0
    assert checkpointer.in_commits >= 3
    assert max(writer.sizes) < 100 + 10  # (a commit adds a few pages)


@pytest.mark.anyio
async def test_the_driver_checkpoints_off_its_writers_commits(sqlite_url: str) -> None:
    """The SQLite driver's writer commits without SQLite's checkpoints, its checkpointer's
    thread copies the WAL, and closing the driver stops the thread; the last connection
    closed checkpoints the rest and removes the WAL."""
    path = path_from_url(sqlite_url)
    async with open_sqlite(sqlite_url) as driver:
        assert isinstance(driver, SQLiteDriver)
        writer = driver._writer
        assert await writer.run(lambda c: c.pragma("wal_autocheckpoint")) == 0

        def fill(conn: apsw.Connection) -> None:
            conn.execute("CREATE TABLE IF NOT EXISTS filler (x BLOB)")
            for _ in range(CHECKPOINT_PAGES + 200):
                conn.execute("INSERT INTO filler VALUES (randomblob(3000))")

        await writer.run(fill)
        checkpointer = driver._db.checkpointer
        assert checkpointer is not None
        assert await anyio.to_thread.run_sync(checkpointer.wait_checkpoints, 1, PROMPTLY)
        assert checkpointer.last is not None and checkpointer.last[0] == "main"
    assert not any(t.name == "river-sqlite-checkpointer" for t in threading.enumerate())
    assert not await anyio.Path(path + "-wal").exists()


@pytest.mark.anyio
async def test_an_attached_databases_wal_is_checkpointed_too(
    sqlite_url: str, tmp_path: Path
) -> None:
    """River's tables in an attached database: commits to it wake the thread for that
    database, whose WAL the thread checkpoints."""
    river_db = path_from_url(sqlite_url)
    async with open_sqlite(
        str(tmp_path / "app.sqlite3"), schema="river", attach={"river": river_db}
    ) as driver:

        def fill(conn: apsw.Connection) -> None:
            conn.execute("CREATE TABLE IF NOT EXISTS river.filler (x BLOB)")
            for _ in range(CHECKPOINT_PAGES + 200):
                conn.execute("INSERT INTO river.filler VALUES (randomblob(3000))")

        await driver._writer.run(fill)
        checkpointer = driver._db.checkpointer
        assert checkpointer is not None
        assert await anyio.to_thread.run_sync(checkpointer.wait_checkpoints, 1, PROMPTLY)
        assert checkpointer.last is not None
        database, (pages, copied) = checkpointer.last
        assert database == "river" and pages > 0 and copied > 0


@pytest.mark.anyio
async def test_a_sqlite3_module_keeps_sqlites_own_checkpoints(sqlite_url: str) -> None:
    """With a ``sqlite3``-API module there is no WAL hook to take over: no checkpointer,
    and SQLite's autocheckpoint (1,000 pages) stays."""
    sqlite3 = pytest.importorskip("pysqlite3.dbapi2")
    async with open_sqlite(sqlite_url, sqlite_module=sqlite3) as driver:
        assert driver._db.checkpointer is None
        rows = await driver._writer.run(lambda c: c.execute("PRAGMA wal_autocheckpoint").fetchall())
        assert rows == [(1000,)]
