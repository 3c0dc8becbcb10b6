"""Run River's conformance harness against river_anyio's adapter.

    python -m river_anyio_tests.conformance.run [TIER ...] [--drivers D] [--backend B] [-- ARGS]

Tiers: ``pr`` (the pull-request scenarios), ``chaos`` (the nightly chaos scenarios and the
fleets with River Go as a third engine), ``perf`` (the performance gate), ``soak`` (10 minutes
on PostgreSQL unless ``RIVER_CONFORMANCE_SOAK`` says otherwise), ``nightly`` (all of the nightly
tier). The harness is River's ``conformance/`` module at v0.51.2 with its runner ``run.sh``:
``RIVER_CONFORMANCE_HARNESS`` names its directory, else a ``shared/river-conformance`` beside
the checkout or above it is used. Without it, or without Go, the run is skipped with one loud
line (an error with ``RIVER_ANYIO_REQUIRE_CONFORMANCE=1``).

PostgreSQL: ``RIVER_ANYIO_TEST_DATABASE_URL`` (a server URL; its server needs
``max_connections`` of 400 or more), else a throwaway cluster with 500 connections, started
as the test suite starts its own.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What each tier runs: ``run.sh``'s tier and the scenarios selected in it.
TIERS: dict[str, tuple[str, list[str]]] = {
    "pr": ("pr", []),
    "chaos": ("nightly", ["-run", "TestChaos|TestMultiEngine"]),
    "perf": ("perf", []),
    "soak": ("soak", []),
    "nightly": ("nightly", []),
}
HARNESS_SOURCE = (
    "River's conformance harness (github.com/riverqueue/river, directory conformance/, at "
    "v0.51.2, with run.sh): set RIVER_CONFORMANCE_HARNESS to its directory"
)


def find_harness() -> Path | None:
    """The harness's directory (holding ``run.sh`` and ``conformance/``), if there is one."""
    given = os.environ.get("RIVER_CONFORMANCE_HARNESS")
    if given:
        return Path(given)
    for parent in [ROOT, *ROOT.parents]:
        candidate = parent / "shared" / "river-conformance"
        if (candidate / "run.sh").is_file():
            return candidate
        candidate = parent.parent / "shared" / "river-conformance"
        if (candidate / "run.sh").is_file():
            return candidate
    return None


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server URL for the harness (its ``river_test`` database created)."""
    url = os.environ.get("RIVER_ANYIO_TEST_DATABASE_URL")
    with contextlib.ExitStack() as stack:
        if not url:
            from river_anyio_tests.conftest import _find_pg_bin, _throwaway_cluster

            bindir = _find_pg_bin()
            if bindir is None:
                raise SystemExit("no PostgreSQL: install it or set RIVER_ANYIO_TEST_DATABASE_URL")
            url = stack.enter_context(_throwaway_cluster(bindir, max_connections=500))
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS river_test WITH (FORCE)")
            conn.execute("CREATE DATABASE river_test")
        parts = urllib.parse.urlsplit(url)
        query = parts.query or "sslmode=disable"
        yield urllib.parse.urlunsplit(parts._replace(path="/river_test", query=query))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tiers", nargs="*", default=["pr"], choices=sorted(TIERS))
    parser.add_argument("--drivers", default="postgres,sqlite")
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    harness = find_harness()
    missing = None
    if harness is None or not (harness / "run.sh").is_file():
        missing = f"no harness found ({HARNESS_SOURCE})"
    elif shutil.which("go") is None:
        missing = "no Go on PATH (the harness is a Go test module)"
    if missing is not None:
        line = f"== River conformance SKIPPED: {missing}"
        if os.environ.get("RIVER_ANYIO_REQUIRE_CONFORMANCE") == "1":
            print(line.replace("SKIPPED", "REQUIRED but unavailable"), file=sys.stderr)
            return 1
        print(line, flush=True)
        return 0
    assert harness is not None
    env = {
        **os.environ,
        "RIVER_CONFORMANCE_EXTERNAL_COMMAND": f"{sys.executable} -m river_anyio_tests.conformance",
        "RIVER_CONFORMANCE_EXTERNAL_NAME": "river_anyio",
        "RIVER_CONFORMANCE_EXTERNAL_DIR": str(ROOT),
        "RIVER_CONFORMANCE_DRIVERS": args.drivers,
        "RIVER_ANYIO_CONFORMANCE_BACKEND": args.backend,
    }
    failed = False
    with postgres_server() as url:
        env["TEST_DATABASE_URL"] = url
        for tier in args.tiers:
            run_tier, selection = TIERS[tier]
            print(f"== River conformance: {tier} ({args.drivers}, {args.backend})", flush=True)
            start = time.monotonic()
            cmd = ["bash", str(harness / "run.sh"), run_tier, "--", *selection, *extra]
            # the harness runs its soak whenever RIVER_CONFORMANCE_SOAK is set: only in its tier
            tier_env = {k: v for k, v in env.items() if k != "RIVER_CONFORMANCE_SOAK"}
            if tier == "soak":
                tier_env["RIVER_CONFORMANCE_SOAK"] = env.get("RIVER_CONFORMANCE_SOAK", "10m")
            code = subprocess.run(cmd, env=tier_env, cwd=ROOT, check=False).returncode
            print(f"   {tier}: {'ok' if code == 0 else 'FAILED'} ({time.monotonic() - start:.0f}s)")
            failed |= code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
