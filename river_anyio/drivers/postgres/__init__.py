"""The PostgreSQL driver: psycopg 3 driven through AnyIO, so it runs under asyncio and trio.

Use :func:`open_postgres`::

    async with open_postgres("postgresql://localhost/app", schema="river") as driver:
        async with driver.transaction() as tx:
            await tx.job_insert_fast_many(jobs)

Every connection is in autocommit mode with ``TimeZone=UTC``; transactions are explicit
(:meth:`PostgresDriver.transaction`, or a caller's own through
:meth:`PostgresDriver.executor_for`).

The server is identified when the driver opens (:class:`ServerCapabilities`): on YugabyteDB
without LISTEN/NOTIFY the driver sends no notifications (clients poll instead) and unique
inserts carry a metadata nonce, as River Go's driver does.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import urllib.parse
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal

import anyio
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..._errors import ConfigError
from .. import redact_secrets, redact_url
from ._capabilities import POSTGRES, ServerCapabilities, detect_capabilities
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
    "ServerCapabilities",
    "cli_conninfo",
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


def _check_schema(schema: object) -> str | None:
    """``schema`` if it can name River's schema (and prefix its channels), else ConfigError."""
    if schema is not None:
        if not isinstance(schema, str) or not _SCHEMA_RE.match(schema):
            raise ConfigError("schema", "must match ^[a-zA-Z_][a-zA-Z0-9_]*$ (or be None)", schema)
        if len(schema) > _SCHEMA_MAX:
            raise ConfigError("schema", f"must be at most {_SCHEMA_MAX} characters", schema)
    return schema


class PostgresDriver:
    """A River driver on a pool of PostgreSQL connections (see :func:`open_postgres`, which
    detects the server's ``capabilities``; a driver built directly assumes PostgreSQL).

    :meth:`with_schema` gives the same pool under another schema, as River Go's clients of
    several schemas share one driver.
    """

    def __init__(
        self, pool: Pool, schema: str | None, capabilities: ServerCapabilities = POSTGRES
    ) -> None:
        self._pool = pool
        self._queries = Queries(schema, capabilities)
        self._executor = PostgresExecutor(self._queries, pool=pool)

    def with_schema(self, schema: str | None) -> PostgresDriver:
        """This driver's pool with River's tables in ``schema`` (None: the connections'
        ``search_path``), for clients and migrators of several schemas on one pool.

        The view shares the pool (its size bounds every view together) and belongs to this
        driver: it works while this driver is open, and closing it closes nothing. Its
        listeners take their own connection, as this driver's do, and hear the channels of
        its schema. Nothing is opened or checked in the database: a schema that does not
        exist fails at its first statement. ``schema`` is checked as :func:`open_postgres`
        checks it (ConfigError).
        """
        schema = _check_schema(schema)
        if schema == self.schema:
            return self
        return _PostgresSchemaView(self._pool, schema, self.capabilities)

    def __repr__(self) -> str:
        params = conninfo_to_dict(self._pool._conninfo)
        shown = " ".join(
            f"{k}={params[k]}" for k in ("host", "port", "dbname", "user") if params.get(k)
        )
        return f"<PostgresDriver {shown or 'libpq defaults'} schema={self.schema!r}>"

    @property
    def dialect(self) -> Literal["postgres"]:
        return "postgres"

    @property
    def schema(self) -> str | None:
        return self._queries.schema

    @property
    def supports_listen_notify(self) -> bool:
        """Whether the server delivers notifications: always on PostgreSQL; on YugabyteDB only
        with ``yb_enable_listen_notify``. Without them clients poll (as with ``poll_only``)."""
        return self._queries.notify

    @property
    def capabilities(self) -> ServerCapabilities:
        """The server, as detected when the driver opened (once: a change of the server's
        settings takes a new driver)."""
        return self._queries.capabilities

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
            # another schema's executor (a transaction of a view on the same pool, say):
            # the same connection or pool, with this driver's tables
            return conn if conn.schema == self.schema else conn.on_schema(self._queries)
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


class _PostgresSchemaView(PostgresDriver):
    """A :meth:`PostgresDriver.with_schema` view: the pool is the driver's, and so is its
    closing."""

    async def aclose(self) -> None:
        """Nothing to close: the driver the view came from owns the pool."""


