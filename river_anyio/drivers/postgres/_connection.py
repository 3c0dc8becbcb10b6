"""A psycopg ``AsyncConnection`` whose socket waits go through AnyIO (asyncio and trio).

psycopg drives every operation through backend-neutral generators that yield "wait for
read/write" requests; its async class answers them with asyncio. We answer them with AnyIO, so
the whole psycopg API (cursors, transactions, COPY, pipelines, ``notifies()``) runs on both
loops, and cancellation by an AnyIO scope cancels the query on the server instead of closing
the connection and leaving the query running.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import re
import select
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.lowlevel
import psycopg
from psycopg import errors as pg_errors
from psycopg import generators, pq
from psycopg.adapt import PyFormat, Transformer
from psycopg.conninfo import conninfo_attempts, conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow, tuple_row
from psycopg.waiting import Ready, Wait

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from psycopg.abc import PQGen, PQGenConn
    from psycopg.abc import Transformer as TransformerType

__all__ = ["CLEANUP_TIMEOUT", "AnyioConnection", "shielded_transaction"]

logger = logging.getLogger("river_anyio.driver")

RV = TypeVar("RV")

#: Upper bound for cleanup that runs shielded from cancellation (cancel + drain, COMMIT or
#: ROLLBACK on the way out of a transaction). Past it the connection is closed instead.
CLEANUP_TIMEOUT = 5.0

# Yield to the scheduler at least this often even when the socket never blocks (psycopg's
# own fairness policy).
_MAX_BUSY = 0.005
_last_yield = 0.0

_ACTIVE = pq.TransactionStatus.ACTIVE
_POLL_MASK = {
    Wait.R: select.POLLIN,
    Wait.W: select.POLLOUT,
    Wait.RW: select.POLLIN | select.POLLOUT,
}
_POLL_READABLE = select.POLLIN | select.POLLERR | select.POLLHUP
_IDLE = pq.TransactionStatus.IDLE
_CONN_OK = pq.ConnStatus.OK
_BINARY = pq.Format.BINARY
_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_FATAL_ERROR = pq.ExecStatus.FATAL_ERROR
_SQLSTATE = pq.DiagnosticField.SQLSTATE
#: invalid_sql_statement_name: the prepared statement does not exist
_UNDEFINED_PREPARED = b"26000"

#: A direct statement is prepared anew this long after it was first prepared, then after
#: twice as long each time, up to ``_REPREPARE_MAX`` (seconds): PostgreSQL settles a prepared
#: statement's generic plan on the table as it is then, and a plan made while ``river_job`` was
#: nearly empty (sequential scans) would otherwise last until autovacuum next analyzes it.
_REPREPARE_FIRST = 0.25
_REPREPARE_MAX = 60.0


class _Prepared:
    """A direct statement's prepared name, and when to prepare it anew."""

    __slots__ = ("due", "interval", "name")

    def __init__(self, name: bytes, interval: float) -> None:
        self.name = name
        self.interval = interval
        self.due = time.monotonic() + interval


# The direct path's placeholders: psycopg's (``%s``, or ``%(name)s`` for parameters given by
# name), numbered once per statement text.
_PLACEHOLDER = re.compile(r"%(\((\w+)\))?(.)")


@functools.lru_cache(maxsize=256)
def _numbered(query: str) -> tuple[bytes, tuple[str, ...] | None]:
    """``query`` with numbered placeholders (``$1``, ``$2``...; ``%%`` as ``%``), and the
    names of its parameters in their order when they are named (a name used twice is one
    parameter, as psycopg binds it)."""
    names: dict[str, int] = {}
    positional = 0

    def number(m: re.Match[str]) -> str:
        nonlocal positional
        if m.group(3) == "%" and m.group(1) is None:
            return "%"
        if m.group(3) != "s":
            raise ValueError(f"unsupported placeholder {m.group()!r}")
        name = m.group(2)
        if name is None:
            positional += 1
            return f"${positional}"
        return f"${names.setdefault(name, len(names) + 1)}"

    sql = _PLACEHOLDER.sub(number, query)
    if names and positional:
        raise ValueError("a statement mixes named and positional placeholders")
    return sql.encode(), tuple(names) if names else None


def _poll_now(fd: int, wait: int) -> int:
    """Readiness of ``fd`` right now, without blocking (0 when not ready)."""
    poller = select.poll()
    poller.register(fd, _POLL_MASK[Wait(wait)])
    ready = 0
    for _, events in poller.poll(0):
        if events & _POLL_READABLE:
            ready |= Ready.R
        if events & select.POLLOUT:
            ready |= Ready.W
    return ready


