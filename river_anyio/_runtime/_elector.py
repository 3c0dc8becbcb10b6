"""Leader election on River's ``river_leader`` lease, and the leader scope.

River's protocol, so River Go and river_anyio clients on one database elect one leader among
them. A follower tries to take the lease every interval (5 s, plus 0–1 s of jitter), sooner
when the leader announces its resignation on ``river_leadership``. The lease lasts three
intervals (15 s); the leader extends it every interval and trusts its term only until the
lease, measured from the start of its last successful attempt, is a safety margin (1 s) from
expiring. It leads until the lease is gone (lost: someone else may hold it), until it cannot
renew it in time, until a ``request_resign`` notification arrives, or until the client stops;
in every case but "lost" it resigns (bounded, shielded) so another client takes over at once.

While it leads, and only then, the leader scope exists: a task group holding the leader's
services. Leaving leadership for any reason cancels it, and with it every service.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import attrs
from anyio.abc import TaskGroup, TaskStatus

from .._errors import DatabaseError
from .._events import Event, EventHub, EventKind
from ..drivers import TOPIC_LEADERSHIP, Driver, LeaderRow, Notification
from ._clock import SystemClock
from ._health import Contact
from ._util import Wakeup

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectReceiveStream

    from ._clock import Clock
    from ._notifier import Notifier

__all__ = ["Elector", "LeaderService"]

logger = logging.getLogger("river_anyio.elector")

#: River's per-operation timeout for elect/reelect.
DB_TIMEOUT = 5.0
#: A follower woken by a resignation waits up to this before bidding (so not all at once).
WAKE_SPREAD = 0.05
#: Resignation: three tries with 1, 2, 3 s timeouts, 1 s and 2 s apart (River's).
RESIGN_TIMEOUTS = (1.0, 2.0, 3.0)


class LeaderService(Protocol):
    """A service of the leader scope."""

    name: str

    async def run(self, *, task_status: TaskStatus[None] = ...) -> None: ...


def _backoff(attempt: int, wrap: int) -> float:
    """River's service back-off: 1, 2, 4, … s (wrapping after ``wrap`` attempts), ±10%."""
    base = float(2 ** ((attempt - 1) % wrap))
    return base * (1 + random.uniform(-0.1, 0.1))


@attrs.define
class _Term:
    elected_at: dt.datetime
    #: ``anyio.current_time()`` until which this client may act as leader.
    trusted_until: float


