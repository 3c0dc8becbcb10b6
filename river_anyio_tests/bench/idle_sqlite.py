"""Benchmark: what an idle client costs on SQLite, per minute: SQL statements and CPU seconds.

    python -m river_anyio_tests.bench.idle_sqlite [--seconds 60] [--loop trio] [--by-statement]

Starts a client with one queue on a new SQLite file, lets it settle for a few seconds, then for
``--seconds`` counts every statement that any apsw connection of the process runs (an
``exec_trace`` installed through ``apsw.connection_hooks``, so the writer's and the listener's
connections alike) and the process's CPU time. ``--by-statement`` also lists the statements by
their first words. Compare with an idle client on PostgreSQL (pg_stat_statements' calls).
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

import river_anyio as river

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


async def measure(seconds: float, directory: Path) -> tuple[StatementCounter, float]:
    """Statements and CPU seconds of an idle client over ``seconds`` (after settling)."""
    counter = StatementCounter()
    counter.install()
    try:
        workers = river.Workers()
        workers.add(Idle, _noop)
        async with river.open_client(
            f"sqlite://{directory / 'idle.sqlite3'}",
            queues={"default": river.QueueConfig(max_workers=10)},
            workers=workers,
            auto_migrate=True,
        ):
            await anyio.sleep(SETTLE)  # start-up done (migrations, election, first fetch)
            counter.by_text.clear()
            cpu = time.process_time()
            await anyio.sleep(seconds)
            cpu = time.process_time() - cpu
            counted = StatementCounter()
            counted.by_text.update(counter.by_text)
    finally:
        counter.uninstall()
    return counted, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--loop", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--by-statement", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="river_anyio_idle_") as tmp:
        counter, cpu = anyio.run(measure, args.seconds, Path(tmp), backend=args.loop)
    per_minute = 60.0 / args.seconds
    print(
        f"idle SQLite client ({args.loop}, {args.seconds:g}s): "
        f"{counter.total * per_minute:,.0f} statements/min, {cpu * per_minute:.2f} CPU s/min"
    )
    if args.by_statement:
        for text, n in counter.by_text.most_common():
            print(f"  {n * per_minute:8,.0f}/min  {text}")


if __name__ == "__main__":
    main()
