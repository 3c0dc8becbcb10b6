"""The event-loop lag monitor: reports every stall of the loop of at least ``THRESHOLD``.

A stall is a task that runs without yielding (a blocking call in async code): nothing else on
the loop runs meanwhile. A thread of the monitor's own looks at the loop's thread every tick
(half the threshold: 50 ms). When that thread is waiting for I/O in the event loop's
own wait (asyncio's selector, trio's I/O manager) the loop is idle, not stalled, and nothing
more is done: an idle client's loop is not woken by the monitor. Otherwise the monitor asks
the loop to run a probe and times how long it takes to run. A stall of ``B`` seconds that
begins between two looks is first seen within a tick of its start, so its probe waits
between ``B - tick`` and ``B``; a probe that waited at least one tick is reported as a stall
of ``wait + tick/2`` (within ±25 ms of the truth): every stall of 100 ms or more is reported,
once, and stalls shorter than one tick never are.

The cost: a thread waking 20 times a second to read which code the loop's thread runs (a
few microseconds each); a probe on the loop only while it is busy. Ticking on the loop itself
woke it 20 times a second, two thirds of an idle client's CPU (measured in
``docs/discussion/design.md``, "Idle cost"). On a loop whose wait the monitor does not know
(uvloop, say) every look is a probe, which costs what the ticks did.
"""

from __future__ import annotations

import logging
import math
import selectors
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from types import CodeType

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
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
        #: the latest probe's wait (0 when the loop was last seen idle or on time), and the
        #: longest stall seen
        self.last = 0.0
        self.max = 0.0
        self._recent: deque[tuple[float, float]] = deque(maxlen=RECENT_MAX)
        #: looks at the loop's thread, and probes run on the loop (for tests and diagnostics)
        self.looks = 0
        self.probes = 0

    def histogram(self) -> dict[float, int]:
        """Stalls of the last ten minutes by duration: ``{upper bound: count}``."""
        since = anyio.current_time() - RECENT_WINDOW
        counts = dict.fromkeys(BUCKETS, 0)
        for at, lag in self._recent:
            if at >= since:
                counts[next(b for b in BUCKETS if lag <= b)] += 1
        return counts

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch the loop from a thread until cancelled; the thread ends with it."""
        stop = threading.Event()
        watch = _Watch(
            self,
            loop_thread=threading.get_ident(),
            idle=_idle_waits(anyio.get_cancelled_exc_class()),
            clock=loop_clock(),
            stop=stop,
        )
        async with anyio.create_task_group() as tg:
            # a limiter of its own: the thread does not take one of the application's
            tg.start_soon(
                lambda: anyio.to_thread.run_sync(watch.run, limiter=anyio.CapacityLimiter(1)),
                name="river lag monitor thread",
            )
            task_status.started()
            try:
                await anyio.sleep_forever()
            finally:
                stop.set()  # the thread returns at once; the task group waits for it

    def _stalled(self, lag: float, at: float) -> None:
        """A stall of ``lag`` seconds just ended (on the loop)."""
        self.max = max(self.max, lag)
        self._recent.append((at, lag))
        logger.warning(
            "event loop lag %.0f ms",
            lag * 1000,
            extra=client_extra("loop_lag", self._client_id),
        )
        self._events.publish(Event(kind=EventKind.LOOP_LAG, details={"lag": lag}))


class _Watch:
    """The monitor's thread: a look every tick, a probe when the loop is not idle."""

    def __init__(
        self,
        monitor: LagMonitor,
        *,
        loop_thread: int,
        idle: frozenset[CodeType],
        clock: Callable[[], float],
        stop: threading.Event,
    ) -> None:
        self._monitor = monitor
        self._loop_thread = loop_thread
        self._idle = idle
        self._clock = clock
        self._stop = stop

    def run(self) -> None:
        monitor = self._monitor
        tick = monitor._tick
        frames = sys._current_frames
        while not self._stop.wait(tick):  # set when the client stops: ends the thread at once
            monitor.looks += 1
            frame = frames().get(self._loop_thread)
            if frame is not None and frame.f_code in self._idle:
                monitor.last = 0.0
                continue
            del frame
            asked = time.monotonic()
            try:
                anyio.from_thread.run_sync(self._probe, asked)  # waits for the loop to run it
            except anyio.RunFinishedError:
                return

    def _probe(self, asked: float) -> None:
        """On the loop: how long it took to get here."""
        monitor = self._monitor
        monitor.probes += 1
        wait = time.monotonic() - asked
        tick = monitor._tick
        if wait < tick:
            monitor.last = wait
            return
        lag = wait + tick / 2
        monitor.last = lag
        monitor._stalled(lag, self._clock())


def _idle_waits(cancelled: type[BaseException]) -> frozenset[CodeType]:
    """The code an event loop's thread runs while it waits for I/O (its innermost Python
    frame then): asyncio's selectors, or trio's I/O managers. Empty for a loop not known,
    whose every look is then a probe."""
    codes: set[CodeType] = set()
    if cancelled.__module__.startswith("asyncio"):
        for name in ("SelectSelector", "PollSelector", "EpollSelector", "DevpollSelector",
                     "KqueueSelector"):  # fmt: skip
            cls = getattr(selectors, name, None)
            if cls is not None:
                codes.add(cls.select.__code__)
    elif cancelled.__module__.startswith("trio"):
        try:  # the platform's I/O manager (epoll, kqueue or IOCP), as trio picks it
            from trio._core._run import TheIOManager  # type: ignore[attr-defined]

            codes.add(TheIOManager.get_events.__code__)
        except (ImportError, AttributeError):
            pass
    return frozenset(codes)
