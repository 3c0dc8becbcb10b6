"""Benchmark aid: what a run costs PostgreSQL, per job: server CPU and transactions.

    python -m river_anyio_tests.bench.pgcpu [--whole] -- river-anyio bench ... --database-url URL

Runs the command after ``--`` (a ``river-anyio bench``), echoing its output, and measures the
PostgreSQL server named by the command's ``--database-url`` (it must run on this machine:
the CPU is read from ``/proc``):

- server CPU: user + system time of every process of the cluster (the postmaster's children,
  found through a backend's parent) plus the time of children already exited, as the
  postmaster's ``cutime``/``cstime`` count them;
- transactions: ``xact_commit`` of the bench's database in ``pg_stat_database``.

By default the window is the drain's (from the ``working...`` line to the ``worked`` line);
``--whole`` measures the whole command (the steady-rate mode, where inserting is part of the
cost). Divided by the jobs the ``worked`` line reports.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import psycopg

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    return text[text.rindex(")") + 2 :].split()


def postmaster_pid(url: str) -> int:
    """The cluster's postmaster: the parent of one of its backends."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        return int(_stat(int(row[0]))[1])


def server_cpu(postmaster: int) -> float:
    """CPU seconds of the cluster so far: live processes and exited children."""
    fields = _stat(postmaster)
    total = sum(int(v) for v in fields[11:15]) / TICK  # its own and its reaped children's
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = _stat(int(name))
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def commits(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        assert row is not None
        return int(row[0])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m river_anyio_tests.bench.pgcpu")
    parser.add_argument("--whole", action="store_true", help="measure the whole command")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = [c for c in args.command if c != "--"]
    if "--database-url" not in command:
        parser.error("the command needs --database-url (a PostgreSQL server on this machine)")
    url = command[command.index("--database-url") + 1]
    postmaster = postmaster_pid(url)
    begin: tuple[float, int, float] | None = None
    end: tuple[float, int, float] | None = None
    jobs = 0
    if args.whole:
        begin = (server_cpu(postmaster), commits(url), time.monotonic())
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        if not args.whole and "working..." in line:
            begin = (server_cpu(postmaster), commits(url), time.monotonic())
        if line.startswith("worked "):
            jobs = int(line.split()[1].replace(",", ""))
            if not args.whole:
                end = (server_cpu(postmaster), commits(url), time.monotonic())
    proc.wait()
    if args.whole:
        ended = time.monotonic()
        # statistics reach pg_stat_database when a backend goes idle: let them settle
        time.sleep(1.0)
        end = (server_cpu(postmaster), commits(url), ended)
    if begin is None or end is None or not jobs:
        sys.exit(
            f"no measurement: the command did not report a drain (exit status {proc.returncode})"
        )
    cpu = end[0] - begin[0]
    print(
        f"PostgreSQL: {cpu:.2f} CPU s = {cpu / jobs * 1e6:.0f} µs/job "
        f"({cpu / (end[2] - begin[2]):.2f} cores); {(end[1] - begin[1]) / jobs:.2f} transactions/job"
    )
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
