"""Prometheus metrics of a running client, on both loops and both databases."""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import river_anyio as river
from river_anyio._config import ClientConfig
from river_anyio.contrib.prometheus import PrometheusMetrics

from ..runtime.lifecycle_support import (
    SOON,
    Blocker,
    Gate,
    next_event,
    pg_connections_refused,
    queues,
    refuse_completions,
    sqlite_write_lock,
    wait_until,
)
from .support import capture

pytestmark = pytest.mark.anyio

#: (the private tuning hook: a ClientConfig as ``config``)
FAST_COMPLETER: dict[str, Any] = {
    "config": ClientConfig(completer_pauses=(0.01,), completer_try_timeout=5.0)
}
LATER = river.InsertOpts(scheduled_at=dt.datetime.now(dt.UTC) + dt.timedelta(days=1))


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_queue_depth_and_job_durations(database_url: str) -> None:
    registry = CollectorRegistry()
    gate = Gate()
    gate.release.set()
    async with river.open_client(database_url) as other:
        await other.client.insert_many(
            [
                river.InsertManyParams(Blocker("a"), river.InsertOpts(queue="elsewhere")),
                river.InsertManyParams(Blocker("b"), river.InsertOpts(queue="elsewhere")),
                river.InsertManyParams(Blocker("c"), LATER),
            ]
        )
    with anyio.fail_after(SOON):
        async with anyio.create_task_group() as tg:
            async with river.open_client(
                database_url, queues=queues(), workers=gate.workers(), fetch_cooldown=0.01
            ) as run:
                metrics = PrometheusMetrics(run, registry=registry, queue_depth_interval=3600)
                await tg.start(metrics.run)
                # sampled once at start: every queue in the database, this client's zero-filled
                assert (
                    value(registry, "river_queue_jobs", queue="elsewhere", state="available") == 2
                )
                assert value(registry, "river_queue_jobs", queue="default", state="scheduled") == 1
                assert value(registry, "river_queue_jobs", queue="default", state="running") == 0
                assert (
                    value(registry, "river_queue_jobs", queue="default", state="completed") is None
                )

                with run.subscribe(river.EventKind.JOB_COMPLETED) as sub:
                    job = (await run.client.insert(Blocker("worked"))).job
                    await next_event(sub, river.EventKind.JOB_COMPLETED, job.id)
                await run.client.insert(Blocker("d"), river.InsertOpts(queue="elsewhere"))
                await metrics.sample_queue_depth()
                assert (
                    value(registry, "river_queue_jobs", queue="elsewhere", state="available") == 3
                )
                assert value(registry, "river_queue_jobs", queue="default", state="available") == 0
                assert value(registry, "river_completer_written_total") == 1
                assert value(registry, "river_queue_active_jobs", queue="default") == 0
            # the service returns once the client has stopped, so the task group ends
    labels = {"queue": "default", "kind": "blocker", "outcome": "completed"}
    assert value(registry, "river_job_duration_seconds_count", **labels) == 1
    duration = value(registry, "river_job_duration_seconds_sum", **labels)
    assert duration is not None and 0 <= duration < SOON
    assert (
        value(registry, "river_job_queue_wait_seconds_count", queue="default", kind="blocker") == 1
    )
    assert value(registry, "river_metrics_events_dropped_total") == 0
    text = generate_latest(registry).decode()
    assert "# TYPE river_job_duration_seconds histogram" in text
    assert "# TYPE river_completer_dropped_total counter" in text
    assert "# TYPE river_event_loop_lag_seconds gauge" in text


async def test_failures_are_observed_by_outcome(database_url: str) -> None:
    registry = CollectorRegistry()

    async def fail(ctx: river.WorkContext, job: river.Job[Blocker]) -> None:
        raise ValueError("no")

    workers = river.Workers()
    workers.add(Blocker, fail)
    with anyio.fail_after(SOON):
        async with anyio.create_task_group() as tg:
            async with river.open_client(
                database_url, queues=queues(), workers=workers, fetch_cooldown=0.01
            ) as run:
                await tg.start(PrometheusMetrics(run, registry=registry).run)
                with run.subscribe(river.EventKind.JOB_FAILED) as sub:
                    job = (await run.client.insert(Blocker(), river.InsertOpts(max_attempts=1))).job
                    await next_event(sub, river.EventKind.JOB_FAILED, job.id)
    labels = {"queue": "default", "kind": "blocker"}
    assert value(registry, "river_job_duration_seconds_count", **labels, outcome="failed") == 1
    assert (
        value(registry, "river_job_duration_seconds_count", **labels, outcome="completed") is None
    )