async def _wait_rw(fd: int) -> int:
    """Block until ``fd`` is readable or writable (send buffer full, pipeline mode)."""
    ready = 0
    async with anyio.create_task_group() as tg:

        async def one(readable: bool) -> None:
            nonlocal ready
            if readable:
                await anyio.wait_readable(fd)
                ready |= Ready.R
            else:
                await anyio.wait_writable(fd)
                ready |= Ready.W
            tg.cancel_scope.cancel("the socket is ready")

        tg.start_soon(one, True)
        tg.start_soon(one, False)
    return ready


async def _wait_fd(fd: int, wait: int) -> int:
    if wait == Wait.R:
        await anyio.wait_readable(fd)
        return Ready.R
    # A socket asked for writing is nearly always writable: poll(0) is far cheaper than
    # registering with the loop.
    ready = _poll_now(fd, wait)
    if ready:
        return ready
    if wait == Wait.W:
        await anyio.wait_writable(fd)
        return Ready.W
    return await _wait_rw(fd)


async def _drive(gen: PQGen[RV], fd: int) -> RV:
    """Run a psycopg generator that works on one socket to completion."""
    global _last_yield
    try:
        wait = next(gen)
        while True:
            ready = await _wait_fd(fd, wait)
            _last_yield = time.monotonic()
            wait = gen.send(Ready(ready))
    except StopIteration as stop:
        if time.monotonic() - _last_yield >= _MAX_BUSY:
            await anyio.lowlevel.cancel_shielded_checkpoint()
            _last_yield = time.monotonic()
        result: RV = stop.value
        return result
    except (OSError, anyio.ClosedResourceError) as exc:
        # ClosedResourceError: close() called notify_closing() on the socket we waited on.
        raise psycopg.OperationalError("the connection socket was closed") from exc


async def _drive_conn(gen: PQGenConn[RV]) -> RV:
    """Run a psycopg generator that may change sockets (connect, cancel) to completion."""
    try:
        fd, wait = next(gen)
        while True:
            ready = await _wait_fd(fd, wait)
            fd, wait = gen.send(Ready(ready))
    except StopIteration as stop:
        result: RV = stop.value
        return result


def _new_lock() -> anyio.Semaphore:
    # Owner-less, like asyncio.Lock: notifies() may be finalised by another task, and
    # anyio.Lock refuses a release from a task that does not own it.
    return anyio.Semaphore(1, fast_acquire=True)


