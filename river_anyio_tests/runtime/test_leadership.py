"""Leader election within one process: who leads, handing over, resigning on request, losing
the lease, the leader scope, and clients that never lead (both databases, both loops)."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import anyio
import attrs
import pytest
from anyio.abc import TaskGroup

import river_anyio as river
from river_anyio._config import ClientConfig
from river_anyio.drivers import TOPIC_LEADERSHIP, open_driver

from .conftest import WAIT, next_event

pytestmark = pytest.mark.anyio
K = river.EventKind
#: A short election interval: the lease lasts three of them.
INTERVAL = 0.3


#: Another client takes the lease for an hour, in one statement.
STEAL_PG = """UPDATE river_leader SET leader_id = 'usurper',
    elected_at = now() - interval '1 second', expires_at = now() + interval '1 hour'"""
STEAL_SQLITE = """UPDATE river_leader SET leader_id = 'usurper',
    elected_at = datetime('now', 'subsec', '-1 seconds'),
    expires_at = datetime('now', 'subsec', '+3600 seconds')"""


@attrs.frozen
class Ping:
    kind: ClassVar[str] = "leader_ping"


def workers() -> river.Workers:
    w = river.Workers()

    @w.register(Ping)
    async def work(ctx: river.WorkContext, job: river.Job[Ping]) -> None:
        pass

    return w


def options(client_id: str, **kw: Any) -> dict[str, Any]:
    """A ClientConfig's fields (the private tuning hook included): ``tuned(options(...))``."""
    base: dict[str, Any] = {
        "id": client_id,
        "queues": {"default": river.QueueConfig(max_workers=2)},
        "workers": workers(),
        "fetch_cooldown": 0.01,
        "soft_stop_timeout": 2.0,
        "elect_interval": INTERVAL,
        "maintenance_stagger": False,
    }
    base.update(kw)
    return base


def tuned(client_id: str, **kw: Any) -> ClientConfig:
    return ClientConfig(**options(client_id, **kw))


async def start(tg: TaskGroup, url: str, client_id: str, **kw: Any) -> river.ClientRun:
    run: river.ClientRun = await tg.start(river.run_client, url, tuned(client_id, **kw))
    return run


async def leading(run: river.ClientRun, events: river.Subscription) -> None:
    """Until ``run`` leads (``events`` subscribed to LEADER_ELECTED before the call: the
    election may have happened before the subscription)."""
    if not run.is_leader:
        ev = await next_event(events, K.LEADER_ELECTED)
        assert ev.details["client_id"] == run.config.id


async def lease_holder(url: str) -> str | None:
    async with open_driver(url) as driver:
        row = await driver.executor().leader_get_elected()
    return row.leader_id if row is not None else None


@contextlib.asynccontextmanager
async def clients(url: str) -> AsyncIterator[TaskGroup]:
    with anyio.fail_after(4 * WAIT):
        async with anyio.create_task_group() as tg:
            yield tg
            tg.cancel_scope.cancel()


async def test_one_client_leads_and_a_stopping_leader_hands_over_at_once(
    database_url: str,
) -> None:
    # a long interval: on PostgreSQL the follower takes over because the leader said it
    # resigned, not because it polled; on SQLite, as with River's driver, the leader says
    # nothing and the follower takes over at its next bid
    slow = 3.0
    async with clients(database_url) as tg:
        a = await start(tg, database_url, "leader-a", elect_interval=slow)
        with a.subscribe(K.LEADER_ELECTED, K.LEADER_LOST) as a_events:
            await leading(a, a_events)
            b = await start(tg, database_url, "leader-b", elect_interval=slow)
            with b.subscribe(K.LEADER_ELECTED) as b_events:
                assert a.is_leader and not b.is_leader
                assert await lease_holder(database_url) == "leader-a"
                a.stop()
                stopped_at = anyio.current_time()
                assert a.stopping
                with anyio.fail_after(WAIT):
                    await a.wait_stopping()  # at once: the stop has begun
                lost = await next_event(a_events, K.LEADER_LOST)
                assert lost.details["reason"] == "stopping"
                await next_event(b_events, K.LEADER_ELECTED)
                handover = anyio.current_time() - stopped_at
                bound = 1.0 if a.client.driver.dialect == "postgres" else slow * 1.2 + 1.0
                assert handover < bound, f"handover took {handover:.2f}s"
                assert b.is_leader and not a.is_leader
                assert await lease_holder(database_url) == "leader-b"
        await a.wait()
        b.stop()
        await b.wait()
    assert await lease_holder(database_url) is None  # b resigned too


