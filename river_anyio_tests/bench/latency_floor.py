"""Benchmark aid: the pickup latency PostgreSQL itself allows, with a near-free client.

    python -m river_anyio_tests.bench.latency_floor --database-url URL [--rate 200] [--seconds 8]

The counterpart, for ``river-anyio bench --rate N --inserter process``, of the drain limit
client: a separate process inserts one job at a time at ``--rate`` a second, each insert and
its ``pg_notify`` in one statement, stamping ``time.time()`` into the args just before; this
process LISTENs and, on every notification, claims with river_anyio's own claim statement.
Both sides are synchronous psycopg with prepared statements, nothing else: no limiter, no
completion, no event loop. The enqueue-to-claim percentiles it prints are what a client
could reach on this server at best. It deletes every job in the database first (a migrated,
throwaway database).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time

import psycopg

from river_anyio._bench import _pct
from river_anyio.drivers.postgres._queries import Queries

#: set for the inserting process, to the database URL (not argv: ``ps`` shows it)
INSERTER_URL = "RIVER_ANYIO_LATENCY_FLOOR_URL"
INSERT = """WITH n AS MATERIALIZED (SELECT pg_notify('river_insert', '{"queue":"default"}'))
INSERT INTO river_job (args, kind, max_attempts, priority, queue, state, metadata, tags)
SELECT %s::jsonb, 'latency_floor', 25, 1, 'default', 'available', '{}', '{}' FROM n"""


def insert(url: str, rate: float, seconds: float) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.perf_counter()
        i = 0
        while time.perf_counter() < start + seconds:
            conn.execute(INSERT, (json.dumps({"t": time.time()}),), prepare=True)
            i += 1
            if (wait := start + i / rate - time.perf_counter()) > 0:
                time.sleep(wait)
        return i


def work(url: str, rate: float, seconds: float) -> None:
    claim = Queries(None).job_get_available
    latencies: list[float] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM river_job")
        conn.execute("LISTEN river_insert")
        argv = [sys.executable, "-m", __spec__.name if __spec__ else __file__]
        argv += ["--rate", str(rate), "--seconds", str(seconds)]
        env = {**os.environ, INSERTER_URL: url}
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
        fd = conn.pgconn.socket
        stop_at: float | None = None
        while stop_at is None or time.monotonic() < stop_at:
            if select.select([fd], [], [], 0.05)[0]:
                conn.pgconn.consume_input()
                while conn.pgconn.notifies() is not None:
                    pass
                rows = conn.execute(
                    claim, ("default", 100, 100, 100, "latency_floor"), prepare=True, binary=True
                ).fetchall()
                now = time.time()
                latencies.extend(now - json.loads(row[1])["t"] for row in rows)
            if stop_at is None and proc.poll() is not None:
                stop_at = time.monotonic() + 0.5  # the last notifications
        assert proc.stdout is not None
        inserted = int(proc.stdout.read().split()[-1])
    ms = [v * 1000 for v in latencies]

    def pct(q: float) -> float:
        return _pct(ms, q)

    print(
        f"latency floor at {rate:g} jobs/s: {len(latencies):,} of {inserted:,} jobs claimed; "
        f"enqueue-to-claim p50 {pct(0.5):.2f} ms, p95 {pct(0.95):.2f} ms, p99 {pct(0.99):.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m river_anyio_tests.bench.latency_floor")
    parser.add_argument("--database-url", help="a migrated, throwaway PostgreSQL database")
    parser.add_argument("--rate", type=float, default=200.0, help="jobs a second (> 0)")
    parser.add_argument("--seconds", type=float, default=8.0, help="how long to insert (> 0)")
    args = parser.parse_args()
    if not args.rate > 0 or not args.seconds > 0:
        parser.error("--rate and --seconds must be positive")
    if url := os.environ.get(INSERTER_URL):
        print(insert(url, args.rate, args.seconds))
    elif args.database_url is None:
        parser.error("--database-url is required")
    else:
        work(args.database_url, args.rate, args.seconds)


if __name__ == "__main__":
    main()
