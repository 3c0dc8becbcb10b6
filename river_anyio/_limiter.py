"""Burst-tolerant rate limiting for notifications and fetches.

River limits insert notifications (per queue, per client) and fetches (per producer) to one per
cooldown (100 ms by default). That guards the database against notification storms, but it
also means a job inserted 5 ms after another waits for the rest of the cooldown to be noticed:
at 200 inserts/s the pickup latency is then ~50 ms instead of ~1 ms. river_anyio keeps the
same guard on sustained load and lets bursts through: up to ``burst`` events per cooldown
window. Under a storm the rate is still capped at ``burst / cooldown`` per second: 500 insert
notifications a second per queue and inserting client (``BURST_DEFAULT``), and 250 notified
fetches a second per producer (``FETCH_BURST`` of the pacer), each fetch then claiming every
job that has arrived.

Insert notifications allow 50 per window: at 10 per window, an application inserting 200 jobs
a second from another process left half of them to wait for a later notification (measured
pickup p50 / p95 / p99 of 7 / 24 / 38 ms, against 2 / 3 / 4 ms at 50).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

__all__ = ["BurstLimiter"]

BURST_DEFAULT = 50


class BurstLimiter:
    """At most ``burst`` events in any ``window`` seconds."""

    def __init__(
        self,
        window: float,
        burst: int = BURST_DEFAULT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window = window
        self._burst = max(1, burst)
        self._clock = clock
        self._times: deque[float] = deque()

    def _trim(self, now: float) -> None:
        times = self._times
        while times and now - times[0] >= self._window:
            times.popleft()

    def delay(self) -> float:
        """Seconds until the next event is allowed (0 when it may happen now)."""
        now = self._clock()
        self._trim(now)
        if len(self._times) < self._burst:
            return 0.0
        return self._window - (now - self._times[0])  # same arithmetic as _trim

    def record(self) -> None:
        now = self._clock()
        self._trim(now)
        self._times.append(now)

    def try_acquire(self) -> bool:
        """Record an event if one is allowed now; False otherwise."""
        if self.delay() > 0:
            return False
        self.record()
        return True


class KeyedBurstLimiter:
    """A :class:`BurstLimiter` per key (per queue)."""

    def __init__(self, window: float, burst: int = BURST_DEFAULT) -> None:
        self._window = window
        self._burst = burst
        self._limiters: dict[str, BurstLimiter] = {}

    def try_acquire(self, key: str) -> bool:
        limiter = self._limiters.get(key)
        if limiter is None:
            limiter = self._limiters[key] = BurstLimiter(self._window, self._burst)
        return limiter.try_acquire()
