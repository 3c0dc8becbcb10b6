"""Insert notifications the client's limiter held back, sent once it lets them through.

An inserting client sends at most ``BURST_DEFAULT`` insert notifications per queue at once
and one every 2 ms after that (``river_anyio._limiter``). A producer's fetch claims every job
committed by then, so jobs whose notification was held back are normally claimed with a
neighbour's; but the last jobs of a fast stream (or of a burst bigger than the bucket) have
no later neighbour, and used to wait for the producer's poll (``fetch_poll_interval``, 1 s by
default). A running client owes such a queue one notification after its insert commits, and
sends it once the limiter allows and ``GRACE`` (10 ms) has passed since the latest such
commit, unless an insert's own notification went out meanwhile (it was sent after that
commit, so its fetch sees the job): under a steady flow each commit defers the debt and the
inserts' own notifications cover each other, so nothing extra is sent, and a stream's tail
is noticed within about 10 ms. It takes a token like any other, so the bound holds. Inserts
in the caller's transaction commit out of sight and are not followed up this way, as in
River. A client that stops sends what it still owes at once (shielded, within
``FINAL_TIMEOUT``): a script's last inserts are announced too.
"""

from __future__ import annotations

import logging
import time

import anyio

from .._errors import DatabaseError
from .._limiter import KeyedBurstLimiter
from .._logging import client_extra
from ..drivers import TOPIC_INSERT, Driver
from ._control import HOT_OPERATION_TIMEOUT
from ._util import Wakeup

__all__ = ["TrailingNotifications"]

logger = logging.getLogger("river_anyio.client")

#: How long after the latest commit owing one a notification waits for an insert's own.
GRACE = 0.01
#: The most a stopping client spends sending the notifications it owes.
FINAL_TIMEOUT = 2.0


class TrailingNotifications:
    """The notifications a running client owes, and the service (:meth:`run`) sending them."""

    def __init__(self, driver: Driver, limiter: KeyedBurstLimiter, client_id: str) -> None:
        self._driver = driver
        self._limiter = limiter
        self._client_id = client_id
        #: queue -> (the limiter's marker, its clock's time) at the latest commit owing one
        self._owed: dict[str, tuple[float, float]] = {}
        self._wake = Wakeup()
        #: notifications sent (for tests and diagnostics)
        self.sent = 0

    def committed(self, queues: set[str]) -> None:
        """Jobs of ``queues`` were committed by this client: a notification is owed for those
        whose latest notification the limiter refused."""
        refused = self._limiter.take_refused(queues)
        if refused:
            now = time.monotonic()  # the limiter's clock (no event-loop lookup per insert)
            for queue in refused:
                self._owed[queue] = (self._limiter.marker(queue), now)
            self._wake.set()

    async def run(self) -> None:
        try:
            await self._serve()
        finally:
            # the client is stopping: what is owed goes out now, limiter or not
            owed = sorted(
                q
                for q, (marker, _) in self._owed.items()
                if not self._limiter.allowed_since(q, marker)
            )
            self._owed.clear()
            if owed:
                with anyio.move_on_after(FINAL_TIMEOUT, shield=True):
                    await self._send(owed)

    async def _serve(self) -> None:
        owed = self._owed
        limiter = self._limiter
        while True:
            await self._wake.wait()
            while owed:
                now = time.monotonic()
                due = {q: max(now + limiter.delay(q), at + GRACE) for q, (_, at) in owed.items()}
                await anyio.sleep(min(due.values()) - now)
                now = time.monotonic()
                ready = []
                for queue, (marker, at) in list(owed.items()):
                    if limiter.allowed_since(queue, marker):
                        del owed[queue]  # notified after the latest commit owing one
                    elif now >= at + GRACE and limiter.try_acquire(queue):
                        del owed[queue]
                        ready.append(queue)
                if ready:
                    await self._send(sorted(ready))

    async def _send(self, queues: list[str]) -> None:
        payloads = [f'{{"queue": "{q}"}}' for q in queues]
        try:
            with anyio.fail_after(HOT_OPERATION_TIMEOUT):
                await self._driver.executor().notify_many(TOPIC_INSERT, payloads)
        except (DatabaseError, TimeoutError, OSError) as exc:
            # the producers' poll picks the jobs up; nothing to retry
            logger.warning(
                "client %s: a held-back insert notification failed (%s): %s",
                self._client_id,
                ", ".join(queues),
                exc,
                extra=client_extra("trailing_notify_failed", self._client_id),
            )
            return
        self.sent += len(queues)