async def test_the_leader_schedules_jobs_and_a_follower_does_not(database_url: str) -> None:
    maintenance = river.MaintenanceConfig(scheduler_interval=0.1)
    async with clients(database_url) as tg:
        run = await start(tg, database_url, "solo", maintenance=maintenance)
        with run.subscribe(K.LEADER_ELECTED, K.JOB_COMPLETED) as events:
            await leading(run, events)
            at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.5)
            res = await run.client.insert(Ping(), river.InsertOpts(scheduled_at=at))
            assert res.job.state is river.JobState.SCHEDULED
            ev = await next_event(events, K.JOB_COMPLETED, job_id=res.job.id)
            assert ev.job is not None and ev.job.scheduled_at == res.job.scheduled_at
        run.stop()


async def test_request_resign_and_a_lost_lease_end_the_term_and_its_services(
    database_url: str,
) -> None:
    maintenance = river.MaintenanceConfig(scheduler_interval=0.1)
    async with clients(database_url) as tg:
        run = await start(tg, database_url, "resigner", maintenance=maintenance)
        with run.subscribe(K.LEADER_ELECTED, K.LEADER_LOST, K.JOB_COMPLETED) as events:
            await leading(run, events)
            assert run.diagnostics.leader_terms == 1
            assert set(run.diagnostics.leader_services) >= {"scheduler", "rescuer"}
            async with open_driver(database_url) as driver:
                ex = driver.executor()
                # River's RequestResign: the leader resigns, then competes again
                await ex.notify_many(
                    TOPIC_LEADERSHIP, ['{"action":"request_resign","leader_id":""}']
                )
                lost = await next_event(events, K.LEADER_LOST)
                assert lost.details["reason"] == "resigned"
                await next_event(events, K.LEADER_ELECTED)
                assert run.diagnostics.leader_terms == 2  # a new term (with new services)

                # someone else takes the lease (as after a partition): the term is lost, the
                # services stop with it
                await ex.exec_script(STEAL_PG if driver.dialect == "postgres" else STEAL_SQLITE)
                lost = await next_event(events, K.LEADER_LOST)
                assert lost.details["reason"] == "lost"
                assert not run.is_leader
                assert run.diagnostics.leader_services == ()
                at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.2)
                res = await run.client.insert(Ping(), river.InsertOpts(scheduled_at=at))
                # nobody schedules it: not this client's scheduler, whose scope was cancelled
                await anyio.sleep(1.0)
                row = await ex.job_get_by_id(res.job.id)
                assert row is not None and row.state is river.JobState.SCHEDULED
                assert await lease_holder(database_url) == "usurper"

                # the lease is free again: leading again, the job gets scheduled and worked
                await ex.exec_script("DELETE FROM river_leader")
                with anyio.fail_after(WAIT):
                    await run.wait_leading()
                assert run.diagnostics.leader_terms == 3
                await next_event(events, K.JOB_COMPLETED, job_id=res.job.id)
        run.stop()


async def test_a_client_with_leader_election_disabled_never_leads(database_url: str) -> None:
    async with clients(database_url) as tg:
        run = await start(tg, database_url, "never", leader_election_disabled=True)
        with run.subscribe(K.LEADER_ELECTED) as events:
            await anyio.sleep(5 * INTERVAL)  # several elections' worth of time
            with pytest.raises(anyio.WouldBlock):
                events.receive_nowait()
        assert not run.is_leader
        with pytest.raises(river.ValidationError, match="never leads"):
            await run.wait_leading()
        assert await lease_holder(database_url) is None
        # it still works its queues
        with run.subscribe(K.JOB_COMPLETED) as done:
            res = await run.client.insert(Ping())
            await next_event(done, K.JOB_COMPLETED, job_id=res.job.id)
        run.stop()


def test_maintenance_settings_on_a_never_leader_are_ignored_with_a_warning(
    database_url: str,
) -> None:
    m = river.MaintenanceConfig(scheduler_interval=1)
    config = tuned("x", leader_election_disabled=True, maintenance=m)
    with pytest.warns(UserWarning, match="maintenance settings are ignored"):
        river.open_client(database_url, config)  # checked by the call, before entering
    assert config.leader_election_disabled
    with pytest.raises(river.ConfigError, match="must be a MaintenanceConfig"):
        tuned("x", maintenance={"scheduler_interval": 1})
    with pytest.raises(river.ConfigError, match="must be a bool"):
        tuned("x", leader_election_disabled="yes")


@attrs.frozen
class Periodic:
    kind: ClassVar[str] = "leader_periodic"


async def test_the_leader_inserts_periodic_jobs_and_workers_run_them(database_url: str) -> None:
    """The enqueuer runs in the leader scope: a run_on_start job is inserted once the client
    leads, and it is worked like any other job."""
    w = workers()
    worked: list[river.Job[Periodic]] = []
    done = anyio.Event()

    @w.register(Periodic)
    async def work(ctx: river.WorkContext, job: river.Job[Periodic]) -> None:
        worked.append(job)
        done.set()

    job = river.PeriodicJob(river.every(3600), Periodic, id="hourly", run_on_start=True)
    async with anyio.create_task_group() as tg:
        run = await start(tg, database_url, "periodic-leader", workers=w, periodic_jobs=[job])
        with anyio.fail_after(WAIT):
            await done.wait()
        assert run.is_leader
        assert len(worked) == 1
        meta = worked[0].row.metadata
        assert meta["periodic"] is True
        assert meta["river:periodic_job_id"] == "hourly"
        run.stop()


