"""One OS thread owning one apsw connection, driven from asyncio or trio through AnyIO.

Why a dedicated thread: apsw calls block, a connection must only be used by one thread at a
time, and a thread hop costs far more than SQLite's own work. So coroutines hand the thread
whole units of work (``await conn_thread.run(fn, *args)`` where ``fn(conn, *args)`` is
synchronous and does a complete operation), one hop each.

Cancellation: the cancelled caller flags its work item, calls ``conn.interrupt()`` and then waits,
shielded, until ``fn`` has returned or raised, so the connection is never abandoned mid-statement
and the database state is known. Lock waits are not stopped by ``interrupt()``, so the busy
handler is written in Python: it sleeps on an event that the canceller sets, and gives up at the
busy deadline.

Multi-hop transactions take an exclusive *checkout* (a ``Semaphore(1)``) for their whole
duration; ``run()`` from other tasks waits until it is released, so no other task's work ever
executes inside someone else's open transaction.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, TypeVar, TypeVarTuple, cast

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import apsw

from ..._errors import ConfigError, ConnectionLostError, DatabaseError
from ._dbapi import dbapi_translator, is_interrupt, open_dbapi
from ._errors import translate

if TYPE_CHECKING:
    from ._listener import OwnCommits

__all__ = [
    "MIN_SQLITE_VERSION",
    "ConnectionThread",
    "Session",
    "TransactionLostError",
    "check_sqlite_version",
    "MEMORY",
    "path_from_url",
    "quote_ident",
    "rollback_quietly",
    "write_unit",
]

logger = logging.getLogger("river_anyio.driver")

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

#: River's SQLite queries need jsonb() (3.45), unhex() (3.41) and 'subsec' (3.42); metadata
#: merges on keys holding quotes need 3.47's JSON path handling (found by the floors session).
MIN_SQLITE_VERSION: Final = (3, 47, 0)

# Busy handler sleeps (seconds), by invocation count; the last value repeats. Short at first
# because River's write transactions are short; a cancellation wakes the sleep immediately.
_BUSY_DELAYS: Final = (0.001, 0.002, 0.005, 0.010, 0.015, 0.020, 0.025)
# While a cancelled item is still running, interrupt() again this often: an interrupt that
# lands between two statements is forgotten by SQLite when the next statement starts.
_REINTERRUPT_EVERY: Final = 0.02


class TransactionLostError(DatabaseError):
    """SQLite ended the transaction on its own (an interrupted or failed write rolls it back)."""


def check_sqlite_version() -> None:
    """ConfigError unless apsw's SQLite is at least :data:`MIN_SQLITE_VERSION`."""
    text = apsw.sqlite_lib_version()
    version = tuple(int(p) for p in text.split(".")[:3])
    if version < MIN_SQLITE_VERSION:
        need = ".".join(map(str, MIN_SQLITE_VERSION))
        raise ConfigError(
            "sqlite",
            f"River needs SQLite >= {need} (jsonb, JSON paths, 'subsec'); apsw uses SQLite {text}. "
            "Install a newer apsw wheel (they bundle SQLite): pip install -U apsw",
            text,
        )


