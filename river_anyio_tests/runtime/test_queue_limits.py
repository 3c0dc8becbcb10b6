"""Global queue limits (``QueueConfig(rate_limit=..., global_max_workers=...)``): validation,
the rate window's arithmetic and the pacer's hold (pure), the drivers' limited claim, and
limits shared by two clients in one process, on both loops and both databases. The
multi-process scenarios are in ``test_queue_limits_processes.py``."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio._queue_limits import RateWindow
from river_anyio._runtime._pacing import FetchPacer
from river_anyio.drivers import open_driver
from river_anyio.migrate import LINE_RIVER_ANYIO, Migrator
from river_anyio_tests.faulty import open_faulty

from .conftest import WAIT

SECOND = dt.timedelta(seconds=1)


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "field", "rule"),
    [
        (lambda: river.RateLimit(0, per=1), "rate_limit.count", "between 1 and"),
        (lambda: river.RateLimit(True, per=1), "rate_limit.count", "must be an int"),
        (lambda: river.RateLimit(2.5, per=1), "rate_limit.count", "must be an int"),
        (lambda: river.RateLimit(5, per=0), "rate_limit.per", "at least 1 ms"),
        (lambda: river.RateLimit(5, per=-SECOND), "rate_limit.per", "at least 1 ms"),
        (lambda: river.RateLimit(5, per=float("inf")), "rate_limit.per", "finite"),
        (lambda: river.RateLimit(5, per="1s"), "rate_limit.per", "timedelta or a number"),
        (lambda: river.RateLimit(5, per=dt.timedelta(days=40)), "rate_limit.per", "31 days"),
        (lambda: river.QueueConfig(max_workers=1, rate_limit=5), "rate_limit", "RateLimit"),
        (lambda: river.QueueConfig(max_workers=1, global_max_workers=0), "global_max_workers",
         "between 1 and"),
        (lambda: river.QueueConfig(max_workers=1, global_max_workers="4"), "global_max_workers",
         "must be an int"),
    ],
)  # fmt: skip
def test_invalid_limits_name_their_field(build: Any, field: str, rule: str) -> None:
    with pytest.raises(river.ConfigError) as info:
        build()
    assert info.value.field == field
    assert rule in info.value.rule


def test_limits_read_back() -> None:
    rate = river.RateLimit(20, per=dt.timedelta(milliseconds=1500))
    assert (rate.count, rate.per) == (20, 1.5)
    assert river.RateLimit(3, per=2) == river.RateLimit(3, per=2.0)
    assert river.QueueConfig(max_workers=1, rate_limit=rate).limited
    assert river.QueueConfig(max_workers=1, global_max_workers=3).limited
    assert not river.QueueConfig(max_workers=1).limited


# --- the rate window and the pacer's hold (pure) --------------------------------------------------

US = 1_000_000


def test_the_rate_window_is_sliding_and_exact() -> None:
    limit = river.RateLimit(10, per=1)
    w = RateWindow.decode(None)
    assert w.allowance(100 * US, limit) == 10
    w.record(100 * US, 6, limit)
    assert w.allowance(100 * US + 500_000, limit) == 4
    w.record(100 * US + 500_000, 4, limit)
    assert w.allowance(100 * US + 999_999, limit) == 0
    # the first entry leaves the window one second after it: 6 more may start then
    assert w.reopens_in(100 * US + 600_000, limit) == pytest.approx(0.4)
    assert w.allowance(101 * US, limit) == 6
    assert w.allowance(101 * US + 500_000, limit) == 10
    # an entry later than "now" (a claim whose transaction began later committed first)
    # counts too
    assert w.allowance(100 * US - 100_000, limit) == 0
    # round trip through the stored text; entries far older than a window are forgotten
    w = RateWindow.decode(w.encode())
    w.record(200 * US, 1, limit)
    assert w.entries == [[200 * US, 1]]
    assert w.reopens_in(200 * US, limit) == 0.0


def test_entries_are_rounded_up_to_a_hundredth_of_the_window_and_merged() -> None:
    limit = river.RateLimit(1000, per=1)  # a grid of 10 ms
    w = RateWindow([])
    for i in range(1, 400):  # a claim every 2.5 ms for a second: one entry per 10 ms
        w.record(100 * US + i * 2500, 1, limit)
    assert len(w.entries) <= 101
    assert sum(n for _, n in w.entries) == 399
    assert all(at % 10_000 == 0 for at, _ in w.entries)
    # rounded up, never down: a start counts at least as long as it strictly must
    w = RateWindow([])
    w.record(100 * US + 1, 1, limit)
    assert w.entries == [[100 * US + 10_000, 1]]
    assert w.allowance(101 * US + 5_000, limit) == 999


def test_a_held_pacer_claims_no_sooner_whatever_wakes_it() -> None:
    now = [1000.0]
    pacer = FetchPacer(
        max_workers=10, cooldown=0.1, poll_interval=5.0, clock=lambda: now[0],
        jitter=lambda a, b: 0.0, prefetch=False,
    )  # fmt: skip
    pacer.fetching()
    pacer.claimed(10, 10, 10, 0)
    pacer.hold(0.75)
    assert pacer.idle_time() == pytest.approx(0.75)  # the next claim is on the timer
    pacer.refill()  # a freed slot does not bypass the hold
    assert pacer.cooldown() == pytest.approx(0.75)
    now[0] += 0.75
    assert pacer.cooldown() == 0.0
    # no rows claimed ahead for a limited queue, however fast the jobs are
    pacer.fetching()
    pacer.claimed(10, 10, 10, 0)
    now[0] += 0.01
    pacer.fetching()
    pacer.claimed(10, 10, 10, 5000)
    assert pacer.prefetch == 0


# --- on the databases -------------------------------------------------------------------------

pytestmark = pytest.mark.anyio


@attrs.frozen
class Nap:
    kind: ClassVar[str] = "limits_nap"
    ms: int = 0


class Recorder:
    """Runs ``Nap`` jobs and records how many ran at once in this process."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.done = 0
        self.all_done = anyio.Event()
        self.expected = 0

    def workers(self) -> river.Workers:
        workers = river.Workers()
        workers.add(Nap, self.work)
        return workers

    async def work(self, ctx: river.WorkContext, job: river.Job[Nap]) -> None:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await anyio.sleep(job.args.ms / 1000)
        finally:
            self.now -= 1
            self.done += 1
            if self.done >= self.expected:
                self.all_done.set()


