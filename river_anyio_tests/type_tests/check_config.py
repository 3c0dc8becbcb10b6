"""Checked by mypy (``river_anyio_tests/api/test_type_checks.py``), never run.

A line ending in ``# error: CODE`` must get exactly that mypy error code; every other line
must be clean.
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import assert_type

import anyio

import river_anyio as river


async def misspelled_and_mistyped_options(url: str) -> None:
    async with river.open_client(url, job_timout=5):  # error: call-arg
        pass
    async with river.open_client(url, fetch_cooldown="fast"):  # error: arg-type
        pass
    async with river.open_client(url, queues=["default"]):  # error: arg-type
        pass
    river.Config(job_timout=5)  # error: call-arg
    river.Config(fetch_cooldown="fast")  # error: arg-type
    river.Config(poll_only="yes")  # error: arg-type
    river.Config(_elect_interval=0.2)  # error: call-arg
    async with river.open_client(url, _completer_pauses=(0.01,)):  # error: call-arg
        pass
    options: river.ConfigOptions = {"job_timout": 5}  # error: typeddict-unknown-key
    async with river.open_client(url, **options):
        pass
    async with river.open_client(url, river.MaintenanceConfig()):  # error: arg-type
        pass


async def correct_calls(url: str, workers: river.Workers) -> None:
    queues = {"default": river.QueueConfig(max_workers=10)}
    async with river.open_client(
        url,
        queues=queues,
        workers=workers,
        job_timeout=dt.timedelta(minutes=5),
        fetch_cooldown=0.05,
        fetch_poll_interval=2,
        soft_stop_timeout=None,
        driver_options={"busy_timeout": 5.0},
        maintenance=river.MaintenanceConfig(scheduler_interval=1),
    ) as run:
        assert_type(run, river.ClientRun)
        assert_type(run.client, river.Client)
        assert_type(run.health(), river.Health)
        assert_type(run.health().queues["default"], river.QueueHealth)
    async with river.open_client(
        url,
        wait_for_database=True,
        health=river.HealthConfig(database_failing_after=dt.timedelta(seconds=10)),
    ):
        pass
    async with river.open_client(url, wait_for_database="yes"):  # error: arg-type
        pass
    config = river.Config(queues=queues, workers=workers, id="worker-1")
    assert_type(config.job_timeout, float | None)
    assert_type(config.fetch_cooldown, float)
    async with river.open_client(url, config, id="worker-2") as run:
        assert_type(run, river.ClientRun)
    options: river.ConfigOptions = {"job_timeout": 30, "poll_only": True}
    async with river.open_client(url, config, **options):
        pass
    async with anyio.create_task_group() as tg:
        started: river.ClientRun = await tg.start(river.run_client, url, config)
        started.stop()
        await tg.start(functools.partial(river.run_client, url, config))


async def job_list_options(client: river.Client) -> None:
    page = await client.jobs.list(kinds=["email"], order="desc", limit=10)
    assert_type(page, river.JobListResult)
    await client.jobs.list(limt=10)  # error: call-arg
    await client.jobs.list(order="down")  # error: arg-type
    options: river.JobListOptions = {"states": [river.JobState.AVAILABLE], "limit": 5}
    await client.jobs.list_tx(object(), **options)
