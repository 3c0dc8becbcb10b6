"""The client run: one task group, nested scopes, and the exception policy at its boundary.

::

    run_client                        (root task group)
    ├─ lag monitor
    ├─ notifier.run                   ready once listening (start fails otherwise)
    ├─ completer.run                  the completion nursery; outlives every job
    ├─ elector.run                    River's river_leader lease (cancelled when a stop begins)
    │    └─ leader scope              exists exactly while this client leads
    │         └─ scheduler, rescuer, job cleaner, queue cleaner, reindexer | outbox cleaner
    └─ producers task group           the inner scope: stop escalation lands here
         └─ producer[q].run (×queues)
              └─ job nursery → executor per job

Soft stop (``run.stop(timeout)``, or leaving ``open_client``'s body normally): producers stop
claiming; running jobs may finish; when the timeout passes the producers' scope is cancelled
with reason "soft stop timeout" and the jobs still running are interrupted (back to
``available``, attempt restored, no error). ``run.stop_and_cancel()`` cancels them at once.
When every producer has exited the completer flushes and returns, then the notifier and the
rest are cancelled. When a stop begins the leader resigns at once (bounded, shielded) and its
maintenance ends while the queues drain, so another client can take over. Many stop calls
share one shutdown; the client never installs signal handlers.

Exceptions leaving ``open_client``: the body's own exception propagates unchanged (after a
stop-and-cancel); a failure of an internal service raises :class:`ClientCrashedError` with the
exception group as ``__cause__``; a start-up failure is raised as itself; cancellation and
``KeyboardInterrupt`` are never wrapped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import attrs
from anyio.abc import TaskStatus

from .._client import Client
from .._config import ClientConfig, QueueConfig
from .._errors import ConfigError, NotFoundError, RiverError, ValidationError
from .._events import Event, EventHub, EventKind, Subscription
from .._logging import client_extra, queue_extra
from ..drivers import Driver
from ._clock import Clock
from ._completer import Completer, CompleterStatistics
from ._elector import Elector, LeaderService
from ._maintenance import (
    JobCleaner,
    JobRescuer,
    JobScheduler,
    NotificationCleaner,
    QueueCleaner,
    Reindexer,
)
from ._notifier import ALL_TOPICS, TOPICS, Notifier
from ._periodic import PeriodicEnqueuer
from ._producer import Producer
from ._runner import JobRunner
from ._util import STOP_AND_CANCEL_REASON, STOP_TIMEOUT_REASON

__all__ = ["ClientCrashedError", "ClientRun", "Diagnostics", "leader_services"]

logger = logging.getLogger("river_anyio.client")

LAG_SAMPLE = 1.0
LAG_WARN = 0.1


class ClientCrashedError(RiverError):
    """An internal service of a running client failed; the run was stopped and cleaned up.

    The failures are in ``__cause__`` (an exception group).
    """


@attrs.frozen(kw_only=True)
class QueueDiagnostics:
    active_jobs: int
    paused: bool
    fetches: int


@attrs.frozen(kw_only=True)
class Diagnostics:
    """A snapshot of a running client's internals."""

    loop_lag: float
    loop_lag_max: float
    queues: dict[str, QueueDiagnostics]
    completer: CompleterStatistics | None
    notifier_reconnects: int
    notifications_dropped: int
    stopping: bool


