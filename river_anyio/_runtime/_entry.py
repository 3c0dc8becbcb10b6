"""The entry points: ``open_client`` and ``run_client``, and the exception policy at their
boundary (the run itself is in ``_supervisor``).

Both take a database and a :class:`~river_anyio.Config`; ``open_client`` also takes the
config's fields as typed keyword options. Everything is checked once, in :func:`prepare`,
before anything connects: the configuration, the database argument (a URL's dialect is
resolved here, once, and its driver options checked against that driver) and the warnings
about settings that would have no effect.

Exceptions leaving either entry point (``docs/discussion/shutdown-and-cancellation.md``):

====================================================  ===========================================
What happened                                         What is raised
====================================================  ===========================================
bad configuration or database argument                :class:`ConfigError`, before anything opens
the start fails (database unreachable, a queue ...)   that exception itself, not a group
an internal service fails while running               :class:`ClientCrashedError`, the group as
                                                      ``__cause__``
the ``open_client`` body raises                       the body's exception unchanged (internal
                                                      failures, if any, as its ``__context__``)
cancellation, ``KeyboardInterrupt``, ``SystemExit``   propagated as themselves, never wrapped
====================================================  ===========================================
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import AsyncIterator
from typing import Any, Unpack

import anyio
import attrs
from anyio.abc import TaskStatus

from .._client import Client
from .._config import CONFIG_OPTIONS, ClientConfig, Config, ConfigOptions, client_config
from .._errors import ClientCrashedError, ConfigError, ConnectionLostError
from .._events import EventHub
from ..drivers import Dialect, Driver, dialect_of_url, open_dialect_driver
from ..migrate._migrator import AUTO_LINES, Migrator, require_schema
from ._clock import SystemClock
from ._supervisor import ClientRun
from ._util import leaves as _leaves

__all__ = ["open_client", "run_client"]

#: The keyword options of ``open_postgres``/``open_sqlite`` (a test keeps them in step). Not
#: read from their signatures: importing a driver (psycopg finds libpq) blocks the loop.
DRIVER_OPTIONS = {
    "postgres": frozenset(
        {"pool_max_size", "acquire_timeout", "connect_timeout", "prepare_threshold"}
    ),
    "sqlite": frozenset({"busy_timeout", "attach", "sqlite_module"}),
}


@attrs.frozen(kw_only=True)
class Prepared:
    """A client ready to start: its configuration as the run reads it and its database,
    both checked. ``url`` is set (with its ``dialect``) when the database is a URL,
    ``driver`` when the caller brought a driver."""

    config: ClientConfig
    dialect: Dialect
    url: str | None = None
    driver: Driver | None = None


def prepare(
    database: str | Driver, config: Config | None = None, options: ConfigOptions | None = None
) -> Prepared:
    """Check everything a client start needs, once: ``options`` applied over ``config``, the
    database argument, and the settings that would have no effect (a warning)."""
    if config is not None and not isinstance(config, Config):
        raise ConfigError("config", f"must be a river_anyio.Config, not {type(config).__name__}")
    opts: dict[str, Any] = dict(options or {})
    unknown = sorted(set(opts) - CONFIG_OPTIONS)
    if unknown:
        raise ConfigError(unknown[0], "is not an open_client option")
    run_config = client_config(config, opts)
    if isinstance(database, str):
        dialect = dialect_of_url(database)
        _check_driver_options(dialect, run_config.driver_options)
        prepared = Prepared(config=run_config, dialect=dialect, url=database)
    elif all(hasattr(database, a) for a in ("transaction", "executor_for", "dialect")):
        if run_config.driver_options:
            raise ConfigError("driver_options", "only applies when opening a database from a URL")
        if run_config.schema is not None:
            # River Go's Config.Schema: the client's schema on the caller's driver (its pool)
            database = database.with_schema(run_config.schema)
        prepared = Prepared(config=run_config, dialect=database.dialect, driver=database)
    else:
        raise ConfigError(
            "database", f"must be a database URL or a driver, not {type(database).__name__}"
        )
    message = run_config.unused_settings_warning()
    if message is not None:
        warnings.warn(message, UserWarning, stacklevel=_caller_stacklevel())
    return prepared


def _check_driver_options(dialect: Dialect, driver_options: Any) -> None:
    """Unknown driver option names are configuration errors, not a TypeError at start."""
    known = DRIVER_OPTIONS[dialect]
    for name in driver_options:
        if name not in known:
            raise ConfigError(
                "driver_options",
                f"{name!r} is not an option of the {dialect} driver "
                f"(options: {', '.join(sorted(known))})",
                name,
            )


#: Frames in these files are skipped when a warning looks for its caller's line (computed at
#: import: path functions are blocking calls on the event loop).
_OWN_FILES = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.abspath(contextlib.__file__),
)


def _caller_stacklevel() -> int:
    """The stacklevel of the first frame outside river_anyio and contextlib, so that a
    warning points at the caller's ``open_client``/``run_client`` line."""
    skip = _OWN_FILES
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
        level += 1
    return level


