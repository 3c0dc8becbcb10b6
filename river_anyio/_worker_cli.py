"""``river-anyio worker MODULE:ATTR``: work jobs from the command line until a signal stops it.

``ATTR`` names a :class:`~river_anyio.Workers` registry, a complete :class:`~river_anyio.Config`,
or a function taking no arguments that returns either; the current directory is importable, as
with uvicorn and celery. The first SIGTERM or SIGINT begins a graceful stop bounded by
``--soft-stop-timeout`` (``run.stop(timeout)``); a second one cancels the running jobs
(``run.stop_and_cancel()``), which go back to ``available``. Signals are received inside the run
with AnyIO's ``open_signal_receiver``, so the same code stops the client on asyncio and trio.

With ``--health-port PORT`` the worker answers ``GET /health`` on ``--health-host``
(127.0.0.1 by default) with the client's health as JSON: 200 while it is ok, 503 while it is
not (the database unreachable, a queue's claims failing, stopping, or waiting for the database
with ``--wait-for-database``). A few lines of HTTP/1.1 on AnyIO sockets, run inside the
client's run: nothing to install.

Exit codes: 0 after a stop asked for by a signal, 1 when the start fails, the client crashes or
the application's module raises while imported, 2 for usage errors (flags, ``MODULE:ATTR``
that does not name what it should, no database), as argparse does.

Only this command configures logging (a handler on the root logger, unless the application
configured one): the library never installs handlers.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import inspect
import logging
import os
import signal
import sys
import traceback
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, TextIO

import anyio
import attrs

if TYPE_CHECKING:
    from ._config import Config
    from ._runtime._supervisor import ClientRun
    from ._work import Workers

__all__ = ["DEFAULT_MAX_WORKERS", "DatabaseSource", "add_parser", "database_from", "run"]

#: River's QueueConfig has no default MaxWorkers (it must be 1 to 10,000); River's
#: documentation configures ``river.QueueDefault: {MaxWorkers: 100}``, and so does a bare
#: ``--queue NAME`` here.
DEFAULT_MAX_WORKERS = 100
DEFAULT_QUEUE = "default"
LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s"
LOG_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
LOG_LEVELS = ("debug", "info", "warning", "error")
#: The libpq variables shown (never PGPASSWORD) when the database comes from them.
_PG_SHOWN = ("PGHOST", "PGPORT", "PGUSER", "PGDATABASE")

#: Messages about stopping go where the client's own stop messages go.
logger = logging.getLogger("river_anyio.client")


class WorkerUsageError(Exception):
    """A bad flag or ``MODULE:ATTR``: one line on stderr, exit code 2."""


class WorkerError(Exception):
    """The application cannot be loaded (its module raised): one line on stderr, exit code 1."""


# --- the command line -----------------------------------------------------------------------


def add_parser(subparsers: Any) -> None:
    """Add the ``worker`` subcommand to the ``river-anyio`` parser's subparsers."""
    p = subparsers.add_parser(
        "worker",
        help="Work jobs with the workers of MODULE:ATTR until SIGTERM/SIGINT",
        description=(
            "Run a river_anyio client that works jobs until it receives SIGTERM or SIGINT. "
            "MODULE:ATTR names a river_anyio.Workers registry, a river_anyio.Config, or a "
            "function taking no arguments that returns either (the current directory is "
            "importable). The first signal stops gracefully: no new jobs are claimed and "
            "running jobs get --soft-stop-timeout to finish, then are cancelled and made "
            "available again. A second signal cancels them at once. Exit code 0 after a stop "
            "by signal, 1 after a failed start or a crash, 2 for usage errors."
        ),
    )
    p.add_argument(
        "app",
        metavar="MODULE:ATTR",
        type=_app_spec,
        help="e.g. myapp.jobs:workers, myapp.jobs:config or myapp.jobs:make_config",
    )
    p.add_argument(
        "--database-url",
        default=None,
        help="database URL (default: $RIVER_DATABASE_URL, then $DATABASE_URL, then libpq's "
        "PG* variables when PGDATABASE is set)",
    )
    p.add_argument(
        "--queue",
        dest="queues",
        metavar="NAME[=MAX_WORKERS]",
        type=_queue_flag,
        action="append",
        default=None,
        help=f"a queue to work and how many of its jobs to run at once (default "
        f"{DEFAULT_MAX_WORKERS}); repeatable; replaces a Config's queues (default: the "
        f"Config's queues, else {DEFAULT_QUEUE}={DEFAULT_MAX_WORKERS})",
    )
    p.add_argument(
        "--loop",
        choices=("asyncio", "trio"),
        default="asyncio",
        help="event loop to run on (default asyncio; trio needs river_anyio[trio])",
    )
    p.add_argument(
        "--soft-stop-timeout",
        type=_timeout_flag,
        default=None,
        metavar="DURATION",
        help="on the first signal, how long running jobs may take to finish before they are "
        "cancelled, e.g. 30, 30s, 1m30s (default: the Config's soft_stop_timeout; without "
        "one, as long as they take)",
    )
    p.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=None,
        help="log level (default info); logs go to stderr in a readable format, unless the "
        "application configured logging when imported (then its handlers are kept)",
    )
    p.add_argument(
        "--health-port",
        type=_port_flag,
        default=None,
        metavar="PORT",
        help="answer GET /health on this port: 200 and the client's health as JSON while it is "
        "ok, 503 while it is not (0 picks a free port, shown in the start line)",
    )
    p.add_argument(
        "--health-host",
        default="127.0.0.1",
        metavar="HOST",
        help="the address --health-port listens on (default 127.0.0.1; 0.0.0.0 for every "
        "interface, as an orchestrator's probe from outside the container needs)",
    )
    p.add_argument(
        "--wait-for-database",
        action="store_true",
        help="start even while the database cannot be reached: log an error for each "
        "attempt, report 503, and start working as soon as it answers (default: fail at once)",
    )
    p.add_argument(
        "--auto-migrate",
        action="store_true",
        help="apply pending migrations (line main, then line river_anyio) before starting",
    )
    p.set_defaults(worker_parser=p)