class ClientRun:
    """A running client: ``client`` plus stop controls, events and diagnostics."""

    def __init__(self, client: Client, config: ClientConfig, events: EventHub) -> None:
        self.client = client
        self.config = config
        self._events = events
        self._stop_requested = anyio.Event()
        self._stopped = anyio.Event()
        self._stop_deadline = math.inf
        self._cancel_reason: str | None = None
        self._producers_scope: anyio.CancelScope | None = None
        self._escalation: anyio.CancelScope | None = None
        self._producers: dict[str, Producer] = {}
        self._completer: Completer | None = None
        self._notifier: Notifier | None = None
        self._lag = 0.0
        self._lag_max = 0.0
        self._started = False
        # local queues (client.local_queues): what a producer added later is built from
        self._producers_tg: anyio.abc.TaskGroup | None = None
        self._producer_done: dict[str, anyio.Event] = {}
        self._new_producer: Callable[[str, ClientConfig], Producer] | None = None
        self._elector: Elector | None = None
        self._elector_scope: anyio.CancelScope | None = None
        #: The current (or last) leader term's services, for diagnostics and tests.
        self._leader_services: list[LeaderService] = []

    # --- controls -----------------------------------------------------------------------------

    def stop(self, timeout: float | None = None) -> None:
        """Begin a graceful stop: stop claiming, let running jobs finish, and cancel them once
        ``timeout`` seconds have passed (``None``: wait for them however long it takes).
        Returns at once; ``await run.wait()`` for the end. Calling it again can bring the
        deadline forward, never push it back."""
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or math.isnan(timeout)
            or timeout < 0
        ):
            raise ConfigError(
                "timeout", "must be a non-negative number of seconds or None", timeout
            )
        deadline = math.inf if timeout is None else anyio.current_time() + float(timeout)
        if deadline < self._stop_deadline:
            self._stop_deadline = deadline
            if self._escalation is not None:
                self._escalation.cancel("stop deadline brought forward")  # the stopper re-arms
        self._request_stop()

    def stop_and_cancel(self) -> None:
        """Stop now: running jobs are cancelled and made available again (interrupted)."""
        self._request_stop()
        self._cancel_jobs(STOP_AND_CANCEL_REASON)

    def _request_stop(self) -> None:
        # Producers stop claiming now, not when the stopper task next runs: once stop()
        # returns no new claim begins (trio may run a producer before the stopper).
        if not self._stop_requested.is_set():
            logger.info(
                "client %s stopping",
                self.client.id,
                extra=client_extra("client_stopping", self.client.id),
            )
            self._stop_requested.set()
        for producer in self._producers.values():
            producer.stop_fetching()
        if self._elector_scope is not None:  # resign now; maintenance ends as queues drain
            self._elector_scope.cancel("client stopping")

    def _cancel_jobs(self, reason: str) -> None:
        # Cancelling the producers while they start would fail their start: a stop that
        # arrives during start is applied as soon as every producer has started.
        if self._cancel_reason is None:
            self._cancel_reason = reason
        if self._started and self._producers_scope is not None:
            self._producers_scope.cancel(reason)

    async def wait(self) -> None:
        """Wait until the run has fully stopped."""
        await self._stopped.wait()

    @property
    def stopping(self) -> bool:
        return self._stop_requested.is_set()

    @property
    def is_leader(self) -> bool:
        """Whether this client currently holds River's leadership lease."""
        return self._elector is not None and self._elector.is_leader

    def subscribe(self, *kinds: EventKind | str) -> Subscription:
        """Events of the given kinds (all when none given), in a bounded buffer of 1,000."""
        return self._events.subscribe(kinds)

    @property
    def diagnostics(self) -> Diagnostics:
        return Diagnostics(
            loop_lag=self._lag,
            loop_lag_max=self._lag_max,
            queues={
                name: QueueDiagnostics(
                    active_jobs=p.active_jobs, paused=p.paused, fetches=p.fetches
                )
                for name, p in self._producers.items()
            },
            completer=self._completer.statistics() if self._completer is not None else None,
            notifier_reconnects=self._notifier.reconnects if self._notifier else 0,
            notifications_dropped=self._notifier.dropped if self._notifier else 0,
            stopping=self.stopping,
        )

    def _trigger_queues(self, queues: set[str]) -> None:
        for q in queues:
            p = self._producers.get(q)
            if p is not None:
                p.trigger()

    # --- local queues and local control (client.local_queues; client.jobs/queues) --------------

    def _control_locally(self, queue: str, payload: dict[str, Any]) -> None:
        """A control action taken through this client's API, applied to its own producers at
        once when it does not listen for notifications (River does the same)."""
        for producer in list(self._producers.values()):
            producer._control(payload)

    async def _run_producer(self, producer: Producer, *, task_status: TaskStatus[None]) -> None:
        done = self._producer_done[producer.queue] = anyio.Event()
        try:
            await producer.run(task_status=task_status)
        finally:
            done.set()

    async def _add_queue(self, name: str, queue_config: QueueConfig) -> None:
        """Start a producer for a new queue (``client.local_queues.add``)."""
        if self._new_producer is None:
            raise ValidationError(
                "local_queues", "this client works no jobs (no workers are registered)"
            )
        if self._producers_tg is None or not self._started or self.stopping:
            raise ValidationError("local_queues", "the client is not running (or is stopping)")
        if name in self._producers:
            raise ValidationError("name", f"queue {name!r} is already added", name)
        config = self.config
        cooldown = queue_config.fetch_cooldown
        cooldown = config.fetch_cooldown if cooldown is None else cooldown
        poll = queue_config.fetch_poll_interval
        poll = config.fetch_poll_interval if poll is None else poll
        if poll < cooldown:
            raise ConfigError(
                "fetch_poll_interval",
                f"cannot be shorter than the queue's fetch_cooldown ({cooldown:g}s)",
                poll,
            )
        self.config = attrs.evolve(config, queues={**config.queues, name: queue_config})
        producer = self._new_producer(name, self.config)
        self._producers[name] = producer
        try:
            await self._producers_tg.start(
                self._run_producer, producer, name=f"river producer {name}"
            )
        except BaseException:
            self._forget(name, producer)
            raise
        logger.info("queue %s added", name, extra=queue_extra("queue_added", name, self.config.id))

    async def _remove_queue(self, name: str) -> None:
        """Stop a queue's producer and wait until its running jobs are done
        (``client.local_queues.remove``)."""
        producer = self._producers.get(name)
        if producer is None:
            raise NotFoundError(f"queue {name!r} is not worked by this client")
        producer.stop_fetching()
        done = self._producer_done.get(name)
        if done is not None:
            await done.wait()
        self._forget(name, producer)
        logger.info(
            "queue %s removed", name, extra=queue_extra("queue_removed", name, self.config.id)
        )

    def _forget(self, name: str, producer: Producer) -> None:
        if self._producers.get(name) is not producer:
            return
        del self._producers[name]
        self._producer_done.pop(name, None)
        self.config = attrs.evolve(
            self.config, queues={k: v for k, v in self.config.queues.items() if k != name}
        )

    # --- the run ------------------------------------------------------------------------------

    async def _lag_monitor(self) -> None:
        while True:
            start = anyio.current_time()
            await anyio.sleep(LAG_SAMPLE)
            lag = max(0.0, anyio.current_time() - start - LAG_SAMPLE)
            self._lag = lag
            self._lag_max = max(self._lag_max, lag)
            if lag > LAG_WARN:
                logger.warning(
                    "event loop lag %.0f ms",
                    lag * 1000,
                    extra=client_extra("loop_lag", self.client.id),
                )
                self._events.publish(Event(kind=EventKind.LOOP_LAG, details={"lag": lag}))

    async def _stopper(self) -> None:
        """Cancels the running jobs once the stop deadline passes."""
        await self._stop_requested.wait()
        while True:
            with anyio.CancelScope() as self._escalation:
                if math.isfinite(self._stop_deadline):
                    await anyio.sleep_until(self._stop_deadline)
                    logger.warning(
                        "soft stop timeout passed; cancelling running jobs",
                        extra=client_extra("stop_timeout", self.client.id),
                    )
                    self._cancel_jobs(STOP_TIMEOUT_REASON)
                    return
                await anyio.sleep_forever()
            # the deadline was brought forward: re-arm

    async def _run_elector(self, elector: Elector) -> None:
        with anyio.CancelScope() as scope:
            self._elector_scope = scope
            if self._stop_requested.is_set():
                scope.cancel("client stopping")
            await elector.run()

    async def _run(
        self,
        driver: Driver,
        clock: Clock,
        *,
        task_status: TaskStatus[ClientRun],
    ) -> None:
        config = self.config
        try:
            async with anyio.create_task_group() as root:
                root.start_soon(self._lag_monitor, name="river lag monitor")
                notifier: Notifier | None = None
                works = bool(config.queues) or len(config.workers) > 0  # queues may be added
                elects = bool(config.queues) and not config.leader_election_disabled
                if works and not config.poll_only and driver.supports_listen_notify:
                    notifier = Notifier(driver, ALL_TOPICS if elects else TOPICS)
                    await root.start(notifier.run, name="river notifier")
                self._notifier = notifier
                if elects:

                    def services() -> list[LeaderService]:
                        self._leader_services = leader_services(self, driver, clock)
                        return self._leader_services

                    self._elector = Elector(
                        driver=driver,
                        client_id=config.id,
                        events=self._events,
                        services=services,
                        interval=config.elect_interval,
                        clock=clock,
                        notifier=notifier,
                    )
                    root.start_soon(self._run_elector, self._elector, name="river elector")
                timings: dict[str, Any] = {}
                if config.completer_pauses is not None:
                    timings["pauses"] = config.completer_pauses
                if config.completer_try_timeout is not None:
                    timings["try_timeout"] = config.completer_try_timeout
                completer = Completer(driver, client_id=config.id, events=self._events, **timings)
                self._completer = completer
                completer_done = anyio.Event()

                async def run_completer(*, task_status: TaskStatus[Any]) -> None:
                    try:
                        await completer.run(task_status=task_status)
                    finally:
                        completer_done.set()

                send = await root.start(run_completer, name="river completer")
                thread_limiter = anyio.CapacityLimiter(config.thread_workers)
                process_runner = None
                if any(reg.run_in == "process" for reg in config.workers):
                    from ._process import ProcessRunner

                    process_runner = ProcessRunner(
                        limit=config.process_workers, stuck_threshold=config.job_stuck_threshold
                    ).run
                streams = []
                with send:
                    # Queues added while running clone this spare stream, closed with the rest.
                    spare = send.clone()
                    streams.append(spare)

                    def new_producer(name: str, config: ClientConfig) -> Producer:
                        stream = spare.clone()  # the producer closes it when it exits
                        streams.append(stream)
                        runner = JobRunner(
                            config=config,
                            client=self.client,
                            clock=clock,
                            send=stream,
                            thread_limiter=thread_limiter,
                            process_runner=process_runner,
                        )
                        return Producer(
                            queue=name,
                            config=config,
                            driver=driver,
                            runner=runner,
                            completer=completer,
                            send=stream,
                            events=self._events,
                            notifier=notifier,
                        )

                    for name in config.queues:
                        self._producers[name] = new_producer(name, config)
                    if len(config.workers) > 0:
                        self._new_producer = new_producer
                if self._stop_requested.is_set():
                    self._request_stop()
                root.start_soon(self._stopper, name="river stopper")
                self.client._after_insert = self._trigger_queues
                if notifier is None:
                    self.client._local_control = self._control_locally
                try:
                    async with anyio.create_task_group() as producers:
                        self._producers_scope = producers.cancel_scope
                        self._producers_tg = producers
                        for name, producer in list(self._producers.items()):
                            await producers.start(
                                self._run_producer, producer, name=f"river producer {name}"
                            )
                        self._started = True
                        self.client.local_queues._host = self
                        if self._cancel_reason is not None:  # stop-and-cancel during start
                            producers.cancel_scope.cancel(self._cancel_reason)
                        task_status.started(self)
                        logger.info(
                            "client %s started (%d queues)",
                            config.id,
                            len(config.queues),
                            extra=client_extra("client_started", config.id),
                        )
                        await self._stop_requested.wait()
                finally:
                    # Every producer is done and has closed its completion stream; close those
                    # of producers that never started (a failed start), or the completer
                    # would wait for them forever. It then writes what is left, and the rest
                    # of the run is torn down.
                    for stream in streams:
                        stream.close()
                with anyio.CancelScope(shield=True):
                    await completer_done.wait()
                root.cancel_scope.cancel("client stopped")
        except BaseExceptionGroup as group:
            if self._started:
                raise
            # a start-up failure surfaces as one plain exception
            cancelled = anyio.get_cancelled_exc_class()
            real = [e for e in _leaves(group) if not isinstance(e, cancelled)]
            if len(real) == 1:
                raise real[0] from None
            raise
        finally:
            self.client._after_insert = None
            self.client._local_control = None
            self.client.local_queues._host = None
            self._producers_tg = None
            if self._notifier is not None:
                self._notifier.close()
            self._events.close()
            self._stopped.set()
            logger.info(
                "client %s stopped", config.id, extra=client_extra("client_stopped", config.id)
            )


def leader_services(run: ClientRun, driver: Driver, clock: Clock) -> list[LeaderService]:
    """The services of one leader term, in River's start order (built afresh each term)."""
    config = run.config
    m = config.maintenance
    common: dict[str, Any] = {
        "driver": driver,
        "clock": clock,
        "events": run._events,
        "config": config,
    }
    services: list[LeaderService] = [
        JobCleaner(interval=m.job_cleaner_interval, **common),
        JobRescuer(interval=m.rescuer_interval, **common),
        JobScheduler(
            interval=m.scheduler_interval,
            notify_insert=run.client._notify_queues,
            after_commit=run._trigger_queues,
            **common,
        ),
        PeriodicEnqueuer(client=run.client, clock=clock, events=run._events),
        QueueCleaner(interval=m.queue_cleaner_interval, **common),
    ]
    if driver.dialect == "sqlite":
        services.append(NotificationCleaner(interval=m.notification_cleaner_interval, **common))
    else:
        services.append(Reindexer(**common))
    return services


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        out: list[BaseException] = []
        for e in exc.exceptions:
            out.extend(_leaves(e))
        return out
    return [exc]
