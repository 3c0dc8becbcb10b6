"""Benchmark: what an idle client costs per minute: SQL statements and CPU seconds.

    python -m river_anyio_tests.bench.idle [--seconds 60] [--loop trio] [--by-statement]
        [--database-url postgresql://...]

Starts a client with one queue (it leads), lets it settle for a few seconds, then for
``--seconds`` counts its statements and the process's CPU time. On SQLite (a new file, the
default) every statement that any apsw connection of the process runs is counted (an
``exec_trace`` installed through ``apsw.connection_hooks``, so the writer's and the listener's
connections alike); ``--by-statement`` lists them by their first words. On PostgreSQL
(``--database-url``, a server on this machine; River's tables are created if missing) the
statements are ``pg_stat_statements``' calls in that database (the extension must be
preloaded; it is created in the database if missing) and the server's CPU is reported too:
every process of the cluster, from ``/proc``, so run nothing else on it meanwhile.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import anyio
import apsw
import attrs
import psycopg

import river_anyio as river

from . import pgcpu

SETTLE = 3.0


@attrs.frozen
class Idle:
    kind: ClassVar[str] = "bench_idle"


async def _noop(ctx: river.WorkContext, job: river.Job[Idle]) -> None:
    return None


class StatementCounter:
    """Counts statements run by every apsw connection opened after :meth:`install`."""

    def __init__(self) -> None:
        self.by_text: collections.Counter[str] = collections.Counter()

    @property
    def total(self) -> int:
        return sum(self.by_text.values())

    def install(self) -> None:
        apsw.connection_hooks.append(self._hook)

    def uninstall(self) -> None:
        apsw.connection_hooks.remove(self._hook)

    def _hook(self, conn: apsw.Connection) -> None:
        conn.exec_trace = self._trace

    def _trace(self, cursor: Any, sql: str, bindings: Any) -> bool:
        self.by_text[" ".join(sql.split()[:6])] += 1
        return True


async def measure(seconds: float, url: str) -> tuple[StatementCounter, float, float | None]:
    """Statements, the process's CPU seconds and (PostgreSQL) the server's of an idle client
    over ``seconds`` (after settling)."""
    counter = StatementCounter()
    postgres = not url.startswith("sqlite:")
    if not postgres:
        counter.install()
    try:
        workers = river.Workers()
        workers.add(Idle, _noop)
        async with river.open_client(
            url,
            queues={"default": river.QueueConfig(max_workers=10)},
            workers=workers,
            auto_migrate=True,
        ):
            await anyio.sleep(SETTLE)  # start-up done (migrations, election, first fetch)
            counter.by_text.clear()
            server = _pg_begin(url) if postgres else None
            cpu = time.process_time()
            await anyio.sleep(seconds)
            cpu = time.process_time() - cpu
            server_cpu = _pg_end(url, server, counter) if server is not None else None
            counted = StatementCounter()
            counted.by_text.update(counter.by_text)
    finally:
        if not postgres:
            counter.uninstall()
    return counted, cpu, server_cpu


def _pg_begin(url: str) -> tuple[int, float]:
    """Reset ``pg_stat_statements``; the cluster's postmaster and CPU so far."""
    postmaster = pgcpu.postmaster_pid(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
    return postmaster, pgcpu.server_cpu(postmaster)


def _pg_end(url: str, begun: tuple[int, float], counter: StatementCounter) -> float:
    """The server's CPU since :func:`_pg_begin`; its statements in ``url``'s database, but
    this aid's own, into ``counter``."""
    postmaster, cpu = begun
    cpu = pgcpu.server_cpu(postmaster) - cpu
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT query, calls FROM pg_stat_statements JOIN pg_database d ON d.oid = dbid "
            "WHERE d.datname = current_database() AND query NOT LIKE '%pg_stat_statements%'"
        ).fetchall()
    for query, calls in rows:
        counter.by_text[" ".join(str(query).split()[:6])] += int(calls)
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--loop", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--by-statement", action="store_true")
    parser.add_argument("--database-url", help="a PostgreSQL server on this machine")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="river_anyio_idle_") as tmp:
        url = args.database_url or f"sqlite://{Path(tmp) / 'idle.sqlite3'}"
        counter, cpu, server = anyio.run(measure, args.seconds, url, backend=args.loop)
    per_minute = 60.0 / args.seconds
    where = "SQLite" if server is None else "PostgreSQL"
    also = "" if server is None else f", the server {server * per_minute:.2f} CPU s/min"
    print(
        f"idle {where} client ({args.loop}, {args.seconds:g}s): "
        f"{counter.total * per_minute:,.0f} statements/min, {cpu * per_minute:.2f} CPU s/min"
        f"{also}"
    )
    if args.by_statement:
        for text, n in counter.by_text.most_common():
            print(f"  {n * per_minute:8,.0f}/min  {text}")


if __name__ == "__main__":
    main()
