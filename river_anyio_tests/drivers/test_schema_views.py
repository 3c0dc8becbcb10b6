"""``driver.with_schema()``: one driver's connections (PostgreSQL's pool, SQLite's writer)
serving River's tables in several schemas (attached databases on SQLite), as River Go's
clients of several schemas share one driver; and ``open_client(driver, schema=...)`` on it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio.drivers import TOPIC_INSERT, Driver, open_driver
from river_anyio.drivers.postgres import Pool, PostgresDriver
from river_anyio.migrate import Migrator

pytestmark = pytest.mark.anyio

OTHER = "river_other"


@attrs.frozen
class Note:
    kind: ClassVar[str] = "schema_view_note"
    text: str = ""


@attrs.frozen(kw_only=True)
class Database:
    """A migrated database and the options that open it with a second River schema."""

    dialect: str
    url: str
    options: dict[str, Any]

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[Driver]:
        async with open_driver(self.url, **self.options) as driver:
            yield driver


@pytest.fixture(params=["postgres", "sqlite"])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """River migrated in the default schema, plus an empty schema ``OTHER`` (an attached
    file on SQLite) that each test migrates through a view."""
    if request.param == "postgres":
        url = str(request.getfixturevalue("pg_url"))
        db = Database(dialect="postgres", url=url, options={"pool_max_size": 3})
        async with db.open() as driver:
            await driver.executor().execute(f'CREATE SCHEMA "{OTHER}"')
        yield db
        return
    url = str(request.getfixturevalue("sqlite_url"))
    other = str(tmp_path / "other.sqlite3")
    yield Database(dialect="sqlite", url=url, options={"attach": {OTHER: other}})


async def _migrated_view(driver: Driver) -> Driver:
    view = driver.with_schema(OTHER)
    await Migrator(view).up()
    return view


def _pool(driver: Driver) -> Pool:
    assert isinstance(driver, PostgresDriver)
    return driver.pool


def _client(driver: Driver) -> river.Client:
    return river.Client(driver, id="schema-views", max_attempts=25)


async def _texts(driver: Driver, schema: str | None) -> list[str]:
    """The ``text`` of every job in ``schema``'s table, read with plain SQL by name."""
    table = f'"{schema}".river_job' if schema else "river_job"
    column = "args->>'text'" if driver.dialect == "postgres" else "args->>'$.text'"
    rows = await driver.executor().fetch_all(f"SELECT {column} FROM {table} ORDER BY id")
    return [str(r[0]) for r in rows]


async def test_a_view_serves_another_schema_on_the_drivers_connections(
    database: Database,
) -> None:
    async with database.open() as driver:
        view = await _migrated_view(driver)
        assert view.schema == OTHER and view.dialect == driver.dialect
        if database.dialect == "postgres":
            assert _pool(view) is _pool(driver)  # one pool for both
        await _client(driver).insert(Note("main"))
        await _client(view).insert(Note("other"))
        assert await _texts(driver, None) == ["main"]
        assert await _texts(driver, OTHER) == ["other"]
        listed = await _client(view).jobs.list()
        assert [job.args["text"] for job in listed.jobs] == ["other"]
        # River's tables of the other schema, migrated through the view, read back as current
        assert [v.version for v in (await Migrator(view).up()).versions] == []
        if database.dialect == "postgres":
            stats = _pool(driver).statistics()
            assert stats.connects <= 3  # the migrator's lock and its work, never more


async def test_the_pool_bounds_every_view_together(pg_url: str) -> None:
    async with open_driver(pg_url, pool_max_size=1, acquire_timeout=0.2) as driver:
        view = driver.with_schema(OTHER)
        async with driver.transaction():
            with pytest.raises(river.PoolTimeoutError):
                await view.executor().fetch_all("SELECT 1")
        assert await view.executor().fetch_all("SELECT 1") == [(1,)]
        assert _pool(driver).statistics().connects == 1


