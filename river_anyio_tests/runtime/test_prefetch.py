"""Fetch pacing and prefetch planning (pure logic, no database, no event loop): when a
producer claims, how many rows, and how many it claims ahead of its free slots."""

from __future__ import annotations

import pytest

from river_anyio._runtime._pacing import (
    CLAIM_SHARE,
    FETCH_BURST,
    FOLLOW_UP,
    NO_LOW_WATER,
    PREFETCH_HORIZON,
    PREFETCH_MAX,
    FetchPacer,
)

MAX_WORKERS = 50


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pacer(
    clock: ManualClock, *, max_workers: int = MAX_WORKERS, cooldown: float = 0.1
) -> FetchPacer:
    return FetchPacer(
        max_workers=max_workers,
        cooldown=cooldown,
        poll_interval=1.0,
        clock=clock,
        jitter=lambda low, high: 0.0,
    )


def after_backlog_claims(*, finished: int, seconds: float) -> FetchPacer:
    """A pacer whose previous claim filled every slot ``seconds`` ago, ``finished`` jobs
    finished since; the claim just made filled every slot again."""
    clock = ManualClock()
    p = pacer(clock)
    p.fetching()
    p.claimed(MAX_WORKERS, MAX_WORKERS, MAX_WORKERS, 0)
    clock.now += seconds
    p.fetching()
    p.claimed(MAX_WORKERS, MAX_WORKERS, MAX_WORKERS, finished)
    return p


# --- rows claimed ahead ------------------------------------------------------------------------


def test_quick_jobs_get_up_to_prefetch_max_times_max_workers() -> None:
    p = after_backlog_claims(finished=10_000, seconds=0.1)  # 100,000 jobs/s
    assert p.prefetch == PREFETCH_MAX * MAX_WORKERS
    assert p.claim_size(MAX_WORKERS) == PREFETCH_MAX * MAX_WORKERS


def test_rows_claimed_ahead_follow_the_measured_rate() -> None:
    p = after_backlog_claims(finished=200, seconds=1.0)  # about 200 jobs/s
    assert 0 < p.prefetch <= int(200 * PREFETCH_HORIZON) + 1


def test_slow_jobs_and_an_empty_queue_get_none() -> None:
    slow = after_backlog_claims(finished=5, seconds=1.0)
    assert slow.prefetch == 0
    clock = ManualClock()
    drained = pacer(clock)
    drained.claimed(MAX_WORKERS, MAX_WORKERS, MAX_WORKERS, 0)
    clock.now += 0.1
    # fewer rows than asked for: the queue is drained, nothing is claimed ahead
    assert drained.claimed(3, MAX_WORKERS, 3, 10_000) == NO_LOW_WATER
    assert drained.prefetch == 0


def test_the_first_claim_measures_nothing() -> None:
    p = pacer(ManualClock())
    p.claimed(MAX_WORKERS, MAX_WORKERS, MAX_WORKERS, 10_000)
    assert p.prefetch == 0


# --- refills of freed slots ---------------------------------------------------------------------


def test_a_backlog_asks_for_a_claim_once_half_the_slots_are_free() -> None:
    p = pacer(ManualClock())
    p.fetching()
    mark = p.claimed(MAX_WORKERS, MAX_WORKERS, MAX_WORKERS, 0)
    assert mark == MAX_WORKERS - 25  # half of 50 free
    assert p.idle_time() > 0  # nothing due until the pool reaches the mark
    p.refill()
    assert p.idle_time() == 0


def test_the_refill_share_is_at_most_25_and_at_least_one() -> None:
    assert pacer(ManualClock(), max_workers=200).low_water() == 200 - 25
    assert pacer(ManualClock(), max_workers=1).low_water() == 0
    assert pacer(ManualClock(), max_workers=3).low_water() == 1


def test_rows_claimed_ahead_lower_the_mark_to_room_for_a_share_of_them() -> None:
    p = after_backlog_claims(finished=10_000, seconds=0.1)
    prefetch = p.prefetch
    assert p.low_water() == MAX_WORKERS + prefetch - prefetch // CLAIM_SHARE
    # the claim at the mark takes that share; twice as many rows are still ready
    assert p.claim_size(p.low_water()) == prefetch // CLAIM_SHARE
    few = after_backlog_claims(finished=300, seconds=1.0)  # a few rows ahead: the refill share
    assert 0 < few.prefetch // CLAIM_SHARE < 25
    assert few.low_water() == MAX_WORKERS + few.prefetch - 25


