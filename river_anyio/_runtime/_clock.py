"""The wall clock the runtime stamps rows with, injectable for tests (River's TimeGenerator)."""

from __future__ import annotations

import datetime as dt
from typing import Protocol

import anyio
import anyio.lowlevel

__all__ = ["Clock", "ManualClock", "SystemClock", "sleep_until"]


class Clock(Protocol):
    def now(self) -> dt.datetime:
        """The current time, timezone-aware (UTC)."""
        ...


class SystemClock:
    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


# --- sleeping on a clock (periodic jobs) ------------------------------------------------------


async def sleep_until(clock: Clock, when: dt.datetime) -> None:
    """Sleep until ``clock`` reads ``when``. A clock with its own ``sleep_until`` (a manual
    clock in tests) is asked; otherwise the wait is the difference from ``clock.now()``."""
    own = getattr(clock, "sleep_until", None)
    if own is not None:
        await own(when)
        return
    delay = (when.astimezone(dt.UTC) - clock.now().astimezone(dt.UTC)).total_seconds()
    await anyio.sleep(max(0.0, delay))


class ManualClock:
    """A clock that moves only when told to; tasks sleeping on it wake when it passes their
    deadline. For tests of time-driven services on both event loops."""

    def __init__(self, at: dt.datetime) -> None:
        self._at = at.astimezone(dt.UTC)
        self._sleepers: list[tuple[dt.datetime, anyio.Event]] = []
        self._sleepers_changed = anyio.Event()

    def now(self) -> dt.datetime:
        return self._at

    def set(self, at: dt.datetime) -> None:
        self._at = at.astimezone(dt.UTC)
        for when, event in self._sleepers:
            if when <= self._at:
                event.set()

    def advance(self, delta: dt.timedelta) -> None:
        self.set(self._at + delta)

    @property
    def next_deadline(self) -> dt.datetime | None:
        """The earliest deadline a task is sleeping until (still in the future), if any."""
        pending = [when for when, _ in self._sleepers if when > self._at]
        return min(pending) if pending else None

    async def sleep_until(self, when: dt.datetime) -> None:
        when = when.astimezone(dt.UTC)
        if when <= self._at:
            await anyio.lowlevel.checkpoint()
            return
        entry = (when, anyio.Event())
        self._sleepers.append(entry)
        self._notify()
        try:
            await entry[1].wait()
        finally:
            self._sleepers.remove(entry)
            self._notify()

    async def wait_sleeping(self) -> dt.datetime:
        """Wait until some task sleeps until a future time; returns the earliest such time."""
        while (deadline := self.next_deadline) is None:
            await self._sleepers_changed.wait()
        return deadline

    def _notify(self) -> None:
        self._sleepers_changed.set()
        self._sleepers_changed = anyio.Event()
