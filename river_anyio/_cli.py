"""The ``river-anyio`` command line: River's verbs and flags (migrations, bench), plus a demo.

``main(argv)`` returns the exit code: 0 on success, 1 when ``validate`` finds missing
migrations, 2 on a usage error and 1 on any other error, reported as one line on stderr.
No output path prints a database password: every message goes through ``redact_url``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import shlex
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, TextIO

import anyio

from . import _worker_cli
from ._errors import RiverError
from ._version import __version__
from .drivers import Driver, dialect_of_url, open_driver, redact_secrets, redact_url
from .migrate import LINE_MAIN, MigrateResult, Migrator, all_migrations, migration_sql
from .migrate._migrator import Direction

PROG = "river-anyio"

_DESCRIPTION = """\
Command line facilities for river_anyio, River's job queue for Python.

Commands that use a database take --database-url. Without it they fall back, as River's CLI
does, to PostgreSQL settings in libpq's environment variables (PGHOST, PGPORT, PGDATABASE,
PGUSER, PGPASSWORD, PGSSLMODE, ...): PGDATABASE at least must be set. --database-url wins
over the PG* variables when both are given.

--statement-timeout sets PostgreSQL's statement_timeout for the commands' own sessions. The
flag wins over a statement_timeout query parameter in --database-url, which wins over the
default of 10s. SQLite ignores it.
"""

_URL_FORMS = """\
database URLs:
  postgres://user:password@host:5432/dbname   (or postgresql://; libpq's URL syntax)
  host=localhost user=app dbname=app          (a libpq key/value string)
  sqlite://river.db, sqlite:river.db          (a file relative to the current directory)
  sqlite:///var/lib/app/river.db              (an absolute path; also sqlite:/var/lib/...)
"""

#: River's CLI default for statement_timeout on its own PostgreSQL sessions.
_STATEMENT_TIMEOUT_DEFAULT = "10s"
_APPLICATION_NAME = "river-anyio CLI"


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's default exits; we want one line + code 2
        raise _UsageError(message)


def _int_list(text: str) -> list[int]:
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _duration(text: str) -> float:
    from ._bench import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _global_flags(parser: argparse.ArgumentParser, *, root: bool) -> None:
    """River's persistent flags, accepted before or after the verb. On the verbs they default
    to SUPPRESS, so a flag given before the verb is not reset by the verb's parser."""

    def default(value: object) -> object:
        return value if root else argparse.SUPPRESS

    group = parser.add_argument_group("global options")
    loudness = group.add_mutually_exclusive_group()
    loudness.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default(False),
        help="log more: river_anyio's info-level messages go to stderr",
    )
    loudness.add_argument(
        "--debug",
        action="store_true",
        default=default(False),
        help="log everything: debug-level messages go to stderr",
    )
    group.add_argument(
        "--statement-timeout",
        type=_duration,
        default=default(None),
        metavar="DURATION",
        help="PostgreSQL statement_timeout for this command's sessions, more than 1ms (e.g. "
        "500ms, 10s, 1m); wins over a statement_timeout parameter in --database-url; "
        "default 10s; ignored on SQLite",
    )


