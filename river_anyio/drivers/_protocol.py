"""The driver contract: what the client and the migrator need from a database.

These Protocols are public so applications can annotate with them, but they are **unstable for
third-party implementers**: methods are added as the runtime grows.

A driver hands out *executors*. An executor runs River's operations against one connection:
either inside a transaction (``driver.transaction()``, or a caller's own connection through
``driver.executor_for(conn)``) or, for ``driver.executor()``, each call in its own short
unit of work. Every method translates driver exceptions into :mod:`river_anyio`'s tree.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

import attrs

from .._job import JobRow, JobState
from .._queue_limits import RateLimit

Dialect = Literal["postgres", "sqlite"]

#: Notification topics (River's channel names without the schema prefix).
TOPIC_INSERT = "river_insert"
TOPIC_CONTROL = "river_control"
TOPIC_LEADERSHIP = "river_leadership"


@attrs.frozen(kw_only=True)
class JobInsertParams:
    """One job ready to be written, every River default already resolved.

    ``created_at``/``scheduled_at`` of ``None`` mean "the database's now".
    ``metadata`` and ``encoded_args`` are encoded JSON objects.
    """

    encoded_args: bytes
    kind: str
    max_attempts: int
    metadata: bytes
    priority: int
    queue: str
    state: JobState
    tags: tuple[str, ...]
    scheduled_at: dt.datetime | None = None
    created_at: dt.datetime | None = None
    unique_key: bytes | None = None
    unique_states: int | None = None


@attrs.frozen(kw_only=True)
class InsertedJob:
    """A row returned by a fast insert, with River's duplicate flag."""

    job: JobRow
    unique_skipped_as_duplicate: bool


class Completion(Protocol):
    """What :meth:`Executor.job_set_state_if_running_many` reads of a completion: the fields
    of :class:`JobCompletion`, which satisfies it (the runtime passes its own records, so a
    finished job needs no second object)."""

    @property
    def id(self) -> int: ...
    @property
    def attempt(self) -> int: ...
    @property
    def state(self) -> JobState: ...
    @property
    def finalized_at(self) -> dt.datetime | None: ...
    @property
    def scheduled_at(self) -> dt.datetime | None: ...
    @property
    def error(self) -> bytes | None: ...
    @property
    def metadata_updates(self) -> bytes | None: ...
    @property
    def attempt_new(self) -> int | None: ...


@attrs.frozen(kw_only=True)
class JobCompletion:
    """One finished attempt to persist (River's ``JobSetStateIfRunning`` parameters).

    It applies only while the row is still ``running`` for the attempt this client claimed
    (``attempt`` and the last ``attempted_by`` entry): the attempt guard. Otherwise only
    ``metadata_updates`` is merged, as River merges metadata whatever the state.

    ``error`` is one encoded errors element, appended. ``attempt_new`` rewrites ``attempt``
    (snoozes and interruptions give the attempt back). ``finalized_at``/``scheduled_at`` of
    ``None`` leave the column unchanged, except that ``finalized_at`` is cleared when the
    target state is not final.
    """

    id: int
    attempt: int
    state: JobState
    finalized_at: dt.datetime | None = None
    scheduled_at: dt.datetime | None = None
    error: bytes | None = None
    metadata_updates: bytes | None = None
    attempt_new: int | None = None


@attrs.frozen(kw_only=True)
class LimitedClaim:
    """What a limited claim returns: the claimed rows (in claim order), how many rows the
    queue's global limits allowed it (at most the rows asked for; fewer rows than that means
    the queue had no more due), and, when its rate limit is used up, the seconds until a job
    may start again (else 0)."""

    jobs: list[JobRow]
    allowed: int
    reopens_in: float = 0.0


@attrs.frozen(kw_only=True)
class CompletionResult:
    """A completion's job id, whether the state change was applied (the guard held), and the
    row after it (``None`` when rows were not asked for)."""

    id: int
    applied: bool
    job: JobRow | None = None


