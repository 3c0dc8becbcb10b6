"""River Go and river_anyio clients running together on one database: one leader between
them, handed over when the leader stops (either way); never-leader river_anyio clients beside
a River Go leader; and a gradual migration of job kinds, where each client fetches only the
kinds it knows from a shared queue.

River Go's side of leadership is read two ways: the program's ``leader`` lines (who holds
``river_leader``) and its ``elector`` lines (River Go's elector's own log records: bids,
elections, notifications received). River Go's elector runs at its fixed 5 s interval;
river_anyio's runs at a short private interval here, so "must not happen" checks are bounded
by River Go's rounds, not ours.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import AsyncIterator
from typing import Any, ClassVar, cast

import anyio
import pytest
from anyio.abc import TaskStatus

import river_anyio as river
from river_anyio._config import ClientConfig
from river_anyio.drivers import TOPIC_LEADERSHIP, Driver, Executor, LeaderRow, Listener, open_driver

from ._river_go import GoRun, RiverGo
from ._shared import CLIENT_OPTIONS, QUEUE, ScriptedWorker, Task, collect, task_json

pytestmark = pytest.mark.anyio

E = river.EventKind


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


#: River Go's elector, in its own words (the program prints its log records as "elector" lines).
GAINED = "Gained leadership"
BID = "Attempting to gain leadership"
DENIED = "Leadership bid was unsuccessful (not an error)"
REELECT = "Current leader attempting reelect"
NOTIFIED = "Received notification from notifier"
RESIGNED = "Resigned leadership successfully"
#: River Go's election round: a follower bids every 5 s plus up to 1 s of jitter; a leader
#: renews every 5 s. Its lease lasts 15 s.
GO_ROUND = 6.0
#: river_anyio's election interval in these tests (River Go keeps its own 5 s): a lease of
#: three intervals, renewed every interval, so an unrenewed lease would expire twice within
#: one of River Go's rounds.
INTERVAL = 1.0
#: A river_anyio election interval longer than any of these tests' waits.
SLOW = 60.0


async def until_leader(run: river.ClientRun, sub: river.Subscription) -> None:
    """Until ``run`` leads (``sub`` subscribed to leader_elected: it may have been elected
    before the subscription, so its state is checked first)."""
    if not run.is_leader:
        await wait_leader_event(sub, "leader_elected")
    assert run.is_leader


def elector_lines(go: GoRun) -> list[str]:
    return [line["message"] for line in go.find("elector")]


class Notes(list[dict[str, Any]]):
    """Payloads received, and an event set when the next one arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = anyio.Event()

    def add(self, payload: dict[str, Any]) -> None:
        self.append(payload)
        self.arrived.set()
        self.arrived = anyio.Event()

    async def wait_for(self, payload: dict[str, Any]) -> None:
        while payload not in self:
            await self.arrived.wait()


