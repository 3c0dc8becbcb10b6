"""A queue's controls: pause and resume, remote cancels, and what brings them.

Insert notifications wake the queue's fetch loop; control notifications (and the same actions
taken locally, without a listener) pause, resume or cancel a running job; without
notifications (``poll_only``, or a server without LISTEN/NOTIFY) the queue's settings and the
cancellations of its running jobs are polled, every two seconds as River's producer polls them;
the queue's row is kept alive. A remote cancel is a reason set on the job's attempt by the
worker pool, which owns it.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from .._errors import DatabaseError
from .._events import Event, EventHub, EventKind
from .._job import JobState
from .._logging import job_extra, queue_extra
from ..drivers import TOPIC_CONTROL, Driver, Notification
from ._attempt import CancelReason

if TYPE_CHECKING:
    from .._config import ClientConfig
    from ._pool import WorkerPool

__all__ = ["QueueControl"]

logger = logging.getLogger("river_anyio.producer")

HOT_OPERATION_TIMEOUT = 10.0
QUEUE_REPORT_INTERVAL = 600.0
QUEUE_SETTINGS_POLL = 2.0
#: Running jobs whose cancellation one poll looks up in one statement (River's batch).
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
        #: running jobs a poll found cancelled and cancelled (not cancelled again, or logged,
        #: at each poll while their worker finishes)
        self._poll_cancelled: set[int] = set()

    @property
    def _client_id(self) -> str:
        return self._config.id

    def cancel_job(self, job_id: int) -> bool:
        """Cancel a running job of this queue (a remote cancel); True if it was running."""
        attempt = self._pool.cancel(job_id, CancelReason.REMOTE)
        if attempt is None:
            return False
        extra = job_extra("job_cancel_remote", attempt.row, self._client_id)
        logger.warning("job %d cancelled remotely", job_id, extra=extra)
        return True

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
        """After missed notifications: re-poll the queue, and cancel running jobs that were
        cancelled remotely meanwhile."""
        self._trigger()
        ids = self._pool.job_ids()
        if not ids:
            return
        try:
            rows = await self._driver.executor().job_list(ids=ids, limit=len(ids))
        except DatabaseError as exc:
            logger.warning(
                "producer %s: reconciling cancellations failed: %s",
                self.queue,
                exc,
                extra=queue_extra("reconcile_failed", self.queue, self._client_id),
            )
            return
        for row in rows:
            if "cancel_attempted_at" in row.metadata:
                self.cancel_job(row.id)
        if not self._config.poll_only:
            await self.poll_settings_once()

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

    async def poll_settings(self) -> None:
        """Without notifications: the queue's settings and its running jobs' cancellations,
        polled every ``QUEUE_SETTINGS_POLL`` seconds."""
        while True:
            await anyio.sleep(QUEUE_SETTINGS_POLL)
            await self.poll_settings_once()
            await self.poll_cancellations_once()

    async def poll_cancellations_once(self) -> None:
        """Cancel the running jobs of this queue whose cancellation was requested (River's
        ``JobGetCancelRequested``: ``cancel_attempted_at`` set while running)."""
        ids = self._pool.job_ids()
        if not ids:
            self._poll_cancelled.clear()
            return
        requested: set[int] = set()
        try:
            with anyio.fail_after(HOT_OPERATION_TIMEOUT):
                for start in range(0, len(ids), CANCEL_POLL_BATCH):
                    batch = ids[start : start + CANCEL_POLL_BATCH]
                    rows = await self._driver.executor().job_list(ids=batch, limit=len(batch))
                    requested.update(
                        row.id
                        for row in rows
                        if row.state is JobState.RUNNING and "cancel_attempted_at" in row.metadata
                    )
        except (DatabaseError, TimeoutError) as exc:
            logger.warning(
                "producer %s: polling for cancellations failed: %s",
                self.queue,
                exc,
                extra=queue_extra("cancel_poll_failed", self.queue, self._client_id),
            )
            return
        done = self._poll_cancelled
        self._poll_cancelled = {i for i in requested if i in done or self.cancel_job(i)}

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
