"""River's SQLite notifications: following the ``river_notification`` outbox.

SQLite has no LISTEN/NOTIFY, so senders append rows to ``river_notification`` inside their
transaction and listeners read rows past a cursor. The cursor starts at ``max(id)`` when the
listener connects (no replay of history); each topic also remembers ``max(id)`` when it was
subscribed. Because SQLite serialises writers, ids become visible in increasing order, so the
cursor never skips a row.

When to read: a commit in this process pokes the listener (the driver calls :meth:`poke`), and
a commit by any other connection (another process on the same file) changes the WAL index
header, the first 48 bytes of the ``-shm`` file, whose change counter SQLite increments with
every transaction (https://www.sqlite.org/walformat.html). The reader thread looks at that
header every :data:`WATCH_INTERVAL` (one ``pread``, no SQL, no event-loop wake-up) and runs the
outbox query only when it changed, so an idle listener runs no statement at all. A checkpoint
or a truncated ``-wal`` file changes the header too (at worst one query finds nothing). Where
there is no ``-shm`` file to watch (not in WAL mode, the in-memory database, no ``os.pread``)
the listener falls back to polling the outbox every :data:`POLL_INTERVAL`.

Reads run on the listener's own read-only connection (WAL readers never wait for the writer),
in its own thread, so they neither queue behind the writer's work nor delay it.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import anyio
import apsw

from ..._errors import ConnectionLostError
from .._protocol import Notification

if TYPE_CHECKING:
    from ._connection import ConnectionThread
    from ._queries import Queries

__all__ = ["POLL_INTERVAL", "WATCH_INTERVAL", "SQLiteListener"]

#: Poll interval without a WAL index to watch, as River's SQLite listener.
POLL_INTERVAL: Final = 0.05
#: How often the reader thread looks at the WAL index header for another connection's commit.
WATCH_INTERVAL: Final = 0.005
#: A watch returns to the event loop at least this often (without reading the outbox).
_WATCH_MAX: Final = 30.0
_BATCH: Final = 256
_HEADER: Final = 48  # one copy of the WAL index header


Rows = list[tuple[int, str, str]]


def _op_last_id(conn: apsw.Connection, sql: str) -> int:
    row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def _op_after(conn: apsw.Connection, sql: str, after: int, topics: str, limit: int) -> Rows:
    return [(int(i), str(t), str(p)) for i, t, p in conn.execute(sql, (after, topics, limit))]


class _WalIndexWatch:
    """Tells whether the database changed since the last look by reading the WAL index
    header from the ``-shm`` file (used only in the reader thread)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._seen = b""

    @classmethod
    def open(cls, conn: apsw.Connection, schema: str | None) -> _WalIndexWatch | None:
        """A watch on the database holding the outbox, or None when there is nothing to watch."""
        name = schema or "main"
        if not hasattr(os, "pread"):
            return None
        row = conn.execute(f'PRAGMA "{name}".journal_mode').fetchone()
        if not row or str(row[0]).lower() != "wal":
            return None
        path = conn.db_filename(name)
        if not path:
            return None
        try:
            fd = os.open(path + "-shm", os.O_RDONLY)
        except OSError:
            return None
        watch = cls(fd)
        watch.changed()
        return watch

    def changed(self) -> bool:
        try:
            head = os.pread(self._fd, _HEADER, 0)
        except OSError:
            return True  # cannot tell: read the outbox
        if head == self._seen:
            return False
        self._seen = head
        return True

    def close(self) -> None:
        os.close(self._fd)


def _op_watch(conn: apsw.Connection, schema: str | None) -> _WalIndexWatch | None:
    return _WalIndexWatch.open(conn, schema)


def _op_close_watch(conn: apsw.Connection, watch: _WalIndexWatch) -> None:
    watch.close()


