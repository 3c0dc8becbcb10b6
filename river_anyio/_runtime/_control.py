"""A queue's controls: pause and resume, remote cancels, and what brings them.

Insert notifications wake the queue's fetch loop; control notifications (and the same actions
taken locally, without a listener) pause, resume or cancel a running job. As in River, the
queue's settings and its running jobs' cancellation requests are also polled: every
``QUEUE_POLL`` without notifications (the only way such a client learns of them), every
``NOTIFICATION_POLL`` with them (a notification sent while the listener was away is lost). The
queue's row is kept alive. A remote cancel is a reason set on the job's attempt by the worker
pool, which owns it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from .._errors import DatabaseError
from .._events import Event, EventHub, EventKind
from .._logging import job_extra, queue_extra
from ..drivers import TOPIC_CONTROL, Driver, Notification
from ._attempt import Attempt, CancelReason

if TYPE_CHECKING:
    from .._config import ClientConfig
    from ._pool import WorkerPool

__all__ = ["QueueControl"]

logger = logging.getLogger("river_anyio.producer")

HOT_OPERATION_TIMEOUT = 10.0
QUEUE_REPORT_INTERVAL = 600.0
#: How often a queue without notifications polls its settings and cancellation requests
#: (River's queue poll interval).
QUEUE_POLL = 2.0
#: How often a queue with notifications polls them anyway (River's notification poll interval).
NOTIFICATION_POLL = 60.0
#: The most running jobs one cancellation poll asks about (River's batch).
CANCEL_POLL_BATCH = 1000


class QueueControl:
    """Follows one queue's controls for its producer. ``trigger`` asks for a fetch (an
    insert, a reconciliation); ``resumed`` is called when the queue is resumed."""

    def __init__(
        self,
        *,
        queue: str,
        config: ClientConfig,
        driver: Driver,
        events: EventHub,
        pool: WorkerPool,
        trigger: Callable[[], None],
        resumed: Callable[[], None],
    ) -> None:
        self.queue = queue
        self._config = config
        self._driver = driver
        self._events = events
        self._pool = pool
        self._trigger = trigger
        self._resumed = resumed
        #: the queue is paused (data: read by the fetch loop and diagnostics)
        self.paused = False
        #: while a claim is in flight, the remote cancels that matched no attempt: they may
        #: be for rows it is claiming (see :meth:`claiming`)
        self._unmatched: set[int] | None = None

    @property
    def _client_id(self) -> str:
        return self._config.id

    def cancel_job(self, job_id: int) -> bool:
        """Cancel a job of this queue (a remote cancel): a running one stops, a claimed one
        starts cancelled. True if this client held it."""
        attempt = self._pool.cancel(job_id, CancelReason.REMOTE)
        if attempt is None:
            if self._unmatched is not None:
                self._unmatched.add(job_id)
            return False
        self._log_cancel(attempt)
        return True

    @contextlib.contextmanager
    def claiming(self) -> Iterator[None]:
        """Around a claim and the dispatch of its rows: a remote cancel that arrives meanwhile
        may be for a row the claim is taking, which the pool does not hold yet. Such cancels
        are kept and applied once the block has dispatched the rows, so the job starts
        cancelled (River's pending cancellations)."""
        unmatched: set[int] = set()
        self._unmatched = unmatched
        try:
            yield
        finally:
            self._unmatched = None
        for job_id in unmatched:
            self.cancel_job(job_id)

    def _log_cancel(self, attempt: Attempt) -> None:
        extra = job_extra("job_cancel_remote", attempt.row, self._client_id)
        logger.warning("job %d cancelled remotely", attempt.row.id, extra=extra)

    def set_paused(self, paused: bool) -> None:
        if paused == self.paused:
            return
        self.paused = paused
        kind = EventKind.QUEUE_PAUSED if paused else EventKind.QUEUE_RESUMED
        logger.info(
            "queue %s %s",
            self.queue,
            "paused" if paused else "resumed",
            extra=queue_extra(kind.value, self.queue, self._client_id),
        )
        self._events.publish(Event(kind=kind, queue=self.queue))
        if not paused:
            self._resumed()

    async def reconcile(self) -> None:
        """After missed notifications: re-poll the queue, cancel running jobs that were
        cancelled remotely meanwhile, and read the queue's settings again."""
        self._trigger()
        await self.poll_cancellations_once()
        await self.poll_settings_once()

    async def poll_cancellations_once(self) -> None:
        """Cancel the attempts this queue runs whose jobs were cancelled remotely (River's
        cancellation poll). The attempts are taken before the query: one that ended meanwhile
        is left alone, and so is a later attempt of the same job."""
        attempts = self._pool.attempts()
        ids = list(attempts)
        try:
            for start in range(0, len(ids), CANCEL_POLL_BATCH):
                batch = ids[start : start + CANCEL_POLL_BATCH]
                with anyio.fail_after(HOT_OPERATION_TIMEOUT):
                    requested = await self._driver.executor().job_get_cancel_requested(batch)
                for job_id in requested:
                    if self._pool.cancel(job_id, CancelReason.REMOTE, attempts[job_id]):
                        self._log_cancel(attempts[job_id])
        except (DatabaseError, TimeoutError) as exc:
            logger.warning(
                "producer %s: polling cancellations failed: %s",
                self.queue,
                exc,
                extra=queue_extra("reconcile_failed", self.queue, self._client_id),
            )

    def control(self, payload: dict[str, Any]) -> None:
        action = payload.get("action")
        queue = payload.get("queue")
        if action == "cancel":
            job_id = payload.get("job_id")
            if queue == self.queue and isinstance(job_id, int):
                self.cancel_job(job_id)
        elif action in ("pause", "resume") and queue in (self.queue, "*"):
            self.set_paused(action == "pause")
        # metadata_changed and unknown actions: nothing to do in the open-source runtime

    # --- the services (in the producer's services task group) -------------------------------

    async def notifications(self, receive: MemoryObjectReceiveStream[Notification]) -> None:
        async with receive:
            async for note in receive:
                try:
                    payload: Any = json.loads(note.payload)
                except ValueError:
                    logger.warning(
                        "producer %s: malformed notification %r",
                        self.queue,
                        note.payload,
                        extra=queue_extra("notification_malformed", self.queue, self._client_id),
                    )
                    continue
                if not isinstance(payload, dict):
                    continue
                if note.topic == TOPIC_CONTROL:
                    self.control(payload)

    async def poll(self, interval: float) -> None:
        """Poll cancellation requests and the queue's settings every ``interval``."""
        while True:
            await anyio.sleep(interval)
            await self.poll_cancellations_once()
            await self.poll_settings_once()

    async def poll_settings_once(self) -> None:
        try:
            with anyio.fail_after(HOT_OPERATION_TIMEOUT):
                row = await self._driver.executor().queue_get(self.queue)
        except (DatabaseError, TimeoutError) as exc:
            logger.warning(
                "producer %s: reading queue settings failed: %s",
                self.queue,
                exc,
                extra=queue_extra("queue_settings_failed", self.queue, self._client_id),
            )
            return
        if row is not None:
            self.set_paused(row.paused_at is not None)

    async def report_queue(self) -> None:
        """Keep the queue's row alive (River's producer reports every 10 minutes)."""
        await anyio.sleep(random.uniform(0, 1))
        while True:
            await anyio.sleep(QUEUE_REPORT_INTERVAL)
            try:
                with anyio.fail_after(HOT_OPERATION_TIMEOUT):
                    await self._driver.executor().queue_create_or_set_updated_at(name=self.queue)
            except (DatabaseError, TimeoutError) as exc:
                logger.warning(
                    "producer %s: queue keep-alive failed: %s",
                    self.queue,
                    exc,
                    extra=queue_extra("queue_keepalive_failed", self.queue, self._client_id),
                )
