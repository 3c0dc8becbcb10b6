"""River's SQLite driver on apsw (or a ``sqlite3``-API module), for asyncio and trio.

One OS thread owns the writer connection; every driver call is one hop to it (see
``_connection``). Listeners follow River's ``river_notification`` outbox on a read-only
connection of their own. A checkpointer thread, woken by the writer's commits, copies the WAL
back into the database with a connection of its own (see ``_checkpoint``).

Open it with :func:`open_sqlite`::

    async with open_sqlite("sqlite:///var/lib/app/river.sqlite3") as driver:
        async with driver.transaction() as tx:
            await tx.job_insert_fast_many(params)

The driver belongs to the event loop that opened it. The database must be a file (WAL mode is
switched on); its directory must exist.

With ``sqlite_module=pysqlite3.dbapi2`` (or the standard library's ``sqlite3`` when it links
SQLite 3.47+), every connection the driver opens uses that module's SQLite instead of apsw's:
for a process whose other code (Django's ORM, say) opens the same file with that module, since
two SQLite libraries on one file in one process break each other's locks.
"""

from __future__ import annotations

import logging
import math
import os
import re
import weakref
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final, Literal

import anyio
import anyio.to_thread
import attrs

from ..._errors import ConfigError
from ._checkpoint import Checkpointer
from ._connection import MEMORY, ConnectionThread, check_sqlite_version, path_from_url
from ._dbapi import check_sqlite3_version, is_sqlite3_module
from ._executor import SQLiteExecutor
from ._listener import OwnCommits, SQLiteListener
from ._malloc import settle_allocator
from ._queries import Queries

__all__ = ["SQLiteDriver", "SQLiteExecutor", "SQLiteListener", "open_sqlite", "path_from_url"]

_IDENT_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SCHEMA_MAX: Final = 46  # River's client limit for schema names
# Extra time a COMMIT/ROLLBACK may take beyond the busy timeout before it is abandoned.
_FINISH_GRACE: Final = 10.0
#: The longest a closing driver waits for its checkpointer's thread to end.
_JOIN_TIMEOUT: Final = 10.0

logger = logging.getLogger("river_anyio.driver")


