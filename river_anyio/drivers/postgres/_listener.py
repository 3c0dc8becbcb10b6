"""LISTEN on one dedicated autocommit connection (the Listener protocol)."""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

import anyio

from ..._errors import ValidationError
from .._protocol import Notification
from ._errors import map_errors
from ._queries import quote_ident

if TYPE_CHECKING:
    from ._connection import AnyioConnection

__all__ = ["PostgresListener"]

logger = logging.getLogger("river_anyio.driver")


class PostgresListener:
    """Receives River notifications: channel ``<schema>.<topic>``, delivered by bare topic.

    The schema is the configured one or the connection's ``current_schema()``. Iterate it
    (one consumer at a time) to receive notifications; iteration ends when the listener is
    closed. ``listen``/``unlisten`` may be called from another task while a consumer waits:
    the wait is interrupted, the command runs, and the wait resumes; notifications arriving
    meanwhile are buffered by psycopg and delivered afterwards.
    """

    def __init__(self, conn: AnyioConnection, prefix: str) -> None:
        self._conn = conn
        self._prefix = prefix
        self._topics: set[str] = set()
        self._buffer: deque[Notification] = deque()
        self._wait_scope: anyio.CancelScope | None = None
        self._receiving = False
        self._closed = False

    @classmethod
    async def open(cls, conn: AnyioConnection, schema: str | None) -> PostgresListener:
        """A listener on ``conn`` (which it then owns)."""
        if schema is None:
            with map_errors():
                cur = await conn.execute("SELECT current_schema()")
                row = await cur.fetchone()
            schema = row[0] if row else None
        return cls(conn, f"{schema}." if schema else "")

    @property
    def topics(self) -> frozenset[str]:
        """The topics currently listened to."""
        return frozenset(self._topics)

    def _channel(self, topic: str) -> str:
        if not isinstance(topic, str) or not topic:
            raise ValidationError("topic", "must be a non-empty string", topic)
        return self._prefix + topic

    async def listen(self, topic: str) -> None:
        await self._command("LISTEN " + quote_ident(self._channel(topic)))
        self._topics.add(topic)

    async def unlisten(self, topic: str) -> None:
        await self._command("UNLISTEN " + quote_ident(self._channel(topic)))
        self._topics.discard(topic)

    async def ping(self) -> None:
        """A round trip on the listening connection (checks it is alive)."""
        await self._command("SELECT 1")

    async def _command(self, statement: str) -> None:
        # A waiting consumer holds the connection lock: interrupt its wait; the lock is
        # handed to us (FIFO) before the consumer can take it again.
        if self._wait_scope is not None:
            self._wait_scope.cancel("a LISTEN or UNLISTEN needs the connection")
        with map_errors():
            await self._conn.execute(statement.encode(), prepare=False)

    async def _receive(self) -> None:
        """Wait for at least one notification and buffer everything received with it (a
        wait cancelled for a LISTEN or UNLISTEN receives nothing and is waited again)."""
        received: list[tuple[str, str]] = []
        with anyio.CancelScope() as scope:
            self._wait_scope = scope
            try:
                received = await self._conn.wait_notifications()
            finally:
                self._wait_scope = None
        for channel, payload in received:
            self._buffer.append(Notification(topic=self._topic(channel), payload=payload))

    def _topic(self, channel: str) -> str:
        prefix = self._prefix
        return channel[len(prefix) :] if prefix and channel.startswith(prefix) else channel

    def __aiter__(self) -> PostgresListener:
        return self

    async def __anext__(self) -> Notification:
        if self._receiving:
            raise RuntimeError("another task is already iterating this listener")
        self._receiving = True
        try:
            while not self._buffer:
                if self._closed:
                    raise StopAsyncIteration
                try:
                    with map_errors():
                        await self._receive()
                except Exception:
                    if self._closed:
                        raise StopAsyncIteration from None
                    raise
            return self._buffer.popleft()
        finally:
            self._receiving = False

    async def aclose(self) -> None:
        """Close the connection; a consumer waiting for notifications stops iterating."""
        self._closed = True
        await self._conn.close()

    async def __aenter__(self) -> PostgresListener:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        with anyio.CancelScope(shield=True):
            await self.aclose()
