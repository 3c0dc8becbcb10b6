"""The SQLite side of the blocking client: the async driver's own executor on blocking
connections.

:class:`SQLiteExecutor` does every operation as one synchronous function of a connection
(``fn(conn)``, River's statements from the driver's ``Queries``), handed to the connection's
owner to run. Here the owner runs it at once in the calling thread, on a pooled apsw
connection or on the caller's own connection (apsw, or a ``sqlite3``-API connection seen
through a small adapter), so :func:`~._drive.drive` runs the executor's coroutines to their end.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final, Literal, TypeVar, cast

import apsw

from .._errors import (
    ConfigError,
    ConnectionLostError,
    PoolTimeoutError,
)
from .._sqlalchemy import sync_dbapi_connection
from ..drivers.sqlite import SQLiteExecutor
from ..drivers.sqlite._connection import _MEMDB_URI as MEMDB_URI
from ..drivers.sqlite._connection import (
    MEMORY,
    TransactionLostError,
    quote_ident,
    rollback_quietly,
)
from ..drivers.sqlite._dbapi import (
    Sqlite3AsApsw,
    check_sqlite3_version,
    dbapi_translator,
    open_dbapi,
    sqlite3_module,
)
from ..drivers.sqlite._errors import translate
from ..drivers.sqlite._queries import Queries
from ._drive import other_schema_error

__all__ = ["SQLitePool", "BlockingSQLiteDriver"]

logger = logging.getLogger("river_anyio.driver")

T = TypeVar("T")

#: ``sqlite3.LEGACY_TRANSACTION_CONTROL`` (Python 3.12+): the module begins before writes.
_LEGACY: Final = -1


def open_apsw(path: str, *, busy_timeout: float, attach: dict[str, str]) -> apsw.Connection:
    """A read-write connection to River's database file (or the process's in-memory database,
    shared with the async drivers), set up as the async driver's."""
    if path == MEMORY:
        conn = apsw.Connection(
            MEMDB_URI,
            flags=apsw.SQLITE_OPEN_URI | apsw.SQLITE_OPEN_CREATE | apsw.SQLITE_OPEN_READWRITE,
        )
        try:
            conn.set_busy_timeout(int(busy_timeout * 1000))
            conn.pragma("foreign_keys", 1)
        except BaseException:
            conn.close()
            raise
        return conn
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise ConfigError(
            "database_url",
            f"directory {parent!r} does not exist (the driver does not create directories)",
            path,
        )
    conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE)
    try:
        conn.set_busy_timeout(int(busy_timeout * 1000))
        conn.pragma("foreign_keys", 1)
        for name, other in attach.items():
            conn.execute(f"ATTACH DATABASE ? AS {quote_ident(name)}", (other,))
        for schema in ("main", *attach):
            if str(conn.pragma("journal_mode", schema=schema)).lower() != "wal":
                conn.pragma("journal_mode", "wal", schema=schema)
            conn.pragma("synchronous", "normal", schema=schema)
    except BaseException:
        conn.close()
        raise
    return conn


class SQLitePool:
    """A thread-safe pool of connections to one file (apsw, or of the ``sqlite3``-API module
    given), each used by one thread at a time."""

    def __init__(
        self,
        path: str,
        *,
        max_size: int,
        acquire_timeout: float,
        busy_timeout: float,
        attach: dict[str, str],
        module: Any = None,
    ) -> None:
        self.path = path
        self._max_size = max_size
        self._acquire_timeout = acquire_timeout
        self._busy_timeout = busy_timeout
        self._attach = attach
        self._module = module
        #: What an error of these connections becomes (None: not a database error).
        self.translate_error = _apsw_error if module is None else dbapi_translator(module)
        self._slots = threading.BoundedSemaphore(max_size)
        self._lock = threading.Lock()
        self._idle: list[Any] = []
        self._closed = False

    def _open(self) -> Any:
        if self._module is None:
            return open_apsw(self.path, busy_timeout=self._busy_timeout, attach=self._attach)
        return open_dbapi(
            self._module, self.path, busy_timeout=self._busy_timeout, attach=self._attach
        )

    def get(self) -> Any:
        if self._closed:
            raise ConnectionLostError("sqlite: the blocking client is closed")
        if not self._slots.acquire(timeout=self._acquire_timeout):
            raise PoolTimeoutError(
                f"no connection became free within {self._acquire_timeout:g}s "
                f"(pool max size {self._max_size})"
            )
        try:
            with self._lock:
                if self._idle:
                    return self._idle.pop()
            try:
                return self._open()
            except Exception as exc:
                mapped = self.translate_error(exc)
                if mapped is None:
                    raise
                raise mapped from exc
        except BaseException:
            self._slots.release()
            raise

    def put(self, conn: Any) -> None:
        try:
            try:
                rollback_quietly(conn)
            except Exception:  # a sqlite3-API error rolling back: the connection is dropped
                logger.warning("sqlite: ROLLBACK failed; closing the connection", exc_info=True)
            with self._lock:
                if not self._closed and not conn.in_transaction:
                    self._idle.append(conn)
                    return
            conn.close()
        finally:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _PoolRunner:
    """The executor's connection owner for calls outside a transaction: each runs at once on
    a pooled connection."""

    __slots__ = ("_pool",)

    def __init__(self, pool: SQLitePool) -> None:
        self._pool = pool

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        pool = self._pool
        conn = pool.get()
        try:
            return fn(conn, *args)
        except Exception as exc:
            mapped = pool.translate_error(exc)
            if mapped is None:
                raise
            raise mapped from exc
        finally:
            pool.put(conn)  # an open transaction is rolled back


