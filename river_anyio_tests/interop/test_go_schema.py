"""Schema interop with River Go: each side's migrations are current for the other, and
migrating down with one and up with the other gives back the same schema."""

from __future__ import annotations

import io
import re
import subprocess

import pytest

from river_anyio._cli import main as cli_main

from ..migrate.introspect import describe_postgres, describe_sqlite
from ..migrate.test_migrator import LATEST
from ._river_go import GO_DIR, RIVER_VERSION, RiverGo

ALL = list(range(1, LATEST + 1))


def describe(url: str) -> object:
    if url.startswith("sqlite:"):
        import apsw

        from river_anyio.drivers.sqlite import path_from_url

        conn = apsw.Connection(path_from_url(url))
        try:
            return describe_sqlite(conn)
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url) as conn:
        return describe_postgres(conn, "public")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``river-anyio ARGS`` (in this process: the command line's own entry point)."""
    out, err = io.StringIO(), io.StringIO()
    rc = cli_main(list(args), stdout=out, stderr=err)
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


def assert_current_for_river_anyio(url: str) -> None:
    validate = cli("validate", "--database-url", url)
    assert validate.returncode == 0, validate.stderr
    listed = cli("migrate-list", "--database-url", url)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert [int(line[2:5]) for line in lines] == ALL
    assert [line[:2] for line in lines] == ["  "] * (LATEST - 1) + ["* "]


def assert_current_for_go(river_go: RiverGo, url: str) -> None:
    assert river_go.call_sync("validate", url) == {"ok": True, "messages": []}
    assert river_go.call_sync("versions", url) == {"versions": ALL}


def test_program_is_pinned_to_the_expected_river_release() -> None:
    gomod = (GO_DIR / "go.mod").read_text()
    for module in ("river", "river/riverdriver/riverpgxv5", "river/riverdriver/riversqlite"):
        assert re.search(rf"github\.com/riverqueue/{module} {RIVER_VERSION}\n", gomod), module
    assert "modernc.org/sqlite " in gomod and "github.com/jackc/pgx/v5 " in gomod


@pytest.fixture(params=["postgres", "sqlite"])
def empty_and_migrated(request: pytest.FixtureRequest) -> tuple[str, str]:
    """An empty database and one migrated by river_anyio, on the same backend."""
    if request.param == "postgres":
        return request.getfixturevalue("pg_empty_url"), request.getfixturevalue("pg_url")
    return request.getfixturevalue("sqlite_empty_url"), request.getfixturevalue("sqlite_url")


def test_database_migrated_by_go_is_current_for_river_anyio(
    river_go: RiverGo, empty_and_migrated: tuple[str, str]
) -> None:
    url, database_url = empty_and_migrated
    out = river_go.call_sync("migrate", url, "-direction", "up")
    assert out == {"applied": ALL, "versions": ALL}
    assert_current_for_river_anyio(url)
    # ... and it is the very schema river_anyio builds (database_url: migrated by river_anyio)
    assert describe(url) == describe(database_url)


def test_database_migrated_by_river_anyio_is_current_for_go(
    river_go: RiverGo, database_url: str
) -> None:
    assert_current_for_go(river_go, database_url)
    # nothing left for River Go to apply
    assert river_go.call_sync("migrate", database_url, "-direction", "up") == {
        "applied": [],
        "versions": ALL,
    }


@pytest.mark.parametrize("target", [0, 1, 4, 6, LATEST - 1])
def test_down_with_go_up_with_river_anyio(
    river_go: RiverGo, database_url: str, target: int
) -> None:
    url = database_url
    fresh = describe(url)
    out = river_go.call_sync(
        "migrate", url, "-direction", "down", "-target-version", str(target or -1)
    )
    assert out == {"applied": list(range(LATEST, target, -1)), "versions": ALL[:target]}
    bad = cli("validate", "--database-url", url)
    assert bad.returncode == 1, "river_anyio must see the missing versions"
    up = cli("migrate-up", "--database-url", url)
    assert up.returncode == 0, up.stderr
    assert_current_for_river_anyio(url)
    assert_current_for_go(river_go, url)
    assert describe(url) == fresh  # the whole catalogue, not just the version list


@pytest.mark.parametrize("target", [0, 1, 4, 6, LATEST - 1])
def test_down_with_river_anyio_up_with_go(
    river_go: RiverGo, database_url: str, target: int
) -> None:
    url = database_url
    fresh = describe(url)
    down = cli("migrate-down", "--database-url", url, "--target-version", str(target))
    assert down.returncode == 0, down.stderr
    assert river_go.call_sync("validate", url)["ok"] is False
    out = river_go.call_sync("migrate", url, "-direction", "up")
    assert out == {"applied": list(range(target + 1, LATEST + 1)), "versions": ALL}
    assert_current_for_river_anyio(url)
    assert_current_for_go(river_go, url)
    assert describe(url) == fresh  # the whole catalogue, not just the version list


def test_river_go_leaves_line_river_anyio_alone(river_go: RiverGo, database_url: str) -> None:
    """River Go's migrator reads only line main: a database that also has river_anyio's own
    line (leases, queue limits) is current for River Go, and River Go migrating main down and up
    again leaves that line's row and table in place."""
    url = database_url
    up = cli("migrate-up", "--line", "river_anyio", "--database-url", url)
    assert up.returncode == 0, up.stderr
    assert_current_for_go(river_go, url)
    out = river_go.call_sync("migrate", url, "-direction", "down", "-target-version", "6")
    assert out == {"applied": list(range(LATEST, 6, -1)), "versions": ALL[:6]}
    out = river_go.call_sync("migrate", url, "-direction", "up")
    assert out == {"applied": list(range(7, LATEST + 1)), "versions": ALL}
    listed = cli("migrate-list", "--line", "river_anyio", "--database-url", url)
    assert listed.stdout == "  001 create_river_anyio_lease\n* 002 create_river_anyio_queue_limit\n"
    assert cli("validate", "--line", "river_anyio", "--database-url", url).returncode == 0
    assert_current_for_river_anyio(url)
