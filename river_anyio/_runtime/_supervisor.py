"""The client run: one task group whose nested scopes are the run's lifetimes.

::

    health endpoint                   (``health_listen``) answers GET /health until the run ends
    database                          opened (with ``wait_for_database``, retried until it
                                      answers, the run reported started before it)
    root                              the run; cancelled from outside: a hard stop
    ├─ lag monitor
    ├─ notifier                       ready once listening (start fails otherwise)
    ├─ elector                        in the elector scope: cancelled when a stop begins
    │    └─ leader scope              exists exactly while this client leads
    │         └─ scheduler, rescuer, job cleaner, queue cleaner, reindexer | outbox cleaner
    └─ work                           exits when the completer has written the last result
         ├─ completer                 ends on EndOfStream: every producer closed its stream
         └─ jobs scope                a graceful stop's deadline, stop-and-cancel's cancel
              └─ producers            its body starts the queues added while running
                   └─ producer[q] ⊃ its fetch scope and its jobs (×queues)

A stop is an operation on these scopes, done at once inside ``stop()``: every producer's fetch
scope is cancelled (no claim begins afterwards), no queue can be added any more (the producers'
body ends), the elector scope is cancelled (the leader resigns, its maintenance ends while the
queues drain), and ``stop(timeout)`` brings the jobs scope's deadline forward to
``now + timeout`` (never back). ``stop_and_cancel()`` cancels the jobs scope: running jobs are
interrupted (``available`` again, attempt restored, no error). When the last producer has
exited the completer writes what is left and returns, the work group exits, and the root is
cancelled. The scopes exist from the start, so a stop requested while the run is starting
applies as soon as they are entered.

Start-up failures surface as one plain exception (the exception policy of ``open_client`` is
in ``_entry``).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any

import anyio
import anyio.abc
import attrs
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from .._client import Client
from .._config import ClientConfig, QueueConfig
from .._errors import (
    ClientCrashedError,
    ConfigError,
    DatabaseError,
    NotFoundError,
    ValidationError,
)
from .._events import EventHub, EventKind, Subscription
from .._health import Health
from .._logging import client_extra, queue_extra
from ..drivers import Driver
from ._clock import Clock
from ._completer import Completer, CompleterStatistics, Finished
from ._elector import Elector, LeaderService
from ._health import Contact, HealthServer, health
from ._lag import LagMonitor
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
from ._trailing import TrailingNotifications
from ._util import STOP_AND_CANCEL_REASON, Backoff
from ._util import leaves as _leaves

__all__ = ["ClientCrashedError", "ClientRun", "Diagnostics", "leader_services"]

logger = logging.getLogger("river_anyio.client")

#: ``wait_for_database``: attempts to reach the database back off from 0.5 s to this.
WAIT_FOR_DATABASE_MAX_DELAY = 5.0


@attrs.frozen(kw_only=True)
class QueueDiagnostics:
    active_jobs: int
    paused: bool
    #: claims sent to the database
    fetches: int
    #: turns of the fetch loop that have ended, whether they claimed or not (a paused
    #: queue's turns send nothing): a turn that ends after another began after it ended
    fetch_turns: int = 0


@attrs.frozen(kw_only=True)
class Diagnostics:
    """A snapshot of a running client's internals."""

    #: the lag monitor's latest probe's wait (0 while the loop is idle), and the longest stall
    #: of the loop seen
    loop_lag: float
    loop_lag_max: float
    #: stalls of the loop in the last ten minutes: ``{duration upper bound (s): count}``
    loop_lag_histogram: dict[float, int]
    queues: dict[str, QueueDiagnostics]
    completer: CompleterStatistics | None
    notifier_reconnects: int
    notifications_dropped: int
    stopping: bool
    #: leadership terms this client has begun, and its leader services' names while it leads
    leader_terms: int = 0
    leader_services: tuple[str, ...] = ()


@attrs.define(eq=False)
class _Queue:
    """A worked queue: its producer, and whether that has exited (``local_queues.remove``)."""

    producer: Producer
    exited: anyio.Event = attrs.field(factory=anyio.Event)


#: A request to start working a queue, and where its outcome goes (None: started).
_QueueRequest = tuple[str, QueueConfig, MemoryObjectSendStream[BaseException | None]]
_NewProducer = Callable[[str, ClientConfig], Producer]
#: Opens the client's database (and checks its schema): the driver while it is entered.
OpenDatabase = Callable[[], AbstractAsyncContextManager[Driver]]