class _Session:
    """The executor's session inside a transaction: each call runs at once on ``conn``,
    after ``begin`` (once, when given and no transaction is open; ``begun`` then)."""

    __slots__ = ("begin", "begun", "conn", "ended", "notified", "translate_error")

    def __init__(
        self,
        conn: Any,
        *,
        begin: Callable[[], None] | None,
        translate_error: Callable[[BaseException], BaseException | None],
    ) -> None:
        self.conn = conn
        self.begin = begin
        self.begun = False
        #: The transaction block ended: its executor may not be used any more.
        self.ended = False
        self.notified = False
        self.translate_error = translate_error

    async def run(self, fn: Callable[..., T]) -> T:
        try:
            if self.begun:
                if not self.conn.in_transaction:
                    raise TransactionLostError(
                        "sqlite: the transaction is no longer open (SQLite rolled it back "
                        "after an interrupted or failed statement); nothing of it was committed"
                    )
            elif self.begin is not None and not self.conn.in_transaction:
                self.begin()
                self.begun = True
            return fn(self.conn)
        except Exception as exc:
            mapped = self.translate_error(exc)
            if mapped is None:
                raise
            raise mapped from exc


def _apsw_error(exc: BaseException) -> BaseException | None:
    return translate(exc) if isinstance(exc, apsw.Error) else None


class BlockingSQLiteDriver:
    """The driver surface the async :class:`~river_anyio.Client` uses, on an :class:`SQLitePool`
    (every awaited call completes before it returns)."""

    def __init__(self, pool: SQLitePool, schema: str | None) -> None:
        self._pool = pool
        self._schema = schema
        self._queries = Queries(schema)
        self._runner = _PoolRunner(pool)
        self._executor = SQLiteExecutor(cast(Any, self._runner), self._queries)

    @property
    def dialect(self) -> Literal["sqlite"]:
        return "sqlite"

    @property
    def schema(self) -> str | None:
        return self._schema

    @property
    def supports_listen_notify(self) -> bool:
        return True

    def with_schema(self, schema: str | None) -> BlockingSQLiteDriver:
        """The driver itself for its own schema (see :func:`other_schema_error`)."""
        if schema == self.schema:
            return self
        raise other_schema_error(schema)

    def executor(self) -> SQLiteExecutor:
        return self._executor

    def _on(self, session: _Session) -> SQLiteExecutor:
        return SQLiteExecutor(cast(Any, self._runner), self._queries, session=cast(Any, session))

    def transaction(self) -> AbstractAsyncContextManager[SQLiteExecutor]:
        return self._transaction()

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[SQLiteExecutor]:
        conn = self._pool.get()
        try:
            session = _Session(
                conn,
                begin=lambda: _execute(conn, "BEGIN IMMEDIATE"),
                translate_error=self._pool.translate_error,
            )
            tx = self._on(session)
            try:
                yield tx
            finally:
                session.ended = True
            if session.begun:
                try:
                    conn.execute("COMMIT")
                except Exception as exc:
                    mapped = self._pool.translate_error(exc)
                    if mapped is None:
                        raise
                    raise mapped from exc
        finally:
            self._pool.put(conn)  # rolls back whatever is still open

    def executor_for(self, conn: object) -> SQLiteExecutor:
        """An executor inside the caller's transaction: an ``apsw.Connection``, a
        ``sqlite3``-API connection (stdlib ``sqlite3`` linking SQLite >= 3.47, or
        ``pysqlite3``), or an SQLAlchemy ``Connection``/``Session`` on one."""
        if isinstance(conn, SQLiteExecutor) and cast(Any, conn._writer) is self._runner:
            return conn
        if isinstance(conn, apsw.Connection):
            return self._on(_Session(conn, begin=None, translate_error=_apsw_error))
        mod = sqlite3_module(conn)
        if mod is None:
            raw = sync_dbapi_connection(conn)
            if raw is None:
                raise TypeError(
                    "insert_tx() on SQLite takes an apsw.Connection, a sqlite3 (or pysqlite3) "
                    "connection, or an SQLAlchemy Connection/Session on one, not "
                    f"{type(conn).__module__}.{type(conn).__qualname__}"
                )
            return self.executor_for(raw)
        check_sqlite3_version(mod)
        return self._on(
            _Session(
                Sqlite3AsApsw(conn),
                begin=_legacy_begin(conn),
                translate_error=dbapi_translator(mod),
            )
        )

    def listener(self) -> Any:
        raise TypeError("the blocking client does not listen for notifications")

    async def aclose(self) -> None:
        self._pool.close()


def _legacy_begin(conn: Any) -> Callable[[], None] | None:
    """What the ``sqlite3`` module does before a write in its default (legacy) transaction
    mode: ``BEGIN`` (with the connection's isolation level) when none is open. None when the
    connection is in autocommit mode (``isolation_level=None``): the caller begins."""
    if getattr(conn, "autocommit", _LEGACY) != _LEGACY:
        return None  # Python 3.12's autocommit=False keeps a transaction open; True: caller's
    level = getattr(conn, "isolation_level", None)
    if level is None:
        return None
    return lambda: _execute(conn, f"BEGIN {level}".strip())


def _execute(conn: Any, sql: str) -> None:
    conn.execute(sql)
