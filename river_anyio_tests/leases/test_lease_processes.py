"""Leases across processes: clients on asyncio and trio racing for the same lease at the same
instant run it exactly once per round; a holder killed with SIGKILL frees its leases when their
terms pass."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

import river_anyio as river
from river_anyio._cli import main as cli

from .lease_child import HOLD_TTL

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 20
#: Starting a child (imports, connecting) on a loaded two-core machine.
START = 60.0
ROUND = 20.0


class Child:
    """A ``lease_child`` process with line-by-line reads bounded by a deadline."""

    def __init__(self, mode: str, url: str, backend: str, log: Path) -> None:
        self.backend = backend
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "river_anyio_tests.leases.lease_child", mode, url, backend,
             str(log)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
        )  # fmt: skip
        self._buffer = b""

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")

    def read_line(self, within: float) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + within
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                raise TimeoutError(f"{self.backend} child said nothing in {within}s")
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                raise EOFError(f"{self.backend} child exited ({self.proc.wait()})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def install_leases(url: str) -> None:
    assert cli(["migrate-up", "--line", "river_anyio", "--database-url", url]) == 0


@pytest.mark.parametrize(
    ("database", "backends"),
    [
        ("postgres", ("asyncio", "asyncio", "trio", "trio")),
        ("sqlite", ("asyncio", "trio")),
    ],
)
def test_processes_racing_for_a_lease_run_it_once_per_round(
    request: pytest.FixtureRequest, tmp_path: Path, database: str, backends: tuple[str, ...]
) -> None:
    url = str(request.getfixturevalue("pg_url" if database == "postgres" else "sqlite_url"))
    install_leases(url)
    log = tmp_path / "ran.log"
    children = [Child("rounds", url, backend, log) for backend in backends]
    try:
        for child in children:
            assert child.read_line(START) == "ready"
        winners: Counter[int] = Counter()
        for n in range(1, ROUNDS + 1):
            for child in children:  # the barrier: every child is waiting on this line
                child.send(str(n))
            for child in children:
                number, ran = child.read_line(ROUND).split()
                assert int(number) == n
                winners[n] += int(ran)
    finally:
        for child in children:
            child.close()
    assert all(child.proc.returncode == 0 for child in children)
    assert winners == dict.fromkeys(range(1, ROUNDS + 1), 1)
    runs = Counter(int(line.split()[0]) for line in log.read_text().splitlines())
    assert runs == dict.fromkeys(range(1, ROUNDS + 1), 1)  # fn ran once per round, not more


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("anyio_backend", "database"), [("asyncio", "postgres"), ("trio", "sqlite")]
)
async def test_a_killed_holder_frees_its_leases_after_their_term(
    request: pytest.FixtureRequest, anyio_backend: str, database: str, tmp_path: Path
) -> None:
    """The child runs on the other loop; the leases it held (one from ``with_lease``, one
    renewed by ``lease``) are refused while it lives and taken once their terms pass after
    SIGKILL, not before. Each loop and each database once (the pairs cover both sides)."""
    database_url = str(
        request.getfixturevalue("pg_url" if database == "postgres" else "sqlite_url")
    )
    await anyio.to_thread.run_sync(install_leases, database_url)
    other = "trio" if anyio_backend == "asyncio" else "asyncio"
    child = await anyio.to_thread.run_sync(
        Child, "hold", database_url, other, tmp_path / "unused.log"
    )
    try:
        assert await anyio.to_thread.run_sync(child.read_line, START) == "held"
        async with river.open_client(database_url) as run:
            client = run.client
            ran: list[str] = []

            async def fn() -> None:
                ran.append("x")

            assert not await client.with_lease("crash-with", fn, ttl=5)
            async with client.lease("crash-block", ttl=5) as held:
                assert held is None
            killed = time.monotonic()
            child.proc.send_signal(signal.SIGKILL)
            await anyio.to_thread.run_sync(child.proc.wait)
            with anyio.fail_after(HOLD_TTL + 10):
                while not await client.with_lease("crash-with", fn, ttl=5):  # noqa: ASYNC110
                    await anyio.sleep(0.05)
                while True:
                    async with client.lease("crash-block", ttl=5) as held:
                        if held is not None:
                            break
                    await anyio.sleep(0.05)
            # the renewed lease lasted until its last renewal's term (ttl/3 before the kill
            # at the earliest) passed
            assert time.monotonic() - killed >= HOLD_TTL * 2 / 3 - 0.05
            assert ran == ["x"]
    finally:
        await anyio.to_thread.run_sync(child.close)
