from __future__ import annotations

import itertools

from river_anyio._limiter import BurstLimiter, KeyedBurstLimiter


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_burst_then_one_event_per_interval() -> None:
    clock = FakeClock()
    lim = BurstLimiter(0.1, burst=4, clock=clock)
    assert [lim.try_acquire() for _ in range(5)] == [True, True, True, True, False]
    # once the burst is spent, the next event waits one interval (window / burst), not for
    # the window to slide past the whole burst
    assert abs(lim.delay() - 0.025) < 1e-9
    clock.t += 0.02
    assert not lim.try_acquire()
    clock.t += 0.006
    assert [lim.try_acquire() for _ in range(2)] == [True, False]
    # a quiet window refills the bucket: a whole burst again, and no more
    clock.t += 0.2
    assert [lim.try_acquire() for _ in range(5)] == [True, True, True, True, False]


def test_sustained_rate_is_capped_and_evenly_spread() -> None:
    clock = FakeClock()
    lim = BurstLimiter(0.1, burst=10, clock=clock)
    allowed: list[float] = []
    for _ in range(1000):  # 1 s of attempts every millisecond
        if lim.try_acquire():
            allowed.append(clock.t)
        clock.t += 0.001
    # the first burst, then burst / window a second
    assert 100 <= len(allowed) <= 100 + 10
    gaps = [b - a for a, b in itertools.pairwise(allowed[10:])]
    assert all(abs(g - 0.01) < 0.0015 for g in gaps), gaps


def test_a_recorded_event_that_was_not_allowed_still_counts() -> None:
    clock = FakeClock()
    lim = BurstLimiter(0.1, burst=2, clock=clock)
    lim.record()
    lim.record()
    lim.record()  # over the limit (a due fetch): the bucket runs a debt
    assert abs(lim.delay() - 0.1) < 1e-9


def test_keys_are_independent() -> None:
    lim = KeyedBurstLimiter(10.0, burst=1)
    assert lim.try_acquire("a")
    assert not lim.try_acquire("a")
    assert lim.try_acquire("b")


def test_refused_keys_are_remembered_until_taken() -> None:
    limiter = KeyedBurstLimiter(0.1, burst=1)
    assert limiter.try_acquire("a") and limiter.try_acquire("b")
    assert not limiter.try_acquire("a")
    assert not limiter.try_acquire("b")
    assert limiter.delay("a") > 0
    assert limiter.take_refused({"a", "c"}) == {"a"}
    assert limiter.take_refused({"a"}) == set()  # taken once
    assert limiter.take_refused({"b"}) == {"b"}
