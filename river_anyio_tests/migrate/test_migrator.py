"""Migrations on real databases: River's schema at every version, up and down, both backends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

import river_anyio as river
from river_anyio.drivers import open_driver
from river_anyio.migrate import LINE_RIVER_ANYIO, Migrator, all_migrations, migration_sql

from ..conftest import CUSTOM_SCHEMA
from .introspect import describe_postgres, describe_sqlite

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent
REPO = HERE.parents[1]
LATEST = len(all_migrations("postgres"))


def expected(dialect: str, version: int, *, after_down: bool = False) -> Any:
    """River Go's schema at ``version``. Stepping down does not always give back the fresh
    state (PostgreSQL keeps the 'pending' enum value, SQLite moves a column), so River's own
    after-down state is recorded separately where it differs."""
    if after_down:
        path = HERE / f"schema_{dialect}_v{version}_after_down.json"
        if path.exists():
            return json.loads(path.read_text())
    return json.loads((HERE / f"schema_{dialect}_v{version}.json").read_text())


def _describe_sync(url: str, schema: str | None) -> Any:
    if url.startswith("sqlite:"):
        import apsw

        from river_anyio.drivers.sqlite import path_from_url

        conn = apsw.Connection(path_from_url(url))
        try:
            return describe_sqlite(conn, schema or "main")
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url) as conn:
        return describe_postgres(conn, schema or "public")


async def describe(url: str, schema: str | None = None) -> Any:
    return await anyio.to_thread.run_sync(_describe_sync, url, schema)


def dialect(url: str) -> str:
    return "sqlite" if url.startswith("sqlite:") else "postgres"


def test_migration_lines_are_in_lockstep() -> None:
    pg = [(m.version, m.name) for m in all_migrations("postgres")]
    lite = [(m.version, m.name) for m in all_migrations("sqlite")]
    assert pg == lite
    assert [v for v, _ in pg] == list(range(1, LATEST + 1))
    assert LATEST >= 8
    pg_own = [(m.version, m.name) for m in all_migrations("postgres", LINE_RIVER_ANYIO)]
    assert pg_own == [(m.version, m.name) for m in all_migrations("sqlite", LINE_RIVER_ANYIO)]
    assert pg_own[0] == (1, "create_river_anyio_lease")


def test_every_reference_is_schema_qualified_by_placeholder() -> None:
    for d in ("postgres", "sqlite"):
        for m, sql in migration_sql(d, range(1, LATEST + 1), "up", schema="zz"):
            assert "/*river:schema*/" not in sql, (d, m.version)
        own = migration_sql(d, [1], "up", schema="zz", line=LINE_RIVER_ANYIO)
        assert all("/*river:schema*/" not in sql for _, sql in own)
        for m in (*all_migrations(d), *all_migrations(d, LINE_RIVER_ANYIO)):
            for sql in (m.sql_up, m.sql_down):
                body = [
                    line
                    for line in sql.splitlines()
                    if line.strip() and not line.strip().startswith("--")
                ]
                if body == ["SELECT 1;"]:
                    continue  # a version that is a no-op on this backend
                assert "/*river:schema*/" in sql, (d, m.version)


async def test_up_down_up_matches_rivers_schema_at_every_version(empty_database_url: str) -> None:
    url = empty_database_url
    d = dialect(url)
    async with open_driver(url) as driver:
        migrator = Migrator(driver)
        for version in range(1, LATEST + 1):
            res = await migrator.up(max_steps=1)
            assert [v.version for v in res.versions] == [version]
            assert await describe(url) == expected(d, version), f"up to {version}"
        assert (await migrator.validate()).ok
        for version in range(LATEST, 0, -1):
            res = await migrator.down()
            assert [v.version for v in res.versions] == [version]
            if version > 1:
                want = expected(d, version - 1, after_down=True)
                assert await describe(url) == want, f"down to {version - 1}"
        assert await migrator.existing_versions() == []
        res = await migrator.up()
        assert [v.version for v in res.versions] == list(range(1, LATEST + 1))
        assert await describe(url) == expected(d, LATEST)
        assert (await migrator.up()).versions == ()


async def test_custom_postgres_schema(pg_empty_url: str) -> None:
    async with open_driver(pg_empty_url) as plain:
        await plain.executor().exec_script(f'CREATE SCHEMA "{CUSTOM_SCHEMA}"')
    async with open_driver(pg_empty_url, schema=CUSTOM_SCHEMA) as driver:
        await Migrator(driver).up()
        assert await describe(pg_empty_url, CUSTOM_SCHEMA) == expected("postgres", LATEST)
        # nothing leaked into public
        public = await describe(pg_empty_url, "public")
        assert public["tables"] == {}
        assert public["enums"] == {} and public["functions"] == []
        await Migrator(driver).down(target_version=0)
    desc = await describe(pg_empty_url, CUSTOM_SCHEMA)
    assert desc["tables"] == {} and desc["enums"] == {} and desc["functions"] == []


@pytest.mark.parametrize("schema", ["1abc", "a-b", 'x"y', "a" * 47, "has space"])
async def test_invalid_schema_names_are_rejected(empty_database_url: str, schema: str) -> None:
    with pytest.raises((river.ConfigError, river.ValidationError), match="schema"):
        async with open_driver(empty_database_url, schema=schema) as driver:
            await Migrator(driver).up()


async def test_dry_run_changes_nothing_and_returns_sql(empty_database_url: str) -> None:
    async with open_driver(empty_database_url) as driver:
        migrator = Migrator(driver)
        res = await migrator.up(dry_run=True)
        assert [v.version for v in res.versions] == list(range(1, LATEST + 1))
        assert "river_migration" in res.versions[0].sql
        assert await migrator.existing_versions() == []
        await migrator.up(target_version=3)
        res = await migrator.down(dry_run=True, target_version=0)
        assert [v.version for v in res.versions] == [3, 2, 1]
        assert [m.version for m in await migrator.existing_versions()] == [1, 2, 3]


async def test_target_version_and_max_steps(empty_database_url: str) -> None:
    async with open_driver(empty_database_url) as driver:
        m = Migrator(driver)
        assert [v.version for v in (await m.up(target_version=3)).versions] == [1, 2, 3]
        assert (await m.up(target_version=2)).versions == ()  # already applied
        assert [v.version for v in (await m.up(max_steps=2)).versions] == [4, 5]
        v = await m.validate()
        assert not v.ok and v.missing == tuple(range(6, LATEST + 1))
        assert v.messages == (f"Unapplied migrations: [{' '.join(map(str, v.missing))}]",)
        assert (await m.validate(target_version=5)).ok
        assert [x.version for x in (await m.down()).versions] == [5]
        assert [x.version for x in (await m.down(target_version=2)).versions] == [4, 3]
        with pytest.raises(river.MigrationError, match="not in target list"):
            await m.down(target_version=3)
        with pytest.raises(river.MigrationError, match="not a valid River migration version"):
            await m.up(target_version=99)
        with pytest.raises(river.ValidationError, match="max_steps"):
            await m.up(max_steps=0)
        with pytest.raises(river.ValidationError, match="target_version"):
            await m.up(target_version=0)
        with pytest.raises(river.MigrationError, match="migration line does not exist: mian"):
            Migrator(driver, line="mian")
        assert [x.version for x in (await m.down(target_version=0)).versions] == [2, 1]


async def test_other_lines_are_left_alone(empty_database_url: str) -> None:
    ph = "%s" if dialect(empty_database_url) == "postgres" else "?"
    async with open_driver(empty_database_url) as driver:
        m = Migrator(driver)
        await m.up()
        async with driver.transaction() as tx:
            await tx.execute(
                f"INSERT INTO river_migration (line, version) VALUES ({ph}, {ph})", ("pro", 1)
            )
        await m.down(target_version=6)
        await m.up()
        rows = await driver.executor().fetch_all(
            "SELECT line, version FROM river_migration ORDER BY line, version"
        )
    assert ("pro", 1) in [tuple(r) for r in rows]
    assert [r[1] for r in rows if r[0] == "main"] == list(range(1, LATEST + 1))


def _without_line_river_anyio(description: Any) -> Any:
    """A schema description with line river_anyio's objects and rows taken out."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if "river_anyio_lease" not in str(k)}
        if isinstance(value, list):
            return [strip(v) for v in value if v != ["river_anyio", 1]]
        return value

    return strip(description)


