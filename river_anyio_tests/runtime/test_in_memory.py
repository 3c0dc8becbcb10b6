"""River's in-memory SQLite database (``sqlite://:memory:``): the process's own, shared by the
drivers it opens on it (a client's writer and listener, other clients), gone once the last
closes."""

from __future__ import annotations

from typing import ClassVar

import anyio
import attrs
import pytest

import river_anyio as river

pytestmark = pytest.mark.anyio

URL = "sqlite://:memory:"


@attrs.frozen
class Ping:
    kind: ClassVar[str] = "in_memory_ping"


async def test_a_client_works_jobs_in_memory_and_the_database_goes_with_it() -> None:
    workers = river.Workers()
    ran: list[int] = []

    @workers.register(Ping)
    async def ping(ctx: river.WorkContext, job: river.Job[Ping]) -> None:
        ran.append(job.id)

    async with river.open_client(
        URL, queues={"default": river.QueueConfig(max_workers=2)}, workers=workers,
        auto_migrate=True,
    ) as run:  # fmt: skip
        with run.subscribe(river.EventKind.JOB_COMPLETED) as events:
            # a second client in the process shares the database: its insert (and the
            # notification through the outbox) reaches the working client
            async with river.open_client("sqlite::memory:") as inserter:
                job = (await inserter.client.insert(Ping())).job
            with anyio.fail_after(10):
                async for event in events:
                    if event.job is not None and event.job.id == job.id:
                        break
    assert ran == [job.id]
    # every driver has closed: the next one finds an empty database, and says what to do
    with pytest.raises(river.MigrationError, match="auto_migrate=True"):
        async with river.open_client(URL):
            pass


async def test_an_in_memory_database_cannot_be_attached() -> None:
    with pytest.raises(river.ConfigError, match="cannot be attached"):
        async with river.open_client(
            "sqlite://:memory:", driver_options={"attach": {"x": ":memory:"}}
        ):
            pass
