"""A claim whose reply was lost: finding its jobs and giving them back at once.

A claim (``job_get_available``) that fails with a connection error or times out may still
have committed on the server: its rows are ``running``, attempted by this client, yet no
worker has them. Without this they wait for the rescuer (``rescue_after``, an hour by default).
So a producer whose claim failed gives those rows back (``job_give_back_lost_claims``) with
the next database call that works, before it claims again: they become ``available`` with
their attempt restored and no error, like an interrupted attempt, and the next claim takes
them again. Giving back rather than running them keeps this out of the producer's slot and
prefetch accounting, and costs one statement.

Which rows are the lost claim's: this client's id last in ``attempted_by``, this queue, not
among the jobs the producer runs, and attempted *after* the latest claim whose rows did
arrive. That bound is exact on the database's own clock (claims run one after another, and
``attempted_at`` is the claim's ``now()``), so a job an earlier claim took, finished and
handed to the completer but whose completion is not written yet, is never given back and run
twice. The window back from the database's now (the time since the failed claim began, plus
``WINDOW_SLACK``) only keeps stale rows of an earlier run under the same id out of it.

The happy path costs one comparison per claim (:meth:`LostClaims.claimed`) and no SQL.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Collection, Sequence

import anyio

from .._errors import DatabaseError
from .._job import JobRow, JobState
from .._logging import queue_extra
from ..drivers import Driver

__all__ = ["LostClaims"]

logger = logging.getLogger("river_anyio.producer")

#: How much further back than the failed claim's start the window reaches: room for the
#: recovery statement's own latency (the window is measured from the database's now).
WINDOW_SLACK = 60.0
#: Bound on one recovery statement.
RECOVERY_TIMEOUT = 10.0


class LostClaims:
    """One producer's lost-claim bookkeeping: the newest ``attempted_at`` among rows it
    received, and since when a failed claim waits to be recovered (``pending_since``, on the
    loop's clock; None when nothing does)."""

    __slots__ = ("_client_id", "_driver", "_queue", "claimed_after", "pending_since")

    def __init__(self, driver: Driver, *, queue: str, client_id: str) -> None:
        self._driver = driver
        self._queue = queue
        self._client_id = client_id
        self.claimed_after: dt.datetime | None = None
        self.pending_since: float | None = None

    def claimed(self, rows: Sequence[JobRow]) -> None:
        """A claim's rows arrived (one claim's rows share one ``attempted_at``)."""
        if rows:
            at = rows[0].attempted_at
            if at is not None and (self.claimed_after is None or at > self.claimed_after):
                self.claimed_after = at

    def failed(self, started: float) -> None:
        """A claim begun at ``started`` (``anyio.current_time()``, or earlier) failed: its rows
        may be running on the server."""
        if self.pending_since is None or started < self.pending_since:
            self.pending_since = started

    async def recover(self, running: Collection[int]) -> bool:
        """Give back what failed claims left running, except the ``running`` job ids.

        Returns False when the database failed again (transiently): the producer must not
        claim before a later call succeeds. A permanent failure gives up (logged): those
        rows are left to the rescuer rather than blocking claims for good.
        """
        since = self.pending_since
        if since is None:
            return True
        within = anyio.current_time() - since + WINDOW_SLACK
        try:
            # Shielded like the claim: cut short after the server committed, the rows would
            # be given back unseen (harmless), but the next claim must follow a finished call.
            with anyio.CancelScope(shield=True), anyio.fail_after(RECOVERY_TIMEOUT):
                rows = await self._driver.executor().job_give_back_lost_claims(
                    queue=self._queue,
                    client_id=self._client_id,
                    claimed_after=self.claimed_after,
                    within=within,
                    running=list(running),
                )
        except (DatabaseError, TimeoutError) as exc:
            transient = isinstance(exc, TimeoutError) or exc.transient
            if transient:
                logger.warning(
                    "producer %s: recovering a failed claim failed (retrying before the next "
                    "claim): %s",
                    self._queue,
                    exc,
                    extra=queue_extra("lost_claim_recovery_failed", self._queue, self._client_id),
                )
                return False
            logger.error(
                "producer %s: recovering a failed claim failed; any jobs it claimed are left "
                "to the rescuer: %s",
                self._queue,
                exc,
                extra=queue_extra("lost_claim_recovery_failed", self._queue, self._client_id),
            )
            self.pending_since = None
            return True
        self.pending_since = None
        if rows:
            cancelled = sum(1 for r in rows if r.state is JobState.CANCELLED)
            extra = queue_extra("lost_claim_recovered", self._queue, self._client_id)
            extra["river_job_ids"] = [r.id for r in rows]
            logger.warning(
                "producer %s: a claim's reply was lost; gave back %d jobs it had claimed "
                "(%d available again, %d cancelled meanwhile)",
                self._queue,
                len(rows),
                len(rows) - cancelled,
                cancelled,
                extra=extra,
            )
        return True