def quote_ident(name: str) -> str:
    """A double-quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


#: The path :func:`path_from_url` gives for River's in-memory forms.
MEMORY = ":memory:"
#: The database behind :data:`MEMORY`: SQLite's ``memdb`` VFS shares a database whose name
#: begins with "/" among every connection of the process that opens it (the writer and the
#: listener's reader alike), with ordinary locking, until the last of them closes.
_MEMDB_URI = "file:/river-anyio-memory?vfs=memdb"


def path_from_url(url_or_path: str, *, absolute: bool = True) -> str:
    """The absolute file path a ``sqlite:`` URL (or a plain path) names, by River's rules.

    River's CLIs and drivers read what follows ``sqlite://`` (or, in the short form, ``sqlite:``)
    as the file path, so the same string opens the same file in every River client:

    - ``sqlite://river.db`` and ``sqlite:river.db``: ``river.db``, relative to the current
      directory;
    - ``sqlite:///var/lib/app/river.db`` and ``sqlite:/var/lib/app/river.db``: the absolute
      path ``/var/lib/app/river.db``;
    - ``sqlite://:memory:`` and ``sqlite::memory:`` (and the plain path ``:memory:``): an
      in-memory database, returned as :data:`MEMORY`. It belongs to this process: every driver
      the process opens on it shares it, and it is gone once the last of them closes;
    - ``sqlite://`` and ``sqlite:``: no path, rejected as River rejects it.

    Anything without the ``sqlite:`` prefix is a filesystem path, used as is. The path is taken
    verbatim (no percent-decoding, as River's drivers do). Relative paths are made absolute
    (``absolute=False`` leaves that to the caller, which the driver does off the event loop:
    it reads the working directory), so later connections (the listener's) open the same file
    if the working directory changes.

    Rejected with ConfigError: query strings (``?``) and ``file:`` URIs.
    """
    field = "database_url"
    if not isinstance(url_or_path, str):
        raise ConfigError(field, f"must be a str, not {type(url_or_path).__name__}")
    raw = url_or_path
    forms = "sqlite://relative.db, sqlite:///absolute/path.db (or sqlite:relative.db, sqlite:/absolute/path.db)"
    if raw[:7].lower() == "sqlite:":
        rest = raw[7:]
        path = rest[2:] if rest.startswith("//") else rest
        if "?" in path:
            raise ConfigError(
                field,
                f"query parameters are not supported in SQLite URLs (got {raw!r}); use {forms}",
                raw,
            )
        if not path:
            raise ConfigError(field, f"the SQLite URL {raw!r} names no file; use {forms}", raw)
    else:
        if raw.lower().startswith("file:"):
            raise ConfigError(
                field, f"file: URIs are not supported (got {raw!r}); use {forms}", raw
            )
        if not raw:
            raise ConfigError(field, f"an empty path names no file; use {forms}", raw)
        path = raw
    if path == MEMORY:
        return MEMORY
    if path == "/:memory:":
        raise ConfigError(
            field,
            f"{raw!r} names a file /:memory:; an in-memory database is sqlite://:memory:",
            raw,
        )
    if path.endswith("/"):
        raise ConfigError(field, f"{raw!r} names a directory, not a database file", raw)
    if "\x00" in path:
        raise ConfigError(field, "the path contains a NUL character", raw)
    if path.startswith("//"):  # sqlite:////abs: POSIX reads "//abs" as "/abs"; say it once
        path = "/" + path.lstrip("/")
    if os.path.isabs(path) or not absolute:
        return os.path.normpath(path)  # no system call
    return os.path.abspath(path)


def rollback_quietly(conn: apsw.Connection) -> None:
    """Roll back if a transaction is open; never raises (logs instead).

    Retries a rollback hit by a late ``interrupt()`` from a canceller.
    """
    for _ in range(3):
        if not conn.in_transaction:
            return
        try:
            conn.execute("ROLLBACK")
            return
        except apsw.InterruptError:
            continue
        except Exception as exc:  # apsw's, or a sqlite3-API module's (sqlite_module)
            if is_interrupt(exc):
                continue
            logger.warning("sqlite: ROLLBACK failed: %r", exc)
            return
    if conn.in_transaction:
        logger.warning("sqlite: ROLLBACK kept being interrupted; transaction still open")


Waker = Callable[[Callable[[], object]], object]


def _current_loop_waker() -> Waker:
    """A thread-safe, non-blocking "run this callback on the current event loop soon".

    asyncio's ``loop.call_soon_threadsafe`` and trio's ``TrioToken.run_sync_soon`` are public
    APIs of those libraries and don't make the worker thread wait for the loop. AnyIO's public
    ``from_thread.run_sync`` does: it blocks until the callback ran, so the next queued unit of
    work waits for event-loop latency (measured: 2-3x slower with 8 concurrent tasks). Other
    backends fall back to it. Looked up per call (a few hundred ns), so a wake-up always goes
    to the loop of the task that is waiting.
    """
    trio = sys.modules.get("trio")
    if trio is not None and trio.lowlevel.in_trio_run():
        run_sync_soon: Waker = trio.lowlevel.current_trio_token().run_sync_soon
        return run_sync_soon
    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:
        pass
    anyio_token = anyio.lowlevel.current_token()

    def blocking(fn: Callable[[], object]) -> object:
        return anyio.from_thread.run_sync(fn, token=anyio_token)

    return blocking


class _Item:
    """One unit of work queued for the thread and its outcome."""

    __slots__ = ("allow_open_tx", "args", "cancelled", "done", "error", "fn", "value", "wake")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], allow_open_tx: bool) -> None:
        self.fn = fn
        self.args = args
        self.allow_open_tx = allow_open_tx
        self.done = anyio.Event()
        self.wake = _current_loop_waker()
        self.cancelled = False
        self.value: Any = None
        self.error: BaseException | None = None


class _Skipped(Exception):
    """The item was cancelled before the thread started it."""


class ConnectionThread:
    """An apsw connection owned by one dedicated OS thread (see the module docstring).

    ``module``: a ``sqlite3``-API module (``pysqlite3.dbapi2``, ``sqlite3``) to open the
    connection with instead of apsw, seen through :class:`~._dbapi.Sqlite3AsApsw`; its errors
    are translated as apsw's are, and the busy handler below serves it too.

    Use from the event loop that called :meth:`start`.
    """

    def __init__(
        self,
        path: str,
        *,
        readonly: bool = False,
        busy_timeout: float = 5.0,
        attach: Mapping[str, str] | None = None,
        name: str = "river-sqlite",
        module: Any = None,
        wal_hook: Callable[[apsw.Connection, str, int], int] | None = None,
    ) -> None:
        self.path = path
        self.readonly = readonly
        self.module = module
        # What a non-apsw error becomes (the sqlite_module's); None with apsw
        self._translate_other = None if module is None else dbapi_translator(module)
        self.busy_timeout = busy_timeout
        self._attach = dict(attach or {})
        self._name = name
        #: the WAL hook of a writer's apsw connection to a file (it replaces SQLite's own
        #: checkpoints from commits: see ``_checkpoint``)
        self._wal_hook = wal_hook
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards _current and item.cancelled
        self._current: _Item | None = None
        self._cancel_wait = threading.Event()  # set => the running item was cancelled
        self._busy_deadline = 0.0
        self._conn: apsw.Connection | None = None
        self._thread: threading.Thread | None = None
        self._stop_waker: Waker | None = None
        self._stopped: anyio.Event | None = None
        self._closed = False
        self._gate = anyio.Semaphore(1, fast_acquire=True)
        self._owner: object = None  # id of the task holding the checkout
        #: Called (on the event loop, must not block) when the running unit is cancelled, to
        #: wake a unit that waits on something other than SQL (the listener's watch).
        self.cancel_hook: Callable[[], object] | None = None
        #: Told of every unit of work this thread runs, so listeners know its commits: one
        #: per database file a listener follows the WAL index of (none costs nothing).
        self.own_commits: tuple[OwnCommits, ...] = ()

    # ---- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the thread and open the connection in it (errors are translated)."""
        if self._thread is not None:
            raise RuntimeError("ConnectionThread.start() called twice")
        self._stopped = anyio.Event()
        self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
        self._thread.start()
        try:
            self._conn = await self._submit(False, self._open)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._stop_thread()
            raise
        logger.debug(
            "sqlite: opened %s (%s)", self.path, "read-only" if self.readonly else "writer"
        )

    async def aclose(self) -> None:
        """Finish queued work, close the connection and join the thread (never blocks the loop)."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self._stop_thread()
        logger.debug("sqlite: closed %s", self.path)

    async def _stop_thread(self) -> None:
        self._closed = True
        thread = self._thread
        if thread is None or self._stopped is None:
            return
        self._stop_waker = _current_loop_waker()
        self._queue.put(None)
        await self._stopped.wait()
        # The thread set _stopped as its very last action; join() returns almost at once.
        await anyio.to_thread.run_sync(thread.join)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def cancel_requested(self) -> threading.Event:
        """Set once the unit of work now running has been cancelled. A unit that waits (the
        listener's watch) checks it, since ``interrupt()`` only stops SQL statements."""
        return self._cancel_wait

    # ---- running work ---------------------------------------------------------------------------

    async def run(self, fn: Callable[[apsw.Connection, *Ts], T], *args: *Ts) -> T:
        """Run ``fn(conn, *args)`` in the thread: one hop. apsw errors come back translated.

        ``fn`` must leave no transaction open (an open one is rolled back and logged). If
        another task holds the checkout, waits for it to be released first.
        """
        if self._gate.value == 0:
            if self._owner == anyio.get_current_task().id:
                raise RuntimeError(
                    "deadlock: this task holds an open SQLite transaction; use the "
                    "transaction's executor instead of driver.executor() inside it"
                )
            async with self._gate:
                pass
        return await self._submit(False, fn, self._require_conn(), *args)

    @asynccontextmanager
    async def checkout(self) -> AsyncIterator[Session]:
        """Exclusive use of the connection across several hops (for a transaction)."""
        self._require_conn()
        if self._owner == anyio.get_current_task().id:
            raise RuntimeError("this task already holds the SQLite connection (nested transaction)")
        await self._gate.acquire()
        self._owner = anyio.get_current_task().id
        try:
            yield Session(self)
        finally:
            self._owner = None
            self._gate.release()

    def _require_conn(self) -> apsw.Connection:
        if self._closed or self._conn is None:
            raise ConnectionLostError("sqlite: the driver is closed")
        return self._conn

    async def _submit(self, allow_open_tx: bool, fn: Callable[..., T], *args: Any) -> T:
        item = _Item(fn, args, allow_open_tx)
        self._queue.put(item)
        try:
            await item.done.wait()
        except BaseException:
            # Cancelled (or interrupted): stop the work, then wait for it to really end.
            self._cancel(item)
            with anyio.CancelScope(shield=True):
                while not item.done.is_set():
                    with anyio.move_on_after(_REINTERRUPT_EVERY):
                        await item.done.wait()
                    if not item.done.is_set():
                        self._cancel(item)
            raise
        if item.error is not None:
            err = item.error
            item.error = None  # no reference cycle through the traceback
            if isinstance(err, apsw.Error):
                raise translate(err) from err
            if self._translate_other is not None:
                mapped = self._translate_other(err)
                if mapped is not None:
                    raise mapped from err
            raise err
        value: T = item.value
        return value

    def _cancel(self, item: _Item) -> None:
        with self._lock:
            item.cancelled = True
            if self._current is item:
                self._cancel_wait.set()
                if self._conn is not None:
                    self._conn.interrupt()
                if self.cancel_hook is not None:
                    self.cancel_hook()

    # ---- thread side ------------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            while (item := self._queue.get()) is not None:
                self._execute(item)
        finally:
            conn, self._conn = self._conn, None
            if conn is not None:
                try:
                    rollback_quietly(conn)
                    conn.close()
                except Exception as exc:  # pragma: no cover - close errors are unexpected
                    logger.warning("sqlite: error closing %s: %r", self.path, exc)
            if self._stopped is not None and self._stop_waker is not None:
                self._wake(self._stop_waker, self._stopped.set)

    def _execute(self, item: _Item) -> None:
        with self._lock:
            skip = item.cancelled
            if not skip:
                self._current = item
                self._cancel_wait.clear()
        if skip:
            item.error = _Skipped()
        else:
            owns = self.own_commits
            conn = self._conn
            if owns and conn is not None:
                for own in owns:
                    own.unit_begins(conn)
            try:
                item.value = item.fn(*item.args)
            except BaseException as exc:
                item.error = exc
            finally:
                with self._lock:
                    self._current = None
            conn = self._conn
            if not item.allow_open_tx and conn is not None and conn.in_transaction:
                logger.warning("sqlite: a unit of work left a transaction open; rolling back")
                rollback_quietly(conn)
            if owns and conn is not None:
                for own in owns:
                    own.unit_ends(conn)
        self._wake(item.wake, item.done.set)

    def _wake(self, waker: Waker, callback: Callable[[], object]) -> None:
        try:
            waker(callback)
        except Exception as exc:  # the event loop is gone: nobody is waiting any more
            logger.debug("sqlite: could not wake the event loop: %r", exc)

    def _busy(self, count: int) -> bool:
        # SQLite calls this while a lock is held elsewhere; False means "give up" (BusyError).
        now = time.monotonic()
        if count == 0:
            self._busy_deadline = now + self.busy_timeout
        remaining = self._busy_deadline - now
        if remaining <= 0:
            return False
        delay = min(_BUSY_DELAYS[min(count, len(_BUSY_DELAYS) - 1)], remaining)
        return not self._cancel_wait.wait(delay)

    def _open(self) -> apsw.Connection:
        if self.path == MEMORY:
            return self._open_memory()
        parent = os.path.dirname(self.path)
        if not os.path.isdir(parent):
            raise ConfigError(
                "database_url",
                f"directory {parent!r} does not exist (the driver does not create directories)",
                self.path,
            )
        if self.module is not None:
            # the adapter has the apsw methods the driver's operations use
            return cast(
                apsw.Connection,
                open_dbapi(
                    self.module,
                    self.path,
                    busy_timeout=self.busy_timeout,
                    attach=self._attach,
                    readonly=self.readonly,
                    busy=self._busy,
                ),
            )
        if self.readonly:
            flags = apsw.SQLITE_OPEN_READONLY
        else:
            flags = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
        conn = apsw.Connection(self.path, flags=flags)
        try:
            conn.set_busy_handler(self._busy)
            conn.pragma("foreign_keys", 1)
            for name, path in self._attach.items():
                conn.execute(f"ATTACH DATABASE ? AS {quote_ident(name)}", (path,))
            if not self.readonly:
                for schema in ("main", *self._attach):
                    mode = self._set_wal(conn, schema)
                    if str(mode).lower() != "wal":
                        logger.warning("sqlite: %s: journal_mode is %s, not wal", schema, mode)
                    conn.pragma("synchronous", "normal", schema=schema)
                if self._wal_hook is not None:
                    conn.set_wal_hook(self._wal_hook)
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_memory(self) -> apsw.Connection:
        # no WAL (memdb keeps no journal file) and nothing attached (attach refuses memory)
        access = apsw.SQLITE_OPEN_READONLY if self.readonly else apsw.SQLITE_OPEN_READWRITE
        flags = apsw.SQLITE_OPEN_URI | apsw.SQLITE_OPEN_CREATE | access
        if self.readonly:
            flags &= ~apsw.SQLITE_OPEN_CREATE
        conn = apsw.Connection(_MEMDB_URI, flags=flags)
        try:
            conn.set_busy_handler(self._busy)
            conn.pragma("foreign_keys", 1)
        except BaseException:
            conn.close()
            raise
        return conn

    def _set_wal(self, conn: apsw.Connection, schema: str) -> Any:
        """Switch to WAL. The switch needs an exclusive lock, and SQLite reports BUSY for it
        without calling the busy handler when another connection (say, a second process
        opening a new file at the same moment) holds a lock, so retry here, on this thread,
        within the busy timeout."""
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.001
        while True:
            try:
                return conn.pragma("journal_mode", "wal", schema=schema)
            except apsw.BusyError:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.05)


class Session:
    """The checked-out connection of one transaction: hops that may leave it open."""

    __slots__ = ("begun", "ended", "notified", "owner")

    def __init__(self, owner: ConnectionThread) -> None:
        self.owner = owner
        #: BEGIN IMMEDIATE ran (it is sent lazily with the first statement hop).
        self.begun = False
        #: The ``transaction()`` block ended: its executors may not be used any more.
        self.ended = False
        #: Notifications were written in this transaction (listeners get poked after commit).
        self.notified = False

    async def run(self, fn: Callable[[apsw.Connection, *Ts], T], *args: *Ts) -> T:
        """Run ``fn(conn, *args)`` inside the transaction (begun on first use): one hop."""
        return await self.owner._submit(True, self._in_tx, fn, self.owner._require_conn(), args)

    async def run_if(
        self,
        due: Callable[[apsw.Connection], bool],
        fn: Callable[[apsw.Connection], T],
        otherwise: T,
    ) -> T:
        """:meth:`run`, except that while the transaction has not begun, the read ``due`` runs
        first, outside it: when it is False, ``otherwise`` comes back and nothing begins (no
        BEGIN, no write lock, no COMMIT). One hop either way."""
        return await self.owner._submit(
            True, self._if, due, fn, otherwise, self.owner._require_conn()
        )

    def _if(
        self,
        due: Callable[[apsw.Connection], bool],
        fn: Callable[[apsw.Connection], T],
        otherwise: T,
        conn: apsw.Connection,
    ) -> T:
        if not self.begun and not due(conn):
            return otherwise
        return self._in_tx(fn, conn, ())

    def _in_tx(
        self, fn: Callable[[apsw.Connection, *Ts], T], conn: apsw.Connection, args: tuple[*Ts]
    ) -> T:
        if not self.begun:
            conn.execute("BEGIN IMMEDIATE")
            self.begun = True
        elif not conn.in_transaction:
            raise TransactionLostError(
                "sqlite: the transaction is no longer open (SQLite rolled it back after an "
                "interrupted or failed statement); nothing of it was committed"
            )
        return fn(conn, *args)

    async def finish(self, *, commit: bool, bound: float) -> None:
        """COMMIT (or ROLLBACK) in a shielded, time-bounded hop.

        A failed or timed-out COMMIT is rolled back and raised; a ROLLBACK never raises.
        """
        if not self.begun:
            return
        owner = self.owner
        with anyio.CancelScope(shield=True):
            if commit:
                try:
                    with anyio.fail_after(bound):
                        await owner._submit(True, _commit, owner._require_conn())
                    return
                except TimeoutError:
                    await self._rollback(bound)
                    raise DatabaseError(f"sqlite: COMMIT did not finish within {bound} s") from None
                except BaseException:
                    await self._rollback(bound)
                    raise
            await self._rollback(bound)

    async def _rollback(self, bound: float) -> None:
        if self.owner._conn is None:
            return
        with anyio.move_on_after(bound) as scope:
            await self.owner._submit(False, rollback_quietly, self.owner._conn)
        if scope.cancelled_caught:
            logger.warning("sqlite: ROLLBACK did not finish within %s s", bound)


def _commit(conn: apsw.Connection) -> None:
    if not conn.in_transaction:
        raise TransactionLostError(
            "sqlite: the transaction is no longer open (SQLite rolled it back after an "
            "interrupted or failed statement); nothing of it was committed"
        )
    conn.execute("COMMIT")


def write_unit(conn: apsw.Connection, fn: Callable[[apsw.Connection], T]) -> T:
    """Run ``fn`` in ``BEGIN IMMEDIATE`` … ``COMMIT``, rolling back on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn)
        conn.execute("COMMIT")
    except BaseException:
        rollback_quietly(conn)
        raise
    return result
