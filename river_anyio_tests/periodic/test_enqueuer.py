"""The periodic job enqueuer against real databases, on both event loops, driven by a manual
clock: each step moves the clock and then waits until the enqueuer sleeps again (which it does
only once everything due has been written), so no test sleeps to synchronise."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio._runtime._clock import ManualClock
from river_anyio._runtime._periodic import PeriodicEnqueuer

from ..runtime.lifecycle_support import is_postgres, pg_connections_refused, sqlite_write_lock

pytestmark = pytest.mark.anyio

UTC = dt.UTC
WAIT = 15.0
#: A Monday, at half past midnight (UTC).
T0 = dt.datetime(2030, 1, 7, 0, 0, 30, tzinfo=UTC)
# Zones are loaded here, off the event loop (loading one reads the zone database).
EVERY_MINUTE = river.cron("CRON_TZ=UTC * * * * *")
NY_230 = river.cron("CRON_TZ=America/New_York 30 2 * * *")


@attrs.frozen
class Tick:
    kind = "periodic_tick"
    n: int = 0


@attrs.frozen
class Other:
    kind = "periodic_other"


def minutes(n: float) -> dt.timedelta:
    return dt.timedelta(minutes=n)


@contextlib.asynccontextmanager
async def enqueuing(
    url: str,
    jobs: Sequence[river.PeriodicJob] = (),
    *,
    clock: ManualClock,
    **options: Any,
) -> AsyncIterator[tuple[river.ClientRun, PeriodicEnqueuer]]:
    """A client (no queues) and its periodic enqueuer running as one leadership term."""
    async with river.open_client(url, periodic_jobs=list(jobs), **options) as run:
        enqueuer = PeriodicEnqueuer(client=run.client, clock=clock, events=run._events)
        enqueuer.retry_first_pause = 0.01
        async with anyio.create_task_group() as tg:
            with anyio.fail_after(WAIT):
                await tg.start(enqueuer.run)
                await clock.wait_sleeping()
            yield run, enqueuer
            tg.cancel_scope.cancel("test over")


async def settle(clock: ManualClock, to: dt.datetime | None = None) -> dt.datetime:
    """Move the clock (to ``to``, or to the enqueuer's wake-up time) and wait until it sleeps
    again; returns its next wake-up time."""
    with anyio.fail_after(WAIT):
        target = to if to is not None else await clock.wait_sleeping()
        clock.set(target)
        await anyio.lowlevel.checkpoint()
        return await clock.wait_sleeping()


def meta(row: river.JobRow) -> dict[str, Any]:
    """The row's metadata without the nonce SQLite's insert path adds."""
    return {k: v for k, v in row.metadata.items() if k != "river:unique_nonce"}


async def rows(run: river.ClientRun, kind: str = Tick.kind) -> list[river.JobRow]:
    return await run.client.driver.executor().job_list(kinds=[kind], limit=1000)


async def planned(run: river.ClientRun, kind: str = Tick.kind) -> list[dt.datetime]:
    return [r.scheduled_at for r in await rows(run, kind)]


# --- schedules ------------------------------------------------------------------------------


async def test_jobs_fire_at_their_planned_times_with_periodic_metadata(database_url: str) -> None:
    clock = ManualClock(T0)
    jobs = [
        river.PeriodicJob(EVERY_MINUTE, Tick, id="every_minute"),
        river.PeriodicJob(river.every(minutes(5)), Other),
    ]
    async with enqueuing(database_url, jobs, clock=clock) as (run, _):
        assert await rows(run) == []
        assert clock.next_deadline == T0.replace(minute=1, second=0)

        wake = await settle(clock)
        [row] = await rows(run)
        assert row.scheduled_at == T0.replace(minute=1, second=0)
        assert row.state == river.JobState.AVAILABLE
        assert meta(row) == {"river:periodic_job_id": "every_minute", "periodic": True}
        assert wake == T0.replace(minute=2, second=0)

        # Late by several runs: each missed run is inserted at its own planned time (the next
        # run is computed from the planned one, not from now).
        wake = await settle(clock, T0 + minutes(5) + dt.timedelta(seconds=10))
        assert await planned(run) == [T0.replace(minute=m, second=0) for m in range(1, 6)]
        [other] = await rows(run, Other.kind)
        assert other.scheduled_at == T0 + minutes(5)
        assert meta(other) == {"periodic": True}
        assert wake == T0.replace(minute=6, second=0)


async def test_a_run_due_within_100ms_is_inserted_with_the_batch(database_url: str) -> None:
    clock = ManualClock(T0)
    jobs = [
        river.PeriodicJob(river.every(minutes(1)), Tick),
        river.PeriodicJob(river.every(minutes(1) + dt.timedelta(milliseconds=80)), Other),
    ]
    async with enqueuing(database_url, jobs, clock=clock) as (run, _):
        await settle(clock)
        assert await planned(run) == [T0 + minutes(1)]
        assert await planned(run, Other.kind) == [T0 + minutes(1) + dt.timedelta(milliseconds=80)]


async def test_cron_in_a_zone_skips_the_dst_gap(database_url: str) -> None:
    # 02:30 does not exist in New York on 2030-03-10: as with robfig/cron, that day has no run
    clock = ManualClock(dt.datetime(2030, 3, 9, 12, tzinfo=UTC))
    async with enqueuing(database_url, [river.PeriodicJob(NY_230, Tick)], clock=clock) as (run, _):
        for _ in range(3):
            await settle(clock)
        assert [t.astimezone(UTC) for t in await planned(run)] == [
            dt.datetime(2030, 3, 11, 6, 30, tzinfo=UTC),
            dt.datetime(2030, 3, 12, 6, 30, tzinfo=UTC),
            dt.datetime(2030, 3, 13, 6, 30, tzinfo=UTC),
        ]


# --- leadership terms and run_on_start --------------------------------------------------------


async def test_run_on_start_inserts_once_per_term_and_each_term_starts_afresh(
    database_url: str,
) -> None:
    clock = ManualClock(T0)
    job = river.PeriodicJob(river.every(minutes(10)), Tick, run_on_start=True)
    async with river.open_client(database_url, periodic_jobs=[job]) as run:
        enqueuer = PeriodicEnqueuer(client=run.client, clock=clock, events=run._events)
        for term_start, expected_next in (
            (T0, T0 + minutes(10)),
            (T0 + minutes(7), T0 + minutes(17)),  # not T0 + 10 min: the schedule restarts
        ):
            clock.set(term_start)
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tg:
                    await tg.start(enqueuer.run)
                    assert await clock.wait_sleeping() == expected_next
                    assert (await planned(run))[-1] == term_start
                    tg.cancel_scope.cancel("leadership lost")
        assert await planned(run) == [T0, T0 + minutes(7)]


# --- changes at runtime -------------------------------------------------------------------------


async def caught_up(enqueuer: PeriodicEnqueuer, clock: ManualClock) -> dt.datetime:
    """Wait until the enqueuer has handled a change to its jobs (call right after the change);
    returns its next wake-up time."""
    event = enqueuer._caught_up
    assert event is not None
    with anyio.fail_after(WAIT):
        await event.wait()
        return await clock.wait_sleeping()


async def test_jobs_added_and_removed_at_runtime(database_url: str) -> None:
    clock = ManualClock(T0)
    async with enqueuing(database_url, clock=clock) as (run, enqueuer):
        bundle = run.client.periodic_jobs
        assert clock.next_deadline == T0 + dt.timedelta(hours=24)  # nothing to do

        # an added job wakes the enqueuer: run_on_start inserts at once, then it is scheduled
        handle = bundle.add(
            river.PeriodicJob(river.every(minutes(3)), Tick, id="tick", run_on_start=True)
        )
        assert await caught_up(enqueuer, clock) == T0 + minutes(3)
        assert await planned(run) == [T0]
        other = bundle.add(river.PeriodicJob(river.every(minutes(2)), Other, id="other"))
        assert await caught_up(enqueuer, clock) == T0 + minutes(2)
        assert enqueuer.next_runs() == {handle: T0 + minutes(3), other: T0 + minutes(2)}

        # removed by handle: its next run passes without an insert
        assert bundle.remove(handle) is True
        assert bundle.remove(handle) is False
        assert await caught_up(enqueuer, clock) == T0 + minutes(2)
        assert handle not in enqueuer.next_runs()
        assert await settle(clock, T0 + minutes(3)) == T0 + minutes(4)
        assert await planned(run) == [T0]
        assert await planned(run, Other.kind) == [T0 + minutes(2)]

        # removed by ID; the same ID may then be added again (with a fresh handle)
        assert bundle.remove_by_id("other") is True
        assert await caught_up(enqueuer, clock) == T0 + minutes(3) + dt.timedelta(hours=24)
        again = bundle.add(river.PeriodicJob(river.every(minutes(1)), Other, id="other"))
        assert again.value > other.value
        assert await caught_up(enqueuer, clock) == T0 + minutes(4)
        await settle(clock)
        assert await planned(run, Other.kind) == [T0 + minutes(2), T0 + minutes(4)]

        bundle.clear()
        wake = await caught_up(enqueuer, clock)
        assert wake == T0 + minutes(4) + dt.timedelta(hours=24)
        await settle(clock, T0 + minutes(10))
        assert await planned(run, Other.kind) == [T0 + minutes(2), T0 + minutes(4)]
        assert len(bundle) == 0


# --- what make_args returns ---------------------------------------------------------------------


async def test_make_args_options_skips_and_failures(database_url: str) -> None:
    clock = ManualClock(T0)
    calls = 0

    def varying() -> object:
        nonlocal calls
        calls += 1
        if calls == 1:
            return None  # skip this run
        if calls == 2:
            raise RuntimeError("cannot build args")  # skipped and logged
        if calls == 3:
            return Tick(n=3), river.InsertOpts(queue="elsewhere", metadata={"a": 1})
        return Tick(n=calls)

    job = river.PeriodicJob(
        river.every(minutes(1)), varying, opts=river.InsertOpts(priority=3, tags=["periodic"])
    )
    async with enqueuing(database_url, [job], clock=clock) as (run, _):
        for _ in range(4):
            await settle(clock)
        got = await rows(run)
        assert [r.args["n"] for r in got] == [3, 4]
        first, second = got
        # options returned by make_args replace the job's own for that run
        assert (first.queue, first.priority, first.tags) == ("elsewhere", 1, ())
        assert meta(first) == {"a": 1, "periodic": True}
        assert (second.queue, second.priority, second.tags) == ("default", 3, ("periodic",))
        assert first.scheduled_at == T0 + minutes(3)


async def test_scheduled_at_from_options_is_kept(database_url: str) -> None:
    clock = ManualClock(T0)
    later = T0 + dt.timedelta(hours=5)
    job = river.PeriodicJob(
        river.every(minutes(1)), Tick, opts=river.InsertOpts(scheduled_at=later)
    )
    async with enqueuing(database_url, [job], clock=clock) as (run, _):
        await settle(clock)
        [row] = await rows(run)
        assert row.scheduled_at == later
        assert row.state == river.JobState.SCHEDULED


# --- the client's insert path: unique options and middleware ---------------------------------


class RecordingMiddleware:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.fail_next = False

    async def insert(self, params: Sequence[Any], next: Any) -> Any:
        self.batches.append([p.kind for p in params])
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("middleware refuses")
        return await next(params)


async def test_unique_periodic_jobs_and_middleware(database_url: str) -> None:
    clock = ManualClock(T0)
    mw = RecordingMiddleware()
    unique = river.InsertOpts(unique=river.UniqueOpts(by_period=dt.timedelta(hours=1)))
    jobs = [
        river.PeriodicJob(river.every(minutes(20)), Tick, opts=unique, id="unique_tick"),
        river.PeriodicJob(river.every(minutes(20)), Other),
    ]
    async with enqueuing(database_url, jobs, clock=clock, middleware=[mw]) as (run, _):
        await settle(clock)  # 00:20:30, inside the hour of 00:00
        await settle(clock)  # 00:40:30, same hour: a duplicate, skipped
        assert len(await rows(run)) == 1
        assert len(await rows(run, Other.kind)) == 2
        # both jobs of a tick go through the middleware in one batch
        assert mw.batches == [[Tick.kind, Other.kind], [Tick.kind, Other.kind]]
        await settle(clock)  # 01:00:30, a new hour
        assert await planned(run) == [T0 + minutes(20), T0 + minutes(60)]


# --- faults ---------------------------------------------------------------------------------------


async def test_a_failing_batch_is_skipped_and_reported(database_url: str) -> None:
    clock = ManualClock(T0)
    mw = RecordingMiddleware()
    jobs = [river.PeriodicJob(river.every(minutes(1)), Tick)]
    async with enqueuing(database_url, jobs, clock=clock, middleware=[mw]) as (run, _):
        with run.subscribe(river.EventKind.MAINTENANCE_FAILED) as events:
            mw.fail_next = True
            await settle(clock)
            event = events.receive_nowait()
            await settle(clock)
        assert event.details["service"] == "periodic_job_enqueuer"
        assert event.details["transient"] is False
        assert event.error is not None and "middleware refuses" in event.error
        assert await planned(run) == [T0 + minutes(2)]  # the failed run is not retried


async def test_a_database_outage_is_retried_until_the_batch_lands(
    database_url: str, request: pytest.FixtureRequest
) -> None:
    clock = ManualClock(T0)
    jobs = [river.PeriodicJob(river.every(minutes(1)), Tick, id="tick")]
    options: dict[str, Any] = {}
    if not is_postgres(database_url):
        options["driver_options"] = {"busy_timeout": 0.05}
    async with enqueuing(database_url, jobs, clock=clock, **options) as (run, _):
        with run.subscribe(river.EventKind.MAINTENANCE_FAILED) as events:
            async with contextlib.AsyncExitStack() as outage:
                if is_postgres(database_url):
                    await outage.enter_async_context(
                        pg_connections_refused(request.getfixturevalue("pg_server"), database_url)
                    )
                else:
                    await outage.enter_async_context(sqlite_write_lock(database_url))
                clock.set(T0 + minutes(1))
                with anyio.fail_after(WAIT):
                    first = await events.__anext__()
                    second = await events.__anext__()  # it keeps trying
            # the outage is over: the same batch lands, then the enqueuer sleeps again
            with anyio.fail_after(WAIT):
                assert await clock.wait_sleeping() == T0 + minutes(2)
        assert first.details["transient"] is True
        assert (first.details["attempt"], second.details["attempt"]) == (1, 2)
        [row] = await rows(run)
        assert row.scheduled_at == T0 + minutes(1)
        assert meta(row) == {"river:periodic_job_id": "tick", "periodic": True}


async def test_a_schedule_that_raises_stops_only_that_job(database_url: str) -> None:
    class Broken:
        def next(self, after: dt.datetime) -> dt.datetime:
            raise RuntimeError("broken schedule")

    clock = ManualClock(T0)
    jobs = [
        river.PeriodicJob(Broken(), Other, run_on_start=True),
        river.PeriodicJob(river.every(minutes(1)), Tick),
    ]
    async with enqueuing(database_url, jobs, clock=clock) as (run, enqueuer):
        await settle(clock)
        assert list(enqueuer.next_runs().values()) == [None, T0 + minutes(2)]
        assert await planned(run, Other.kind) == [T0]
        assert await planned(run) == [T0 + minutes(1)]


# --- the local zone ---------------------------------------------------------------------------


@pytest.fixture
def tz_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Set $TZ for ``local_zone`` (its cached answer is dropped before and after)."""
    from river_anyio._runtime._periodic import local_zone

    def set_tz(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv("TZ", raising=False)
        else:
            monkeypatch.setenv("TZ", value)
        local_zone.cache_clear()

    yield set_tz
    local_zone.cache_clear()


@pytest.mark.parametrize(
    ("tz", "expected"),
    [
        ("", "UTC"),
        ("America/New_York", "America/New_York"),
        (":Europe/London", "Europe/London"),
        ("Not/AZone", "UTC"),
    ],
)
def test_local_zone_is_found_as_go_finds_it(tz_env: Any, tz: str, expected: str) -> None:
    from river_anyio._runtime._periodic import local_zone

    tz_env(tz)
    assert str(local_zone()) == expected


async def test_cron_without_a_zone_runs_in_the_local_zone(database_url: str, tz_env: Any) -> None:
    tz_env("America/New_York")
    clock = ManualClock(T0)  # 2030-01-07 00:00:30Z is 19:00:30 EST the day before
    jobs = [river.PeriodicJob(river.cron("0 9 * * *"), Tick)]
    async with enqueuing(database_url, jobs, clock=clock) as (run, enqueuer):
        [first] = enqueuer.next_runs().values()
        assert first is not None and str(first) == "2030-01-07 09:00:00-05:00"
        await settle(clock)
        assert await planned(run) == [dt.datetime(2030, 1, 7, 14, tzinfo=UTC)]
