"""Running one job: the middleware chain, the worker, and the outcome handed to the completer.

The :class:`JobRunner` is the one path a job runs through, for producers and for
``river_anyio.testing`` alike (both drive it from a :class:`~._pool.WorkerPool`, which owns the
attempts, their cancel scopes and deadlines).

An attempt ends in exactly one completion handed to the completer:

- returned None: ``completed``;
- returned ``snooze(d)``: ``available``/``scheduled`` at now + d, the attempt given back;
- returned ``discard(reason)`` / ``cancel(reason)``: finalized with the reason recorded;
- raised (or timed out, or unknown kind, or undecodable args): the error is recorded and the
  job retries per the retry policy, or is discarded when out of attempts (its text as River
  records an error, its traceback only in the log: see :func:`_error_text`);
- claimed as a row that could not be decoded: failed without being worked, as River Go fails
  it (the error handler sees it; the client's retry policy applies);
- cancelled remotely: ``cancelled`` unless the worker still completed cleanly;
- interrupted because the client is stopping: back to ``available`` with its attempt restored
  and no error recorded.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import anyio.to_thread
from anyio.streams.memory import MemoryObjectSendStream

from .._config import ClientConfig
from .._convert import structure_hook
from .._events import EventKind
from .._fastinit import positional_constructor
from .._job import JobRow, JobState, UndecodableJobRow
from .._logging import job_extra
from .._resumable import has_progress
from .._retry import DefaultRetryPolicy
from .._timeutil import format_rfc3339nano
from .._work import (
    CancelOutcome,
    DiscardOutcome,
    Job,
    Registration,
    SnoozeOutcome,
    WorkContext,
    _Unset,
)
from ._attempt import Attempt, CancelReason
from ._clock import SystemClock
from ._completer import Finished
from ._util import REMOTE_CANCEL_REASON, loop_clock

if TYPE_CHECKING:
    from .._client import Client
    from ._clock import Clock

__all__ = ["JobRowDecodeError", "JobRunner", "UnknownJobKindError"]

logger = logging.getLogger("river_anyio.executor")  # the name users filter on

MAX_ERROR_TEXT = 32_768
#: How long a result still waits for a backed-up completer once its attempt is cancelled.
HAND_OFF_GRACE = 10.0
_default_policy = DefaultRetryPolicy()


class UnknownJobKindError(Exception):
    """No worker is registered for a claimed job's kind (River's message)."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"job kind is not registered in the client's Workers bundle: {kind}")


class JobRowDecodeError(Exception):
    """A claimed row could not be decoded (River's message, then which columns and why)."""

    #: recorded as River's bare message, without the exception type name
    river_error_text = True

    def __init__(self, detail: str) -> None:
        super().__init__(f"job row couldn't be decoded: {detail}")


class JobTimeoutError(Exception):
    def __init__(self, seconds: float) -> None:
        super().__init__(f"job timed out after {seconds:g}s")


def _error_text(exc: BaseException) -> str:
    """The ``error`` River records for an attempt that raised ``exc``.

    River Go records the error's own message (``err.Error()``), and a ``trace`` only for a
    panic, which Python does not have: so ``str(exc)`` with an empty trace, and the traceback
    goes to the log record of the failure. An exception raised without a message (``raise
    TimeoutError``) has empty text, and Go's errors never do: its class name is recorded
    instead, so an attempt's error always says what happened (as it does when ``__str__``
    itself fails).
    """
    try:
        text = str(exc)
    except Exception:
        text = ""
    return (text or type(exc).__name__)[:MAX_ERROR_TEXT]


def _log_exc_info(exc: BaseException) -> BaseException | None:
    """``exc`` for a log record's ``exc_info`` when it has a traceback (or a cause) to show;
    an error the runtime made up (a timeout, an unknown kind) has none."""
    return exc if exc.__traceback__ is not None or exc.__cause__ is not None else None


def _snoozes(metadata: Any) -> int:
    value = metadata.get("snoozes") if isinstance(metadata, dict) else None
    try:
        return int(value) if value is not None and not isinstance(value, bool) else 0
    except (TypeError, ValueError):
        return 0