async def test_line_river_anyio_sits_beside_main(empty_database_url: str) -> None:
    """Line river_anyio adds its table and its river_migration row and nothing else: line main
    stays exactly River's schema; up, validate and down leave main alone."""
    url = empty_database_url
    d = dialect(url)
    async with open_driver(url) as driver:
        main = Migrator(driver)
        line = Migrator(driver, line=LINE_RIVER_ANYIO)
        assert [(m.version, m.name) for m in line.all_versions()][:1] == [
            (1, "create_river_anyio_lease")
        ]
        with pytest.raises(river.MigrationError, match="fully migrate the main migration line"):
            await line.up()
        await main.up()
        assert not (await line.validate()).ok
        assert [v.version for v in (await line.up(target_version=1)).versions] == [1]
        assert (await line.validate(target_version=1)).ok and (await main.validate()).ok
        assert await driver.executor().table_exists("river_anyio_lease")
        with_line = await describe(url)
        assert ["river_anyio", 1] in with_line["river_migration"]
        assert _without_line_river_anyio(with_line) == expected(d, LATEST)
        assert [(e.line, e.version) for e in await line.existing_versions()] == [("river_anyio", 1)]
        assert [v.version for v in (await line.down(target_version=0)).versions] == [1]
        assert not await driver.executor().table_exists("river_anyio_lease")
        assert await line.existing_versions() == []
        assert await describe(url) == expected(d, LATEST)


