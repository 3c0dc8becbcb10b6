"""The event-loop lag monitor: reports every stall of the loop of at least ``THRESHOLD``.

A stall is a task that runs without yielding (a blocking call in async code): nothing else on
the loop runs meanwhile. The monitor sleeps in ticks of half the threshold (50 ms) and measures
how late each tick wakes. A stall of ``B`` seconds that begins during a tick makes that tick
wake between ``B - tick`` and ``B`` late, so a tick at least one tick late is reported as a
stall of ``late + tick/2`` (within ±25 ms of the truth): every stall of 100 ms or more is
reported, once, and stalls shorter than one tick never are.

The cost: 20 wake-ups a second, about what one 50 ms sleep costs each (measured in
``docs/discussion/design.md``, "Idle cost"). A coarser tick would miss or misjudge stalls
near the threshold.
"""

from __future__ import annotations

import logging
import math
from collections import deque

import anyio
from anyio.abc import TaskStatus

from .._events import Event, EventHub, EventKind
from .._logging import client_extra
from ._util import loop_clock

__all__ = ["LagMonitor"]

logger = logging.getLogger("river_anyio.client")

#: Stalls of the loop at least this long are reported (seconds).
THRESHOLD = 0.1
#: Reported stalls are kept this long for the histogram (seconds)...
RECENT_WINDOW = 600.0
#: ...and at most this many of them.
RECENT_MAX = 1000
#: The histogram's bucket upper bounds (seconds).
BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, math.inf)


class LagMonitor:
    """Measures the loop's stalls; started with ``await tg.start(monitor.run)``."""

    def __init__(self, *, client_id: str, events: EventHub, threshold: float = THRESHOLD) -> None:
        self._client_id = client_id
        self._events = events
        self._tick = threshold / 2
        #: the lag of the last tick (0 when it woke on time), and the longest stall seen
        self.last = 0.0
        self.max = 0.0
        self._recent: deque[tuple[float, float]] = deque(maxlen=RECENT_MAX)

    def histogram(self) -> dict[float, int]:
        """Stalls of the last ten minutes by duration: ``{upper bound: count}``."""
        since = anyio.current_time() - RECENT_WINDOW
        counts = dict.fromkeys(BUCKETS, 0)
        for at, lag in self._recent:
            if at >= since:
                counts[next(b for b in BUCKETS if lag <= b)] += 1
        return counts

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        tick = self._tick
        now = loop_clock()
        task_status.started()
        while True:
            start = now()
            await anyio.sleep(tick)
            woke = now()
            late = woke - start - tick
            if late < tick:
                self.last = max(0.0, late)
                continue
            lag = late + tick / 2
            self.last = lag
            self.max = max(self.max, lag)
            self._recent.append((woke, lag))
            logger.warning(
                "event loop lag %.0f ms",
                lag * 1000,
                extra=client_extra("loop_lag", self._client_id),
            )
            self._events.publish(Event(kind=EventKind.LOOP_LAG, details={"lag": lag}))
