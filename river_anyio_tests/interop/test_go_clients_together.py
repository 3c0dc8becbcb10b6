"""River Go and river_anyio clients running together on one database: one leader between
them, handed over when the leader stops; and a gradual migration of job kinds, where each
client fetches only the kinds it knows from a shared queue.

The leadership tests need river_anyio's leader election (``leader_elected``/``leader_lost``
events, the ``leader_election_disabled`` option); they skip while it is absent and run as soon
as it exists.
"""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import pytest

import river_anyio as river
from river_anyio._errors import ConfigError
from river_anyio._runtime._supervisor import _config_from

from ._river_go import GoRun, RiverGo
from ._shared import CLIENT_OPTIONS, QUEUE, ScriptedWorker, Task, collect, task_json

pytestmark = pytest.mark.anyio

E = river.EventKind


def _accepts_option(name: str, value: object) -> bool:
    try:
        _config_from("sqlite:///unused.sqlite3", {name: value})
    except ConfigError as exc:
        return exc.field != name
    return True


HAS_LEADERSHIP = {"LEADER_ELECTED", "LEADER_LOST"} <= set(E.__members__)
HAS_NEVER_LEADER = _accepts_option("leader_election_disabled", True)
needs_leadership = pytest.mark.skipif(
    not HAS_LEADERSHIP, reason="needs leadership (river_anyio has no leader_elected events yet)"
)
needs_never_leader = pytest.mark.skipif(
    not HAS_NEVER_LEADER, reason="needs leadership (no leader_election_disabled option yet)"
)


class Moved(Task):
    """A kind already moved from Go to Python."""

    kind: ClassVar[str] = "interop_moved"


LEGACY = "interop_legacy"  # a kind still worked by Go only


def python_workers(worker: ScriptedWorker) -> river.Workers:
    w = river.Workers()
    w.add(Moved, worker)
    return w


async def wait_leader_event(sub: river.Subscription, kind: str) -> river.Event:
    with anyio.fail_after(30):
        async for event in sub:
            if event.kind == kind:
                return event
    raise AssertionError("subscription ended")


def go_is_leader(go: GoRun) -> bool:
    lines = go.find("leader")
    return bool(lines and lines[-1]["is_leader"])


@pytest.mark.parametrize("never_leader", [False, True])
async def test_gradual_migration_each_client_fetches_only_its_kinds(
    river_go: RiverGo, database_url: str, never_leader: bool
) -> None:
    if never_leader and not HAS_NEVER_LEADER:
        pytest.skip("needs leadership (no leader_election_disabled option yet)")
    url = database_url
    worker = ScriptedWorker()
    extra: dict[str, Any] = {"leader_election_disabled": True} if never_leader else {}
    async with (
        river_go.run(
            url,
            queues={QUEUE: 10},
            kinds=[LEGACY],
            fetch_only_known_kinds=True,
            report_leader=never_leader,
        ) as go,
        river.open_client(
            url,
            queues={QUEUE: river.QueueConfig(max_workers=10)},
            workers=python_workers(worker),
            fetch_only_known_kinds=True,
            **extra,
            **CLIENT_OPTIONS,
        ) as run,
    ):
        with run.subscribe() as sub:
            specs = [
                {**task_json(label=str(i)), "kind": LEGACY if i % 2 else Moved.kind}
                for i in range(20)
            ]
            inserted = await river_go.call("insert", url, stdin=specs)
            ids = {r["id"]: r["row"]["kind"] for r in inserted}
            moved = [i for i, k in ids.items() if k == Moved.kind]
            legacy = [i for i, k in ids.items() if k == LEGACY]
            events = await collect(sub, moved)
            for job_id in legacy:
                await go.wait_for("job_completed", id=job_id)
            if never_leader:
                await go.wait_until(lambda: go_is_leader(go), "River Go elected")
                assert not [e for e in sub_events(sub) if e.kind == "leader_elected"]

    assert all(e.kind is E.JOB_COMPLETED for e in events.values())
    for job_id in moved:
        row = events[job_id].job
        assert row is not None
        assert row.attempted_by == (run.client.id,) and row.attempt == 1 and not row.errors
    for job_id in legacy:
        (done,) = go.find("job_completed", id=job_id)
        assert done["job"]["attempted_by"] == [go.client_id]
        assert done["job"]["attempt"] == 1 and not done["job"]["errors"]
    assert not go.find("job_started", kind=Moved.kind)
    assert {j.kind for j in worker.jobs} == {Moved.kind}


def sub_events(sub: river.Subscription) -> list[river.Event]:
    out = []
    while True:
        try:
            out.append(sub.receive_nowait())
        except anyio.WouldBlock:
            return out


@needs_leadership
async def test_one_leader_between_go_and_river_anyio_and_handover_to_river_anyio(
    river_go: RiverGo, database_url: str
) -> None:
    url = database_url
    worker = ScriptedWorker()
    async with river_go.run(
        url, queues={QUEUE: 5}, kinds=[Task.kind], client_id="go-first", report_leader=True
    ) as go:
        await go.wait_for("leader", is_leader=True)
        async with river.open_client(
            url,
            queues={QUEUE: river.QueueConfig(max_workers=5)},
            workers=python_workers(worker),
            **CLIENT_OPTIONS,
        ) as run:
            with run.subscribe("leader_elected", "leader_lost") as sub:
                # Go leads; river_anyio must not be elected too.
                with anyio.move_on_after(6):  # more than one of River's 5 s election rounds
                    await wait_leader_event(sub, "leader_elected")
                    pytest.fail("river_anyio elected while River Go leads")
                assert go_is_leader(go)
                await go.stop()  # River Go resigns
                await wait_leader_event(sub, "leader_elected")


@needs_leadership
async def test_one_leader_between_go_and_river_anyio_and_handover_to_go(
    river_go: RiverGo, database_url: str
) -> None:
    url = database_url
    worker = ScriptedWorker()
    async with river.open_client(
        url,
        queues={QUEUE: river.QueueConfig(max_workers=5)},
        workers=python_workers(worker),
        **CLIENT_OPTIONS,
    ) as run:
        with run.subscribe("leader_elected", "leader_lost") as sub:
            await wait_leader_event(sub, "leader_elected")
            async with river_go.run(
                url, queues={QUEUE: 5}, kinds=[Task.kind], client_id="go-second",
                report_leader=True,
            ) as go:  # fmt: skip
                first = await go.wait_for("leader")
                assert first["is_leader"] is False and first["leader_id"] == run.client.id
                with anyio.move_on_after(6):
                    await go.wait_for("leader", is_leader=True, within=6)
                assert not go_is_leader(go), "River Go elected while river_anyio leads"
                run.stop()
                await run.wait()
                await go.wait_for("leader", is_leader=True)


async def test_harness_reports_river_go_leadership_and_handover(
    river_go: RiverGo, database_url: str
) -> None:
    """The program's leadership reporting, checked between two River Go clients (what the
    tests above rely on to see River Go's side)."""
    url = database_url
    async with river_go.run(url, queues={QUEUE: 1}, kinds=[Task.kind], client_id="go-a",
                            report_leader=True) as a:  # fmt: skip
        await a.wait_for("leader", is_leader=True, leader_id="go-a")
        async with river_go.run(url, queues={QUEUE: 1}, kinds=[Task.kind], client_id="go-b",
                                report_leader=True) as b:  # fmt: skip
            first = await b.wait_for("leader")
            assert (first["is_leader"], first["leader_id"]) == (False, "go-a")
            await a.stop()
            await b.wait_for("leader", is_leader=True, leader_id="go-b")
