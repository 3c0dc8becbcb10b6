"""Throwaway migrated databases for tests: a SQLite file, or a PostgreSQL schema of its own."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Unpack

import anyio
import attrs

from .._config import Config, ConfigOptions
from .._runtime._entry import open_client
from .._runtime._supervisor import ClientRun
from ..drivers import dialect_of_url, open_driver
from ..migrate import Migrator
from ..migrate._migrator import AUTO_LINES

__all__ = ["MigratedDatabase", "postgres_test_schema", "sqlite_test_database"]

#: How long dropping a test schema may take before it is left behind (it is named
#: ``river_test_*``, so it is easy to find).
_DROP_TIMEOUT = 30.0


@attrs.frozen(kw_only=True)
class MigratedDatabase:
    """A database with River's schema (and line river_anyio's tables): its URL and, on PostgreSQL, the schema holding the
    tables (pass both to :func:`~river_anyio.open_client`, or use :meth:`open_client`)."""

    url: str
    schema: str | None = None

    def open_client(
        self, config: Config | None = None, **options: Unpack[ConfigOptions]
    ) -> AbstractAsyncContextManager[ClientRun]:
        """``open_client`` on this database (``schema`` filled in unless given)."""
        given = "schema" in options or (config is not None and config.schema is not None)
        if self.schema is not None and not given:
            options["schema"] = self.schema
        return open_client(self.url, config, **options)


async def _migrate(url: str, schema: str | None) -> None:
    """Lines main and river_anyio, as ``auto_migrate`` installs them (leases work)."""
    async with open_driver(url, schema=schema) as driver:
        for line in AUTO_LINES:
            await Migrator(driver, line=line).up()


@contextlib.asynccontextmanager
async def sqlite_test_database(path: str | os.PathLike[str]) -> AsyncIterator[MigratedDatabase]:
    """A new SQLite file at ``path`` (which must not exist), migrated; left in place on exit
    (put it in a temporary directory)."""
    file = Path(path)
    if await anyio.Path(file).exists():
        raise FileExistsError(f"{file} exists; sqlite_test_database makes a new database")
    url = f"sqlite://{file}"
    await _migrate(url, None)
    yield MigratedDatabase(url=url)


@contextlib.asynccontextmanager
async def postgres_test_schema(url: str) -> AsyncIterator[MigratedDatabase]:
    """A new schema ``river_test_<random>`` in the PostgreSQL database at ``url``, migrated,
    and dropped (with everything in it) on exit. Tests sharing one database stay isolated,
    notifications included (River's channels are named after the schema). The user needs
    the CREATE privilege on the database."""
    if dialect_of_url(url) != "postgres":
        raise ValueError("postgres_test_schema needs a postgres:// or postgresql:// URL")
    schema = f"river_test_{secrets.token_hex(6)}"
    async with open_driver(url) as admin:
        await admin.executor().exec_script(f'CREATE SCHEMA "{schema}"')
        try:
            await _migrate(url, schema)
            yield MigratedDatabase(url=url, schema=schema)
        finally:
            with anyio.move_on_after(_DROP_TIMEOUT, shield=True):
                await admin.executor().exec_script(f'DROP SCHEMA "{schema}" CASCADE')