class Elector:
    """Runs elections for one client; while it leads, runs the leader services."""

    def __init__(
        self,
        *,
        driver: Driver,
        client_id: str,
        events: EventHub,
        services: Callable[[], Sequence[LeaderService]],
        interval: float,
        clock: Clock | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self._driver = driver
        self._client_id = client_id
        self._events = events
        self._services = services
        self.interval = interval
        self.jitter = interval / 5  # River: 1 s on 5 s
        self.ttl = interval * 3  # River: interval + 10 s padding
        self.margin = interval / 5  # River: trust the lease until 1 s before it expires
        # River passes its own time to the lease queries only when a test time is set;
        # otherwise the database's clock decides.
        self._clock = None if clock is None or isinstance(clock, SystemClock) else clock
        self._notifier = notifier
        self._wake_follower = Wakeup()
        self._resign_requested = Wakeup()
        #: set while this client leads (a fresh one for each term)
        self._leading = anyio.Event()
        #: leadership terms begun, and the services of the current (or last) term
        self.terms = 0
        self.services: tuple[LeaderService, ...] = ()
        #: the lease's round trips (for health)
        self.contact = Contact()

    @property
    def is_leader(self) -> bool:
        return self._leading.is_set()

    async def wait_leading(self) -> None:
        """Wait until this client leads (at once if it does)."""
        await self._leading.wait()

    # --- notifications --------------------------------------------------------------------

    def request_resign(self) -> None:
        """Ask the current term to end (it resigns and competes again); no-op when following."""
        if self.is_leader:
            self._resign_requested.set()

    def _on_notification(self, note: Notification) -> None:
        try:
            payload = json.loads(note.payload)
        except ValueError:
            logger.warning("elector: unreadable leadership notification %r", note.payload)
            return
        if not isinstance(payload, dict):
            return
        action = payload.get("action")
        if action == "request_resign":
            if self.is_leader:
                logger.info("elector: resignation requested")
            self.request_resign()
        elif action == "resigned" and payload.get("leader_id") != self._client_id:
            self._wake_follower.set()

    async def _follow_notifications(self, receive: MemoryObjectReceiveStream[Notification]) -> None:
        async with receive:
            async for note in receive:
                if note.topic == TOPIC_LEADERSHIP:
                    self._on_notification(note)

    # --- the run ------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        receive = None
        if self._notifier is not None:
            receive = self._notifier.subscribe(self, (TOPIC_LEADERSHIP,))
        try:
            async with anyio.create_task_group() as tg:
                if receive is not None:
                    tg.start_soon(self._follow_notifications, receive, name="river elector notes")
                task_status.started()
                while True:
                    term = await self._follow()
                    await self._lead(term)
        finally:
            if self._notifier is not None:
                self._notifier.unsubscribe(self)

    def _now(self) -> dt.datetime | None:
        return self._clock.now() if self._clock is not None else None

    async def _follow(self) -> _Term:
        """Bid for the lease until this client holds it."""
        failures = 0
        while True:
            started = anyio.current_time()
            try:
                with anyio.fail_after(DB_TIMEOUT):
                    async with self._driver.transaction() as tx:
                        await tx.leader_delete_expired(now=self._now())
                        row = await tx.leader_attempt_elect(
                            leader_id=self._client_id, ttl=self.ttl, now=self._now()
                        )
            except (DatabaseError, TimeoutError) as exc:
                self.contact.failed(exc)
                failures += 1
                delay = _backoff(failures, 7)
                hint = (
                    " (the connection pool may be exhausted)"
                    if isinstance(exc, TimeoutError)
                    else ""
                )
                logger.error(
                    "elector: election attempt %d failed, retrying in %.1fs: %s%s",
                    failures,
                    delay,
                    exc or type(exc).__name__,
                    hint,
                    extra={"river_event": "elect_failed"},
                )
                await anyio.sleep(delay)
                continue
            self.contact.ok(started)
            if row is not None:
                return self._term(row, started)
            failures = 0
            with anyio.move_on_after(random.uniform(self.interval, self.interval + self.jitter)):
                await self._wake_follower.wait()
                # someone resigned: bid soon, not all at once
                await anyio.sleep(random.uniform(0, WAKE_SPREAD))
            self._wake_follower.clear()

    def _term(self, row: LeaderRow, started: float) -> _Term:
        return _Term(
            elected_at=row.elected_at, trusted_until=started + max(0.0, self.ttl - self.margin)
        )

    async def _lead(self, term: _Term) -> None:
        """Hold the lease, with the leader scope open, until leadership ends; then resign
        unless the lease was lost."""
        self._resign_requested.clear()
        # built before the term is announced, so whoever hears of it sees its services
        self.services = tuple(self._services())
        self._leading.set()
        self.terms += 1
        logger.info("elector: %s elected leader", self._client_id)
        self._events.publish(
            Event(
                kind=EventKind.LEADER_ELECTED,
                details={"client_id": self._client_id, "elected_at": term.elected_at},
            )
        )
        reason = "stopping"
        async with anyio.create_task_group() as leader:
            leader.start_soon(self._start_services, leader, name="river leader services")
            try:
                reason = await self._keep(term)
            finally:
                leader.cancel_scope.cancel(f"leadership {reason}")
                # no longer the leader from here on: said before the lease is given up, so
                # nobody hears of a new leader while this one still claims to lead
                self._leading = anyio.Event()
                self._resign_requested.clear()
                logger.info("elector: %s no longer leads (%s)", self._client_id, reason)
                self._events.publish(
                    Event(
                        kind=EventKind.LEADER_LOST,
                        details={"client_id": self._client_id, "reason": reason},
                    )
                )
                if reason != "lost":
                    # at once, before the services are awaited, so another client may take
                    # over while they wind down
                    await self._resign(term)

    async def _start_services(self, leader: TaskGroup) -> None:
        for service in self.services:
            try:
                await leader.start(_guarded, service, self._events, name=f"river {service.name}")
            except Exception as exc:
                _report(service, exc, self._events, starting=True)
                logger.error("elector: maintenance could not start; resigning this term")
                self.request_resign()
                return

    async def _keep(self, term: _Term) -> str:
        """Renew the lease every interval. Returns why leadership ended: "lost" (the lease is
        gone), "expired" (not renewed within the trusted window) or "resigned" (asked to)."""
        failures = 0
        wait = self.interval
        while True:
            with anyio.move_on_after(wait):
                await self._resign_requested.wait()
                logger.info("elector: %s resigning on request", self._client_id)
                return "resigned"
            started = anyio.current_time()
            remaining = term.trusted_until - started
            if remaining <= 0:
                logger.warning("elector: lease not renewed in time; stepping down")
                return "expired"
            try:
                with anyio.fail_after(min(DB_TIMEOUT, remaining)):
                    row = await self._driver.executor().leader_attempt_reelect(
                        leader_id=self._client_id,
                        elected_at=term.elected_at,
                        ttl=self.ttl,
                        now=self._now(),
                    )
            except (DatabaseError, TimeoutError) as exc:
                self.contact.failed(exc)
                failures += 1
                remaining = term.trusted_until - anyio.current_time()
                if remaining <= 0:
                    logger.warning("elector: lease not renewed in time after an error: %s", exc)
                    return "expired"
                delay = min(_backoff(failures, 3), remaining)
                logger.error(
                    "elector: renewing the lease failed (%d), retrying in %.1fs: %s",
                    failures,
                    delay,
                    exc or type(exc).__name__,
                )
                await anyio.sleep(delay)
                wait = 0  # the window shrank already: retry right after the back-off
                continue
            self.contact.ok(started)
            if row is None:
                logger.warning("elector: %s lost the lease", self._client_id)
                return "lost"
            failures = 0
            term = self._term(row, started)
            wait = self.interval

    async def _resign(self, term: _Term) -> None:
        """Give the lease up: a few bounded tries, shielded from cancellation."""
        with anyio.CancelScope(shield=True):
            for attempt, timeout in enumerate(RESIGN_TIMEOUTS, start=1):
                try:
                    with anyio.fail_after(timeout):
                        await self._driver.executor().leader_resign(
                            leader_id=self._client_id, elected_at=term.elected_at
                        )
                    return
                except (DatabaseError, TimeoutError) as exc:
                    logger.error("elector: resigning failed (attempt %d): %s", attempt, exc)
                    if attempt < len(RESIGN_TIMEOUTS):
                        await anyio.sleep(_backoff(attempt, len(RESIGN_TIMEOUTS)))


def _report(service: Any, exc: BaseException, events: EventHub, *, starting: bool) -> None:
    logger.error(
        "maintenance service %s %s: %s: %s",
        service.name,
        "failed to start" if starting else "stopped",
        type(exc).__name__,
        exc,
        exc_info=exc,
        extra={"river_event": "maintenance_failed", "river_service": service.name},
    )
    events.publish(
        Event(
            kind=EventKind.MAINTENANCE_FAILED,
            error=f"{type(exc).__name__}: {exc}",
            details={"service": service.name},
        )
    )


async def _guarded(
    service: LeaderService,
    events: EventHub,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """A leader service whose unexpected failure is reported, never raised into the scope
    (the services handle failures of each run themselves; this is the last resort). A failure
    before it started is raised: its start failed."""
    status = _Status(task_status)
    try:
        await service.run(task_status=status)
    except Exception as exc:
        if not status.called:
            raise
        _report(service, exc, events, starting=False)


class _Status:
    """Forwards ``started()`` and remembers that it was called."""

    def __init__(self, inner: TaskStatus[None]) -> None:
        self._inner = inner
        self.called = False

    def started(self, value: None = None) -> None:
        self.called = True
        self._inner.started()
