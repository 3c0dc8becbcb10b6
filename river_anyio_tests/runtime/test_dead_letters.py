"""Dead letters and stalls, reported: ``job_discarded`` for each way a job reaches
``discarded`` and ``job_rescued`` from the leader's rescuer, on both loops and both databases."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio._config import ClientConfig
from river_anyio._events import EventHub
from river_anyio._runtime._maintenance import RESCUE_ERROR, JobRescuer, JobScheduler
from river_anyio.drivers import Driver, JobRescue

from ..faulty import open_faulty
from .conftest import WAIT, FixedClock, next_event
from .test_maintenance import Env, Known, env, insert, update

pytestmark = pytest.mark.anyio
S = river.JobState
E = river.EventKind
UTC = dt.UTC
H = dt.timedelta(hours=1)


class DayAhead:
    """A retry policy a day ahead: a retried job is never due during a test."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def next_retry(self, job: river.JobRow, now: dt.datetime) -> dt.datetime:
        self.calls.append(job.id)
        return now + dt.timedelta(days=1)


@attrs.frozen
class Outcome:
    kind: ClassVar[str] = "dead_outcome"
    mode: str


@attrs.frozen
class Nobody:
    """Args of a kind no worker is registered for."""

    kind: ClassVar[str] = "dead_nobody"


async def outcome_worker(ctx: river.WorkContext, job: river.Job[Outcome]) -> Any:
    if job.args.mode == "discard":
        return river.discard("not worth it")
    raise RuntimeError(f"broken {job.args.mode}")


async def test_job_discarded_for_each_worker_outcome(database_url: str) -> None:
    workers = river.Workers()
    workers.add(Outcome, outcome_worker)
    last = river.InsertOpts(max_attempts=1)
    async with river.open_client(
        database_url,
        queues={"default": river.QueueConfig(max_workers=10)},
        workers=workers,
        retry_policy=DayAhead(),
        leader_election_disabled=True,
        fetch_cooldown=0.01,
    ) as run:
        with run.subscribe(E.JOB_FAILED, E.JOB_DISCARDED) as sub:
            results = await run.client.insert_many(
                [
                    river.InsertManyParams(Outcome("exhausted"), last),
                    river.InsertManyParams(Outcome("discard")),  # 25 attempts left, discarded
                    river.InsertManyParams(Nobody(), last),
                    river.InsertManyParams(Outcome("retried")),  # fails, retries a day ahead
                ]
            )
            exhausted, discarded, unknown, retried = (r.job.id for r in results)
            seen: list[tuple[river.EventKind, int]] = []
            causes: dict[int, Any] = {}
            failed_rows: dict[int, river.JobRow] = {}
            with anyio.fail_after(WAIT):
                async for ev in sub:
                    assert ev.job is not None
                    seen.append((ev.kind, ev.job.id))
                    if ev.kind is E.JOB_DISCARDED:
                        causes[ev.job.id] = ev.details["cause"]
                        assert ev.job.state is S.DISCARDED and ev.job.finalized_at is not None
                        assert ev.error is not None and ev.timings is not None
                    else:
                        failed_rows[ev.job.id] = ev.job
                    if len(causes) == 3 and len(failed_rows) == 4:
                        break
            assert causes == {
                exhausted: "attempts_exhausted",
                discarded: "discard",
                unknown: "unknown_kind",
            }
            # job_failed still fires for every failed attempt, before job_discarded
            for job_id in causes:
                assert seen.index((E.JOB_FAILED, job_id)) < seen.index((E.JOB_DISCARDED, job_id))
            assert failed_rows[retried].state is S.RETRYABLE
            assert (E.JOB_DISCARDED, retried) not in seen


def leader(url: str, workers: river.Workers, **options: Any) -> Any:
    """A client that leads at once and runs its rescuer every 50 ms."""
    return river.open_client(
        url,
        ClientConfig(elect_interval=0.2, maintenance_stagger=False),
        queues={"default": river.QueueConfig(max_workers=1)},
        workers=workers,
        fetch_cooldown=0.01,
        maintenance=river.MaintenanceConfig(rescuer_interval=0.05),
        **options,
    )


async def make_stuck(driver: Driver, job_id: int, attempt: int, **cols: Any) -> None:
    """Leave the job ``running`` as a client that went away two hours ago would."""
    now = dt.datetime.now(UTC)
    await update(driver, job_id, state="running", attempt=attempt, attempted_at=now - 2 * H, **cols)


