"""``auto_migrate``: a client on an empty database migrates line main up before it starts;
without it a missing schema is one MigrationError naming the fix."""

from __future__ import annotations

from typing import ClassVar

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio.drivers import open_driver
from river_anyio.migrate import Migrator

pytestmark = pytest.mark.anyio


@attrs.frozen
class Ping:
    kind: ClassVar[str] = "auto_migrate_ping"


def ping_workers(done: anyio.Event) -> river.Workers:
    workers = river.Workers()

    @workers.register(Ping)
    async def ping(ctx: river.WorkContext, job: river.Job[Ping]) -> None:
        done.set()

    return workers


async def test_auto_migrate_migrates_an_empty_database_then_works(empty_database_url: str) -> None:
    done = anyio.Event()
    async with river.open_client(
        empty_database_url,
        queues={"default": river.QueueConfig(max_workers=2)},
        workers=ping_workers(done),
        auto_migrate=True,
    ) as run:
        await run.client.insert(Ping())
        with anyio.fail_after(30):
            await done.wait()
    async with open_driver(empty_database_url) as driver:
        assert (await Migrator(driver).validate()).ok


async def test_clients_starting_together_migrate_once(empty_database_url: str) -> None:
    """Two clients auto-migrating the same empty database at once: the migrator's lock lets
    one apply each version; both start on a current schema."""

    async def start(results: list[bool]) -> None:
        async with river.open_client(empty_database_url, auto_migrate=True) as run:
            results.append(bool(run.client.id))

    results: list[bool] = []
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(start, results)
            tg.start_soon(start, results)
    assert results == [True, True]
    async with open_driver(empty_database_url) as driver:
        assert (await Migrator(driver).validate()).ok


async def test_without_auto_migrate_a_missing_schema_names_the_fix(
    empty_database_url: str,
) -> None:
    with pytest.raises(river.MigrationError, match="river-anyio migrate-up --database-url"):
        async with river.open_client(empty_database_url):
            pass


async def test_auto_migrate_leaves_a_current_schema_alone(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        before = await Migrator(driver).existing_versions()
    async with river.open_client(database_url, auto_migrate=True) as run:
        assert run.client.id
    async with open_driver(database_url) as driver:
        assert await Migrator(driver).existing_versions() == before  # nothing re-applied


def test_auto_migrate_must_be_a_bool() -> None:
    with pytest.raises(river.ConfigError, match="auto_migrate"):
        river.Config(auto_migrate="yes")  # type: ignore[arg-type]
