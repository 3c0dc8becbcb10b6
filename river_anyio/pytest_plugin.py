"""pytest fixtures for applications that use river_anyio, registered through ``pytest11``.

Every fixture is function-scoped and async, written against AnyIO, so it runs under AnyIO's
pytest plugin (in tests marked ``anyio``, on the ``anyio_backend`` in use) and under
pytest-trio alike:

``river_sqlite_database`` / ``river_postgres_database`` / ``river_database``
    A :class:`~river_anyio.testing.MigratedDatabase`: a new SQLite file in ``tmp_path``; a new
    schema in the PostgreSQL database given by ``--river-database-url`` (or the
    ``RIVER_TEST_DATABASE_URL`` environment variable; tests skip without one), dropped
    afterwards; and ``river_database``, PostgreSQL when a URL is given, else SQLite.
``river_sqlite_client`` / ``river_postgres_client`` / ``river_client``
    A :class:`~river_anyio.Client` (inserting only) on the matching database.
``river_running_client``
    A :class:`~river_anyio.ClientRun` on ``river_database`` working the ``default`` queue
    with the workers of the ``river_workers`` fixture (override it), stopped gracefully
    after the test.

Override ``river_workers`` (a :class:`~river_anyio.Workers`), ``river_client_options``
(extra ``open_client`` options for every client fixture; ``queues`` replaces the running
client's default queue) or ``river_postgres_url`` (where the PostgreSQL URL comes from) in
your ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from river_anyio import Client, ClientRun, Workers
    from river_anyio.testing import MigratedDatabase

URL_OPTION = "--river-database-url"
URL_ENV = "RIVER_TEST_DATABASE_URL"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("river_anyio")
    group.addoption(
        URL_OPTION,
        dest="river_database_url",
        default=None,
        metavar="URL",
        help=(
            "PostgreSQL database for the river_postgres_* fixtures (each test gets a schema "
            f"of its own in it); default: ${URL_ENV}"
        ),
    )


@pytest.fixture(scope="session")
def river_postgres_url(pytestconfig: pytest.Config) -> str | None:
    """The PostgreSQL URL the ``river_postgres_*`` fixtures use, or None."""
    url = pytestconfig.getoption("river_database_url") or os.environ.get(URL_ENV) or None
    return str(url) if url else None


@pytest.fixture
def river_workers() -> Workers:
    """The workers of ``river_running_client``: override this fixture to register yours."""
    from river_anyio import Workers

    return Workers()


@pytest.fixture
def river_client_options() -> dict[str, Any]:
    """Extra ``open_client`` options for every client fixture (override to set them)."""
    return {}


def _sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "river.sqlite3"


@contextlib.asynccontextmanager
async def _postgres(url: str | None) -> AsyncIterator[MigratedDatabase]:
    from river_anyio.testing import postgres_test_schema

    if url is None:
        pytest.skip(f"no PostgreSQL database: pass {URL_OPTION} or set {URL_ENV}")
    async with postgres_test_schema(url) as db:
        yield db


@contextlib.asynccontextmanager
async def _sqlite(tmp_path: Path) -> AsyncIterator[MigratedDatabase]:
    from river_anyio.testing import sqlite_test_database

    async with sqlite_test_database(_sqlite_path(tmp_path)) as db:
        yield db


@pytest.fixture
async def river_sqlite_database(tmp_path: Path) -> AsyncIterator[MigratedDatabase]:
    """A new, migrated SQLite file for this test."""
    async with _sqlite(tmp_path) as db:
        yield db


@pytest.fixture
async def river_postgres_database(
    river_postgres_url: str | None,
) -> AsyncIterator[MigratedDatabase]:
    """A new, migrated schema in the configured PostgreSQL database, dropped afterwards."""
    async with _postgres(river_postgres_url) as db:
        yield db


@pytest.fixture
async def river_database(
    river_postgres_url: str | None, tmp_path: Path
) -> AsyncIterator[MigratedDatabase]:
    """PostgreSQL (a schema of its own) when a URL is configured, else a SQLite file."""
    source = _postgres(river_postgres_url) if river_postgres_url else _sqlite(tmp_path)
    async with source as db:
        yield db


@contextlib.asynccontextmanager
async def _client(db: MigratedDatabase, options: dict[str, Any]) -> AsyncIterator[Client]:
    async with db.open_client(**options) as run:
        yield run.client


@pytest.fixture
async def river_sqlite_client(
    river_sqlite_database: MigratedDatabase, river_client_options: dict[str, Any]
) -> AsyncIterator[Client]:
    """A client (inserting only) on a new SQLite database."""
    async with _client(river_sqlite_database, river_client_options) as client:
        yield client


@pytest.fixture
async def river_postgres_client(
    river_postgres_database: MigratedDatabase, river_client_options: dict[str, Any]
) -> AsyncIterator[Client]:
    """A client (inserting only) on a new PostgreSQL schema."""
    async with _client(river_postgres_database, river_client_options) as client:
        yield client


@pytest.fixture
async def river_client(
    river_database: MigratedDatabase, river_client_options: dict[str, Any]
) -> AsyncIterator[Client]:
    """A client (inserting only) on ``river_database``."""
    async with _client(river_database, river_client_options) as client:
        yield client


@pytest.fixture
async def river_running_client(
    river_database: MigratedDatabase,
    river_workers: Workers,
    river_client_options: dict[str, Any],
) -> AsyncIterator[ClientRun]:
    """A client working the ``default`` queue (10 at a time) with ``river_workers``."""
    from river_anyio import QueueConfig

    if len(river_workers) == 0 and "workers" not in river_client_options:
        raise pytest.UsageError(
            "river_running_client needs workers: override the river_workers fixture "
            "(return a river_anyio.Workers with your workers registered)"
        )
    options = {
        "queues": {"default": QueueConfig(max_workers=10)},
        "workers": river_workers,
        **river_client_options,
    }
    async with river_database.open_client(**options) as run:
        yield run
