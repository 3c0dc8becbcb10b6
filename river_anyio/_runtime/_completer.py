"""The completion nursery: batches finished attempts into few database writes.

River's BatchCompleter shape: completions are keyed by job id. While completions are pending a
50 ms tick runs: it flushes once 100 are pending (then flushes back to back while 100 are
pending) or on every 5th tick (about 250 ms after the first completion when quiet); a flush is
also asked for when a producer finds its queue drained, and when its last attempt ends after
that, so the last results of a burst are not left for the 5th tick. Flushes asked for follow
one another by ``SOON_SPACING`` (25 ms) at least: one asked for sooner is made at the next
request past that, or at the next tick (under a steady flow every claim drains the queue, and a write after each cost a statement
per few jobs; made right after a claim, not at a set time, a write does not compete with the
next job's pickup). With nothing pending the completer sleeps until a completion arrives (an
idle client's completer does not wake). Waiting for the tick rather than flushing at the 100th
completion makes a busy queue's flushes large (hundreds of rows), which costs the database far
less per job. Batches are written in sub-batches of at most 5,000; at 10,000 pending the
completer stops taking more (executors wait) until fewer than 5,000 are pending.

Each write gets 3 tries of at most 10 s, with 1 s, 2 s and 4 s pauses, shielded (so bounded)
so a write is never cut off half-way and then repeated. If it still fails, a transient failure
puts the batch back (workers wait for capacity), any other failure drops it (the jobs stay
``running`` for the rescuer); both are counted and logged. In the final flush the first batch
that still fails gives the rest to the rescuer, so a stop always finishes.

Producers each hold a clone of the send stream; when the last one closes its clone the
completer sees ``EndOfStream``, flushes what is left and returns. Cancelled (a hard stop), it
still takes what the producers hand over until their last clone is closed, and writes it: a
bounded, shielded final flush.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import random
import time
from collections.abc import Callable
from typing import Final

import anyio
import anyio.lowlevel
import attrs
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._errors import DatabaseError
from .._events import Event, EventHub, EventKind, JobTimings
from .._job import FINALIZED_STATES, JobRow, JobState
from .._logging import client_extra, job_extra, jobs_extra
from .._wait import JobWaiters
from ..drivers import CompletionResult, Driver, JobCompletion
from ._health import Contact
from ._util import Wakeup

__all__ = ["Completer", "CompleterStatistics", "Finished"]

logger = logging.getLogger("river_anyio.completer")

TICK = 0.05
FLUSH_THRESHOLD = 100
IDLE_TICKS = 5
#: A flush asked for (``flush_soon``) begins at least this long after the previous one began.
SOON_SPACING = TICK / 2
SUB_BATCH = 5_000
BACKLOG_HIGH = 10_000
BACKLOG_LOW = 5_000
TRIES = 3
TRY_TIMEOUT = 10.0
PAUSES = (1.0, 2.0, 4.0)
STREAM_BUFFER = 256


@attrs.define(slots=True, eq=False, kw_only=True)
class Finished:
    """A finished attempt on its way to the database: the completion to write (it is its own
    :class:`~river_anyio.drivers.Completion`, so the completer hands these to the driver as
    they are) and what events and logs need."""

    # the completion (JobCompletion's fields)
    id: int
    attempt: int
    state: JobState
    finalized_at: dt.datetime | None = None
    scheduled_at: dt.datetime | None = None
    #: one encoded ``errors`` element
    error: bytes | None = None
    metadata_updates: bytes | None = None
    attempt_new: int | None = None
    # the attempt
    row: JobRow
    kind: EventKind
    #: the recorded error's text, for events
    message: str | None
    #: the attempt's start on the client's clock (seconds since the epoch), and its start
    #: and end on the monotonic one (the timings are only worked out for events)
    start: float
    started: float
    finished_at: float = attrs.field(factory=time.monotonic)
    #: the worker completed the job in its own transaction (``ctx.complete_tx``): the row
    #: not being running any more is expected, not a race
    completed_tx: bool = False
    #: why a ``discarded`` completion discards (``job_discarded``'s ``cause``)
    discard_cause: str | None = None

    @property
    def completion(self) -> JobCompletion:
        return JobCompletion(**{name: getattr(self, name) for name in _COMPLETION_FIELDS})

    @property
    def queue_wait(self) -> dt.timedelta:
        """From the job's ``scheduled_at`` to the attempt's start (never negative)."""
        start = dt.datetime.fromtimestamp(self.start, dt.UTC)
        return max(start - self.row.scheduled_at, dt.timedelta(0))

    @property
    def run_time(self) -> dt.timedelta:
        return dt.timedelta(seconds=self.finished_at - self.started)


_COMPLETION_FIELDS = tuple(f.name for f in attrs.fields(JobCompletion))


@attrs.frozen(kw_only=True)
class CompleterStatistics:
    written: int
    races: int
    requeued: int
    dropped: int
    pending: int


#: the event of a completion whose row is (now) in this state, as River's completer names it
_KIND_BY_STATE: Final = {
    JobState.CANCELLED: EventKind.JOB_CANCELLED,
    JobState.COMPLETED: EventKind.JOB_COMPLETED,
    JobState.DISCARDED: EventKind.JOB_FAILED,
    JobState.RETRYABLE: EventKind.JOB_FAILED,
    JobState.SCHEDULED: EventKind.JOB_SNOOZED,
}
#: what an ``available`` row's completion was, by what it asked for: a retry, a short snooze
#: or an interruption says so; a completion or a cancel that found the row made available
#: (retried meanwhile) failed
_KIND_IF_AVAILABLE: Final = {
    EventKind.JOB_FAILED: EventKind.JOB_FAILED,
    EventKind.JOB_SNOOZED: EventKind.JOB_SNOOZED,
    EventKind.JOB_INTERRUPTED: EventKind.JOB_INTERRUPTED,
    EventKind.JOB_COMPLETED: EventKind.JOB_FAILED,
    EventKind.JOB_CANCELLED: EventKind.JOB_FAILED,
}


def river_event_kind(asked: EventKind, state: JobState) -> EventKind | None:
    """The job event of a completion that asked for ``asked`` and left its row in ``state``,
    as River's completer decides it: by the row as written, whether this completion applied
    or the row had been finalized or retried meanwhile (an external completion, a cancel, a
    rescue), so every client reports the state a job reached the same way. None when the row
    is ``running`` or ``pending`` (claimed again, or moved out of band): nothing finished."""
    if state is JobState.AVAILABLE:
        return _KIND_IF_AVAILABLE.get(asked, EventKind.JOB_FAILED)
    return _KIND_BY_STATE.get(state)


class Completer:
    """Owns the completion stream's receive side and every write of finished attempts."""

    def __init__(
        self,
        driver: Driver,
        *,
        client_id: str,
        events: EventHub,
        tries: int = TRIES,
        try_timeout: float = TRY_TIMEOUT,
        pauses: tuple[float, ...] = PAUSES,
        final_flush_timeout: float = 60.0,
        on_dropped: Callable[[list[Finished]], None] | None = None,
        waiters: JobWaiters | None = None,
    ) -> None:
        self._driver = driver
        #: ``client.jobs.wait`` calls on this client, woken when their job is finalized here
        self._waiters = waiters if waiters is not None else JobWaiters()
        self._client_id = client_id
        self._events = events
        self._tries = tries
        self._try_timeout = try_timeout
        self._pauses = pauses
        self._final_flush_timeout = final_flush_timeout
        self._on_dropped = on_dropped
        self._pending: dict[int, Finished] = {}
        #: a completion arrived while nothing was pending: the flush loop starts ticking
        self._arrived = Wakeup()
        #: a flush is asked for now (``flush_soon``)
        self._wake = Wakeup()
        self._below_low = anyio.Event()
        self._below_low.set()
        self._written = 0
        self._races = 0
        self._requeued = 0
        self._dropped = 0
        #: the writes' round trips (for health)
        self.contact = Contact()

    def statistics(self) -> CompleterStatistics:
        return CompleterStatistics(
            written=self._written,
            races=self._races,
            requeued=self._requeued,
            dropped=self._dropped,
            pending=len(self._pending),
        )

    def flush_soon(self) -> None:
        """Ask for a flush now (a producer found its queue drained)."""
        if self._pending:
            self._wake.set()

    def flush_on_arrival(self) -> None:
        """Ask for a flush as soon as the completion handed over last arrives (a producer's
        last attempt ended after its queue was found drained): the last results of a burst
        are written then, not on the 5th quiet tick."""
        self._wake.set()

    async def run(
        self,
        *,
        task_status: TaskStatus[MemoryObjectSendStream[Finished]] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        send, receive = anyio.create_memory_object_stream[Finished](STREAM_BUFFER)
        with receive:
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._flush_loop, name="river completer flushes")
                    task_status.started(send)
                    await self._receive(receive)
                    # every producer has closed its stream (a write in progress is shielded
                    # and finishes first)
                    tg.cancel_scope.cancel("completion streams closed")
            finally:
                await self._final_flush(receive)

    async def _final_flush(self, receive: MemoryObjectReceiveStream[Finished]) -> None:
        """Take what is still handed over (results of interrupted jobs arrive until the last
        producer has closed its stream) and write everything: bounded and shielded."""
        pending = self._pending
        with anyio.move_on_after(self._final_flush_timeout, shield=True) as scope:
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    item = await receive.receive()
                    pending[item.id] = item
            while pending:
                if not await self._flush_once(final=True):
                    break
        if scope.cancelled_caught and pending:
            logger.error(
                "completer: final flush timed out; %d jobs left running for the rescuer",
                len(pending),
                extra=jobs_extra("completer_flush_timeout", list(pending), self._client_id),
            )
            self._drop(list(pending.values()))
            pending.clear()

    async def _receive(self, receive: MemoryObjectReceiveStream[Finished]) -> None:
        pending = self._pending
        arrived = self._arrived
        async for item in receive:
            if not pending:
                arrived.set()
            pending[item.id] = item
            # take whatever else is buffered without a checkpoint per item
            while len(pending) < BACKLOG_HIGH:
                try:
                    item = receive.receive_nowait()
                except anyio.WouldBlock:
                    break
                pending[item.id] = item
            n = len(pending)
            if n >= BACKLOG_HIGH:
                logger.warning(
                    "completer: %d completions pending, waiting for the database",
                    n,
                    extra=client_extra("completer_backlog", self._client_id),
                )
                self._below_low = anyio.Event()
                await self._below_low.wait()

    async def _flush_loop(self) -> None:
        pending = self._pending
        flushed_at = -math.inf
        while True:
            await self._arrived.wait()  # asleep while nothing is pending
            ticks = 0
            asked_at = math.inf  # a flush asked for and not yet made
            while pending:
                woken = False
                with anyio.move_on_after(TICK):
                    await self._wake.wait()
                    woken = True
                now = anyio.current_time()
                if woken:
                    # asked for by a producer that has just handed its workers new rows: let
                    # them start first (trio may run this task before them; sending the
                    # statement can then hand the core to the database for a while)
                    await anyio.lowlevel.checkpoint()
                    asked_at = min(asked_at, now)
                    # flushes asked for follow one another by SOON_SPACING at least; one
                    # asked for sooner waits for a later request or the next tick
                    soon = now - flushed_at >= SOON_SPACING
                else:
                    ticks += 1
                    soon = asked_at < now
                if soon or len(pending) >= FLUSH_THRESHOLD or ticks >= IDLE_TICKS:
                    ticks = 0
                    asked_at = math.inf
                    while pending:
                        flushed_at = anyio.current_time()
                        # shielded: a write cut off half-way would be repeated, its jobs
                        # then seen as races (each try is bounded by its timeout)
                        with anyio.CancelScope(shield=True):
                            await self._flush_once(final=False)
                        if len(pending) < FLUSH_THRESHOLD:
                            break

    def _take(self) -> list[Finished]:
        pending = self._pending
        if len(pending) <= SUB_BATCH:
            batch = list(pending.values())
            pending.clear()
            return batch
        return [pending.pop(job_id) for job_id in list(pending)[:SUB_BATCH]]

    async def _flush_once(self, *, final: bool) -> bool:
        """Write one sub-batch; False when it failed and, in the ``final`` flush, the rest
        was dropped with it."""
        batch = self._take()
        if not batch:
            return True
        try:
            results, last_error = await self._write(batch, final=final)
        except anyio.get_cancelled_exc_class():
            # cancelled mid-write (the statement is cancelled with it): keep the batch for
            # the final, shielded flush
            for f in batch:
                self._pending.setdefault(f.id, f)
            raise
        if results is not None:
            self._done(batch, results)
            return True

        assert last_error is not None
        transient = isinstance(last_error, TimeoutError) or (
            isinstance(last_error, DatabaseError) and last_error.transient
        )
        if final:
            rest = batch + list(self._pending.values())
            self._pending.clear()
            logger.error(
                "completer: stopping with the database failing; %d jobs left running for the "
                "rescuer",
                len(rest),
                extra=jobs_extra(
                    "completer_stop_failing", [f.row.id for f in rest], self._client_id
                ),
            )
            self._drop(rest)
            self._release_backpressure()
            return False
        if transient:
            for f in batch:  # never overwrite a newer completion for the same job
                self._pending.setdefault(f.id, f)
            self._requeued += len(batch)
            logger.warning(
                "completer: requeued %d completions after a transient failure",
                len(batch),
                extra=jobs_extra("completion_requeued", [f.row.id for f in batch], self._client_id),
            )
        else:
            self._drop(batch)
        self._release_backpressure()
        return True

    async def _write(
        self, batch: list[Finished], *, final: bool
    ) -> tuple[list[CompletionResult] | None, BaseException | None]:
        last_error: BaseException | None = None
        for attempt in range(self._tries):
            try:
                with anyio.fail_after(self._try_timeout):
                    results = await self._driver.executor().job_set_state_if_running_many(
                        batch,
                        client_id=self._client_id,
                        return_rows=self._events.active,  # rows are only needed for events
                    )
                self.contact.ok(anyio.current_time())  # once per batch
                return results, None
            except (DatabaseError, TimeoutError) as exc:
                last_error = exc
                self.contact.failed(exc)
                transient = isinstance(exc, TimeoutError) or exc.transient
                logger.log(
                    logging.WARNING if transient else logging.ERROR,
                    "completer: writing %d completions failed (try %d of %d): %s",
                    len(batch),
                    attempt + 1,
                    self._tries,
                    exc,
                    extra=jobs_extra(
                        "completion_failed", [f.row.id for f in batch], self._client_id
                    ),
                )
                if final and attempt + 1 == self._tries:
                    break
                pause = self._pauses[min(attempt, len(self._pauses) - 1)]
                await anyio.sleep(pause * (1 + random.uniform(-0.1, 0.1)))
        return None, last_error

    def _drop(self, items: list[Finished]) -> None:
        self._dropped += len(items)
        logger.error(
            "completer: dropped %d completions; those jobs stay running until rescued",
            len(items),
            extra=jobs_extra("completion_dropped", [f.row.id for f in items], self._client_id),
        )
        if self._events.active:
            self._events.publish(
                Event(
                    kind=EventKind.COMPLETION_DROPPED,
                    details={"job_ids": [f.row.id for f in items]},
                )
            )
        if self._on_dropped is not None:
            self._on_dropped(items)

    def _release_backpressure(self) -> None:
        if len(self._pending) < BACKLOG_LOW and not self._below_low.is_set():
            self._below_low.set()

    def _done(self, batch: list[Finished], results: list[CompletionResult]) -> None:
        self._written += len(batch)
        self._release_backpressure()
        not_applied = {r.id for r in results if not r.applied}
        races = (
            [f for f in batch if f.row.id in not_applied and not f.completed_tx]
            if not_applied
            else []
        )
        self._races += len(races)
        if self._waiters:  # someone awaits a job of this client (else: one check per batch)
            self._waiters.wake(f.id for f in batch if f.state in FINALIZED_STATES)
        for f in races:
            logger.warning(
                "completer: job %d was no longer running for attempt %d of this client; "
                "its result was not applied",
                f.row.id,
                f.row.attempt,
                extra=job_extra("job_race", f.row, self._client_id),
            )
        if not self._events.active:
            return
        by_id = {r.id: r for r in results}
        now = time.monotonic()
        for f in batch:
            r = by_id.get(f.row.id)
            if r is None or r.job is None:  # deleted, or a subscriber arrived mid-write
                continue
            timings = JobTimings(
                queue_wait=f.queue_wait,
                run=f.run_time,
                completion=dt.timedelta(seconds=now - f.finished_at),
            )
            job = r.job
            events = [river_event_kind(f.kind, job.state)]
            if not r.applied and not (f.completed_tx and job.state == JobState.COMPLETED):
                events.append(EventKind.JOB_RACE)
            if r.applied and job.state == JobState.DISCARDED:
                events.append(EventKind.JOB_DISCARDED)
            for kind in events:
                if kind is None:
                    continue
                details = (
                    {"cause": f.discard_cause or "attempts_exhausted"}
                    if kind is EventKind.JOB_DISCARDED
                    else {}
                )
                self._events.publish(
                    Event(
                        kind=kind,
                        job=job,
                        queue=job.queue,
                        error=f.message,
                        timings=timings,
                        details=details,
                    )
                )
