"""The pytest plugin's fixtures under pytest-trio (trio tests, trio fixtures, no AnyIO plugin
involvement), as an application's test suite would use them."""

from __future__ import annotations

from typing import ClassVar

import attrs
import pytest
import trio
import trio.lowlevel

import river_anyio as river
from river_anyio.testing import (
    MigratedDatabase,
    require_inserted,
    require_not_inserted,
    work_once,
    work_with_client,
)

pytestmark = pytest.mark.trio


@attrs.frozen
class Greet:
    kind: ClassVar[str] = "greet"
    name: str


async def greet(ctx: river.WorkContext, job: river.Job[Greet]) -> None:
    await trio.lowlevel.checkpoint()  # trio itself, not only AnyIO, is usable in the worker
    ctx.set_metadata("output", f"hello {job.args.name}")


@pytest.fixture
def river_workers() -> river.Workers:
    workers = river.Workers()
    workers.add(Greet, greet)
    return workers


def in_trio() -> None:
    trio.lowlevel.current_task()  # raises outside trio


async def test_sqlite_client(river_sqlite_client: river.Client) -> None:
    in_trio()
    assert river_sqlite_client.driver.dialect == "sqlite"
    await require_not_inserted(river_sqlite_client, Greet)
    await river_sqlite_client.insert(Greet(name="a"))
    job = await require_inserted(river_sqlite_client, Greet, queue="default")
    assert job.args == Greet(name="a")


async def test_postgres_client(
    river_postgres_client: river.Client, river_postgres_database: MigratedDatabase
) -> None:
    in_trio()
    assert river_postgres_client.driver.dialect == "postgres"
    assert river_postgres_client.driver.schema == river_postgres_database.schema
    assert (river_postgres_database.schema or "").startswith("river_test_")
    await river_postgres_client.insert(Greet(name="pg"))
    assert (await require_inserted(river_postgres_client, Greet)).args.name == "pg"


async def test_each_test_gets_a_fresh_postgres_schema(river_postgres_client: river.Client) -> None:
    await require_not_inserted(river_postgres_client, Greet)


async def test_running_client_works_jobs(river_running_client: river.ClientRun) -> None:
    in_trio()
    with river_running_client.subscribe(river.EventKind.JOB_COMPLETED) as events:
        job = (await river_running_client.client.insert(Greet(name="run"))).job
        with trio.fail_after(10):
            event = await events.__anext__()
    assert event.job is not None and event.job.id == job.id
    assert event.job.metadata["output"] == "hello run"


async def test_work_helpers(river_client: river.Client, river_workers: river.Workers) -> None:
    result = await work_once(river_workers, Greet(name="once"))
    assert result.output == "hello once"
    result = await work_with_client(river_client, Greet(name="db"), workers=river_workers)
    assert result.job.state is river.JobState.COMPLETED
    assert result.job.metadata["output"] == "hello db"