async def leader_notes(
    listener: Listener,
    into: Notes,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Every payload on ``river_leadership``, into ``into``."""
    await listener.listen(TOPIC_LEADERSHIP)
    task_status.started()
    async for note in listener:
        into.add(json.loads(note.payload))


@pytest.mark.parametrize("never_leader", [False, True])
async def test_gradual_migration_each_client_fetches_only_its_kinds(
    river_go: RiverGo, database_url: str, never_leader: bool
) -> None:
    url = database_url
    worker = ScriptedWorker()
    extra: dict[str, Any] = {"leader_election_disabled": True} if never_leader else {}
    async with (
        river_go.run(
            url,
            queues={QUEUE: 10},
            kinds=[LEGACY],
            fetch_only_known_kinds=True,
            report_leader=True,
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
                # River Go leads (and runs the maintenance) for both
                await go.wait_for("elector", message=GAINED)
                assert go_is_leader(go) and not run.is_leader
            else:
                # one of the two leads
                await go.wait_until(
                    lambda: go.find("leader") and go.find("leader")[-1]["leader_id"],
                    "a leader",
                )
                assert run.is_leader != go_is_leader(go)

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


async def test_one_leader_between_go_and_river_anyio_and_handover_to_river_anyio(
    river_go: RiverGo, database_url: str
) -> None:
    url = database_url
    worker = ScriptedWorker()
    async with river_go.run(
        url, queues={QUEUE: 5}, kinds=[Task.kind], client_id="go-first", report_leader=True
    ) as go:
        await go.wait_for("elector", message=GAINED)
        await go.wait_for("leader", is_leader=True, leader_id="go-first")
        async with (
            river.open_client(
                url,
                queues={QUEUE: river.QueueConfig(max_workers=5)},
                workers=python_workers(worker),
                config=ClientConfig(elect_interval=INTERVAL),
                **CLIENT_OPTIONS,
            ) as run,
            run.client.driver.listener() as listener,
            anyio.create_task_group() as tg,
        ):
            notes = Notes()
            await tg.start(leader_notes, listener, notes)
            with run.subscribe("leader_elected", "leader_lost") as sub:
                # Go leads: river_anyio bids every second and must lose every bid, over one
                # of River Go's rounds (in which Go renews its lease at least once)
                renewals = len(go.find("elector", message=REELECT))
                with anyio.move_on_after(GO_ROUND):
                    await until_leader(run, sub)
                    pytest.fail("river_anyio elected while River Go leads")
                assert len(go.find("elector", message=REELECT)) > renewals
                assert not run.is_leader and go_is_leader(go)
                lines = elector_lines(go)
                assert lines.count(GAINED) == 1
                assert BID not in lines[lines.index(GAINED) :]  # Go did not drop back
                await go.stop()  # River Go resigns
                assert RESIGNED in elector_lines(go)
                await until_leader(run, sub)
                assert (await run.client.driver.executor().leader_get_elected()) is not None
            if url.startswith("postgres"):
                # River Go's resignation told followers on river_leadership (River's SQLite
                # driver tells nobody: a follower there finds the lease free on its next bid).
                # The client may act on it before this test's own listener receives it.
                with anyio.fail_after(10):
                    await notes.wait_for({"action": "resigned", "leader_id": "go-first"})
            tg.cancel_scope.cancel("test done")


class BidWatch:
    """A driver that tells when its client has bid for the lease and lost."""

    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        self.lost_bid = anyio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._driver, name)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        async with self._driver.transaction() as tx:
            yield _BidTx(tx, self.lost_bid)


class _BidTx:
    def __init__(self, tx: Executor, lost_bid: anyio.Event) -> None:
        self._tx = tx
        self._lost_bid = lost_bid

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)

    async def leader_attempt_elect(self, **kw: Any) -> LeaderRow | None:
        row = await self._tx.leader_attempt_elect(**kw)
        if row is None:
            self._lost_bid.set()
        return row


async def test_river_anyio_follower_wakes_when_river_go_resigns(
    river_go: RiverGo, pg_url: str
) -> None:
    """River Go's resignation (its ``resigned`` notification) wakes a river_anyio follower,
    which bids at once instead of on its next round. PostgreSQL only: River's SQLite driver
    sends no notification when it resigns."""
    worker = ScriptedWorker()
    async with (
        river_go.run(
            pg_url, queues={QUEUE: 5}, kinds=[Task.kind], client_id="go-first", report_leader=True
        ) as go,
        open_driver(pg_url) as driver,
    ):
        await go.wait_for("elector", message=GAINED)
        watch = BidWatch(driver)
        async with river.open_client(
            cast(Driver, watch),
            queues={QUEUE: river.QueueConfig(max_workers=5)},
            workers=python_workers(worker),
            config=ClientConfig(
                elect_interval=SLOW
            ),  # its second bid would come SLOW seconds after the first
            **CLIENT_OPTIONS,
        ) as run:
            with run.subscribe("leader_elected") as sub:
                with anyio.fail_after(10):
                    await watch.lost_bid.wait()  # its first bid lost to Go's lease
                await go.stop()
                with anyio.fail_after(SLOW / 2):
                    await until_leader(run, sub)


async def test_one_leader_between_go_and_river_anyio_and_handover_to_go(
    river_go: RiverGo, database_url: str
) -> None:
    url = database_url
    worker = ScriptedWorker()
    async with river.open_client(
        url,
        queues={QUEUE: river.QueueConfig(max_workers=5)},
        workers=python_workers(worker),
        config=ClientConfig(elect_interval=INTERVAL),
        **CLIENT_OPTIONS,
    ) as run:
        with run.subscribe("leader_elected", "leader_lost") as sub:
            await until_leader(run, sub)
            async with river_go.run(
                url, queues={QUEUE: 5}, kinds=[Task.kind], client_id="go-second",
                report_leader=True,
            ) as go:  # fmt: skip
                first = await go.wait_for("leader")
                assert first["is_leader"] is False and first["leader_id"] == run.client.id
                # Go bids at once and again one of its rounds later: both bids fail, the
                # second long after river_anyio's three-second lease would have run out
                # unrenewed
                await go.wait_until(
                    lambda: elector_lines(go).count(DENIED) >= 2 or GAINED in elector_lines(go),
                    "River Go's second bid",
                    within=GO_ROUND + 10,
                )
                assert GAINED not in elector_lines(go), "River Go elected while river_anyio leads"
                assert run.is_leader and not go_is_leader(go)
                with pytest.raises(anyio.WouldBlock):
                    sub.receive_nowait()  # never lost its lease
                run.stop()
                await run.wait()
                lost = await wait_leader_event(sub, "leader_lost")
                assert lost.details["reason"] == "stopping"
                await go.wait_for("elector", message=GAINED, within=GO_ROUND + 5)
                await go.wait_for("leader", is_leader=True, leader_id="go-second")
                if url.startswith("postgres"):
                    # Go bid at once because river_anyio's resignation woke it (River's
                    # `resigned` notification), not on its next round. On SQLite, as River's
                    # driver, river_anyio announces nothing: Go finds the lease free later.
                    lines = elector_lines(go)
                    assert lines.index(NOTIFIED) < lines.index(GAINED)
                    (note,) = go.find("elector", message=NOTIFIED)
                    assert note["action"] == "resigned"
                else:
                    assert not go.find("elector", message=NOTIFIED)


async def test_river_go_takes_over_a_river_anyio_lease_left_to_expire(
    river_go: RiverGo, database_url: str
) -> None:
    """A lease river_anyio wrote and never renewed (a client that died) is free for River Go
    once it expires, by River Go's reading of its timestamps; and River Go's own lease is
    live, by river_anyio's reading, until its ``expires_at``."""
    url = database_url
    async with open_driver(url) as driver:
        async with driver.transaction() as tx:
            # one of River Go's rounds minus its jitter: live at Go's first bid, expired by
            # its second (five to six seconds after the first)
            dead = await tx.leader_attempt_elect(leader_id="died", ttl=5.0, now=None)
        assert dead is not None
        async with river_go.run(
            url, queues={QUEUE: 1}, kinds=[Task.kind], report_leader=True
        ) as go:
            await go.wait_for("elector", message=GAINED, within=GO_ROUND + 5)
            bids = [m for m in elector_lines(go) if m in (BID, DENIED, GAINED)]
            assert bids == [BID, DENIED, BID, GAINED]
            await go.wait_for("leader", is_leader=True, leader_id=go.client_id)
            # (River Go renews five seconds after its election: these checks take much less)
            lease = await driver.executor().leader_get_elected()
            assert lease is not None and lease.leader_id == go.client_id
            assert lease.expires_at - lease.elected_at >= dt.timedelta(seconds=15)  # Go's TTL
            just_before = lease.expires_at - dt.timedelta(milliseconds=1)
            assert await driver.executor().leader_delete_expired(now=just_before) == 0
            with pytest.raises(Rollback):  # not to take the lease from under River Go
                async with driver.transaction() as tx:
                    after = lease.expires_at + dt.timedelta(milliseconds=1)
                    assert await tx.leader_delete_expired(now=after) == 1
                    raise Rollback
            kept = await driver.executor().leader_get_elected()
            assert kept is not None
            assert (kept.leader_id, kept.elected_at) == (lease.leader_id, lease.elected_at)


class Rollback(Exception):
    pass


async def test_never_leader_river_anyio_beside_river_go(
    river_go: RiverGo, database_url: str
) -> None:
    """A never-leader river_anyio client never takes the lease, even when it is free; the
    River Go leader's maintenance serves its jobs (here: makes a scheduled job available)."""
    url = database_url
    worker = ScriptedWorker()
    async with river.open_client(
        url,
        queues={QUEUE: river.QueueConfig(max_workers=5)},
        workers=python_workers(worker),
        fetch_only_known_kinds=True,
        leader_election_disabled=True,
        config=ClientConfig(
            elect_interval=0.2
        ),  # were it electing, it would bid five times a second
        **CLIENT_OPTIONS,
    ) as run:
        with run.subscribe() as sub:
            async with river_go.run(
                url, queues={QUEUE: 5}, kinds=[LEGACY], fetch_only_known_kinds=True,
                report_leader=True,
            ) as go:  # fmt: skip
                await go.wait_for("elector", message=GAINED)
                # the lease was free when Go started: its first bid won
                bids = [m for m in elector_lines(go) if m in (BID, DENIED, GAINED)]
                assert bids[:2] == [BID, GAINED]
                await go.wait_for("leader", is_leader=True, leader_id=go.client_id)
                # no river_anyio scheduler here: River Go's makes the job available
                at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.5)
                inserted = await run.client.insert(
                    Moved(label="later"), river.InsertOpts(queue=QUEUE, scheduled_at=at)
                )
                assert inserted.job.state is river.JobState.SCHEDULED
                events = await collect(sub, [inserted.job.id], {E.JOB_COMPLETED})
                done = events[inserted.job.id].job
                assert done is not None and done.attempted_by == (run.client.id,)
                assert not go.find("job_started", kind=Moved.kind)
            assert RESIGNED in elector_lines(go)
            # the lease is free again; an electing client would take it within its interval
            with anyio.move_on_after(10 * 0.2):
                await wait_leader_event(sub, "leader_elected")
                pytest.fail("a never-leader client was elected")
            assert not run.is_leader
            assert (await run.client.driver.executor().leader_get_elected()) is None


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
