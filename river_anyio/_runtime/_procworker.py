"""Child side of process workers: run one job function and report its result as JSON.

Reads one JSON request on stdin, imports the worker function and the args class by name,
rebuilds the job from the persisted JSON, runs it and writes one JSON result on stdout.
SIGTERM (the job was cancelled) raises :class:`JobCancelledInProcess` in the function.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import signal
import sys
import traceback
from typing import Any

__all__ = ["JobCancelledInProcess", "ProcessContext", "main"]


class JobCancelledInProcess(BaseException):
    """Raised inside a process worker when its job is cancelled (timeout, remote, stop)."""


def _resolve(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _on_term(_signum: int, _frame: object) -> None:
    raise JobCancelledInProcess("job cancelled")


def main() -> None:
    signal.signal(signal.SIGTERM, _on_term)
    request = json.loads(sys.stdin.buffer.readline())
    out: dict[str, Any]
    try:
        from river_anyio._convert import structure_args
        from river_anyio._work import CancelOutcome, DiscardOutcome, Job, SnoozeOutcome

        fn = _resolve(request["module"], request["qualname"])
        args_cls = _resolve(request["args_module"], request["args_qualname"])
        row = _ProcessRow(request["job"])
        job = Job(row, structure_args(request["args"], args_cls))  # type: ignore[arg-type]
        result = fn(ProcessContext(row), job)
        if result is None:
            out = {"ok": True}
        elif isinstance(result, SnoozeOutcome):
            out = {"ok": True, "snooze": result.duration.total_seconds()}
        elif isinstance(result, DiscardOutcome):
            out = {"ok": True, "discard": result.reason}
        elif isinstance(result, CancelOutcome):
            out = {"ok": True, "cancel": result.reason}
        else:
            out = {"ok": False, "error": f"worker for {row.kind!r} returned "
                   f"{type(result).__name__}; expected None or an outcome (snooze, discard, "
                   "cancel)", "trace": ""}  # fmt: skip
    except JobCancelledInProcess:
        out = {"ok": False, "cancelled": True, "error": "job cancelled", "trace": ""}
    except BaseException as exc:
        # the text the parent records (as its runner records an exception's, River's
        # err.Error()); the traceback goes to the parent's log
        try:
            text = str(exc)
        except Exception:
            text = ""
        out = {
            "ok": False,
            "error": text or type(exc).__name__,
            "trace": "".join(traceback.format_exception(exc)),
        }
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()


class ProcessContext:
    """What a process worker gets as ``ctx``: the job's row data (no client in the child)."""

    def __init__(self, row: _ProcessRow) -> None:
        self.job_row = row


class _ProcessRow:
    """The job row's fields a process worker can read (a plain-data copy)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.id: int = data["id"]
        self.kind: str = data["kind"]
        self.queue: str = data["queue"]
        self.attempt: int = data["attempt"]
        self.max_attempts: int = data["max_attempts"]
        self.metadata: dict[str, Any] = data["metadata"]
        self.args: dict[str, Any] = data["args"]
        self.scheduled_at = dt.datetime.fromisoformat(data["scheduled_at"])


if __name__ == "__main__":
    main()
