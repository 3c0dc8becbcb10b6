"""YugabyteDB, detected as River Go detects it, on PostgreSQL made to look like it the way
River's own tests (and the conformance harness) simulate it: functions in a schema ahead of
``pg_catalog`` on the ``search_path`` shadow ``version()`` with a Yugabyte version,
``current_setting()`` with one lacking ``yb_enable_listen_notify``, and ``pg_notify()`` with
one that raises, so any notification fails the statement sending it.

On such a server the driver sends no notifications, writes unique inserts with a metadata
nonce (YugabyteDB has no ``xmax``), and a client polls for new jobs, queue settings and the
cancellations of its running jobs instead of listening. Every test runs on asyncio and trio.
"""

from __future__ import annotations

import datetime as dt
import urllib.parse
from collections.abc import AsyncIterator
from typing import ClassVar

import anyio
import attrs
import psycopg
import pytest

import river_anyio as river
from river_anyio import blocking
from river_anyio.drivers.postgres import ServerCapabilities, open_postgres

pytestmark = pytest.mark.anyio

K = river.EventKind
S = river.JobState
YB_VERSION = "PostgreSQL 15.12-YB-2025.2.1.0-b1"
NONCE = "river:unique_nonce"


def _simulate(url: str, *, listen_notify: str | None = None) -> str:
    """Make the database at ``url`` look like YugabyteDB (``yb_enable_listen_notify``: the
    setting's value, None for a server without it) and return the URL whose sessions see it
    (``public`` ahead of ``pg_catalog``)."""
    setting = "NULL::text" if listen_notify is None else f"'{listen_notify}'::text"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"""
            CREATE FUNCTION public.version() RETURNS text LANGUAGE sql
                AS $$ SELECT '{YB_VERSION}'::text $$;
            CREATE FUNCTION public.current_setting(setting_name text, missing_ok boolean)
                RETURNS text LANGUAGE sql AS $$
                SELECT CASE WHEN setting_name = 'yb_enable_listen_notify' THEN {setting}
                ELSE pg_catalog.current_setting(setting_name, missing_ok) END $$;
            CREATE FUNCTION public.pg_notify(text, text) RETURNS void LANGUAGE plpgsql AS $$
                BEGIN RAISE EXCEPTION 'LISTEN/NOTIFY is unavailable'; END $$;
            """
        )
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.urlencode(
        {"options": "-c search_path=public,pg_catalog"}, quote_via=urllib.parse.quote
    )
    return urllib.parse.urlunsplit(parts._replace(query=query))


@pytest.fixture
def yb_url(pg_url: str) -> str:
    return _simulate(pg_url)


@attrs.frozen
class Unique:
    kind: ClassVar[str] = "yb_unique"
    n: int = 0

    @staticmethod
    def insert_opts() -> river.InsertOpts:
        return river.InsertOpts(unique=river.UniqueOpts(by_args=True))


@attrs.frozen
class Plain:
    kind: ClassVar[str] = "yb_plain"
    n: int = 0


def test_yugabyte_is_recognised_by_its_version_and_setting() -> None:
    read = ServerCapabilities.from_server
    pg = read("PostgreSQL 16.4 on x86_64-pc-linux-gnu", 160004, False)
    assert (pg.yugabyte, pg.listen_notify, pg.unique_nonce) == (False, True, False)
    old = read(YB_VERSION, 150012, False)
    assert (old.yugabyte, old.listen_notify, old.unique_nonce) == (True, False, True)
    enabled = read("PostgreSQL 15.12-YB-2025.2.3.0-b1", 150012, True)
    assert (enabled.yugabyte, enabled.listen_notify, enabled.unique_nonce) == (True, True, True)
    assert read("YugabyteDB", 150012, False).yugabyte


async def test_plain_postgres_is_detected(pg_url: str) -> None:
    async with open_postgres(pg_url) as driver:
        caps = driver.capabilities
        assert not caps.yugabyte and caps.listen_notify and not caps.unique_nonce
        assert caps.version_num >= 100000 and caps.product.startswith("PostgreSQL")
        assert driver.supports_listen_notify


async def test_simulated_yugabyte_is_detected(yb_url: str) -> None:
    async with open_postgres(yb_url) as driver:
        caps = driver.capabilities
        assert (caps.product, caps.yugabyte, caps.listen_notify) == (YB_VERSION, True, False)
        assert caps.unique_nonce and not driver.supports_listen_notify


async def test_yugabyte_with_notifications_enabled_listens(pg_url: str) -> None:
    async with open_postgres(_simulate(pg_url, listen_notify="on")) as driver:
        assert driver.capabilities.yugabyte and driver.supports_listen_notify


