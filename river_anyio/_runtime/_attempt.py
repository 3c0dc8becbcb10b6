"""One running attempt at a job: the record its queue's worker pool keeps, and nobody else.

An :class:`Attempt` is made when its row is claimed and lives until its result is handed to
the completer. The pool owns it (one mapping, job id -> attempt); the job runner fills in what
running it needs (worker, decoded job, context, result). A remote cancel, the job's timeout and
the client's stop all end it the same way: they set :attr:`Attempt.reason` and cancel
:attr:`Attempt.scope` (the cancel scope the job runs in, set only while it runs).
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING, Any

from ._util import REMOTE_CANCEL_REASON

if TYPE_CHECKING:
    import anyio

    from .._job import JobRow
    from .._work import Job, Registration, WorkContext

__all__ = ["Attempt", "CancelReason"]


class CancelReason(enum.Enum):
    """Why an attempt was cancelled; the value is the cancel scope's reason."""

    REMOTE = REMOTE_CANCEL_REASON
    TIMEOUT = "job timed out"
    STOP = "client stopping"


class Attempt:
    """One attempt at a claimed job, from the claim to the hand-off of its result."""

    __slots__ = (
        "ctx",
        "deadline",
        "job",
        "reason",
        "reg",
        "result",
        "row",
        "scope",
        "start",
        "started",
        "timeout",
    )

    # set when it begins (by the job runner); ``start`` on the client's clock, in seconds
    # since the epoch (a datetime only when needed: building one per job costs)
    start: float
    started: float
    reg: Registration | None
    result: Any

    def __init__(self, row: JobRow) -> None:
        self.row = row
        #: the scope the worker runs in, while it runs (a worker's scope serves many jobs)
        self.scope: anyio.CancelScope | None = None
        #: why it was cancelled, once it was
        self.reason: CancelReason | None = None
        #: when its timeout cancels it (the event loop's clock), inf without a timeout
        self.deadline = math.inf
        self.timeout: float | None = None
        self.job: Job[Any] | None = None
        self.ctx: WorkContext | None = None