async def test_a_never_leader_client_refuses_periodic_jobs(database_url: str) -> None:
    job = river.PeriodicJob(river.every(60), Periodic)
    with pytest.raises(river.ConfigError, match="leader_election_disabled=True never leads"):
        async with river.open_client(
            database_url, periodic_jobs=[job], config=tuned("never", leader_election_disabled=True)
        ):
            pass  # pragma: no cover
    async with river.open_client(
        database_url, tuned("never", leader_election_disabled=True)
    ) as run:
        with pytest.raises(river.ConfigError, match="never leads"):
            run.client.periodic_jobs.add(job)
        assert len(run.client.periodic_jobs) == 0


async def test_periodic_jobs_start_hooks_run_each_time_the_enqueuer_starts(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """River's HookPeriodicJobsStart: once per term, before run-on-start jobs are inserted;
    one that raises is logged and the enqueuer starts anyway."""
    w = workers()
    starts: list[river.PeriodicJobsStartParams] = []
    inserted = 0
    worked = anyio.Event()

    class Counting:
        async def periodic_jobs_start(self, params: river.PeriodicJobsStartParams) -> None:
            starts.append(params)
            assert inserted == len(starts) - 1  # this term's run-on-start job is not in yet

    class Broken:
        def periodic_jobs_start(self, params: river.PeriodicJobsStartParams) -> None:
            raise RuntimeError("start hook broke")

    @w.register(Periodic)
    async def work(ctx: river.WorkContext, job: river.Job[Periodic]) -> None:
        nonlocal inserted
        inserted += 1
        worked.set()

    job = river.PeriodicJob(river.every(3600), Periodic, id="hourly", run_on_start=True)
    caplog.set_level(logging.ERROR, logger="river_anyio")
    async with clients(database_url) as tg:
        run = await start(
            tg, database_url, "hooked", workers=w, periodic_jobs=[job], hooks=[Broken(), Counting()]
        )
        with run.subscribe(K.LEADER_ELECTED, K.LEADER_LOST) as events:
            with anyio.fail_after(WAIT):
                await worked.wait()
            assert [(p.client_id, p.jobs) for p in starts] == [("hooked", (job,))]
            worked = anyio.Event()
            await run.client.request_resign()  # a new term starts the enqueuer again
            lost = await next_event(events, K.LEADER_LOST)
            assert lost.details["reason"] == "resigned"
            await next_event(events, K.LEADER_ELECTED)
            with anyio.fail_after(WAIT):
                await worked.wait()
        run.stop()
    assert len(starts) == 2 and inserted == 2
    messages = [r.getMessage() for r in caplog.records]
    assert sum("Broken.periodic_jobs_start raised" in m for m in messages) == 2


class _Rollback(Exception):
    pass


REQUEST_RESIGN = '{"action":"request_resign","leader_id":""}'


async def test_request_resign_asks_the_leader_to_resign_directly_and_in_transactions(
    database_url: str,
) -> None:
    """River's Notify().RequestResign(Tx) from a client that does not lead: River's exact
    payload; a rolled-back transaction sends nothing, a committed one sends it once."""
    async with clients(database_url) as tg:
        run = await start(tg, database_url, "asked-to-resign")
        with run.subscribe(K.LEADER_ELECTED, K.LEADER_LOST) as events:
            await leading(run, events)
            async with open_driver(database_url) as driver, driver.listener() as listener:
                await listener.listen(TOPIC_LEADERSHIP)
                requester = river.Client(driver, id="requester", max_attempts=25)

                await requester.request_resign()
                lost = await next_event(events, K.LEADER_LOST)
                assert lost.details["reason"] == "resigned"
                await next_event(events, K.LEADER_ELECTED)  # it competes again, and wins

                with pytest.raises(_Rollback):
                    async with requester.transaction() as tx:
                        await requester.request_resign_tx(tx)
                        raise _Rollback
                async with requester.transaction() as tx:
                    await requester.request_resign_tx(tx)
                lost = await next_event(events, K.LEADER_LOST)
                assert lost.details["reason"] == "resigned"
                await next_event(events, K.LEADER_ELECTED)
                assert run.diagnostics.leader_terms == 3

                # what was published, up to a marker sent last
                await driver.executor().notify_many(TOPIC_LEADERSHIP, ['{"marker":true}'])
                requests: list[str] = []
                with anyio.fail_after(WAIT):
                    async for note in listener:
                        if note.payload == '{"marker":true}':
                            break
                        if "request_resign" in note.payload:
                            requests.append(note.payload)
        run.stop()
    assert requests == [REQUEST_RESIGN, REQUEST_RESIGN]
