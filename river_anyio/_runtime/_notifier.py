"""The notifier: one listener (PostgreSQL LISTEN connection or SQLite outbox) fanned out to the
producers.

It must be listening before the client reports itself started (a failure then fails the
start). Afterwards a lost connection is operational: it is logged, retried with back-off
(250 ms → 30 s ±10%, reset on success), and once listening again every producer re-polls its
queue and reconciles the remote cancellations it may have missed. Each subscriber has a
buffer of 1,000 notifications; beyond that they are dropped with a warning (polling covers
them).
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._errors import ConnectionLostError, DatabaseError
from ..drivers import TOPIC_CONTROL, TOPIC_INSERT, Driver, Listener, Notification
from ._util import Backoff

if TYPE_CHECKING:
    from ._producer import Producer

__all__ = ["Notifier"]

logger = logging.getLogger("river_anyio.notifier")

BUFFER = 1000
PING_INTERVAL = 5.0
TOPICS = (TOPIC_INSERT, TOPIC_CONTROL)


class Notifier:
    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        self._subscribers: dict[Producer, MemoryObjectSendStream[Notification]] = {}
        self._backoff = Backoff()
        self.reconnects = 0
        self.dropped = 0

    def subscribe(self, producer: Producer) -> MemoryObjectReceiveStream[Notification]:
        send, receive = anyio.create_memory_object_stream[Notification](BUFFER)
        self._subscribers[producer] = send
        return receive

    def unsubscribe(self, producer: Producer) -> None:
        send = self._subscribers.pop(producer, None)
        if send is not None:
            send.close()

    def _deliver(self, note: Notification) -> None:
        for send in list(self._subscribers.values()):
            try:
                send.send_nowait(note)
            except anyio.WouldBlock:
                self.dropped += 1
                logger.warning(
                    "notifier: a subscriber's buffer is full; notification dropped",
                    extra={"river_event": "notification_dropped"},
                )
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass

    async def _connect(self, stack: AsyncExitStack) -> Listener:
        listener = await stack.enter_async_context(self._driver.listener())
        for topic in TOPICS:
            await listener.listen(topic)
        return listener

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        first = True
        while True:
            try:
                async with AsyncExitStack() as stack:
                    listener = await self._connect(stack)
                    if first:
                        first = False
                        task_status.started()
                    else:
                        self.reconnects += 1
                        logger.info(
                            "notifier: listening again; re-polling every queue",
                            extra={"river_event": "notifier_reconnected"},
                        )
                        for producer in list(self._subscribers):
                            await producer.reconcile()
                    self._backoff.reset()
                    failures: list[BaseException] = []
                    async with anyio.create_task_group() as tg:
                        if hasattr(listener, "ping"):
                            tg.start_soon(self._ping, listener, tg.cancel_scope, failures)
                        try:
                            async for note in listener:
                                self._deliver(note)
                        except DatabaseError as exc:
                            failures.append(exc)
                        tg.cancel_scope.cancel("listener closed")
                    failure = failures[0] if failures else None
                    if isinstance(failure, DatabaseError):
                        raise failure
                    raise ConnectionLostError(f"listener stopped: {failure or 'closed'}")
            except DatabaseError as exc:
                if first:
                    raise  # cannot listen at start-up: the client does not start
                delay = self._backoff.next_delay()
                logger.warning(
                    "notifier: listening failed (retrying in %.2fs): %s",
                    delay,
                    exc,
                    extra={"river_event": "notifier_failed"},
                )
                await anyio.sleep(delay)

    async def _ping(
        self, listener: Listener, scope: anyio.CancelScope, failures: list[BaseException]
    ) -> None:
        """A round trip every few seconds, so a silently dead connection is noticed."""
        try:
            while True:
                await anyio.sleep(PING_INTERVAL)
                with anyio.fail_after(PING_INTERVAL):
                    await listener.ping()  # type: ignore[attr-defined]
        except (DatabaseError, TimeoutError) as exc:
            failures.append(exc)
            scope.cancel("listener ping failed")

    def close(self) -> None:
        for send in self._subscribers.values():
            send.close()
        self._subscribers.clear()
