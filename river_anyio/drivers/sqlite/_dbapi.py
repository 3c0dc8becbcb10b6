"""River's SQLite operations on a ``sqlite3``-API connection (stdlib ``sqlite3``, ``pysqlite3``).

The driver's operations are written against the few apsw connection methods they use;
:class:`Sqlite3AsApsw` gives those on a ``sqlite3``-API connection. Both the async driver (its
``sqlite_module`` option) and the blocking client (its pooled connections, and the caller's own
in ``insert_tx()``) use it: a process whose other code opens River's file with that module then
holds one SQLite library on the file (two libraries on one file in one process break each
other's POSIX locks).

What apsw has and ``sqlite3`` lacks, and what stands in for it here:

- a Python busy handler: with ``busy`` given, the connection is opened with no busy timeout of
  its own and a statement that finds the database locked outside a transaction (or a COMMIT) is
  retried here, asking ``busy(count)`` as apsw asks its handler, so a cancelled caller stops
  waiting at once. Without it (the blocking client), ``sqlite3``'s ``timeout`` waits in C;
- ``Connection.interrupt()`` exists in both;
- several statements in one ``execute()``: split at statement ends (``complete_statement``);
- ``db_filename()``: ``PRAGMA database_list``.
"""

from __future__ import annotations

import datetime as dt
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, Final

from ..._errors import (
    ConfigError,
    ConnectionLostError,
    DatabaseBusyError,
    DatabaseError,
    IntegrityError,
    QueryCanceledError,
    UniqueViolationError,
)

__all__ = [
    "Sqlite3AsApsw",
    "check_sqlite3_version",
    "dbapi_translator",
    "is_sqlite3_module",
    "open_dbapi",
    "sqlite3_module",
]

# SQLite's result codes (https://www.sqlite.org/rescode.html), as ``sqlite_errorcode`` gives them
_BUSY: Final = 5
_LOCKED: Final = 6
_INTERRUPT: Final = 9
_IOERR: Final = 10
_CANTOPEN: Final = 14
_CONSTRAINT: Final = 19
_UNIQUE_CODES: Final = frozenset({2067, 1555})  # SQLITE_CONSTRAINT_UNIQUE, _PRIMARYKEY
_ONE_AT_A_TIME: Final = "one statement at a time"

#: ``busy(count) -> bool``: wait before attempt ``count + 1``; False gives up (apsw's handler).
BusyHandler = Callable[[int], bool]


