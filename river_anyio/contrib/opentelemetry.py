"""OpenTelemetry traces and metrics for inserts and work, with River's ``otelriver`` names.

Add the middleware to a client; it needs only ``opentelemetry-api``
(``pip install river_anyio[opentelemetry]``) and reports to the global tracer and meter
providers unless others are given::

    from river_anyio.contrib.opentelemetry import OpenTelemetryMiddleware

    async with river_anyio.open_client(url, ..., middleware=[OpenTelemetryMiddleware()]) as run:
        ...

Spans: ``river.insert_many`` (kind PRODUCER) around every insert call, and ``river.work``
(kind CONSUMER, or ``river.work/<kind>`` with ``work_span_job_kind_suffix``) around every
attempt; a worker's own spans are its children. Metrics: ``river.insert_count``,
``river.insert_many_count``, ``river.insert_many_duration``,
``river.insert_many_duration_histogram``, ``river.work_count``, ``river.work_duration`` and
``river.work_duration_histogram``, with the attributes River's Go middleware gives them, so
dashboards built for River's Go clients work unchanged. ``semantic_metrics`` adds the
OpenTelemetry messaging metrics; ``trace_propagation`` carries the inserting span's W3C trace
context in the job's metadata (``traceparent``/``tracestate``) and links the work span to it.

Dead letters and rescues are known only once written, so they are counted by a small service
reading the client's events rather than by the middleware::

    from river_anyio.contrib.opentelemetry import OpenTelemetryEventMetrics

    async with anyio.create_task_group() as tg:
        async with river_anyio.open_client(url, ...) as run:
            await tg.start(OpenTelemetryEventMetrics(run).run)

It adds ``river.job_discarded_count`` (attributes ``queue``, ``kind``, ``cause``) and
``river.job_rescued_count`` (``queue``, ``kind``, ``outcome``); see ``job_discarded`` and
``job_rescued`` in :class:`~river_anyio.EventKind`.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.abc
import attrs

from .._errors import ConfigError
from .._events import Event, EventKind, Subscription
from .._version import __version__
from .._work import CancelOutcome, Job, Outcome, SnoozeOutcome, WorkContext
from ..drivers import JobInsertParams

try:
    from opentelemetry import metrics, trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "river_anyio.contrib.opentelemetry requires opentelemetry-api: "
        "pip install 'river_anyio[opentelemetry]'"
    ) from exc

if TYPE_CHECKING:
    from .._runtime._supervisor import ClientRun

__all__ = ("INSTRUMENTATION_NAME", "OpenTelemetryEventMetrics", "OpenTelemetryMiddleware")

#: The instrumentation scope of the tracer and the meter.
INSTRUMENTATION_NAME = "river_anyio.contrib.opentelemetry"
_PREFIX = "river."
_propagator = TraceContextTextMapPropagator()

Next = Callable[[Sequence[JobInsertParams]], Awaitable[Any]]
WorkNext = Callable[[WorkContext, "Job[Any]"], Awaitable["Outcome | None"]]


class OpenTelemetryMiddleware:
    """Insert and work middleware emitting River's OpenTelemetry spans and metrics.

    Args:
        tracer_provider: Where spans go; the global provider when ``None``.
        meter_provider: Where metrics go; the global provider when ``None``.
        duration_unit: ``"s"`` (seconds, the default) or ``"ms"`` (whole milliseconds) for
            every duration metric.
        semantic_metrics: Also emit OpenTelemetry's messaging metrics
            (``messaging.client.sent.messages`` and friends).
        trace_propagation: Put the inserting span's trace context in each job's metadata and
            link the work span to it.
        work_span_job_kind_suffix: Name work spans ``river.work/<kind>``.
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        duration_unit: Literal["s", "ms"] = "s",
        semantic_metrics: bool = False,
        trace_propagation: bool = False,
        work_span_job_kind_suffix: bool = False,
    ) -> None:
        if duration_unit not in ("s", "ms"):
            raise ConfigError("duration_unit", "must be 's' or 'ms'", duration_unit)
        self._ms = duration_unit == "ms"
        self._semantic = semantic_metrics
        self._propagate = trace_propagation
        self._kind_suffix = work_span_job_kind_suffix
        tp = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        mp = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        self._tracer = tp.get_tracer(INSTRUMENTATION_NAME, __version__)
        meter = mp.get_meter(INSTRUMENTATION_NAME, __version__)
        unit = duration_unit
        self._insert_count = meter.create_counter(
            _PREFIX + "insert_count", unit="{job}", description="Number of jobs inserted"
        )
        self._insert_many_count = meter.create_counter(
            _PREFIX + "insert_many_count",
            unit="{job_batch}",
            description="Number of job batches inserted (all jobs are inserted in a batch, "
            "but batches may be one job)",
        )
        self._insert_many_duration = meter.create_gauge(
            _PREFIX + "insert_many_duration",
            unit=unit,
            description="Duration of job batch insertion",
        )
        self._insert_many_duration_histogram = meter.create_histogram(
            _PREFIX + "insert_many_duration_histogram",
            unit=unit,
            description="Duration of job batch insertion (histogram)",
        )
        self._work_count = meter.create_counter(
            _PREFIX + "work_count", unit="{job}", description="Number of jobs worked"
        )
        self._work_duration = meter.create_gauge(
            _PREFIX + "work_duration", unit=unit, description="Duration of job being worked"
        )
        self._work_duration_histogram = meter.create_histogram(
            _PREFIX + "work_duration_histogram",
            unit=unit,
            description="Duration of job being worked (histogram)",
        )
        if semantic_metrics:
            self._consumed = meter.create_counter(
                "messaging.client.consumed.messages",
                description="Number of messages that were delivered to the application.",
            )
            self._operation_duration = meter.create_histogram(
                "messaging.client.operation.duration",
                unit=unit,
                description="Duration of messaging operation initiated by a producer or "
                "consumer client.",
            )
            self._sent = meter.create_counter(
                "messaging.client.sent.messages",
                description="Number of messages producer attempted to send to the broker.",
            )
            self._process_duration = meter.create_histogram(
                "messaging.process.duration",
                unit=unit,
                description="Duration of processing operation.",
            )

    def _duration(self, seconds: float) -> float:
        # River's "ms" unit is whole milliseconds.
        return float(int(seconds * 1000)) if self._ms else seconds

    # --- insert -------------------------------------------------------------------------------

    async def insert(self, params: Sequence[JobInsertParams], next: Next) -> Any:
        """Wrap one insert call (one batch) in a ``river.insert_many`` span."""
        with self._tracer.start_as_current_span(
            _PREFIX + "insert_many",
            kind=SpanKind.PRODUCER,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            if self._propagate:
                params = [_with_trace_context(p) for p in params]
            begin = time.perf_counter()
            status = "panic"
            result: Any = None
            try:
                result = await next(params)
                status = "ok"
                span.set_status(Status(StatusCode.OK))
                return result
            except anyio.get_cancelled_exc_class():
                status = "error"
                span.set_status(Status(StatusCode.ERROR, "cancelled"))
                raise
            except Exception as exc:
                status = "error"
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                raise
            except BaseException:
                span.set_status(Status(StatusCode.ERROR, "panic"))
                raise
            finally:
                duration = self._duration(time.perf_counter() - begin)
                skipped = 0
                if isinstance(result, list):  # the fast, count-only path reports none
                    skipped = sum(1 for r in result if getattr(r, "unique_skipped_as_duplicate", 0))
                span.set_attribute("status", status)
                span.set_attribute("kinds", sorted({p.kind for p in params}))
                span.set_attribute("unique_skipped_as_duplicate_count", skipped)
                attributes = {"status": status}
                inserted = len(params) - skipped
                if inserted > 0:
                    self._insert_count.add(
                        inserted, {**attributes, "unique_skipped_as_duplicate": False}
                    )
                if skipped > 0:
                    self._insert_count.add(
                        skipped, {**attributes, "unique_skipped_as_duplicate": True}
                    )
                self._insert_many_count.add(1, attributes)
                self._insert_many_duration.set(duration, attributes)
                self._insert_many_duration_histogram.record(duration, attributes)
                if self._semantic:
                    semantic = {
                        "messaging.operation.name": "insert_many",
                        "messaging.system": "river",
                    }
                    self._operation_duration.record(duration, semantic)
                    self._sent.add(len(params), semantic)

    # --- work ---------------------------------------------------------------------------------

    async def work(self, ctx: WorkContext, job: Job[Any], next: WorkNext) -> Outcome | None:
        """Wrap one attempt in a ``river.work`` span."""
        row = job.row
        name = _PREFIX + "work" + (f"/{row.kind}" if self._kind_suffix else "")
        links = []
        if self._propagate:
            linked = _linked_span_context(row.metadata)
            if linked is not None:
                links.append(Link(linked))
        with self._tracer.start_as_current_span(
            name,
            kind=SpanKind.CONSUMER,
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            attributes: dict[str, Any] = {
                "attempt": row.attempt,
                "kind": row.kind,
                "priority": row.priority,
                "queue": row.queue,
                "status": "panic",
                "tag": row.tags,  # a tuple: metric attributes must be hashable (SDK < 1.28)
            }
            begin = time.perf_counter()
            outcome: Outcome | None = None
            try:
                outcome = await next(ctx, job)
            except anyio.get_cancelled_exc_class():
                # a timeout, a remote cancel or a stop: the attempt ends with an error
                attributes["status"] = "error"
                span.set_status(Status(StatusCode.ERROR, "cancelled"))
                raise
            except Exception as exc:
                attributes["status"] = "error"
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                raise
            except BaseException:
                span.set_status(Status(StatusCode.ERROR, "panic"))
                raise
            else:
                if isinstance(outcome, SnoozeOutcome):
                    # flow control, not a failure (River records snoozes as ok)
                    attributes["snooze"] = True
                    attributes["status"] = "ok"
                    span.set_status(Status(StatusCode.OK))
                    span.set_attribute("snooze.duration", go_duration(outcome.duration))
                elif outcome is None:
                    attributes["status"] = "ok"
                    span.set_status(Status(StatusCode.OK))
                else:  # cancel and discard end the job with an error
                    if isinstance(outcome, CancelOutcome):
                        attributes["cancel"] = True
                    attributes["status"] = "error"
                    reason = getattr(outcome, "reason", repr(outcome))
                    span.set_status(Status(StatusCode.ERROR, str(reason)))
                return outcome
            finally:
                duration = self._duration(time.perf_counter() - begin)
                # higher-cardinality attributes go on the span only, not on the metrics
                span.set_attribute("id", row.id)
                span.set_attribute("created_at", _rfc3339(row.created_at))
                span.set_attribute("scheduled_at", _rfc3339(row.scheduled_at))
                span.set_attributes(attributes)
                self._work_count.add(1, attributes)
                self._work_duration.set(duration, attributes)
                self._work_duration_histogram.record(duration, attributes)
                if self._semantic:
                    semantic = {"messaging.operation.name": "work", "messaging.system": "river"}
                    self._consumed.add(1, semantic)
                    self._operation_duration.record(duration, semantic)
                    self._process_duration.record(duration, semantic)


class OpenTelemetryEventMetrics:
    """Counters of the jobs a running client discarded and rescued, from its events.

    Start it next to the client, in a task group that outlives it (``await
    tg.start(OpenTelemetryEventMetrics(run).run)``); it returns once the client has stopped.
    It subscribes only to ``job_discarded`` and ``job_rescued``.

    Args:
        run: The running client (what ``open_client`` yields).
        meter_provider: Where metrics go; the global provider when ``None``.
    """

    def __init__(
        self, run: ClientRun, *, meter_provider: metrics.MeterProvider | None = None
    ) -> None:
        self._run = run
        self._started = False
        mp = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        meter = mp.get_meter(INSTRUMENTATION_NAME, __version__)
        self._discarded = meter.create_counter(
            _PREFIX + "job_discarded_count",
            unit="{job}",
            description="Number of jobs discarded (dead letters), by queue, kind and cause",
        )
        self._rescued = meter.create_counter(
            _PREFIX + "job_rescued_count",
            unit="{job}",
            description="Number of stuck jobs the rescuer moved on, by queue, kind and outcome",
        )

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Count events until the client run stops (ready once subscribed)."""
        if self._started:
            raise RuntimeError("OpenTelemetryEventMetrics.run() can run only once")
        self._started = True
        with self._run.subscribe(EventKind.JOB_DISCARDED, EventKind.JOB_RESCUED) as sub:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._observe_all, sub, name="river opentelemetry events")
                task_status.started()
                await self._run.wait()
                tg.cancel_scope.cancel("client run stopped")
            while True:  # what arrived before the run ended
                try:
                    self._observe(sub.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    break

    async def _observe_all(self, sub: Subscription) -> None:
        async for event in sub:
            self._observe(event)

    def _observe(self, event: Event) -> None:
        job = event.job
        if job is None:
            return
        attributes = {"queue": job.queue, "kind": job.kind}
        if event.kind is EventKind.JOB_DISCARDED:
            self._discarded.add(1, {**attributes, "cause": str(event.details.get("cause", ""))})
        elif event.kind is EventKind.JOB_RESCUED:
            outcome = str(event.details.get("outcome", ""))
            self._rescued.add(1, {**attributes, "outcome": outcome})


def _with_trace_context(params: JobInsertParams) -> JobInsertParams:
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    if not carrier:
        return params
    try:
        metadata = json.loads(params.metadata or b"{}")
    except ValueError:
        return params
    if not isinstance(metadata, dict):
        return params
    metadata.update(carrier)
    encoded = json.dumps(metadata, separators=(",", ":")).encode()
    return attrs.evolve(params, metadata=encoded)


def _linked_span_context(metadata: Any) -> trace.SpanContext | None:
    if not isinstance(metadata, dict):
        return None
    carrier = {k: v for k, v in metadata.items() if isinstance(v, str)}
    context = _propagator.extract(carrier)
    span_context = trace.get_current_span(context).get_span_context()
    return span_context if span_context.is_valid else None


def _rfc3339(at: dt.datetime) -> str:
    """Go's ``time.RFC3339`` layout (whole seconds, ``Z`` for UTC)."""
    text = at.strftime("%Y-%m-%dT%H:%M:%S%z")
    if text.endswith("+0000"):
        return text[:-5] + "Z"
    return text[:-2] + ":" + text[-2:]


def go_duration(duration: dt.timedelta) -> str:
    """A duration as Go's ``time.Duration.String`` writes it (``1m30s``, ``1.5s``, ``250ms``),
    as River records ``snooze.duration``."""
    ns = ((duration.days * 86_400 + duration.seconds) * 1_000_000 + duration.microseconds) * 1000
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns == 0:
        return "0s"
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return sign + _decimal(ns, size) + unit
    hours, rest = divmod(ns, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    seconds = _decimal(rest, 1_000_000_000) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{sign}{minutes}m{seconds}"
    return sign + seconds


def _decimal(value: int, size: int) -> str:
    whole, frac = divmod(value, size)
    if not frac:
        return str(whole)
    digits = str(frac).rjust(len(str(size)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"
