"""Test fixtures: both event loops, a real PostgreSQL server and real SQLite files.

PostgreSQL: ``RIVER_ANYIO_TEST_DATABASE_URL`` (a server URL whose user may create databases)
when set; otherwise a throwaway cluster is started with ``initdb``/``pg_ctl`` found on PATH or
under ``/usr/lib/postgresql/*/bin``, in a temporary directory on a free port, and removed at the
end. Every test gets its own database cloned from a template migrated once per session.
Without PostgreSQL binaries the PostgreSQL tests skip with one loud line, unless
``RIVER_ANYIO_REQUIRE_POSTGRES=1`` (CI), which turns that into an error.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TEMPLATE_DB = "river_anyio_template"
TEMPLATE_SCHEMA_DB = "river_anyio_template_schema"
CUSTOM_SCHEMA = "river_custom"

#: The suite that runs the pytest plugin's fixtures under pytest-trio: collected only in its own
#: pytest run with ``-p trio`` (the main suite runs with ``-p no:trio``).
PYTEST_TRIO_SUITE = "pytest_trio_compat"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.name == PYTEST_TRIO_SUITE and not config.pluginmanager.has_plugin("trio"):
        return True
    return None


@pytest.fixture(scope="session", params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def no_blocking_calls_in_river_anyio(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail any test in which river_anyio's own code blocks the event loop (file, socket,
    sleep, lock calls on the loop thread). blockbuster sees the asyncio loop; the same code
    paths run under trio."""
    if "anyio_backend" not in request.fixturenames:
        yield
        return
    from blockbuster import blockbuster_ctx

    with blockbuster_ctx("river_anyio", excluded_modules=["river_anyio_tests"]):
        yield


# --------------------------------------------------------------------------------------------
# PostgreSQL server


def _find_pg_bin() -> Path | None:
    for name in ("initdb", "pg_ctl"):
        if shutil.which(name) is None:
            break
    else:
        return Path(shutil.which("initdb")).resolve().parent  # type: ignore[arg-type]
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    return Path(candidates[-1]).parent if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as(user: pwd.struct_passwd | None) -> dict[str, Any]:
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid}


@contextlib.contextmanager
def _throwaway_cluster(bindir: Path, *, max_connections: int = 200) -> Iterator[str]:
    tmp = Path(tempfile.mkdtemp(prefix="river_anyio_pg_"))
    user: pwd.struct_passwd | None = None
    if os.geteuid() == 0:
        # PostgreSQL refuses to run as root: run it as the postgres (or nobody) account.
        for name in ("postgres", "nobody"):
            with contextlib.suppress(KeyError):
                user = pwd.getpwnam(name)
                break
        assert user is not None, "running as root and no postgres/nobody account exists"
        os.chown(tmp, user.pw_uid, user.pw_gid)
    data = tmp / "data"
    port = _free_port()
    env = {**os.environ, "LC_ALL": "C"}
    subprocess.run(
        [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
         "-E", "UTF8", "--no-sync", "--no-instructions"],
        check=True, capture_output=True, cwd=tmp, env=env, **_run_as(user),
    )  # fmt: skip
    opts = (
        f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c fsync=off "
        f"-c synchronous_commit=off -c full_page_writes=off -c max_connections={max_connections}"
    )
    subprocess.run(
        [str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(tmp / "log"), "-w", "start"],
        check=True, capture_output=True, cwd=tmp, env=env, **_run_as(user),
    )  # fmt: skip
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True, cwd=tmp, env=env, **_run_as(user),
        )  # fmt: skip
        shutil.rmtree(tmp, ignore_errors=True)


def _migrate_cli(url: str, *extra: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "river_anyio", "migrate-up", "--database-url", url, *extra],
        capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"migrate-up failed for test template: {proc.stderr or proc.stdout}")


