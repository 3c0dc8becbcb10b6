"""Running a worker in a test: without a database (``work_once``) or through a client
(``work_with_client``), both through the runtime's own job running path (a worker pool
and its job runner, as in a producer), so timeouts, outcomes, errors,
retries and metadata behave exactly as they do in a running client."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn, cast

import anyio
import attrs

from .._client import Client
from .._config import ClientConfig
from .._errors import ConfigError
from .._events import EventKind
from .._insert import args_kind, build_insert_params
from .._job import MAX_ATTEMPTS_DEFAULT, AttemptError, InsertOpts, JobRow, JobState
from .._runtime._attempt import Attempt
from .._runtime._clock import Clock, SystemClock
from .._runtime._completer import Finished
from .._runtime._pool import WorkerPool
from .._runtime._runner import JobRunner, _CancelAfterError, _Failure
from .._runtime._supervisor import ClientRun
from .._timeutil import utc_now
from .._unique import unique_states_mask
from .._work import (
    UNSET,
    CancelOutcome,
    DiscardOutcome,
    Job,
    Outcome,
    Registration,
    SnoozeOutcome,
    WorkContext,
    Workers,
)

__all__ = ["WorkResult", "build_job", "work_once", "work_with_client"]

#: The client id ``build_job`` and ``work_once`` put in ``attempted_by``.
TEST_CLIENT_ID = "river_anyio_test"


@attrs.frozen(kw_only=True)
class WorkResult:
    """What one attempt did.

    ``kind`` is the job event it produced (completed, failed, snoozed, cancelled; ``job_race``
    when a client's completion no longer applied). ``state`` is the state the attempt moves
    the job to. ``outcome`` is the snooze/discard/cancel the worker returned, ``error`` the
    exception it raised (or the timeout, or why its args could not be decoded) and
    ``error_text`` that error as recorded in the job's ``errors``. ``metadata_updates`` are
    the keys the worker staged with ``ctx.set_metadata``; ``output`` is the recorded output
    (River keeps it under the ``output`` metadata key). ``job`` is, for :func:`work_once`, the
    row the worker ran with; for :func:`work_with_client`, the row read back after the
    completion was written.
    """

    kind: EventKind
    state: JobState
    outcome: Outcome | None
    error: BaseException | None
    error_text: str | None
    metadata_updates: Mapping[str, Any]
    job: JobRow

    @property
    def output(self) -> Any:
        """The output the worker recorded, decoded (``None`` if it recorded none)."""
        return self.metadata_updates.get("output")


def _states_of(mask: int | None) -> frozenset[JobState] | None:
    if mask is None:
        return None
    return frozenset(s for s in JobState if unique_states_mask([s.value]) & mask)


def build_job(
    args: object,
    opts: InsertOpts | None = None,
    *,
    id: int = 1,
    attempt: int = 1,
    errors: Sequence[AttemptError] = (),
    attempted_by: Sequence[str] = (TEST_CLIENT_ID,),
    now: dt.datetime | None = None,
) -> JobRow:
    """A ``running`` job row built in memory, as a client would claim it for ``attempt``.

    ``args`` and ``opts`` resolve exactly as an insert resolves them (queue, priority,
    max attempts, tags, metadata, unique key), and the args go through their JSON encoding,
    so the worker sees what it would see from the database. For anything else, change the
    row with ``attrs.evolve(row, ...)``.
    """
    at = now or utc_now()
    params = build_insert_params(
        args, opts, client_max_attempts=MAX_ATTEMPTS_DEFAULT, now=lambda: at
    )
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError(f"attempt must be a positive int, got {attempt!r}")
    return JobRow(
        id=id,
        args=json.loads(params.encoded_args),
        encoded_args=params.encoded_args,
        attempt=attempt,
        attempted_at=at,
        attempted_by=tuple(attempted_by),
        created_at=at,
        errors=tuple(errors),
        finalized_at=None,
        kind=params.kind,
        max_attempts=params.max_attempts,
        metadata=json.loads(params.metadata),
        priority=params.priority,
        queue=params.queue,
        scheduled_at=params.scheduled_at or at,
        state=JobState.RUNNING,
        tags=params.tags,
        unique_key=params.unique_key,
        unique_states=_states_of(params.unique_states),
    )


def _claimed(row: JobRow) -> JobRow:
    """A row as a producer's claim would leave it (in memory only)."""
    return attrs.evolve(
        row,
        state=JobState.RUNNING,
        attempt=row.attempt + 1,
        attempted_at=utc_now(),
        attempted_by=(*row.attempted_by, TEST_CLIENT_ID)[-100:],
    )


class _NoDatabase:
    """``ctx.client`` under :func:`work_once` when no client was given."""

    def __getattr__(self, name: str) -> NoReturn:
        raise RuntimeError(
            f"ctx.client.{name}: work_once runs the worker without a database; pass "
            "client=... (a client from open_client, or the river_client fixture) to give the "
            "worker one"
        )


class _RecordingRunner(JobRunner):
    """The runtime's job runner, remembering what the worker returned or raised."""

    recorded: Any = None

    def end_nowait(self, attempt: Attempt) -> bool:
        return False  # every attempt through ``_finish``, where its result is recorded

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
        self.recorded = result
        return super()._finish(row, reg, job, result, start, started, ctx)


def _check_registered(config: ClientConfig, kind: str) -> None:
    if kind not in config.workers:
        known = ", ".join(config.workers.kinds()) or "none"
        raise ConfigError(
            "workers", f"no worker is registered for kind {kind!r} (registered: {known})", kind
        )


async def _execute(
    config: ClientConfig, client: Client, clock: Clock, row: JobRow
) -> tuple[Finished, Any, Mapping[str, Any]]:
    """Run ``row`` as a producer runs a claimed row (a worker pool of one, its job timeout
    watchdog included); returns the completion, what the worker returned or raised, and its
    staged metadata."""
    send, receive = anyio.create_memory_object_stream[Finished](1)
    process_runner: Callable[..., Awaitable[Any]] | None = None
    reg = config.workers.get(row.kind)
    if reg is not None and reg.run_in == "process":
        from .._runtime._process import ProcessRunner

        process_runner = ProcessRunner(limit=1, stuck_threshold=config.job_stuck_threshold).run
    runner = _RecordingRunner(
        config=config,
        client=client,
        clock=clock,
        send=send,
        thread_limiter=anyio.CapacityLimiter(config.thread_workers),
        process_runner=process_runner,
    )
    pool = WorkerPool(runner=runner, max_workers=1, name="river_anyio.testing worker")
    with send, receive:
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            pool.dispatch([row])
            pool.close()
        finished = receive.receive_nowait()
    updates: Mapping[str, Any] = {}
    if finished.completion.metadata_updates is not None:
        updates = json.loads(finished.completion.metadata_updates)
    return finished, runner.recorded, updates


def _outcome_and_error(recorded: Any) -> tuple[Outcome | None, BaseException | None]:
    if isinstance(recorded, SnoozeOutcome | DiscardOutcome | CancelOutcome):
        return recorded, None
    if isinstance(recorded, _Failure):
        return None, recorded.exc
    if isinstance(recorded, _CancelAfterError):
        return None, recorded.failure.exc
    return None, None


def _config(
    *,
    id: str,
    workers: Workers,
    job_timeout: Any,
    middleware: Any,
    hooks: Any,
    retry_policy: Any,
    error_handler: Any,
) -> ClientConfig:
    """A client's configuration for running one job: River's defaults (``Config``'s) but for
    what the caller gave."""
    timeout: dict[str, Any] = {} if job_timeout is UNSET else {"job_timeout": job_timeout}
    return ClientConfig(
        id=id,
        workers=workers,
        middleware=middleware,
        hooks=hooks,
        retry_policy=retry_policy,
        error_handler=error_handler,
        **timeout,
    )


async def work_once(
    workers: Workers,
    job: JobRow | object,
    opts: InsertOpts | None = None,
    *,
    client: Client | ClientRun | None = None,
    job_timeout: float | dt.timedelta | None = UNSET,
    middleware: Sequence[Any] = (),
    hooks: Sequence[Any] = (),
    retry_policy: Any = None,
    error_handler: Any = None,
    clock: Clock | None = None,
) -> WorkResult:
    """Run the worker registered for the job's kind once, with no database.

    ``job`` is a row (see :func:`build_job`) or job args to build one from (with ``opts``). A
    row that is not ``running`` (say, one just inserted) is first claimed in memory, as a
    producer would claim it: ``running``, attempt + 1, this test client in ``attempted_by``.
    The attempt runs as a producer runs it: the worker's own timeout or ``job_timeout``
    (60 s by default, as in a client), thread and process workers, outcomes, errors and the
    retry decision are all the real ones; nothing is written anywhere, and the result says
    what would have been. Middleware and hooks are not applied unless passed here: the unit
    under test is the worker (:func:`work_with_client` runs a client's own). ``ctx.client``
    is ``client`` if given; otherwise any use of it raises a clear error.
    """
    if not isinstance(workers, Workers):
        raise TypeError(f"workers must be a river_anyio.Workers, not {type(workers).__name__}")
    if isinstance(job, JobRow):
        if opts is not None:
            raise TypeError("opts only applies when work_once builds the job from args")
        row = job if job.state == JobState.RUNNING else _claimed(job)
    else:
        row = build_job(job, opts)
    real_client = client.client if isinstance(client, ClientRun) else client
    config = _config(
        id=row.attempted_by[-1] if row.attempted_by else TEST_CLIENT_ID,
        workers=workers,
        job_timeout=job_timeout,
        middleware=middleware,
        hooks=hooks,
        retry_policy=retry_policy,
        error_handler=error_handler,
    )
    _check_registered(config, row.kind)
    the_client = real_client if real_client is not None else cast(Client, _NoDatabase())
    finished, recorded, updates = await _execute(config, the_client, clock or SystemClock(), row)
    outcome, error = _outcome_and_error(recorded)
    return WorkResult(
        kind=finished.kind,
        state=finished.completion.state,
        outcome=outcome,
        error=error,
        error_text=finished.message,
        metadata_updates=updates,
        job=row,
    )


async def work_with_client(
    client: Client | ClientRun,
    args: object,
    opts: InsertOpts | None = None,
    *,
    workers: Workers | None = None,
) -> WorkResult:
    """Insert a job through ``client``, claim it as a producer would, work it with a real
    context as a producer runs it, write its completion and return the result with
    the row as stored afterwards.

    With a running client (``ClientRun``) its configuration applies (middleware, hooks, error
    handler, retry policy, timeouts) and its workers unless ``workers`` is given; with a plain
    :class:`~river_anyio.Client` pass ``workers``. The insert and the claim share one
    transaction, so the job is never seen ``available`` by anyone else (a running client's
    own producers included) and the claim can only take this job: if the queue holds other
    available jobs that a producer would take first, or the insert returned an existing
    unique job, or the job is not available now (scheduled, pending), this raises and the
    insert is rolled back.
    """
    if isinstance(client, ClientRun):
        real = client.client
        config = client.config
        if workers is not None:
            config = attrs.evolve(config, workers=workers)
    elif isinstance(client, Client):
        if workers is None:
            raise TypeError("work_with_client needs workers= when given a Client")
        real = client
        config = _config(
            id=client.id,
            workers=workers,
            job_timeout=UNSET,
            middleware=(),
            hooks=(),
            retry_policy=None,
            error_handler=None,
        )
    else:
        raise TypeError(f"expected a Client or ClientRun, not {type(client).__name__}")
    if not isinstance(config.workers, Workers):
        raise TypeError(f"workers must be a river_anyio.Workers, not {type(workers).__name__}")
    _check_registered(config, args_kind(args))

    async with real.transaction() as tx:
        inserted = await real.insert_tx(tx, args, opts)
        row = inserted.job
        if inserted.unique_skipped_as_duplicate:
            raise ValueError(
                f"work_with_client: a unique job like this one already exists (id {row.id}, "
                f"{row.state}); it works only the job it inserts"
            )
        if row.state != JobState.AVAILABLE:
            raise ValueError(
                f"work_with_client: the job was inserted {row.state}, not available, so no "
                "producer would claim it now (use work_once to run its worker regardless)"
            )
        claimed = await tx.job_get_available(
            queue=row.queue, max_to_lock=1, client_id=config.id, kinds=[row.kind]
        )
        if [c.id for c in claimed] != [row.id]:
            raise RuntimeError(
                f"work_with_client: queue {row.queue!r} holds other available {row.kind!r} "
                f"jobs that a producer would claim before job {row.id} (claimed "
                f"{[c.id for c in claimed]}); the insert was rolled back. Use a queue of "
                "its own for the job, or a database without such jobs"
            )
        row = claimed[0]

    finished, recorded, updates = await _execute(config, real, SystemClock(), row)
    results = await real.driver.executor().job_set_state_if_running_many(
        [finished.completion], client_id=config.id
    )
    kind = finished.kind
    final: JobRow | None = results[0].job if results else None
    if final is None:
        final = await real.driver.executor().job_get_by_id(row.id)
    if final is None:
        raise RuntimeError(f"work_with_client: job {row.id} was deleted while it ran")
    if results and not results[0].applied:
        kind = EventKind.JOB_RACE
    elif final.state == JobState.CANCELLED:
        kind = EventKind.JOB_CANCELLED
    outcome, error = _outcome_and_error(recorded)
    return WorkResult(
        kind=kind,
        state=final.state,
        outcome=outcome,
        error=error,
        error_text=finished.message,
        metadata_updates=updates,
        job=final,
    )
