"""Global limits of a queue, shared by every river_anyio client that works it.

:class:`RateLimit` is the public value (``QueueConfig(rate_limit=...)``). The rest is the
arithmetic both drivers run inside a limited claim's transaction, pure so it is tested alone.

The rate limit is a *sliding window log*. The queue's limiter row holds the starts of the
last window as ``[[microseconds since the epoch, jobs started], ...]`` (JSON text). A claim
reads the clock once it holds the row's lock (so the instants increase from one claim to the
next), may start ``count`` minus the jobs of every entry later than ``now - per``, stamps the
rows it claims with that instant as ``attempted_at``, and adds an entry. So no window of
``per`` seconds, wherever it begins, holds more than ``count`` starts: there is no burst.

An entry's instant is rounded *up* to a grid of ``per / 100`` and merged with an entry of the
same instant, which keeps the log to about a hundred entries however many claims a window
sees; the cost is that a start may count against the limit up to 1 % of ``per`` longer than
it strictly must (never shorter).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

import attrs

from ._errors import ConfigError

__all__ = [
    "GRID_PER_WINDOW",
    "LIMITS_TABLE",
    "MIGRATE_COMMAND",
    "RateLimit",
    "RateWindow",
    "limits_table_missing",
]

#: Our table of per-queue limiter rows (migration line ``river_anyio``, version 002).
LIMITS_TABLE = "river_anyio_queue_limit"
#: The command that installs it.
MIGRATE_COMMAND = "river-anyio migrate-up --line river_anyio"
#: Entries are rounded up to a grid of ``per`` divided by this (see the module docstring).
GRID_PER_WINDOW = 100

RATE_LIMIT_MAX_COUNT = 1_000_000


def limits_table_missing(queue: str) -> str:
    """The message of the error a limited queue without its table raises."""
    return (
        f"queue {queue!r} has global limits (rate_limit/global_max_workers), which need the "
        f"table {LIMITS_TABLE} of migration line river_anyio: run `{MIGRATE_COMMAND}` "
        "(or start the client with auto_migrate=True)"
    )


def _count(_inst: object, _attr: object, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError("rate_limit.count", f"must be an int, not {type(value).__name__}", value)
    if not 1 <= value <= RATE_LIMIT_MAX_COUNT:
        raise ConfigError(
            "rate_limit.count",
            f"must be between 1 and {RATE_LIMIT_MAX_COUNT:,}, got {value}",
            value,
        )


def _per(value: Any) -> float:
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(
            "rate_limit.per",
            f"must be a timedelta or a number of seconds, not {type(value).__name__}",
            value,
        )
    if not math.isfinite(value) or value < 0.001:
        raise ConfigError("rate_limit.per", "must be a finite duration of at least 1 ms", value)
    if value > 31 * 24 * 3600:
        raise ConfigError("rate_limit.per", "must be at most 31 days", value)
    return float(value)


@attrs.frozen
class RateLimit:
    """At most ``count`` jobs of a queue start per ``per`` (a timedelta or seconds), across
    every river_anyio client working the queue: no window of that length, wherever it
    begins, holds more starts (``attempted_at``). ``per`` reads back as float seconds."""

    count: int = attrs.field(validator=_count)
    per: float = attrs.field(kw_only=True, converter=_per)


@attrs.define
class RateWindow:
    """The decoded starts of a queue's last window, and what they allow (see the module
    docstring). Times are microseconds since the epoch."""

    entries: list[list[int]]

    @classmethod
    def decode(cls, text: str | None) -> RateWindow:
        entries = json.loads(text) if text else []
        return cls(entries if isinstance(entries, list) else [])

    def encode(self) -> str:
        return json.dumps(self.entries, separators=(",", ":"))

    def started_since(self, since: int) -> int:
        return sum(n for at, n in self.entries if at > since)

    def allowance(self, now: int, limit: RateLimit) -> int:
        """How many jobs may start at ``now``."""
        per = round(limit.per * 1e6)
        return max(0, limit.count - self.started_since(now - per))

    def record(self, now: int, started: int, limit: RateLimit) -> None:
        """``started`` jobs started at ``now``: add them (at ``now`` rounded up to the grid),
        and forget the entries that left the window."""
        per = round(limit.per * 1e6)
        entries = [e for e in self.entries if e[0] > now - per]
        if started > 0:
            grid = max(1, per // GRID_PER_WINDOW)
            at = -(-now // grid) * grid
            if entries and entries[-1][0] == at:
                entries[-1] = [at, entries[-1][1] + started]
            else:
                entries.append([at, started])
                entries.sort()
        self.entries = entries

    def reopens_in(self, now: int, limit: RateLimit) -> float:
        """Seconds from ``now`` until at least one job may start again (0: one may now)."""
        per = round(limit.per * 1e6)
        live = sorted(e for e in self.entries if e[0] > now - per)
        total = sum(n for _, n in live)
        for at, n in live:
            if total < limit.count:
                break
            total -= n
            if total < limit.count:  # this entry leaves the window at at + per
                return max(0.0, (at + per - now) / 1e6)
        return 0.0


def micros(value: dt.datetime) -> int:
    """``value`` as microseconds since the epoch (exact)."""
    return (value - _EPOCH) // _US


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)


def claim_size(
    *,
    wanted: int,
    now: int,
    window: RateWindow | None,
    rate_limit: RateLimit | None,
    global_max_workers: int | None,
    running: int,
) -> int:
    """How many rows a limited claim takes: ``wanted``, capped by the rate allowance at
    ``now`` and by the global slots left with ``running`` jobs of the queue running."""
    n = wanted
    if rate_limit is not None and window is not None:
        n = min(n, window.allowance(now, rate_limit))
    if global_max_workers is not None:
        n = min(n, global_max_workers - running)
    return max(0, n)
