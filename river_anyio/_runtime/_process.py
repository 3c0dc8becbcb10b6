"""Process workers: one child process per job, at most ``process_workers`` at a time.

The job's args cross the boundary as the persisted JSON and the child rebuilds them. On
cancellation (timeout, remote cancel, stop) the child gets SIGTERM, which raises inside the
worker function; a child still running ``job_stuck_threshold`` seconds later is killed.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from typing import Any

import anyio
from anyio.abc import Process

from .._work import CancelOutcome, DiscardOutcome, Job, Registration, WorkContext, snooze

__all__ = ["ProcessRunner", "ProcessWorkerError"]

logger = logging.getLogger("river_anyio.executor")


class ProcessWorkerError(Exception):
    """A process worker raised: the child's error text (recorded as the attempt's error, as
    any exception's text is) and its traceback (in ``trace``, and as a note, so the log
    record of the failure shows where the child raised)."""

    def __init__(self, message: str, trace: str = "") -> None:
        super().__init__(message)
        self.trace = trace
        if trace:
            self.add_note(f"the process worker's traceback:\n{trace.rstrip()}")


class ProcessRunner:
    def __init__(self, *, limit: int, stuck_threshold: float) -> None:
        self._limiter = anyio.CapacityLimiter(limit)
        self._stuck_threshold = stuck_threshold

    async def run(self, reg: Registration, ctx: WorkContext, job: Job[Any]) -> Any:
        row = job.row
        request = {
            "module": reg.work.__module__,
            "qualname": reg.work.__qualname__,
            "args_module": reg.args_cls.__module__,
            "args_qualname": reg.args_cls.__qualname__,
            "args": row.args,
            "job": {
                "id": row.id,
                "kind": row.kind,
                "queue": row.queue,
                "attempt": row.attempt,
                "max_attempts": row.max_attempts,
                "metadata": dict(row.metadata),
                "args": row.args,
                "scheduled_at": row.scheduled_at.isoformat(),
            },
        }
        async with self._limiter:
            process = await anyio.open_process(
                [sys.executable, "-m", "river_anyio._runtime._procworker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=None,
            )
            try:
                assert process.stdin is not None
                assert process.stdout is not None
                await process.stdin.send(json.dumps(request).encode() + b"\n")
                await process.stdin.aclose()
                chunks = [chunk async for chunk in process.stdout]
                await process.wait()
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):
                    await self._stop(process, row.id)
                raise
            finally:
                with anyio.CancelScope(shield=True):
                    await process.aclose()
        return self._result(b"".join(chunks), process.returncode)

    async def _stop(self, process: Process, job_id: int) -> None:
        if process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        with anyio.move_on_after(self._stuck_threshold):
            await process.wait()
            return
        logger.warning(
            "process worker for job %d ignored cancellation for %.1fs; killing it",
            job_id,
            self._stuck_threshold,
            extra={"river_event": "job_stuck_killed", "river_job_id": job_id},
        )
        process.kill()
        await process.wait()

    @staticmethod
    def _result(raw: bytes, returncode: int | None) -> Any:
        try:
            out = json.loads(raw)
        except ValueError:
            raise ProcessWorkerError(
                f"process worker exited with code {returncode} without a result"
            ) from None
        if out.get("ok"):
            if "snooze" in out:
                return snooze(out["snooze"])
            if "discard" in out:
                return DiscardOutcome(out["discard"])
            if "cancel" in out:
                return CancelOutcome(out["cancel"])
            return None
        raise ProcessWorkerError(out.get("error", "process worker failed"), out.get("trace", ""))
