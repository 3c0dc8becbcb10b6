"""Resumable jobs (River's ``ResumableStep``, ``ResumableStepCursor``, ``ResumableSetCursor``
and ``ResumableSetStep[Cursor]Tx``), on River's metadata keys so progress is shared with River
clients in every language.

A worker splits its work into named steps (``await ctx.step(name, fn)``). When an attempt
fails (or snoozes, or is cancelled) after some steps completed, the last completed step is
recorded in ``river:resumable_step``; the next attempt skips every step up to and including it.
A cursor step (``await ctx.step_cursor(name, fn)``) receives the cursor it saved with
``ctx.set_cursor(value)`` (kept in ``river:resumable_cursor``, a map of step name to cursor)
and is re-run from there. Progress can also be saved at once inside a transaction
(``ctx.set_step_tx``), together with the step's own writes.

Python's difference from Go: a step's exception propagates out of ``step`` (no further steps
run, as in River); if the worker catches it and returns, the job fails with it all the same.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from ._errors import RiverError

__all__ = ["CURSOR_KEY", "STEP_KEY", "ResumableState", "ResumableStepError", "has_progress"]

STEP_KEY: Final = "river:resumable_step"
CURSOR_KEY: Final = "river:resumable_cursor"


class ResumableStepError(RiverError, RuntimeError):
    """A misuse of resumable steps, or a recorded step the worker no longer has (River's
    messages)."""


def has_progress(metadata: Mapping[str, Any]) -> bool:
    return STEP_KEY in metadata or CURSOR_KEY in metadata


class ResumableState:
    """One attempt's view of its resumable progress (River's ``ResumableState``)."""

    def __init__(self, metadata: Mapping[str, Any]) -> None:
        step = metadata.get(STEP_KEY)
        self.resume_step: str = step if isinstance(step, str) else ""
        self.resume_matched = self.resume_step == ""
        cursors = metadata.get(CURSOR_KEY)
        #: step name -> encoded cursor JSON
        self.cursors: dict[str, str] = {}
        if isinstance(cursors, Mapping):
            self.cursors = {
                str(k): json.dumps(v, separators=(",", ":")) for k, v in cursors.items()
            }
        # Cursor-only progress has no step to skip to: those steps must still be found,
        # or partly done work would pass for finished.
        self.pending_cursor_steps: list[str] = (
            sorted(self.cursors) if self.resume_step == "" else []
        )
        self.all_names: set[str] = set()
        self.completed_step = ""
        self.cursors_dirty = False
        self.error: BaseException | None = None
        self.step_name = ""  # the step running now, if any

    # --- steps ----------------------------------------------------------------------------

    def _register(self, name: str) -> bool:
        if not isinstance(name, str) or not name:
            self.error = ResumableStepError("river: resumable step names must be non-empty str")
            return False
        if self.step_name:
            self.error = ResumableStepError("river: resumable steps cannot be nested")
            return False
        if name in self.all_names:
            self.error = ResumableStepError(f"river: duplicate resumable step name {name!r}")
            return False
        self.all_names.add(name)
        return True

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    async def step(self, name: str, fn: Callable[[], Awaitable[Any]]) -> None:
        if self.error is not None:  # an earlier step failed: no further steps run
            return
        if not self._register(name):
            self._raise_if_failed()
        if name in self.pending_cursor_steps:
            self.error = ResumableStepError(
                f"river: resumable cursor step {name!r} requires a cursor step"
            )
            raise self.error
        if not self.resume_matched:
            if name == self.resume_step:
                self.completed_step = name
                self.resume_matched = True
            return
        await self._run(name, fn)

    async def step_cursor(self, name: str, fn: Callable[[Any], Awaitable[Any]]) -> None:
        if self.error is not None:
            return
        if not self._register(name):
            self._raise_if_failed()
        if not self.resume_matched:
            if name != self.resume_step:
                return
            self.completed_step = name
            self.resume_matched = True
            if name not in self.cursors:
                return  # finished before: skipped like a plain step
        cursor: Any = None
        if name in self.cursors:
            cursor = json.loads(self.cursors[name])
        if name in self.pending_cursor_steps:
            self.pending_cursor_steps.remove(name)
        await self._run(name, lambda: fn(cursor))
        if name in self.cursors:  # finished: its cursor is no longer needed
            del self.cursors[name]
            self.cursors_dirty = True

    async def _run(self, name: str, fn: Callable[[], Awaitable[Any]]) -> None:
        self.step_name = name
        try:
            await fn()
        except Exception as exc:
            self.error = exc
            raise
        finally:
            self.step_name = ""
        self._raise_if_failed()
        self.completed_step = name

    def set_cursor(self, value: Any) -> None:
        if not self.step_name:
            raise ResumableStepError(
                "river: resumable cursor can only be used within a resumable step"
            )
        try:
            encoded = json.dumps(value, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"resumable cursor is not JSON-encodable: {exc}") from None
        self.cursors[self.step_name] = encoded
        self.cursors_dirty = True

    # --- persistence ------------------------------------------------------------------------

    def checkpoint_updates(self, cursor: Any = None, *, with_cursor: bool = False) -> bytes:
        """The metadata updates saving the current step (and cursors) now (River's
        ``ResumableSetStep[Cursor]Tx``), as JSON."""
        if not self.step_name:
            raise ResumableStepError(
                "not inside a resumable step; must be called from within step or step_cursor"
            )
        if self.pending_cursor_steps:
            raise ResumableStepError(
                "river: resumable checkpoint cannot precede saved cursor step "
                f"{self.pending_cursor_steps[0]!r}"
            )
        cursors = dict(self.cursors)
        if with_cursor:
            cursors[self.step_name] = json.dumps(cursor, separators=(",", ":"), allow_nan=False)
        return _encode(self.step_name, cursors, write_cursors=True)

    def checkpointed(self, updates: bytes) -> None:
        """The checkpoint was written: it is the new baseline."""
        doc = json.loads(updates)
        self.completed_step = ""
        cursors = doc.get(CURSOR_KEY) or {}
        self.cursors = {k: json.dumps(v, separators=(",", ":")) for k, v in cursors.items()}
        self.cursors_dirty = False

    def final_error(self) -> BaseException | None:
        """Why an attempt whose worker returned cleanly still failed, if it did."""
        if self.error is not None:
            return self.error
        if self.resume_step and not self.resume_matched:
            return ResumableStepError(
                f"river: resumable step {self.resume_step!r} not found in Worker"
            )
        if self.pending_cursor_steps:
            return ResumableStepError(
                f"river: resumable cursor step {self.pending_cursor_steps[0]!r} not found in Worker"
            )
        return None

    def progress_updates(self) -> dict[str, Any]:
        """Metadata updates recording progress after an attempt that did not succeed."""
        if self.pending_cursor_steps:
            # recording a step now could make the cursor's step unreachable later
            return {}
        out: dict[str, Any] = {}
        if self.cursors_dirty:
            out[CURSOR_KEY] = (
                {k: json.loads(v) for k, v in self.cursors.items()} if self.cursors else None
            )
        if self.completed_step:
            out[STEP_KEY] = self.completed_step
        return out


def _encode(step: str, cursors: dict[str, str], *, write_cursors: bool) -> bytes:
    parts = [f"{json.dumps(STEP_KEY)}:{json.dumps(step)}"]
    if write_cursors:
        if cursors:
            body = ",".join(f"{json.dumps(k)}:{v}" for k, v in cursors.items())
            parts.append(f"{json.dumps(CURSOR_KEY)}:{{{body}}}")
        else:
            parts.append(f"{json.dumps(CURSOR_KEY)}:null")
    return ("{" + ",".join(parts) + "}").encode()