async def test_rescuer_reports_rescues_with_their_count_on_the_leader(database_url: str) -> None:
    policy = DayAhead()
    workers = river.Workers()
    workers.add(Known, _noop, retry_policy=policy)  # the kind's policy, used by the rescuer
    async with leader(database_url, workers) as run:
        await run.wait_leading()
        driver = run.client.driver
        with run.subscribe(E.JOB_RESCUED, E.JOB_DISCARDED) as sub:
            # in a queue nobody works, so only the rescuer touches them
            job = await insert(driver, 1, queue="stuck", max_attempts=3)
            cancel = await insert(driver, 2, queue="stuck")
            await make_stuck(
                driver, cancel.id, 1, metadata={"cancel_attempted_at": "2024-01-02T03:04:05Z"}
            )
            cancelled = await next_event(sub, E.JOB_RESCUED, job_id=cancel.id)
            assert cancelled.details == {"rescue_count": 1, "outcome": "cancelled"}
            assert cancelled.job is not None and cancelled.job.state is S.CANCELLED

            for attempt in (1, 2):
                await make_stuck(driver, job.id, attempt)
                ev = await next_event(sub, E.JOB_RESCUED, job_id=job.id)
                assert ev.details == {"rescue_count": attempt, "outcome": "retried"}
                assert ev.error == RESCUE_ERROR and ev.queue == "stuck"
                row = ev.job
                assert row is not None and row.state is S.RETRYABLE
                assert row.metadata["river:rescue_count"] == attempt
                assert row.scheduled_at > dt.datetime.now(UTC) + 12 * H  # the kind's policy
                assert [e.error for e in row.errors] == [RESCUE_ERROR] * attempt
            assert policy.calls == [job.id, job.id]

            await make_stuck(driver, job.id, 3)  # its last attempt
            ev = await next_event(sub, E.JOB_RESCUED, job_id=job.id)
            assert ev.details == {"rescue_count": 3, "outcome": "discarded"}
            dead = await next_event(sub, E.JOB_DISCARDED, job_id=job.id)
            assert dead.details == {"cause": "rescuer"} and dead.error == RESCUE_ERROR
            assert dead.job is not None and dead.job.state is S.DISCARDED
            assert dead.job.finalized_at is not None
            # the cancelled job was not reported as discarded
            while True:
                try:
                    extra = sub.receive_nowait()
                except anyio.WouldBlock:
                    break
                assert extra.kind is not E.JOB_DISCARDED or extra.job.id != cancel.id  # type: ignore[union-attr]


async def _noop(ctx: river.WorkContext, job: river.Job[Any]) -> None:
    pass


async def test_rescuer_reads_rows_back_only_for_subscribers(
    database_url: str, t0: dt.datetime
) -> None:
    async with open_faulty(database_url) as driver:
        e = Env(driver=driver, clock=FixedClock(t0), events=EventHub(), triggered=[])
        svc: JobRescuer = e.service(JobRescuer)
        for n in range(2):
            job = await insert(driver, n)
            await update(driver, job.id, state="running", attempt=1, attempted_at=t0 - 2 * H)
        await svc.run_once()  # nobody subscribes: River's statement, no rows read back
        assert driver.calls["job_rescue_many"] == 1
        assert driver.calls["job_rescue_many_returning"] == 0
        assert svc.rescued == 2
        job = await insert(driver, 9)
        await update(driver, job.id, state="running", attempt=1, attempted_at=t0 - 2 * H)
        with e.events.subscribe([E.JOB_RESCUED]) as sub:
            await svc.run_once()
            assert driver.calls["job_rescue_many"] == 1
            assert driver.calls["job_rescue_many_returning"] == 1
            ev = sub.receive_nowait()
            assert ev.kind is E.JOB_RESCUED and ev.job is not None and ev.job.id == job.id
            assert ev.details == {"rescue_count": 1, "outcome": "retried"}


async def test_scheduler_reports_unique_conflict_discards(
    database_url: str, t0: dt.datetime
) -> None:
    mask = sum(
        1 << i
        for i, s in enumerate(sorted(S, key=lambda s: s.value))
        if s in (S.AVAILABLE, S.COMPLETED, S.PENDING, S.RUNNING, S.SCHEDULED)
    )
    async with env(database_url, FixedClock(t0)) as e:
        await insert(e.driver, 1, unique_key=b"held", unique_states=mask)
        blocked = await insert(
            e.driver, 2, state=S.RETRYABLE, scheduled_at=t0 - H, unique_key=b"held",
            unique_states=mask,
        )  # fmt: skip
        await insert(e.driver, 3, state=S.RETRYABLE, scheduled_at=t0 - H)
        with e.events.subscribe([E.JOB_DISCARDED]) as sub:
            await e.service(JobScheduler).run_once()
            ev = sub.receive_nowait()
            assert ev.job is not None and ev.job.id == blocked.id
            assert ev.job.state is S.DISCARDED
            assert ev.details == {"cause": "unique_conflict"}
            with pytest.raises(anyio.WouldBlock):
                sub.receive_nowait()


@pytest.fixture
def t0() -> dt.datetime:
    return dt.datetime.now(UTC).replace(microsecond=0) - dt.timedelta(days=3)


async def test_rescue_returning_gives_back_only_the_rows_it_changed(
    database_url: str, t0: dt.datetime
) -> None:
    async with env(database_url, FixedClock(t0)) as e:
        ex = e.driver.executor()
        stuck = await insert(e.driver, 1, metadata=b'{"river:rescue_count": 4, "x": 1}')
        await update(e.driver, stuck.id, state="running", attempt=1, attempted_at=t0 - 2 * H)
        done = await insert(e.driver, 2)  # finished meantime: the guard leaves it alone
        await update(e.driver, done.id, state="completed", finalized_at=t0)
        error = b'{"at":"2024-01-01T00:00:00Z","attempt":1,"error":"stuck","trace":""}'
        rescues = [
            JobRescue(id=j.id, state=S.DISCARDED, error=error, scheduled_at=t0, finalized_at=t0)
            for j in (stuck, done)
        ]
        (row,) = await ex.job_rescue_many_returning(rescues, stuck_horizon=t0 - H)
        assert row.id == stuck.id and row.state is S.DISCARDED and row.finalized_at == t0
        assert row.metadata["river:rescue_count"] == 5 and row.metadata["x"] == 1
        assert [x.error for x in row.errors] == ["stuck"]
        assert (await ex.job_get_by_id(done.id)).state is S.COMPLETED  # type: ignore[union-attr]
        assert await ex.job_rescue_many_returning([], stuck_horizon=t0) == []