@attrs.frozen(kw_only=True)
class QueueRow:
    """A ``river_queue`` row. ``metadata`` is the decoded JSON object."""

    name: str
    created_at: dt.datetime
    metadata: Any
    paused_at: dt.datetime | None
    updated_at: dt.datetime


@attrs.frozen(kw_only=True)
class Notification:
    """A received notification: its bare topic (no schema prefix) and JSON payload text."""

    topic: str
    payload: str


# --- client job and queue APIs (River's JobList/JobRetry/JobDelete/JobUpdate/QueueUpdate) ---


#: The columns a job list may be ordered by (besides ``id``, which always breaks ties).
ListOrderField = Literal["id", "scheduled_at", "attempted_at", "finalized_at", "created_at"]


@attrs.frozen(kw_only=True)
class JobListQuery:
    """Filters, order and cursor of a job list (River's ``dblist.JobListParams``), validated.

    ``None`` filters match everything; every given filter must match. ``tags_all``/``tags_any``:
    the row's tags contain all/any of these. ``metadata``: JSON containment (``@>``; encoded
    JSON; PostgreSQL only). Rows are ordered by ``order_by`` (then ``id``), ascending unless
    ``descending``; ascending puts NULL times last, descending first, on both backends.

    The cursor resumes after the row (``after_id``, ``after_time``) as River's does: with no
    ``after_time`` and a column that cannot be NULL only the id is compared; with no
    ``after_time`` and a nullable column (``time_nullable``) the cursor row had a NULL time.
    """

    ids: tuple[int, ...] | None = None
    kinds: tuple[str, ...] | None = None
    priorities: tuple[int, ...] | None = None
    queues: tuple[str, ...] | None = None
    states: tuple[JobState, ...] | None = None
    tags_all: tuple[str, ...] | None = None
    tags_any: tuple[str, ...] | None = None
    metadata: bytes | None = None
    order_by: ListOrderField = "id"
    descending: bool = False
    after_id: int | None = None
    after_time: dt.datetime | None = None
    time_nullable: bool = False
    limit: int = 100


# --- leadership and maintenance (types) ------------------------------------------------------


@attrs.frozen(kw_only=True)
class LeaderRow:
    """The ``river_leader`` lease: who leads, since when (identifies the term), until when."""

    leader_id: str
    elected_at: dt.datetime
    expires_at: dt.datetime


@attrs.frozen(kw_only=True)
class LeaseRow:
    """A ``river_anyio_lease`` row: a named lease, who holds it, since when (which, with the
    holder, identifies this taking of it) and until when."""

    name: str
    holder: str
    taken_at: dt.datetime
    expires_at: dt.datetime


@attrs.frozen(kw_only=True)
class ScheduledJob:
    """A job the scheduler moved: to ``available``, or ``discarded`` on a unique conflict."""

    job: JobRow
    conflict_discarded: bool


@attrs.frozen(kw_only=True)
class JobRescue:
    """One stuck job's new state (River's ``JobRescueMany`` element). ``error`` is one encoded
    errors element, appended; ``finalized_at`` is None for a non-final state."""

    id: int
    state: JobState
    error: bytes
    scheduled_at: dt.datetime
    finalized_at: dt.datetime | None = None