async def test_the_sampler_runs_periodically(database_url: str) -> None:
    registry = CollectorRegistry()
    with anyio.fail_after(SOON):
        async with anyio.create_task_group() as tg:
            async with river.open_client(database_url) as run:
                await tg.start(
                    PrometheusMetrics(run, registry=registry, queue_depth_interval=0.05).run
                )
                assert value(registry, "river_queue_jobs", queue="late", state="available") is None
                await run.client.insert(Blocker(), river.InsertOpts(queue="late"))
                await wait_until(
                    lambda: (
                        value(registry, "river_queue_jobs", queue="late", state="available") == 1
                    )
                )


async def test_dropped_completions_are_counted(database_url: str) -> None:
    await refuse_completions(database_url)
    registry = CollectorRegistry()
    gate = Gate()
    gate.release.set()
    with anyio.fail_after(SOON):
        async with anyio.create_task_group() as tg:
            async with river.open_client(
                database_url, queues=queues(), workers=gate.workers(), **FAST_COMPLETER
            ) as run:
                await tg.start(PrometheusMetrics(run, registry=registry).run)
                with run.subscribe(river.EventKind.COMPLETION_DROPPED) as sub:
                    job = (await run.client.insert(Blocker())).job
                    await next_event(sub, river.EventKind.COMPLETION_DROPPED, job.id)
                assert value(registry, "river_completer_dropped_total") == 1
                assert value(registry, "river_completer_requeued_total") == 0
                assert value(registry, "river_completer_written_total") == 0


async def test_requeued_completions_are_counted(database_url: str, pg_server: str | None) -> None:
    """A database outage (SQLite: another connection holds the write lock; PostgreSQL: the
    database refuses connections) makes the completer put completions back."""
    registry = CollectorRegistry()
    gate = Gate()
    sqlite = database_url.startswith("sqlite")
    with anyio.fail_after(SOON * 2):
        async with anyio.create_task_group() as tg:
            async with river.open_client(
                database_url,
                queues=queues(),
                workers=gate.workers(),
                driver_options={"busy_timeout": 0.05} if sqlite else None,
                **FAST_COMPLETER,
            ) as run:
                await tg.start(
                    PrometheusMetrics(run, registry=registry, queue_depth_interval=3600).run
                )
                with run.subscribe(river.EventKind.JOB_COMPLETED) as sub:
                    job = (await run.client.insert(Blocker())).job
                    await gate.started_event(job.id).wait()
                    async with contextlib.AsyncExitStack() as stack:
                        if sqlite:
                            await stack.enter_async_context(sqlite_write_lock(database_url))
                        else:
                            assert pg_server is not None
                            await stack.enter_async_context(
                                pg_connections_refused(pg_server, database_url)
                            )
                        gate.release.set()
                        await wait_until(
                            lambda: (value(registry, "river_completer_requeued_total") or 0) >= 1
                        )
                        assert value(registry, "river_completer_written_total") == 0
                    await next_event(sub, river.EventKind.JOB_COMPLETED, job.id)
                assert value(registry, "river_completer_written_total") == 1
                assert value(registry, "river_completer_dropped_total") == 0


async def test_a_failing_sample_is_logged_and_keeps_the_last_one(database_url: str) -> None:
    registry = CollectorRegistry()
    async with river.open_client(database_url) as run:
        await run.client.insert(Blocker())
        metrics = PrometheusMetrics(run, registry=registry, states=["available"])
        await metrics.sample_queue_depth()
        assert value(registry, "river_queue_jobs", queue="default", state="available") == 1
        await run.client.driver.executor().exec_script("DROP TABLE river_job")
        with capture() as records:
            await metrics.sample_queue_depth()
        (record,) = records.of("queue_depth_failed")
        assert record.name == "river_anyio.contrib.prometheus"
        assert value(registry, "river_queue_jobs", queue="default", state="available") == 1


def test_options_are_checked() -> None:
    class NoRun:
        pass

    with pytest.raises(river.ConfigError, match="queue_depth_interval"):
        PrometheusMetrics(NoRun(), registry=None, queue_depth_interval=0)  # type: ignore[arg-type]
    with pytest.raises(river.ConfigError, match="states"):
        PrometheusMetrics(NoRun(), registry=None, states=["sleeping"])  # type: ignore[arg-type]
