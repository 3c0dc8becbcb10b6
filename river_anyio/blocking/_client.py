"""The blocking client: River's insert side and job/queue control for code that is not an
AnyIO program (Django and Flask views, scripts, worker threads).

It is the async :class:`river_anyio.Client`, run over drivers whose I/O blocks (see
:mod:`._drive`): the same validation, option precedence, unique keys, insert middleware and
hooks, and insert notifications, from the same code. No event loop is involved.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Final, Unpack

from .._client import NOTIFY_COOLDOWN, default_client_id
from .._client import Client as AsyncClient
from .._config import Config
from .._errors import ConfigError
from .._job import InsertOpts, InsertResult, JobRow
from .._jobs_api import JobListOptions, JobListResult
from .._limiter import KeyedBurstLimiter
from ..drivers import Driver, QueueRow, dialect_of_url
from ._drive import drive

__all__ = ["DRIVER_OPTIONS", "Client", "Jobs", "Queues"]

#: The ``driver_options`` the blocking client takes, by database.
DRIVER_OPTIONS: Final = {
    "postgres": frozenset(
        {"pool_max_size", "acquire_timeout", "connect_timeout", "prepare_threshold"}
    ),
    "sqlite": frozenset(
        {"pool_max_size", "acquire_timeout", "busy_timeout", "attach", "sqlite_module"}
    ),
}
#: Connections the blocking client keeps at most, unless ``driver_options`` says otherwise.
POOL_MAX_SIZE_DEFAULT: Final = 4


class _LockedLimiter(KeyedBurstLimiter):
    """The insert-notification limiter, safe to share between threads."""

    def __init__(self, window: float) -> None:
        super().__init__(window)
        self._lock = threading.Lock()

    def try_acquire(self, key: str) -> bool:
        with self._lock:
            return super().try_acquire(key)


class _Core(AsyncClient):
    """The async client the blocking one runs (its notification limiter is thread-safe)."""

    def __init__(self, driver: Driver, config: Config) -> None:
        super().__init__(
            driver,
            id=config.id or default_client_id(),
            max_attempts=config.max_attempts,
            middleware=config.middleware,
            hooks=config.hooks,
        )
        self._limiter = _LockedLimiter(NOTIFY_COOLDOWN)


def _open_driver(url: str, config: Config) -> Driver:
    dialect = dialect_of_url(url)
    options = dict(config.driver_options)
    known = DRIVER_OPTIONS[dialect]
    for name in options:
        if name not in known:
            raise ConfigError(
                "driver_options",
                f"{name!r} is not an option of the blocking {dialect} client "
                f"(options: {', '.join(sorted(known))})",
                name,
            )
    pool_max_size = options.pop("pool_max_size", POOL_MAX_SIZE_DEFAULT)
    acquire_timeout = options.pop("acquire_timeout", 30.0)
    if dialect == "postgres":
        from ..drivers.postgres import _validate
        from ._postgres import BlockingPostgresDriver, SyncPool

        conninfo, schema, size, acquire, connect, prepare = _validate(
            url,
            config.schema,
            pool_max_size,
            acquire_timeout,
            options.get("connect_timeout", 10.0),
            options.get("prepare_threshold", 5),
        )
        pool = SyncPool(
            conninfo,
            max_size=size,
            acquire_timeout=acquire,
            connect_timeout=connect,
            prepare_threshold=prepare,
            raw_url=url,
        )
        return BlockingPostgresDriver(pool, schema)

    import os

    from ..drivers.postgres import _number
    from ..drivers.sqlite import (
        _validate_attach,
        _validate_busy_timeout,
        _validate_identifier,
        path_from_url,
    )
    from ..drivers.sqlite._connection import MEMORY, check_sqlite_version
    from ..drivers.sqlite._dbapi import check_sqlite3_version, is_sqlite3_module
    from ._sqlite import BlockingSQLiteDriver, SQLitePool

    path = path_from_url(url)
    if config.schema is not None:
        _validate_identifier("schema", config.schema)
    if isinstance(pool_max_size, bool) or not isinstance(pool_max_size, int) or pool_max_size < 1:
        raise ConfigError("pool_max_size", "must be an int >= 1", pool_max_size)
    sqlite_acquire = _number("acquire_timeout", acquire_timeout)
    assert sqlite_acquire is not None
    busy = _validate_busy_timeout(options.get("busy_timeout", 5.0))
    attach = {k: os.path.abspath(v) for k, v in _validate_attach(options.get("attach")).items()}
    if config.schema is not None and config.schema not in attach:
        raise ConfigError(
            "schema",
            f"no attached database named {config.schema!r}; pass "
            "driver_options={'attach': {name: path}} to attach it",
            config.schema,
        )
    module = options.get("sqlite_module")
    if module is not None and path == MEMORY:
        raise ConfigError(
            "sqlite_module",
            "the in-memory database (sqlite://:memory:) is apsw's SQLite's, shared through "
            "its memdb VFS: another SQLite library cannot open it",
            module,
        )
    if module is not None:
        if not is_sqlite3_module(module):
            raise ConfigError(
                "sqlite_module",
                "must be a sqlite3-API module (sqlite3, pysqlite3.dbapi2) or None for apsw",
                module,
            )
        check_sqlite3_version(module, field="sqlite_module")
    else:
        check_sqlite_version()  # apsw's SQLite (with a module, only the module's matters)
    apsw_pool = SQLitePool(
        path,
        max_size=pool_max_size,
        acquire_timeout=sqlite_acquire,
        busy_timeout=busy,
        attach=attach,
        module=module,
    )
    return BlockingSQLiteDriver(apsw_pool, config.schema)


class Client:
    """A blocking River client for inserting jobs and managing jobs and queues.

    ``url``: a ``postgresql://`` URL (or libpq key/value string) or a ``sqlite:`` URL, as
    :func:`river_anyio.open_client` takes. The options are :class:`river_anyio.Config`'s
    that concern inserting (``id``, ``schema``, ``max_attempts``, ``middleware``, ``hooks``,
    ``driver_options``), validated the same way, before anything connects. ``driver_options``:
    ``pool_max_size`` (4), ``acquire_timeout`` (30 s), and PostgreSQL's ``connect_timeout``
    and ``prepare_threshold``, or SQLite's ``busy_timeout``, ``attach`` and ``sqlite_module``
    (the client's own connections use apsw; give the ``sqlite3``-API module your application
    opens the same file with, such as ``pysqlite3.dbapi2``, so that one SQLite library holds
    the file's locks in this process: two libraries on one file break each other's locks).

    Connections are opened on first use from a small pool of the client's own; the ``*_tx``
    methods use the caller's connection instead. Safe to share between threads. Close it with
    :meth:`close` or a ``with`` block.
    """

    def __init__(
        self,
        url: str,
        *,
        id: str | None = None,
        schema: str | None = None,
        max_attempts: int = 25,
        middleware: Sequence[Any] | None = None,
        hooks: Sequence[Any] | None = None,
        driver_options: Mapping[str, Any] | None = None,
    ) -> None:
        config = Config(
            id=id,
            schema=schema,
            max_attempts=max_attempts,
            middleware=middleware,
            hooks=hooks,
            driver_options=driver_options,
        )
        self._driver = _open_driver(url, config)
        self._core = _Core(self._driver, config)
        #: River's job API: get, list, cancel, retry, delete (and ``*_tx`` twins).
        self.jobs = Jobs(self._core)
        #: River's queue API: get, list, pause, resume (and ``*_tx`` twins).
        self.queues = Queues(self._core)

    def __repr__(self) -> str:
        return f"<river_anyio.blocking.Client {self._driver.dialect} id={self.id!r}>"

    @property
    def id(self) -> str:
        return self._core.id

    @property
    def dialect(self) -> str:
        """``"postgres"`` or ``"sqlite"``."""
        return self._driver.dialect

    def close(self) -> None:
        """Close the client's connections (those in use close when their call ends)."""
        drive(self._driver.aclose())

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- inserting ------------------------------------------------------------------------

    def insert(self, args: object, opts: InsertOpts | None = None) -> InsertResult:
        """Insert one job in a transaction of its own; a unique duplicate returns the
        existing job (``unique_skipped_as_duplicate``)."""
        return drive(self._core.insert(args, opts))

    def insert_tx(self, conn: object, args: object, opts: InsertOpts | None = None) -> InsertResult:
        """Insert one job inside the caller's open transaction on ``conn``: a
        ``psycopg.Connection``, an ``apsw.Connection``, a ``sqlite3``/``pysqlite3``
        connection, or an SQLAlchemy ``Connection``/``Session``. The job (and its insert
        notification) exists when that transaction commits, and not at all if it rolls back."""
        return drive(self._core.insert_tx(conn, args, opts))

    def insert_many(self, params: Sequence[object]) -> list[InsertResult]:
        """Insert a batch (args, or :class:`~river_anyio.InsertManyParams`) in one statement
        and one transaction; results in input order."""
        return drive(self._core.insert_many(params))

    def insert_many_tx(self, conn: object, params: Sequence[object]) -> list[InsertResult]:
        """:meth:`insert_many` inside the caller's transaction on ``conn``."""
        return drive(self._core.insert_many_tx(conn, params))

    def insert_many_fast(self, params: Sequence[object]) -> int:
        """Insert a batch without returning rows; returns how many were inserted (on
        PostgreSQL by COPY: a unique conflict fails the whole batch, as in River)."""
        return drive(self._core.insert_many_fast(params))

    def insert_many_fast_tx(self, conn: object, params: Sequence[object]) -> int:
        """:meth:`insert_many_fast` inside the caller's transaction on ``conn``."""
        return drive(self._core.insert_many_fast_tx(conn, params))


