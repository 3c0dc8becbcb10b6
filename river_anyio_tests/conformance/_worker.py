"""The contract's built-in worker: it follows each job's ``behavior`` arg; plus the barriers
jobs and claims wait on, and the counters ``stats`` reports."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

import anyio
import attrs

import river_anyio as river

from ._protocol import ERROR_RETRYABLE, KIND_ECHO, KIND_ECHO_PEER, KIND_ECHO_RENAMED


@attrs.frozen
class EchoArgs:
    """The args of every job the adapter inserts (keys in Go's order)."""

    kind: ClassVar[str] = KIND_ECHO

    behavior: str = ""
    duration_ms: int = 0
    message: str = ""


@attrs.frozen
class PeerArgs(EchoArgs):
    kind: ClassVar[str] = KIND_ECHO_PEER


@attrs.frozen
class RenamedArgs(EchoArgs):
    """Renamed from the echo kind, which stays an alias (River's safe rename)."""

    kind: ClassVar[str] = KIND_ECHO_RENAMED
    kind_aliases: ClassVar[tuple[str, ...]] = (KIND_ECHO,)


ARGS_BY_KIND: dict[str, type[EchoArgs]] = {
    KIND_ECHO: EchoArgs,
    KIND_ECHO_PEER: PeerArgs,
    KIND_ECHO_RENAMED: RenamedArgs,
}


class Barriers:
    """Named barriers: each exists from its first use, a wait or a release; a release before
    any wait lets later waits pass."""

    def __init__(self) -> None:
        self._events: dict[str, anyio.Event] = {}

    def _get(self, name: str) -> anyio.Event:
        event = self._events.get(name)
        if event is None:
            event = self._events[name] = anyio.Event()
        return event

    def release(self, name: str) -> None:
        self._get(name).set()

    async def wait(self, name: str) -> None:
        await self._get(name).wait()


@attrs.define
class Stats:
    """What a running client observed since it started."""

    cancelled_at_start: int = 0
    error_handler_calls: int = 0
    events: list[str] = attrs.field(factory=list)
    periodic_starts: int = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "cancelled_at_start": self.cancelled_at_start,
            "error_handler_calls": self.error_handler_calls,
            "events": list(self.events),
            "periodic_starts": self.periodic_starts,
        }


class EchoWorker:
    """Works every echo kind by its job's behavior."""

    def __init__(self, barriers: Barriers, stats: Stats) -> None:
        self._barriers = barriers
        self._stats = stats

    async def work(self, ctx: river.WorkContext, job: river.Job[EchoArgs]) -> river.Outcome | None:
        args = job.args
        behavior = args.behavior
        if behavior in ("barrier_wait", "barrier_output"):
            await self._barriers.wait(args.message)
            if behavior == "barrier_output":
                ctx.record_output({"race": "worker"})
            return None
        if behavior == "cancel":
            return river.cancel("cancelled by conformance worker")
        if behavior == "":
            return None
        if behavior == "cooperative_cancel":
            if ctx.cancelled.is_set():
                self._stats.cancelled_at_start += 1
            await anyio.sleep_forever()
        if behavior == "error":
            raise RuntimeError(ERROR_RETRYABLE)
        if behavior == "output":
            ctx.record_output({"message": args.message})
            return None
        if behavior == "resumable_cursor":
            await self._resumable_cursor(ctx, job)
            return None
        if behavior == "sleep":
            await anyio.sleep(args.duration_ms / 1000)
            return None
        if behavior == "snooze_once":
            if "snoozes" in job.metadata:
                return None
            return river.snooze(dt.timedelta(milliseconds=max(args.duration_ms, 1)))
        raise RuntimeError(f'unknown behavior "{behavior}"')

    async def _resumable_cursor(self, ctx: river.WorkContext, job: river.Job[EchoArgs]) -> None:
        async def first() -> None:
            ctx.set_metadata("first_attempt", job.attempt)

        async def second(cursor: Any) -> None:
            if job.attempt == 1:
                ctx.set_cursor(7)
                raise RuntimeError("retry with cursor")
            if cursor != 7:
                raise RuntimeError(f"expected cursor 7, got {cursor}")
            ctx.set_metadata("cursor_observed", cursor)

        async def third() -> None:
            if job.attempt == 2:
                raise RuntimeError("retry after consuming cursor")

        await ctx.step("first", first)
        await ctx.step_cursor("second", second)
        await ctx.step("third", third)


class CancellingErrorHandler:
    """Cancels every job whose attempt fails, counting its calls."""

    @attrs.frozen
    class Result:
        set_cancelled: bool = True

    def __init__(self, stats: Stats) -> None:
        self._stats = stats

    def handle_error(self, job: river.JobRow, exc: BaseException) -> Result:
        self._stats.error_handler_calls += 1
        return self.Result()


class FixedRetryPolicy:
    """Retries every failed attempt after the same delay."""

    def __init__(self, delay: dt.timedelta) -> None:
        self._delay = delay

    def next_retry(self, job: river.JobRow, now: dt.datetime) -> dt.datetime:
        return now + self._delay
