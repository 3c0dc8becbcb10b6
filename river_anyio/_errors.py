"""The river_anyio exception tree.

Every error the library raises on purpose derives from :class:`RiverError`::

    RiverError
    ├── ConfigError (also ValueError)         bad client/driver configuration
    │   └── CronError                         a cron expression that cannot be parsed
    ├── ValidationError (also ValueError)     bad input to an insert or another call
    ├── NotFoundError                         the row asked for does not exist
    ├── JobRunningError                       the job is running (River's ErrJobRunning)
    ├── JobWaitTimeoutError (also TimeoutError) ``jobs.wait`` timed out before the job finished
    ├── ResumableStepError (also RuntimeError) resumable steps misused (river_anyio._resumable)
    ├── MigrationError                        a migration cannot run or the schema is not current
    ├── LeaseLostError                        a held lease expired or was taken before its block ended
    ├── ClientCrashedError                    a running client's internal service failed
    └── DatabaseError                         the database failed; translated driver errors
        ├── ConnectionLostError               the connection dropped or could not be opened (transient)
        ├── PoolTimeoutError                  no pooled connection became free in time (transient)
        ├── DatabaseBusyError                 SQLite stayed locked past the busy timeout (transient)
        ├── QueryCanceledError                a statement was cancelled (timeout or request)
        └── IntegrityError                    a constraint rejected a write
            └── UniqueViolationError

Driver exceptions (psycopg, apsw) never escape the driver layer: they are translated at the
boundary and kept as ``__cause__``. ``DatabaseError.transient`` tells background services
whether retrying with back-off is likely to help; besides the classes marked above, it is true
for a PostgreSQL transaction that lost a race (serialization failure, deadlock).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._job import JobRow


class RiverError(Exception):
    """Root of every error raised by river_anyio."""


class ConfigError(RiverError, ValueError):
    """A configuration value is invalid; ``field`` names it and ``rule`` says what is required."""

    def __init__(self, field: str, rule: str, value: object = None) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        super().__init__(f"{field}: {rule}")


class CronError(ConfigError):
    """A cron expression is invalid. ``field`` names the part at fault (``minute``, ``hour``,
    ``day of month``, ``month``, ``day of week``, ``time zone``, ``descriptor``, ``@every`` or
    ``expression``); ``expression`` is the whole text."""

    def __init__(self, expression: str, field: str, rule: str) -> None:
        super().__init__(field, rule, expression)
        self.expression = expression
        self.args = (f"invalid cron expression {expression!r}: {field}: {rule}",)


class ValidationError(RiverError, ValueError):
    """An argument to a call is invalid; raised before anything is written."""

    def __init__(self, field: str, rule: str, value: object = None) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        super().__init__(f"{field}: {rule}")


class NotFoundError(RiverError):
    """The job, queue or other row asked for does not exist."""


class JobRunningError(RiverError):
    """The operation is refused because the job is running (River's ``ErrJobRunning``): a
    running job cannot be deleted."""


class JobWaitTimeoutError(RiverError, TimeoutError):
    """``client.jobs.wait`` gave up: the job was not finalized within ``timeout`` seconds.

    Also a :class:`TimeoutError`. ``job`` is the row as last read (None if it was never
    read), so the caller sees how far the job got.
    """

    def __init__(self, job_id: int, timeout: float, job: JobRow | None = None) -> None:
        self.job_id = job_id
        self.timeout = timeout
        self.job = job
        seen = f" (last seen {job.state})" if job is not None else ""
        super().__init__(f"job {job_id} was not finalized within {timeout:g}s{seen}")


class MigrationError(RiverError):
    """A migration could not be applied, or the requested change is not possible."""


class LeaseLostError(RiverError):
    """A lease held by ``async with client.lease(...)`` could not be renewed before it expired
    (or its row was gone), so another holder may take it: the block was cancelled. ``name``
    is the lease's name."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"lease {name!r} was lost: {reason}")


class ClientCrashedError(RiverError):
    """An internal service of a running client failed; the run was stopped and cleaned up.

    Raised by :func:`~river_anyio.open_client` and :func:`~river_anyio.run_client` alike. The
    failures are in ``__cause__``, an exception group (match it with ``pytest.RaisesGroup``).
    """


class DatabaseError(RiverError):
    """The database reported an error. ``sqlstate`` is set for PostgreSQL errors."""

    transient: bool = False

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        self.sqlstate = sqlstate
        super().__init__(message)


class ConnectionLostError(DatabaseError):
    """The connection could not be opened or was lost mid-operation."""

    transient = True


class PoolTimeoutError(DatabaseError):
    """No pooled connection became available within the acquire timeout."""

    transient = True


class DatabaseBusyError(DatabaseError):
    """SQLite's database stayed locked by another writer past the busy timeout."""

    transient = True


class QueryCanceledError(DatabaseError):
    """A statement was cancelled, by a statement timeout or a cancel request."""

    transient = True


class IntegrityError(DatabaseError):
    """A constraint (CHECK, NOT NULL, foreign key, unique) rejected a write."""


class UniqueViolationError(IntegrityError):
    """A unique index rejected a write (SQLSTATE 23505 on PostgreSQL)."""
