"""The PostgreSQL side of the blocking client: blocking psycopg 3 connections under the
async driver's own executor.

:class:`PostgresExecutor` runs every statement of River's PostgreSQL driver (its ``Queries``,
parameter building and row decoding). Here it is handed a facade with the
``psycopg.AsyncConnection`` surface it uses, over a blocking ``psycopg.Connection``: each
awaited call returns at once, so :func:`~._drive.drive` runs the executor's coroutines to
their end in the calling thread.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from typing import Any, Literal, cast

import psycopg
from psycopg import pq
from psycopg.rows import tuple_row

from .._errors import PoolTimeoutError
from .._sqlalchemy import sync_dbapi_connection
from ..drivers.postgres import PostgresExecutor
from ..drivers.postgres import _scrubbed as scrubbed
from ..drivers.postgres._capabilities import ServerCapabilities, detect_capabilities_sync
from ..drivers.postgres._errors import map_errors
from ..drivers.postgres._queries import Queries
from ._drive import other_schema_error

__all__ = ["BlockingPostgresDriver", "SyncPool"]

logger = logging.getLogger("river_anyio.driver")

_IDLE = pq.TransactionStatus.IDLE


class _Copy:
    __slots__ = ("_copy",)

    def __init__(self, copy: psycopg.Copy) -> None:
        self._copy = copy

    async def write(self, data: Any) -> None:
        self._copy.write(data)


class _Cursor:
    """The ``psycopg.AsyncCursor`` surface the executor uses, over a blocking cursor."""

    __slots__ = ("_cur",)

    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self._cur = cur

    async def execute(self, query: Any, params: Any = None, **kw: Any) -> _Cursor:
        self._cur.execute(query, params, **kw)
        return self

    @property
    def pgresult(self) -> Any:
        return self._cur.pgresult

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    async def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    async def fetchone(self) -> Any:
        return self._cur.fetchone()

    @asynccontextmanager
    async def copy(self, statement: Any) -> AsyncIterator[_Copy]:
        with self._cur.copy(statement) as copy:
            yield _Copy(copy)


class AsyncFacade:
    """The ``psycopg.AsyncConnection`` surface :class:`PostgresExecutor` uses, over a
    blocking connection (every call completes before it returns)."""

    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    @property
    def pgconn(self) -> pq.abc.PGconn:
        return self.conn.pgconn

    @property
    def closed(self) -> bool:
        return self.conn.closed

    def cursor(self, *, binary: bool = False) -> _Cursor:
        return _Cursor(self.conn.cursor(binary=binary))

    async def execute(self, query: Any, params: Any = None, **kw: Any) -> _Cursor:
        return _Cursor(self.conn.execute(query, params, **kw))


class _CallerFacade(AsyncFacade):
    """:class:`AsyncFacade` over a caller's connection, which may have its own cursor class
    and loaders (Django's: client-side binding, ``jsonb`` as text, ``timestamptz`` naive when
    ``USE_TZ = False``): River's statements run on plain cursors with psycopg's own loaders
    for the types River reads, as on the client's own connections."""

    __slots__ = ()

    def cursor(self, *, binary: bool = False) -> _Cursor:
        cur = psycopg.Cursor(self.conn, row_factory=tuple_row)
        if binary:
            cur.format = pq.Format.BINARY
        for name in _RIVER_TYPES:
            oid = psycopg.adapters.types[name].oid
            for fmt in (pq.Format.TEXT, pq.Format.BINARY):
                loader = psycopg.adapters.get_loader(oid, fmt)
                if loader is not None and cur.adapters.get_loader(oid, fmt) is not loader:
                    cur.adapters.register_loader(oid, loader)
        return _Cursor(cur)

    async def execute(self, query: Any, params: Any = None, **kw: Any) -> _Cursor:
        return await self.cursor().execute(query, params, **kw)


#: The types of River's columns whose loaders an application may have replaced.
_RIVER_TYPES = ("timestamptz", "jsonb", "json")


def executor_on(queries: Queries, conn: psycopg.Connection[Any]) -> PostgresExecutor:
    """River's PostgreSQL executor on a blocking connection."""
    return PostgresExecutor(queries, conn=cast("psycopg.AsyncConnection[Any]", AsyncFacade(conn)))


def caller_executor(queries: Queries, conn: psycopg.Connection[Any]) -> PostgresExecutor:
    """River's PostgreSQL executor on a caller's connection, in the caller's transaction."""
    return PostgresExecutor(queries, conn=cast("psycopg.AsyncConnection[Any]", _CallerFacade(conn)))