class ClientRun:
    """A running client: ``client`` plus stop controls, events and diagnostics."""

    def __init__(self, client: Client, config: ClientConfig, events: EventHub) -> None:
        self.client = client
        self.config = config
        self._events = events
        self._stop_begun = anyio.Event()
        self._started = anyio.Event()
        self._stopped = anyio.Event()
        # The scopes a stop acts on exist before the run enters them: a stop during start
        # is applied as they are entered.
        self._jobs_scope = anyio.CancelScope()
        self._elector_scope = anyio.CancelScope()
        #: ``wait_for_database``: the attempts to reach the database, ended by a stop
        self._waiting_scope = anyio.CancelScope()
        #: the database answered and the configured queues are worked
        self._working = anyio.Event()
        #: the start's round trips (opening the database, checking its schema)
        self._start_contact = Contact()
        #: the port ``GET /health`` is answered on (``health_listen``), once bound
        self.health_port: int | None = None
        # local queues: requests served inside the producers group, closed when a stop begins
        self._queue_requests, self._queue_requests_received = anyio.create_memory_object_stream[
            _QueueRequest
        ](math.inf)
        self._queues: dict[str, _Queue] = {}
        self._lag = LagMonitor(client_id=config.id, events=events)
        self._completer: Completer | None = None
        self._notifier: Notifier | None = None
        #: the insert notifications this run owes (None: the driver has none)
        self._trailing: TrailingNotifications | None = None
        self._elector: Elector | None = None

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
        self._begin_stop()
        if timeout is not None:
            scope = self._jobs_scope
            scope.deadline = min(scope.deadline, anyio.current_time() + float(timeout))

    def stop_and_cancel(self) -> None:
        """Stop now: running jobs are cancelled and made available again (interrupted)."""
        self._begin_stop()
        self._jobs_scope.cancel(STOP_AND_CANCEL_REASON)

    def _begin_stop(self) -> None:
        if self._stop_begun.is_set():
            return
        logger.info(
            "client %s stopping",
            self.client.id,
            extra=client_extra("client_stopping", self.client.id),
        )
        self._stop_begun.set()
        # No claim begins after this returns, and no queue is added any more.
        for queue in self._queues.values():
            queue.producer.stop_fetching()
        self._queue_requests.close()
        self._elector_scope.cancel("client stopping")  # resign now; maintenance ends too
        self._waiting_scope.cancel("client stopping")

    async def wait(self) -> None:
        """Wait until the run has fully stopped."""
        await self._stopped.wait()

    async def wait_stopping(self) -> None:
        """Wait until a stop has begun (at once if it has)."""
        await self._stop_begun.wait()

    async def wait_leading(self) -> None:
        """Wait until this client leads (at once if it does). A client that never leads
        (``leader_election_disabled``, or no queues) raises :class:`ValidationError`."""
        if self._elector is None:
            raise ValidationError("leader_election_disabled", "this client never leads")
        await self._elector.wait_leading()

    @property
    def stopping(self) -> bool:
        """Whether a stop has begun."""
        return self._stop_begun.is_set()

    @property
    def is_leader(self) -> bool:
        """Whether this client currently holds River's leadership lease."""
        return self._elector is not None and self._elector.is_leader

    def health(self) -> Health:
        """The client's health now: ``ok``, the reasons it is not, and the facts behind it
        (see :class:`~river_anyio.Health`; thresholds in ``Config.health``). Read from what
        the run already records: no query is sent, so probes may call it as often as they
        like. Call it from the client's event loop."""
        return health(self)

    @property
    def _waiting_for_database(self) -> bool:
        return (
            self.config.wait_for_database
            and not self._working.is_set()
            and not self._stopped.is_set()
        )

    def subscribe(self, *kinds: EventKind | str) -> Subscription:
        """Events of the given kinds (all when none given), in a bounded buffer of 1,000."""
        return self._events.subscribe(kinds)

    @property
    def diagnostics(self) -> Diagnostics:
        elector = self._elector
        leading = elector is not None and elector.is_leader
        return Diagnostics(
            loop_lag=self._lag.last,
            loop_lag_max=self._lag.max,
            loop_lag_histogram=self._lag.histogram(),
            queues={
                name: QueueDiagnostics(
                    active_jobs=q.producer.active_jobs,
                    paused=q.producer.paused,
                    fetches=q.producer.fetches,
                    fetch_turns=q.producer.fetch_turns,
                )
                for name, q in self._queues.items()
            },
            completer=self._completer.statistics() if self._completer is not None else None,
            notifier_reconnects=self._notifier.reconnects if self._notifier else 0,
            notifications_dropped=self._notifier.dropped if self._notifier else 0,
            stopping=self.stopping,
            leader_terms=elector.terms if elector is not None else 0,
            leader_services=(
                tuple(s.name for s in elector.services) if elector is not None and leading else ()
            ),
        )

    @property
    def _producers(self) -> dict[str, Producer]:
        """Each worked queue's producer (what tests that watch a producer reach)."""
        return {name: q.producer for name, q in self._queues.items()}

    def _trigger_queues(self, queues: set[str]) -> None:
        """This client committed jobs of ``queues``: wake its own producers of them, and
        owe other processes the notifications its limiter held back."""
        if self._trailing is not None:
            self._trailing.committed(queues)
        for name in queues:
            queue = self._queues.get(name)
            if queue is not None:
                queue.producer.trigger()

    def _control_locally(self, queue: str, payload: dict[str, Any]) -> None:
        """A control action taken through this client's API, applied to its own producers at
        once when it does not listen for notifications (River does the same)."""
        for q in list(self._queues.values()):
            q.producer._control(payload)

    # --- local queues (client.local_queues) ---------------------------------------------------

    async def _add_queue(self, name: str, queue_config: QueueConfig) -> None:
        """Start a producer for a new queue (``client.local_queues.add``): asked of the
        producers group's body, which starts it there."""
        if len(self.config.workers) == 0:
            raise ValidationError(
                "local_queues", "this client works no jobs (no workers are registered)"
            )
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
        reply, outcome = anyio.create_memory_object_stream[BaseException | None](1)
        with outcome:
            try:
                self._queue_requests.send_nowait((name, queue_config, reply))
                failure = await outcome.receive()
            except (anyio.ClosedResourceError, anyio.EndOfStream):
                reply.close()
                raise _not_running() from None
        if failure is not None:
            raise failure
        logger.info("queue %s added", name, extra=queue_extra("queue_added", name, self.config.id))

    async def _serve_queue_requests(
        self, producers: anyio.abc.TaskGroup, new_producer: _NewProducer
    ) -> None:
        """The producers group's body: starts the queues asked for, until a stop begins."""
        requests = self._queue_requests_received
        try:
            async for name, queue_config, reply in requests:
                with reply:
                    outcome: BaseException | None = None
                    try:
                        if self.stopping:
                            raise _not_running()
                        await self._start_queue(producers, new_producer, name, queue_config)
                    except Exception as exc:
                        outcome = exc
                    with contextlib.suppress(anyio.BrokenResourceError):  # caller gone
                        reply.send_nowait(outcome)
        finally:
            self._refuse_queue_requests()

    def _refuse_queue_requests(self) -> None:
        """No more queues: callers still waiting are told the client is stopping."""
        self._queue_requests.close()
        requests = self._queue_requests_received
        while True:
            try:
                _, _, reply = requests.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            reply.close()
        requests.close()

    async def _start_queue(
        self,
        producers: anyio.abc.TaskGroup,
        new_producer: _NewProducer,
        name: str,
        queue_config: QueueConfig,
    ) -> None:
        if name in self._queues:
            raise ValidationError("name", f"queue {name!r} is already added", name)
        self.config = attrs.evolve(self.config, queues={**self.config.queues, name: queue_config})
        queue = self._queues[name] = _Queue(new_producer(name, self.config))
        if self.stopping:  # a queue of the configuration, while a stop began during start
            queue.producer.stop_fetching()
        try:
            await producers.start(self._run_queue, queue, name=f"river producer {name}")
        except BaseException:
            self._forget(name, queue)
            raise

    async def _run_queue(self, queue: _Queue, *, task_status: TaskStatus[None]) -> None:
        try:
            await queue.producer.run(task_status=task_status)
        finally:
            queue.exited.set()

    async def _remove_queue(self, name: str) -> None:
        """Stop a queue's producer and wait until it has exited, its running jobs done and
        handed to the completer (``client.local_queues.remove``)."""
        queue = self._queues.get(name)
        if queue is None:
            raise NotFoundError(f"queue {name!r} is not worked by this client")
        queue.producer.stop_fetching()
        await queue.exited.wait()
        self._forget(name, queue)
        logger.info(
            "queue %s removed", name, extra=queue_extra("queue_removed", name, self.config.id)
        )

    def _forget(self, name: str, queue: _Queue) -> None:
        if self._queues.get(name) is not queue:
            return
        del self._queues[name]
        self.config = attrs.evolve(
            self.config, queues={k: v for k, v in self.config.queues.items() if k != name}
        )

    # --- the run ------------------------------------------------------------------------------

    async def _serve(
        self, open_database: OpenDatabase, clock: Clock, *, task_status: TaskStatus[ClientRun]
    ) -> None:
        """Open the database and run on it; with ``health_listen``, answer ``GET /health``
        from before the database is opened until the run has ended."""
        listen = self.config.health_listen
        try:
            if listen is None:
                await self._open_and_run(open_database, clock, task_status=task_status)
                return
            try:
                async with anyio.create_task_group() as tg:
                    server = HealthServer(self.health, host=listen[0], port=listen[1])
                    self.health_port = await tg.start(server.run, name="river health endpoint")
                    await self._open_and_run(open_database, clock, task_status=task_status)
                    tg.cancel_scope.cancel("client stopped")
            except BaseExceptionGroup as group:
                if self._started.is_set():
                    raise
                _raise_start_failure(group)
        finally:
            self._finish()

    async def _open_and_run(
        self, open_database: OpenDatabase, clock: Clock, *, task_status: TaskStatus[ClientRun]
    ) -> None:
        async with AsyncExitStack() as stack:
            if self.config.wait_for_database:
                # started at once: the block is entered while the database may be down, and
                # health() says so
                self._report_started(task_status)
                driver = await self._wait_for_database(stack, open_database)
                if driver is None:  # stopped before the database answered
                    return
            else:
                driver = await stack.enter_async_context(open_database())
                self._start_contact.ok(anyio.current_time())
            self.client._driver = driver
            await self._run(driver, clock, task_status=task_status)

    async def _wait_for_database(
        self, stack: AsyncExitStack, open_database: OpenDatabase
    ) -> Driver | None:
        """Open the database, retrying with back-off while it cannot be reached; None when
        a stop begins first. Other failures (a schema that is not current) are raised."""
        backoff = Backoff(first=0.5, cap=WAIT_FOR_DATABASE_MAX_DELAY)
        contact = self._start_contact
        client_id = self.config.id
        with self._waiting_scope:
            while True:
                try:
                    driver = await stack.enter_async_context(open_database())
                except (DatabaseError, OSError, TimeoutError) as exc:
                    contact.failed(exc)
                    delay = backoff.next_delay()
                    logger.error(
                        "client %s: the database cannot be reached (attempt %d, retrying in "
                        "%.1fs; the client reports itself not ok until it answers): %s",
                        client_id,
                        backoff.failures,
                        delay,
                        contact.error,
                        extra=client_extra("database_unreachable", client_id),
                    )
                    await anyio.sleep(delay)
                    continue
                contact.ok(anyio.current_time())
                if backoff.failures:
                    logger.warning(
                        "client %s: the database answered after %d failed attempts; starting",
                        client_id,
                        backoff.failures,
                        extra=client_extra("database_reachable", client_id),
                    )
                return driver
        return None

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
                await root.start(self._lag.run, name="river lag monitor")
                notifier: Notifier | None = None
                works = bool(config.queues) or len(config.workers) > 0  # queues may be added
                elects = bool(config.queues) and not config.leader_election_disabled
                if works and not config.poll_only and driver.supports_listen_notify:
                    notifier = Notifier(driver, ALL_TOPICS if elects else TOPICS)
                    await root.start(notifier.run, name="river notifier")
                self._notifier = notifier
                if elects:
                    self._elector = Elector(
                        driver=driver,
                        client_id=config.id,
                        events=self._events,
                        services=lambda: leader_services(self, driver, clock),
                        interval=config.elect_interval,
                        clock=clock,
                        notifier=notifier,
                    )
                    root.start_soon(self._run_elector, self._elector, name="river elector")
                if driver.supports_listen_notify:
                    self._trailing = TrailingNotifications(driver, self.client._limiter, config.id)
                    root.start_soon(self._trailing.run, name="river trailing notifications")
                self.client._after_insert = self._trigger_queues
                if notifier is None:
                    self.client._local_control = self._control_locally
                await self._work(driver, clock, notifier, task_status)
                root.cancel_scope.cancel("client stopped")
        except BaseExceptionGroup as group:
            if self._started.is_set():
                raise
            _raise_start_failure(group)
        finally:
            self._finish()

    def _finish(self) -> None:
        """The run has ended (however: stopped, crashed, or before it could open the
        database): nothing is accepted any more and ``wait()`` returns."""
        if self._stopped.is_set():
            return
        self.client._after_insert = None
        self.client._local_control = None
        self.client.local_queues._host = None
        self._refuse_queue_requests()
        if self._notifier is not None:
            self._notifier.close()
        self._events.close()
        self._stopped.set()
        logger.info(
            "client %s stopped",
            self.config.id,
            extra=client_extra("client_stopped", self.config.id),
        )

    async def _run_elector(self, elector: Elector) -> None:
        with self._elector_scope:
            await elector.run()

    async def _work(
        self,
        driver: Driver,
        clock: Clock,
        notifier: Notifier | None,
        task_status: TaskStatus[ClientRun],
    ) -> None:
        """The work group: the completer, and the jobs scope holding the producers."""
        config = self.config
        timings: dict[str, Any] = {}
        if config.completer_pauses is not None:
            timings["pauses"] = config.completer_pauses
        if config.completer_try_timeout is not None:
            timings["try_timeout"] = config.completer_try_timeout
        completer = Completer(
            driver,
            client_id=config.id,
            events=self._events,
            waiters=self.client._job_waiters,
            **timings,
        )
        self._completer = completer
        thread_limiter = anyio.CapacityLimiter(config.thread_workers)
        process_runner = None
        if any(reg.run_in == "process" for reg in config.workers):
            from ._process import ProcessRunner

            process_runner = ProcessRunner(
                limit=config.process_workers, stuck_threshold=config.job_stuck_threshold
            ).run
        async with anyio.create_task_group() as work:
            send: MemoryObjectSendStream[Finished] = await work.start(
                completer.run, name="river completer"
            )
            # Every producer gets a clone of ``send`` and closes it when it exits; these are
            # closed here too, for a producer whose task never ran.
            clones: list[MemoryObjectSendStream[Finished]] = []

            def new_producer(name: str, config: ClientConfig) -> Producer:
                clone = send.clone()
                clones.append(clone)
                runner = JobRunner(
                    config=config,
                    client=self.client,
                    clock=clock,
                    send=clone,
                    thread_limiter=thread_limiter,
                    process_runner=process_runner,
                )
                return Producer(
                    queue=name,
                    config=config,
                    driver=driver,
                    runner=runner,
                    completer=completer,
                    send=clone,
                    events=self._events,
                    notifier=notifier,
                )

            with send:
                try:
                    with self._jobs_scope:
                        async with anyio.create_task_group() as producers:
                            for name, queue_config in config.queues.items():
                                await self._start_queue(producers, new_producer, name, queue_config)
                            self._working.set()
                            self._report_started(task_status)
                            await self._serve_queue_requests(producers, new_producer)
                finally:
                    for clone in clones:
                        clone.close()
            self._log_jobs_cancelled()
            if not self._started.is_set():
                # a stop-and-cancel (or a passed stop deadline) cut the start short: the run
                # still reports itself started, and is stopping
                self._report_started(task_status)

    def _report_started(self, task_status: TaskStatus[ClientRun]) -> None:
        if self._started.is_set():
            return
        self._started.set()
        self.client.local_queues._host = self
        task_status.started(self)
        logger.info(
            "client %s started (%d queues)%s",
            self.config.id,
            len(self.config.queues),
            "; waiting for the database" if self._waiting_for_database else "",
            extra=client_extra("client_started", self.config.id),
        )

    def _log_jobs_cancelled(self) -> None:
        scope = self._jobs_scope
        if not scope.cancelled_caught:
            return
        if scope.deadline <= anyio.current_time():  # not a stop-and-cancel
            logger.warning(
                "soft stop timeout passed; running jobs were cancelled",
                extra=client_extra("stop_timeout", self.client.id),
            )


def _raise_start_failure(group: BaseExceptionGroup[BaseException]) -> None:
    """A start-up failure surfaces as one plain exception (the group if there are more)."""
    cancelled = anyio.get_cancelled_exc_class()
    real = [e for e in _leaves(group) if not isinstance(e, cancelled)]
    if len(real) == 1:
        raise real[0] from None
    raise group


def _not_running() -> ValidationError:
    return ValidationError("local_queues", "the client is not running (or is stopping)")


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
        JobRescuer(interval=m.rescuer_interval, waiters=run.client._job_waiters, **common),
        JobScheduler(
            interval=m.scheduler_interval,
            notify_insert=run.client._notify_queues,
            after_commit=run._trigger_queues,
            **common,
        ),
        PeriodicEnqueuer(client=run.client, clock=clock, events=run._events, hooks=config.hooks),
        QueueCleaner(interval=m.queue_cleaner_interval, **common),
    ]
    if driver.dialect == "sqlite":
        services.append(NotificationCleaner(interval=m.notification_cleaner_interval, **common))
    else:
        services.append(Reindexer(**common))
    return services
