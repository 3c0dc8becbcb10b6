"""The wall clock the runtime stamps rows with, injectable for tests (River's TimeGenerator)."""

from __future__ import annotations

import datetime as dt
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    def now(self) -> dt.datetime:
        """The current time, timezone-aware (UTC)."""
        ...


class SystemClock:
    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)
