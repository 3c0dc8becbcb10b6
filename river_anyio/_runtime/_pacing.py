"""When a producer claims and how many rows: pure logic, no I/O, nothing awaited.

Fetch triggers (River's): start-up; an insert notification for this queue; the poll timer
every ``fetch_poll_interval`` plus jitter ``U[0, max(interval/10, 10 ms))``; a resume.
Notification- and poll-triggered fetches are rate limited by ``fetch_cooldown``, the guard
against notification storms: a burst of up to ``FETCH_BURST`` fetches, then one every
``fetch_cooldown / FETCH_BURST`` (a token bucket), so a job inserted a few milliseconds after
another is still picked up at once, while a storm is capped at ``FETCH_BURST / fetch_cooldown``
fetches per second, evenly spread. A fetch right after a claim that got rows is not a storm's:
jobs are arriving steadily, and it may follow that claim's start by ``fetch_cooldown /
FOLLOW_UP`` (1 ms by default) without counting against the bucket. Under a steady flow of
inserts the notified fetches then follow the notifications (at most 1,000 a second that find
rows), while fetches that find nothing stay at the bucket's 250 a second.

Beyond River, freed slots are refilled promptly while a backlog exists (the last claim filled
every free slot): once a worthwhile share of the slots is free (half of them, at most 25) a
claim runs without waiting for the cooldown, so a busy queue is not capped at one claim per
cooldown. The pacer expresses that as a *low-water mark*: the number of attempts the worker
pool may hold at most before it asks for a claim. While that backlog lasts and jobs finish
quickly, the producer also claims ahead: up to ``PREFETCH_MAX × max_workers`` extra rows, no
more than the workers get through in ``PREFETCH_HORIZON`` at the rate measured between
claims, may wait in the ready queue, so the next claim's round trip overlaps the jobs being
run instead of following them. Each such claim takes a third of the rows claimed ahead
(``CLAIM_SHARE``), leaving twice as many ready: a claim costs the database about as much time
per row as a quick job costs the client, and its round trip competes with the client for the
same cores, so the rows left must outlast it. Long jobs measure a low rate and get no
prefetch.

A queue with global limits (``rate_limit``, ``global_max_workers``) claims no rows ahead, and
when a claim is cut short by a limit the pacer *holds*: no claim before the rate window
reopens (or, for ``global_max_workers``, before one cooldown passed), whatever wakes the loop.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from .._limiter import BurstLimiter

__all__ = [
    "CLAIM_SHARE",
    "FETCH_BURST",
    "FOLLOW_UP",
    "NO_LOW_WATER",
    "PREFETCH_HORIZON",
    "PREFETCH_MAX",
    "FetchPacer",
]

#: Notification- and poll-triggered fetches allowed at once, and per ``fetch_cooldown``.
FETCH_BURST = 25
#: After a claim that got rows, a notified fetch may follow ``fetch_cooldown / FOLLOW_UP``
#: after the previous one began, whatever the burst limiter says.
FOLLOW_UP = 100
#: Claimed-ahead rows are limited to what the workers start within this many seconds...
PREFETCH_HORIZON = 0.05
#: ...and to this many times ``max_workers``.
PREFETCH_MAX = 6
#: While rows are claimed ahead, a claim takes this share of them (at least the refill share).
CLAIM_SHARE = 3
#: A low-water mark no pool reaches: no claim is wanted when jobs finish.
NO_LOW_WATER = -1


class FetchPacer:
    """Decides when a producer's fetch loop claims, and how many rows, from what it is told:
    wake-ups, claims made, jobs finished. ``clock`` is the event loop's clock in a producer
    and a manual one in tests; ``jitter`` draws the poll timer's jitter."""

    def __init__(
        self,
        *,
        max_workers: int,
        cooldown: float,
        poll_interval: float,
        clock: Callable[[], float],
        jitter: Callable[[float, float], float] = random.uniform,
        fixed_prefetch: int | None = None,
        prefetch: bool = True,
    ) -> None:
        self.max_workers = max_workers
        self.cooldown_interval = cooldown
        #: rows claimed ahead after every claim that meets a backlog, instead of the measured
        #: number (tests use it to hold rows in the ready queue)
        self._fixed_prefetch = fixed_prefetch
        #: whether rows may be claimed ahead (not for a queue with global limits)
        self.prefetch_allowed = prefetch
        self.poll_interval = poll_interval
        #: the share of free slots worth a claim of its own
        self.refill_at = max(1, min(25, math.ceil(max_workers / 2)))
        #: rows the next claims may take beyond the free slots
        self.prefetch = 0
        self._clock = clock
        self._jitter = jitter
        self._limiter = BurstLimiter(cooldown, FETCH_BURST, clock=clock)
        self._follow_up_interval = cooldown / FOLLOW_UP
        #: the earliest follow-up fetch (inf: the last claim got nothing, the limiter rules)
        self._follow_up_at = math.inf
        # the previous claim's end: (time, jobs finished by then)
        self._last_claim: tuple[float, int] | None = None
        #: the last claim got fewer rows than it asked for: the queue is drained (or a limit
        #: cut the claim short)
        self.drained = False
        #: a claim is due without waiting for a wake-up or the cooldown (start-up, resume,
        #: a refill of freed slots)
        self._due = True
        self._next_poll = clock() + self._poll_delay()
        #: no claim before this time (a global limit allows none until then)
        self._hold_until = -math.inf
        #: when the current (or last) fetch began
        self._fetch_began = -math.inf

    def _poll_delay(self) -> float:
        p = self.poll_interval
        return p + self._jitter(0, max(p / 10, 0.01))

    # --- the fetch loop's questions --------------------------------------------------------

    def idle_time(self) -> float:
        """How long the loop waits for a wake-up before fetching anyway (the poll timer);
        0 when a claim is due."""
        if self._due:
            return 0.0
        return max(0.0, self._next_poll - self._clock())

    def cooldown(self) -> float:
        """Called on waking: how long to wait before fetching (the burst limiter's delay; 0
        for a claim that is due, which bypasses it). Re-arms the poll timer once it fired."""
        now = self._clock()
        if now >= self._next_poll:
            self._next_poll = now + self._poll_delay()
        wait = 0.0 if self._due else min(self._limiter.delay(), self._follow_up_at - now)
        return max(wait, self._hold_until - now, 0.0)

    def fetching(self) -> None:
        """A fetch begins: it counts against the cooldown unless it was due or a follow-up
        the limiter would not have let through yet (a follow-up is paced by its interval)."""
        if not self._due and self._limiter.delay() == 0:
            self._limiter.record()
        self._due = False
        self._follow_up_at = math.inf
        self._fetch_began = self._clock()

    def claim_size(self, active: int) -> int:
        """How many rows a claim may take with ``active`` attempts held (claimed or running):
        the free slots plus the rows that may be claimed ahead; 0 or less: none."""
        return self.max_workers + self.prefetch - active

    def low_water(self) -> int:
        """The most attempts the pool may hold for a claim to be worthwhile: half the slots
        free (at most 25), or while rows are claimed ahead, room for a third of them, so the
        claim's round trip runs while twice as many rows are still ready."""
        share = max(self.refill_at, self.prefetch // CLAIM_SHARE)
        return self.max_workers + self.prefetch - share

    def full(self) -> int:
        """No room for a claim: the low-water mark at which finishing jobs ask for one."""
        return self.low_water()

    def claimed(self, got: int, limit: int, active: int, finished: int) -> int:
        """A claim of up to ``limit`` rows returned ``got``; the pool now holds ``active``
        attempts and has finished ``finished`` jobs in all. Plans the rows to claim ahead and
        returns the low-water mark for the pool (``NO_LOW_WATER`` when the queue is drained,
        or when the next claim is due at once)."""
        backlog = got == limit
        self.drained = not backlog
        if got:  # rows are arriving: the next notified fetch need not wait for the limiter
            self._follow_up_at = self._fetch_began + self._follow_up_interval
        self._plan_prefetch(backlog, finished)
        if not backlog:
            return NO_LOW_WATER
        mark = self.low_water()
        if active <= mark:
            # room to claim ahead already: the next claim overlaps the jobs just claimed
            self._due = True
            return NO_LOW_WATER
        return mark

    @property
    def last_claim_at(self) -> float | None:
        """When the last successful claim returned (the clock's time), None before one."""
        return None if self._last_claim is None else self._last_claim[0]

    def failed(self, delay: float) -> None:
        """A claim failed: the next one waits ``delay`` (a back-off), then the poll timer."""
        self._next_poll = self._clock() + delay
        self._due = False

    def hold(self, delay: float) -> None:
        """A global limit allows no claim for ``delay`` seconds: the next one waits that long
        (then it is due on the poll timer), and nothing that wakes the loop claims sooner."""
        self._hold_until = self._next_poll = self._clock() + delay
        self._due = False

    def refill(self) -> None:
        """The pool fell to its low-water mark: a claim is due."""
        self._due = True

    def resumed(self) -> None:
        """The queue was resumed: a claim is due."""
        self._due = True

    def _plan_prefetch(self, backlog: bool, finished: int) -> None:
        """After a claim: how many rows the next claims may take beyond the free slots.

        Only while a backlog lasts, and only as many as the workers finish within
        ``PREFETCH_HORIZON`` at the rate measured since the previous claim, so rows claimed
        ahead start promptly and slow jobs get none.
        """
        now = self._clock()
        previous, self._last_claim = self._last_claim, (now, finished)
        self.prefetch = 0
        if not backlog or not self.prefetch_allowed:
            return
        if self._fixed_prefetch is not None:
            self.prefetch = self._fixed_prefetch
            return
        if previous is None:
            return
        elapsed = now - previous[0]
        if elapsed <= 0:
            return
        rate = (finished - previous[1]) / elapsed
        self.prefetch = min(PREFETCH_MAX * self.max_workers, int(rate * PREFETCH_HORIZON))