def _app_spec(text: str) -> tuple[str, str]:
    module, sep, attr = text.partition(":")
    if not sep or not module or not attr:
        raise argparse.ArgumentTypeError(
            f"expected MODULE:ATTR (e.g. myapp.jobs:workers), got {text!r}"
        )
    if not all(part.isidentifier() for part in module.split(".")) or not all(
        part.isidentifier() for part in attr.split(".")
    ):
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid MODULE:ATTR")
    return module, attr


def _queue_flag(text: str) -> tuple[str, int]:
    from ._config import QUEUE_MAX_WORKERS
    from ._errors import ValidationError
    from ._job import validate_queue_name

    name, sep, count = text.partition("=")
    try:
        validate_queue_name(name, "--queue")
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(exc.rule) from None
    if not sep:
        return name, DEFAULT_MAX_WORKERS
    try:
        max_workers = int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"MAX_WORKERS of queue {name!r} must be an integer, got {count!r}"
        ) from None
    if not 1 <= max_workers <= QUEUE_MAX_WORKERS:
        raise argparse.ArgumentTypeError(
            f"MAX_WORKERS of queue {name!r} must be between 1 and {QUEUE_MAX_WORKERS:,}, "
            f"got {max_workers}"
        )
    return name, max_workers


def _port_flag(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be between 0 and 65535, got {port}")
    return port


def _timeout_flag(text: str) -> float:
    from ._bench import parse_duration

    try:
        return 0.0 if text.strip() in ("0", "0s") else parse_duration(text.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# --- the database ---------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class DatabaseSource:
    """The database to open, what to show for it (password redacted) and where it came from."""

    url: str
    display: str
    source: str


#: The variables the worker reads a database URL from, in order, after ``--database-url``.
URL_VARIABLES = ("RIVER_DATABASE_URL", "DATABASE_URL")


def database_from(
    flag: str | None, environ: Mapping[str, str], *, variables: tuple[str, ...] = URL_VARIABLES
) -> DatabaseSource | None:
    """The database in River's CLI order: ``--database-url``, then the URL ``variables``
    (the worker's: ``RIVER_DATABASE_URL``, ``DATABASE_URL``; none for River's verbs), then
    libpq's ``PG*`` variables (when ``PGDATABASE`` is set, as River's CLI requires); ``None``
    when there is none. Every verb of the command line finds its database here."""
    from .drivers import redact_url

    for source, value in (("--database-url", flag), *((v, environ.get(v)) for v in variables)):
        if value:
            return DatabaseSource(url=value, display=redact_url(value), source=source)
    if environ.get("PGDATABASE"):
        shown = " ".join(f"{name}={environ[name]}" for name in _PG_SHOWN if environ.get(name))
        # an empty URL: libpq reads every PG* variable itself (PGPASSWORD, PGSSLMODE, ...)
        return DatabaseSource(url="postgresql://", display=f"postgresql:// ({shown})", source="PG*")
    return None


# --- loading MODULE:ATTR --------------------------------------------------------------------


#: Frames in these files are not the application's: river_anyio's own, and generated code
#: (``<frozen importlib._bootstrap>``, attrs' ``<attrs generated ...>``).
_NOT_APP = (os.path.dirname(os.path.abspath(__file__)) + os.sep, "<")


def _where(exc: BaseException) -> str:
    """`` (file:line)`` of the innermost frame of the application an exception passed through."""
    frames = traceback.extract_tb(exc.__traceback__)
    app = [f for f in frames if not f.filename.startswith(_NOT_APP)]
    if not app:
        return ""
    frame = app[-1]
    cwd = os.getcwd() + os.sep
    return f" ({frame.filename.removeprefix(cwd)}:{frame.lineno})"


def _describe(exc: BaseException) -> str:
    """One line for an exception the application raised, URL passwords redacted."""
    from .drivers import redact_url

    words = str(exc).split()
    text = " ".join(redact_url(w) if "://" in w else w for w in words)
    return f"{type(exc).__name__}: {text}{_where(exc)}"


def load_app(module_name: str, attr: str) -> Workers | Config:
    """The Workers or Config ``module_name:attr`` names (calling it if it is a function).

    Raises:
        WorkerUsageError: The module is not found, has no such attribute, or it names
            something else.
        WorkerError: Importing the module, or calling the function, raised.
    """
    from ._config import Config
    from ._work import Workers

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    spec = f"{module_name}:{attr}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == module_name or module_name.startswith(missing + "."):
            raise WorkerUsageError(
                f"module {module_name!r} not found (looked in the current directory "
                f"{cwd} and on sys.path)"
            ) from None
        raise WorkerError(f"importing module {module_name!r} failed: {_describe(exc)}") from None
    except Exception as exc:
        raise WorkerError(f"importing module {module_name!r} failed: {_describe(exc)}") from None
    value: Any = module
    for i, part in enumerate(attr.split(".")):
        try:
            value = getattr(value, part)
        except AttributeError:
            owner = ".".join([module_name, *attr.split(".")[:i]])
            raise WorkerUsageError(f"{owner!r} has no attribute {part!r}") from None
    if isinstance(value, Workers | Config):
        return value
    if callable(value) and not isinstance(value, type):
        try:
            inspect.signature(value).bind()
        except TypeError:
            raise WorkerUsageError(f"{spec} must be callable with no arguments") from None
        except ValueError:
            pass  # no signature to check (a builtin): calling it tells
        try:
            result = value()
        except Exception as exc:
            raise WorkerError(f"{spec}() raised {_describe(exc)}") from None
        if isinstance(result, Workers | Config):
            return result
        raise WorkerUsageError(
            f"{spec}() returned {type(result).__name__}, not a river_anyio.Workers or "
            "river_anyio.Config"
        )
    raise WorkerUsageError(
        f"{spec} is {_type_name(value)}, not a river_anyio.Workers, a river_anyio.Config or a "
        "function returning one"
    )


def _type_name(value: object) -> str:
    if isinstance(value, type):
        return f"the class {value.__name__}"
    name = type(value).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def worker_config(
    app: Workers | Config,
    queues: list[tuple[str, int]] | None,
    soft_stop_timeout: float | None,
) -> Config:
    """The client's configuration: ``app`` as a Config, the flags applied over it."""
    from ._config import Config, QueueConfig
    from ._errors import ConfigError

    config = app if isinstance(app, Config) else Config(workers=app)
    if len(config.workers) == 0:
        raise WorkerUsageError("no workers are registered: register at least one job kind")
    changes: dict[str, Any] = {}
    if queues is not None:
        names = [name for name, _ in queues]
        for name in names:
            if names.count(name) > 1:
                raise WorkerUsageError(f"--queue {name} is given more than once")
        changes["queues"] = {name: QueueConfig(max_workers=n) for name, n in queues}
    elif not config.queues:
        changes["queues"] = {DEFAULT_QUEUE: QueueConfig(max_workers=DEFAULT_MAX_WORKERS)}
    if soft_stop_timeout is not None:
        changes["soft_stop_timeout"] = soft_stop_timeout
    try:
        return attrs.evolve(config, **changes)
    except ConfigError as exc:
        raise WorkerUsageError(str(exc)) from None


# --- running --------------------------------------------------------------------------------


def configure_logging(level: str | None) -> None:
    """A readable stderr handler on the root logger at ``level`` (default info), unless the
    application configured logging when it was imported: then only an explicit ``level`` is
    applied (to the root logger) and its handlers are left as they are."""
    root = logging.root
    if root.handlers:
        if level is not None:
            root.setLevel(getattr(logging, level.upper()))
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, LOG_DATE_FORMAT))
    root.addHandler(handler)
    root.setLevel(getattr(logging, (level or "info").upper()))


