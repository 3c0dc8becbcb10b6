"""The blocking client's ``*_tx`` methods inside the caller's transaction, on every kind of
connection it takes: psycopg 3, SQLAlchemy ``Connection``/``Session`` (PostgreSQL and SQLite),
apsw, and ``sqlite3``-API connections (pysqlite3; the stdlib module when its SQLite is new
enough, a clear error otherwise). Committed: the jobs and their insert notification exist.
Rolled back: neither does."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import apsw
import attrs
import psycopg
import pytest

import river_anyio as river
from river_anyio import blocking
from river_anyio.drivers import TOPIC_INSERT
from river_anyio.drivers.sqlite._connection import MIN_SQLITE_VERSION

sqlalchemy = pytest.importorskip("sqlalchemy")
dbapi2 = pytest.importorskip("pysqlite3.dbapi2")
orm = pytest.importorskip("sqlalchemy.orm")


@attrs.frozen
class Order:
    kind: ClassVar[str] = "blk_order"
    n: int = 0


@attrs.define
class Tx:
    """A caller's connection with an open transaction, and how to end it."""

    conn: Any
    commit: Callable[[], object]
    rollback: Callable[[], object]


def sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite://")


def sa_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


@contextlib.contextmanager
def caller_tx(kind: str, url: str) -> Iterator[Tx]:
    """An open transaction of ``kind`` on the database at ``url``."""
    if kind == "psycopg":
        with psycopg.connect(url) as pg:
            yield Tx(pg, pg.commit, pg.rollback)
    elif kind in ("sa-connection", "sa-session", "sa-sqlite-connection", "sa-sqlite-session"):
        if "sqlite" in kind:
            engine = sqlalchemy.create_engine(
                f"sqlite+pysqlite:///{sqlite_path(url)}", module=dbapi2
            )
        else:
            engine = sqlalchemy.create_engine(sa_url(url))
        try:
            if kind.endswith("session"):
                with orm.Session(engine) as session:
                    yield Tx(session, session.commit, session.rollback)
            else:
                with engine.connect() as sa_conn:
                    yield Tx(sa_conn, sa_conn.commit, sa_conn.rollback)
        finally:
            engine.dispose()
    elif kind == "apsw":
        conn = apsw.Connection(sqlite_path(url))
        conn.set_busy_timeout(5000)
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield Tx(conn, lambda: conn.execute("COMMIT"), lambda: conn.execute("ROLLBACK"))
        finally:
            conn.close()
    elif kind in ("pysqlite3", "pysqlite3-explicit"):
        explicit = kind == "pysqlite3-explicit"
        # legacy mode: the module begins before the first write; explicit: the caller does
        conn = dbapi2.connect(sqlite_path(url), isolation_level=None if explicit else "")
        try:
            if explicit:
                conn.execute("BEGIN")
            yield Tx(conn, conn.commit, conn.rollback)
        finally:
            conn.close()
    else:  # pragma: no cover
        raise AssertionError(kind)


def same_library(kind: str) -> dict[str, Any]:
    """The blocking client's options for a caller using ``kind``: on SQLite, its own
    connections use the caller's library (two SQLite libraries on one file in one process
    release each other's POSIX locks)."""
    if kind.startswith(("pysqlite3", "sa-sqlite")):
        return {"driver_options": {"sqlite_module": dbapi2}}
    return {}


PG_KINDS = ["psycopg", "sa-connection", "sa-session"]
SQLITE_KINDS = [
    "apsw",
    "pysqlite3",
    "pysqlite3-explicit",
    "sa-sqlite-connection",
    "sa-sqlite-session",
]


@pytest.fixture(
    params=[*(("postgres", k) for k in PG_KINDS), *(("sqlite", k) for k in SQLITE_KINDS)],
    ids=lambda p: p[1],
)
def db_and_kind(request: pytest.FixtureRequest) -> tuple[str, str]:
    backend, kind = request.param
    url = request.getfixturevalue("pg_url" if backend == "postgres" else "sqlite_url")
    return str(url), kind