async def test_open_client_with_a_schema_works_jobs_on_the_callers_driver(
    database: Database,
) -> None:
    worked: list[str] = []

    async def work(ctx: river.WorkContext, job: river.Job[Note]) -> None:
        worked.append(job.args.text)

    workers = river.Workers()
    workers.add(Note, work)
    async with database.open() as driver:
        await _migrated_view(driver)
        queues = {"default": river.QueueConfig(max_workers=2)}
        async with river.open_client(driver, schema=OTHER, queues=queues, workers=workers) as run:
            client_driver = run.client.driver
            assert client_driver.schema == OTHER
            if database.dialect == "postgres":
                assert _pool(client_driver) is _pool(driver)
            inserted = await run.client.insert(Note("worked in the other schema"))
            done = await run.client.jobs.wait(inserted.job.id, timeout=10)
            assert done.state is river.JobState.COMPLETED
        assert worked == ["worked in the other schema"]
        assert await _texts(driver, OTHER) == ["worked in the other schema"]
        assert await _texts(driver, None) == []


class _Rollback(Exception):
    pass


async def test_one_transaction_writes_both_schemas(database: Database) -> None:
    async with database.open() as driver:
        view = await _migrated_view(driver)
        main, other = _client(driver), _client(view)
        with pytest.raises(_Rollback):
            async with driver.transaction() as tx:
                await main.insert_tx(tx, Note("main, rolled back"))
                await other.insert_tx(tx, Note("other, rolled back"))
                raise _Rollback
        async with view.transaction() as tx:
            await other.insert_tx(tx, Note("other"))
            await main.insert_tx(tx, Note("main"))
            # the transaction's executor given to each driver reads that driver's tables
            assert len(await view.executor_for(tx).job_list()) == 1
            assert len(await driver.executor_for(tx).job_list()) == 1
        assert await _texts(driver, None) == ["main"]
        assert await _texts(driver, OTHER) == ["other"]


async def _next_payload(listener: Any) -> str:
    with anyio.fail_after(10):
        async for note in listener:
            return str(note.payload)
    raise AssertionError("the listener ended")


async def test_a_views_listener_hears_its_schema_only(database: Database) -> None:
    async with database.open() as driver:
        view = await _migrated_view(driver)
        async with driver.listener() as heard_main, view.listener() as heard_other:
            await heard_main.listen(TOPIC_INSERT)
            await heard_other.listen(TOPIC_INSERT)
            await driver.executor().notify_many(TOPIC_INSERT, ['{"queue":"main"}'])
            await view.executor().notify_many(TOPIC_INSERT, ['{"queue":"other"}'])
            assert await _next_payload(heard_other) == '{"queue":"other"}'
            assert await _next_payload(heard_main) == '{"queue":"main"}'
            # and again, in the other order, after both listeners followed a commit
            await view.executor().notify_many(TOPIC_INSERT, ['{"queue":"other 2"}'])
            await driver.executor().notify_many(TOPIC_INSERT, ['{"queue":"main 2"}'])
            assert await _next_payload(heard_main) == '{"queue":"main 2"}'
            assert await _next_payload(heard_other) == '{"queue":"other 2"}'


async def test_with_schema_checks_its_argument_and_closes_nothing(database: Database) -> None:
    async with database.open() as driver:
        assert driver.with_schema(driver.schema) is driver
        with pytest.raises(river.ConfigError) as info:
            driver.with_schema("no-such schema")
        assert info.value.field == "schema"
        with pytest.raises(river.ConfigError):
            driver.with_schema("s" * 47)
        if database.dialect == "sqlite":
            with pytest.raises(river.ConfigError) as info:
                driver.with_schema("not_attached")
            assert "no attached database named 'not_attached'" in info.value.rule
            assert driver.with_schema("main").schema == "main"
        view = await _migrated_view(driver)
        back = view.with_schema(None)
        assert back.schema is None
        await view.aclose()  # a view owns nothing: the driver and its views go on working
        await _client(view).insert(Note("after the view closed"))
        await _client(back).insert(Note("main"))
        assert await _texts(driver, OTHER) == ["after the view closed"]
        assert await _texts(driver, None) == ["main"]