async def migrate_limits(url: str) -> None:
    async with open_driver(url) as driver:
        await Migrator(driver, line=LINE_RIVER_ANYIO).up()


async def insert(url: str, queue: str, n: int, ms: int = 0) -> None:
    async with river.open_client(url) as run:
        await run.client.insert_many(
            [river.InsertManyParams(Nap(ms=ms), river.InsertOpts(queue=queue)) for _ in range(n)]
        )


def options(**extra: Any) -> dict[str, Any]:
    return {
        "leader_election_disabled": True,
        "fetch_cooldown": 0.02,
        "soft_stop_timeout": 2.0,
        **extra,
    }


async def test_a_limited_queue_without_its_table_names_the_command(database_url: str) -> None:
    queues = {"q": river.QueueConfig(max_workers=1, global_max_workers=1)}
    with pytest.raises(river.MigrationError, match="river-anyio migrate-up --line river_anyio"):
        async with river.open_client(
            database_url, queues=queues, workers=Recorder().workers(), **options()
        ):
            pass


async def test_the_limited_claim_takes_what_the_limits_allow(database_url: str) -> None:
    await migrate_limits(database_url)
    await insert(database_url, "rated", 5)
    await insert(database_url, "capped", 5)
    async with open_driver(database_url) as driver:
        ex = driver.executor()
        rate = river.RateLimit(3, per=60)
        first = await ex.job_get_available_limited(
            queue="rated", max_to_lock=10, client_id="a", rate_limit=rate
        )
        assert (len(first.jobs), first.allowed) == (3, 3)
        assert 59 < first.reopens_in <= 60.6  # the window is used up until its start leaves it
        second = await ex.job_get_available_limited(
            queue="rated", max_to_lock=10, client_id="b", rate_limit=rate
        )
        assert (len(second.jobs), second.allowed) == (0, 0)
        assert 59 < second.reopens_in <= 60.6
        # global_max_workers counts the queue's running rows, whoever claimed them
        capped = await ex.job_get_available_limited(
            queue="capped", max_to_lock=3, client_id="a", global_max_workers=4
        )
        assert (len(capped.jobs), capped.allowed, capped.reopens_in) == (3, 3, 0.0)
        capped = await ex.job_get_available_limited(
            queue="capped", max_to_lock=3, client_id="b", global_max_workers=4
        )
        assert (len(capped.jobs), capped.allowed) == (1, 1)
        assert all(j.state is river.JobState.RUNNING for j in capped.jobs)
        # fewer rows than allowed: the queue had no more
        rate = river.RateLimit(100, per=1)
        rest = await ex.job_get_available_limited(
            queue="rated", max_to_lock=10, client_id="c", rate_limit=rate
        )
        assert (len(rest.jobs), rest.allowed, rest.reopens_in) == (2, 10, 0.0)


