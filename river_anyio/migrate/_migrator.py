"""River's schema migrations, applied the way River's own migrator applies them.

Each version runs in its own transaction together with the insert or delete of its
``river_migration`` row, so a database migrated by River Go or by river_anyio is current for
both. Unlike River Go, concurrent migrators are serialised: each version's transaction takes an
advisory lock (PostgreSQL) or is ``BEGIN IMMEDIATE`` (SQLite) and re-reads the applied versions
before doing anything, so two racing migrators apply each version exactly once.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import logging
import re
import shlex
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Literal

import attrs

from .._errors import MigrationError, ValidationError
from ..drivers import Dialect, Driver, Executor, redact_url

__all__ = [
    "AUTO_LINES",
    "LINE_MAIN",
    "LINE_RIVER_ANYIO",
    "AppliedMigration",
    "MigrateResult",
    "MigrateVersion",
    "Migration",
    "Migrator",
    "ValidateResult",
    "all_migrations",
    "migrate_up_command",
    "migration_sql",
    "quote_schema",
    "require_schema",
]

logger = logging.getLogger("river_anyio.migrate")

LINE_MAIN = "main"
#: river_anyio's own tables (leases, ...), a line River Go's migrator leaves alone.
LINE_RIVER_ANYIO = "river_anyio"
#: The lines ``auto_migrate`` installs, in order (line river_anyio needs main's
#: ``river_migration.line`` column).
AUTO_LINES = (LINE_MAIN, LINE_RIVER_ANYIO)
#: River's placeholder in our SQL files, replaced by ``"schema".`` or nothing.
SCHEMA_PLACEHOLDER = "/*river:schema*/"
_VERSION_TABLE_ADDED = 1
_VERSION_LINE_COLUMN_ADDED = 5
_FILE_RE = re.compile(r"^(?P<version>\d{3})_(?P<name>[a-z0-9_]+)\.(?P<dir>up|down)\.sql$")
_SCHEMA_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

Direction = Literal["up", "down"]


@attrs.frozen(kw_only=True)
class Migration:
    """One version of a migration line: its number, name and SQL (schema placeholder intact)."""

    version: int
    name: str
    sql_up: str = attrs.field(repr=False)
    sql_down: str = attrs.field(repr=False)


@attrs.frozen(kw_only=True)
class MigrateVersion:
    """A version a migrate call applied (or, in a dry run, would apply), with the SQL run."""

    version: int
    name: str
    sql: str = attrs.field(repr=False)
    duration: float


@attrs.frozen(kw_only=True)
class MigrateResult:
    """What ``up`` or ``down`` did: its direction and the versions applied, in order (none
    when the database was already at the target)."""

    direction: Direction
    versions: tuple[MigrateVersion, ...]


@attrs.frozen(kw_only=True)
class AppliedMigration:
    """A ``river_migration`` row."""

    line: str
    version: int
    created_at: object


@attrs.frozen(kw_only=True)
class ValidateResult:
    """What ``validate`` found: ``ok`` when no migration is pending, else the ``missing``
    versions and River's ``messages`` about them."""

    ok: bool
    missing: tuple[int, ...] = ()
    messages: tuple[str, ...] = ()


def _sql_root() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "_sql", here.parents[1] / "migrations"):
        if candidate.is_dir():
            return candidate
    raise MigrationError(
        "river_anyio's migration SQL files are missing from this installation "
        f"(looked in {here / '_sql'} and {here.parents[1] / 'migrations'})"
    )


def _read_line(directory: Path) -> tuple[Migration, ...]:
    found: dict[int, dict[str, str]] = {}
    names: dict[int, str] = {}
    for path in directory.iterdir():
        m = _FILE_RE.match(path.name)
        if m is None:
            continue
        version = int(m["version"])
        if names.setdefault(version, m["name"]) != m["name"]:
            raise MigrationError(f"two names for migration version {version} in {directory}")
        found.setdefault(version, {})[m["dir"]] = path.read_text(encoding="utf-8")
    migrations = []
    for expected, version in enumerate(sorted(found), start=1):
        if version != expected:
            raise MigrationError(
                f"migration versions in {directory} are not contiguous at {expected}"
            )
        parts = found[version]
        if set(parts) != {"up", "down"}:
            raise MigrationError(f"migration {version:03d} in {directory} lacks an up or down file")
        migrations.append(
            Migration(
                version=version, name=names[version], sql_up=parts["up"], sql_down=parts["down"]
            )
        )
    return tuple(migrations)


