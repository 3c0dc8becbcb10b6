"""The PostgreSQL driver: psycopg 3 driven through AnyIO, so it runs under asyncio and trio.

Use :func:`open_postgres`::

    async with open_postgres("postgresql://localhost/app", schema="river") as driver:
        async with driver.transaction() as tx:
            await tx.job_insert_fast_many(jobs)

Every connection is in autocommit mode with ``TimeZone=UTC``; transactions are explicit
(:meth:`PostgresDriver.transaction`, or a caller's own through
:meth:`PostgresDriver.executor_for`).
"""

from __future__ import annotations

import asyncio
import math
import re
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal

import anyio
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..._errors import ConfigError
from ._connection import AnyioConnection, shielded_transaction
from ._errors import map_errors
from ._executor import PostgresExecutor
from ._listener import PostgresListener
from ._pool import Pool, PoolStatistics
from ._queries import Queries

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

__all__ = [
    "AnyioConnection",
    "Pool",
    "PoolStatistics",
    "PostgresDriver",
    "PostgresExecutor",
    "PostgresListener",
    "open_postgres",
    "shielded_transaction",
]

if TYPE_CHECKING:
    from .._protocol import Driver, Executor, Listener

    def _conforms(
        d: PostgresDriver, e: PostgresExecutor, li: PostgresListener
    ) -> tuple[Driver, Executor, Listener]:
        return d, e, li  # mypy checks the classes against the protocols


_SCHEMA_RE = re.compile(r"\A[a-zA-Z_][a-zA-Z0-9_]*\Z")
#: 63 (PostgreSQL's identifier limit) - 1 (".") - len("river_leadership"): the schema
#: prefixes notification channel names.
_SCHEMA_MAX = 46


class PostgresDriver:
    """A River driver on a pool of PostgreSQL connections (see :func:`open_postgres`)."""

    def __init__(self, pool: Pool, schema: str | None) -> None:
        self._pool = pool
        self._queries = Queries(schema)
        self._executor = PostgresExecutor(self._queries, pool=pool)

    @property
    def dialect(self) -> Literal["postgres"]:
        return "postgres"

    @property
    def schema(self) -> str | None:
        return self._queries.schema

    @property
    def supports_listen_notify(self) -> bool:
        return True

    @property
    def pool(self) -> Pool:
        return self._pool

    def statistics(self) -> PoolStatistics:
        """The connection pool's statistics."""
        return self._pool.statistics()

    def executor(self) -> PostgresExecutor:
        """An executor whose every call runs on a pooled connection in autocommit."""
        return self._executor

    def transaction(self) -> AbstractAsyncContextManager[PostgresExecutor]:
        """A transaction on one pooled connection: commits when the block succeeds, rolls
        back on error or cancellation (shielded, bounded)."""
        return self._transaction()

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[PostgresExecutor]:
        with map_errors():
            conn = await self._pool.getconn()
            try:
                async with shielded_transaction(conn):
                    yield PostgresExecutor(self._queries, conn=conn)
            finally:
                await self._pool.putconn(conn)

    def executor_for(self, conn: object) -> PostgresExecutor:
        """An executor on the caller's connection; the caller owns its transaction.

        Accepts one of our executors (returned as is), an :class:`AnyioConnection`, or under
        asyncio a stock ``psycopg.AsyncConnection`` (note that AnyIO cancel scopes make
        psycopg close such a connection when they cancel a query; prefer AnyioConnection).
        """
        if isinstance(conn, PostgresExecutor):
            return conn
        if isinstance(conn, AnyioConnection):
            return PostgresExecutor(self._queries, conn=conn)
        if isinstance(conn, psycopg.AsyncConnection):
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                raise TypeError(
                    "a stock psycopg.AsyncConnection only works under asyncio; under trio "
                    "open the connection with river_anyio.drivers.postgres.AnyioConnection"
                ) from None
            return PostgresExecutor(self._queries, conn=conn)
        if isinstance(conn, psycopg.Connection):
            raise TypeError(
                "executor_for() needs an async connection (AnyioConnection or "
                "psycopg.AsyncConnection), not a synchronous psycopg.Connection"
            )
        raise TypeError(
            "executor_for() accepts a PostgresExecutor, an AnyioConnection or a "
            f"psycopg.AsyncConnection, not {type(conn).__module__}.{type(conn).__qualname__}"
        )

    def listener(self) -> AbstractAsyncContextManager[PostgresListener]:
        """A listener on its own dedicated connection (not taken from the pool)."""
        return self._listener()

    @asynccontextmanager
    async def _listener(self) -> AsyncIterator[PostgresListener]:
        with map_errors():
            conn = await self._pool.connect()
        try:
            listener = await PostgresListener.open(conn, self.schema)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await conn.close()
            raise
        async with listener:
            yield listener

    async def aclose(self) -> None:
        """Close the pool (connections in use are closed when given back)."""
        await self._pool.aclose()