def _op_follow(
    conn: apsw.Connection,
    query: Callable[[apsw.Connection], Rows],
    watch: _WalIndexWatch,
    look_first: bool,
    poked: threading.Event,
    cancelled: threading.Event,
) -> Rows | None:
    """Wait in the reader thread until there are rows to deliver or the loop must look.

    Returns the rows found after a change of the WAL index header (or at once when
    ``look_first``); the rows (maybe none) after a poke; None when cancelled or after
    :data:`_WATCH_MAX` without rows.
    """
    deadline = time.monotonic() + _WATCH_MAX
    look = look_first
    while True:
        if poked.is_set():
            poked.clear()
            watch.changed()  # the query below sees whatever this commit was
            return query(conn)
        if watch.changed() or look:
            look = False
            rows = query(conn)
            if rows:
                return rows
        if cancelled.is_set() or time.monotonic() >= deadline:
            return None
        poked.wait(WATCH_INTERVAL)


class SQLiteListener:
    """Notifications from River's SQLite outbox; iterate with ``async for``.

    Only topics passed to :meth:`listen` are delivered, and only rows committed after the
    listener connected (and after that topic was subscribed).
    """

    def __init__(
        self, reader: ConnectionThread, queries: Queries, *, poll_interval: float = POLL_INTERVAL
    ) -> None:
        self._reader = reader
        self._q = queries
        self._poll_interval = poll_interval
        self._last_id = 0
        self._topics: dict[str, int] = {}  # topic -> max(id) when subscribed
        self._pending: collections.deque[tuple[int, str, str]] = collections.deque()
        self._wake = anyio.Event()
        self._poked = threading.Event()  # the same "look now", for the reader thread's watch
        self._watch: _WalIndexWatch | None = None
        self._look = True  # read the outbox before watching again (a poke or rows came back)
        self._closed = False

    async def connect(self) -> None:
        """Remember where the outbox ends now: earlier rows are never delivered."""
        self._last_id = await self._reader.run(_op_last_id, self._q.notification_last_id)
        self._watch = await self._reader.run(_op_watch, self._q.schema)

    @property
    def watching(self) -> bool:
        """Whether commits are noticed through the WAL index (else the outbox is polled)."""
        return self._watch is not None

    async def listen(self, topic: str) -> None:
        if topic in self._topics:
            return
        self.poke()  # a watch in progress gives the reader thread back
        current = await self._reader.run(_op_last_id, self._q.notification_last_id)
        # Not the global cursor: rows of other topics up to `current` may still be pending.
        self._topics[topic] = max(self._last_id, current)
        self.poke()

    async def unlisten(self, topic: str) -> None:
        self._topics.pop(topic, None)

    @property
    def topics(self) -> frozenset[str]:
        return frozenset(self._topics)

    def poke(self) -> None:
        """Read the outbox now rather than at the next look (a notification was just committed)."""
        self._wake.set()
        self._poked.set()

    async def aclose(self) -> None:
        self._closed = True
        self.poke()
        watch, self._watch = self._watch, None
        with anyio.CancelScope(shield=True):
            if watch is not None and not self._reader.closed:
                with contextlib.suppress(ConnectionLostError):
                    await self._reader.run(_op_close_watch, watch)
            await self._reader.aclose()

    def __aiter__(self) -> SQLiteListener:
        return self

    async def __anext__(self) -> Notification:
        while True:
            while self._pending:
                row_id, topic, payload = self._pending.popleft()
                start = self._topics.get(topic)
                if start is not None and row_id > start:
                    return Notification(topic=topic, payload=payload)
            if self._closed:
                raise StopAsyncIteration
            if not self._topics:
                await self._wake.wait()  # nothing to read for until listen()
                self._wake = anyio.Event()
                continue
            try:
                rows = await self._next_rows()
            except ConnectionLostError:
                if self._closed:
                    raise StopAsyncIteration from None
                raise
            if rows:
                self._pending.extend(rows)
                self._last_id = rows[-1][0]

    async def _next_rows(self) -> Rows:
        query = functools.partial(
            _op_after,
            sql=self._q.notification_after,
            after=self._last_id,
            topics=json.dumps(list(self._topics)),
            limit=_BATCH,
        )
        watch = self._watch
        if watch is not None:
            found = await self._reader.run(
                _op_follow, query, watch, self._look, self._poked, self._reader.cancel_requested
            )
            self._look = found is not None
            return found or []
        rows = await self._reader.run(query)
        if not rows:
            with anyio.move_on_after(self._poll_interval):
                await self._wake.wait()
            self._wake = anyio.Event()
        return rows