def test_room_to_claim_ahead_already_makes_the_next_claim_due_at_once() -> None:
    p = pacer(ManualClock())
    p.fetching()
    # a full claim that leaves the pool at (or under) its mark: claim again now
    assert p.claimed(10, 10, 10, 0) == NO_LOW_WATER
    assert p.idle_time() == 0 and p.cooldown() == 0


def test_a_full_pool_waits_for_its_mark() -> None:
    p = pacer(ManualClock())
    assert p.claim_size(MAX_WORKERS) == 0
    assert p.full() == MAX_WORKERS - 25


# --- the cooldown and the poll timer --------------------------------------------------------------


def test_triggered_fetches_burst_then_wait_for_the_cooldown() -> None:
    clock = ManualClock()
    p = pacer(clock)
    assert p.cooldown() == 0  # start-up: due
    p.fetching()
    for _ in range(FETCH_BURST):
        assert p.cooldown() == 0
        p.fetching()
    assert 0 < p.cooldown() <= 0.1
    clock.now += 0.1
    assert p.cooldown() == 0


def test_a_due_claim_bypasses_the_cooldown_and_does_not_count_against_it() -> None:
    clock = ManualClock()
    p = pacer(clock)
    p.fetching()
    for _ in range(FETCH_BURST):
        p.fetching()
    assert p.cooldown() > 0
    p.refill()
    assert p.cooldown() == 0
    p.fetching()
    p.resumed()
    assert p.cooldown() == 0


def test_after_a_claim_that_got_rows_a_notified_fetch_follows_within_a_hundredth() -> None:
    """Once the burst is spent, a notified fetch waits for the limiter (4 ms at the default
    cooldown) unless the previous claim got rows: then it may follow that claim's start by
    ``cooldown / FOLLOW_UP`` (1 ms). A claim that gets nothing ends it, and follow-ups do not
    run the limiter into debt, so the next fetch after a streak waits one interval at most."""
    clock = ManualClock()
    p = pacer(clock)
    for _ in range(FETCH_BURST + 1):  # the start-up claim, then the burst
        p.fetching()
    interval = 0.1 / FETCH_BURST
    assert p.cooldown() == pytest.approx(interval)
    p.claimed(3, MAX_WORKERS, 3, 0)  # the last of them got rows
    for _ in range(50):  # a steady flow: every claim gets a few rows
        assert p.cooldown() == pytest.approx(0.1 / FOLLOW_UP)
        clock.now += 0.1 / FOLLOW_UP
        assert p.cooldown() == 0
        p.fetching()
        p.claimed(3, MAX_WORKERS, 3, 0)
    clock.now += 0.1 / FOLLOW_UP
    p.fetching()
    p.claimed(0, MAX_WORKERS, 0, 0)  # the flow stopped
    assert 0 < p.cooldown() <= interval
    clock.now += interval
    assert p.cooldown() == 0


def test_a_failed_or_held_claim_gets_no_follow_up() -> None:
    clock = ManualClock()
    p = pacer(clock)
    for _ in range(FETCH_BURST + 1):
        p.fetching()
    p.claimed(3, MAX_WORKERS, 3, 0)
    p.fetching()  # this claim fails
    p.failed(2.0)
    assert p.idle_time() == 2.0
    clock.now += 0.1 / FOLLOW_UP
    assert p.cooldown() > 0  # the limiter's wait, not a follow-up
    p.fetching()
    p.claimed(3, MAX_WORKERS, 3, 0)
    p.hold(0.5)
    clock.now += 0.1 / FOLLOW_UP
    assert p.cooldown() == pytest.approx(0.5 - 0.1 / FOLLOW_UP)


def test_the_poll_timer_and_a_failure_back_off() -> None:
    clock = ManualClock()
    p = pacer(clock)
    p.fetching()
    assert p.idle_time() == 1.0
    clock.now += 0.4
    assert abs(p.idle_time() - 0.6) < 1e-9
    clock.now += 0.6
    assert p.idle_time() == 0
    p.cooldown()  # re-arms the timer once it fired
    assert p.idle_time() == 1.0
    p.failed(5.0)
    assert p.idle_time() == 5.0
