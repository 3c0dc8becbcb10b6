from __future__ import annotations

from river_anyio._limiter import BurstLimiter, KeyedBurstLimiter


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_burst_then_cooldown() -> None:
    clock = FakeClock()
    lim = BurstLimiter(0.1, burst=3, clock=clock)
    assert [lim.try_acquire() for _ in range(4)] == [True, True, True, False]
    assert abs(lim.delay() - 0.1) < 1e-9
    clock.t += 0.05
    assert not lim.try_acquire()
    clock.t += 0.06  # the first three events leave the window together
    assert [lim.try_acquire() for _ in range(4)] == [True, True, True, False]


def test_sustained_rate_is_capped() -> None:
    clock = FakeClock()
    lim = BurstLimiter(0.1, burst=10, clock=clock)
    allowed = 0
    for _ in range(1000):  # 1 s of attempts every millisecond
        allowed += lim.try_acquire()
        clock.t += 0.001
    assert allowed == 100


def test_keys_are_independent() -> None:
    lim = KeyedBurstLimiter(10.0, burst=1)
    assert lim.try_acquire("a")
    assert not lim.try_acquire("a")
    assert lim.try_acquire("b")
