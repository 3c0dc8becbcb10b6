"""A running async client picks up what the blocking client inserts, through the insert
notification (PostgreSQL NOTIFY, SQLite outbox): its poll interval is far longer than the
test's patience, so only the notification can wake it. On asyncio and trio, PostgreSQL and
SQLite; the blocking calls run in a worker thread, as a web framework's would."""

from __future__ import annotations

from typing import ClassVar

import anyio
import anyio.to_thread
import apsw
import attrs
import psycopg
import pytest

import river_anyio as river
from river_anyio import blocking

from ..runtime.conftest import WAIT, running

pytestmark = pytest.mark.anyio

#: Long enough that a pickup within WAIT can only come from a notification.
POLL = 60.0


@attrs.frozen
class Ping:
    kind: ClassVar[str] = "blk_ping"
    tag: str = ""


def recording_workers() -> tuple[river.Workers, list[str], anyio.Event]:
    """Workers recording each Ping's tag, and an event set when one tagged "last" runs."""
    seen: list[str] = []
    last = anyio.Event()

    async def work(ctx: river.WorkContext, job: river.Job[Ping]) -> None:
        seen.append(job.args.tag)
        if job.args.tag == "last":
            last.set()

    workers = river.Workers()
    workers.add(Ping, work)
    return workers, seen, last


def insert_in_caller_tx(url: str, client: blocking.Client, tag: str, *, commit: bool) -> None:
    """``insert_tx`` in a transaction of the caller's own connection, committed or rolled
    back: psycopg, or on SQLite apsw (the running client's library: two SQLite libraries on
    one file in one process release each other's locks)."""
    if url.startswith("sqlite"):
        conn = apsw.Connection(url.removeprefix("sqlite://"))
        conn.set_busy_timeout(5000)
        try:
            conn.execute("BEGIN IMMEDIATE")
            client.insert_tx(conn, Ping(tag=tag))
            conn.execute("COMMIT" if commit else "ROLLBACK")
        finally:
            conn.close()
        return
    with psycopg.connect(url) as pg:
        client.insert_tx(pg, Ping(tag=tag))
        if commit:
            pg.commit()
        else:
            pg.rollback()


async def test_a_running_client_picks_up_blocking_inserts_at_once(database_url: str) -> None:
    workers, seen, last = recording_workers()
    async with running(database_url, workers, fetch_poll_interval=POLL):
        with blocking.Client(database_url) as client:
            await anyio.to_thread.run_sync(client.insert, Ping(tag="last"))
            with anyio.fail_after(WAIT):
                await last.wait()
    assert seen == ["last"]


async def test_committed_tx_inserts_are_picked_up_rolled_back_ones_never(
    database_url: str,
) -> None:
    workers, seen, last = recording_workers()
    async with running(database_url, workers, fetch_poll_interval=POLL):
        with blocking.Client(database_url) as client:
            await anyio.to_thread.run_sync(
                lambda: insert_in_caller_tx(database_url, client, "undone", commit=False)
            )
            await anyio.to_thread.run_sync(
                lambda: insert_in_caller_tx(database_url, client, "last", commit=True)
            )
            with anyio.fail_after(WAIT):
                await last.wait()
            rows = await anyio.to_thread.run_sync(lambda: client.jobs.list().jobs)
    assert seen == ["last"]
    assert [r.args["tag"] for r in rows] == ["last"]


async def test_an_apsw_transaction_notifies_at_commit(sqlite_url: str) -> None:
    workers, seen, last = recording_workers()

    def insert() -> None:
        conn = apsw.Connection(sqlite_url.removeprefix("sqlite://"))
        try:
            with conn:  # a transaction committed on leaving the block
                client.insert_tx(conn, Ping(tag="last"))
        finally:
            conn.close()

    async with running(sqlite_url, workers, fetch_poll_interval=POLL):
        with blocking.Client(sqlite_url) as client:
            await anyio.to_thread.run_sync(insert)
            with anyio.fail_after(WAIT):
                await last.wait()
    assert seen == ["last"]