class Executor(Protocol):
    """River's operations on one connection (see the module docstring)."""

    @property
    def dialect(self) -> Dialect: ...

    # --- jobs -------------------------------------------------------------------------------
    async def job_insert_fast_many(self, params: Sequence[JobInsertParams]) -> list[InsertedJob]:
        """Insert jobs in one statement; unique conflicts return the existing row, flagged.

        Results are in input order. A batch holding one unique key twice (for jobs whose state
        is among their unique states) is refused with :class:`~river_anyio.ValidationError`, as
        River does.
        """
        ...

    async def job_insert_fast_many_no_returning(self, params: Sequence[JobInsertParams]) -> int:
        """Insert jobs without returning rows (the bulk path); returns the number inserted.

        Rows that conflict on a unique key are skipped (SQLite) or fail the batch (PostgreSQL
        COPY), as River does.
        """
        ...

    async def job_get_by_id(self, job_id: int) -> JobRow | None: ...

    async def job_list(
        self,
        *,
        ids: Sequence[int] | None = None,
        kinds: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        states: Sequence[JobState] | None = None,
        after_id: int | None = None,
        limit: int = 100,
    ) -> list[JobRow]:
        """Jobs matching every given filter, ordered by id ascending (the
        :meth:`job_list_query` of those filters, for callers that need no other)."""
        ...

    async def job_get_cancel_requested(self, ids: Sequence[int]) -> list[int]:
        """Of ``ids``, the running jobs whose cancellation was requested (``cancel_attempted_at``
        in their metadata), ascending (River's JobGetCancelRequested): how a producer learns
        of a remote cancel it was not notified of (no listener, or a notification lost)."""
        ...

    # --- the runtime's hot path --------------------------------------------------------------
    async def job_get_available(
        self,
        *,
        queue: str,
        max_to_lock: int,
        client_id: str,
        max_attempted_by: int = 100,
        kinds: Sequence[str] | None = None,
    ) -> list[JobRow]:
        """Claim up to ``max_to_lock`` available jobs of ``queue`` whose time has come.

        River's claim: ``priority, scheduled_at, id`` order, ``FOR UPDATE SKIP LOCKED`` on
        PostgreSQL; claimed rows become ``running`` with ``attempt + 1``, ``attempted_at`` =
        the database's now and ``client_id`` appended to ``attempted_by`` (keeping the last
        ``max_attempted_by``). ``kinds`` restricts the claim to those kinds (fetch only known
        kinds); ``None`` claims any kind. Returned in claim order.
        """
        ...

    async def job_get_available_limited(
        self,
        *,
        queue: str,
        max_to_lock: int,
        client_id: str,
        max_attempted_by: int = 100,
        kinds: Sequence[str] | None = None,
        rate_limit: RateLimit | None = None,
        global_max_workers: int | None = None,
    ) -> LimitedClaim:
        """:meth:`job_get_available` bounded by the queue's global limits, in one transaction.

        The claim first locks the queue's row of ``river_anyio_queue_limit`` (migration line
        ``river_anyio``; created on first use), which serialises the limited claims of that
        queue across every client, then takes at most what the limits allow: the rate
        limit's allowance (see :mod:`river_anyio._queue_limits`) and ``global_max_workers``
        minus the queue's ``running`` rows, and records the starts. A missing table raises
        :class:`~river_anyio.MigrationError` naming the command that installs it.
        """
        ...

    async def job_set_state_if_running_many(
        self, completions: Sequence[Completion], *, client_id: str, return_rows: bool = True
    ) -> list[CompletionResult]:
        """Persist finished attempts in one statement (PostgreSQL) or one transaction (SQLite).

        River 0.51's semantics (state, errors, finalized_at, scheduled_at only while running; an
        ``available``/``retryable``/``scheduled`` target becomes ``cancelled`` when the row
        carries ``cancel_attempted_at``; metadata merged even when not running, top-level keys
        replaced and nulls kept, on both backends) plus the attempt guard described on
        :class:`JobCompletion`. One result per completion whose row still exists, in input
        order. With ``return_rows=False`` (the completer, when nobody subscribes to events)
        only the completions that were not applied are returned, without their rows (``job``
        is None): usually none, so nothing is decoded per job.
        """
        ...

    async def job_cancel(
        self, *, job_id: int, cancel_attempted_at: dt.datetime, notify: bool = True
    ) -> JobRow | None:
        """River's JobCancel: a running job is flagged (``cancel_attempted_at``) and a
        ``river_control`` cancel notification is sent; any other non-final job becomes
        ``cancelled``. Finalized jobs are returned unchanged; a missing one gives None."""
        ...

    # --- queues -----------------------------------------------------------------------------
    async def queue_create_or_set_updated_at(
        self, *, name: str, metadata: bytes = b"{}"
    ) -> QueueRow:
        """Insert the queue's row, or bump its ``updated_at`` if it exists; return it."""
        ...

    async def queue_get(self, name: str) -> QueueRow | None: ...

    async def queue_list(self, *, limit: int = 100) -> list[QueueRow]:
        """Queues ordered by name."""
        ...

    async def queue_pause(self, name: str) -> int:
        """Pause a queue (``"*"`` for all) unless already paused; returns the rows matched.

        Also sends River's ``{"action":"pause","queue":...}`` control notification.
        """
        ...

    async def queue_resume(self, name: str) -> int:
        """Resume a queue (``"*"`` for all); returns the rows matched; notifies as River."""
        ...

    # --- notifications ----------------------------------------------------------------------
    async def notify_many(self, topic: str, payloads: Sequence[str]) -> None:
        """Send notifications on a River topic; delivered when the transaction commits.

        PostgreSQL: ``pg_notify('<schema>.<topic>', payload)``, schema being the configured one
        or ``current_schema()``. SQLite: rows in River's ``river_notification`` outbox.
        """
        ...

    # --- generic access (migrator, tests, admin) -----------------------------------------------
    async def exec_script(self, sql: str) -> None:
        """Run a multi-statement SQL script (DDL), no parameters."""
        ...

    async def fetch_all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement with backend-native placeholders (``%s`` / ``?``) and return rows."""
        ...

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement with backend-native placeholders; return the affected row count."""
        ...

    async def table_exists(self, table: str) -> bool:
        """Whether ``table`` exists in the driver's schema (or the search path)."""
        ...

    async def column_exists(self, table: str, column: str) -> bool: ...

    # --- observability -------------------------------------------------------------------

    async def job_count_by_queue_and_state(
        self, *, states: Sequence[JobState]
    ) -> list[tuple[str, JobState, int]]:
        """How many jobs each queue has in each of ``states``: ``(queue, state, count)``
        for every pair with at least one job, ordered by queue and state."""
        ...

    # --- client job and queue APIs (River's JobList/JobRetry/JobDelete/JobUpdate/QueueUpdate) ---
    async def job_list_query(self, query: JobListQuery) -> list[JobRow]:
        """River's JobList: the rows matching ``query``, in its order, at most ``limit``.

        A ``metadata`` filter on SQLite raises :class:`~river_anyio.ValidationError`.
        """
        ...

    async def job_retry(self, job_id: int) -> JobRow | None:
        """River's JobRetry: unless the job is running, or available and already due, make it
        ``available`` now (``finalized_at`` cleared, ``cancel_attempted_at`` dropped, one more
        attempt allowed when all are used up). Returns the row after it; None if missing."""
        ...

    async def job_delete(self, job_id: int) -> JobRow | None:
        """River's JobDelete: delete the job unless it is running, and return it. A running
        job is returned as it is, undeleted (the caller raises); a missing one gives None."""
        ...

    async def job_delete_many(self, query: JobListQuery) -> list[JobRow]:
        """River's JobDeleteMany: delete up to ``query.limit`` matching jobs, lowest ids first,
        never running ones (nor, on PostgreSQL, rows other transactions hold locked); returns
        the deleted rows ordered by id. Order and cursor fields of ``query`` are ignored."""
        ...

    async def job_update_metadata(self, job_id: int, metadata_updates: bytes) -> JobRow | None:
        """River's JobUpdate: merge an encoded JSON object into the job's metadata (top-level
        keys replaced, as completions merge). Returns the row after it; None if missing."""
        ...

    async def queue_update(self, name: str, *, metadata: bytes | None = None) -> QueueRow | None:
        """River's QueueUpdate: replace the queue's metadata when given, and bump
        ``updated_at``. Sends no notification (the caller does, in the same transaction).
        Returns the row after it; None if there is no such queue."""

    # --- leadership and maintenance -------------------------------------------------------------
    # ``now`` of None means the database's clock, as River does unless a test time is set.

    async def leader_delete_expired(self, *, now: dt.datetime | None = None) -> int:
        """Delete the lease if it expired before ``now``; returns the rows deleted."""
        ...

    async def leader_attempt_elect(
        self, *, leader_id: str, ttl: float, now: dt.datetime | None = None
    ) -> LeaderRow | None:
        """Take the lease (elected now, expiring ``ttl`` seconds later) unless someone holds it;
        None when someone does. River runs it after :meth:`leader_delete_expired`, in one
        transaction."""
        ...

    async def leader_attempt_reelect(
        self,
        *,
        leader_id: str,
        elected_at: dt.datetime,
        ttl: float,
        now: dt.datetime | None = None,
    ) -> LeaderRow | None:
        """Extend our unexpired lease of the term ``elected_at``; None when it is gone."""
        ...

    async def leader_resign(self, *, leader_id: str, elected_at: dt.datetime) -> bool:
        """Give up the lease of the term ``elected_at``; False when it was not held. As in
        River, PostgreSQL also notifies ``resigned`` on ``river_leadership`` so followers try
        at once; SQLite does not (its followers bid at their next interval)."""
        ...

    async def leader_get_elected(self) -> LeaderRow | None:
        """The current lease row, expired or not."""
        ...

    # --- named leases (line river_anyio's ``river_anyio_lease``) ------------------------------
    # Times are the database's: the holders' clocks never matter.

    async def lease_take(self, *, name: str, holder: str, ttl: float) -> LeaseRow | None:
        """Take the lease ``name`` for ``ttl`` seconds from now unless an unexpired row holds
        it, in one statement (an insert that overwrites only an expired row), so exactly one
        of any number of racing callers gets it. None when it is held."""
        ...

    async def lease_renew(
        self, *, name: str, holder: str, taken_at: dt.datetime, ttl: float
    ) -> LeaseRow | None:
        """Extend the unexpired lease taken by ``holder`` at ``taken_at`` to ``ttl`` seconds
        from now; None when that taking of it has expired or is gone."""
        ...

    async def lease_release(self, *, name: str, holder: str, taken_at: dt.datetime) -> bool:
        """Delete the lease if it is still the one ``holder`` took at ``taken_at``; whether it
        was."""
        ...

    async def job_schedule(
        self, *, horizon: dt.datetime, now: dt.datetime, limit: int
    ) -> list[ScheduledJob]:
        """River's JobSchedule: up to ``limit`` ``scheduled``/``retryable`` jobs due by
        ``horizon`` (priority, scheduled_at, id order) become ``available``; a unique job whose
        key another row holds in one of its unique states, or that is not the first of its key
        in the batch, is ``discarded`` (finalized ``now``, metadata ``unique_key_conflict:
        "scheduler_discarded"``). ``scheduled_at`` is kept. Results in that order."""
        ...

    async def job_get_stuck(
        self, *, stuck_horizon: dt.datetime, after_id: int = 0, limit: int
    ) -> list[JobRow]:
        """``running`` jobs attempted before ``stuck_horizon``, id above ``after_id``, by id."""
        ...

    async def job_rescue_many(
        self, rescues: Sequence[JobRescue], *, stuck_horizon: dt.datetime
    ) -> int:
        """Apply rescues to jobs still ``running`` and attempted before ``stuck_horizon``:
        the error appended, state/scheduled_at/finalized_at set and ``river:rescue_count``
        incremented. Returns the rows changed."""
        ...

    async def job_rescue_many_returning(
        self, rescues: Sequence[JobRescue], *, stuck_horizon: dt.datetime
    ) -> list[JobRow]:
        """:meth:`job_rescue_many`, returning the rows it changed as written (in no
        particular order): what the rescuer reports in events when someone subscribes."""
        ...

    async def job_delete_before(
        self,
        *,
        cancelled_before: dt.datetime | None,
        completed_before: dt.datetime | None,
        discarded_before: dt.datetime | None,
        limit: int,
    ) -> int:
        """Delete up to ``limit`` jobs (by id) of each final state finalized before its
        horizon; a None horizon keeps that state's jobs. Returns the rows deleted."""
        ...

    async def queue_delete_expired(self, *, updated_before: dt.datetime, limit: int) -> list[str]:
        """Delete up to ``limit`` queue rows (by name) not updated since ``updated_before``."""
        ...

    async def notification_delete_before(self, *, created_before: dt.datetime, limit: int) -> int:
        """Delete up to ``limit`` ``river_notification`` outbox rows created before the horizon."""
        ...

    async def index_exists(self, name: str) -> bool:
        """Whether the index exists in the driver's schema."""
        ...

    async def index_reindex_artifacts(self, name: str) -> list[str]:
        """Leftovers of an interrupted concurrent rebuild of ``name`` (``<name>_ccnew``,
        ``_ccold`` and numbered variants; PostgreSQL only, none on SQLite)."""
        ...

    async def index_reindex(self, name: str) -> None:
        """Rebuild the index (``REINDEX INDEX CONCURRENTLY`` on PostgreSQL, outside any
        transaction; ``REINDEX`` on SQLite)."""
        ...

    async def index_drop_if_exists(self, name: str) -> None:
        """Drop the index if it exists (concurrently on PostgreSQL)."""
        ...

    # --- one-round-trip insert (runtime speed-ups) ------------------------------------------

    async def job_insert_fast_many_notify(
        self, params: Sequence[JobInsertParams], *, topic: str, payloads: Sequence[str]
    ) -> list[InsertedJob]:
        """:meth:`job_insert_fast_many` and :meth:`notify_many` in one unit of work: one
        statement on PostgreSQL, so a client's own-transaction insert is one round trip.
        Inside a transaction, both belong to that transaction."""
        ...

    # --- a claim whose reply was lost -----------------------------------------------------------

    async def job_give_back_lost_claims(
        self,
        *,
        queue: str,
        client_id: str,
        claimed_after: dt.datetime | None,
        within: float,
        running: Sequence[int] = (),
    ) -> list[JobRow]:
        """Give back jobs that a claim of ``client_id`` committed although the client never
        got its reply (the connection broke, or it stopped waiting), so they are not left
        ``running`` for the rescuer.

        Matched: rows of ``queue`` still ``running`` whose last ``attempted_by`` entry is
        ``client_id``, attempted after ``claimed_after`` (the ``attempted_at`` of the latest
        claim whose rows the client did receive; None for no such bound), at most ``within``
        seconds before now on the clock :meth:`job_get_available` sets ``attempted_at``
        from, and not among ``running`` (the attempts the client does run). Each becomes
        ``available`` with its attempt given back (``attempt - 1``), no error recorded and
        ``scheduled_at`` kept, like an interrupted attempt; one whose cancellation was
        requested meanwhile (``cancel_attempted_at``) becomes ``cancelled`` instead, as its
        completion would. Returns the changed rows, by id. Only called after a claim failed.
        """
        ...


