"""Database drivers: one protocol, two implementations (PostgreSQL via psycopg 3, SQLite via apsw).

``open_driver(url)`` picks the implementation from the URL scheme (``postgres://``,
``postgresql://``, ``sqlite:///path``). Backends are imported lazily, so an application needs
only the extra it uses (``river_anyio[postgres]`` or ``river_anyio[sqlite]``).

The protocols are public for annotations but unstable for third-party implementers.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.to_thread

from .._errors import ConfigError
from ._protocol import (
    TOPIC_CONTROL,
    TOPIC_INSERT,
    TOPIC_LEADERSHIP,
    CompletionResult,
    Dialect,
    Driver,
    Executor,
    InsertedJob,
    JobCompletion,
    JobInsertParams,
    JobListQuery,
    JobRescue,
    LeaderRow,
    Listener,
    Notification,
    QueueRow,
    ScheduledJob,
)

__all__ = (
    "TOPIC_CONTROL",
    "TOPIC_INSERT",
    "TOPIC_LEADERSHIP",
    "CompletionResult",
    "Dialect",
    "Driver",
    "Executor",
    "InsertedJob",
    "JobCompletion",
    "JobInsertParams",
    "JobListQuery",
    "JobRescue",
    "LeaderRow",
    "Listener",
    "Notification",
    "QueueRow",
    "ScheduledJob",
    "dialect_of_url",
    "open_driver",
    "redact_url",
)


def dialect_of_url(url: str) -> Dialect:
    """The backend a database URL names, or a ConfigError saying which schemes are accepted."""
    if not isinstance(url, str):
        raise ConfigError("database_url", f"must be a str, not {type(url).__name__}", url)
    scheme, sep, _ = url.partition(":")
    scheme = scheme.lower()
    if sep and scheme in ("postgres", "postgresql"):
        return "postgres"
    if sep and scheme == "sqlite":
        return "sqlite"
    raise ConfigError(
        "database_url",
        f"must start with postgres://, postgresql:// or sqlite:/// (got {redact_url(url)!r})",
    )


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***``, safe to print or log."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, tail = rest.partition("/")
    userinfo, at, hostport = netloc.rpartition("@")
    if at and ":" in userinfo:
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{hostport}"
    # libpq also accepts password=... as a query parameter
    if "password=" in tail:
        parts = tail.split("?", 1)
        if len(parts) == 2:
            query = "&".join(
                "password=***" if p.lower().startswith("password=") else p
                for p in parts[1].split("&")
            )
            tail = f"{parts[0]}?{query}"
    return f"{scheme}{sep}{netloc}{slash}{tail}"


def _missing_extra(extra: str, exc: ImportError) -> ConfigError:
    return ConfigError(
        "database_url",
        f"this backend requires river_anyio[{extra}]: pip install 'river_anyio[{extra}]' ({exc})",
    )


_BACKENDS = {"postgres": ("postgres", "psycopg"), "sqlite": ("sqlite", "apsw")}


async def _backend(dialect: Dialect) -> Any:
    """The backend's module, imported in a worker thread: importing psycopg (libpq) or apsw does
    file I/O that must not stall the event loop."""
    extra, dependency = _BACKENDS[dialect]
    name = f"{__name__}.{dialect}"
    if name in sys.modules:
        return sys.modules[name]
    try:
        return await anyio.to_thread.run_sync(importlib.import_module, name)
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] == dependency:
            raise _missing_extra(extra, exc) from exc
        raise


@contextlib.asynccontextmanager
async def open_driver(
    url: str, *, schema: str | None = None, **options: Any
) -> AsyncIterator[Driver]:
    """Open the driver a URL names; ``options`` go to ``open_postgres``/``open_sqlite``."""
    async with open_dialect_driver(dialect_of_url(url), url, schema=schema, **options) as driver:
        yield driver


@contextlib.asynccontextmanager
async def open_dialect_driver(
    dialect: Dialect, url: str, *, schema: str | None = None, **options: Any
) -> AsyncIterator[Driver]:
    """:func:`open_driver` for a URL whose dialect the caller has already resolved with
    :func:`dialect_of_url` (``open_client`` resolves it once, where its options are checked).
    Internal: not part of the drivers' public surface."""
    backend = await _backend(dialect)
    opener = backend.open_postgres if dialect == "postgres" else backend.open_sqlite
    async with opener(url, schema=schema, **options) as driver:
        yield driver