def _db_url(server_url: str, dbname: str) -> str:
    """The server URL pointed at another database (query parameters kept)."""
    parts = urllib.parse.urlsplit(server_url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError("RIVER_ANYIO_TEST_DATABASE_URL must be a postgres:// or postgresql:// URL")
    return urllib.parse.urlunsplit(parts._replace(path="/" + dbname))


def _pg_skip_reason() -> str | None:
    """Why the PostgreSQL tests are skipped, or None when there is a server to use. Computed
    the same in every process (pytest-xdist's workers and the one that reports)."""
    if os.environ.get("RIVER_ANYIO_TEST_DATABASE_URL") or _find_pg_bin() is not None:
        return None
    return (
        "PostgreSQL tests SKIPPED: RIVER_ANYIO_TEST_DATABASE_URL is unset and no initdb/pg_ctl "
        "was found on PATH or under /usr/lib/postgresql/*/bin"
    )


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str | None]:
    """The admin URL of a PostgreSQL server, or None when there is none to use."""
    url = os.environ.get("RIVER_ANYIO_TEST_DATABASE_URL")
    if url:
        yield url
        return
    bindir = _find_pg_bin()
    if bindir is None:
        yield None
        return
    with _throwaway_cluster(bindir) as url:
        yield url


@pytest.fixture(scope="session")
def pg_template(pg_server: str | None) -> Iterator[str]:
    """Name of a template database migrated once with ``river-anyio migrate-up``."""
    if pg_server is None:
        if os.environ.get("RIVER_ANYIO_REQUIRE_POSTGRES") == "1":
            pytest.fail(_pg_skip_reason() or "PostgreSQL required but unavailable")
        pytest.skip(_pg_skip_reason() or "no PostgreSQL")
    import psycopg

    suffix = f"_{os.getpid()}"
    tpl = TEMPLATE_DB + suffix
    tpl_schema = TEMPLATE_SCHEMA_DB + suffix
    with psycopg.connect(pg_server, autocommit=True) as conn:
        for name in (tpl, tpl_schema):
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
    _migrate_cli(_db_url(pg_server, tpl))
    with psycopg.connect(_db_url(pg_server, tpl_schema), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{CUSTOM_SCHEMA}"')
    _migrate_cli(_db_url(pg_server, tpl_schema), "--schema", CUSTOM_SCHEMA)
    yield tpl
    with psycopg.connect(pg_server, autocommit=True) as conn:
        for name in (tpl, tpl_schema):
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_db_counter = itertools.count()


@contextlib.contextmanager
def _cloned_db(server: str, template: str) -> Iterator[str]:
    import psycopg

    name = f"river_anyio_t{os.getpid()}_{next(_db_counter)}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        yield _db_url(server, name)
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_server: str | None, pg_template: str) -> Iterator[str]:
    """A fresh PostgreSQL database with River's schema (public), for this test only."""
    assert pg_server is not None
    with _cloned_db(pg_server, pg_template) as url:
        yield url


@pytest.fixture
def pg_schema_url(pg_server: str | None, pg_template: str) -> Iterator[str]:
    """A fresh database whose River schema lives in the custom schema ``CUSTOM_SCHEMA``."""
    assert pg_server is not None
    with _cloned_db(pg_server, pg_template.replace(TEMPLATE_DB, TEMPLATE_SCHEMA_DB)) as url:
        yield url


@pytest.fixture
def pg_empty_url(pg_server: str | None) -> Iterator[str]:
    """A fresh, empty PostgreSQL database (for migration tests)."""
    if pg_server is None:
        if os.environ.get("RIVER_ANYIO_REQUIRE_POSTGRES") == "1":
            pytest.fail(_pg_skip_reason() or "PostgreSQL required but unavailable")
        pytest.skip(_pg_skip_reason() or "no PostgreSQL")
    with _cloned_db(pg_server, "template0") as url:
        yield url


# --------------------------------------------------------------------------------------------
# SQLite


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite_template") / "river.sqlite3"
    _migrate_cli(f"sqlite://{path}")
    return path


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """A fresh SQLite file with River's schema, for this test only."""
    path = tmp_path / "river.sqlite3"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite://{path}"


@pytest.fixture
def sqlite_empty_url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'empty.sqlite3'}"


# --------------------------------------------------------------------------------------------
# both


@pytest.fixture(params=["postgres", "sqlite"])
def database_url(request: pytest.FixtureRequest) -> str:
    """A fresh, migrated database on each backend."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return str(request.getfixturevalue("sqlite_url"))


@pytest.fixture(params=["postgres", "sqlite"])
def empty_database_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty database on each backend."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_empty_url"))
    return str(request.getfixturevalue("sqlite_empty_url"))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    reason = _pg_skip_reason()
    if reason:
        terminalreporter.write_line("!" * 20 + " " + reason + " " + "!" * 20, red=True)
