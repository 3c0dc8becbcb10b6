"""Process workers for the execution tests: module-level and importable, as ``run_in="process"``
requires. They run in a child process, so they report through files named in their args."""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any, ClassVar

import attrs

import river_anyio as river
from river_anyio._work import Outcome


@attrs.frozen
class ProcRecord:
    kind: ClassVar[str] = "exec_proc_record"
    path: str
    n: int
    tags: list[str] = attrs.field(factory=list)


@attrs.frozen
class ProcFail:
    kind: ClassVar[str] = "exec_proc_fail"


@attrs.frozen
class ProcSleepy:
    kind: ClassVar[str] = "exec_proc_sleepy"
    path: str


@attrs.frozen
class ProcStubborn:
    kind: ClassVar[str] = "exec_proc_stubborn"
    path: str


def record(ctx: Any, job: river.Job[ProcRecord]) -> Outcome | None:
    """Write what the child received; snooze when asked to, to show outcomes cross back."""
    with open(job.args.path, "w") as f:
        json.dump(
            {
                "args": attrs.asdict(job.args),
                "args_type": type(job.args).__name__,
                "row_args": ctx.job_row.args,
                "id": job.id,
                "attempt": job.attempt,
                "kind": job.kind,
                "pid": os.getpid(),
            },
            f,
        )
    if job.args.n == 2:
        return river.snooze(30)
    return None


def fail(ctx: Any, job: river.Job[ProcFail]) -> None:
    raise ValueError("boom in child")


def sleepy(ctx: Any, job: river.Job[ProcSleepy]) -> None:
    """Runs until SIGTERM interrupts it (the default handling: cooperative)."""
    with open(job.args.path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)


def stubborn(ctx: Any, job: river.Job[ProcStubborn]) -> None:
    """Ignores SIGTERM; only a kill ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(job.args.path, "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
