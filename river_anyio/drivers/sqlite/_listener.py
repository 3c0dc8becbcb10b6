"""River's SQLite notifications: following the ``river_notification`` outbox.

SQLite has no LISTEN/NOTIFY, so senders append rows to ``river_notification`` inside their
transaction and listeners poll for rows past a cursor. The cursor starts at ``max(id)`` when the
listener connects (no replay of history); each topic also remembers ``max(id)`` when it was
subscribed. Polling is one indexed query every 50 ms while idle, and immediately again after
rows were found. Because SQLite serialises writers, ids become visible in increasing order, so
the cursor never skips a row.

The polls run on the listener's own read-only connection (WAL readers never wait for the
writer), in its own thread, so they neither queue behind the writer's work nor delay it.
"""

from __future__ import annotations

import collections
import json
from typing import TYPE_CHECKING, Final

import anyio
import apsw

from ..._errors import ConnectionLostError
from .._protocol import Notification

if TYPE_CHECKING:
    from ._connection import ConnectionThread
    from ._queries import Queries

__all__ = ["POLL_INTERVAL", "SQLiteListener"]

#: Idle poll interval, as River's SQLite listener.
POLL_INTERVAL: Final = 0.05
_BATCH: Final = 256


def _op_last_id(conn: apsw.Connection, sql: str) -> int:
    row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def _op_after(
    conn: apsw.Connection, sql: str, after: int, topics: str, limit: int
) -> list[tuple[int, str, str]]:
    return [(int(i), str(t), str(p)) for i, t, p in conn.execute(sql, (after, topics, limit))]


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
        self._closed = False

    async def connect(self) -> None:
        """Remember where the outbox ends now: earlier rows are never delivered."""
        self._last_id = await self._reader.run(_op_last_id, self._q.notification_last_id)

    async def listen(self, topic: str) -> None:
        if topic in self._topics:
            return
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
        """Poll now rather than at the next interval (a notification was just committed)."""
        self._wake.set()

    async def aclose(self) -> None:
        self._closed = True
        self.poke()
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
            if self._topics:
                try:
                    rows = await self._reader.run(
                        _op_after,
                        self._q.notification_after,
                        self._last_id,
                        json.dumps(list(self._topics)),
                        _BATCH,
                    )
                except ConnectionLostError:
                    if self._closed:
                        raise StopAsyncIteration from None
                    raise
                if rows:
                    self._pending.extend(rows)
                    self._last_id = rows[-1][0]
                    continue
                with anyio.move_on_after(self._poll_interval):
                    await self._wake.wait()
            else:
                await self._wake.wait()  # nothing to poll for until listen()
            if self._wake.is_set():
                self._wake = anyio.Event()
