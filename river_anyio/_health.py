"""A running client's health: the facts a readiness probe needs, and whether they are fine.

:meth:`ClientRun.health() <river_anyio.ClientRun.health>` reads them from what the run already
records while it works (the time of each successful claim, completer write, listener ping,
leadership attempt); it sends no query of its own, so a probe may call it as often as it likes.
:class:`HealthConfig` holds the thresholds that turn the facts into ``ok`` and its reasons.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import attrs

from ._errors import ConfigError

__all__ = ["Health", "HealthConfig", "QueueHealth"]

DATABASE_FAILING_AFTER_DEFAULT = 5.0
FETCH_FAILING_AFTER_DEFAULT = 5.0
NOTIFIER_DOWN_AFTER_DEFAULT = 30.0
#: The completer's own high-water mark: at this backlog, workers wait for the database.
COMPLETER_BACKLOG_MAX_DEFAULT = 10_000


def _seconds(value: object, field: str, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(
            field,
            f"must be a number of seconds or a timedelta{' or None' if allow_none else ''}, "
            f"not {type(value).__name__}",
            value,
        )
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(field, "must be a finite number of seconds greater than zero", value)
    return float(value)


def _required(value: float | None) -> float:
    assert value is not None  # _seconds() without allow_none never returns None
    return value


def _database_failing_after(value: float | dt.timedelta) -> float:
    return _required(_seconds(value, "database_failing_after"))


def _fetch_failing_after(value: float | dt.timedelta) -> float:
    return _required(_seconds(value, "fetch_failing_after"))


def _notifier_down_after(value: float | dt.timedelta | None) -> float | None:
    return _seconds(value, "notifier_down_after", allow_none=True)


def _backlog(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError("completer_backlog_max", "must be an int >= 1", value)
    return value


@attrs.frozen(kw_only=True)
class HealthConfig:
    """When :meth:`ClientRun.health() <river_anyio.ClientRun.health>` reports a client not ok
    (durations in seconds or as timedeltas; each reads back as float seconds).

    Attributes:
        database_failing_after: Round trips to the database may fail for this long, with none
            succeeding, before the database counts as unreachable (5 s). A single failed
            statement that is retried at once never reaches it.
        fetch_failing_after: A queue's claims may fail for this long before the queue counts
            as failing (5 s). An idle queue whose claims succeed is healthy however long it
            has found nothing; a paused or full queue does not claim and is healthy too.
        notifier_down_after: The listener may be disconnected for this long before that is a
            reason (30 s; ``None``: never). Without it producers still poll, so alone it only
            makes a client slower to see new jobs.
        completer_backlog_max: Finished jobs whose results wait to be written at which the
            client is not ok (10,000: where workers start to wait for the database).
    """

    database_failing_after: float = attrs.field(
        default=DATABASE_FAILING_AFTER_DEFAULT, converter=_database_failing_after
    )
    fetch_failing_after: float = attrs.field(
        default=FETCH_FAILING_AFTER_DEFAULT, converter=_fetch_failing_after
    )
    notifier_down_after: float | None = attrs.field(
        default=NOTIFIER_DOWN_AFTER_DEFAULT,
        converter=_notifier_down_after,
    )
    completer_backlog_max: int = attrs.field(
        default=COMPLETER_BACKLOG_MAX_DEFAULT, converter=_backlog
    )


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _secs(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@attrs.frozen(kw_only=True)
class QueueHealth:
    """One worked queue: its last successful claim and whether its claims are failing.

    Attributes:
        last_fetch_at: When its last claim succeeded (whether or not it found jobs); ``None``
            before the first.
        last_fetch_age: Seconds since then.
        failing_for: Seconds since its claims began failing, ``None`` while they succeed.
        paused: Whether the queue is paused (a paused queue does not claim).
        active_jobs: Jobs this client holds for the queue (claimed or running).
    """

    last_fetch_at: dt.datetime | None
    last_fetch_age: float | None
    failing_for: float | None
    paused: bool
    active_jobs: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "last_fetch_at": _iso(self.last_fetch_at),
            "last_fetch_age": _secs(self.last_fetch_age),
            "failing_for": _secs(self.failing_for),
            "paused": self.paused,
            "active_jobs": self.active_jobs,
        }


@attrs.frozen(kw_only=True)
class Health:
    """A client's health at ``checked_at``: ``ok``, the ``reasons`` it is not, and the facts.

    Attributes:
        ok: Whether the client is ready: started, not stopping, its database reachable, its
            queues claiming, its results being written (the thresholds of
            :class:`HealthConfig`).
        reasons: Why it is not ok, one sentence each (empty when ok).
        checked_at: When this was read (UTC).
        database_reachable: Whether the last round trip to the database succeeded, or failed
            for less than ``database_failing_after``; ``None`` when none was made yet.
        database_last_ok_at: When a round trip last succeeded (claims, completer writes,
            listener pings, leadership attempts, the start's schema check).
        database_last_ok_age: Seconds since then.
        database_failing_for: Seconds since round trips began failing with none succeeding,
            ``None`` when the last one succeeded.
        database_error: The last failure's text while they fail.
        waiting_for_database: The client was started with ``wait_for_database`` and the
            database has not answered yet.
        notifier_connected: Whether the listener is connected; ``None`` when this client
            does not listen (SQLite polls, ``poll_only``, an insert-only client).
        queues: Each worked queue's :class:`QueueHealth`.
        completer_backlog: Finished jobs whose results are not written yet.
        leader: Whether this client is the leader.
        stopping: Whether a stop has begun (a stopping client is not ok: route no new work
            to it).
    """

    ok: bool
    reasons: tuple[str, ...]
    checked_at: dt.datetime
    database_reachable: bool | None
    database_last_ok_at: dt.datetime | None
    database_last_ok_age: float | None
    database_failing_for: float | None
    database_error: str | None
    waiting_for_database: bool
    notifier_connected: bool | None
    queues: dict[str, QueueHealth]
    completer_backlog: int
    leader: bool
    stopping: bool

    def as_dict(self) -> dict[str, Any]:
        """The health as JSON-ready values (times as ISO 8601 strings, ages in seconds)."""
        return {
            "ok": self.ok,
            "reasons": list(self.reasons),
            "checked_at": _iso(self.checked_at),
            "database": {
                "reachable": self.database_reachable,
                "last_ok_at": _iso(self.database_last_ok_at),
                "last_ok_age": _secs(self.database_last_ok_age),
                "failing_for": _secs(self.database_failing_for),
                "error": self.database_error,
                "waiting": self.waiting_for_database,
            },
            "notifier_connected": self.notifier_connected,
            "queues": {name: q.as_dict() for name, q in sorted(self.queues.items())},
            "completer_backlog": self.completer_backlog,
            "leader": self.leader,
            "stopping": self.stopping,
        }
