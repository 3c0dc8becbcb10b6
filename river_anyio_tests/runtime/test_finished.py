"""A finished attempt is its own completion record for the drivers."""

from __future__ import annotations

import datetime as dt

import attrs

from river_anyio._events import EventKind
from river_anyio._job import JobState
from river_anyio._runtime._completer import Finished
from river_anyio.drivers import JobCompletion


def test_finished_carries_every_completion_field() -> None:
    completion_fields = {f.name: f.type for f in attrs.fields(JobCompletion)}
    finished_fields = {f.name: f.type for f in attrs.fields(Finished)}
    assert completion_fields.items() <= finished_fields.items()


def test_completion_round_trips() -> None:
    at = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    values = {
        "id": 7,
        "attempt": 3,
        "state": JobState.RETRYABLE,
        "finalized_at": None,
        "scheduled_at": at,
        "error": b'{"error":"x"}',
        "metadata_updates": b'{"k":1}',
        "attempt_new": 2,
    }
    finished = Finished(
        **values,
        row=None,  # type: ignore[arg-type]
        kind=EventKind.JOB_FAILED,
        message="x",
        start=at.timestamp(),
        started=0.0,
    )
    assert finished.completion == JobCompletion(**values)
