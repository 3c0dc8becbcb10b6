"""The SQLite driver on a ``sqlite3``-API module (``sqlite_module=pysqlite3.dbapi2``) instead
of apsw: a client works jobs another process inserts, noticed through their notification, while
its jobs write the same file through that module (as Django's ORM does in ``river_worker``);
every write is visible to other processes. Cancellation of a lock wait, the busy timeout and
the option's validation."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from typing import Any, ClassVar

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio.drivers.sqlite import open_sqlite, path_from_url

pytestmark = pytest.mark.anyio

#: Far beyond the test's deadline: only the notification can start the jobs in time.
POLL = 60.0
#: From the inserting process's exit to the last job's completion (a loaded machine).
PROMPT = 10.0
JOBS = 5

INSERTER = """
import sys
from typing import ClassVar

import anyio
import attrs

import river_anyio as river


@attrs.frozen
class Mark:
    kind: ClassVar[str] = "sqlite_module_mark"
    n: int


async def main() -> None:
    async with river.open_client(sys.argv[1]) as run:
        await run.client.insert(Mark(n=0))
        await run.client.insert_many([Mark(n=n) for n in range(1, int(sys.argv[3]))])


anyio.run(main, backend=sys.argv[2])
"""

#: Another process's view of the file, through a connection opened afresh.
READER = """
import json, sys

import apsw

conn = apsw.Connection(sys.argv[1], flags=apsw.SQLITE_OPEN_READONLY)
conn.set_busy_timeout(5000)
print(json.dumps({
    "completed": conn.execute(
        "SELECT count(*) FROM river_job WHERE state = 'completed'").fetchone()[0],
    "marks": sorted(r[0] for r in conn.execute("SELECT n FROM marks")),
}))
"""


@attrs.frozen
class Mark:
    kind: ClassVar[str] = "sqlite_module_mark"
    n: int


def _module() -> Any:
    return pytest.importorskip(
        "pysqlite3.dbapi2", reason="pysqlite3-binary (Linux x86-64 wheels) is not installed"
    )


async def test_client_on_pysqlite3_works_jobs_another_process_inserts(
    sqlite_empty_url: str, anyio_backend: str
) -> None:
    module = _module()
    path = path_from_url(sqlite_empty_url)

    def mark(n: int) -> None:
        # the job's own connection of the same module, opened and closed (as the ORM's)
        conn = module.connect(path, timeout=5)
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS marks (n integer PRIMARY KEY)")
            conn.execute("INSERT INTO marks (n) VALUES (?)", (n,))
            conn.commit()
        finally:
            conn.close()

    async def work(ctx: river.WorkContext, job: river.Job[Mark]) -> None:
        await anyio.to_thread.run_sync(mark, job.args.n)

    workers = river.Workers()
    workers.add(Mark, work)
    async with river.open_client(
        sqlite_empty_url,
        queues={"default": river.QueueConfig(max_workers=JOBS)},
        workers=workers,
        fetch_poll_interval=POLL,
        auto_migrate=True,  # River's migrations run through pysqlite3 too
        driver_options={"sqlite_module": module},
    ) as run:
        driver: Any = run.client.driver
        assert driver.sqlite_module is module
        with run.subscribe(river.EventKind.JOB_COMPLETED) as events:
            await anyio.run_process(
                [sys.executable, "-c", INSERTER, sqlite_empty_url, anyio_backend, str(JOBS)],
                check=True,
                stdout=None,
                stderr=None,
            )
            done: set[int] = set()
            with anyio.fail_after(PROMPT):
                async for ev in events:
                    assert ev.job is not None
                    done.add(ev.job.id)
                    if len(done) == JOBS:
                        break
        proc = await anyio.run_process([sys.executable, "-c", READER, path], check=True)
    seen = json.loads(proc.stdout)
    assert seen == {"completed": JOBS, "marks": list(range(JOBS))}


async def test_a_lock_wait_is_cancelled_at_once_and_busy_timeout_applies(
    sqlite_url: str,
) -> None:
    module = _module()
    holder = module.connect(path_from_url(sqlite_url), isolation_level=None)
    try:
        async with open_sqlite(sqlite_url, sqlite_module=module, busy_timeout=30) as driver:
            holder.execute("BEGIN IMMEDIATE")  # another connection holds the write lock
            started = time.monotonic()
            with anyio.move_on_after(0.3) as scope:
                await driver.executor().exec_script("CREATE TABLE waits (a integer)")
            assert scope.cancelled_caught
            # the 30 s busy timeout is not waited out: the busy handler wakes on cancellation
            assert time.monotonic() - started < 5
            holder.execute("ROLLBACK")
            await driver.executor().exec_script("CREATE TABLE after_wait (a integer)")
            assert await driver.executor().table_exists("after_wait")
            assert not await driver.executor().table_exists("waits")
        async with open_sqlite(sqlite_url, sqlite_module=module, busy_timeout=0.2) as driver:
            holder.execute("BEGIN IMMEDIATE")
            started = time.monotonic()
            with pytest.raises(river.DatabaseBusyError):
                await driver.executor().exec_script("CREATE TABLE busy (a integer)")
            assert 0.15 < time.monotonic() - started < 5
            holder.execute("ROLLBACK")
    finally:
        holder.close()


def test_sqlite_module_is_validated(tmp_path: Any) -> None:
    url = f"sqlite://{tmp_path / 'x.sqlite3'}"
    with pytest.raises(river.ConfigError) as info:
        open_sqlite(url, sqlite_module=json)
    assert info.value.field == "sqlite_module" and "sqlite3-API module" in str(info.value)
    with pytest.raises(river.ConfigError) as info:
        open_sqlite("sqlite://:memory:", sqlite_module=_module())
    assert info.value.field == "sqlite_module" and "in-memory" in str(info.value)
    if sqlite3.sqlite_version_info < (3, 47):
        with pytest.raises(river.ConfigError) as info:
            open_sqlite(url, sqlite_module=sqlite3)
        assert info.value.field == "sqlite_module"
        assert f"SQLite {sqlite3.sqlite_version}" in str(info.value), info.value