@contextlib.asynccontextmanager
async def _driver_for(prepared: Prepared) -> AsyncIterator[Driver]:
    if prepared.driver is not None:
        await _ensure_schema(prepared.driver, prepared.config, None)
        yield prepared.driver
        return
    assert prepared.url is not None
    config = prepared.config
    async with open_dialect_driver(
        prepared.dialect, prepared.url, schema=config.schema, **config.driver_options
    ) as driver:
        await _ensure_schema(driver, config, prepared.url)
        yield driver


async def _ensure_schema(driver: Driver, config: Config, url: str | None) -> None:
    """With ``auto_migrate``, line main then line river_anyio migrated up (under the
    migrator's lock, so clients starting together migrate once); then one clear error unless
    line main is current (line river_anyio is checked by the features using it)."""
    if config.auto_migrate:
        for line in AUTO_LINES:
            await Migrator(driver, line=line).up()
        return  # line main is current once its migrator returns
    await require_schema(driver, database_url=url)


async def run_prepared(prepared: Prepared, *, task_status: TaskStatus[ClientRun]) -> None:
    """Open the driver (unless the caller brought one) and run the client on it. Exceptions
    leave as the run raised them; the entry points apply the policy."""
    config = prepared.config
    # The client exists before its database is open (``wait_for_database`` hands it out
    # then); until the database answers it is on a driver that says so.
    client = Client(
        prepared.driver or UnopenedDriver(prepared.dialect, config.schema),
        id=config.id,
        max_attempts=config.max_attempts,
        middleware=config.middleware,
        hooks=config.hooks,
        periodic_jobs=config.periodic_jobs,
        never_leader=config.leader_election_disabled,
        database_url=prepared.url,
    )
    run = ClientRun(client, config, EventHub())
    await run._serve(
        lambda: _driver_for(prepared), config.clock or SystemClock(), task_status=task_status
    )


class UnopenedDriver:
    """The driver of a client whose database has not answered yet (``wait_for_database``):
    every use raises :class:`ConnectionLostError`."""

    def __init__(self, dialect: Dialect, schema: str | None) -> None:
        self.dialect = dialect
        self.schema = schema
        self.supports_listen_notify = True

    def with_schema(self, schema: str | None) -> UnopenedDriver:
        return UnopenedDriver(self.dialect, schema)

    def _error(self) -> ConnectionLostError:
        return ConnectionLostError(
            "the database has not answered yet (the client waits for it: wait_for_database)"
        )

    def executor(self) -> Any:
        raise self._error()

    def transaction(self) -> Any:
        raise self._error()

    def executor_for(self, conn: object) -> Any:
        raise self._error()

    def listener(self) -> Any:
        raise self._error()

    async def aclose(self) -> None:
        return None


# --- the exception policy -------------------------------------------------------------------


