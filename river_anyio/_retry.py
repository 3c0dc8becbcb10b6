"""Retry policies: when a failed job runs again."""

from __future__ import annotations

import datetime as dt
import random
from typing import Protocol, runtime_checkable

from ._job import JobRow

__all__ = ["DefaultRetryPolicy", "RetryPolicy"]

# Go's time.Duration tops out at about 292 years; River caps the backoff there.
_MAX_SECONDS = (2**63 - 1) / 1e9


@runtime_checkable
class RetryPolicy(Protocol):
    """Decides the next run time of a job whose attempt just failed."""

    def next_retry(self, job: JobRow, now: dt.datetime) -> dt.datetime: ...


class DefaultRetryPolicy:
    """River's default: ``(errors + 1) ** 4`` seconds, ±10% jitter.

    The number of recorded errors (including the one just made) drives it, not ``attempt``, so
    snoozes do not stretch the schedule: 1 s, 16 s, 81 s, 256 s, … about three weeks in all
    for River's default of 25 attempts.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def next_retry(self, job: JobRow, now: dt.datetime) -> dt.datetime:
        errors = len(job.errors) + 1  # the error being recorded now counts
        seconds = float(errors**4)
        if seconds >= _MAX_SECONDS:
            return now + dt.timedelta(seconds=_MAX_SECONDS)
        seconds += seconds * (self._rng.random() * 0.2 - 0.1)
        return now + dt.timedelta(seconds=seconds)
