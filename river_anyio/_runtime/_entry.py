"""The entry points: ``open_client`` and ``run_client``, the options they take, and the
exception policy at the ``open_client`` boundary (the run itself is in ``_supervisor``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
from anyio.abc import TaskStatus

from .._client import Client, default_client_id
from .._config import ELECT_INTERVAL_DEFAULT, ClientConfig, build_config
from .._errors import ConfigError
from .._events import EventHub
from .._job import MAX_ATTEMPTS_DEFAULT
from .._work import UNSET
from ..drivers import Driver, dialect_of_url, open_driver
from ..migrate._migrator import require_schema
from ._clock import SystemClock
from ._supervisor import ClientCrashedError, ClientRun, _leaves

__all__ = ["open_client", "run_client"]


def _config_from(database: object, options: dict[str, Any]) -> ClientConfig:
    opts = dict(options)
    client_id = opts.pop("id", None)
    if client_id is None:
        client_id = default_client_id()
    defaults: dict[str, Any] = {
        "schema": None,
        "max_attempts": MAX_ATTEMPTS_DEFAULT,
        "queues": None,
        "workers": None,
        "job_timeout": 60.0,
        "soft_stop_timeout": None,
        "fetch_cooldown": 0.1,
        "fetch_poll_interval": 1.0,
        "poll_only": False,
        "fetch_only_known_kinds": False,
        "retry_policy": None,
        "error_handler": None,
        "middleware": None,
        "hooks": None,
        "job_stuck_threshold": 10.0,
        "thread_workers": 16,
        "process_workers": 4,
        "periodic_jobs": None,
        # private, for tests: shorter completer retry timings (validated like the rest)
        "_completer_pauses": None,
        "_completer_try_timeout": None,
        # leadership and maintenance (private ones for tests: a short election interval;
        # no random stagger before each maintenance service starts)
        "maintenance": None,
        "leader_election_disabled": False,
        "_elect_interval": ELECT_INTERVAL_DEFAULT,
        "_maintenance_stagger": True,
    }
    unknown = set(opts) - set(defaults) - {"driver_options", "clock"}
    if unknown:
        raise ConfigError(sorted(unknown)[0], "is not an open_client option")
    if isinstance(database, str):
        dialect_of_url(database)
    elif not all(hasattr(database, a) for a in ("transaction", "executor_for", "dialect")):
        raise ConfigError(
            "database", f"must be a database URL or a driver, not {type(database).__name__}"
        )
    driver_options = opts.get("driver_options")
    if driver_options is not None and not isinstance(driver_options, dict):
        raise ConfigError("driver_options", "must be a dict of driver keyword arguments")
    if driver_options and isinstance(database, str):
        _check_driver_options(database, driver_options)
    clock = opts.get("clock")
    if clock is not None and not callable(getattr(clock, "now", None)):
        raise ConfigError("clock", "must be an object with a now() method", clock)
    kw = {k.lstrip("_"): opts.get(k, v) for k, v in defaults.items()}
    job_timeout_given = opts.get("job_timeout", UNSET) is not UNSET
    if kw["job_timeout"] is UNSET:
        kw["job_timeout"] = 60.0
    return build_config(id=client_id, job_timeout_given=job_timeout_given, **kw)


#: The keyword options of ``open_postgres``/``open_sqlite`` (a test keeps them in step). Not
#: read from their signatures: importing a driver (psycopg finds libpq) blocks the loop.
DRIVER_OPTIONS = {
    "postgres": frozenset(
        {"pool_max_size", "acquire_timeout", "connect_timeout", "prepare_threshold"}
    ),
    "sqlite": frozenset({"busy_timeout", "attach"}),
}


def _check_driver_options(url: str, driver_options: dict[str, Any]) -> None:
    """Unknown driver option names are configuration errors, not a TypeError at start."""
    dialect = dialect_of_url(url)
    known = DRIVER_OPTIONS[dialect]
    for name in driver_options:
        if name == "schema":
            raise ConfigError("driver_options", "use open_client's schema option, not schema")
        if name not in known:
            raise ConfigError(
                "driver_options",
                f"{name!r} is not an option of the {dialect} driver "
                f"(options: {', '.join(sorted(known))})",
                name,
            )


@contextlib.asynccontextmanager
async def _driver_for(
    database: str | Driver, config: ClientConfig, driver_options: dict[str, Any] | None
) -> AsyncIterator[Driver]:
    if isinstance(database, str):
        async with open_driver(database, schema=config.schema, **(driver_options or {})) as d:
            await require_schema(d, database_url=database)
            yield d
        return
    if not all(hasattr(database, a) for a in ("transaction", "executor_for", "dialect")):
        raise ConfigError(
            "database", f"must be a database URL or a driver, not {type(database).__name__}"
        )
    if driver_options:
        raise ConfigError("driver_options", "only applies when opening a database from a URL")
    if config.schema is not None and database.schema != config.schema:
        raise ConfigError("schema", f"conflicts with the driver's schema {database.schema!r}")
    await require_schema(database)
    yield database


async def run_client(
    database: str | Driver,
    *,
    task_status: TaskStatus[ClientRun] = anyio.TASK_STATUS_IGNORED,
    **options: Any,
) -> None:
    """Run a client until it is stopped, in a task group the caller brings::

        run = await tg.start(functools.partial(river_anyio.run_client, url, queues=..., workers=...))
        ...
        run.stop()

    (``TaskGroup.start`` passes no keyword arguments, hence ``functools.partial``.) Cancelling
    the caller's scope is a hard stop: running jobs are interrupted and written back.
    """
    config = _config_from(database, options)
    driver_options = options.get("driver_options")
    if driver_options is not None and not isinstance(driver_options, dict):
        raise ConfigError("driver_options", "must be a dict of driver keyword arguments")
    clock = options.get("clock") or SystemClock()
    events = EventHub()
    async with _driver_for(database, config, driver_options) as driver:
        client = Client(
            driver,
            id=config.id,
            max_attempts=config.max_attempts,
            middleware=config.middleware,
            hooks=config.hooks,
            periodic_jobs=config.periodic_jobs,
            never_leader=config.leader_election_disabled,
        )
        run = ClientRun(client, config, events)
        await run._run(driver, clock, task_status=task_status)


@contextlib.asynccontextmanager
async def open_client(database: str | Driver, **options: Any) -> AsyncIterator[ClientRun]:
    """Open a client; with ``queues`` and ``workers`` it also works jobs until the block ends.

    Leaving the block normally is a graceful stop bounded by ``soft_stop_timeout``; leaving it
    with an exception is a stop-and-cancel, after which the exception propagates unchanged.
    Every option is validated before anything connects (:class:`ConfigError` naming it).

    Args:
        database: A database URL (``postgresql://…``, ``postgres://…`` or ``sqlite://path``)
            or a driver opened by the caller (:mod:`river_anyio.drivers`).

    Keyword Args:
        queues: ``{name: QueueConfig}``, the queues this client works (``workers`` needed).
            Without queues the client only inserts and manages jobs, and never leads.
        workers: The :class:`Workers` that run each job kind.
        id: This client's ID, at most 100 characters (default: host name and start time).
        schema: The schema holding River's tables (PostgreSQL), or the attached database
            (SQLite; attach it with ``driver_options={"attach": {name: path}}``).
        max_attempts: Attempts of jobs inserted without their own (River's 25).
        job_timeout: How long an attempt may run unless its worker says otherwise: seconds or
            a timedelta, ``None`` for no limit (default 60 s).
        soft_stop_timeout: How long a graceful stop lets running jobs finish before they are
            cancelled (default ``None``: as long as they take).
        fetch_cooldown: The shortest time between two fetches of a queue (0.1 s).
        fetch_poll_interval: How often a queue is fetched without notifications (1 s).
        poll_only: Poll instead of listening for notifications (default False).
        fetch_only_known_kinds: Claim only jobs of kinds that have a worker here (default
            False: a job of an unknown kind is claimed and fails, as in River).
        retry_policy: An object with ``next_retry(job_row, now) -> datetime`` (default
            :class:`DefaultRetryPolicy`, River's).
        error_handler: An object with ``handle_error(job_row, exc)`` (may be async), called
            when an attempt raises; a result with a true ``set_cancelled`` cancels the job.
        middleware: Objects with ``async insert(params, next)`` and/or
            ``async work(ctx, job, next)`` methods, outermost first.
        hooks: Objects with ``insert_begin(params)``, ``work_begin(ctx, job)`` and/or
            ``work_end(ctx, job, error)`` (sync or async); a hook that raises is logged.
        job_stuck_threshold: How long a ``run_in="process"`` worker may ignore cancellation
            before its process is killed (10 s).
        thread_workers: Threads shared by ``run_in="thread"`` workers (16).
        process_workers: Child processes shared by ``run_in="process"`` workers (4).
        periodic_jobs: :class:`PeriodicJob` instances the client inserts while it leads.
        maintenance: A :class:`MaintenanceConfig` for the leader's maintenance services.
        leader_election_disabled: Never take part in leader elections (default False).
        driver_options: Keyword arguments for the driver opened from the URL: PostgreSQL's
            ``pool_max_size``, ``acquire_timeout``, ``connect_timeout``,
            ``prepare_threshold``; SQLite's ``busy_timeout``, ``attach``.
    """
    config = _config_from(database, options)  # validate before anything connects
    user_exc: BaseException | None = None
    started = False
    cancelled = anyio.get_cancelled_exc_class()
    reraise: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            run: ClientRun = await tg.start(_run_client_task, database, options)
            started = True
            try:
                yield run
            except BaseException as exc:
                if not isinstance(exc, cancelled):
                    user_exc = exc
                run.stop_and_cancel()
                raise
            run.stop(config.soft_stop_timeout)
    except BaseExceptionGroup as group:
        real = [e for e in _leaves(group) if not isinstance(e, cancelled)]
        fatal = [e for e in real if isinstance(e, KeyboardInterrupt | SystemExit)]
        if user_exc is not None:
            internal = [e for e in real if e is not user_exc]
            if internal:
                user_exc.__context__ = BaseExceptionGroup("river_anyio internal errors", internal)
            # raised below, outside this handler, so its __cause__, __context__ and
            # __suppress_context__ stay exactly as the body left them
            reraise = user_exc
        elif fatal:
            raise fatal[0] from None
        elif not real:
            raise
        elif not started and len(real) == 1:
            raise real[0] from None  # a start-up failure is raised as itself
        else:
            raise ClientCrashedError(
                f"a river_anyio service failed: {type(real[0]).__name__}: {real[0]}"
            ) from group
    if reraise is not None:
        raise reraise


async def _run_client_task(
    database: str | Driver, options: dict[str, Any], *, task_status: TaskStatus[ClientRun]
) -> None:
    await run_client(database, task_status=task_status, **options)