_PENDING: Any = object()
_make_job = positional_constructor(Job)
_make_finished = positional_constructor(Finished)


def _completed(row: JobRow, now: dt.datetime, start: float, started: float) -> Finished:
    """A clean success's result (the common case; positional, in Finished's field order)."""
    return _make_finished(
        row.id,
        row.attempt,
        JobState.COMPLETED,
        now,
        None,
        None,
        None,
        None,
        row,
        EventKind.JOB_COMPLETED,
        None,
        start,
        started,
        time.monotonic(),
        False,
        None,
    )


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class JobRunner:
    """Runs the attempts of one queue's jobs (or of a test's)."""

    def __init__(
        self,
        *,
        config: ClientConfig,
        client: Client,
        clock: Clock,
        send: MemoryObjectSendStream[Finished],
        thread_limiter: anyio.CapacityLimiter,
        process_runner: Callable[..., Awaitable[Any]] | None = None,
    ) -> None:
        self._config = config
        self._client = client
        self._clock = clock
        self._send = send
        self._thread_limiter = thread_limiter
        self._process_runner = process_runner
        #: retries and snoozes due within this are written ``available``, as River does: the
        #: scheduler would make them available no later than that anyway
        self._near_future = dt.timedelta(seconds=config.maintenance.scheduler_interval)
        self._loop_time: Callable[[], float] | None = None
        system = type(clock) is SystemClock  # not a subclass with its own now()
        #: the clock's time (the system clock's read without a Python call of its own)
        self._now: Callable[[], dt.datetime] = (
            functools.partial(dt.datetime.now, dt.UTC) if system else clock.now
        )
        #: the attempt's start, in seconds since the epoch: the system clock's without
        #: building a datetime
        self._start_time: Callable[[], float] = (
            time.time if system else lambda: clock.now().timestamp()
        )
        #: no work hooks or middleware to wrap workers in
        self._plain = not config.middleware and not any(
            callable(getattr(h, name, None))
            for h in config.hooks
            for name in ("work_begin", "work_end")
        )
        # args class -> its cattrs structure hook, looked up once
        self._structure: dict[type, Callable[[Any, type], Any]] = {}

    def begin(self, attempt: Attempt) -> None:
        """Begin an attempt: look up the worker and decode the args. The attempt is ready to
        :meth:`run` when ``attempt.job`` is set; otherwise its result is already decided."""
        row = attempt.row
        attempt.start = self._start_time()
        attempt.started = time.monotonic()
        if type(row) is UndecodableJobRow:
            self._undecodable(attempt, row)
            return
        reg = attempt.reg = self._config.workers.get(row.kind)
        if reg is None:
            attempt.result = _Failure(UnknownJobKindError(row.kind))
            return
        cls = reg.args_cls
        structure = self._structure.get(cls)
        if structure is None:
            structure = self._structure[cls] = structure_hook(cls)
        try:
            job: Job[Any] = _make_job(row, structure(row.args, cls))
        except Exception as exc:
            err = ValueError(f"cannot decode args of {row.kind!r}: {exc}")
            err.__cause__ = exc  # its traceback in the log
            attempt.result = _Failure(err)
            return
        own = reg.job_timeout(job)
        timeout = self._config.job_timeout if isinstance(own, _Unset) else own
        deadline = math.inf
        if timeout is not None:
            loop_time = self._loop_time
            if loop_time is None:
                loop_time = self._loop_time = loop_clock()
            deadline = loop_time() + timeout
        attempt.job = job
        attempt.timeout = timeout
        attempt.deadline = deadline
        attempt.ctx = WorkContext(
            client=self._client, job=row, deadline=None if timeout is None else deadline
        )
        attempt.result = _PENDING

    def _undecodable(self, attempt: Attempt, row: UndecodableJobRow) -> None:
        """A claimed row some of whose columns could not be decoded is not worked: its
        attempt fails with the decode error, through the error handler and the client's
        retry policy (no worker is looked up), as River Go fails it."""
        logger.error(
            "job %d (%s): the row couldn't be decoded; failing its attempt without working it: %s",
            row.id,
            row.kind,
            row.decode_error,
            extra=job_extra("job_undecodable", row, self._config.id),
        )
        attempt.reg = None
        attempt.result = _Failure(JobRowDecodeError(row.decode_error))

    async def run(self, attempt: Attempt, scope: anyio.CancelScope) -> bool:
        """Run the worker of a begun attempt under ``scope``, the scope its cancellation
        (remote cancel, timeout) cancels. A caller may run many attempts, one after the
        other, under one scope, as long as it stops using the scope once it was cancelled
        (this returns True): nothing refers to it for this job once this returns (or raises)."""
        ctx = attempt.ctx
        job = attempt.job
        reg = attempt.reg
        assert ctx is not None
        assert job is not None
        assert reg is not None
        attempt.scope = scope
        if attempt.reason is not None:  # cancelled while it waited to begin
            ctx.cancelled.set()
            scope.cancel(attempt.reason.value)
        try:
            if self._plain and reg.run_in == "loop":
                attempt.result = await reg.work(ctx, job)  # the common case, unwrapped
            else:
                attempt.result = await self._invoke(reg, ctx, job)
        except Exception as exc:
            attempt.result = _Failure(exc)
        finally:
            attempt.scope = None
            if attempt.reason is not None:
                ctx.cancelled.set()
        return attempt.reason is not None

    def end_nowait(self, attempt: Attempt) -> bool:
        """Conclude a clean success without awaiting anything (the common case): True when
        its result went to the completer; False leaves the attempt to :meth:`end`."""
        ctx = attempt.ctx
        if (
            attempt.result is not None
            or ctx is None
            or ctx._resumable is not None
            or ctx._metadata_updates
            or ctx._output is not None
            or ctx._completed_tx
            or has_progress(attempt.row.metadata)
        ):
            return False
        return self._offer(_completed(attempt.row, self._now(), attempt.start, attempt.started))

    async def end(self, attempt: Attempt) -> None:
        """Decide the attempt's outcome and hand it to the completer (interrupted when the
        client cancels this meanwhile)."""
        ctx = attempt.ctx
        if (
            attempt.result is None
            and ctx is not None
            and ctx._resumable is None
            and not has_progress(attempt.row.metadata)
        ):
            # a clean success: nothing to await but a full completer
            finished = self._finish(
                attempt.row, attempt.reg, attempt.job, None, attempt.start, attempt.started, ctx
            )
        else:
            try:
                finished = await self._conclude(attempt)
            except anyio.get_cancelled_exc_class():
                await self.interrupt(attempt)
                raise
        if not self._offer(finished):  # no coroutine unless the completer is backed up
            await self._hand_off(finished)

    async def interrupt(self, attempt: Attempt) -> None:
        """The client is stopping and cancelled this attempt: give the job back, unharmed."""
        attempt.reason = CancelReason.STOP
        await self._hand_off(self._interrupted(attempt.row, attempt.start, attempt.started))

    async def _conclude(self, attempt: Attempt) -> Finished:
        row = attempt.row
        reg = attempt.reg
        job = attempt.job
        result = attempt.result
        ctx = attempt.ctx
        start = attempt.start
        if reg is None or job is None or ctx is None:
            if isinstance(result, _Failure):
                result = await self._handle_error(row, result)
            return self._finish(row, reg, job, result, start, attempt.started, None)
        remote = attempt.reason is CancelReason.REMOTE
        if ctx._resumable is not None or has_progress(row.metadata):
            result = _resumable_outcome(ctx, result)
        if not isinstance(result, _OUTCOMES) and result is not _PENDING:
            result = _bad_return(row, result)  # an error like any other (handler too)
        if result is _PENDING:  # our own scope stopped the worker
            if remote:
                result = CancelOutcome(REMOTE_CANCEL_REASON)
            else:
                assert attempt.timeout is not None
                result = _Failure(JobTimeoutError(attempt.timeout))
        elif remote and result is not None:
            # River: once cancelled remotely, anything but a clean success cancels
            result = CancelOutcome(REMOTE_CANCEL_REASON)
        if isinstance(result, _Failure) and not remote:
            result = await self._handle_error(row, result)
        return self._finish(row, reg, job, result, start, attempt.started, ctx)

    async def give_back(self, row: JobRow) -> None:
        """A claimed job that never started (the client stopped): back to ``available``."""
        await self._hand_off(self._interrupted(row, self._start_time(), time.monotonic()))

    def _offer(self, finished: Finished) -> bool:
        """Give a result to the completer if it can take it now."""
        try:
            self._send.send_nowait(finished)
        except anyio.WouldBlock:
            return False
        return True

    async def _hand_off(self, finished: Finished) -> None:
        """Give a result to the completer; only waits when it is backed up (the database is
        slow or away). While the run goes on that wait lasts as long as it takes: workers
        wait for capacity. Once the attempt's scope is cancelled (a stop, escalated or
        not), the result still waits, shielded, for at most ``HAND_OFF_GRACE``; after that
        the job is left ``running`` for the rescuer, and the stop goes on."""
        if self._offer(finished):
            return
        try:
            await self._send.send(finished)
        except anyio.get_cancelled_exc_class():
            with anyio.move_on_after(HAND_OFF_GRACE, shield=True) as grace:
                await self._send.send(finished)
            if grace.cancelled_caught:
                logger.error(
                    "job %d: the completer stayed backed up for %.0fs while stopping; "
                    "the job is left running for the rescuer",
                    finished.id,
                    HAND_OFF_GRACE,
                    extra=job_extra("completer_hand_off_timeout", finished.row, self._config.id),
                )
            raise

    async def _invoke(self, reg: Registration, ctx: WorkContext, job: Job[Any]) -> Any:
        async def innermost(ctx: WorkContext, job: Job[Any]) -> Any:
            await self._hooks("work_begin", ctx, job)
            error: BaseException | None = None
            try:
                if reg.run_in == "loop":
                    return await reg.work(ctx, job)
                if reg.run_in == "thread":
                    return await self._in_thread(reg, ctx, job)
                if self._process_runner is None:
                    raise RuntimeError("process workers are not available")
                return await self._process_runner(reg, ctx, job)
            except BaseException as exc:
                error = exc
                raise
            finally:
                await self._hooks("work_end", ctx, job, error)

        call: Callable[[WorkContext, Job[Any]], Awaitable[Any]] = innermost
        for mw in reversed(self._config.middleware):
            work = getattr(mw, "work", None)
            if work is None:
                continue
            call = _wrap(work, call)
        return await call(ctx, job)

    async def _in_thread(self, reg: Registration, ctx: WorkContext, job: Job[Any]) -> Any:
        # The thread cannot be interrupted: a watcher turns cancellation of this job into
        # ``ctx.cancelled`` while the (shielded) wait for the thread goes on.
        done = False
        result: Any = None
        error: BaseException | None = None

        async def tell_thread_on_cancel() -> None:
            try:
                await anyio.sleep_forever()
            finally:
                if not done:
                    ctx.cancelled.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(tell_thread_on_cancel)
            try:
                result = await anyio.to_thread.run_sync(
                    reg.work, ctx, job, limiter=self._thread_limiter
                )
            except Exception as exc:  # raised below, not wrapped in the task group's group
                error = exc
            finally:
                done = True
                tg.cancel_scope.cancel("the thread returned")
        # A thread that returned (or raised) after being told to stop was cancelled: the
        # cancellation (timeout, remote cancel, stop) decides the outcome, on every backend.
        if ctx.cancelled.is_set():
            await anyio.lowlevel.checkpoint()
        if error is not None:
            raise error
        return result

    async def _hooks(self, name: str, *args: Any) -> None:
        for hook in self._config.hooks:
            fn = getattr(hook, name, None)
            if fn is None:
                continue
            try:
                res = fn(*args)
                if inspect.isawaitable(res):
                    await res
            except Exception:
                ctx = args[0] if args else None
                logger.exception(
                    "hook %s.%s raised; ignored",
                    type(hook).__name__,
                    name,
                    extra=job_extra("hook_failed", ctx.job_row, self._config.id)
                    if isinstance(ctx, WorkContext)
                    else None,
                )

    async def _handle_error(self, row: JobRow, failure: _Failure) -> Any:
        handler = self._config.error_handler
        if handler is None:
            return failure
        try:
            res = handler.handle_error(row, failure.exc)
            if inspect.isawaitable(res):
                res = await res
        except Exception:
            logger.exception(
                "error handler raised while handling job %d; ignored",
                row.id,
                extra=job_extra("error_handler_failed", row, self._config.id),
            )
            return failure
        if res is not None and getattr(res, "set_cancelled", False):
            return _CancelAfterError(failure)
        return failure

    # --- completions ------------------------------------------------------------------------

    def _finish(
        self,
        row: JobRow,
        reg: Registration | None,
        job: Job[Any] | None,
        result: Any,
        start: float,
        started: float,
        ctx: WorkContext | None,
    ) -> Finished:
        now = self._now()
        if result is None and (
            ctx is None
            or not (ctx._metadata_updates or ctx._output is not None or ctx._completed_tx)
        ):
            return _completed(row, now, start, started)  # without the general bookkeeping
        meta: dict[str, Any] = {}
        error_text: str | None = None
        kind = EventKind.JOB_COMPLETED
        discard_cause: str | None = None
        params: dict[str, Any] = {"id": row.id, "attempt": row.attempt}

        def err_elem(exc: BaseException | str) -> bytes:
            # an outcome's reason (a str) is recorded as given; never a trace (River Go
            # records one only for a panic)
            nonlocal error_text
            text = exc if isinstance(exc, str) else _error_text(exc)
            error_text = text[:MAX_ERROR_TEXT]
            return json.dumps(
                {
                    "at": format_rfc3339nano(dt.datetime.fromtimestamp(start, dt.UTC)),
                    "attempt": row.attempt,
                    "error": error_text,
                    "trace": "",
                },
                separators=(",", ":"),
            ).encode()

        if result is None:
            params.update(state=JobState.COMPLETED, finalized_at=now)
        elif isinstance(result, SnoozeOutcome):
            kind = EventKind.JOB_SNOOZED
            meta["snoozes"] = _snoozes(row.metadata) + 1
            at = now + result.duration
            params.update(
                state=JobState.AVAILABLE
                if result.duration <= self._near_future
                else JobState.SCHEDULED,
                scheduled_at=at,
                attempt_new=max(row.attempt - 1, 0),
            )
        elif isinstance(result, CancelOutcome):
            kind = EventKind.JOB_CANCELLED
            params.update(
                state=JobState.CANCELLED,
                finalized_at=now,
                error=err_elem(f"JobCancelError: {result.reason}"),
            )
        elif isinstance(result, _CancelAfterError):
            kind = EventKind.JOB_CANCELLED
            exc = result.failure.exc
            params.update(state=JobState.CANCELLED, finalized_at=now, error=err_elem(exc))
            logger.info(
                "job %d (%s) failed on attempt %d; its error handler cancelled it: %s",
                row.id,
                row.kind,
                row.attempt,
                error_text,
                exc_info=_log_exc_info(exc),
                extra=job_extra("job_failed", row, self._config.id),
            )
        elif isinstance(result, DiscardOutcome):
            kind = EventKind.JOB_FAILED
            discard_cause = "discard"
            params.update(
                state=JobState.DISCARDED,
                finalized_at=now,
                error=err_elem(f"JobDiscardError: {result.reason}"),
            )
        else:
            if not isinstance(result, _Failure):
                result = _bad_return(row, result)
            kind = EventKind.JOB_FAILED
            elem = err_elem(result.exc)
            if row.attempt >= row.max_attempts:
                params.update(state=JobState.DISCARDED, finalized_at=now, error=elem)
                discard_cause = (
                    "unknown_kind"
                    if isinstance(result.exc, UnknownJobKindError)
                    else "attempts_exhausted"
                )
            else:
                nxt = self._next_retry(row, reg, job, now)
                params.update(
                    state=JobState.AVAILABLE
                    if nxt - now <= self._near_future
                    else JobState.RETRYABLE,
                    scheduled_at=nxt,
                    error=elem,
                )
            if reg is not None or not isinstance(result.exc, UnknownJobKindError):
                logger.info(
                    "job %d (%s) failed on attempt %d: %s",
                    row.id,
                    row.kind,
                    row.attempt,
                    error_text,
                    exc_info=_log_exc_info(result.exc),
                    extra=job_extra("job_failed", row, self._config.id),
                )
            else:
                logger.warning(
                    "job %d: %s",
                    row.id,
                    error_text,
                    extra=job_extra("job_unknown_kind", row, self._config.id),
                )
        if meta or (ctx is not None and (ctx._metadata_updates or ctx._output is not None)):
            try:
                if ctx is not None:
                    encoded = ctx.metadata_updates_json(meta)
                else:
                    encoded = json.dumps(meta, separators=(",", ":"), allow_nan=False).encode()
            except (TypeError, ValueError) as exc:  # a staged value was mutated since
                logger.error(
                    "job %d: metadata updates dropped, not JSON-encodable: %s",
                    row.id,
                    exc,
                    extra=job_extra("metadata_dropped", row, self._config.id),
                )
            else:
                params["metadata_updates"] = encoded
        return Finished(
            **params,
            row=row,
            kind=kind,
            message=error_text,
            start=start,
            started=started,
            completed_tx=ctx is not None and ctx._completed_tx,
            discard_cause=discard_cause,
        )

    def _next_retry(
        self, row: JobRow, reg: Registration | None, job: Job[Any] | None, now: dt.datetime
    ) -> dt.datetime:
        nxt: dt.datetime | None = None
        if reg is not None and job is not None:
            try:
                nxt = reg.next_retry(job)
            except Exception:
                logger.exception(
                    "next_retry of %s raised; using the retry policy",
                    row.kind,
                    extra=job_extra("next_retry_failed", row, self._config.id),
                )
        if nxt is None:
            policy = self._config.retry_policy
            if reg is not None and reg.retry_policy is not None:
                policy = reg.retry_policy  # the kind's own (Workers.add(retry_policy=...))
            try:
                nxt = policy.next_retry(row, now)
            except Exception:
                logger.exception(
                    "retry policy raised; using River's default",
                    extra=job_extra("retry_policy_failed", row, self._config.id),
                )
        if nxt is None or nxt < now:
            if nxt is not None:
                logger.warning(
                    "next retry for job %d is in the past; using the default",
                    row.id,
                    extra=job_extra("next_retry_in_past", row, self._config.id),
                )
            nxt = _default_policy.next_retry(row, now)
        return nxt

    def _interrupted(self, row: JobRow, start: float, started: float) -> Finished:
        now = self._clock.now()
        return Finished(
            id=row.id,
            attempt=row.attempt,
            state=JobState.AVAILABLE,
            scheduled_at=now,
            attempt_new=max(row.attempt - 1, 0),
            row=row,
            kind=EventKind.JOB_INTERRUPTED,
            message=None,
            start=start,
            started=started,
        )