class SyncPool:
    """A thread-safe pool of autocommit ``psycopg.Connection`` (``TimeZone=UTC``): at most
    ``max_size`` open, the most recently returned reused first, opened on demand."""

    def __init__(
        self,
        conninfo: str,
        *,
        max_size: int,
        acquire_timeout: float,
        connect_timeout: float,
        prepare_threshold: int | None,
        raw_url: str,
    ) -> None:
        self._conninfo = conninfo
        self._max_size = max_size
        self._acquire_timeout = acquire_timeout
        self._connect_timeout = connect_timeout
        self._prepare_threshold = prepare_threshold
        self._raw_url = raw_url
        self._slots = threading.BoundedSemaphore(max_size)
        self._lock = threading.Lock()
        self._idle: list[psycopg.Connection[Any]] = []
        self._closed = False

    def getconn(self) -> psycopg.Connection[Any]:
        """A connection; give it back with :meth:`putconn`. :class:`PoolTimeoutError` when
        none is free within the acquire timeout."""
        if self._closed:
            raise psycopg.OperationalError("the blocking client is closed")
        if not self._slots.acquire(timeout=self._acquire_timeout):
            raise PoolTimeoutError(
                f"no connection became free within {self._acquire_timeout:g}s "
                f"(pool max size {self._max_size})"
            )
        try:
            with self._lock:
                while self._idle:
                    conn = self._idle.pop()
                    if not conn.closed:
                        return conn
            try:
                return psycopg.Connection.connect(
                    self._conninfo,
                    autocommit=True,
                    prepare_threshold=self._prepare_threshold,
                    connect_timeout=math.ceil(self._connect_timeout),
                )
            except psycopg.Error as exc:
                raise scrubbed(exc, self._raw_url) from exc.__cause__
        except BaseException:
            self._slots.release()
            raise

    def putconn(self, conn: psycopg.Connection[Any]) -> None:
        """Give a connection back: kept when idle and healthy, closed otherwise."""
        try:
            keep = not self._closed and not conn.closed and not conn.broken
            if keep and conn.pgconn.transaction_status != _IDLE:
                try:
                    conn.rollback()
                except psycopg.Error:
                    keep = False
                keep = keep and conn.pgconn.transaction_status == _IDLE
            if keep:
                with self._lock:
                    if not self._closed:
                        self._idle.append(conn)
                        return
            conn.close()
        finally:
            self._slots.release()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        conn = self.getconn()
        try:
            yield conn
        finally:
            self.putconn(conn)

    def close(self) -> None:
        """Close the idle connections; those in use are closed when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _PoolFacade:
    """:class:`SyncPool` with the async ``getconn``/``putconn`` the executor awaits."""

    __slots__ = ("_pool",)

    def __init__(self, pool: SyncPool) -> None:
        self._pool = pool

    async def getconn(self) -> AsyncFacade:
        return AsyncFacade(self._pool.getconn())

    async def putconn(self, conn: AsyncFacade) -> None:
        self._pool.putconn(conn.conn)


class BlockingPostgresDriver:
    """The driver surface the async :class:`~river_anyio.Client` uses, on a :class:`SyncPool`
    (every awaited call completes before it returns).

    The server (see ``ServerCapabilities``: YugabyteDB sends no notifications and writes
    unique inserts with a nonce) is identified on the first connection the driver uses,
    once; the pool opens connections on demand, so nothing connects before that."""

    def __init__(self, pool: SyncPool, schema: str | None) -> None:
        self._pool = pool
        self._schema = schema
        self._lock = threading.Lock()
        self._detected: tuple[Queries, PostgresExecutor] | None = None

    def _for_server(self, conn: psycopg.Connection[Any] | None = None) -> Queries:
        """The statements for the server, identified on ``conn`` (a pooled connection when
        None) the first time. Not under the lock while querying: the caller may hold the
        pool's only connection; racing detections agree, and the first one is kept."""
        detected = self._detected
        if detected is None:
            with map_errors():
                if conn is None:
                    with self._pool.connection() as pooled:
                        capabilities = detect_capabilities_sync(pooled)
                else:
                    capabilities = detect_capabilities_sync(conn)
            queries = Queries(self._schema, capabilities)
            executor = PostgresExecutor(queries, pool=cast(Any, _PoolFacade(self._pool)))
            with self._lock:
                if self._detected is None:
                    self._detected = (queries, executor)
                detected = self._detected
        return detected[0]

    @property
    def dialect(self) -> Literal["postgres"]:
        return "postgres"

    @property
    def schema(self) -> str | None:
        return self._schema

    @property
    def supports_listen_notify(self) -> bool:
        """Whether the server delivers notifications (identifying it first)."""
        return self._for_server().notify

    @property
    def capabilities(self) -> ServerCapabilities:
        """The server, identified on the driver's first connection."""
        return self._for_server().capabilities

    def with_schema(self, schema: str | None) -> BlockingPostgresDriver:
        """The driver itself for its own schema (see :func:`other_schema_error`)."""
        if schema == self.schema:
            return self
        raise other_schema_error(schema)

    def executor(self) -> PostgresExecutor:
        self._for_server()
        assert self._detected is not None
        return self._detected[1]

    def transaction(self) -> AbstractAsyncContextManager[PostgresExecutor]:
        return self._transaction()

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[PostgresExecutor]:
        with map_errors():
            conn = self._pool.getconn()
            try:
                queries = self._for_server(conn)
                with conn.transaction():
                    yield executor_on(queries, conn)
            finally:
                self._pool.putconn(conn)

    def executor_for(self, conn: object) -> PostgresExecutor:
        """An executor inside the caller's transaction: a blocking ``psycopg.Connection`` or
        an SQLAlchemy ``Connection``/``Session`` on ``postgresql+psycopg``."""
        if isinstance(conn, PostgresExecutor) and isinstance(
            cast(Any, conn.connection), AsyncFacade
        ):
            return conn
        if isinstance(conn, psycopg.Connection):
            return caller_executor(self._for_server(conn), conn)
        if isinstance(conn, psycopg.AsyncConnection):
            raise TypeError(
                "river_anyio.blocking.Client takes a blocking psycopg.Connection; insert with "
                "an async connection through river_anyio.Client instead"
            )
        raw = sync_dbapi_connection(conn)
        if isinstance(raw, psycopg.Connection):
            return caller_executor(self._for_server(raw), raw)
        if raw is not None:
            raise TypeError(
                "the SQLAlchemy connection is not on psycopg 3 (use a postgresql+psycopg:// "
                f"engine), its DBAPI connection is {_name(raw)}"
            )
        raise TypeError(
            "insert_tx() on PostgreSQL takes a psycopg.Connection or an SQLAlchemy "
            f"Connection/Session (postgresql+psycopg), not {_name(conn)}"
        )

    def listener(self) -> Any:
        raise TypeError("the blocking client does not listen for notifications")

    async def aclose(self) -> None:
        self._pool.close()


def _name(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"
