"""Named leases for single-flight work across replicas (``Client.with_lease``/``lease``).

A lease is a row of ``river_anyio_lease`` (migration line ``river_anyio``), taken by one
statement that inserts it or overwrites an expired one, so of any number of callers racing
for a name exactly one gets it. Its term is judged by the database's clock. Nothing here
runs unless a lease is asked for.
"""

from __future__ import annotations

import datetime as dt
import math

from ._errors import DatabaseError, MigrationError, ValidationError
from .drivers import Driver, LeaseRow
from .migrate._migrator import LINE_RIVER_ANYIO, migrate_up_command

__all__ = ["LEASE_TABLE", "Lease", "check_lease_name", "lease_ttl_seconds", "take_lease"]

LEASE_TABLE = "river_anyio_lease"
_NAME_MAX = 255
_TTL_MIN = 0.01
_TTL_MAX = 366 * 24 * 3600.0


class Lease:
    """A lease held by ``async with client.lease(name, ttl=...)``: its name, its holder (the
    client's id), when it was taken and when it expires unless renewed (both on the
    database's clock; ``expires_at`` follows each renewal)."""

    __slots__ = ("_expires_at", "_holder", "_name", "_taken_at", "_ttl")

    def __init__(self, row: LeaseRow, ttl: float) -> None:
        self._name = row.name
        self._holder = row.holder
        self._taken_at = row.taken_at
        self._expires_at = row.expires_at
        self._ttl = ttl

    @property
    def name(self) -> str:
        return self._name

    @property
    def holder(self) -> str:
        return self._holder

    @property
    def taken_at(self) -> dt.datetime:
        return self._taken_at

    @property
    def expires_at(self) -> dt.datetime:
        return self._expires_at

    @property
    def ttl(self) -> float:
        """The term, in seconds, each renewal extends the lease to."""
        return self._ttl

    def _renewed(self, row: LeaseRow) -> None:
        self._expires_at = row.expires_at

    def __repr__(self) -> str:
        return (
            f"<Lease {self._name!r} holder={self._holder!r} "
            f"expires_at={self._expires_at.isoformat()}>"
        )


def check_lease_name(name: object) -> str:
    """``name`` if it is a usable lease name, else a ValidationError naming the rule."""
    if not isinstance(name, str):
        raise ValidationError("name", f"must be a str, not {type(name).__name__}", name)
    if not 1 <= len(name) <= _NAME_MAX:
        raise ValidationError("name", f"must be 1 to {_NAME_MAX} characters long", name)
    if "\x00" in name:
        raise ValidationError("name", "must not contain NUL characters", name)
    return name


def lease_ttl_seconds(ttl: object) -> float:
    """``ttl`` (seconds, or a ``timedelta``) in seconds, checked: at least 10 ms (SQLite keeps
    milliseconds) and at most 366 days."""
    if isinstance(ttl, dt.timedelta):
        seconds = ttl.total_seconds()
    elif isinstance(ttl, int | float) and not isinstance(ttl, bool):
        seconds = float(ttl)
    else:
        raise ValidationError(
            "ttl", f"must be seconds (a number) or a timedelta, not {type(ttl).__name__}", ttl
        )
    if not math.isfinite(seconds) or not _TTL_MIN <= seconds <= _TTL_MAX:
        raise ValidationError("ttl", "must be between 10 ms and 366 days", ttl)
    return seconds


async def missing_table_error(
    driver: Driver, exc: DatabaseError, database_url: str | None
) -> MigrationError | None:
    """The one clear error for a database without line ``river_anyio`` (the command that
    installs it), when that is why ``exc`` happened; None otherwise."""
    if exc.transient or await driver.executor().table_exists(LEASE_TABLE):
        return None
    problem = (
        f"leases need table {LEASE_TABLE} of migration line {LINE_RIVER_ANYIO}, which this "
        "database lacks"
    )
    if getattr(driver, "path", None) == ":memory:":  # no command can reach it
        return MigrationError(f"{problem}: open the client with auto_migrate=True")
    command = migrate_up_command(driver, database_url=database_url, line=LINE_RIVER_ANYIO)
    return MigrationError(f"{problem}: run {command} (or open the client with auto_migrate=True)")


async def take_lease(
    driver: Driver, *, name: str, holder: str, ttl: float, database_url: str | None
) -> LeaseRow | None:
    """Take the lease in one statement; None when someone holds it."""
    try:
        return await driver.executor().lease_take(name=name, holder=holder, ttl=ttl)
    except DatabaseError as exc:
        missing = await missing_table_error(driver, exc, database_url)
        if missing is None:
            raise
        raise missing from exc