_OUTCOMES = (type(None), SnoozeOutcome, DiscardOutcome, CancelOutcome, _Failure)


def _bad_return(row: JobRow, result: object) -> _Failure:
    return _Failure(
        TypeError(
            f"worker for {row.kind!r} returned {type(result).__name__}; expected None or an "
            "outcome (snooze, discard, cancel)"
        )
    )


def _resumable_outcome(ctx: WorkContext, result: Any) -> Any:
    """River's resumable middleware, after the worker: a clean return still fails when a step
    failed or a recorded step was not found; an attempt that did not succeed records its
    progress."""
    state = ctx._resumable_state()
    if result is None:
        err = state.final_error()
        if err is not None:
            result = _Failure(err)
    if result is not None:
        ctx._metadata_updates = {**(ctx._metadata_updates or {}), **state.progress_updates()}
    return result


class _CancelAfterError:
    """The error handler asked to cancel the job instead of retrying it."""

    __slots__ = ("failure",)

    def __init__(self, failure: _Failure) -> None:
        self.failure = failure


def _wrap(
    mw_work: Callable[..., Awaitable[Any]],
    nxt: Callable[[WorkContext, Job[Any]], Awaitable[Any]],
) -> Callable[[WorkContext, Job[Any]], Awaitable[Any]]:
    async def call(ctx: WorkContext, job: Job[Any]) -> Any:
        return await mw_work(ctx, job, nxt)

    return call
