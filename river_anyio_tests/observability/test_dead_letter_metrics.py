"""Dead letters and rescues counted by the Prometheus collector and the OpenTelemetry event
metrics, through a leading client on both loops and both databases."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

import anyio
import attrs
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

import river_anyio as river
from river_anyio._config import ClientConfig
from river_anyio.contrib.opentelemetry import OpenTelemetryEventMetrics
from river_anyio.contrib.prometheus import PrometheusMetrics

from ..runtime.lifecycle_support import SOON, wait_until
from ..runtime.test_maintenance import Known, insert, update

pytestmark = pytest.mark.anyio
H = dt.timedelta(hours=1)


@attrs.frozen
class Doomed:
    kind: ClassVar[str] = "metrics_doomed"


async def doomed(ctx: river.WorkContext, job: river.Job[Doomed]) -> Any:
    return river.discard("never going to work")


async def noop(ctx: river.WorkContext, job: river.Job[Any]) -> None:
    pass


def otel_points(reader: InMemoryMetricReader, name: str) -> dict[tuple[Any, ...], int]:
    data = reader.get_metrics_data()
    out: dict[tuple[Any, ...], int] = {}
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        out[tuple(sorted(point.attributes.items()))] = point.value
    return out


async def test_discards_and_rescues_are_counted(database_url: str) -> None:
    registry = CollectorRegistry()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    workers = river.Workers()
    workers.add(Doomed, doomed)
    workers.add(Known, noop)
    try:
        with anyio.fail_after(SOON):
            async with anyio.create_task_group() as tg:
                async with river.open_client(
                    database_url,
                    ClientConfig(elect_interval=0.2, maintenance_stagger=False),
                    queues={"default": river.QueueConfig(max_workers=2)},
                    workers=workers,
                    fetch_cooldown=0.01,
                    maintenance=river.MaintenanceConfig(rescuer_interval=0.05),
                ) as run:
                    prom = PrometheusMetrics(run, registry=registry, queue_depth_interval=3600)
                    await tg.start(prom.run)
                    await tg.start(OpenTelemetryEventMetrics(run, meter_provider=provider).run)
                    await run.wait_leading()

                    await run.client.insert(Doomed())
                    stuck = await insert(run.client.driver, 1, queue="stuck", max_attempts=1)
                    await update(
                        run.client.driver,
                        stuck.id,
                        state="running",
                        attempt=1,
                        attempted_at=dt.datetime.now(dt.UTC) - 2 * H,
                    )

                    def discarded(kind: str, cause: str, queue: str = "default") -> float | None:
                        labels = {"queue": queue, "kind": kind, "cause": cause}
                        return registry.get_sample_value("river_jobs_discarded_total", labels)

                    await wait_until(lambda: discarded(Doomed.kind, "discard") == 1)
                    await wait_until(lambda: discarded(Known.kind, "rescuer", "stuck") == 1)
                    rescued = {"queue": "stuck", "kind": Known.kind, "outcome": "discarded"}
                    assert registry.get_sample_value("river_jobs_rescued_total", rescued) == 1

                    await wait_until(
                        lambda: len(otel_points(reader, "river.job_discarded_count")) == 2
                    )
                    assert otel_points(reader, "river.job_discarded_count") == {
                        (("cause", "discard"), ("kind", Doomed.kind), ("queue", "default")): 1,
                        (("cause", "rescuer"), ("kind", Known.kind), ("queue", "stuck")): 1,
                    }
                    assert otel_points(reader, "river.job_rescued_count") == {
                        (("kind", Known.kind), ("outcome", "discarded"), ("queue", "stuck")): 1
                    }
    finally:
        provider.shutdown()
