"""Holding a named lease across a block (``Client.lease``): taken on entry, renewed by a task
of a task group local to the block, released on exit.

The renewer extends the lease every third of its term. A failed renewal (the database
unreachable) is logged and retried with back-off; once the lease can no longer be known to be
ours (its row is gone or another holder has it, or the local deadline, measured from before
the last successful statement was sent, passes), the block is cancelled and
:class:`~river_anyio.LeaseLostError` raised from it, so no two holders keep running.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import anyio

from .._errors import DatabaseError, LeaseLostError
from .._lease import Lease, take_lease
from ..drivers import Driver
from ._util import Backoff

__all__ = ["hold_lease"]

logger = logging.getLogger("river_anyio.lease")

#: How long releasing the lease on exit may take before it is left to expire.
RELEASE_TIMEOUT = 5.0


@contextlib.asynccontextmanager
async def hold_lease(
    driver: Driver, *, name: str, holder: str, ttl: float, database_url: str | None
) -> AsyncIterator[Lease | None]:
    """Yield the lease, held and renewed until the block ends, or None when someone else
    holds it (nothing is started then). Arguments are already validated."""
    sent = anyio.current_time()
    row = await take_lease(driver, name=name, holder=holder, ttl=ttl, database_url=database_url)
    if row is None:
        yield None
        return
    lease = Lease(row, ttl)
    cancelled = anyio.get_cancelled_exc_class()
    lost: list[LeaseLostError] = []
    body_exc: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as body:
                tg.start_soon(
                    _renew, driver, lease, body, lost, sent + ttl, name=f"river lease {name!r}"
                )
                try:
                    yield lease
                except BaseException as exc:
                    if not isinstance(exc, cancelled):
                        body_exc = exc
                    raise
                finally:
                    tg.cancel_scope.cancel("the lease's block ended")
    except BaseExceptionGroup:
        if body_exc is None:
            raise  # cancellations only: the renewer never raises
    finally:
        await _release(driver, lease)
    if body_exc is not None:
        raise body_exc  # outside the handler: its own __cause__ and __context__ stay
    if lost:
        raise lost[0] from None  # not "during handling of" the block's cancellation


async def _renew(
    driver: Driver,
    lease: Lease,
    body: anyio.CancelScope,
    lost: list[LeaseLostError],
    deadline: float,
) -> None:
    """Renew every third of the term until cancelled; on losing the lease, cancel ``body``."""
    backoff = Backoff()
    delay = lease.ttl / 3
    while True:
        await anyio.sleep(max(0.0, min(delay, deadline - anyio.current_time())))
        sent = anyio.current_time()
        row = None
        with anyio.move_on_after(max(0.0, deadline - sent)):
            try:
                row = await driver.executor().lease_renew(
                    name=lease.name, holder=lease.holder, taken_at=lease.taken_at, ttl=lease.ttl
                )
            except DatabaseError as exc:
                delay = backoff.next_delay()
                logger.warning(
                    "lease %r not renewed (retrying in %.2fs): %s",
                    lease.name,
                    delay,
                    exc,
                    extra={"river_event": "lease_renew_failed", "river_lease": lease.name},
                )
                if anyio.current_time() < deadline:
                    continue
        if row is not None:
            lease._renewed(row)
            deadline = sent + lease.ttl
            backoff.reset()
            delay = lease.ttl / 3
            continue
        reason = (
            "its term ended before a renewal succeeded"
            if anyio.current_time() >= deadline
            else "its row is gone or another holder has it"
        )
        logger.error(
            "lease %r lost: %s; cancelling its block",
            lease.name,
            reason,
            extra={"river_event": "lease_lost", "river_lease": lease.name},
        )
        lost.append(LeaseLostError(lease.name, reason))
        body.cancel(f"lease {lease.name!r} lost")
        return


async def _release(driver: Driver, lease: Lease) -> None:
    """Delete the lease if it is still this taking of it (shielded, bounded; a failure leaves
    it to expire)."""
    with anyio.move_on_after(RELEASE_TIMEOUT, shield=True):
        try:
            await driver.executor().lease_release(
                name=lease.name, holder=lease.holder, taken_at=lease.taken_at
            )
        except DatabaseError as exc:
            logger.warning(
                "lease %r not released (it expires at %s): %s",
                lease.name,
                lease.expires_at.isoformat(),
                exc,
                extra={"river_event": "lease_release_failed", "river_lease": lease.name},
            )