async def test_racing_migrators_apply_each_version_once(empty_database_url: str) -> None:
    results: list[list[int]] = []

    async def migrate() -> None:
        async with open_driver(empty_database_url) as driver:
            res = await Migrator(driver).up()
            results.append([v.version for v in res.versions])

    async with anyio.create_task_group() as tg:
        tg.start_soon(migrate)
        tg.start_soon(migrate)
    applied = sorted(v for r in results for v in r)
    assert applied == list(range(1, LATEST + 1))
    async with open_driver(empty_database_url) as driver:
        existing = await Migrator(driver).existing_versions()
    assert [e.version for e in existing] == list(range(1, LATEST + 1))
    assert await describe(empty_database_url) == expected(dialect(empty_database_url), LATEST)


async def test_river_migration_rows_match_rivers_shape(empty_database_url: str) -> None:
    async with open_driver(empty_database_url) as driver:
        m = Migrator(driver)
        await m.up(target_version=4)
        rows = await driver.executor().fetch_all("SELECT version FROM river_migration ORDER BY 1")
        assert [r[0] for r in rows] == [1, 2, 3, 4]
        assert not await driver.executor().column_exists("river_migration", "line")
        await m.up()
        rows = await driver.executor().fetch_all(
            "SELECT line, version, created_at FROM river_migration ORDER BY version"
        )
    assert [(r[0], r[1]) for r in rows] == [("main", v) for v in range(1, LATEST + 1)]
    assert all(r[2] is not None for r in rows)


async def test_a_client_start_without_migrations_names_the_fix(empty_database_url: str) -> None:
    """One MigrationError, not "no such table" from a service; it gives the command to run
    (a SQLite file by its absolute path; any password redacted)."""
    workers = river.Workers()
    with pytest.raises(river.MigrationError) as info:
        async with river.open_client(empty_database_url, workers=workers):
            pytest.fail("the body must not run")
    message = str(info.value)
    assert "the database has no River schema: run river-anyio migrate-up --database-url " in message
    assert "\n" not in message
    if empty_database_url.startswith("sqlite:"):
        assert empty_database_url in message  # the fixture's URL is already absolute
    # part of the schema: the versions still to apply are named
    async with open_driver(empty_database_url) as driver:
        await Migrator(driver).migrate("up", target_version=LATEST - 2)
    with pytest.raises(river.MigrationError, match=rf"migrations {LATEST - 1:03d}, {LATEST:03d}"):
        async with river.open_client(empty_database_url, workers=workers):
            pytest.fail("the body must not run")
    async with open_driver(empty_database_url) as driver:
        await Migrator(driver).up()
        # a driver passed in is checked the same way, and a current schema starts
        async with river.open_client(driver, workers=workers):
            pass


async def test_the_fix_redacts_the_password() -> None:
    from river_anyio.migrate._migrator import require_schema

    class Unmigrated:
        dialect = "postgres"
        schema = "river"

        def transaction(self) -> Any:
            return self

        async def __aenter__(self) -> Any:
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

        async def table_exists(self, name: str) -> bool:
            return False

    with pytest.raises(river.MigrationError) as info:
        await require_schema(
            Unmigrated(),  # type: ignore[arg-type]
            database_url="postgres://river:s3cretPW@db.example/app",
        )
    assert "'postgres://river:***@db.example/app' --schema river" in str(info.value)
    assert "s3cretPW" not in str(info.value)
