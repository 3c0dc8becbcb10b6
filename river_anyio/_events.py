"""Events a running client reports, and bounded subscriptions to them.

A subscriber gets its own bounded buffer (1,000 events). Publishing never waits: when a
subscriber's buffer is full the event is dropped *for that subscriber*, counted, and the
subscriber is told how many it missed (an ``events_dropped`` event) before its next event.
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
from collections.abc import Iterable
from typing import Any

import anyio
import attrs
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._job import JobRow

__all__ = ["Event", "EventKind", "JobTimings", "Subscription"]

logger = logging.getLogger("river_anyio.client")

SUBSCRIPTION_BUFFER = 1000


class EventKind(enum.StrEnum):
    JOB_COMPLETED = "job_completed"
    #: An attempt failed (an error, a timeout, ``discard()``): the job retries, or it is
    #: discarded, in which case ``job_discarded`` follows.
    JOB_FAILED = "job_failed"
    JOB_CANCELLED = "job_cancelled"
    JOB_SNOOZED = "job_snoozed"
    JOB_INTERRUPTED = "job_interrupted"
    #: A completion did not apply: the row was no longer running for the attempt this client
    #: claimed (rescued, re-claimed elsewhere, finished by someone else or cancelled). It
    #: follows the event River sends for the state the row is in (``job_completed`` for a row
    #: completed meanwhile, ``job_failed`` for one discarded, ...; none when it is running).
    JOB_RACE = "job_race"
    QUEUE_PAUSED = "queue_paused"
    QUEUE_RESUMED = "queue_resumed"
    #: The event loop was late by more than the lag threshold (``lag`` in ``details``).
    LOOP_LAG = "loop_lag"
    #: Completions that could not be written and were dropped (left for the rescuer).
    COMPLETION_DROPPED = "completion_dropped"
    #: This subscriber missed ``details["count"]`` events because its buffer was full.
    EVENTS_DROPPED = "events_dropped"
    #: This client was elected leader (``details``: ``client_id``, ``elected_at``). Sent when it
    #: happens, not replayed to later subscribers: a client may be elected before a
    #: subscription made just after it started, so check ``ClientRun.is_leader`` first.
    LEADER_ELECTED = "leader_elected"
    #: This client stopped leading (``details``: ``client_id``, ``reason``: "lost",
    #: "expired" (not renewed in time), "resigned" or "stopping").
    LEADER_LOST = "leader_lost"
    #: A maintenance service's run failed; it runs again at its next interval
    #: (``details["service"]`` names it; ``error`` says what went wrong).
    MAINTENANCE_FAILED = "maintenance_failed"
    #: A job reached ``discarded``: the dead letter an app pages on. Sent by the client that
    #: discarded it, after the write, with the row as written; ``details["cause"]`` is
    #: ``"attempts_exhausted"`` (its last attempt failed), ``"discard"`` (the worker returned
    #: ``discard()``), ``"unknown_kind"`` (no worker for its kind, last attempt), ``"rescuer"``
    #: (the leader's rescuer found it stuck on its last attempt, or of a kind it does not
    #: know) or ``"unique_conflict"`` (the leader's scheduler found its unique key taken).
    JOB_DISCARDED = "job_discarded"
    #: The leader's rescuer found the job stuck in ``running`` and moved it on (sent by the
    #: leader, with the row as written): ``details["outcome"]`` is ``"retried"``,
    #: ``"discarded"`` (``job_discarded`` follows) or ``"cancelled"`` (its cancellation had
    #: been asked for); ``details["rescue_count"]`` is how many times it has been rescued,
    #: River's ``river:rescue_count`` metadata key.
    JOB_RESCUED = "job_rescued"


@attrs.frozen(kw_only=True)
class JobTimings:
    """How long a job waited to start, ran, and took to be written back."""

    queue_wait: dt.timedelta
    run: dt.timedelta
    completion: dt.timedelta


@attrs.frozen(kw_only=True)
class Event:
    """One event. ``job`` is the row as written (for job events); ``details`` carries extras."""

    kind: EventKind
    job: JobRow | None = None
    queue: str | None = None
    timings: JobTimings | None = None
    error: str | None = None
    details: dict[str, Any] = attrs.field(factory=dict)


@attrs.define(eq=False)
class _Subscriber:
    kinds: frozenset[EventKind] | None
    send: MemoryObjectSendStream[Event]
    dropped: int = 0


class Subscription:
    """Events for one subscriber: iterate with ``async for``; use as a context manager."""

    def __init__(
        self,
        hub: EventHub,
        subscriber: _Subscriber,
        receive: MemoryObjectReceiveStream[Event],
    ) -> None:
        self._hub = hub
        self._subscriber = subscriber
        self._receive = receive
        self._reported = 0

    @property
    def dropped(self) -> int:
        """Events this subscriber has missed so far."""
        return self._subscriber.dropped

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._hub._remove(self._subscriber)
        self._receive.close()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        missed = self._subscriber.dropped - self._reported
        if missed:
            self._reported = self._subscriber.dropped
            return Event(kind=EventKind.EVENTS_DROPPED, details={"count": missed})
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    def receive_nowait(self) -> Event:
        """The next buffered event, or ``anyio.WouldBlock``."""
        return self._receive.receive_nowait()


class EventHub:
    """Fans events out to subscribers without ever blocking the publisher."""

    def __init__(self) -> None:
        self._subscribers: list[_Subscriber] = []

    def subscribe(self, kinds: Iterable[EventKind | str] = ()) -> Subscription:
        wanted = frozenset(EventKind(k) for k in kinds) or None
        send, receive = anyio.create_memory_object_stream[Event](SUBSCRIPTION_BUFFER)
        sub = _Subscriber(kinds=wanted, send=send)
        self._subscribers.append(sub)
        return Subscription(self, sub, receive)

    def _remove(self, sub: _Subscriber) -> None:
        if sub in self._subscribers:
            self._subscribers.remove(sub)
        sub.send.close()

    @property
    def active(self) -> bool:
        return bool(self._subscribers)

    def publish(self, event: Event) -> None:
        for sub in self._subscribers:
            if sub.kinds is not None and event.kind not in sub.kinds:
                continue
            try:
                sub.send.send_nowait(event)
            except anyio.WouldBlock:
                sub.dropped += 1
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass

    def close(self) -> None:
        """End every subscription (their iteration stops once drained)."""
        for sub in self._subscribers:
            sub.send.close()
        self._subscribers.clear()
