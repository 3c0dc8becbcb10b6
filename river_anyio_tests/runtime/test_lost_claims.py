"""A claim whose reply is lost: the jobs it committed ``running`` are given back at once (not
left for the rescuer) and none runs twice.

The reply is lost for real: through the fault-injecting driver (the claim runs and commits,
then the call raises as a broken connection would), on both databases, and on PostgreSQL
through a TCP proxy that forwards the claim and closes the connection once the server has
answered. The client never leads, so no rescuer runs: a lost job that were not recovered
would stay ``running`` and the test would time out.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import attrs
import pytest

import river_anyio as river

from ..faulty import open_faulty
from ..pgproxy import PgProxy
from .lifecycle_support import SOON, other_driver

pytestmark = pytest.mark.anyio

CLIENT = "lost-claims-client"
JOBS = 60
PRODUCER = "river_anyio.producer"


@attrs.frozen
class Counted:
    kind: ClassVar[str] = "counted"
    n: int


@attrs.define(eq=False)
class Counter:
    """A worker that counts the runs of each job."""

    runs: collections.Counter[int] = attrs.field(factory=collections.Counter)
    first_ran: anyio.Event = attrs.field(factory=anyio.Event)
    on_first: Callable[[], None] | None = None
    _changed: anyio.Event = attrs.field(factory=anyio.Event)

    async def work(self, ctx: river.WorkContext, job: river.Job[Counted]) -> None:
        if not self.first_ran.is_set():
            self.first_ran.set()
            if self.on_first is not None:
                self.on_first()
        self.runs[job.id] += 1
        self._changed.set()
        self._changed = anyio.Event()
        await anyio.lowlevel.checkpoint()

    async def ran(self, n: int) -> None:
        """Wait until ``n`` different jobs have run."""
        while len(self.runs) < n:
            await self._changed.wait()

    def workers(self) -> river.Workers:
        workers = river.Workers()
        workers.add(Counted, self.work)
        return workers


def options(**extra: Any) -> dict[str, Any]:
    return {
        "id": CLIENT,
        "queues": {"default": river.QueueConfig(max_workers=5)},
        "leader_election_disabled": True,  # no rescuer: only the recovery can save lost jobs
        "fetch_cooldown": 0.01,
        **extra,
    }


async def insert_jobs(database: Any, n: int = JOBS) -> list[int]:
    async with river.open_client(database) as inserter:
        results = await inserter.client.insert_many([Counted(i) for i in range(n)])
    return [r.job.id for r in results]


async def assert_each_ran_once_and_completed(url: str, ids: list[int], counter: Counter) -> None:
    assert sorted(counter.runs) == sorted(ids)
    twice = {i: n for i, n in counter.runs.items() if n != 1}
    assert twice == {}, f"jobs run more than once: {twice}"
    async with other_driver(url) as driver:
        rows = await driver.executor().job_list(ids=ids, limit=len(ids))
    assert len(rows) == len(ids)
    assert [r.id for r in rows if r.state is not river.JobState.COMPLETED] == []
    # a given-back job had its attempt restored: its one real run is attempt 1
    assert {r.attempt for r in rows} == {1}
    assert all(r.errors == () for r in rows)


def recovery_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "river_event", None) == "lost_claim_recovered"]


def assert_logged_recovery(caplog: pytest.LogCaptureFixture, lost: list[int]) -> None:
    (record,) = recovery_records(caplog)
    assert record.name == PRODUCER
    assert record.levelno == logging.WARNING
    assert record.river_queue == "default"  # type: ignore[attr-defined]
    assert record.river_client_id == CLIENT  # type: ignore[attr-defined]
    assert record.river_job_ids == sorted(lost)  # type: ignore[attr-defined]
    assert f"gave back {len(lost)} jobs" in record.getMessage()
    assert f"({len(lost)} available again, 0 cancelled meanwhile)" in record.getMessage()


# --- through the fault-injecting driver (both databases) -------------------------------------


async def test_a_lost_claim_reply_is_given_back_at_once(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=PRODUCER)
    async with open_faulty(database_url) as faulty:
        ids = await insert_jobs(faulty)
        # the second claim commits, and its reply is lost: by then jobs of the first claim
        # have run, and some of their completions are not written yet
        fault = faulty.drop_reply("job_get_available", skip=1)
        counter = Counter()
        with anyio.fail_after(SOON):
            async with river.open_client(faulty, workers=counter.workers(), **options()):
                await counter.ran(len(ids))
        assert fault.hits == 1
        (lost,) = fault.replies
        assert lost, "the dropped claim took no jobs"
        assert all(j.state is river.JobState.RUNNING for j in lost)
        assert faulty.calls["job_give_back_lost_claims"] == 1
    await assert_each_ran_once_and_completed(database_url, ids, counter)
    assert_logged_recovery(caplog, [j.id for j in lost])


async def test_a_claim_past_its_bound_is_given_up_and_retried(
    database_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim is shielded from the client's cancellation but bounded by its own deadline:
    one that outlasts it fails with a timeout (logged), and the next claim takes the jobs."""
    from river_anyio._runtime import _producer

    monkeypatch.setattr(_producer, "HOT_OPERATION_TIMEOUT", 0.2)
    caplog.set_level(logging.WARNING, logger=PRODUCER)
    async with open_faulty(database_url) as faulty:
        ids = await insert_jobs(faulty)
        stuck = faulty.delay("job_get_available", seconds=30, skip=1)
        counter = Counter()
        with anyio.fail_after(SOON):
            async with river.open_client(faulty, workers=counter.workers(), **options()):
                await counter.ran(len(ids))
        assert stuck.hits == 1
    await assert_each_ran_once_and_completed(database_url, ids, counter)
    (failed,) = [r for r in caplog.records if getattr(r, "river_event", None) == "fetch_failed"]
    assert failed.levelno == logging.WARNING
    assert "claim took longer than 0.2s" in failed.getMessage()


