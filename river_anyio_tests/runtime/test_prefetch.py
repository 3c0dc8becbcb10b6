"""How many rows a producer may claim ahead of its free slots (pure logic, no database)."""

from __future__ import annotations

import anyio
import pytest

from river_anyio._runtime._producer import PREFETCH_HORIZON, PREFETCH_MAX, Producer

pytestmark = pytest.mark.anyio


def producer_after(*, finished: int, seconds: float, backlog: bool) -> Producer:
    """A producer whose previous claim ended ``seconds`` ago, ``finished`` jobs since."""
    p = Producer.__new__(Producer)
    p._max_workers = 50
    p._prefetch = 0
    p._backlog = backlog
    p._finished = finished
    p._last_claim = (anyio.current_time() - seconds, 0)
    return p


async def test_quick_jobs_get_up_to_prefetch_max_times_max_workers() -> None:
    p = producer_after(finished=10_000, seconds=0.1, backlog=True)  # 100,000 jobs/s
    p._plan_prefetch()
    assert p._prefetch == PREFETCH_MAX * 50


async def test_rows_claimed_ahead_follow_the_measured_rate() -> None:
    p = producer_after(finished=200, seconds=1.0, backlog=True)  # about 200 jobs/s
    p._plan_prefetch()
    assert 0 < p._prefetch <= int(200 * PREFETCH_HORIZON) + 1


async def test_slow_jobs_and_an_empty_queue_get_none() -> None:
    slow = producer_after(finished=5, seconds=1.0, backlog=True)
    slow._plan_prefetch()
    assert slow._prefetch == 0
    drained = producer_after(finished=10_000, seconds=0.1, backlog=False)
    drained._plan_prefetch()
    assert drained._prefetch == 0
