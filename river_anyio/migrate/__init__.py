"""River schema migrations for PostgreSQL and SQLite (``river_anyio.migrate``).

The SQL ships inside the package and produces exactly River's schema, version by version, so
databases migrated by River Go and by river_anyio are interchangeable::

    async with river_anyio.drivers.open_driver(url) as driver:
        result = await Migrator(driver).up()
"""

from __future__ import annotations

from ._migrator import (
    LINE_MAIN,
    LINE_RIVER_ANYIO,
    AppliedMigration,
    MigrateResult,
    MigrateVersion,
    Migration,
    Migrator,
    ValidateResult,
    all_migrations,
    migration_sql,
)

__all__ = (
    "LINE_MAIN",
    "LINE_RIVER_ANYIO",
    "AppliedMigration",
    "MigrateResult",
    "MigrateVersion",
    "Migration",
    "Migrator",
    "ValidateResult",
    "all_migrations",
    "migration_sql",
)
