"""Args, a scripted worker and row comparison shared by the River Go interop tests.

The scripted worker does what a job's args say, exactly as the Go program's worker does, so
either language can work a job the other inserted and the outcome is known in advance.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from typing import Any, ClassVar

import anyio
import attrs

import river_anyio as river
from river_anyio._timeutil import parse_rfc3339, parse_rfc3339_ns

QUEUE = "interop"


@attrs.frozen
class Task:
    """Args of the scripted kind; the Go worker reads the same fields."""

    kind: ClassVar[str] = "interop_task"
    action: str = "complete"  # complete, error, snooze, cancel, output, sleep
    message: str = ""
    snooze_seconds: float = 0.0
    sleep_seconds: float = 0.0
    retry_in_seconds: float | None = None
    fail_attempts: int = 0
    snooze_times: int = 0
    output: dict[str, Any] | None = None
    label: str = ""


@attrs.frozen
class Plain:
    """The Go program's ``PlainArgs``: the same fields, order and ``omitempty``."""

    kind: ClassVar[str] = "interop_plain"
    name: str
    count: int
    ratio: float
    tags: list[str] | None
    meta: dict[str, Any] | None
    note: str = attrs.field(default="", metadata={"omitempty": True})


def task_json(**fields: Any) -> dict[str, Any]:
    """A Go insert spec for a scripted job."""
    return {"kind": Task.kind, "queue": QUEUE, "args": attrs.asdict(Task(**fields))}


class ScriptedWorker:
    """Works ``Task`` jobs as their args say; records every job it was handed."""

    def __init__(self) -> None:
        self.jobs: list[river.Job[Task]] = []
        self.started: dict[int, anyio.Event] = {}

    def _started(self, job_id: int) -> anyio.Event:
        return self.started.setdefault(job_id, anyio.Event())

    async def work(self, ctx: river.WorkContext, job: river.Job[Task]) -> river.Outcome | None:
        self.jobs.append(job)
        self._started(job.id).set()
        a = job.args
        if a.action == "error":
            if a.fail_attempts == 0 or job.attempt <= a.fail_attempts:
                raise RuntimeError(a.message)
        elif a.action == "snooze":
            if not (a.snooze_times and int(job.metadata.get("snoozes", 0)) >= a.snooze_times):
                return river.snooze(a.snooze_seconds)
        elif a.action == "cancel":
            return river.cancel(a.message)
        elif a.action == "output":
            ctx.set_metadata("output", a.output)
        elif a.action == "sleep":
            await anyio.sleep(a.sleep_seconds or 3600)
        return None

    def next_retry(self, job: river.Job[Task]) -> dt.datetime | None:
        if job.args.retry_in_seconds is None:
            return None
        return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=job.args.retry_in_seconds)

    async def wait_started(self, job_id: int) -> None:
        await self._started(job_id).wait()


def workers(worker: ScriptedWorker, *, plain: list[river.Job[Plain]] | None = None) -> Any:
    w = river.Workers()
    w.add(Task, worker)
    if plain is not None:

        async def work_plain(ctx: river.WorkContext, job: river.Job[Plain]) -> None:
            plain.append(job)

        w.add(Plain, work_plain)
    return w


CLIENT_OPTIONS: dict[str, Any] = {"fetch_cooldown": 0.02, "fetch_poll_interval": 0.2}


async def collect(
    sub: river.Subscription, ids: Iterable[int], kinds: set[river.EventKind] | None = None
) -> dict[int, river.Event]:
    """The first job event for each id in ``ids`` (of the given kinds)."""
    want = set(ids)
    got: dict[int, river.Event] = {}
    with anyio.fail_after(30):
        async for event in sub:
            if event.job is None or event.job.id not in want or event.job.id in got:
                continue
            if kinds is None or event.kind in kinds:
                got[event.job.id] = event
                if len(got) == len(want):
                    return got
    raise AssertionError(f"subscription ended; got events for {sorted(got)} of {sorted(want)}")


def _time(value: str | None) -> dt.datetime | None:
    return None if value is None else parse_rfc3339(value)


def assert_same_row(go: dict[str, Any], ours: river.JobRow) -> None:
    """River Go's view of a row (the program's ``get``) equals river_anyio's, field by field."""
    assert go["id"] == ours.id
    assert go["args"] == dict(ours.args)
    assert go["attempt"] == ours.attempt
    assert _time(go["attempted_at"]) == ours.attempted_at
    assert (go["attempted_by"] or []) == list(ours.attempted_by)
    assert _time(go["created_at"]) == ours.created_at
    assert len(go["errors"] or []) == len(ours.errors)
    for theirs, mine in zip(go["errors"] or [], ours.errors, strict=True):
        # to the nanosecond Go wrote (a datetime holds microseconds, at_nanosecond the rest)
        assert parse_rfc3339_ns(theirs["at"]) == (mine.at, mine.at_nanosecond)
        assert (theirs["attempt"], theirs["error"], theirs["trace"]) == (
            mine.attempt,
            mine.error,
            mine.trace,
        )
    assert _time(go["finalized_at"]) == ours.finalized_at
    assert go["kind"] == ours.kind
    assert go["max_attempts"] == ours.max_attempts
    assert go["metadata"] == dict(ours.metadata)
    assert go["priority"] == ours.priority
    assert go["queue"] == ours.queue
    assert _time(go["scheduled_at"]) == ours.scheduled_at
    assert go["state"] == ours.state.value
    assert (go["tags"] or []) == list(ours.tags)
    assert go["unique_key"] == (ours.unique_key.hex() if ours.unique_key is not None else None)
    assert sorted(go["unique_states"] or []) == sorted(s.value for s in ours.unique_states or ())


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