@pytest.fixture
async def yb_client(yb_url: str) -> AsyncIterator[river.ClientRun]:
    async with river.open_client(yb_url) as run:
        yield run


async def test_unique_inserts_carry_a_nonce_and_return_the_existing_job(
    yb_client: river.ClientRun,
) -> None:
    client = yb_client.client
    first = await client.insert(Unique(n=1))
    again = await client.insert(Unique(n=1))
    assert not first.unique_skipped_as_duplicate
    assert (again.job.id, again.unique_skipped_as_duplicate) == (first.job.id, True)
    assert again.job.metadata[NONCE] == first.job.metadata[NONCE]
    assert len(first.job.metadata[NONCE]) == 16
    # in a batch: a new job and the existing one (a key repeated within one batch is refused
    # before anything is written, as River refuses it)
    results = await client.insert_many([Unique(n=2), Unique(n=1), Plain()])
    assert [r.unique_skipped_as_duplicate for r in results] == [False, True, False]
    assert results[1].job.id == first.job.id
    assert NONCE in results[2].job.metadata
    with pytest.raises(river.ValidationError, match="more than once in batch"):
        await client.insert_many([Unique(n=3), Unique(n=3)])


async def test_no_notification_is_sent(yb_client: river.ClientRun) -> None:
    """Every operation that notifies on PostgreSQL succeeds without calling pg_notify."""
    client = yb_client.client
    ex = client.driver.executor()
    await ex.queue_create_or_set_updated_at(name="default")
    inserted = await client.insert(Plain())
    await client.insert_many([Plain(n=1), Plain(n=2)])
    await client.queues.pause("default")
    await client.queues.resume("default")
    await client.queues.update("default", metadata={"a": 1})
    cancelled = await client.jobs.cancel(inserted.job.id)
    assert cancelled.state is S.CANCELLED
    await ex.notify_many("river_insert", ['{"queue": "default"}'])
    leader = await ex.leader_attempt_elect(leader_id="yb", ttl=10)
    assert leader is not None
    assert await ex.leader_resign(leader_id="yb", elected_at=leader.elected_at)


async def test_a_client_polls_for_jobs_settings_and_cancellations(
    yb_url: str, yb_client: river.ClientRun
) -> None:
    """A worker on YugabyteDB without notifications (and without ``poll_only``) finds jobs
    another client inserts, and notices another client's cancellation of its running job and
    pause of its queue, by polling."""
    other = yb_client.client
    started = anyio.Event()
    workers = river.Workers()

    @workers.register(Plain)
    async def work(ctx: river.WorkContext, job: river.Job[Plain]) -> None:
        if job.args.n == 1:
            started.set()
            await anyio.sleep_forever()

    async with river.open_client(
        yb_url,
        queues={"default": river.QueueConfig(max_workers=2)},
        workers=workers,
        fetch_poll_interval=0.1,
        leader_election_disabled=True,
    ) as run:
        assert run.health().notifier_connected is None  # nothing to listen to
        with run.subscribe(K.JOB_CANCELLED, K.QUEUE_PAUSED) as events:
            res = await other.insert(Plain(n=1))
            with anyio.fail_after(10):
                await started.wait()
            at = anyio.current_time()
            await other.jobs.cancel(res.job.id)
            with anyio.fail_after(10):
                ev = await events.__anext__()
            assert ev.kind is K.JOB_CANCELLED and ev.job is not None
            assert ev.job.id == res.job.id
            assert anyio.current_time() - at < 6  # the two-second cancellation poll
            await other.queues.pause("default")
            with anyio.fail_after(10):
                ev = await events.__anext__()
            assert ev.kind is K.QUEUE_PAUSED
        row = await other.jobs.get(res.job.id)
    assert row.state is S.CANCELLED
    assert row.finalized_at is not None and row.finalized_at <= dt.datetime.now(dt.UTC)


def test_the_blocking_client_detects_yugabyte(yb_url: str) -> None:
    """The blocking client identifies the server on its first connection: its inserts send
    no notification, and a duplicate unique insert returns the existing job (by its nonce),
    in its own transaction or in the caller's."""
    with blocking.Client(yb_url) as client:
        first = client.insert(Unique(n=1))
        again = client.insert(Unique(n=1))
        assert not first.unique_skipped_as_duplicate and NONCE in first.job.metadata
        assert (again.job.id, again.unique_skipped_as_duplicate) == (first.job.id, True)
        assert not client.insert(Plain()).unique_skipped_as_duplicate
        with psycopg.connect(yb_url, autocommit=True) as conn, conn.transaction():
            inside = client.insert_tx(conn, Unique(n=1))
        assert (inside.job.id, inside.unique_skipped_as_duplicate) == (first.job.id, True)