class Jobs:
    """River's job API on a blocking client (``client.jobs``); the async client's rules."""

    def __init__(self, core: AsyncClient) -> None:
        self._api = core.jobs

    def get(self, job_id: int) -> JobRow:
        """The job with this ID; :class:`~river_anyio.NotFoundError` when there is none."""
        return drive(self._api.get(job_id))

    def get_tx(self, conn: object, job_id: int) -> JobRow:
        return drive(self._api.get_tx(conn, job_id))

    def list(self, **options: Unpack[JobListOptions]) -> JobListResult:
        """River's JobList, as :meth:`river_anyio.Client.jobs.list <river_anyio.JobsAPI.list>`:
        one page of jobs and ``last_cursor`` to pass as ``after``."""
        return drive(self._api.list(**options))

    def list_tx(self, conn: object, **options: Unpack[JobListOptions]) -> JobListResult:
        return drive(self._api.list_tx(conn, **options))

    def cancel(self, job_id: int) -> JobRow:
        """River's JobCancel: cancels a job not yet running at once; a running one is asked
        to stop (through a control notification) and ends cancelled."""
        return drive(self._api.cancel(job_id))

    def cancel_tx(self, conn: object, job_id: int) -> JobRow:
        return drive(self._api.cancel_tx(conn, job_id))

    def retry(self, job_id: int) -> JobRow:
        """River's JobRetry: make the job available to run again now."""
        return drive(self._api.retry(job_id))

    def retry_tx(self, conn: object, job_id: int) -> JobRow:
        return drive(self._api.retry_tx(conn, job_id))

    def delete(self, job_id: int) -> JobRow:
        """River's JobDelete (a running job cannot be deleted: JobRunningError)."""
        return drive(self._api.delete(job_id))

    def delete_tx(self, conn: object, job_id: int) -> JobRow:
        return drive(self._api.delete_tx(conn, job_id))


class Queues:
    """River's queue API on a blocking client (``client.queues``)."""

    def __init__(self, core: AsyncClient) -> None:
        self._api = core.queues

    def get(self, name: str) -> QueueRow:
        """The queue's row; :class:`~river_anyio.NotFoundError` when there is none."""
        return drive(self._api.get(name))

    def list(self, *, limit: int = 100) -> list[QueueRow]:
        return drive(self._api.list(limit=limit))

    def pause(self, name: str) -> None:
        """Pause the queue (``"*"``: every queue); running clients stop fetching from it."""
        drive(self._api.pause(name))

    def pause_tx(self, conn: object, name: str) -> None:
        drive(self._api.pause_tx(conn, name))

    def resume(self, name: str) -> None:
        """Resume the queue (``"*"``: every queue)."""
        drive(self._api.resume(name))

    def resume_tx(self, conn: object, name: str) -> None:
        drive(self._api.resume_tx(conn, name))
