"""The notifier: one listener (PostgreSQL LISTEN connection or SQLite outbox) fanned out to the
producers.

Insert notifications are routed here, by queue, straight to the producer of that queue (its
``trigger()``): one JSON parse per notification and nothing woken but that producer, however
many queues the client works. Other topics go to their subscribers' streams.

It must be listening before the client reports itself started (a failure then fails the
start). Afterwards a lost connection is operational: it is logged, retried with back-off
(250 ms → 30 s ±10%, reset on success), and once listening again every producer re-polls its
queue and reconciles the remote cancellations it may have missed. Each subscriber has a
buffer of 1,000 notifications; beyond that they are dropped with a warning (polling covers
them).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection
from contextlib import AsyncExitStack

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._errors import ConnectionLostError, DatabaseError
from ..drivers import TOPIC_CONTROL, TOPIC_INSERT, TOPIC_LEADERSHIP, Driver, Listener, Notification
from ._health import Contact
from ._util import Backoff

__all__ = ["Notifier"]

logger = logging.getLogger("river_anyio.notifier")

BUFFER = 1000
PING_INTERVAL = 5.0
#: How long closing a loop's notification iterator may take once the loop has ended.
CLOSE_TIMEOUT = 1.0
TOPICS = (TOPIC_INSERT, TOPIC_CONTROL)
#: What producers' streams carry (insert notifications are routed by queue, see
#: :meth:`Notifier.route_inserts`; the elector listens to ``river_leadership``).
PRODUCER_TOPICS = (TOPIC_CONTROL,)
ALL_TOPICS = (TOPIC_INSERT, TOPIC_CONTROL, TOPIC_LEADERSHIP)


class Notifier:
    """Listens on ``topics`` and hands each notification to the subscribers of its topic;
    after a reconnection, calls each subscriber's ``reconcile()`` if it has one."""

    def __init__(self, driver: Driver, topics: Collection[str] = TOPICS) -> None:
        self._driver = driver
        self._topics = tuple(topics)
        self._subscribers: dict[object, MemoryObjectSendStream[Notification]] = {}
        self._subscribed_topics: dict[object, frozenset[str]] = {}
        #: queue -> what an insert notification for it calls (its producer's trigger)
        self._insert_routes: dict[str, Callable[[], None]] = {}
        self._backoff = Backoff()
        self.reconnects = 0
        self.dropped = 0
        #: for health: round trips (connects, pings), and since when it is (dis)connected
        self.contact = Contact()
        self.connected_at: float | None = None
        self.down_since: float | None = None

    def subscribe(
        self, owner: object, topics: Collection[str] = PRODUCER_TOPICS
    ) -> MemoryObjectReceiveStream[Notification]:
        send, receive = anyio.create_memory_object_stream[Notification](BUFFER)
        self._subscribers[owner] = send
        self._subscribed_topics[owner] = frozenset(topics)
        return receive

    def unsubscribe(self, owner: object) -> None:
        send = self._subscribers.pop(owner, None)
        self._subscribed_topics.pop(owner, None)
        if send is not None:
            send.close()

    def route_inserts(self, queue: str, trigger: Callable[[], None]) -> None:
        """Call ``trigger`` for every insert notification naming ``queue``."""
        self._insert_routes[queue] = trigger

    def unroute_inserts(self, queue: str) -> None:
        self._insert_routes.pop(queue, None)

    def _deliver(self, note: Notification) -> bool:
        """Hand a notification to its producer and subscribers; True if it woke a producer."""
        woke = note.topic == TOPIC_INSERT and self._route_insert(note.payload)
        for owner, send in list(self._subscribers.items()):
            if note.topic not in self._subscribed_topics.get(owner, ()):
                continue
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
        return woke

    def _route_insert(self, payload: str) -> bool:
        try:
            data = json.loads(payload)
        except ValueError:
            logger.warning(
                "notifier: malformed insert notification %r",
                payload,
                extra={"river_event": "notification_malformed"},
            )
            return False
        queue = data.get("queue") if isinstance(data, dict) else None
        trigger = self._insert_routes.get(queue) if isinstance(queue, str) else None
        if trigger is None:
            return False
        trigger()
        return True

    async def _connect(self, stack: AsyncExitStack) -> Listener:
        listener = await stack.enter_async_context(self._driver.listener())
        for topic in self._topics:
            await listener.listen(topic)
        return listener

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        first = True
        while True:
            try:
                async with AsyncExitStack() as stack:
                    listener = await self._connect(stack)
                    self.connected_at = anyio.current_time()
                    self.down_since = None
                    self.contact.ok(self.connected_at)
                    if first:
                        first = False
                        task_status.started()
                    else:
                        self.reconnects += 1
                        logger.info(
                            "notifier: listening again; re-polling every queue",
                            extra={"river_event": "notifier_reconnected"},
                        )
                        for owner in list(self._subscribers):
                            reconcile = getattr(owner, "reconcile", None)
                            if reconcile is not None:
                                await reconcile()
                    self._backoff.reset()
                    failures: list[BaseException] = []
                    try:
                        async with anyio.create_task_group() as tg:
                            if hasattr(listener, "ping"):
                                tg.start_soon(self._ping, listener, tg.cancel_scope, failures)
                            notes = aiter(listener)
                            try:
                                async for note in notes:
                                    if self._deliver(note):
                                        # a producer was woken: let it send its claim
                                        # before this task reads the socket again
                                        await anyio.lowlevel.checkpoint()
                            except DatabaseError as exc:
                                failures.append(exc)
                            finally:
                                await _close_loop(listener, notes)
                            tg.cancel_scope.cancel("listener closed")
                    finally:
                        self.connected_at = None
                        self.down_since = anyio.current_time()
                    failure = failures[0] if failures else None
                    if isinstance(failure, DatabaseError):
                        raise failure
                    raise ConnectionLostError(f"listener stopped: {failure or 'closed'}")
            except DatabaseError as exc:
                if first:
                    raise  # cannot listen at start-up: the client does not start
                self.contact.failed(exc)
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
                self.contact.ok(anyio.current_time())
        except (DatabaseError, TimeoutError) as exc:
            failures.append(exc)
            scope.cancel("listener ping failed")

    def close(self) -> None:
        for send in self._subscribers.values():
            send.close()
        self._subscribers.clear()
        self._insert_routes.clear()


async def _close_loop(listener: object, notes: object) -> None:
    """Close an iterator a listener handed out for one loop (an async generator, say), so a
    loop left at a cancellation does not leave it to the garbage collector; the listener
    itself (when it iterates itself) is closed by its context manager."""
    aclose = getattr(notes, "aclose", None)
    if notes is not listener and aclose is not None:
        with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
            await aclose()