class Listener(Protocol):
    """Receives River notifications on one dedicated connection (PostgreSQL LISTEN) or by
    following the outbox (SQLite)."""

    async def listen(self, topic: str) -> None: ...

    async def unlisten(self, topic: str) -> None: ...

    def __aiter__(self) -> AsyncIterator[Notification]: ...


class Driver(Protocol):
    """A database River can run on: PostgreSQL (psycopg 3) or SQLite (apsw)."""

    @property
    def dialect(self) -> Dialect: ...

    @property
    def schema(self) -> str | None:
        """The configured schema (PostgreSQL) or attached database name (SQLite), if any."""
        ...

    @property
    def supports_listen_notify(self) -> bool: ...

    def with_schema(self, schema: str | None) -> Driver:
        """This driver's connections with River's tables in ``schema`` (River Go's clients of
        several schemas on one driver): a view that shares the pool (PostgreSQL) or the
        writer (SQLite, where ``schema`` names an attached database), owned by this driver.
        The driver itself when ``schema`` is its own."""
        ...

    def executor(self) -> Executor:
        """An executor whose every call runs in its own unit of work."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[Executor]:
        """A transaction (``BEGIN IMMEDIATE`` on SQLite); commits on success, rolls back on error
        or cancellation, with the rollback shielded and bounded."""
        ...

    def executor_for(self, conn: object) -> Executor:
        """An executor on a caller's connection (or one of our executors, returned as is).

        Raises ``TypeError`` for an object this driver cannot use.
        """
        ...

    def listener(self) -> AbstractAsyncContextManager[Listener]: ...

    async def aclose(self) -> None: ...