def _number(field: str, value: object, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(field, "must be a number of seconds", value)
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(field, "must be a finite number of seconds > 0", value)
    return float(value)


def _libpq_keywords() -> frozenset[str]:
    return frozenset(
        d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults() if d.keyword is not None
    )


def _parse(url: str) -> dict[str, Any]:
    """libpq's reading of a URL or key/value string; ConfigError (never quoting the input's
    values, where a password may be) when libpq rejects it."""
    try:
        return conninfo_to_dict(url)
    except psycopg.Error as exc:
        # libpq quotes pieces of the input ('missing "=" after "s3cret"'): keep only quoted
        # option names, so a fragment of a password is never repeated.
        keywords = _libpq_keywords()
        detail = re.sub(
            r'"([^"]*)"', lambda m: m[0] if m[1] in keywords or m[1] == "=" else '"…"', str(exc)
        )
        raise ConfigError(
            "database_url",
            f"is not a valid PostgreSQL connection string: {' '.join(detail.split())} "
            "(use postgres://user:password@host:port/dbname, percent-encoding special "
            "characters, or host=... user=... dbname=...)",
            redact_url(url),
        ) from None


def _conninfo(url: object) -> str:
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("url", "must be a non-empty str", None if url is None else "…")
    scheme, sep, _ = url.partition("://")
    if sep and scheme.lower() not in ("postgres", "postgresql"):
        raise ConfigError(
            "url",
            "must be a postgres:// or postgresql:// URL or a libpq conninfo string",
            redact_url(url),
        )
    params = _parse(url)
    # Timestamps read back as UTC, and naive values are not silently shifted.
    options = str(params.get("options") or "").strip()
    params["options"] = f"{options} -c TimeZone=UTC".strip()
    return make_conninfo("", **params)


def _scrubbed(exc: BaseException, url: str) -> BaseException:
    """``exc`` with any piece of the URL's password hidden, for errors of the first
    connection attempt (libpq quotes a mis-split password as a host name or a port)."""
    before = str(exc)
    text = redact_secrets(before, url)
    if text == before:
        return exc
    exc.args = (text,)
    exc.__cause__ = None  # psycopg's own message still holds the piece
    exc.__suppress_context__ = True
    return exc


def cli_conninfo(
    url: str,
    *,
    statement_timeout_ms: int | None,
    default_statement_timeout: str,
    application_name: str,
) -> str:
    """The connection string River's CLI would use for ``url`` (``""``: libpq's PG*
    environment variables alone): ``statement_timeout`` from the flag, else a
    ``statement_timeout`` query parameter of the URL (which libpq itself would reject), else
    the default; ``idle_in_transaction_session_timeout`` of 11 s and a fallback
    ``application_name``, unless the string or PGOPTIONS sets them."""
    from_url: str | None = None
    if "://" in url and "?" in url:
        head, _, query = url.partition("?")
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        from_url = next((v for k, v in pairs if k == "statement_timeout"), None)
        kept = [(k, v) for k, v in pairs if k != "statement_timeout"]
        url = head + ("?" + urllib.parse.urlencode(kept) if kept else "")
    params = _parse(url) if url else {}
    options = str(params.get("options") or os.environ.get("PGOPTIONS") or "").strip()
    timeout = str(statement_timeout_ms) if statement_timeout_ms is not None else from_url
    if timeout is not None or "statement_timeout=" not in options:
        value = (timeout or default_statement_timeout).replace("\\", "\\\\").replace(" ", "\\ ")
        options += f" -c statement_timeout={value}"
    if "idle_in_transaction_session_timeout=" not in options:
        options += " -c idle_in_transaction_session_timeout=11000"
    params["options"] = options.strip()
    params.setdefault("fallback_application_name", application_name)
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
    checked_schema = _check_schema(schema)
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
    return conninfo, checked_schema, pool_max_size, acquire, connect, prepare_threshold


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
    PgBouncer in transaction mode); the runtime's frequent statements (claims, inserts,
    completions) are prepared on their first run unless it is None. One connection is
    opened up front so a bad URL or an unreachable server fails here; on it the server is
    identified (:attr:`PostgresDriver.capabilities`: YugabyteDB without LISTEN/NOTIFY makes
    the driver send no notifications and write unique inserts with a nonce). Arguments are
    checked before anything is opened.
    """
    checked = _validate(
        url, schema, pool_max_size, acquire_timeout, connect_timeout, prepare_threshold
    )
    return _open(*checked, raw=url)


@asynccontextmanager
async def _open(
    conninfo: str,
    schema: str | None,
    pool_max_size: int,
    acquire_timeout: float,
    connect_timeout: float,
    prepare_threshold: int | None,
    *,
    raw: str,
) -> AsyncIterator[PostgresDriver]:
    pool = Pool(
        conninfo,
        max_size=pool_max_size,
        acquire_timeout=acquire_timeout,
        connect_timeout=connect_timeout,
        prepare_threshold=prepare_threshold,
    )
    try:
        try:
            with map_errors():
                conn = await pool.getconn()
                try:
                    capabilities = await detect_capabilities(conn)
                finally:
                    await pool.putconn(conn)
        except Exception as exc:
            raise _scrubbed(exc, raw) from exc.__cause__
        yield PostgresDriver(pool, schema, capabilities)
    finally:
        with anyio.CancelScope(shield=True):
            await pool.aclose()