def _number(field: str, value: object, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(field, "must be a number of seconds", value)
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(field, "must be a finite number of seconds > 0", value)
    return float(value)


def _conninfo(url: object) -> str:
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("url", "must be a non-empty str", url)
    scheme, sep, _ = url.partition("://")
    if sep and scheme.lower() not in ("postgres", "postgresql"):
        raise ConfigError(
            "url", "must be a postgres:// or postgresql:// URL or a libpq conninfo string", url
        )
    try:
        params: dict[str, Any] = conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise ConfigError("url", f"is not a valid PostgreSQL URL: {exc}", url) from None
    # Timestamps read back as UTC, and naive values are not silently shifted.
    options = str(params.get("options") or "").strip()
    params["options"] = f"{options} -c TimeZone=UTC".strip()
    return make_conninfo("", **params)


def _validate(
    url: object,
    schema: object,
    pool_max_size: object,
    acquire_timeout: object,
    connect_timeout: object,
    prepare_threshold: object,
) -> tuple[str, str | None, int, float, float, int | None]:
    conninfo = _conninfo(url)
    if schema is not None:
        if not isinstance(schema, str) or not _SCHEMA_RE.match(schema):
            raise ConfigError("schema", "must match ^[a-zA-Z_][a-zA-Z0-9_]*$ (or be None)", schema)
        if len(schema) > _SCHEMA_MAX:
            raise ConfigError("schema", f"must be at most {_SCHEMA_MAX} characters", schema)
    if isinstance(pool_max_size, bool) or not isinstance(pool_max_size, int) or pool_max_size < 1:
        raise ConfigError("pool_max_size", "must be an int >= 1", pool_max_size)
    acquire = _number("acquire_timeout", acquire_timeout)
    connect = _number("connect_timeout", connect_timeout)
    assert acquire is not None
    assert connect is not None
    if prepare_threshold is not None and (
        isinstance(prepare_threshold, bool)
        or not isinstance(prepare_threshold, int)
        or prepare_threshold < 0
    ):
        raise ConfigError("prepare_threshold", "must be an int >= 0 or None", prepare_threshold)
    return conninfo, schema, pool_max_size, acquire, connect, prepare_threshold


def open_postgres(
    url: str,
    *,
    schema: str | None = None,
    pool_max_size: int = 10,
    acquire_timeout: float = 30.0,
    connect_timeout: float = 10.0,
    prepare_threshold: int | None = 5,
) -> AbstractAsyncContextManager[PostgresDriver]:
    """Open a :class:`PostgresDriver` on ``url``: a ``postgres://`` or ``postgresql://`` URL,
    or a libpq ``key=value`` conninfo string.

    ``schema`` qualifies every River table (None: the connection's ``search_path``).
    ``prepare_threshold`` is psycopg's (None disables prepared statements, as needed behind
    PgBouncer in transaction mode). One connection is opened up front so a bad URL or an
    unreachable server fails here. Arguments are checked before anything is opened.
    """
    checked = _validate(
        url, schema, pool_max_size, acquire_timeout, connect_timeout, prepare_threshold
    )
    return _open(*checked)


@asynccontextmanager
async def _open(
    conninfo: str,
    schema: str | None,
    pool_max_size: int,
    acquire_timeout: float,
    connect_timeout: float,
    prepare_threshold: int | None,
) -> AsyncIterator[PostgresDriver]:
    pool = Pool(
        conninfo,
        max_size=pool_max_size,
        acquire_timeout=acquire_timeout,
        connect_timeout=connect_timeout,
        prepare_threshold=prepare_threshold,
    )
    driver = PostgresDriver(pool, schema)
    try:
        with map_errors():
            await pool.putconn(await pool.getconn())
        yield driver
    finally:
        with anyio.CancelScope(shield=True):
            await driver.aclose()
