"""Prometheus metrics of a running client (``pip install river_anyio[prometheus]``).

A scrape is synchronous and must not wait for the database, so nothing here queries at
scrape time. Instead :class:`PrometheusMetrics` is a small service started next to the
client, in a task group that outlives it::

    from river_anyio.contrib.prometheus import PrometheusMetrics

    async with anyio.create_task_group() as tg:
        async with river_anyio.open_client(url, queues=..., workers=...) as run:
            await tg.start(PrometheusMetrics(run).run)
            ...
    # the service returns by itself once the client has stopped

It samples the number of jobs per queue and state every ``queue_depth_interval`` seconds
(one grouped count; scrapes read the latest sample), turns the client's job events into
duration histograms, and reads the completer's counters and the run's diagnostics when
scraped. Metrics (with the default ``namespace="river"``):

- ``river_queue_jobs{queue,state}``: jobs in the database (every queue, not only this
  client's), sampled; states default to the unfinished ones;
- ``river_job_duration_seconds{queue,kind,outcome}``: how long attempts ran, by outcome
  (``completed``, ``failed``, ``cancelled``, ``snoozed``, ``interrupted``);
- ``river_job_queue_wait_seconds{queue,kind}``: from ``scheduled_at`` to the attempt's start;
- ``river_jobs_discarded_total{queue,kind,cause}``: jobs this client discarded (the dead
  letters: ``job_discarded`` events; ``cause`` as there: ``attempts_exhausted``,
  ``discard``, ``unknown_kind``, ``rescuer``, ``unique_conflict``);
- ``river_jobs_rescued_total{queue,kind,outcome}``: stuck jobs this client's rescuer moved
  on while it led (``retried``, ``discarded``, ``cancelled``); sum it over your processes;
- ``river_completer_written_total``, ``river_completer_requeued_total``,
  ``river_completer_dropped_total``, ``river_completer_races_total``, ``river_completer_pending``:
  the completer's statistics (requeued: put back after a transient database failure;
  dropped: given up and left ``running`` for the rescuer);
- ``river_queue_active_jobs{queue}``: jobs this client is running;
- ``river_event_loop_lag_seconds``: the latest event-loop lag sample;
- ``river_metrics_events_dropped_total``: job events this collector missed (its buffer was
  full), so the histograms undercount by that much.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskStatus

from .._errors import ConfigError, DatabaseError
from .._events import Event, EventKind, Subscription
from .._job import JobState

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "river_anyio.contrib.prometheus requires prometheus-client: "
        "pip install 'river_anyio[prometheus]'"
    ) from exc

if TYPE_CHECKING:
    from .._runtime._supervisor import ClientRun

__all__ = ("DEFAULT_BUCKETS", "UNFINISHED_STATES", "PrometheusMetrics")

logger = logging.getLogger("river_anyio.contrib.prometheus")

#: The states sampled by default: the jobs still to be worked or being worked.
UNFINISHED_STATES = (
    JobState.AVAILABLE,
    JobState.PENDING,
    JobState.RETRYABLE,
    JobState.RUNNING,
    JobState.SCHEDULED,
)
#: Histogram buckets in seconds, from milliseconds to River's 10-minute scale.
DEFAULT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, math.inf,
)  # fmt: skip

_OUTCOMES = {
    EventKind.JOB_COMPLETED: "completed",
    EventKind.JOB_FAILED: "failed",
    EventKind.JOB_CANCELLED: "cancelled",
    EventKind.JOB_SNOOZED: "snoozed",
    EventKind.JOB_INTERRUPTED: "interrupted",
}
#: The events this collector subscribes to.
_SUBSCRIBED = (*_OUTCOMES, EventKind.JOB_DISCARDED, EventKind.JOB_RESCUED)
SAMPLE_TIMEOUT = 10.0


class PrometheusMetrics:
    """Prometheus metrics of one client run; a collector registered in ``registry``.

    Args:
        run: The running client (what ``open_client`` yields).
        registry: Where to register; the default registry when not given, none when
            ``None`` (register it yourself).
        namespace: The metric name prefix.
        queue_depth_interval: Seconds between two samples of ``<namespace>_queue_jobs``.
        states: The job states sampled.
        buckets: Buckets of the duration histograms, in seconds.
    """

    def __init__(
        self,
        run: ClientRun,
        *,
        registry: CollectorRegistry | None = REGISTRY,
        namespace: str = "river",
        queue_depth_interval: float = 15.0,
        states: Sequence[JobState | str] = UNFINISHED_STATES,
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        if (
            isinstance(queue_depth_interval, bool)
            or not isinstance(queue_depth_interval, int | float)
            or not math.isfinite(queue_depth_interval)
            or queue_depth_interval <= 0
        ):
            raise ConfigError(
                "queue_depth_interval", "must be a positive number of seconds", queue_depth_interval
            )
        try:
            self._states = tuple(JobState(s) for s in states)
        except ValueError:
            raise ConfigError("states", "must be job states", states) from None
        self._run = run
        self._ns = namespace
        self._interval = float(queue_depth_interval)
        self._depth: dict[tuple[str, str], int] = {}
        self._started = False
        self._subscription: Subscription | None = None
        self._durations = Histogram(
            "job_duration_seconds",
            "How long job attempts ran, by queue, kind and outcome.",
            ["queue", "kind", "outcome"],
            namespace=namespace,
            buckets=buckets,
            registry=None,
        )
        self._waits = Histogram(
            "job_queue_wait_seconds",
            "How long jobs waited from scheduled_at to the start of an attempt.",
            ["queue", "kind"],
            namespace=namespace,
            buckets=buckets,
            registry=None,
        )
        self._discarded = Counter(
            "jobs_discarded",
            "Jobs this client discarded (dead letters), by queue, kind and cause.",
            ["queue", "kind", "cause"],
            namespace=namespace,
            registry=None,
        )
        self._rescued = Counter(
            "jobs_rescued",
            "Stuck jobs this client's rescuer moved on, by queue, kind and outcome.",
            ["queue", "kind", "outcome"],
            namespace=namespace,
            registry=None,
        )
        if registry is not None:
            registry.register(self)

    # --- the service --------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Sample and observe until the client run stops (ready after the first sample)."""
        if self._started:
            raise RuntimeError("PrometheusMetrics.run() can run only once")
        self._started = True
        with self._run.subscribe(*_SUBSCRIBED) as sub:
            self._subscription = sub
            async with anyio.create_task_group() as tg:
                await self.sample_queue_depth()
                tg.start_soon(self._sample_loop, name="river prometheus sampler")
                task_status.started()
                async with anyio.create_task_group() as events:
                    events.start_soon(self._observe_all, sub, name="river prometheus events")
                    await self._run.wait()
                    events.cancel_scope.cancel("client run stopped")
                self._drain(sub)
                tg.cancel_scope.cancel("client run stopped")

    async def sample_queue_depth(self) -> None:
        """Count jobs per queue and state now (a failure is logged; the last sample stays)."""
        try:
            with anyio.fail_after(SAMPLE_TIMEOUT):
                counts = await self._run.client.driver.executor().job_count_by_queue_and_state(
                    states=self._states
                )
        except (DatabaseError, TimeoutError) as exc:
            logger.warning(
                "sampling queue depth failed: %s",
                exc,
                extra={"river_event": "queue_depth_failed", "river_client_id": self._run.client.id},
            )
            return
        # pairs seen before, and this client's queues, read 0 when they have no jobs left
        depth = dict.fromkeys(self._depth, 0)
        for queue in self._run.config.queues:
            for state in self._states:
                depth[(queue, str(state))] = 0
        for queue, state, count in counts:
            depth[(queue, str(state))] = count
        self._depth = depth

    async def _sample_loop(self) -> None:
        while True:
            await anyio.sleep(self._interval)
            await self.sample_queue_depth()

    async def _observe_all(self, sub: Subscription) -> None:
        async for event in sub:
            self._observe(event)

    def _drain(self, sub: Subscription) -> None:
        while True:
            try:
                event = sub.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return
            self._observe(event)

    def _observe(self, event: Event) -> None:
        job = event.job
        if event.kind is EventKind.JOB_DISCARDED and job is not None:
            cause = str(event.details.get("cause", ""))
            self._discarded.labels(job.queue, job.kind, cause).inc()
            return
        if event.kind is EventKind.JOB_RESCUED and job is not None:
            rescue = str(event.details.get("outcome", ""))
            self._rescued.labels(job.queue, job.kind, rescue).inc()
            return
        outcome = _OUTCOMES.get(event.kind)
        if outcome is None or event.job is None or event.timings is None:
            return
        job = event.job
        self._durations.labels(job.queue, job.kind, outcome).observe(
            event.timings.run.total_seconds()
        )
        self._waits.labels(job.queue, job.kind).observe(event.timings.queue_wait.total_seconds())

    # --- the collector ------------------------------------------------------------------------

    def collect(self) -> Iterable[Metric]:
        """Called by ``prometheus_client`` on every scrape; reads memory only."""
        return list(self._collect())

    def _collect(self) -> Iterator[Metric]:
        ns = self._ns
        depth = GaugeMetricFamily(
            f"{ns}_queue_jobs",
            "Jobs in the database per queue and state (sampled).",
            labels=["queue", "state"],
        )
        for (queue, state), count in sorted(self._depth.items()):
            depth.add_metric([queue, state], count)
        yield depth
        yield from self._durations.collect()
        yield from self._waits.collect()
        yield from self._discarded.collect()
        yield from self._rescued.collect()

        diagnostics = self._run.diagnostics
        stats = diagnostics.completer
        for name, value, doc in (
            ("written", stats.written if stats else 0, "Completions written to the database."),
            (
                "requeued",
                stats.requeued if stats else 0,
                "Completions put back after a transient database failure.",
            ),
            (
                "dropped",
                stats.dropped if stats else 0,
                "Completions given up on; their jobs stay running until rescued.",
            ),
            (
                "races",
                stats.races if stats else 0,
                "Completions not applied: the job was no longer running for this attempt.",
            ),
        ):
            yield CounterMetricFamily(f"{ns}_completer_{name}", doc, value=value)
        yield GaugeMetricFamily(
            f"{ns}_completer_pending",
            "Completions waiting to be written.",
            value=stats.pending if stats else 0,
        )
        active = GaugeMetricFamily(
            f"{ns}_queue_active_jobs", "Jobs this client is running.", labels=["queue"]
        )
        for queue, q in sorted(diagnostics.queues.items()):
            active.add_metric([queue], q.active_jobs)
        yield active
        yield GaugeMetricFamily(
            f"{ns}_event_loop_lag_seconds",
            "The latest event-loop lag sample.",
            value=diagnostics.loop_lag,
        )
        sub = self._subscription
        yield CounterMetricFamily(
            f"{ns}_metrics_events_dropped",
            "Job events this collector missed because its buffer was full.",
            value=sub.dropped if sub is not None else 0,
        )