async def test_the_limited_claim_filters_kinds(database_url: str) -> None:
    await migrate_limits(database_url)
    await insert(database_url, "q", 3)
    async with open_driver(database_url) as driver:
        ex = driver.executor()
        rate = river.RateLimit(10, per=60)
        none = await ex.job_get_available_limited(
            queue="q", max_to_lock=5, client_id="a", kinds=["other"], rate_limit=rate
        )
        assert (len(none.jobs), none.allowed, none.reopens_in) == (0, 5, 0.0)
        some = await ex.job_get_available_limited(
            queue="q", max_to_lock=2, client_id="a", kinds=[Nap.kind], rate_limit=rate,
            global_max_workers=5,
        )  # fmt: skip
        assert [j.kind for j in some.jobs] == [Nap.kind] * 2
        # one claim, one instant: the one its window entry was recorded at
        assert len({j.attempted_at for j in some.jobs}) == 1
        last = await ex.job_get_available_limited(
            queue="q", max_to_lock=5, client_id="a", kinds=[Nap.kind], global_max_workers=3
        )
        assert (len(last.jobs), last.allowed) == (1, 1)


async def test_unlimited_queues_run_no_limit_statement(database_url: str) -> None:
    await insert(database_url, "default", 3)
    recorder = Recorder()
    recorder.expected = 3
    async with open_faulty(database_url) as faulty:
        queues = {"default": river.QueueConfig(max_workers=2)}
        async with river.open_client(
            faulty, queues=queues, workers=recorder.workers(), **options()
        ):
            with anyio.fail_after(WAIT):
                await recorder.all_done.wait()
        assert faulty.calls["job_get_available"] >= 1
        assert faulty.calls["job_get_available_limited"] == 0


async def test_two_clients_share_global_max_workers(database_url: str) -> None:
    await migrate_limits(database_url)
    await insert(database_url, "capped", 12, ms=40)
    recorder = Recorder()
    recorder.expected = 12
    queues = {"capped": river.QueueConfig(max_workers=5, global_max_workers=2)}
    async with (
        river.open_client(database_url, queues=queues, workers=recorder.workers(), **options()),
        river.open_client(database_url, queues=queues, workers=recorder.workers(), **options()),
    ):
        with anyio.fail_after(WAIT):
            await recorder.all_done.wait()
    assert recorder.most == 2


