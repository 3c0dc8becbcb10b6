"""Helpers shared by the driver tests."""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from typing import Any

from river_anyio import JobState
from river_anyio.drivers import Driver, JobInsertParams
from river_anyio.drivers import open_driver as _open_driver


class SQLiteModuleURL(str):
    """A SQLite test database URL whose drivers open it with a ``sqlite3``-API module (the
    driver's ``sqlite_module``) instead of apsw: the conformance suite's third database."""

    __slots__ = ("sqlite_module",)

    def __new__(cls, url: str, sqlite_module: Any) -> SQLiteModuleURL:
        self = super().__new__(cls, url)
        self.sqlite_module = sqlite_module
        return self


def open_driver(url: str, **options: Any) -> AbstractAsyncContextManager[Driver]:
    """:func:`river_anyio.drivers.open_driver`, with the ``sqlite_module`` a
    :class:`SQLiteModuleURL` carries."""
    if isinstance(url, SQLiteModuleURL):
        options.setdefault("sqlite_module", url.sqlite_module)
    return _open_driver(url, **options)


def params(n: int = 0, *, kind: str = "conformance", **kw: Any) -> JobInsertParams:
    """A ready-to-insert job with args ``{"n": n}`` and River's defaults, overridable."""
    base: dict[str, Any] = {
        "encoded_args": json.dumps({"n": n}).encode(),
        "kind": kind,
        "max_attempts": 25,
        "metadata": b"{}",
        "priority": 1,
        "queue": "default",
        "state": JobState.AVAILABLE,
        "tags": (),
    }
    base.update(kw)
    return JobInsertParams(**base)


def ph(url: str) -> str:
    """The backend's placeholder for raw SQL in tests."""
    return "?" if url.startswith("sqlite:") else "%s"