class Notifications:
    """The insert notifications sent on the database, in order (PostgreSQL: a LISTEN
    connection; SQLite: the outbox)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._pg: psycopg.Connection[Any] | None = None
        if url.startswith("postgresql"):
            self._pg = psycopg.connect(url, autocommit=True)
            # River's channel: the topic prefixed with the schema (current_schema() here)
            self._pg.execute(f'LISTEN "public.{TOPIC_INSERT}"')

    def queues_until(self, queue: str) -> list[str]:
        """The queues notified, up to and including the first notification for ``queue``."""
        seen: list[str] = []
        if self._pg is not None:
            for n in self._pg.notifies(timeout=10):
                seen.append(json.loads(n.payload)["queue"])
                if seen[-1] == queue:
                    return seen
            raise AssertionError(f"no notification for {queue!r} (saw {seen})")
        conn = apsw.Connection(sqlite_path(self._url))
        try:
            rows = conn.execute(
                "SELECT payload FROM river_notification WHERE topic = ? ORDER BY id",
                (TOPIC_INSERT,),
            ).fetchall()
        finally:
            conn.close()
        for (payload,) in rows:
            seen.append(json.loads(payload)["queue"])
            if seen[-1] == queue:
                return seen
        raise AssertionError(f"no notification for {queue!r} (saw {seen})")

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()


@pytest.fixture
def notifications(db_and_kind: tuple[str, str]) -> Iterator[Notifications]:
    n = Notifications(db_and_kind[0])
    yield n
    n.close()


def test_committed_jobs_and_notification_exist(
    db_and_kind: tuple[str, str], notifications: Notifications
) -> None:
    url, kind = db_and_kind
    with blocking.Client(url, **same_library(kind)) as client, caller_tx(kind, url) as tx:
        one = client.insert_tx(tx.conn, Order(n=1), river.InsertOpts(queue="committed"))
        many = client.insert_many_tx(tx.conn, [Order(n=2), Order(n=3)])
        fast = client.insert_many_fast_tx(tx.conn, [Order(n=4), Order(n=5)])
        assert (len(many), fast) == (2, 2)
        assert client.jobs.get_tx(tx.conn, one.job.id).args == {"n": 1}  # in the transaction
        assert client.jobs.list().jobs == []  # not yet visible outside it
        tx.commit()
        jobs = client.jobs.list(kinds=["blk_order"]).jobs
        assert sorted(j.args["n"] for j in jobs) == [1, 2, 3, 4, 5]
        assert client.jobs.get(one.job.id).queue == "committed"
    assert "committed" in notifications.queues_until("committed")


def test_rolled_back_jobs_and_notification_do_not(
    db_and_kind: tuple[str, str], notifications: Notifications
) -> None:
    url, kind = db_and_kind
    with blocking.Client(url, **same_library(kind)) as client:
        with caller_tx(kind, url) as tx:
            gone = client.insert_tx(tx.conn, Order(n=1), river.InsertOpts(queue="rolled_back"))
            client.insert_many_tx(
                tx.conn, [river.InsertManyParams(Order(n=2), river.InsertOpts(queue="rolled_back"))]
            )
            client.insert_many_fast_tx(
                tx.conn, [river.InsertManyParams(Order(n=3), river.InsertOpts(queue="rolled_back"))]
            )
            tx.rollback()
        with pytest.raises(river.NotFoundError):
            client.jobs.get(gone.job.id)
        kept = client.insert(Order(n=9), river.InsertOpts(queue="after")).job
        assert [j.id for j in client.jobs.list().jobs] == [kept.id]
    # notifications arrive in commit order: one of the rolled-back batch would come first
    assert notifications.queues_until("after") == ["after"]


def test_control_calls_follow_the_callers_transaction(pg_url: str) -> None:
    with blocking.Client(pg_url) as client:
        job = client.insert(Order()).job
        with psycopg.connect(pg_url) as conn:
            assert client.jobs.cancel_tx(conn, job.id).state is river.JobState.CANCELLED
            conn.rollback()
        assert client.jobs.get(job.id).state is river.JobState.AVAILABLE
        with psycopg.connect(pg_url) as conn:
            client.jobs.delete_tx(conn, job.id)
        with pytest.raises(river.NotFoundError):
            client.jobs.get(job.id)


def test_an_old_stdlib_sqlite3_is_refused_clearly(sqlite_url: str) -> None:
    if sqlite3.sqlite_version_info >= MIN_SQLITE_VERSION:
        pytest.skip(f"this Python's sqlite3 links SQLite {sqlite3.sqlite_version}")
    path = sqlite_path(sqlite_url)
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    with blocking.Client(sqlite_url) as client, contextlib.closing(sqlite3.connect(path)) as conn:
        with pytest.raises(river.ConfigError) as err:
            client.insert_tx(conn, Order())
        message = str(err.value)
        assert f"SQLite {sqlite3.sqlite_version}" in message
        assert "pysqlite3-binary" in message and "apsw" in message
        with engine.connect() as sa_conn, pytest.raises(river.ConfigError, match="pysqlite3"):
            client.insert_tx(sa_conn, Order())
        assert client.jobs.list().jobs == []
    engine.dispose()


def test_a_connection_of_the_other_database_is_refused(pg_url: str, sqlite_url: str) -> None:
    with blocking.Client(sqlite_url) as client, psycopg.connect(pg_url) as pg:
        with pytest.raises(TypeError, match="on SQLite takes"):
            client.insert_tx(pg, Order())
    with blocking.Client(pg_url) as client:
        conn = apsw.Connection(sqlite_path(sqlite_url))
        with pytest.raises(TypeError, match="on PostgreSQL takes"):
            client.insert_tx(conn, Order())
        conn.close()