def _build_parser() -> _Parser:
    parser = _Parser(
        prog=PROG,
        description=_DESCRIPTION,
        epilog=_URL_FORMS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="store_true", help="print version information")
    _global_flags(parser, root=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def verb(name: str, summary: str, details: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=summary,
            description=f"{summary}.\n\n{textwrap.fill(details, 78)}",
            epilog=_URL_FORMS,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _global_flags(p, root=False)
        return p

    def database_url(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--database-url",
            metavar="URL",
            help="the database: a postgres:// URL, a libpq key/value string or a sqlite: URL "
            "(see below); default: the PG* environment variables",
        )

    def schema(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--schema",
            help="the non-default schema River's tables are in (PostgreSQL: a schema; SQLite: "
            "the name of an attached database)",
        )

    def line(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--line", default=None, help="the migration line to operate on (default: main)"
        )

    migrate_details = {
        "migrate-up": "Applies every up migration not yet applied, unless --max-steps or "
        "--target-version stop earlier. --show-sql prints each migration's SQL and --dry-run "
        "applies nothing; together they print what would be run.",
        "migrate-down": "Reverses one migration, unless --max-steps or --target-version ask for "
        "more (--target-version 0 removes River's schema entirely). --show-sql prints each "
        "migration's SQL and --dry-run applies nothing; together they print what would be run.",
    }
    for name, summary in (
        ("migrate-up", "Run River schema up migrations"),
        ("migrate-down", "Run River schema down migrations"),
    ):
        p = verb(name, summary, migrate_details[name])
        database_url(p)
        schema(p)
        line(p)
        p.add_argument(
            "--dry-run", action="store_true", help="print the migrations, but apply none of them"
        )
        p.add_argument(
            "--max-steps",
            type=int,
            default=None,
            metavar="N",
            help="apply at most N migrations",
        )
        p.add_argument(
            "--show-sql", action="store_true", help="print the SQL of each migration as well"
        )
        p.add_argument(
            "--target-version",
            type=int,
            default=None,
            metavar="VERSION",
            help="the version to end at: the schema includes it and none after it; migrating "
            "down, 0 applies every down migration",
        )

    p = verb(
        "migrate-get",
        "Get SQL for specific River migrations",
        "Prints migrations' SQL, for applying River's schema with another migration tool. "
        "Choose --version (comma-separated or repeated) or --all, and --up or --down; "
        "--exclude-version 1 leaves out River's own river_migration table. PostgreSQL's SQL "
        "unless --database-url hints another kind of database (sqlite:// is enough). It "
        "opens no database.",
    )
    p.add_argument(
        "--database-url",
        default="postgres://",
        metavar="URL",
        help="used only as a hint of the kind of database (default: postgres://)",
    )
    p.add_argument("--schema", help="the schema to qualify the printed SQL's names with")
    line(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--all", action="store_true", help="print all migrations (down ones in descending order)"
    )
    which.add_argument(
        "--version",
        dest="versions",
        type=_int_list,
        action="append",
        metavar="VERSIONS",
        help="the version(s) to print, comma-separated or the flag repeated",
    )
    p.add_argument(
        "--exclude-version",
        type=_int_list,
        action="append",
        default=[],
        metavar="VERSIONS",
        help="version(s) to leave out, usually 1 (River's migration table)",
    )
    direction = p.add_mutually_exclusive_group(required=True)
    direction.add_argument("--up", action="store_true", help="print up migrations")
    direction.add_argument("--down", action="store_true", help="print down migrations")

    p = verb(
        "migrate-list",
        "List River schema migrations",
        "Lists the line's migrations, marking with * the latest one applied to the database. "
        "It only reads: a SQLite file that does not exist is an error, not created.",
    )
    database_url(p)
    schema(p)
    line(p)

    p = verb(
        "validate",
        "Validate River schema",
        "Exits with status 1, naming them, when migrations are still to be applied; 0 when the "
        "schema is current. Pair it with migrate-up --dry-run --show-sql to see their SQL. It "
        "only reads: a SQLite file that does not exist is an error, not created.",
    )
    database_url(p)
    schema(p)
    line(p)

    verb("version", "Print version information", "Prints river_anyio's and Python's versions.")

    p = verb(
        "bench",
        "Run River's benchmark: insert and work no-op jobs",
        "Inserts and works no-op jobs and reports jobs per second and latency percentiles. "
        "-n inserts that many jobs first and times their drain; --duration with --rate works "
        "for that long while --rate jobs a second are inserted (by this client, or with "
        "--inserter process by a separate process; one by one, in bursts or with insert_many: "
        "--insert) and reports enqueue-to-start percentiles and the insert rate achieved; "
        "--duration alone keeps a backlog topped up as River's bench does. Every job in the "
        "database is deleted first, so a --database-url (or the PG* variables) needs --yes; "
        "without either, a temporary SQLite file is used.",
    )
    database_url(p)
    schema(p)
    p.add_argument(
        "--duration",
        type=_duration,
        default=None,
        help="how long to work jobs, e.g. 30s or 1m30s (instead of -n)",
    )
    p.add_argument(
        "-n",
        "--num-total-jobs",
        type=int,
        default=None,
        metavar="N",
        help="insert N jobs before the client starts, then work them all down (default 20000)",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="with --duration: insert this many jobs a second while working",
    )
    p.add_argument(
        "--inserter",
        choices=("client", "process"),
        default="client",
        help="with --rate: who inserts, the working client itself (default) or a separate "
        "process with its own client on the same database",
    )
    p.add_argument(
        "--insert",
        choices=("one", "burst", "many"),
        default="one",
        help="with --rate: how jobs are inserted: one insert per job, up to 16 at once "
        "(default); burst, every K/rate seconds K inserts started at once; many, every K/rate "
        "seconds one insert_many of K jobs (K is --insert-size)",
    )
    p.add_argument(
        "--insert-size",
        type=int,
        default=None,
        metavar="K",
        help="jobs a burst or an insert_many inserts (default 10; --insert one is always 1)",
    )
    p.add_argument(
        "--in-flight",
        type=int,
        default=None,
        metavar="L",
        help="with --rate: insert calls (bursts, for --insert burst) in flight at most, 1 to 100; "
        "default 16 calls, at least two bursts. 1 makes each call wait for the one before, as "
        "the peers' benchmarks insert: a late call then delays the next one's start instead "
        "of running beside it",
    )
    p.add_argument(
        "--backlog",
        type=int,
        default=None,
        metavar="N",
        help="--duration without --rate: keep this many jobs waiting (default River's 75000)",
    )
    p.add_argument(
        "--loop",
        choices=("asyncio", "trio"),
        default="asyncio",
        help="the event loop to run on (default: asyncio; trio needs river_anyio[trio])",
    )
    p.add_argument(
        "--max-workers",
        type=int,
        default=50,
        metavar="N",
        help="jobs worked at once by the benchmark's client (default: 50)",
    )
    p.add_argument(
        "--fetch-cooldown",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the client's fetch cooldown, its guard against notification storms "
        "(default: River's 0.1; River's bench uses 0.002)",
    )
    p.add_argument(
        "--claim-ahead",
        action="store_true",
        help="claim rows ahead of free worker slots while a backlog of quick jobs lasts "
        "(the client's claim_ahead; default: only for free slots, as River)",
    )
    p.add_argument(
        "--fetch-poll-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the client's fetch when no notification came (default: River's 1)",
    )
    p.add_argument(
        "--yes", action="store_true", help="confirm that every job in the database may be deleted"
    )

    p = verb(
        "demo",
        "Run a small demo workload on an embedded SQLite database",
        "Migrates a database, inserts jobs of three kinds and works them. Some outcomes are "
        "deliberate: one job fails once and is retried, one snoozes, one cancels itself and a "
        "duplicate unique job is skipped. Without --database-url it uses a temporary SQLite "
        "file, deleted afterwards; an existing database needs --yes.",
    )
    p.add_argument(
        "--database-url",
        default=None,
        metavar="URL",
        help="the database to use (default: a temporary SQLite file)",
    )
    p.add_argument(
        "--jobs", type=int, default=1000, metavar="N", help="how many email jobs to insert"
    )
    p.add_argument(
        "--loop",
        choices=("asyncio", "trio"),
        default="asyncio",
        help="the event loop to run on (default: asyncio; trio needs river_anyio[trio])",
    )
    p.add_argument(
        "--yes",
        action="store_true",
        help="confirm that the demo may add jobs to an existing database",
    )
    _worker_cli.add_parser(sub)
    return parser


def _format_duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f}s"
    if seconds >= 0.001:
        return f"{seconds * 1000:.2f}ms"
    return f"{seconds * 1_000_000:.2f}µs"


def _print_result(out: TextIO, args: argparse.Namespace, res: MigrateResult, line: str) -> None:
    if not res.versions:
        print("no migrations to apply", file=out)
        return
    width = max(len(v.name) for v in res.versions)
    for v in res.versions:
        if args.dry_run:
            print(f"migration {v.version:03d} [{res.direction}] [DRY RUN]", file=out)
        else:
            print(
                f"applied migration {v.version:03d} [{res.direction}] {v.name:<{width}} "
                f"[{_format_duration(v.duration)}]",
                file=out,
            )
        if args.show_sql:
            print("-" * 80, file=out)
            print(f"-- River {line} migration {v.version:03d} [{res.direction}]", file=out)
            print(v.sql.strip() + "\n", file=out)
    if args.max_steps and len(res.versions) < args.max_steps:
        print("no more migrations to apply", file=out)


class _Target:
    """The database a command works on: the string the driver opens, and how to name it."""

    def __init__(self, url: str, label: str, *, from_env: bool) -> None:
        self.url = url
        self.label = label  # redacted
        self.from_env = from_env


def _target(args: argparse.Namespace, *, required: bool = True) -> _Target | None:
    """--database-url, else River's PG* fallback (PGDATABASE must be set), with River's
    PostgreSQL session settings (statement_timeout, application_name) applied."""
    source = _worker_cli.database_from(args.database_url, os.environ, variables=())
    if source is None:
        if required:
            raise _UsageError("either PG* environment variables or --database-url must be set")
        return None
    from_env = source.source == "PG*"
    url = "" if from_env else source.url
    dialect = "postgres" if from_env else dialect_of_url(url)
    label = "the database of the PG* environment variables" if from_env else source.display
    if dialect == "postgres":
        from .drivers.postgres import cli_conninfo

        timeout = args.statement_timeout
        url = cli_conninfo(
            url,
            statement_timeout_ms=None if timeout is None else round(timeout * 1000),
            default_statement_timeout=_STATEMENT_TIMEOUT_DEFAULT,
            application_name=_APPLICATION_NAME,
        )
    return _Target(url, label, from_env=from_env)


def _require_existing_sqlite(target: _Target, command: str) -> None:
    """Read-only verbs must not create a SQLite file (opening one creates it)."""
    if target.from_env or dialect_of_url(target.url) != "sqlite":
        return
    from .drivers.sqlite import path_from_url

    path = path_from_url(target.url)
    if path != ":memory:" and not os.path.exists(path):
        raise _CommandError(
            f"no SQLite database at {path} ({command} does not create one; "
            f"create it with: {PROG} migrate-up --database-url {shlex.quote(target.label)})"
        )


class _CommandError(Exception):
    """A one-line error (exit 1) that needs no exception type in front of it."""


@contextlib.asynccontextmanager
async def _driver(target: _Target, schema: str | None) -> AsyncIterator[Driver]:
    async with open_driver(target.url, schema=schema or None) as driver:
        yield driver


async def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    line = args.line or LINE_MAIN
    if args.command == "migrate-get":
        dialect = dialect_of_url(args.database_url)
        direction: Direction = "down" if args.down else "up"
        if args.all:
            versions = [m.version for m in all_migrations(dialect, line)]
            if direction == "down":
                versions.reverse()
        else:
            versions = [v for group in args.versions for v in group]
        excluded = {v for group in args.exclude_version for v in group}
        chunks = []
        for migration, sql in migration_sql(
            dialect, versions, direction, schema=args.schema, line=line
        ):
            if migration.version in excluded:
                continue
            chunks.append(
                f"-- River {line} migration {migration.version:03d} [{direction}]\n{sql.strip()}\n"
            )
        out.write("\n".join(chunks))
        return 0

    target = _target(args)
    assert target is not None
    if args.command in ("migrate-list", "validate"):
        _require_existing_sqlite(target, args.command)
    async with _driver(target, args.schema) as driver:
        migrator = Migrator(driver, line=line)
        if args.command in ("migrate-up", "migrate-down"):
            res = await migrator.migrate(
                "up" if args.command == "migrate-up" else "down",
                target_version=args.target_version,
                max_steps=args.max_steps,
                dry_run=args.dry_run,
            )
            _print_result(out, args, res, line)
            return 0
        if args.command == "migrate-list":
            existing = await migrator.existing_versions()
            current = existing[-1].version if existing else 0
            for m in migrator.all_versions():
                prefix = "* " if m.version == current else ("  " if current else "")
                print(f"{prefix}{m.version:03d} {m.name}", file=out)
            return 0
        if args.command == "validate":
            result = await migrator.validate()
            for message in result.messages:
                print(message, file=err)
            return 0 if result.ok else 1
    raise _UsageError(f"unknown command {args.command!r}")


class _RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact_url(super().format(record))


@contextlib.contextmanager
def _logging(args: argparse.Namespace, err: TextIO) -> Iterator[None]:
    """River's levels: warnings by default, info with -v, everything with --debug; on stderr,
    so stdout stays the command's output (migrate-get's SQL can be redirected to a file)."""
    level = logging.DEBUG if args.debug else logging.INFO if args.verbose else logging.WARNING
    handler = logging.StreamHandler(err)
    handler.setFormatter(_RedactingFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    logger = logging.getLogger("river_anyio")
    saved = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)


def _bench(args: argparse.Namespace, out: TextIO) -> int:
    from ._bench import BACKLOG, run_bench

    if args.duration is not None and args.num_total_jobs is not None:
        raise _UsageError("use either --duration or --num-total-jobs, not both")
    if args.num_total_jobs is not None and args.num_total_jobs < 1:
        raise _UsageError("--num-total-jobs must be at least 1")
    if args.rate is not None and (args.duration is None or args.rate <= 0):
        raise _UsageError("--rate needs --duration and must be positive")
    if not 1 <= args.max_workers <= 10_000:
        raise _UsageError("--max-workers must be between 1 and 10000")
    if args.inserter == "process" and args.rate is None:
        raise _UsageError("--inserter process needs --rate and --duration")
    if args.backlog is not None and (args.duration is None or args.rate is not None):
        raise _UsageError("--backlog is for --duration without --rate")
    if args.backlog is not None and args.backlog < 1:
        raise _UsageError("--backlog must be at least 1")
    for flag in ("fetch_cooldown", "fetch_poll_interval"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise _UsageError(f"--{flag.replace('_', '-')} must be positive")
    target = _target(args, required=False)
    try:
        return run_bench(
            database_url=None if target is None else target.url,
            label=None if target is None else target.label,
            schema=args.schema or None,
            total=args.num_total_jobs,
            duration=args.duration,
            rate=args.rate,
            max_workers=args.max_workers,
            loop=args.loop,
            yes=args.yes,
            fetch_cooldown=args.fetch_cooldown,
            fetch_poll_interval=args.fetch_poll_interval,
            claim_ahead=args.claim_ahead,
            inserter=args.inserter,
            insert=args.insert,
            insert_size=args.insert_size,
            in_flight=args.in_flight,
            backlog=BACKLOG if args.backlog is None else args.backlog,
            out=out,
        )
    except RiverError:
        raise
    except ValueError as exc:
        raise _UsageError(str(exc)) from None


def main(
    argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run the command line; returns the process exit code."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        if args.verbose and args.debug:
            raise _UsageError("--debug and --verbose are mutually exclusive")
        if args.statement_timeout is not None and args.statement_timeout <= 0.001:
            raise _UsageError("--statement-timeout must be greater than 1ms when set")
        if args.command == "worker":  # it configures logging itself (--log-level)
            return _worker_cli.run(args, out=out, err=err)
        with _logging(args, err):
            if (args.version and args.command is None) or args.command == "version":
                print(f"{PROG} version {__version__}", file=out)
                print(f"Built with Python {platform.python_version()}", file=out)
                return 0
            if args.command is None:
                parser.print_help(out)
                return 2
            if args.command == "bench":
                return _bench(args, out)
            if args.command == "demo":
                from ._demo import run_demo

                try:
                    return run_demo(
                        database_url=args.database_url,
                        jobs=args.jobs,
                        loop=args.loop,
                        yes=args.yes,
                        out=out,
                    )
                except RiverError:
                    raise
                except ValueError as exc:
                    raise _UsageError(str(exc)) from None
            return anyio.run(_run, args, out, err)
    except _UsageError as exc:
        print(f"{PROG}: error: {_one_line(str(exc), argv)}", file=err)
        return 2
    except (RiverError, _CommandError) as exc:
        print(f"{PROG}: error: {_one_line(str(exc), argv)}", file=err)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one line, never a traceback with a URL in it
        print(f"{PROG}: error: {type(exc).__name__}: {_one_line(str(exc), argv)}", file=err)
        return 1


def _one_line(text: str, argv: Sequence[str] | None) -> str:
    """One line, with any password of a connection string in the arguments (or one that
    slipped into the message) replaced by ``***``."""
    for arg in sys.argv[1:] if argv is None else argv:
        text = redact_secrets(text, arg)
    return " ".join(redact_url(text).split())