def _internal_failures(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    cancelled = anyio.get_cancelled_exc_class()
    return [e for e in _leaves(group) if not isinstance(e, cancelled)]


def _outcome(group: BaseExceptionGroup[BaseException], *, started: bool) -> BaseException | None:
    """What an entry point raises for a group from the run with no body exception involved:
    ``None`` to re-raise the group as it is (only cancellations), a leaf to raise as itself
    (``KeyboardInterrupt``/``SystemExit``; the one failure of a start), or a
    :class:`ClientCrashedError` to raise from the group."""
    real = _internal_failures(group)
    fatal = [e for e in real if isinstance(e, KeyboardInterrupt | SystemExit)]
    if fatal:
        return fatal[0]
    if not real:
        return None
    if not started and len(real) == 1:
        return real[0]
    return ClientCrashedError(f"a river_anyio service failed: {type(real[0]).__name__}: {real[0]}")


class _RecordingStatus(TaskStatus[ClientRun]):
    """The caller's task status, remembering whether the run has started."""

    def __init__(self, inner: TaskStatus[ClientRun]) -> None:
        self._inner = inner
        self.started_run = False

    def started(self, value: ClientRun | None = None) -> None:
        self._inner.started(value)  # type: ignore[arg-type]
        self.started_run = True


async def run_client(
    database: str | Driver,
    config: Config | None = None,
    *,
    task_status: TaskStatus[ClientRun] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run a client until it is stopped, in a task group the caller brings::

        config = river_anyio.Config(queues=..., workers=...)
        run = await tg.start(river_anyio.run_client, url, config)
        ...
        run.stop()

    ``config`` defaults to ``Config()`` (a client that only inserts). Cancelling the
    caller's scope is a hard stop: running jobs are interrupted and written back.

    Raises:
        ConfigError: The database argument or driver options are invalid (before anything
            connects).
        ClientCrashedError: An internal service failed after the start; the run was stopped
            and cleaned up. The exception group is its ``__cause__``.
        Exception: A failed start raises its own exception (not a group), for example
            :class:`ConnectionLostError` when the database cannot be reached.
    """
    prepared = prepare(database, config)
    status = _RecordingStatus(task_status)
    to_raise: BaseException | None = None
    try:
        await run_prepared(prepared, task_status=status)
    except BaseExceptionGroup as group:
        to_raise = _outcome(group, started=status.started_run)
        if to_raise is None:
            raise
        if isinstance(to_raise, ClientCrashedError):
            raise to_raise from group
    if to_raise is not None:
        raise to_raise  # outside the handler: its own __cause__ and __context__ stay


def open_client(
    database: str | Driver, config: Config | None = None, **options: Unpack[ConfigOptions]
) -> contextlib.AbstractAsyncContextManager[ClientRun]:
    """Open a client; with ``queues`` and ``workers`` it also works jobs until the block ends.

    ``config`` is a :class:`Config`; ``options`` are its fields as keywords, applied over it
    (or over ``Config()``): ``open_client(url, queues=..., workers=...)``. Everything is
    validated before anything connects.

    Leaving the block normally is a graceful stop bounded by ``soft_stop_timeout``; leaving it
    with an exception is a stop-and-cancel, after which the exception propagates unchanged.

    Args:
        database: A database URL (``postgresql://…``, ``postgres://…`` or ``sqlite://path``)
            or a driver opened by the caller (:mod:`river_anyio.drivers`); with a driver,
            a ``schema`` option other than the driver's puts the client on
            ``driver.with_schema(schema)``, sharing the driver's connections.
        config: The client's configuration (default ``Config()``).
        options: Any :class:`Config` field, overriding ``config``'s.

    Raises:
        ConfigError: An option, the database argument or a driver option is invalid, or an
            option name is unknown: raised by the call itself, before anything connects.
        ClientCrashedError: An internal service failed; the run was stopped and cleaned up.
            The exception group is its ``__cause__``.
        Exception: The body's own exception, unchanged (an internal failure at the same time
            is attached as its ``__context__``); or, when the start fails, that exception
            itself, not a group.
    """
    return open_prepared(prepare(database, config, options))


@contextlib.asynccontextmanager
async def open_prepared(prepared: Prepared) -> AsyncIterator[ClientRun]:
    """:func:`open_client` for a client :func:`prepare` has checked."""
    cancelled = anyio.get_cancelled_exc_class()
    user_exc: BaseException | None = None
    started = False
    to_raise: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            run: ClientRun = await tg.start(run_prepared, prepared, name="river client")
            started = True
            try:
                yield run
            except BaseException as exc:
                if not isinstance(exc, cancelled):
                    user_exc = exc
                run.stop_and_cancel()
                raise
            run.stop(prepared.config.soft_stop_timeout)
    except BaseExceptionGroup as group:
        if user_exc is not None:
            internal = [e for e in _internal_failures(group) if e is not user_exc]
            if internal:
                user_exc.__context__ = BaseExceptionGroup("river_anyio internal errors", internal)
            to_raise = user_exc
        else:
            to_raise = _outcome(group, started=started)
            if to_raise is None:
                raise
            if isinstance(to_raise, ClientCrashedError):
                raise to_raise from group
    if to_raise is not None:
        # raised outside the handler, so its __cause__, __context__ and
        # __suppress_context__ stay exactly as they were
        raise to_raise
