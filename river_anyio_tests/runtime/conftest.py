"""Shared helpers for runtime tests: a fixed clock, a quick-to-start client, event waits and
rows read back from the database."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

import river_anyio as river
from river_anyio._timeutil import format_sqlite_timestamp, parse_sqlite_timestamp

UTC = dt.UTC
#: How long any single wait in a runtime test may take before it fails.
WAIT = 10.0


class FixedClock:
    """A wall clock that only moves when told to (``clock.at = ...``)."""

    def __init__(self, at: dt.datetime) -> None:
        self.at = at

    def now(self) -> dt.datetime:
        return self.at


def future_instant() -> dt.datetime:
    """An instant a day ahead: retries and snoozes computed from it are never due during a
    test, so a failed job is not claimed again behind the test's back."""
    return (dt.datetime.now(UTC) + dt.timedelta(days=1)).replace(microsecond=123456)


def stored(database_url: str, value: dt.datetime) -> dt.datetime:
    """``value`` as a row column keeps it: PostgreSQL keeps microseconds, River's SQLite text
    milliseconds (rounded, halves up, as River Go writes them). JSON times keep microseconds."""
    if database_url.startswith("sqlite"):
        return parse_sqlite_timestamp(format_sqlite_timestamp(value))
    return value


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(future_instant())


@contextlib.asynccontextmanager
async def running(
    url: str,
    workers: river.Workers,
    *,
    queues: dict[str, river.QueueConfig] | None = None,
    **options: Any,
) -> AsyncIterator[river.ClientRun]:
    """``open_client`` working ``default`` (10 slots) with fast fetches and a bounded stop.

    It never leads unless asked (``leader_election_disabled=False``): with the fixed clock a
    day ahead, the leader's rescuer would see every running job as stuck.
    """
    options.setdefault("leader_election_disabled", True)
    options.setdefault("fetch_cooldown", 0.01)
    options.setdefault("soft_stop_timeout", 2.0)
    if queues is None:
        queues = {"default": river.QueueConfig(max_workers=10)}
    async with river.open_client(url, queues=queues, workers=workers, **options) as run:
        yield run


async def next_event(
    events: river.Subscription,
    kind: river.EventKind | None = None,
    *,
    job_id: int | None = None,
    where: Callable[[river.Event], bool] | None = None,
    within: float = WAIT,
) -> river.Event:
    """The next event matching ``kind``/``job_id``/``where`` (others are skipped)."""
    with anyio.fail_after(within):
        async for ev in events:
            if kind is not None and ev.kind != kind:
                continue
            if job_id is not None and (ev.job is None or ev.job.id != job_id):
                continue
            if where is not None and not where(ev):
                continue
            return ev
    raise AssertionError(f"subscription ended before a {kind} event")


async def get_row(run: river.ClientRun, job_id: int) -> river.JobRow:
    row = await run.client.driver.executor().job_get_by_id(job_id)
    assert row is not None, f"job {job_id} is gone"
    return row


async def raw_errors(run: river.ClientRun, job_id: int) -> list[dict[str, Any]]:
    """The ``errors`` column exactly as stored, decoded from its JSON text."""
    ex = run.client.driver.executor()
    if run.client.driver.dialect == "postgres":
        rows = await ex.fetch_all(
            "SELECT to_json(errors)::text FROM river_job WHERE id = %s", (job_id,)
        )
    else:
        rows = await ex.fetch_all("SELECT json(errors) FROM river_job WHERE id = ?", (job_id,))
    value: list[dict[str, Any]] = json.loads(rows[0][0] or "[]")
    return value


def user_metadata(row: river.JobRow) -> dict[str, Any]:
    """The row's metadata without River's own ``river:`` keys (SQLite's insert nonce)."""
    return {k: v for k, v in row.metadata.items() if not k.startswith("river:")}


async def events_for(
    events: river.Subscription, job_ids: list[int], *, within: float = WAIT
) -> dict[int, river.Event]:
    """The first job event of each of ``job_ids``, whatever order they arrive in."""
    got: dict[int, river.Event] = {}
    with anyio.fail_after(within):
        while len(got) < len(job_ids):
            ev = await next_event(events, where=lambda e: e.job is not None and e.job.id in job_ids)
            assert ev.job is not None
            got.setdefault(ev.job.id, ev)
    return got
