"""A psycopg ``AsyncConnection`` whose socket waits go through AnyIO (asyncio and trio).

psycopg drives every operation through backend-neutral generators that yield "wait for
read/write" requests; its async class answers them with asyncio. We answer them with AnyIO, so
the whole psycopg API (cursors, transactions, COPY, pipelines, ``notifies()``) runs on both
loops, and cancellation by an AnyIO scope cancels the query on the server instead of closing
the connection and leaving the query running.
"""

from __future__ import annotations

import contextlib
import logging
import select
import time
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.lowlevel
import psycopg
from psycopg import errors as pg_errors
from psycopg import generators, pq
from psycopg.conninfo import conninfo_attempts, conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow, tuple_row
from psycopg.waiting import Ready, Wait

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from psycopg.abc import PQGen, PQGenConn

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
        self.lock = _new_lock()  # type: ignore[assignment]
        #: Set when a prepared statement went stale; the pool runs DEALLOCATE ALL on return.
        self.reset_prepared = False
        self._kept: psycopg.AsyncCursor[TupleRow] | None = None

    def _kept_cursor(self) -> psycopg.AsyncCursor[TupleRow]:
        """A binary cursor kept across the hot statements (claims, single inserts, lean
        completions): its adaptation caches (parameter dumpers, result loaders) outlive one
        statement, which a new cursor's do not. For small results only: the last one stays
        with the cursor until its next statement."""
        cur = self._kept
        if cur is None or cur.closed:
            cur = self._kept = self.cursor(binary=True)
        return cur

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
