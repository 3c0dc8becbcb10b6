"""The leader's maintenance services: their effect on real rows, on both databases and both
loops, with a fixed clock (each service is run directly, one run at a time)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio._config import ClientConfig
from river_anyio._events import EventHub
from river_anyio._runtime._maintenance import (
    BATCH_SIZE_DEFAULT,
    BATCH_SIZE_REDUCED,
    RESCUE_ERROR,
    BatchSizes,
    JobCleaner,
    JobRescuer,
    JobScheduler,
    MaintenanceService,
    NotificationCleaner,
    QueueCleaner,
    Reindexer,
)
from river_anyio._timeutil import format_sqlite_timestamp
from river_anyio.drivers import TOPIC_INSERT, Driver, Executor, JobInsertParams, open_driver

from .conftest import WAIT, FixedClock

pytestmark = pytest.mark.anyio
S = river.JobState
UTC = dt.UTC
H = dt.timedelta(hours=1)


@attrs.frozen
class Known:
    kind: ClassVar[str] = "maint_known"
    n: int = 0


class Slow:
    """A worker with its own (long) timeout."""

    async def work(self, ctx: river.WorkContext, job: river.Job[Any]) -> None:
        pass

    def timeout(self, job: river.Job[Any]) -> float:
        return 3 * 3600.0


@attrs.frozen
class SlowArgs:
    kind: ClassVar[str] = "maint_slow"


@attrs.frozen
class Endless:
    kind: ClassVar[str] = "maint_endless"


async def _noop(ctx: river.WorkContext, job: river.Job[Any]) -> None:
    pass


def workers() -> river.Workers:
    w = river.Workers()
    w.add(Known, _noop)
    w.add(SlowArgs, Slow())
    w.add(Endless, _noop, timeout=None)
    return w


def is_pg(driver: Driver) -> bool:
    return driver.dialect == "postgres"


def ts(driver: Driver, value: dt.datetime | None) -> Any:
    if value is None or is_pg(driver):
        return value
    return format_sqlite_timestamp(value)


async def insert(driver: Driver, n: int = 0, **kw: Any) -> river.JobRow:
    base: dict[str, Any] = {
        "encoded_args": json.dumps({"n": n}).encode(),
        "kind": Known.kind,
        "max_attempts": 25,
        "metadata": b"{}",
        "priority": 1,
        "queue": "default",
        "state": S.AVAILABLE,
        "tags": (),
    }
    base.update(kw)
    async with driver.transaction() as tx:
        (res,) = await tx.job_insert_fast_many([JobInsertParams(**base)])
    return res.job


async def update(driver: Driver, job_id: int, **cols: Any) -> None:
    """Set columns of a job as they would be after running (raw SQL, either backend)."""
    p = "%s" if is_pg(driver) else "?"
    sets, values = [], []
    for col, value in cols.items():
        if col == "metadata":
            sets.append(f"metadata = {p}::jsonb" if is_pg(driver) else "metadata = jsonb(?)")
            values.append(json.dumps(value))
        elif col == "state" and is_pg(driver):
            sets.append(f"state = {p}::river_job_state")
            values.append(str(value))
        else:
            sets.append(f"{col} = {p}")
            values.append(ts(driver, value) if isinstance(value, dt.datetime) else value)
    values.append(job_id)
    await driver.executor().execute(
        f"UPDATE river_job SET {', '.join(sets)} WHERE id = {p}", values
    )


async def get(ex: Executor, job_id: int) -> river.JobRow:
    row = await ex.job_get_by_id(job_id)
    assert row is not None
    return row


@attrs.define
class Env:
    driver: Driver
    clock: FixedClock
    events: EventHub
    triggered: list[set[str]]

    def service(self, cls: type[MaintenanceService], **options: Any) -> Any:
        options.setdefault("queues", {"default": river.QueueConfig(max_workers=1)})
        options.setdefault("workers", workers())
        config = ClientConfig(**options, maintenance_stagger=False)
        kw: dict[str, Any] = {
            "driver": self.driver,
            "clock": self.clock,
            "events": self.events,
            "config": config,
        }
        m = config.maintenance
        if cls is JobScheduler:
            client = river.Client(self.driver, id="leader", max_attempts=25)
            kw.update(
                interval=m.scheduler_interval,
                notify_insert=client._notify_queues,
                after_commit=self.triggered.append,
            )
        elif cls is not Reindexer:
            kw["interval"] = 0.05
        return cls(**kw)


@asynccontextmanager
async def env(url: str, clock: FixedClock) -> AsyncIterator[Env]:
    async with open_driver(url) as driver:
        yield Env(driver=driver, clock=clock, events=EventHub(), triggered=[])


@pytest.fixture
def t0() -> dt.datetime:
    return dt.datetime.now(UTC).replace(microsecond=0) - dt.timedelta(days=3)


# --- scheduler -------------------------------------------------------------------------------


async def test_scheduler_makes_due_jobs_available_looking_one_interval_ahead(
    database_url: str, t0: dt.datetime
) -> None:
    clock = FixedClock(t0)
    async with env(database_url, clock) as e:
        due = await insert(e.driver, 1, state=S.SCHEDULED, scheduled_at=t0 - H)
        retry = await insert(e.driver, 2, state=S.RETRYABLE, scheduled_at=t0 - dt.timedelta(1))
        soon = await insert(
            e.driver, 3, state=S.SCHEDULED, scheduled_at=t0 + dt.timedelta(seconds=4), queue="q2"
        )
        later = await insert(e.driver, 4, state=S.SCHEDULED, scheduled_at=t0 + dt.timedelta(6))
        other = await insert(e.driver, 5, state=S.SCHEDULED, scheduled_at=t0 - H, queue="q3")
        svc = e.service(JobScheduler)
        async with e.driver.listener() as listener:
            await listener.listen(TOPIC_INSERT)
            await svc.run_once()
            ex = e.driver.executor()
            for job in (due, retry, soon, other):
                row = await get(ex, job.id)
                assert row.state is S.AVAILABLE
                assert row.scheduled_at == job.scheduled_at  # kept
            assert (await get(ex, later.id)).state is S.SCHEDULED
            # queues of jobs due now were told (not q2's job, due in 4 s) ...
            got = set()
            with anyio.fail_after(WAIT):
                async for note in listener:
                    got.add(json.loads(note.payload)["queue"])
                    if got >= {"default", "q3"}:
                        break
            assert got == {"default", "q3"}
        # ... and this client's own producers poked after the commit
        assert e.triggered == [{"default", "q3"}]
        assert svc.scheduled == 4
        # the clock moves on: the later job's time comes
        clock.at = t0 + dt.timedelta(days=6)
        await svc.run_once()
        assert (await get(ex, later.id)).state is S.AVAILABLE


async def test_scheduler_discards_unique_conflicts(database_url: str, t0: dt.datetime) -> None:
    # unique states without `retryable`, so retryable rows may share a key (River's case)
    mask = sum(
        1 << i
        for i, s in enumerate(sorted(S, key=lambda s: s.value))
        if s in (S.AVAILABLE, S.COMPLETED, S.PENDING, S.RUNNING, S.SCHEDULED)
    )
    async with env(database_url, FixedClock(t0)) as e:
        holder = await insert(e.driver, 1, unique_key=b"held", unique_states=mask)
        blocked = await insert(
            e.driver, 2, state=S.RETRYABLE, scheduled_at=t0 - H, unique_key=b"held",
            unique_states=mask,
        )  # fmt: skip
        first = await insert(
            e.driver, 3, state=S.RETRYABLE, scheduled_at=t0 - 2 * H, unique_key=b"pair",
            unique_states=mask,
        )  # fmt: skip
        second = await insert(
            e.driver, 4, state=S.RETRYABLE, scheduled_at=t0 - H, unique_key=b"pair",
            unique_states=mask,
        )  # fmt: skip
        plain = await insert(e.driver, 5, state=S.RETRYABLE, scheduled_at=t0 - H)
        await e.service(JobScheduler).run_once()
        ex = e.driver.executor()
        assert (await get(ex, holder.id)).state is S.AVAILABLE
        assert (await get(ex, first.id)).state is S.AVAILABLE
        assert (await get(ex, plain.id)).state is S.AVAILABLE
        for job in (blocked, second):
            row = await get(ex, job.id)
            assert row.state is S.DISCARDED
            assert row.finalized_at == t0
            assert row.metadata.get("unique_key_conflict") == "scheduler_discarded"


# --- rescuer ---------------------------------------------------------------------------------


async def test_rescuer_rescues_stuck_jobs(database_url: str, t0: dt.datetime) -> None:
    async with env(database_url, FixedClock(t0)) as e:

        async def running(n: int, since: dt.timedelta, **kw: Any) -> river.JobRow:
            job = await insert(e.driver, n, **{k: v for k, v in kw.items() if k != "meta"})
            cols: dict[str, Any] = {"state": "running", "attempt": kw.get("attempt", 1)}
            cols["attempted_at"] = t0 - since
            if "meta" in kw:
                cols["metadata"] = kw["meta"]
            await update(e.driver, job.id, **cols)
            return job

        stuck = await running(1, 2 * H, meta={"river:rescue_count": 2, "x": 1})
        fresh = await running(2, dt.timedelta(minutes=30))
        spent = await running(3, 2 * H, max_attempts=1)
        unknown = await running(4, 2 * H, kind="maint_unknown")
        slow = await running(5, 2 * H, kind=SlowArgs.kind, encoded_args=b"{}")
        slower = await running(6, 4 * H, kind=SlowArgs.kind, encoded_args=b"{}")
        endless = await running(7, 48 * H, kind=Endless.kind, encoded_args=b"{}")
        cancel = await running(8, 2 * H, meta={"cancel_attempted_at": "2024-01-02T03:04:05Z"})
        undecodable = await running(9, 2 * H, encoded_args=b'{"n": "not an int"}')
        svc = e.service(JobRescuer)
        await svc.run_once()
        ex = e.driver.executor()

        row = await get(ex, stuck.id)
        assert row.state is S.RETRYABLE and row.finalized_at is None
        assert row.scheduled_at > t0  # the retry policy's time
        assert row.metadata["river:rescue_count"] == 3 and row.metadata["x"] == 1
        (err,) = row.errors
        assert (err.error, err.attempt, err.at, err.trace) == (RESCUE_ERROR, 1, t0, "")

        assert (await get(ex, fresh.id)).state is S.RUNNING  # not past rescue_after
        assert (await get(ex, slow.id)).state is S.RUNNING  # within its worker's 3 h
        assert (await get(ex, slower.id)).state is S.RETRYABLE  # past it
        assert (await get(ex, endless.id)).state is S.RUNNING  # no timeout: never
        for job, state in ((spent, S.DISCARDED), (unknown, S.DISCARDED), (cancel, S.CANCELLED)):
            row = await get(ex, job.id)
            assert row.state is state and row.finalized_at == t0
            assert row.metadata["river:rescue_count"] == 1
            assert [x.error for x in row.errors] == [RESCUE_ERROR]
        assert (await get(ex, undecodable.id)).state is S.RETRYABLE
        assert svc.rescued == 6


async def test_rescue_after_defaults_and_validation(database_url: str) -> None:
    base: dict[str, Any] = {"queues": {"default": river.QueueConfig(max_workers=1)}}
    base["workers"] = workers()
    assert river.Config(**base).rescue_after == 3600
    assert river.Config(**base, job_timeout=600).rescue_after == 4200
    assert river.Config(**base, job_timeout=None).rescue_after == 3600
    custom = river.MaintenanceConfig(rescue_after=dt.timedelta(minutes=5))
    assert river.Config(**base, maintenance=custom).rescue_after == 300
    with pytest.raises(river.ConfigError, match=r"rescue_after.*cannot be less than job_timeout"):
        river.Config(**base, maintenance=custom, job_timeout=600)
    # what a running client's maintenance reads
    async with river.open_client(database_url, job_timeout=600, **base) as run:
        assert run.config.rescue_after == 4200


# --- cleaners --------------------------------------------------------------------------------


async def test_job_cleaner_deletes_finalized_jobs_past_retention(
    database_url: str, t0: dt.datetime
) -> None:
    async with env(database_url, FixedClock(t0)) as e:
        jobs: dict[str, river.JobRow] = {}
        for state, age in (
            ("completed", 25 * H),
            ("cancelled", 25 * H),
            ("discarded", 25 * H),
            ("discarded", 8 * 24 * H),
        ):
            job = await insert(e.driver, len(jobs))
            await update(e.driver, job.id, state=state, finalized_at=t0 - age)
            jobs[f"{state}-{age.total_seconds():.0f}"] = job
        young = await insert(e.driver, 99)
        await update(e.driver, young.id, state="completed", finalized_at=t0 - 23 * H)
        old_available = await insert(e.driver, 100, scheduled_at=t0 - 30 * 24 * H)
        svc = e.service(JobCleaner)
        await svc.run_once()
        ex = e.driver.executor()
        left = {j.id for j in await ex.job_list(limit=1000)}
        assert left == {jobs["discarded-90000"].id, young.id, old_available.id}
        assert svc.deleted == 3

        # "keep forever" keeps; the rest goes
        keep = e.service(JobCleaner, maintenance=river.MaintenanceConfig(
            discarded_job_retention=None, completed_job_retention=0
        ))  # fmt: skip
        e.clock.at = t0 + 30 * 24 * H
        await keep.run_once()
        left = {j.id for j in await ex.job_list(limit=1000)}
        assert left == {jobs["discarded-90000"].id, old_available.id}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("completed_job_retention", -1, "cannot be negative"),
        ("cancelled_job_retention", float("inf"), "must be finite"),
        ("discarded_job_retention", float("nan"), "must be finite"),
        ("discarded_job_retention", dt.timedelta(seconds=-5), "cannot be negative"),
        ("scheduler_interval", 0, "must be greater than zero"),
        ("job_cleaner_timeout", "30", "must be a number of seconds"),
        ("reindexer_timeout", -1, "must be greater than zero"),
        ("reindexer_index_names", "river_job_kind", "must be a list"),
        ("reindexer_schedule", 5, "must be a callable"),
    ],
)
def test_maintenance_config_validation(field: str, value: Any, message: str) -> None:
    with pytest.raises(river.ConfigError, match=message) as info:
        river.MaintenanceConfig(**{field: value})
    assert info.value.field == field


def test_maintenance_config_defaults_are_rivers() -> None:
    m = river.MaintenanceConfig()
    assert (m.scheduler_interval, m.rescuer_interval, m.rescue_after) == (5, 30, None)
    assert (m.job_cleaner_interval, m.job_cleaner_timeout) == (30, 30)
    assert m.completed_job_retention == m.cancelled_job_retention == 86400
    assert m.discarded_job_retention == 7 * 86400
    assert (m.queue_cleaner_interval, m.queue_retention) == (3600, 86400)
    assert (m.notification_cleaner_interval, m.notification_retention) == (60, 300)
    assert m.reindexer_timeout == 60 and len(m.reindexer_index_names) == 7
    at = dt.datetime(2025, 3, 4, 15, 16, tzinfo=UTC)
    assert m.next_reindex(at) == dt.datetime(2025, 3, 5, tzinfo=UTC)
    assert river.MaintenanceConfig(completed_job_retention=dt.timedelta(hours=2)) == (
        river.MaintenanceConfig(completed_job_retention=7200)
    )


async def test_queue_cleaner_deletes_untouched_queues(database_url: str) -> None:
    now = dt.datetime.now(UTC)
    async with env(database_url, FixedClock(now)) as e:
        ex = e.driver.executor()
        for name in ("fresh", "stale", "staler"):
            await ex.queue_create_or_set_updated_at(name=name)
        p = "%s" if is_pg(e.driver) else "?"
        for name, age in (("stale", 25 * H), ("staler", 50 * H)):
            await ex.execute(
                f"UPDATE river_queue SET updated_at = {p} WHERE name = {p}",
                [ts(e.driver, now - age), name],
            )
        svc = e.service(QueueCleaner)
        await svc.run_once()
        assert sorted(svc.deleted) == ["stale", "staler"]
        assert [q.name for q in await ex.queue_list()] == ["fresh"]
        e.clock.at = now + 25 * H  # a day later, "fresh" is stale too
        await svc.run_once()
        assert [q.name for q in await ex.queue_list()] == []


async def test_notification_cleaner_deletes_old_outbox_rows(sqlite_url: str) -> None:
    async with env(sqlite_url, FixedClock(dt.datetime.now(UTC))) as e:
        ex = e.driver.executor()
        await ex.notify_many(TOPIC_INSERT, ['{"queue": "a"}', '{"queue": "b"}'])
        await ex.execute(
            "UPDATE river_notification SET created_at = ? WHERE payload = ?",
            [format_sqlite_timestamp(e.clock.at - dt.timedelta(minutes=6)), '{"queue": "a"}'],
        )
        svc = e.service(NotificationCleaner)
        await svc.run_once()
        rows = await ex.fetch_all("SELECT payload FROM river_notification")
        assert rows == [('{"queue": "b"}',)]
        assert svc.deleted == 1


# --- reindexer -------------------------------------------------------------------------------


async def test_reindexer_rebuilds_indexes_concurrently(pg_url: str) -> None:
    async with env(pg_url, FixedClock(dt.datetime.now(UTC))) as e:
        ex = e.driver.executor()

        async def filenodes() -> dict[str, int]:
            rows = await ex.fetch_all(
                "SELECT relname::text, relfilenode::bigint FROM pg_class "
                "WHERE relkind = 'i' AND relname LIKE 'river_job%%'"
            )
            return dict(rows)

        before = await filenodes()
        # leftovers of an interrupted rebuild: that index is skipped
        await ex.exec_script("CREATE INDEX river_job_kind_ccnew ON river_job (kind)")
        names = ("river_job_kind", "river_job_pkey", "river_job_nonexistent")
        svc = e.service(Reindexer, maintenance=river.MaintenanceConfig(reindexer_index_names=names))
        await svc.run_once()
        after = await filenodes()
        assert svc.reindexed == ["river_job_pkey"]
        assert after["river_job_pkey"] != before["river_job_pkey"]
        assert after["river_job_kind"] == before["river_job_kind"]
        assert await ex.index_reindex_artifacts("river_job_kind") == ["river_job_kind_ccnew"]


async def test_reindexer_runs_on_its_schedule(pg_url: str) -> None:
    runs: list[dt.datetime] = []

    def schedule(after: dt.datetime) -> dt.datetime:
        runs.append(after)
        return after + dt.timedelta(milliseconds=50)

    m = river.MaintenanceConfig(
        reindexer_schedule=schedule, reindexer_index_names=["river_job_kind"]
    )
    async with env(pg_url, FixedClock(dt.datetime.now(UTC))) as e:
        svc = e.service(Reindexer, maintenance=m)
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                await tg.start(svc.run)
                while len(svc.reindexed) < 2:  # noqa: ASYNC110 - no event to wait on
                    await anyio.sleep(0.01)
                tg.cancel_scope.cancel()
    assert svc.reindexed[:2] == ["river_job_kind", "river_job_kind"]


# --- common mechanics -----------------------------------------------------------------------


async def test_a_failed_run_is_reported_and_retried_at_the_next_interval(
    database_url: str,
) -> None:
    async with env(database_url, FixedClock(dt.datetime.now(UTC) + 48 * H)) as e:
        ex = e.driver.executor()
        await ex.queue_create_or_set_updated_at(name="stale")
        await ex.exec_script("ALTER TABLE river_queue RENAME TO river_queue_away")
        svc = e.service(QueueCleaner)
        with e.events.subscribe([river.EventKind.MAINTENANCE_FAILED]) as failures:
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tg:
                    await tg.start(svc.run)
                    ev = await failures.__anext__()
                    assert ev.details["service"] == "queue_cleaner"
                    assert ev.error
                    await ex.exec_script("ALTER TABLE river_queue_away RENAME TO river_queue")
                    while not svc.deleted:  # noqa: ASYNC110 - no event to wait on
                        await anyio.sleep(0.01)
                    tg.cancel_scope.cancel()
        assert svc.deleted == ["stale"]


def test_batch_size_breaker() -> None:
    b = BatchSizes()
    assert b.size == BATCH_SIZE_DEFAULT
    b.trip()
    b.trip()
    b.success()  # a success forgets earlier timeouts while closed
    b.trip()
    b.trip()
    assert b.size == BATCH_SIZE_DEFAULT
    b.trip()
    assert b.size == BATCH_SIZE_REDUCED
    b.success()
    assert b.size == BATCH_SIZE_REDUCED  # open for good