def _format_timeout(timeout: float | None) -> str:
    return "none" if timeout is None else f"{timeout:g}s"


def start_line(run: ClientRun, database: DatabaseSource, loop: str) -> str:
    """The one line printed once the client works its queues (or, with
    ``--wait-for-database``, once it waits for its database)."""
    config = run.config
    queues = ",".join(f"{name}:{q.max_workers}" for name, q in sorted(config.queues.items()))
    line = (
        f"river-anyio worker started: queues={queues} kinds={','.join(config.workers.kinds())} "
        f"database={database.display} loop={loop} "
        f"soft_stop_timeout={_format_timeout(config.soft_stop_timeout)} "
        f"client_id={run.client.id}"
    )
    listen = getattr(config, "health_listen", None)
    if listen is not None and run.health_port is not None:
        host = f"[{listen[0]}]" if ":" in listen[0] else listen[0]
        line += f" health=http://{host}:{run.health_port}/health"
    return line


@attrs.define(eq=False)
class _Stopper:
    """What each signal does: the first before the start aborts it; the first after it is a
    graceful stop, the second a stop-and-cancel; later ones are only logged."""

    abort: anyio.CancelScope
    timeout: float | None
    run: ClientRun | None = None
    received: int = 0

    def signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        self.received += 1
        if self.run is None:
            logger.info(
                "%s received before the client started: not starting",
                name,
                extra=self._extra(name, "abort_start"),
            )
            self.abort.cancel(f"{name} before the client started")
        elif self.received == 1:
            logger.info(
                "%s received: stopping; running jobs have %s to finish (SIGTERM or SIGINT "
                "again cancels them)",
                name,
                "as long as they take" if self.timeout is None else f"{self.timeout:g}s",
                extra=self._extra(name, "stop"),
            )
            self.run.stop(self.timeout)
        elif self.received == 2:
            logger.info(
                "%s received again: cancelling running jobs",
                name,
                extra=self._extra(name, "stop_and_cancel"),
            )
            self.run.stop_and_cancel()
        else:
            logger.info(
                "%s received: already cancelling running jobs",
                name,
                extra=self._extra(name, "none"),
            )

    def _extra(self, signal_name: str, action: str) -> dict[str, object]:
        """A signal's record: ``river_event`` "worker_signal", the signal and what it did."""
        from ._logging import client_extra

        client_id = self.run.client.id if self.run is not None else None
        return {
            **client_extra("worker_signal", client_id),
            "river_signal": signal_name,
            "river_action": action,
        }