async def test_two_clients_share_a_rate_limit(database_url: str) -> None:
    await migrate_limits(database_url)
    await insert(database_url, "rated", 12)
    recorder = Recorder()
    recorder.expected = 12
    per = dt.timedelta(milliseconds=400)
    queues = {"rated": river.QueueConfig(max_workers=3, rate_limit=river.RateLimit(4, per=per))}
    async with (
        river.open_client(database_url, queues=queues, workers=recorder.workers(), **options()),
        river.open_client(database_url, queues=queues, workers=recorder.workers(), **options()),
    ):
        with anyio.fail_after(WAIT):
            await recorder.all_done.wait()
    async with open_driver(database_url) as driver:
        rows = await driver.executor().job_list(queues=["rated"])
    starts = sorted(r.attempted_at for r in rows if r.attempted_at is not None)
    assert len(starts) == 12
    assert max(sum(1 for t in starts if s <= t < s + per) for s in starts) <= 4
    assert starts[-1] - starts[0] >= 2 * per - dt.timedelta(milliseconds=1)


async def test_a_local_queue_added_at_runtime_keeps_its_limits(database_url: str) -> None:
    await migrate_limits(database_url)
    recorder = Recorder()
    recorder.expected = 4
    async with river.open_client(
        database_url, queues={"default": river.QueueConfig(max_workers=1)},
        workers=recorder.workers(), **options(),
    ) as run:  # fmt: skip
        await run.client.local_queues.add(
            "added", river.QueueConfig(max_workers=5, global_max_workers=1)
        )
        await run.client.insert_many(
            [river.InsertManyParams(Nap(ms=30), river.InsertOpts(queue="added"))] * 4
        )
        with anyio.fail_after(WAIT):
            await recorder.all_done.wait()
    assert recorder.most == 1


async def test_a_local_queue_with_limits_needs_the_table(database_url: str) -> None:
    async with river.open_client(
        database_url, queues={"default": river.QueueConfig(max_workers=1)},
        workers=Recorder().workers(), **options(),
    ) as run:  # fmt: skip
        with pytest.raises(river.MigrationError, match="--line river_anyio"):
            await run.client.local_queues.add(
                "added", river.QueueConfig(max_workers=1, rate_limit=river.RateLimit(1, per=1))
            )


async def test_a_used_up_rate_waits_for_the_window_instead_of_claiming(database_url: str) -> None:
    await migrate_limits(database_url)
    recorder = Recorder()
    recorder.expected = 2
    per = dt.timedelta(milliseconds=500)
    rate = river.RateLimit(2, per=per)
    # a poll interval far beyond the window: only the hold can make the claim on time
    queues = {"rated": river.QueueConfig(max_workers=5, rate_limit=rate, fetch_poll_interval=5)}
    async with open_faulty(database_url) as faulty:
        async with river.open_client(
            faulty, queues=queues, workers=recorder.workers(), **options()
        ) as run:
            new = [river.InsertManyParams(Nap(), river.InsertOpts(queue="rated"))] * 2
            await run.client.insert_many(new)
            with anyio.fail_after(WAIT):
                await recorder.all_done.wait()
            # the window is used up: these two wake the producer, which waits for the
            # window to reopen and then claims them, instead of claiming nothing now
            recorder.all_done = anyio.Event()
            recorder.expected = 4
            await run.client.insert_many(new)
            with anyio.fail_after(WAIT):
                await recorder.all_done.wait()
            claims = faulty.calls["job_get_available_limited"]
    assert 2 <= claims <= 4, claims
    async with open_driver(database_url) as driver:
        rows = await driver.executor().job_list(queues=["rated"])
    starts = sorted(r.attempted_at for r in rows if r.attempted_at is not None)
    assert len(starts) == 4
    assert per - dt.timedelta(milliseconds=1) <= starts[2] - starts[0] < 4 * per


async def test_a_failed_limited_claim_is_retried(database_url: str) -> None:
    await migrate_limits(database_url)
    await insert(database_url, "capped", 3)
    recorder = Recorder()
    recorder.expected = 3
    queues = {"capped": river.QueueConfig(max_workers=5, global_max_workers=2)}
    async with open_faulty(database_url) as faulty:
        fault = faulty.fail("job_get_available_limited", times=1)
        async with river.open_client(
            faulty, queues=queues, workers=recorder.workers(), **options()
        ):
            with anyio.fail_after(WAIT):
                await recorder.all_done.wait()
        assert fault.hits == 1
    assert recorder.most <= 2