@cache
def _catalog() -> dict[tuple[str, str], tuple[Migration, ...]]:
    """Every shipped migration line of every backend, read once.

    Loaded at import so that migrating never does file I/O on the event loop.
    """
    root = _sql_root()
    return {
        (dialect_dir.name, line_dir.name): _read_line(line_dir)
        for dialect_dir in sorted(root.iterdir())
        if dialect_dir.is_dir()
        for line_dir in sorted(dialect_dir.iterdir())
        if line_dir.is_dir()
    }


def all_migrations(dialect: Dialect, line: str = LINE_MAIN) -> tuple[Migration, ...]:
    """Every version of ``line`` for a backend, in ascending order."""
    catalog = _catalog()
    if (dialect, line) in catalog:
        return catalog[(dialect, line)]
    known = sorted(name for d, name in catalog if d == dialect)
    close = difflib.get_close_matches(line, known, n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    raise MigrationError(f"migration line does not exist: {line}{hint}")


# A broken installation is reported when a migration is first asked for, not at import.
with contextlib.suppress(MigrationError):
    _catalog()


def quote_schema(schema: str | None) -> str:
    """``"schema".`` for a valid schema name, ``""`` for none; anything else is rejected."""
    if schema is None or schema == "":
        return ""
    if not isinstance(schema, str) or not _SCHEMA_RE.match(schema) or len(schema) > 46:
        raise ValidationError(
            "schema",
            "must match ^[a-zA-Z_][a-zA-Z0-9_]*$ and be at most 46 characters",
            schema,
        )
    return '"' + schema.replace('"', '""') + '".'


def migration_sql(
    dialect: Dialect,
    versions: Iterable[int],
    direction: Direction,
    *,
    schema: str | None = None,
    line: str = LINE_MAIN,
) -> list[tuple[Migration, str]]:
    """The SQL of the given versions with the schema substituted (no database needed)."""
    prefix = quote_schema(schema)
    by_version = {m.version: m for m in all_migrations(dialect, line)}
    out = []
    for v in versions:
        if v not in by_version:
            raise MigrationError(f"version {v} is not a valid River migration version")
        m = by_version[v]
        text = m.sql_up if direction == "up" else m.sql_down
        out.append((m, text.replace(SCHEMA_PLACEHOLDER, prefix)))
    return out


class Migrator:
    """Applies, lists and validates one migration line on a driver's database.

    ``target_version`` keeps River's meaning: the final state includes that version and none
    after it. Going down, ``target_version=0`` (or River's ``-1``) removes everything; with no target and no
    ``max_steps`` a down migration takes one step, as River's does.
    """

    def __init__(self, driver: Driver, *, line: str = LINE_MAIN) -> None:
        if not isinstance(line, str) or not line:
            raise ValidationError("line", "must be a non-empty string", line)
        self._driver = driver
        self._line = line
        self._migrations = all_migrations(driver.dialect, line)
        self._prefix = quote_schema(driver.schema)

    @property
    def line(self) -> str:
        return self._line

    def all_versions(self) -> tuple[Migration, ...]:
        return self._migrations

    def get_version(self, version: int) -> Migration:
        for m in self._migrations:
            if m.version == version:
                return m
        raise MigrationError(f"version {version} is not a valid River migration version")

    def _table(self) -> str:
        return f"{self._prefix}river_migration"

    def _ph(self) -> str:
        return "%s" if self._driver.dialect == "postgres" else "?"

    async def _existing(self, ex: Executor) -> list[AppliedMigration]:
        if not await ex.table_exists("river_migration"):
            if self._line != LINE_MAIN:
                raise MigrationError(
                    "can't add a non-main migration line until river_migration is raised; "
                    "fully migrate the main migration line and try again"
                )
            return []
        if not await ex.column_exists("river_migration", "line"):
            if self._line != LINE_MAIN:
                raise MigrationError(
                    "can't add a non-main migration line until river_migration.line is raised; "
                    "fully migrate the main migration line and try again"
                )
            rows = await ex.fetch_all(
                f"SELECT version, created_at FROM {self._table()} ORDER BY version"
            )
            return [AppliedMigration(line=LINE_MAIN, version=int(v), created_at=c) for v, c in rows]
        rows = await ex.fetch_all(
            f"SELECT version, created_at FROM {self._table()} WHERE line = {self._ph()} "
            "ORDER BY version",
            (self._line,),
        )
        return [AppliedMigration(line=self._line, version=int(v), created_at=c) for v, c in rows]

    async def existing_versions(self) -> list[AppliedMigration]:
        """The versions of this line recorded in ``river_migration``, ascending."""
        async with self._driver.transaction() as tx:
            return await self._existing(tx)

    @contextlib.asynccontextmanager
    async def _serialized(self) -> AsyncIterator[None]:
        """Hold off other river_anyio migrators of this schema for the whole run.

        PostgreSQL: an advisory lock held by a transaction on its own connection, taken before
        anything is read, so every later transaction starts after the lock is ours and sees
        what a previous migrator committed (a lock taken inside the version's transaction
        can leave that backend's catalog cache stale). SQLite: each version's transaction is
        ``BEGIN IMMEDIATE`` and re-reads the applied versions, which is enough.
        """
        if self._driver.dialect != "postgres":
            yield
            return
        digest = hashlib.sha256(f"river_anyio.migrate:{self._prefix}".encode()).digest()
        key = int.from_bytes(digest[:8], "big", signed=True)
        async with self._driver.transaction() as lock:
            await lock.fetch_all("SELECT pg_advisory_xact_lock(%s)", (key,))
            yield

    async def _record(self, ex: Executor, direction: Direction, version: int) -> None:
        ph = self._ph()
        main = self._line == LINE_MAIN
        if direction == "up":
            if main and version < _VERSION_LINE_COLUMN_ADDED:
                await ex.execute(f"INSERT INTO {self._table()} (version) VALUES ({ph})", (version,))
            else:
                await ex.execute(
                    f"INSERT INTO {self._table()} (line, version) VALUES ({ph}, {ph})",
                    (self._line, version),
                )
            return
        if main and version <= _VERSION_TABLE_ADDED:
            return  # the down migration dropped river_migration itself
        if main and version <= _VERSION_LINE_COLUMN_ADDED:
            await ex.execute(f"DELETE FROM {self._table()} WHERE version = {ph}", (version,))
        else:
            await ex.execute(
                f"DELETE FROM {self._table()} WHERE line = {ph} AND version = {ph}",
                (self._line, version),
            )

    def _plan(
        self,
        direction: Direction,
        applied: set[int],
        target_version: int | None,
        max_steps: int | None,
    ) -> list[Migration]:
        known = {m.version for m in self._migrations}
        if direction == "up":
            targets = [m for m in self._migrations if m.version not in applied]
        else:
            targets = [m for m in reversed(self._migrations) if m.version in applied]
        if target_version is not None:
            if isinstance(target_version, bool) or not isinstance(target_version, int):
                raise ValidationError("target_version", "must be an int", target_version)
            if target_version == -1 and direction == "down":
                target_version = 0  # River's way of saying "every version"
            if target_version == 0 and direction == "up":
                raise ValidationError(
                    "target_version", "must be a version number (1 or more) when migrating up", 0
                )
            if target_version != 0 and target_version not in known:
                raise MigrationError(
                    f"version {target_version} is not a valid River migration version"
                )
        if max_steps is not None and (
            isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1
        ):
            raise ValidationError("max_steps", "must be a positive int", max_steps)

        target_was_pending = any(m.version == target_version for m in targets)
        steps = max_steps
        if steps is None and direction == "down" and target_version is None:
            steps = 1
        if steps is not None:
            targets = targets[:steps]
        if target_version:
            idx = next((i for i, m in enumerate(targets) if m.version == target_version), -1)
            if idx == -1:
                if direction == "down":
                    raise MigrationError(
                        f"version {target_version} is not in target list of valid migrations "
                        "to apply"
                    )
                if not target_was_pending:
                    targets = []
            else:
                targets = targets[: idx + 1]
                if direction == "down":
                    targets = targets[:-1]
        return targets

    async def migrate(
        self,
        direction: Direction,
        *,
        target_version: int | None = None,
        max_steps: int | None = None,
        dry_run: bool = False,
    ) -> MigrateResult:
        """Apply migrations in ``direction``; a dry run returns the SQL without running it."""
        if direction not in ("up", "down"):
            raise ValidationError("direction", "must be 'up' or 'down'", direction)
        async with self._serialized():
            return await self._migrate(direction, target_version, max_steps, dry_run)

    async def _migrate(
        self, direction: Direction, target_version: int | None, max_steps: int | None, dry_run: bool
    ) -> MigrateResult:
        applied = {m.version for m in await self.existing_versions()}
        plan = self._plan(direction, applied, target_version, max_steps)
        done: list[MigrateVersion] = []
        for migration in plan:
            sql = (migration.sql_up if direction == "up" else migration.sql_down).replace(
                SCHEMA_PLACEHOLDER, self._prefix
            )
            if dry_run:
                done.append(
                    MigrateVersion(
                        version=migration.version, name=migration.name, sql=sql, duration=0.0
                    )
                )
                continue
            start = time.perf_counter()
            async with self._driver.transaction() as tx:
                now_applied = {m.version for m in await self._existing(tx)}
                if (migration.version in now_applied) == (direction == "up"):
                    logger.info(
                        "migration %03d [%s] already handled by another migrator",
                        migration.version,
                        direction,
                    )
                    continue
                try:
                    await tx.exec_script(sql)
                except Exception as exc:
                    raise MigrationError(
                        f"error applying version {migration.version:03d} "
                        f"[{direction.upper()}]: {exc}"
                    ) from exc
                await self._record(tx, direction, migration.version)
            duration = time.perf_counter() - start
            logger.info(
                "applied migration %03d [%s] %s in %.3fs",
                migration.version,
                direction,
                migration.name,
                duration,
            )
            done.append(
                MigrateVersion(
                    version=migration.version, name=migration.name, sql=sql, duration=duration
                )
            )
        return MigrateResult(direction=direction, versions=tuple(done))

    async def up(
        self,
        *,
        target_version: int | None = None,
        max_steps: int | None = None,
        dry_run: bool = False,
    ) -> MigrateResult:
        return await self.migrate(
            "up", target_version=target_version, max_steps=max_steps, dry_run=dry_run
        )

    async def down(
        self,
        *,
        target_version: int | None = None,
        max_steps: int | None = None,
        dry_run: bool = False,
    ) -> MigrateResult:
        return await self.migrate(
            "down", target_version=target_version, max_steps=max_steps, dry_run=dry_run
        )

    async def validate(self, *, target_version: int | None = None) -> ValidateResult:
        """Whether every version (up to ``target_version``) is applied; lists those missing."""
        applied = {m.version for m in await self.existing_versions()}
        wanted: Sequence[Migration] = self._migrations
        if target_version is not None:
            self.get_version(target_version)
            wanted = [m for m in wanted if m.version <= target_version]
        missing = tuple(m.version for m in wanted if m.version not in applied)
        if missing:
            return ValidateResult(
                ok=False,
                missing=missing,
                messages=(f"Unapplied migrations: [{' '.join(str(v) for v in missing)}]",),
            )
        return ValidateResult(ok=True)


def migrate_up_command(
    driver: Driver, *, database_url: str | None = None, line: str = LINE_MAIN
) -> str:
    """The ``river-anyio migrate-up`` command that installs ``line`` on ``driver``'s database,
    for error messages: ``database_url`` shown with its password redacted (without it, a
    placeholder), a SQLite database by its absolute path."""
    path = getattr(driver, "path", None) if driver.dialect == "sqlite" else None
    if isinstance(path, str):
        url = f"sqlite://{path}"
    elif database_url is not None:
        url = redact_url(database_url)
    else:
        url = "URL"
    command = "river-anyio migrate-up"
    if line != LINE_MAIN:
        command += f" --line {line}"
    command += f" --database-url {shlex.quote(url)}"
    if driver.schema:
        command += f" --schema {driver.schema}"
    return command


async def require_schema(driver: Driver, *, database_url: str | None = None) -> None:
    """MigrationError naming the command that fixes it unless every migration of line
    ``main`` is applied: a client's start calls this before anything touches River's tables,
    so a forgotten ``migrate-up`` is one clear error, not "no such table" from a service.

    ``database_url`` is what the user passed (shown with its password redacted); without it
    the command shows a placeholder. A SQLite database is shown by its absolute path, so the
    command works from any directory.
    """
    result = await Migrator(driver).validate()
    if result.ok:
        return
    path = getattr(driver, "path", None) if driver.dialect == "sqlite" else None
    if path == ":memory:":  # it starts empty with every process: only the client can fix it
        raise MigrationError(
            "the in-memory database has no River schema: open the client with "
            "auto_migrate=True (or run river_anyio.migrate.Migrator(driver).up() on it first)"
        )
    command = migrate_up_command(driver, database_url=database_url)
    if len(result.missing) == len(all_migrations(driver.dialect)):
        problem = "the database has no River schema"
    else:
        problem = (
            "the database's River schema is not current (migrations "
            f"{', '.join(f'{v:03d}' for v in result.missing)} of line main are not applied)"
        )
    raise MigrationError(
        f"{problem}: run {command} (or river_anyio.migrate.Migrator(driver).up() in code)"
    )
