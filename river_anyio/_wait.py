"""Waiting for jobs to be finalized (``client.jobs.wait``): in-process wake-ups.

River has no notification for a finished job, and sending one for every completion would cost
every client that never waits. So a wait polls the row, backing off to a bounded interval, and
is woken early when *this* client finalizes the job itself (its completer wrote the result, its
rescuer moved the job on, or it cancelled a job that was not running). The wake-ups cost the
writers one emptiness check of :class:`JobWaiters` per batch while nobody waits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import anyio

__all__ = ["JobWaiters", "Watch"]


class Watch:
    """One waiter's wake-up: level-triggered, consumed by :meth:`wait`."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = anyio.Event()


class JobWaiters:
    """The waits in progress on one client, by job id."""

    __slots__ = ("_by_id",)

    def __init__(self) -> None:
        self._by_id: dict[int, set[Watch]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_id)

    @contextlib.contextmanager
    def watch(self, job_id: int) -> Iterator[Watch]:
        """A wake-up for ``job_id`` while the block runs."""
        watch = Watch()
        self._by_id.setdefault(job_id, set()).add(watch)
        try:
            yield watch
        finally:
            watches = self._by_id.get(job_id)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._by_id[job_id]

    def wake(self, job_ids: Iterable[int]) -> None:
        """These jobs were finalized (or may have been) by this client: wake their waits."""
        by_id = self._by_id
        for job_id in job_ids:
            for watch in by_id.get(job_id, ()):
                watch.set()