def _code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code if isinstance(code, int) else None


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``sqlite3``-API error for an interrupted statement."""
    code = _code(exc)
    return code is not None and code & 0xFF == _INTERRUPT


class Sqlite3AsApsw:
    """The few apsw connection methods River's SQLite operations use, on a ``sqlite3``-API
    connection (stdlib ``sqlite3``, ``pysqlite3``) in autocommit mode (``isolation_level=None``
    when River opened it; the caller's own connection in ``insert_tx()`` otherwise)."""

    __slots__ = ("_busy", "_conn", "_mod")

    def __init__(self, conn: Any, *, busy: BusyHandler | None = None) -> None:
        self._conn = conn
        self._busy = busy
        self._mod: Any = None

    def execute(self, sql: str, params: Any = ()) -> Any:
        cur = self._conn.cursor()
        cur.row_factory = None  # rows as tuples, whatever the connection's factory
        try:
            return _TextTimestamps(cur.execute(sql, params))
        except Exception as exc:
            return self._recover(cur, sql, params, exc)

    def _recover(self, cur: Any, sql: str, params: Any, exc: Exception) -> Any:
        """A failed ``execute``: several statements (apsw runs them all), or the database
        locked where a retry is what SQLite's busy handler would do; else ``exc``."""
        if _ONE_AT_A_TIME in str(exc):
            return self._script(sql, params)
        busy = self._busy
        code = _code(exc)
        if busy is None or code is None or code & 0xFF != _BUSY:
            raise exc
        # Outside a transaction a statement that found the database locked did nothing, and
        # a COMMIT stays pending: both may run again (inside one, SQLite wants a ROLLBACK).
        if self._conn.in_transaction and sql.strip().upper() != "COMMIT":
            raise exc
        count = 0
        while busy(count):
            count += 1
            try:
                return _TextTimestamps(cur.execute(sql, params))
            except Exception as again:
                code = _code(again)
                if code is None or code & 0xFF != _BUSY:
                    raise
                exc = again
        raise exc

    def _script(self, sql: str, params: Any) -> Any:
        """Each statement of ``sql`` in turn (parameters go to the first); the last one's rows."""
        mod = self._module()
        last: Any = _TextTimestamps(None)
        rest = sql
        while rest.strip():
            end = _statement_end(mod, rest)
            one, rest = rest[:end], rest[end:]
            last = self.execute(one, params)
            params = ()
            if rest.strip():
                last.fetchall()
        return last

    def _module(self) -> Any:
        if self._mod is None:
            self._mod = sqlite3_module(self._conn)
        return self._mod

    def total_changes(self) -> int:
        return int(self._conn.total_changes)

    def changes(self) -> int:
        return int(self._conn.execute("SELECT changes()").fetchone()[0])

    @property
    def in_transaction(self) -> bool:
        return bool(self._conn.in_transaction)

    def interrupt(self) -> None:
        """Stop the running statement (from any thread), as apsw's ``interrupt()``."""
        self._conn.interrupt()

    def db_filename(self, name: str) -> str:
        """The file of the attached database ``name`` ("" for a temporary or memory one)."""
        for _seq, db, path in self._conn.execute("PRAGMA database_list").fetchall():
            if db == name:
                return str(path or "")
        return ""

    def close(self) -> None:
        self._conn.close()


def _statement_end(mod: Any, sql: str) -> int:
    """The index just past the first complete statement of ``sql`` (all of it if none)."""
    start = 0
    while (i := sql.find(";", start)) >= 0:
        if mod.complete_statement(sql[: i + 1]):
            return i + 1
        start = i + 1
    return len(sql)


class _TextTimestamps:
    """A ``sqlite3`` cursor whose rows hold River's timestamps as the text stored, also when
    the connection was opened with ``detect_types`` (Django's is, with converters turning
    ``timestamp`` columns into naive datetimes): those are written back as that text (UTC)."""

    __slots__ = ("_cur",)

    def __init__(self, cur: Any) -> None:
        self._cur = cur

    @staticmethod
    def _row(row: Any) -> Any:
        if not any(isinstance(v, dt.datetime) for v in row):
            return row
        return tuple(_timestamp_text(v) if isinstance(v, dt.datetime) else v for v in row)

    def fetchall(self) -> list[Any]:
        if self._cur is None:
            return []
        return [self._row(r) for r in self._cur.fetchall()]

    def fetchone(self) -> Any:
        row = None if self._cur is None else self._cur.fetchone()
        return None if row is None else self._row(row)

    def __iter__(self) -> Iterator[Any]:
        if self._cur is None:
            return iter(())
        return (self._row(r) for r in self._cur)


def _timestamp_text(value: dt.datetime) -> str:
    """A converter's datetime as the text it was read from: River's millisecond layout, or
    microseconds when the stored text had more digits (nothing is lost)."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value.isoformat(" ", "microseconds" if value.microsecond % 1000 else "milliseconds")


def sqlite3_module(conn: object) -> Any:
    """The ``sqlite3``-API module (``sqlite3``, ``pysqlite3.dbapi2``, …) whose connection
    ``conn`` is, or None."""
    for cls in type(conn).__mro__:
        if cls.__name__ == "Connection":
            mod = sys.modules.get(cls.__module__)
            if mod is not None and hasattr(mod, "sqlite_version_info") and hasattr(mod, "Error"):
                return mod
    return None


def is_sqlite3_module(mod: object) -> bool:
    """Whether ``mod`` looks like a ``sqlite3``-API module (``sqlite3``, ``pysqlite3.dbapi2``)."""
    return (
        callable(getattr(mod, "connect", None))
        and callable(getattr(mod, "complete_statement", None))
        and hasattr(mod, "sqlite_version_info")
        and isinstance(getattr(mod, "Error", None), type)
    )


def check_sqlite3_version(mod: Any, field: str = "conn") -> None:
    """ConfigError unless ``mod`` (a ``sqlite3``-API module) links SQLite new enough."""
    from ._connection import MIN_SQLITE_VERSION

    version = tuple(mod.sqlite_version_info)
    if version < MIN_SQLITE_VERSION:
        need = ".".join(map(str, MIN_SQLITE_VERSION))
        raise ConfigError(
            field,
            f"the {mod.__name__} module uses SQLite {mod.sqlite_version}, and River's SQLite "
            f"tables need SQLite >= {need} (JSONB columns, JSON paths). Install "
            "pysqlite3-binary (which bundles a recent SQLite) and connect with "
            "pysqlite3.dbapi2, or use apsw (pip install apsw)",
            mod.sqlite_version,
        )


def dbapi_translator(mod: Any) -> Callable[[BaseException], DatabaseError | None]:
    """What an error of ``mod``'s connections becomes (None: not a database error), by its
    SQLite result code where the module gives it (Python 3.11+, pysqlite3), as apsw's are."""

    def translate(exc: BaseException) -> DatabaseError | None:
        if not isinstance(exc, mod.Error):
            return None
        msg = f"sqlite: {exc}"
        code = _code(exc)
        primary = None if code is None else code & 0xFF
        if primary in (_BUSY, _LOCKED):
            return DatabaseBusyError(msg)
        if primary == _CONSTRAINT or isinstance(exc, mod.IntegrityError):
            # the module does not turn on extended result codes: the message tells them apart
            unique = code in _UNIQUE_CODES or str(exc).startswith("UNIQUE constraint failed")
            return UniqueViolationError(msg) if unique else IntegrityError(msg)
        if primary == _INTERRUPT:
            return QueryCanceledError(msg)
        if primary in (_IOERR, _CANTOPEN) or "closed database" in str(exc):
            return ConnectionLostError(msg)
        if code is None and isinstance(exc, mod.OperationalError) and "locked" in str(exc):
            return DatabaseBusyError(msg)
        return DatabaseError(msg)

    return translate


def _uri(path: str, mode: str) -> str:
    return f"file:{urllib.parse.quote(path)}?mode={mode}"


def open_dbapi(
    mod: Any,
    path: str,
    *,
    busy_timeout: float,
    attach: dict[str, str],
    readonly: bool = False,
    busy: BusyHandler | None = None,
) -> Sqlite3AsApsw:
    """A connection of ``mod`` to River's database file, set up as the apsw ones are: foreign
    keys on, ``attach`` attached, WAL and ``synchronous=normal`` (unless ``readonly``); in
    autocommit mode (transactions are begun explicitly, as on apsw). ``busy``: the busy
    handler (see the module docstring); without it, ``busy_timeout`` is ``sqlite3``'s own."""
    from ._connection import logger, quote_ident

    timeout = 0.0 if busy is not None else busy_timeout
    if readonly:
        raw = mod.connect(
            _uri(path, "ro"),
            uri=True,
            timeout=timeout,
            isolation_level=None,
            check_same_thread=False,
        )
    else:
        raw = mod.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
    conn = Sqlite3AsApsw(raw, busy=busy)
    try:
        conn.execute("PRAGMA foreign_keys = 1")
        for name, other in attach.items():
            target = _uri(other, "ro") if readonly else other
            conn.execute(f"ATTACH DATABASE ? AS {quote_ident(name)}", (target,))
        if not readonly:
            for schema in ("main", *attach):
                q = quote_ident(schema)
                if str(conn.execute(f"PRAGMA {q}.journal_mode").fetchone()[0]).lower() != "wal":
                    (mode,) = conn.execute(f"PRAGMA {q}.journal_mode = wal").fetchone()
                    if str(mode).lower() != "wal":
                        logger.warning("sqlite: %s: journal_mode is %s, not wal", schema, mode)
                conn.execute(f"PRAGMA {q}.synchronous = normal")
    except BaseException:
        raw.close()
        raise
    return conn