def _validate_identifier(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError(field, f"must be a str, not {type(value).__name__}", value)
    if len(value) > _SCHEMA_MAX or not _IDENT_RE.match(value):
        raise ConfigError(
            field,
            f"must be an identifier matching ^[a-zA-Z_][a-zA-Z0-9_]*$ of at most {_SCHEMA_MAX} "
            f"characters (got {value!r})",
            value,
        )
    return value


def _validate_busy_timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError("busy_timeout", f"must be a number of seconds, not {value!r}", value)
    if not math.isfinite(value) or value < 0:
        raise ConfigError("busy_timeout", f"must be >= 0 and finite (got {value!r})", value)
    return float(value)


def _validate_sqlite_module(value: object, path: str) -> Any:
    if value is None:
        return None
    if not is_sqlite3_module(value):
        raise ConfigError(
            "sqlite_module",
            "must be a sqlite3-API module (pysqlite3.dbapi2, sqlite3) or None for apsw, "
            f"not {value!r}",
            value,
        )
    if path == MEMORY:
        raise ConfigError(
            "sqlite_module",
            "the in-memory database (sqlite://:memory:) is apsw's SQLite's, shared through "
            "its memdb VFS: another SQLite library cannot open it",
            value,
        )
    check_sqlite3_version(value, field="sqlite_module")
    return value


def _validate_attach(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError("attach", "must be a mapping of database name to file path/URL", value)
    out: dict[str, str] = {}
    for name, path in value.items():
        _validate_identifier("attach", name)
        if name.lower() in ("main", "temp"):
            raise ConfigError("attach", f"{name!r} is a reserved database name", value)
        out[name] = path_from_url(path, absolute=False)
        if out[name] == MEMORY:
            raise ConfigError(
                "attach", f"{name!r}: an in-memory database cannot be attached", value
            )
    return out


@attrs.define(eq=False)
class _Database:
    """What the driver and its :meth:`SQLiteDriver.with_schema` views share: the writer and
    its checkpointer, the attached files, every open listener (a commit's notifications poke
    them all), and the own-commit followers of the files listeners watch (by database name)."""

    writer: ConnectionThread
    checkpointer: Checkpointer | None
    attach: dict[str, str]
    listeners: weakref.WeakSet[SQLiteListener] = attrs.field(factory=weakref.WeakSet)
    #: each listener following a WAL index, and the database it follows
    watching: dict[SQLiteListener, str] = attrs.field(factory=dict)
    owns: dict[str, OwnCommits] = attrs.field(factory=dict)

    def poke_listeners(self) -> None:
        for listener in list(self.listeners):
            listener.poke()

    def follow_own_commits(self) -> None:
        """Have the writer prove its own commits to the files some listener watches."""
        self.writer.own_commits = tuple(
            own for name, own in self.owns.items() if name in self.watching.values()
        )


class SQLiteDriver:
    """The SQLite implementation of the Driver protocol. Create it with :func:`open_sqlite`.

    :meth:`with_schema` gives the same writer with River's tables in another attached
    database.
    """

    def __init__(self, db: _Database, schema: str | None) -> None:
        self._db = db
        self._writer = db.writer
        self._schema = schema
        self._queries = Queries(schema)
        self._executor = SQLiteExecutor(db.writer, self._queries, on_notify=db.poke_listeners)
        self._finish_bound = db.writer.busy_timeout + _FINISH_GRACE

    def __repr__(self) -> str:
        return f"<SQLiteDriver {self._writer.path} schema={self._schema!r}>"

    def with_schema(self, schema: str | None) -> SQLiteDriver:
        """This driver's writer with River's tables in the attached database ``schema``
        (None: ``main``), for clients and migrators of several schemas on one connection.

        ``schema`` must be ``main`` or a database the driver attaches (its ``attach``
        option): ConfigError otherwise. The view shares the writer, so its transactions and
        this driver's take turns as always on SQLite, and one transaction may write both
        (``driver.transaction()``'s executor, passed to the view's ``executor_for``). It
        belongs to this driver: it works while this driver is open, and closing it closes
        nothing. Its listeners follow its database's outbox on connections of their own.
        """
        if schema is not None:
            _validate_identifier("schema", schema)
            if schema != "main" and schema not in self._db.attach:
                attached = ", ".join(["main", *self._db.attach])
                raise ConfigError(
                    "schema",
                    f"no attached database named {schema!r} (attached: {attached}); "
                    "open the driver with attach={name: path} to attach it",
                    schema,
                )
        if schema == self._schema:
            return self
        return _SQLiteSchemaView(self._db, schema)

    # ---- properties ------------------------------------------------------------------------

    @property
    def dialect(self) -> Literal["sqlite"]:
        return "sqlite"

    @property
    def schema(self) -> str | None:
        """The attached database name River's tables are in, or None for ``main``."""
        return self._schema

    @property
    def supports_listen_notify(self) -> bool:
        """True: notifications go through River's ``river_notification`` outbox."""
        return True

    @property
    def sqlite_module(self) -> Any:
        """The ``sqlite3``-API module the driver's connections use, or None for apsw."""
        return self._writer.module

    @property
    def path(self) -> str:
        """Absolute path of the database file (``":memory:"`` for the process's in-memory
        database)."""
        return self._writer.path

    # ---- executors ---------------------------------------------------------------------------

    def executor(self) -> SQLiteExecutor:
        """An executor whose every call is its own unit of work (writes: BEGIN IMMEDIATE)."""
        return self._executor

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[SQLiteExecutor]:
        """A ``BEGIN IMMEDIATE`` transaction holding the writer exclusively until it ends.

        Commits on success; rolls back on error or cancellation. COMMIT and ROLLBACK are
        shielded from cancellation and bounded in time.
        """
        async with self._writer.checkout() as session:
            tx = SQLiteExecutor(self._writer, self._queries, session=session)
            try:
                yield tx
            except BaseException:
                session.ended = True
                await session.finish(commit=False, bound=self._finish_bound)
                raise
            session.ended = True
            await session.finish(commit=True, bound=self._finish_bound)
            if session.notified:
                self._db.poke_listeners()

    def executor_for(self, conn: object) -> SQLiteExecutor:
        """``conn`` itself if it is one of this driver's executors; TypeError otherwise.

        An executor of another schema of the same writer (a :meth:`with_schema` view's, or
        the driver's) is given this driver's tables, in the same transaction if it has one.
        The apsw connection belongs to the driver's thread, so a caller's own connection
        cannot be used: run your writes through ``driver.transaction()`` instead.
        """
        if isinstance(conn, SQLiteExecutor) and conn._writer is self._writer:
            if conn.schema == self._schema:
                return conn
            return conn.on_schema(self._queries, self._db.poke_listeners)
        raise TypeError(
            "SQLiteDriver.executor_for() accepts only an executor of this driver "
            "(driver.executor() or the one yielded by driver.transaction()); the SQLite "
            "connection is owned by the driver's thread, so other connections cannot be "
            f"used: got {type(conn).__module__}.{type(conn).__qualname__}"
        )

    # ---- notifications --------------------------------------------------------------------------

    @asynccontextmanager
    async def listener(self) -> AsyncIterator[SQLiteListener]:
        """A listener on the notification outbox, with its own read-only connection."""
        db = self._db
        reader = ConnectionThread(
            self._writer.path,
            readonly=True,
            busy_timeout=self._writer.busy_timeout,
            attach=db.attach,
            name="river-sqlite-listener",
            module=self._writer.module,
        )
        await reader.start()
        listener = SQLiteListener(reader, self._queries)
        try:
            await listener.connect()
            db.listeners.add(listener)
            if listener.watching:
                await self._follow_own_commits(listener)
            yield listener
        finally:
            db.listeners.discard(listener)
            if db.watching.pop(listener, None) is not None:
                db.follow_own_commits()
            await listener.aclose()

    async def _follow_own_commits(self, listener: SQLiteListener) -> None:
        """Have the writer's thread prove which commits to the listener's database are its
        own, so the listener's watch does not read the outbox for them (their notifications
        poke it)."""
        db = self._db
        name = self._schema or "main"
        own = db.owns.get(name)
        if own is None:
            own = await self._writer.run(OwnCommits.open, self._schema)
            if own is None:
                return  # no WAL index to follow
            if name in db.owns:  # another listener opened one meanwhile
                own.close()
                own = db.owns[name]
            db.owns[name] = own
        listener.own_commits(own)
        db.watching[listener] = name
        db.follow_own_commits()

    async def aclose(self) -> None:
        """Finish queued work, close the connection and stop its thread."""
        db = self._db
        self._writer.own_commits = ()
        await self._writer.aclose()
        if db.checkpointer is not None:
            with anyio.CancelScope(shield=True):
                await _stop_checkpointer(db.checkpointer)
        owns, db.owns = db.owns, {}
        for own in owns.values():
            own.close()


class _SQLiteSchemaView(SQLiteDriver):
    """A :meth:`SQLiteDriver.with_schema` view: the writer is the driver's, and so is its
    closing."""

    async def aclose(self) -> None:
        """Nothing to close: the driver the view came from owns the writer."""


def open_sqlite(
    url_or_path: str,
    *,
    schema: str | None = None,
    busy_timeout: float = 5.0,
    attach: Mapping[str, str] | None = None,
    sqlite_module: Any = None,
) -> AbstractAsyncContextManager[SQLiteDriver]:
    """Open River's SQLite database; the context manager closes it.

    ``url_or_path``: ``sqlite://relative.db``, ``sqlite:///absolute/path.db`` (River's forms, see
    :func:`path_from_url`) or a plain path. ``schema``: the attached database holding River's
    tables (``None`` for ``main``); attach it with ``attach={name: path}``, which is applied to
    every connection the driver opens. ``busy_timeout``: seconds to wait for another
    connection's write lock before :class:`~river_anyio.DatabaseBusyError`.
    ``sqlite_module``: a ``sqlite3``-API module (``pysqlite3.dbapi2``, or ``sqlite3`` linking
    SQLite 3.47+) that every connection of the driver uses instead of apsw (see
    :ref:`sqlite-module`); None (the default) for apsw.

    Arguments are validated now (ConfigError); the file is opened on entering.
    """
    path = path_from_url(url_or_path, absolute=False)
    module = _validate_sqlite_module(sqlite_module, path)
    if module is None:
        check_sqlite_version()
    if schema is not None:
        _validate_identifier("schema", schema)
    timeout = _validate_busy_timeout(busy_timeout)
    attached = _validate_attach(attach)
    return _open(path, schema, timeout, attached, module)


def _absolute(path: str, attach: dict[str, str]) -> tuple[str, dict[str, str]]:
    main = path if path == MEMORY else os.path.abspath(path)
    return main, {k: os.path.abspath(v) for k, v in attach.items()}


@asynccontextmanager
async def _open(
    path: str, schema: str | None, busy_timeout: float, attach: dict[str, str], module: Any
) -> AsyncIterator[SQLiteDriver]:
    settle_allocator()  # once per process: see _malloc
    if not all(os.path.isabs(p) or p == MEMORY for p in (path, *attach.values())):
        # relative to the working directory as it is now: reading it is a system call
        path, attach = await anyio.to_thread.run_sync(_absolute, path, attach)
    # WAL checkpoints off the commits' path (apsw connections to a file)
    checkpointer = (
        None if path == MEMORY or module is not None else Checkpointer(path, attach=attach)
    )
    writer = ConnectionThread(
        path,
        busy_timeout=busy_timeout,
        attach=attach,
        name="river-sqlite-writer",
        module=module,
        wal_hook=None if checkpointer is None else checkpointer.wal_hook,
    )
    if checkpointer is not None:
        checkpointer.start()
    try:
        await writer.start()
        if schema is not None:
            names = await writer.run(
                lambda c: [str(r[1]) for r in c.execute("PRAGMA database_list")]
            )
            if schema not in names:
                raise ConfigError(
                    "schema",
                    f"no attached database named {schema!r} (attached: {', '.join(names)}); "
                    "pass attach={name: path} to attach it",
                    schema,
                )
        driver = SQLiteDriver(_Database(writer, checkpointer, attach), schema)
        yield driver
    finally:
        with anyio.CancelScope(shield=True):
            await writer.aclose()
            if checkpointer is not None:
                await _stop_checkpointer(checkpointer)


async def _stop_checkpointer(checkpointer: Checkpointer) -> None:
    """Stop the checkpointer's thread (after the writer's: the last connection closed
    checkpoints what is left) and join it outside the event loop, for ``_JOIN_TIMEOUT`` at
    most (a ``PASSIVE`` checkpoint waits for no lock; the thread is a daemon)."""
    thread = checkpointer.stop()
    if thread is not None:
        await anyio.to_thread.run_sync(thread.join, _JOIN_TIMEOUT)
        if thread.is_alive():
            logger.warning("sqlite: the checkpointer of %s did not stop", checkpointer.path)
