"""The OpenTelemetry middleware, through a running client on both loops and both databases,
recorded by the SDK's in-memory span exporter and metric reader."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar

import anyio
import attrs
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import river_anyio as river
from river_anyio.contrib.opentelemetry import OpenTelemetryMiddleware, go_duration

from ..runtime.lifecycle_support import SOON, next_event, queues


@attrs.frozen
class Task:
    kind: ClassVar[str] = "otel_task"
    mode: str = "ok"


@attrs.define
class Telemetry:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    #: metric name -> its data points in the latest collection that had it
    seen: dict[str, list[Any]] = attrs.field(factory=dict)

    def middleware(self, **options: Any) -> OpenTelemetryMiddleware:
        return OpenTelemetryMiddleware(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **options
        )

    def finished(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]

    def points(self, name: str) -> list[Any]:
        """The data points ``name`` last reported. Each call collects again; an instrument
        missing from a collection keeps what it reported before (SDKs before 1.28 report a
        synchronous gauge only to the first collection after it was set)."""
        data = self.reader.get_metrics_data()
        if data is not None:
            for rm in data.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        self.seen[metric.name] = list(metric.data.data_points)
        return self.seen.get(name, [])


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Telemetry(spans, reader, tracer_provider, meter_provider)
    tracer_provider.shutdown()
    meter_provider.shutdown()


def _workers(telemetry: Telemetry) -> river.Workers:
    tracer = telemetry.tracer_provider.get_tracer("worker")

    async def work(ctx: river.WorkContext, job: river.Job[Task]) -> river.Outcome | None:
        with tracer.start_as_current_span("inside the worker"):
            pass
        if job.args.mode == "fail":
            raise ValueError("boom")
        if job.args.mode == "snooze":
            return river.snooze(90)
        if job.args.mode == "cancel":
            return river.cancel("no longer wanted")
        if job.args.mode == "discard":
            return river.discard("bad input")
        if job.args.mode == "hang":
            await anyio.sleep_forever()
        return None

    workers = river.Workers()
    workers.add(Task, work)
    return workers


def _working_client(
    url: str, telemetry: Telemetry, middleware: OpenTelemetryMiddleware, **options: Any
) -> AbstractAsyncContextManager[river.ClientRun]:
    """A client working ``default`` with :func:`_workers` under ``middleware``."""
    return river.open_client(
        url,
        queues=queues(),
        workers=_workers(telemetry),
        middleware=[middleware],
        fetch_cooldown=0.01,
        **options,
    )


pytestmark = pytest.mark.anyio


async def test_a_worked_job_has_river_spans_and_metrics(
    database_url: str, telemetry: Telemetry
) -> None:
    with anyio.fail_after(SOON):
        async with _working_client(database_url, telemetry, telemetry.middleware()) as run:
            with run.subscribe(river.EventKind.JOB_COMPLETED) as sub:
                job = (
                    await run.client.insert(Task(), river.InsertOpts(tags=["tag_one", "tag_two"]))
                ).job
                await next_event(sub, river.EventKind.JOB_COMPLETED, job.id)

    (insert,) = telemetry.finished("river.insert_many")
    assert insert.kind is SpanKind.PRODUCER
    assert insert.status.status_code is StatusCode.OK
    assert dict(insert.attributes or {}) == {
        "status": "ok",
        "kinds": ("otel_task",),
        "unique_skipped_as_duplicate_count": 0,
    }
    (work,) = telemetry.finished("river.work")
    assert work.kind is SpanKind.CONSUMER
    assert work.status.status_code is StatusCode.OK
    attributes = dict(work.attributes or {})
    assert attributes == {
        "attempt": 1,
        "kind": "otel_task",
        "priority": 1,
        "queue": "default",
        "status": "ok",
        "tag": ("tag_one", "tag_two"),
        "id": job.id,
        "created_at": job.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "scheduled_at": job.scheduled_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    # the worker's own span is a child of the work span
    (inside,) = telemetry.finished("inside the worker")
    assert inside.parent is not None and work.context is not None
    assert inside.parent.span_id == work.context.span_id
    assert work.links == ()

    (count,) = telemetry.points("river.insert_count")
    assert (count.value, dict(count.attributes)) == (
        1,
        {"status": "ok", "unique_skipped_as_duplicate": False},
    )
    (batches,) = telemetry.points("river.insert_many_count")
    assert (batches.value, dict(batches.attributes)) == (1, {"status": "ok"})
    (gauge,) = telemetry.points("river.insert_many_duration")
    assert 0 < gauge.value < SOON
    (hist,) = telemetry.points("river.insert_many_duration_histogram")
    assert hist.count == 1
    (worked,) = telemetry.points("river.work_count")
    assert worked.value == 1
    assert dict(worked.attributes) == {
        "attempt": 1,
        "kind": "otel_task",
        "priority": 1,
        "queue": "default",
        "status": "ok",
        "tag": ("tag_one", "tag_two"),
    }
    (work_hist,) = telemetry.points("river.work_duration_histogram")
    assert work_hist.count == 1 and 0 <= work_hist.sum < SOON
    (work_gauge,) = telemetry.points("river.work_duration")
    assert 0 <= work_gauge.value < SOON
    assert telemetry.points("messaging.client.consumed.messages") == []


async def test_outcomes_set_status_and_flags(database_url: str, telemetry: Telemetry) -> None:
    modes = ["fail", "snooze", "cancel", "discard", "hang"]
    done = {
        river.EventKind.JOB_FAILED,
        river.EventKind.JOB_SNOOZED,
        river.EventKind.JOB_CANCELLED,
    }
    with anyio.fail_after(SOON):
        async with _working_client(
            database_url,
            telemetry,
            telemetry.middleware(work_span_job_kind_suffix=True),
            job_timeout=0.2,
        ) as run:
            with run.subscribe(*done) as sub:
                results = await run.client.insert_many(
                    [
                        river.InsertManyParams(Task(m), river.InsertOpts(max_attempts=1))
                        for m in modes
                    ]
                )
                ids = {r.job.id: m for r, m in zip(results, modes, strict=True)}
                seen: set[int] = set()
                with anyio.fail_after(SOON):
                    async for event in sub:
                        assert event.job is not None
                        seen.add(event.job.id)
                        if seen == set(ids):
                            break

    spans = {
        ids[int(s.attributes["id"])]: s  # type: ignore[arg-type,index]
        for s in telemetry.finished("river.work/otel_task")
    }
    assert set(spans) == set(modes)

    def summary(mode: str) -> tuple[Any, ...]:
        span = spans[mode]
        attrs_ = span.attributes or {}
        return (
            attrs_["status"],
            attrs_.get("snooze"),
            attrs_.get("cancel"),
            span.status.status_code,
            span.status.description,
        )

    assert summary("fail") == ("error", None, None, StatusCode.ERROR, "boom")
    assert [e.name for e in spans["fail"].events] == ["exception"]
    assert summary("snooze") == ("ok", True, None, StatusCode.OK, None)
    assert spans["snooze"].attributes["snooze.duration"] == "1m30s"  # type: ignore[index]
    assert summary("cancel") == ("error", None, True, StatusCode.ERROR, "no longer wanted")
    assert summary("discard") == ("error", None, None, StatusCode.ERROR, "bad input")
    assert summary("hang") == ("error", None, None, StatusCode.ERROR, "cancelled")

    by_status: dict[str, int] = {}
    for point in telemetry.points("river.work_count"):
        status = point.attributes["status"]
        by_status[status] = by_status.get(status, 0) + point.value
    assert by_status == {"ok": 1, "error": 4}
    (batch,) = telemetry.finished("river.insert_many")
    assert batch.attributes is not None and batch.attributes["kinds"] == ("otel_task",)


async def test_unique_duplicates_and_semantic_metrics(
    database_url: str, telemetry: Telemetry
) -> None:
    unique = river.InsertOpts(unique=river.UniqueOpts(by_args=True))
    async with river.open_client(
        database_url, middleware=[telemetry.middleware(semantic_metrics=True, duration_unit="ms")]
    ) as run:
        first = await run.client.insert(Task("unique"), unique)
        second = await run.client.insert(Task("unique"), unique)
        assert second.unique_skipped_as_duplicate and not first.unique_skipped_as_duplicate
        assert await run.client.insert_many_fast([Task("a"), Task("b")]) == 2
    spans = telemetry.finished("river.insert_many")
    assert [s.attributes["unique_skipped_as_duplicate_count"] for s in spans] == [0, 1, 0]  # type: ignore[index]
    counts = {
        p.attributes["unique_skipped_as_duplicate"]: p.value
        for p in telemetry.points("river.insert_count")
    }
    assert counts == {False: 3, True: 1}
    (batches,) = telemetry.points("river.insert_many_count")
    assert batches.value == 3
    # milliseconds are whole
    (hist,) = telemetry.points("river.insert_many_duration_histogram")
    assert hist.count == 3 and hist.sum == int(hist.sum)
    (sent,) = telemetry.points("messaging.client.sent.messages")
    assert (sent.value, dict(sent.attributes)) == (
        4,
        {"messaging.operation.name": "insert_many", "messaging.system": "river"},
    )
    (ops,) = telemetry.points("messaging.client.operation.duration")
    assert ops.count == 3


async def test_trace_propagation_links_the_work_span_to_the_insert(
    database_url: str, telemetry: Telemetry
) -> None:
    tracer = telemetry.tracer_provider.get_tracer("app")
    with anyio.fail_after(SOON):
        async with _working_client(
            database_url, telemetry, telemetry.middleware(trace_propagation=True)
        ) as run:
            with run.subscribe(river.EventKind.JOB_COMPLETED) as sub:
                with tracer.start_as_current_span("request"):
                    job = (
                        await run.client.insert(Task(), river.InsertOpts(metadata={"mine": 1}))
                    ).job
                await next_event(sub, river.EventKind.JOB_COMPLETED, job.id)

    (request,) = telemetry.finished("request")
    (insert,) = telemetry.finished("river.insert_many")
    assert insert.parent is not None and request.context is not None
    assert insert.parent.span_id == request.context.span_id
    assert insert.context is not None
    trace_id = f"{insert.context.trace_id:032x}"
    span_id = f"{insert.context.span_id:016x}"
    flags = f"{int(insert.context.trace_flags):02x}"
    assert job.metadata["traceparent"] == f"00-{trace_id}-{span_id}-{flags}"
    assert job.metadata["mine"] == 1
    (work,) = telemetry.finished("river.work")
    assert [(link.context.trace_id, link.context.span_id) for link in work.links] == [
        (insert.context.trace_id, insert.context.span_id)
    ]
    # a link, not a parent: the work span starts a trace of its own
    assert work.parent is None
    assert work.context is not None and work.context.trace_id != insert.context.trace_id


def test_duration_unit_is_checked() -> None:
    with pytest.raises(river.ConfigError, match="duration_unit"):
        OpenTelemetryMiddleware(duration_unit="h")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("duration", "text"),
    [
        (dt.timedelta(0), "0s"),
        (dt.timedelta(microseconds=1), "1µs"),
        (dt.timedelta(microseconds=1500), "1.5ms"),
        (dt.timedelta(milliseconds=250), "250ms"),
        (dt.timedelta(seconds=1), "1s"),
        (dt.timedelta(seconds=2.5), "2.5s"),
        (dt.timedelta(seconds=90), "1m30s"),
        (dt.timedelta(hours=1), "1h0m0s"),
        (dt.timedelta(hours=26, seconds=1.25), "26h0m1.25s"),
        (dt.timedelta(seconds=-5), "-5s"),
    ],
)
def test_go_duration(duration: dt.timedelta, text: str) -> None:
    assert go_duration(duration) == text