class AnyioConnection(psycopg.AsyncConnection[TupleRow]):
    """An ``AsyncConnection`` that runs on any AnyIO backend (asyncio or trio).

    Create it with :meth:`connect`. A cancelled query is cancelled on the server and its
    result drained (bounded by :data:`CLEANUP_TIMEOUT`), so the connection stays usable.
    """

    def __init__(self, pgconn: pq.abc.PGconn, row_factory: Any = tuple_row) -> None:
        super().__init__(pgconn, row_factory)
        self._lock = _new_lock()
        self.lock = self._lock  # type: ignore[assignment]
        #: Set when a prepared statement went stale; the pool runs DEALLOCATE ALL on return.
        self.reset_prepared = False
        # the direct path's adaptation (kept: its dumper and loader caches outlive one
        # statement) and its prepared statements, by statement and parameter types
        self._direct_tx: TransformerType | None = None
        self._direct_names: dict[tuple[str, tuple[int, ...] | None], _Prepared] = {}
        self._direct_count = itertools.count()

    async def execute_direct(
        self, query: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        """Run one statement and return its rows (binary results, as tuples): the driver's
        frequent statements (claims, inserts, completions) take this path.

        It does what a cursor's ``execute`` and ``fetchall`` do for one statement (``%s``
        or ``%(name)s`` placeholders), straight on libpq, without a cursor's per-statement
        bookkeeping (which costs the client more CPU than the statement's round trip): the
        parameters are adapted by the connection's adapters; the statement is prepared on
        first use, unless ``prepare_threshold`` is None (as behind a pooler without
        prepared statements) or ``prepared_max`` statements are prepared already; and a
        cancelled statement is cancelled on the server and drained, as :meth:`wait` does.
        Outside a transaction, a prepared statement that went missing (``DEALLOCATE`` or
        ``DISCARD`` run by someone else) is prepared again.
        """
        if self._pipeline is not None or (
            not self.autocommit and self.pgconn.transaction_status == _IDLE
        ):
            # psycopg's own path: a pipeline, or a transaction psycopg would begin itself
            cur = await self.cursor(binary=True).execute(query, params)
            res = cur.pgresult
            return await cur.fetchall() if res is not None and res.nfields else []
        await self._acquire()
        try:
            return await self._direct(query, params)
        finally:
            self._lock.release()

    async def _acquire(self) -> None:
        """Take the connection's lock (psycopg's), without a task switch when it is free."""
        try:
            self._lock.acquire_nowait()
        except anyio.WouldBlock:
            await self._lock.acquire()

    async def _direct(
        self,
        query: str,
        params: Sequence[Any] | Mapping[str, Any] | None,
        *,
        again: bool = True,
    ) -> list[tuple[Any, ...]]:
        pgconn = self.pgconn
        if pgconn.status != _CONN_OK:
            self._check_connection_ok()
        tx = self._direct_tx
        if tx is None:
            tx = self._direct_tx = Transformer(self)
        args: Sequence[Any]
        if params is None:
            sql, args = query.encode(), ()
        else:
            sql, names = _numbered(query)
            if names is None:
                if isinstance(params, Mapping):
                    raise TypeError("parameters by name for a statement taking them in order")
                args = params
            else:
                if not isinstance(params, Mapping):
                    raise TypeError("parameters in order for a statement taking them by name")
                args = [params[name] for name in names]
        values = tx.dump_sequence(args, [PyFormat.AUTO] * len(args))
        types = tx.types
        formats = tx.formats
        key = (query, types)
        name: bytes | None = None
        prepared = self._direct_names.get(key)
        if prepared is not None:
            name = prepared.name
            if prepared.due <= time.monotonic() and pgconn.transaction_status == _IDLE:
                name = await self._direct_prepare(
                    key, sql, types, min(2 * prepared.interval, _REPREPARE_MAX)
                )
                await self._direct_deallocate(prepared.name)
        elif self.prepare_threshold is not None and (
            self.prepared_max is None or len(self._direct_names) < self.prepared_max
        ):
            name = await self._direct_prepare(key, sql, types, _REPREPARE_FIRST)
        if name is None:  # not prepared: no prepared statements, or as many as psycopg keeps
            pgconn.send_query_params(
                sql, values, param_types=types, param_formats=formats, result_format=_BINARY
            )
        else:
            pgconn.send_query_prepared(name, values, param_formats=formats, result_format=_BINARY)
        res = await self._result()
        if (
            name is not None
            and again
            and res.status == _FATAL_ERROR
            and res.error_field(_SQLSTATE) == _UNDEFINED_PREPARED
            and pgconn.transaction_status == _IDLE
        ):
            # dropped behind our back (DEALLOCATE, a pooler's DISCARD): forget this one only
            # (others may have been prepared since) and prepare it anew
            self._direct_names.pop(key, None)
            return await self._direct(query, params, again=False)
        self._check_result(res)
        if not res.nfields:
            return []
        tx.set_pgresult(res)
        rows: list[tuple[Any, ...]] = tx.load_rows(0, res.ntuples, tuple)
        tx.set_pgresult(None, set_loaders=False)  # not kept until the next statement
        return rows

    async def _direct_prepare(
        self,
        key: tuple[str, tuple[int, ...] | None],
        sql: bytes,
        types: Sequence[int] | None,
        interval: float,
    ) -> bytes:
        """Prepare ``sql`` under a new name, to be prepared anew after ``interval``."""
        name = f"_river_{next(self._direct_count)}".encode()
        self.pgconn.send_prepare(name, sql, param_types=types)
        self._check_result(await self._result())
        self._direct_names[key] = _Prepared(name, interval)
        return name

    async def _direct_deallocate(self, name: bytes) -> None:
        """Drop a direct statement prepared anew (outside a transaction: a failure, such as
        the statement being gone already, changes nothing)."""
        self.pgconn.send_query_params(b"DEALLOCATE " + name, None)
        await self._result()

    async def _result(self) -> pq.abc.PGresult:
        """The result of the statement just sent (psycopg's ``execute`` generator, with
        the usual case, one result read in one wait or two, inline)."""
        pgconn = self.pgconn
        if pgconn.flush():  # the send buffer is full: psycopg's generator waits on it
            results: list[pq.abc.PGresult] = await self.wait(generators.execute(pgconn))
            return results[-1]
        fd = pgconn.socket
        try:
            while pgconn.is_busy():
                await anyio.wait_readable(fd)
                pgconn.consume_input()
            while n := pgconn.notifies():
                if pgconn.notify_handler:
                    pgconn.notify_handler(n)
            res = pgconn.get_result()
            if res is None:
                raise psycopg.InterfaceError("the statement returned no result")
            while pgconn.is_busy():
                await anyio.wait_readable(fd)
                pgconn.consume_input()
            while (extra := pgconn.get_result()) is not None:
                res = extra if extra.status not in (_TUPLES_OK, _COMMAND_OK) else res
            return res
        except anyio.get_cancelled_exc_class():
            if pgconn.transaction_status == _ACTIVE:
                await self._cancel_and_drain(generators.fetch_many(pgconn), fd)
            raise
        except (OSError, anyio.ClosedResourceError) as exc:
            raise psycopg.OperationalError("the connection socket was closed") from exc

    def _check_result(self, res: pq.abc.PGresult) -> None:
        if res.status not in (_TUPLES_OK, _COMMAND_OK):
            raise pg_errors.error_from_result(res, encoding=self.pgconn._encoding)

    async def wait_notifications(self) -> list[tuple[str, str]]:
        """Wait for notifications on this (listening) connection: ``(channel, payload)`` of
        each received, at least one; those psycopg received during other commands first.

        What ``notifies(stop_after=1)`` does, read straight off libpq: an idle listening
        connection has nothing in flight, so a cancelled wait leaves it as it was.
        """
        await self._acquire()
        try:
            pgconn = self.pgconn
            enc = pgconn._encoding
            backlog = self._notifies_backlog
            received: list[tuple[str, str]]
            if backlog:
                received = [(n.channel, n.payload) for n in backlog]
                backlog.clear()
                return received
            self._notifies_backlog = None  # as psycopg: nothing reported twice meanwhile
            try:
                fd = pgconn.socket
                handler = pgconn.notify_handler
                received = []
                while True:
                    try:
                        await anyio.wait_readable(fd)
                    except (OSError, anyio.ClosedResourceError) as exc:
                        raise psycopg.OperationalError("the connection socket was closed") from exc
                    pgconn.consume_input()
                    while n := pgconn.notifies():
                        if handler:
                            handler(n)
                        received.append((n.relname.decode(enc), n.extra.decode(enc)))
                    if received:
                        return received
            finally:
                self._notifies_backlog = backlog
        finally:
            self._lock.release()

    async def deallocate_all(self) -> None:
        """Drop every prepared statement of this connection (psycopg's and the direct
        path's), as after DDL made them stale."""
        self._direct_names.clear()
        await self.execute("DEALLOCATE ALL")

    @classmethod
    async def connect(  # type: ignore[override]
        cls,
        conninfo: str = "",
        *,
        autocommit: bool = True,
        prepare_threshold: int | None = 5,
        connect_timeout: float | None = None,
        **kwargs: Any,
    ) -> AnyioConnection:
        """Open a connection (autocommit by default).

        ``connect_timeout`` (seconds) bounds each host attempt; without it the conninfo's
        ``connect_timeout`` applies, if any.
        """
        params = conninfo_to_dict(conninfo, **kwargs)
        if connect_timeout is None:
            raw = params.get("connect_timeout")
            connect_timeout = float(raw) if raw not in (None, "") else None
            if connect_timeout is not None and connect_timeout <= 0:
                connect_timeout = None
        # Host resolution (getaddrinfo) blocks: do it in a worker thread.
        attempts = await anyio.to_thread.run_sync(conninfo_attempts, params)
        errors: list[psycopg.Error] = []
        pgconn: pq.abc.PGconn | None = None
        for attempt in attempts:
            gen = generators.connect(make_conninfo("", **attempt))
            try:
                with anyio.fail_after(connect_timeout):
                    pgconn = await _drive_conn(gen)
            except TimeoutError:
                errors.append(pg_errors.ConnectionTimeout("connection timeout expired"))
            except psycopg.Error as exc:
                errors.append(exc)
            else:
                break
            finally:
                gen.close()  # frees a half-open libpq connection now, not at GC time
        if pgconn is None:
            if not errors:
                raise psycopg.OperationalError("no host to connect to")
            raise errors[-1]
        conn = cls(pgconn)
        conn.prepare_threshold = prepare_threshold
        try:
            await conn.set_autocommit(True)
            if pgconn.parameter_status(b"TimeZone") != b"UTC":
                # Timestamps then load as UTC datetimes, as River's drivers return them, and
                # ~3x faster than converted into a named zone (several columns per job row).
                # PgBouncer tracks TimeZone, so this holds in transaction pooling too.
                await conn.execute(b"SET TimeZone TO 'UTC'", prepare=False)
            if not autocommit:
                await conn.set_autocommit(False)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def wait(
        self,
        gen: PQGen[RV],
        interval: float = 0.1,
        timeout: float | None = None,  # noqa: ASYNC109 (psycopg's signature)
    ) -> RV:
        fd = self.pgconn.socket
        try:
            if timeout is None:
                return await _drive(gen, fd)
            with anyio.move_on_after(timeout):
                return await _drive(gen, fd)
            # notifies(timeout=...) relies on this private exception.
            raise pg_errors._WaitTimeout("wait timeout expired")
        except anyio.get_cancelled_exc_class():
            if self.pgconn.transaction_status == _ACTIVE:
                await self._cancel_and_drain(gen, fd)
            raise

    async def _cancel_and_drain(self, gen: PQGen[Any], fd: int) -> None:
        """Cancel the running query on the server and consume its result, shielded but
        bounded; on failure the connection is closed (its state is unknown)."""
        ok = False
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = anyio.current_time() + CLEANUP_TIMEOUT
            try:
                await self._cancel_request()
                await _drive(gen, fd)
                ok = True
            except pg_errors.QueryCanceled:
                ok = True
            except psycopg.Error as exc:
                logger.warning("query cancellation failed, closing the connection: %s", exc)
        if not ok or scope.cancelled_caught:
            if scope.cancelled_caught:
                logger.warning("query cancellation timed out, closing the connection")
            self._finish()

    async def _cancel_request(self) -> None:
        cancel_conn = self.pgconn.cancel_conn()  # libpq >= 17: non-blocking cancel
        cancel_conn.start()
        await _drive_conn(generators.cancel(cancel_conn))

    async def cancel_safe(self, *, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """Ask the server to cancel the running query (it may already have finished)."""
        if self.closed:
            return
        try:
            with anyio.fail_after(timeout):
                await self._cancel_request()
        except TimeoutError:
            raise pg_errors.CancellationTimeout("cancellation timeout expired") from None

    def _finish(self) -> None:
        # Wake any task blocked on this socket before the descriptor goes away; otherwise it
        # would wait forever on a dead (or reused) fd.
        if not self.closed:
            with contextlib.suppress(Exception):
                anyio.notify_closing(self.pgconn.socket)
        self.pgconn.finish()

    async def close(self) -> None:
        """Close the connection; a task blocked on it wakes with ``OperationalError``."""
        if self.closed:
            return
        self._closed = True
        self._finish()


@contextlib.asynccontextmanager
async def shielded_transaction(
    conn: psycopg.AsyncConnection[Any],
) -> AsyncIterator[psycopg.AsyncTransaction]:
    """``conn.transaction()`` whose BEGIN and COMMIT/ROLLBACK cannot be cut short by
    cancellation (they are shielded, bounded by :data:`CLEANUP_TIMEOUT`).

    A cancelled ``psycopg`` transaction exit never sends ROLLBACK and leaves the connection
    unusable; here it rolls back, or the connection is closed when that times out.
    """
    tx = conn.transaction()
    with anyio.CancelScope(shield=True) as scope:
        scope.deadline = anyio.current_time() + CLEANUP_TIMEOUT
        handle = await tx.__aenter__()
    if scope.cancelled_caught:
        await conn.close()
        raise psycopg.OperationalError("BEGIN timed out")
    try:
        await anyio.lowlevel.checkpoint_if_cancelled()
        yield handle
    except BaseException as exc:
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = anyio.current_time() + CLEANUP_TIMEOUT
            suppress = await tx.__aexit__(type(exc), exc, exc.__traceback__)
        if scope.cancelled_caught:
            logger.warning("rollback timed out, closing the connection")
            await conn.close()
        if not suppress:
            raise
    else:
        if conn.closed:
            # psycopg's exit would quietly skip the COMMIT: the transaction is lost.
            await tx.__aexit__(None, None, None)
            raise psycopg.OperationalError("the connection was lost; nothing was committed")
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = anyio.current_time() + CLEANUP_TIMEOUT
            await tx.__aexit__(None, None, None)
        if scope.cancelled_caught:
            await conn.close()
            raise psycopg.OperationalError("COMMIT timed out; the outcome is unknown")