async def test_a_recovery_that_fails_is_retried_before_the_next_claim(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=PRODUCER)
    async with open_faulty(database_url) as faulty:
        ids = await insert_jobs(faulty)
        fault = faulty.drop_reply("job_get_available", skip=1)
        refused = faulty.fail("job_give_back_lost_claims", times=2)  # still disconnected
        counter = Counter()
        with anyio.fail_after(SOON):
            async with river.open_client(faulty, workers=counter.workers(), **options()):
                await counter.ran(len(ids))
        assert (fault.hits, refused.hits) == (1, 2)
        assert faulty.calls["job_give_back_lost_claims"] == 3
        # no claim was sent while the recovery was failing
        claims = faulty.calls["job_get_available"]
        (lost,) = fault.replies
    await assert_each_ran_once_and_completed(database_url, ids, counter)
    assert_logged_recovery(caplog, [j.id for j in lost])
    failed = [
        r for r in caplog.records if getattr(r, "river_event", None) == "lost_claim_recovery_failed"
    ]
    assert len(failed) == 2 and all(r.levelno == logging.WARNING for r in failed)
    assert claims >= 3


async def test_a_recovery_refused_for_good_leaves_the_jobs_to_the_rescuer(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A permanent failure gives up (logged as an error) instead of blocking claims: the
    other jobs are worked, the lost ones stay running for the rescuer."""
    caplog.set_level(logging.WARNING, logger=PRODUCER)
    async with open_faulty(database_url) as faulty:
        ids = await insert_jobs(faulty, 20)
        fault = faulty.drop_reply("job_get_available", skip=1)
        faulty.fail("job_give_back_lost_claims", lambda: river.DatabaseError("refused"), times=None)
        counter = Counter()
        with anyio.fail_after(SOON):
            async with river.open_client(faulty, workers=counter.workers(), **options()):
                await fault.hit.wait()
                lost_ids = {j.id for j in fault.replies[0]}
                await counter.ran(len(ids) - len(lost_ids))
        assert lost_ids
        assert faulty.calls["job_give_back_lost_claims"] == 1
    assert set(counter.runs) == set(ids) - lost_ids
    async with other_driver(database_url) as driver:
        rows = await driver.executor().job_list(ids=list(lost_ids), limit=len(lost_ids))
    assert {r.state for r in rows} == {river.JobState.RUNNING}
    (record,) = [
        r for r in caplog.records if getattr(r, "river_event", None) == "lost_claim_recovery_failed"
    ]
    assert record.levelno == logging.ERROR and "left to the rescuer" in record.getMessage()


async def test_no_recovery_without_a_failed_claim(database_url: str) -> None:
    """The happy path sends no recovery statement; nor does a claim the database refused
    (it rolled back: nothing can have been claimed)."""
    async with open_faulty(database_url) as faulty:
        ids = await insert_jobs(faulty, 20)
        refused = faulty.fail("job_get_available", lambda: river.DatabaseError("refused"))
        counter = Counter()
        with anyio.fail_after(SOON):
            async with river.open_client(faulty, workers=counter.workers(), **options()):
                await counter.ran(len(ids))
        assert refused.hits == 1
        assert faulty.calls["job_give_back_lost_claims"] == 0
    await assert_each_ran_once_and_completed(database_url, ids, counter)


# --- a real broken connection (PostgreSQL, through a proxy) ------------------------------------

#: Only the claim statement sets rows running.
CLAIM_MARKER = b"SET state = 'running'"


async def test_a_claim_whose_connection_breaks_after_commit_is_recovered(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=PRODUCER)
    ids = await insert_jobs(pg_url)
    proxy = PgProxy(pg_url, CLAIM_MARKER)
    # armed once the first job runs: the next claim is forwarded, commits, and its
    # connection is closed before the answer reaches the client
    counter = Counter(on_first=proxy.arm)
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        with anyio.fail_after(SOON):
            async with river.open_client(
                proxy.url(pg_url),
                workers=counter.workers(),
                driver_options={"prepare_threshold": None},  # the claim's text on the wire
                **options(),
            ):
                await counter.ran(len(ids))
        tg.cancel_scope.cancel("test over")
    assert proxy.drops == 1
    await assert_each_ran_once_and_completed(pg_url, ids, counter)
    (record,) = recovery_records(caplog)
    assert record.name == PRODUCER and record.levelno == logging.WARNING
    lost = record.river_job_ids  # type: ignore[attr-defined]
    assert lost and set(lost) <= set(ids)
    # the broken claim was logged as a failed fetch before it was recovered
    assert any(getattr(r, "river_event", None) == "fetch_failed" for r in caplog.records)