async def _watch_signals(signals: AsyncIterator[int], stopper: _Stopper) -> None:
    async for signum in signals:
        stopper.signal(signum)


async def serve(
    database: DatabaseSource,
    config: Config,
    *,
    loop: str,
    auto_migrate: bool,
    out: TextIO,
    health_listen: tuple[str, int] | None = None,
) -> None:
    """Migrate (if asked), run the client and stop it on signals; with ``health_listen``,
    the run answers ``GET /health`` there."""
    from ._config import client_config
    from ._runtime._entry import open_client

    if health_listen is not None:
        config = attrs.evolve(client_config(config, {}), health_listen=health_listen)

    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with anyio.create_task_group() as tg:
            stopper = _Stopper(abort=tg.cancel_scope, timeout=config.soft_stop_timeout)
            tg.start_soon(_watch_signals, signals, stopper, name="river worker signals")
            if auto_migrate:
                config = attrs.evolve(config, auto_migrate=True)
            async with open_client(database.url, config) as run:
                stopper.run = run
                print(start_line(run, database, loop), file=out, flush=True)
                await run.wait()
            tg.cancel_scope.cancel("the client stopped")


def _unwrap(exc: BaseException) -> BaseException:
    """The one real failure inside the worker's task group (the signal task never fails)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def run(
    args: argparse.Namespace,
    *,
    out: TextIO,
    err: TextIO,
    driver_options: Mapping[str, Any] | None = None,
    driver_options_reason: str = "",
) -> int:
    """Run ``river-anyio worker`` with parsed ``args``; returns the exit code. Usage errors
    go through the subcommand's parser (exit 2); other failures raise to the CLI's handler.

    ``driver_options``: what a command embedding the worker requires of the driver (Django's
    ``river_worker``: its ``sqlite_module``), added to the application's Config; a Config
    that sets one of them otherwise is a usage error naming ``driver_options_reason``."""
    parser: argparse.ArgumentParser = args.worker_parser
    try:
        database = database_from(args.database_url, os.environ)
        if database is None:
            raise WorkerUsageError(
                "no database: pass --database-url, or set RIVER_DATABASE_URL, DATABASE_URL or "
                "libpq's PG* variables (at least PGDATABASE)"
            )
        _check_url(database)
        if args.loop == "trio" and importlib.util.find_spec("trio") is None:
            raise WorkerUsageError("--loop trio needs trio: pip install 'river_anyio[trio]'")
        app = load_app(*args.app)
        config = worker_config(app, args.queues, args.soft_stop_timeout)
        if driver_options:
            config = _with_driver_options(config, driver_options, driver_options_reason)
        auto_migrate = args.auto_migrate
        if args.wait_for_database:
            # migrated by the client once the database answers, not before it starts
            config = attrs.evolve(config, wait_for_database=True, auto_migrate=auto_migrate)
            auto_migrate = False
        if not args.health_host:
            raise WorkerUsageError("--health-host must not be empty")
    except WorkerUsageError as exc:
        parser.error(str(exc))
    except WorkerError as exc:
        print(f"river-anyio: error: {exc}", file=err)
        return 1
    configure_logging(args.log_level)
    try:
        anyio.run(
            functools.partial(
                serve,
                database,
                config,
                loop=args.loop,
                auto_migrate=auto_migrate,
                out=out,
                health_listen=None
                if args.health_port is None
                else (args.health_host, args.health_port),
            ),
            backend=args.loop,
        )
    except BaseExceptionGroup as group:
        raise _unwrap(group) from None
    return 0


def _with_driver_options(config: Config, required: Mapping[str, Any], reason: str) -> Config:
    own = dict(config.driver_options)
    for name, value in required.items():
        if name in own and own[name] is not value:
            raise WorkerUsageError(
                f"the Config's driver_options[{name!r}] is {own[name]!r}, but this command "
                f"opens the database with {value!r}: {reason}"
            )
    return attrs.evolve(config, driver_options={**own, **required})


def _check_url(database: DatabaseSource) -> None:
    from ._errors import ConfigError
    from .drivers import dialect_of_url

    try:
        dialect_of_url(database.url)
    except ConfigError as exc:
        raise WorkerUsageError(f"{database.source}: {exc.rule}") from None
