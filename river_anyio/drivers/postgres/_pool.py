"""A small AnyIO connection pool for :class:`AnyioConnection` (asyncio and trio).

``psycopg_pool`` is asyncio-only and, under AnyIO cancel scopes, closes a connection whenever
a query is cancelled while the query keeps running on the server. This pool:

* hands out at most ``max_size`` connections; waiters queue FIFO on a semaphore and give up
  after the acquire timeout with :class:`~river_anyio.PoolTimeoutError`;
* reuses the most recently returned idle connection first (LIFO keeps hot ones warm and lets
  the rest sit idle);
* checks a connection on return: a clean idle one goes straight back (no await, no scope);
  otherwise, shielded and bounded, an open transaction is rolled back, and a connection that
  is busy, broken or inside an unfinished ``transaction()`` block is closed.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio
import attrs
import psycopg
from psycopg import pq

from ..._errors import ConfigError, PoolTimeoutError
from ._connection import CLEANUP_TIMEOUT, AnyioConnection

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

__all__ = ["Pool", "PoolStatistics"]

logger = logging.getLogger("river_anyio.driver")

_IDLE = pq.TransactionStatus.IDLE
_INTRANS = pq.TransactionStatus.INTRANS
_INERROR = pq.TransactionStatus.INERROR


@attrs.frozen(kw_only=True)
class PoolStatistics:
    """A snapshot of a pool: connections open (``size``), ``idle`` and ``in_use``; tasks
    ``waiting`` for one; and totals of connections opened (``connects``, counting dedicated
    ones such as a listener's) and ``discarded``."""

    max_size: int
    size: int
    idle: int
    in_use: int
    waiting: int
    connects: int
    discarded: int


class Pool:
    """A pool of autocommit :class:`AnyioConnection` (see the module docstring)."""

    def __init__(
        self,
        conninfo: str,
        *,
        max_size: int = 10,
        acquire_timeout: float = 30.0,
        connect_timeout: float | None = 10.0,
        prepare_threshold: int | None = 5,
    ) -> None:
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ConfigError("pool_max_size", "must be an int >= 1", max_size)
        self._conninfo = conninfo
        self._max_size = max_size
        self._acquire_timeout = acquire_timeout
        self._connect_timeout = connect_timeout
        self._prepare_threshold = prepare_threshold
        self._idle: deque[AnyioConnection] = deque()
        self._slots = anyio.Semaphore(max_size, fast_acquire=True)
        self._in_use = 0
        self._waiting = 0
        self._connects = 0
        self._discarded = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def statistics(self) -> PoolStatistics:
        return PoolStatistics(
            max_size=self._max_size,
            size=len(self._idle) + self._in_use,
            idle=len(self._idle),
            in_use=self._in_use,
            waiting=self._waiting,
            connects=self._connects,
            discarded=self._discarded,
        )

    async def connect(self) -> AnyioConnection:
        """Open a new connection with the pool's settings, outside the pool."""
        conn = await AnyioConnection.connect(
            self._conninfo,
            autocommit=True,
            prepare_threshold=self._prepare_threshold,
            connect_timeout=self._connect_timeout,
        )
        self._connects += 1
        return conn

    async def getconn(self) -> AnyioConnection:
        """Take a connection (open one if none is idle); give it back with :meth:`putconn`.

        Raises :class:`PoolTimeoutError` when none is free within the acquire timeout.
        """
        if self._closed:
            raise psycopg.OperationalError("the connection pool is closed")
        try:
            self._slots.acquire_nowait()  # hot path: no cancel scope
        except anyio.WouldBlock:
            await self._wait_for_slot()
        try:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    self._in_use += 1
                    return conn
                self._discarded += 1
            conn = await self.connect()
            if self.closed:  # closed while we were connecting
                await conn.close()
                raise psycopg.OperationalError("the connection pool is closed")
            self._in_use += 1
            return conn
        except BaseException:
            self._slots.release()
            raise

    async def _wait_for_slot(self) -> None:
        timeout = self._acquire_timeout
        self._waiting += 1
        try:
            with anyio.fail_after(timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise PoolTimeoutError(
                f"no connection became free within {timeout:g}s (pool max size {self._max_size})"
            ) from None
        finally:
            self._waiting -= 1

    async def putconn(self, conn: AnyioConnection) -> None:
        """Give a connection back; it is reset or closed as needed (never raises)."""
        self._in_use -= 1
        if (
            not self._closed
            and not conn.reset_prepared
            and not conn._num_transactions
            and conn.pgconn.transaction_status == _IDLE
        ):
            # Clean and idle (the usual case): no await, no cancel scope.
            self._idle.append(conn)
            self._slots.release()
            return
        try:
            with anyio.CancelScope(shield=True) as scope:
                scope.deadline = anyio.current_time() + CLEANUP_TIMEOUT
                reusable = await self._reset(conn)
            if scope.cancelled_caught:
                reusable = False
            if reusable and not self._closed and not conn.closed:
                self._idle.append(conn)
            else:
                self._discarded += 1
                await conn.close()
        finally:
            self._slots.release()

    async def _reset(self, conn: AnyioConnection) -> bool:
        """Make ``conn`` reusable; False when it must be closed instead."""
        if conn.closed:
            return False
        status = conn.pgconn.transaction_status
        if conn._num_transactions or status not in (_IDLE, _INTRANS, _INERROR):
            # Busy (ACTIVE), unknown, or inside an unfinished transaction() block whose
            # bookkeeping psycopg would keep: not worth repairing.
            return False
        try:
            if status != _IDLE:
                await conn.rollback()
            if conn.reset_prepared:
                # Prepared statements went stale after DDL elsewhere (psycopg clears its
                # own cache when it sees this command).
                await conn.deallocate_all()
                conn.reset_prepared = False
        except psycopg.Error as exc:
            logger.warning("could not reset a returned connection, closing it: %s", exc)
            return False
        return conn.pgconn.transaction_status == _IDLE

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AnyioConnection]:
        """A connection for the duration of the block."""
        conn = await self.getconn()
        try:
            yield conn
        finally:
            await self.putconn(conn)

    async def aclose(self) -> None:
        """Close idle connections now; those in use are closed when given back."""
        self._closed = True
        while self._idle:
            await self._idle.pop().close()

    async def __aenter__(self) -> Pool:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()
