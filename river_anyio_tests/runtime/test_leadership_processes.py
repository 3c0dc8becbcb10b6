"""Leader election between clients in separate processes (trio and asyncio mixed) on one
database: one leader at a time, a crashed leader replaced within a lease, a stopping leader
replaced at once (on SQLite, where River announces no resignation, at the next attempt)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from anyio.abc import Process, TaskGroup
from anyio.streams.text import TextReceiveStream

from river_anyio.drivers import open_driver

from .lifecycle_support import wait_until

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
#: The children's election interval: the lease lasts 3 s, followers retry every 1–1.2 s.
INTERVAL = 1.0
TTL = 3 * INTERVAL
JITTER = INTERVAL / 5
#: Allowance for a loaded machine (two cores shared with other test runs).
SLACK = 2.0
START = 60.0


@attrs.define(eq=False)
class Child:
    id: str
    proc: Process
    events: list[dict[str, Any]] = attrs.field(factory=list)
    output: list[str] = attrs.field(factory=list)
    killed_at: float | None = None

    @property
    def leads(self) -> bool:
        if self.killed_at is not None:
            return False
        states = [e["event"] for e in self.events if e["event"] in ("elected", "lost")]
        return bool(states) and states[-1] == "elected"

    def has(self, event: str) -> bool:
        return any(e["event"] == event for e in self.events)

    def last(self, event: str) -> float:
        return max(e["t"] for e in self.events if e["event"] == event)

    def terms(self) -> list[tuple[float, float]]:
        """(elected, ended) wall times; an open term ends now, or when the child was killed."""
        out: list[tuple[float, float]] = []
        start: float | None = None
        for e in self.events:
            if e["event"] == "elected" and start is None:
                start = e["t"]
            elif e["event"] == "lost" and start is not None:
                out.append((start, e["t"]))
                start = None
        if start is not None:
            out.append((start, self.killed_at or time.time()))
        return out


async def _read(child: Child) -> None:
    assert child.proc.stdout is not None
    buffer = ""
    async for chunk in TextReceiveStream(child.proc.stdout):
        buffer += chunk
        while "\n" in buffer:
            line, buffer = buffer.split("\n", 1)
            try:
                child.events.append(json.loads(line))
            except ValueError:
                child.output.append(line)


async def spawn(tg: TaskGroup, url: str, client_id: str, backend: str) -> Child:
    proc = await anyio.open_process(
        [
            sys.executable,
            "-m",
            "river_anyio_tests.runtime.leader_child",
            url,
            client_id,
            backend,
            str(INTERVAL),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    child = Child(id=client_id, proc=proc)
    tg.start_soon(_read, child)
    return child


def leaders(children: list[Child]) -> list[Child]:
    return [c for c in children if c.leads]


async def one_leader(children: list[Child], within: float) -> Child:
    await wait_until(lambda: len(leaders(children)) == 1, within)
    (leader,) = leaders(children)
    return leader


async def lease_holder(url: str) -> str | None:
    async with open_driver(url) as driver:
        row = await driver.executor().leader_get_elected()
    return row.leader_id if row is not None else None


async def test_clients_in_separate_processes_elect_one_leader(database_url: str) -> None:
    backends = ("asyncio", "trio", "asyncio")
    children: list[Child] = []
    try:
        with anyio.fail_after(START + 60):
            async with anyio.create_task_group() as tg:
                for i, backend in enumerate(backends):
                    children.append(await spawn(tg, database_url, f"proc-{i}-{backend}", backend))
                await wait_until(lambda: all(c.has("ready") for c in children), START)

                # one leader, and it stays the only one
                first = await one_leader(children, TTL + INTERVAL + SLACK)
                await anyio.sleep(2 * INTERVAL)
                assert leaders(children) == [first]
                assert await lease_holder(database_url) == first.id

                # crash (kill -9): another takes over once the lease runs out
                first.proc.kill()
                first.killed_at = time.time()
                await first.proc.wait()
                rest = [c for c in children if c is not first]
                second = await one_leader(rest, TTL + INTERVAL + JITTER + SLACK)
                took = second.last("elected") - first.killed_at
                assert took <= TTL + INTERVAL + JITTER + SLACK, took

                # graceful stop: the leader resigns at once and the last client takes over:
                # on PostgreSQL promptly (told by the resignation, well before its next
                # attempt); on SQLite, where River announces no resignation, at its next
                # attempt (the lease is free by then)
                second.proc.terminate()
                (third,) = [c for c in rest if c is not second]
                await wait_until(lambda: third.leads, INTERVAL + JITTER + SLACK)
                lost = [e for e in second.events if e["event"] == "lost"][-1]
                assert lost["reason"] == "stopping"
                handover = third.last("elected") - lost["t"]
                if database_url.startswith("sqlite"):
                    assert handover < INTERVAL + JITTER + SLACK, handover
                else:
                    assert handover < INTERVAL, handover
                await wait_until(lambda: second.has("stopped"), SLACK + 5)
                assert await lease_holder(database_url) == third.id

                third.proc.terminate()
                await third.proc.wait()
                tg.cancel_scope.cancel()
    finally:
        for child in children:
            if child.proc.returncode is None:
                child.proc.kill()
            with anyio.CancelScope(shield=True):
                await child.proc.wait()
                await child.proc.aclose()
    assert await lease_holder(database_url) is None  # the last one resigned as it stopped

    # never two leaders at once: terms of different processes do not overlap
    terms = sorted((start, end, c.id) for c in children for start, end in c.terms())
    assert len(terms) == 3, (terms, [c.output for c in children])
    for (_, end, who), (start, _, nxt) in itertools.pairwise(terms):
        assert end <= start, f"{who} still led when {nxt} was elected"
