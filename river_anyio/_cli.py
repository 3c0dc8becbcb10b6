"""The ``river-anyio`` command line: River's migration verbs and flags, plus a demo.

``main(argv)`` returns the exit code: 0 on success, 1 when ``validate`` finds missing
migrations, 2 on a usage error and 1 on any other error, reported as one line on stderr.
Passwords in database URLs are never printed.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import anyio

from . import _worker_cli
from ._errors import RiverError
from ._version import __version__
from .drivers import dialect_of_url, open_driver, redact_url
from .migrate import LINE_MAIN, MigrateResult, Migrator, all_migrations, migration_sql
from .migrate._migrator import Direction

PROG = "river-anyio"


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


def _build_parser() -> _Parser:
    parser = _Parser(
        prog=PROG,
        description="Command line facilities for river_anyio, River's job queue for Python.",
    )
    parser.add_argument("--version", action="store_true", help="print version information")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def db(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--database-url",
            help="database URL: postgres://..., postgresql://... or sqlite:///path",
        )
        p.add_argument(
            "--schema", help="name of non-default database schema where River tables are located"
        )
        p.add_argument("--line", default=None, help="migration line to operate on (default: main)")

    for name, help_text in (
        ("migrate-up", "Run River schema up migrations"),
        ("migrate-down", "Run River schema down migrations"),
    ):
        p = sub.add_parser(name, help=help_text, description=help_text)
        db(p)
        p.add_argument("--dry-run", action="store_true", help="print migrations, don't apply them")
        p.add_argument(
            "--max-steps", type=int, default=None, help="maximum number of steps to migrate"
        )
        p.add_argument("--show-sql", action="store_true", help="show SQL of each migration")
        p.add_argument(
            "--target-version",
            type=int,
            default=None,
            help="target version to migrate to (final state includes this version, but none "
            "after it); when migrating down, use 0 to apply all down migrations",
        )

    p = sub.add_parser("migrate-get", help="Get SQL for specific River migrations")
    p.add_argument(
        "--database-url",
        default="postgres://",
        help="used only as a hint of the kind of database (default postgres://)",
    )
    p.add_argument("--schema", help="schema to qualify names with")
    p.add_argument("--line", default=None, help="migration line (default: main)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="print all migrations")
    which.add_argument(
        "--version",
        dest="versions",
        type=_int_list,
        action="append",
        help="version(s) to print; comma-separated or repeated",
    )
    p.add_argument(
        "--exclude-version",
        type=_int_list,
        action="append",
        default=[],
        help="exclude version(s), usually 1 (River's migration table)",
    )
    direction = p.add_mutually_exclusive_group(required=True)
    direction.add_argument("--up", action="store_true", help="print up migrations")
    direction.add_argument("--down", action="store_true", help="print down migrations")

    p = sub.add_parser("migrate-list", help="List River schema migrations")
    db(p)
    p = sub.add_parser(
        "validate", help="Validate River schema (non-zero exit if migrations are missing)"
    )
    db(p)
    sub.add_parser("version", help="Print version information")

    p = sub.add_parser("bench", help="Run River's benchmark: insert and work no-op jobs")
    p.add_argument(
        "--database-url", default=None, help="database (default: a temporary SQLite file)"
    )
    p.add_argument("--duration", type=_duration, default=None, help="e.g. 30s: work for this long")
    p.add_argument(
        "-n", "--num-total-jobs", type=int, default=None, help="jobs to insert and work down"
    )
    p.add_argument(
        "--rate", type=float, default=None, help="with --duration: insert this many jobs/s"
    )
    p.add_argument("--loop", choices=("asyncio", "trio"), default="asyncio")
    p.add_argument("--max-workers", type=int, default=50)
    p.add_argument(
        "--fetch-cooldown", type=float, default=None, help="seconds (default River's 0.1)"
    )
    p.add_argument(
        "--yes", action="store_true", help="confirm that every job in the database may be deleted"
    )

    p = sub.add_parser("demo", help="Run a small demo workload on an embedded SQLite database")
    p.add_argument(
        "--database-url",
        default=None,
        help="database to use (default: a temporary SQLite file)",
    )
    p.add_argument("--jobs", type=int, default=1000, help="number of jobs to insert")
    p.add_argument("--loop", choices=("asyncio", "trio"), default="asyncio")
    _worker_cli.add_parser(sub)
    return parser


def _duration(text: str) -> float:
    from ._bench import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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


def _require_url(args: argparse.Namespace) -> str:
    url: str | None = args.database_url
    if not url:
        raise _UsageError("--database-url must be set")
    dialect_of_url(url)
    return url


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

    url = _require_url(args)
    async with open_driver(url, schema=args.schema or None) as driver:
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


def main(
    argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run the command line; returns the process exit code."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        if (args.version and args.command is None) or args.command == "version":
            print(f"{PROG} version {__version__}", file=out)
            print(f"Built with Python {platform.python_version()}", file=out)
            return 0
        if args.command is None:
            parser.print_help(out)
            return 2
        if args.command == "bench":
            from ._bench import run_bench

            if args.duration is not None and args.num_total_jobs is not None:
                raise _UsageError("use either --duration or --num-total-jobs, not both")
            if args.num_total_jobs is not None and args.num_total_jobs < 1:
                raise _UsageError("--num-total-jobs must be at least 1")
            if args.rate is not None and (args.duration is None or args.rate <= 0):
                raise _UsageError("--rate needs --duration and must be positive")
            if not 1 <= args.max_workers <= 10_000:
                raise _UsageError("--max-workers must be between 1 and 10000")
            try:
                return run_bench(
                    database_url=args.database_url,
                    total=args.num_total_jobs,
                    duration=args.duration,
                    rate=args.rate,
                    max_workers=args.max_workers,
                    loop=args.loop,
                    yes=args.yes,
                    fetch_cooldown=args.fetch_cooldown,
                    out=out,
                )
            except ValueError as exc:
                raise _UsageError(str(exc)) from None
        if args.command == "worker":
            return _worker_cli.run(args, out=out, err=err)
        if args.command == "demo":
            from ._demo import run_demo

            return run_demo(database_url=args.database_url, jobs=args.jobs, loop=args.loop, out=out)
        return anyio.run(_run, args, out, err)
    except _UsageError as exc:
        print(f"{PROG}: error: {exc}", file=err)
        return 2
    except RiverError as exc:
        print(f"{PROG}: error: {_one_line(str(exc))}", file=err)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one line, never a traceback with a URL in it
        print(f"{PROG}: error: {type(exc).__name__}: {_one_line(str(exc))}", file=err)
        return 1


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    # any URL that slipped into an error message loses its password
    return " ".join(redact_url(word) if "://" in word else word for word in text.split(" "))
