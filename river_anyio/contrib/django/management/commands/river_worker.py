"""``manage.py river_worker``: ``river-anyio worker`` with its defaults from ``RIVER_ANYIO``."""

from __future__ import annotations

import argparse
import os
from typing import Any, ClassVar

from django.core.management.base import BaseCommand, CommandError, CommandParser

from river_anyio._errors import RiverError
from river_anyio._worker_cli import LOG_LEVELS, _app_spec, _queue_flag, _timeout_flag, run
from river_anyio.drivers import redact_url

from ._common import settings_or_error, text_stream


class _Usage:
    """The ``parser.error`` the worker machinery calls for a usage error: exit code 2."""

    def error(self, message: str) -> None:
        raise CommandError(redact_url(message), returncode=2)


class Command(BaseCommand):  # type: ignore[misc]
    help = (
        "Work River jobs until SIGTERM or SIGINT, as `river-anyio worker` does, with the "
        "database, workers, queues, loop and soft stop timeout of settings.RIVER_ANYIO "
        "(flags override them). The first signal stops gracefully (running jobs get the soft "
        "stop timeout to finish); a second cancels them. Exit code 0 after a stop by signal."
    )
    # the worker opens its own connections: Django's checks of the project's connections are
    # not its concern
    requires_system_checks: ClassVar[list[str]] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "app",
            nargs="?",
            type=_app_spec,
            metavar="MODULE:ATTR",
            help="a river_anyio.Workers, a river_anyio.Config or a function returning one "
            "(default: RIVER_ANYIO['WORKERS'])",
        )
        parser.add_argument(
            "--queue",
            dest="queues",
            metavar="NAME[=MAX_WORKERS]",
            type=_queue_flag,
            action="append",
            default=None,
            help="a queue to work, repeatable; replaces RIVER_ANYIO['QUEUES'] (default: those, "
            "else the Config's queues, else default=100)",
        )
        parser.add_argument(
            "--loop",
            choices=("asyncio", "trio"),
            default=None,
            help="event loop (default: RIVER_ANYIO['LOOP'], else asyncio)",
        )
        parser.add_argument(
            "--soft-stop-timeout",
            type=_timeout_flag,
            default=None,
            metavar="DURATION",
            help="how long running jobs may take to finish after the first signal, e.g. 30s "
            "(default: RIVER_ANYIO['SOFT_STOP_TIMEOUT'], else the Config's, else unbounded)",
        )
        parser.add_argument(
            "--log-level",
            choices=LOG_LEVELS,
            default=None,
            help="log level (default info), unless LOGGING configured the root logger",
        )
        parser.add_argument(
            "--auto-migrate",
            action="store_true",
            help="apply River's pending migrations before starting",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        config, url = settings_or_error()
        app = options["app"] or config.workers
        if app is None:
            raise CommandError(
                "no workers: pass MODULE:ATTR or set RIVER_ANYIO['WORKERS'] "
                "(e.g. 'shop.jobs:workers')",
                returncode=2,
            )
        # When River's SQLite file is also a DATABASES entry, jobs using the ORM open it with
        # Django's sqlite3 module: the client does too, so that the process holds one SQLite
        # library on the file (two break each other's locks).
        driver_options: dict[str, Any] = {}
        reason = ""
        shared = _shared_sqlite_aliases(url)
        if shared:
            from django.db import connections

            driver_options["sqlite_module"] = connections[shared[0]].Database
            reason = (
                f"River's SQLite file is also DATABASES {', '.join(map(repr, shared))}, which "
                "jobs may open with Django's sqlite3 module, and two SQLite libraries on one "
                "file in one process break each other's locks"
            )
        queues = options["queues"]
        if queues is None and config.queues is not None:
            queues = list(config.queues)
        timeout = options["soft_stop_timeout"]
        namespace = argparse.Namespace(
            app=app,
            database_url=url,
            queues=queues,
            loop=options["loop"] or config.loop,
            soft_stop_timeout=config.soft_stop_timeout if timeout is None else timeout,
            log_level=options["log_level"],
            auto_migrate=options["auto_migrate"],
            wait_for_database=False,
            health_host="127.0.0.1",
            health_port=None,
            worker_parser=_Usage(),
        )
        try:
            code = run(
                namespace,
                out=text_stream(self.stdout),
                err=text_stream(self.stderr),
                driver_options=driver_options,
                driver_options_reason=reason,
            )
        except CommandError:
            raise
        except RiverError as exc:
            raise CommandError(redact_url(str(exc)), returncode=1) from None
        except Exception as exc:  # one line, never a traceback with a URL in it
            raise CommandError(
                f"{type(exc).__name__}: {redact_url(str(exc))}", returncode=1
            ) from None
        if code:
            raise CommandError("the worker failed", returncode=code)


def _shared_sqlite_aliases(url: str) -> list[str]:
    """The ``DATABASES`` aliases on the SQLite file the worker opens (none on PostgreSQL)."""
    from django.db import connections

    from river_anyio.drivers import dialect_of_url

    if dialect_of_url(url) != "sqlite":
        return []
    from river_anyio.drivers.sqlite import path_from_url

    path = os.path.realpath(path_from_url(url))
    return [
        alias
        for alias in connections
        if connections[alias].vendor == "sqlite"
        and os.path.realpath(os.fspath(connections[alias].settings_dict.get("NAME") or "")) == path
    ]
