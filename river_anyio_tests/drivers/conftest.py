"""The driver tests' databases: the conformance suite runs on PostgreSQL, on SQLite through
apsw (the driver's default) and on SQLite through a ``sqlite3``-API module (pysqlite3, the
driver's ``sqlite_module`` option: the path Django's worker takes)."""

from __future__ import annotations

from typing import Any

import pytest

from .support import SQLiteModuleURL

_skipped: list[str] = []


@pytest.fixture(params=["postgres", "sqlite", "sqlite-module"])
def database_url(request: pytest.FixtureRequest) -> str:
    """A fresh, migrated database on each backend (SQLite twice: apsw, then pysqlite3)."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    url = str(request.getfixturevalue("sqlite_url"))
    if request.param == "sqlite":
        return url
    try:
        import pysqlite3.dbapi2 as module  # type: ignore[import-not-found]
    except ImportError as exc:
        reason = (
            "SQLite driver tests on sqlite_module=pysqlite3 SKIPPED: pysqlite3 does not import "
            f"({exc}); pip install pysqlite3-binary (Linux x86-64 wheels)"
        )
        if reason not in _skipped:
            _skipped.append(reason)
        pytest.skip(reason)
    return SQLiteModuleURL(url, module)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for reason in _skipped:
        terminalreporter.write_line("!" * 20 + " " + reason + " " + "!" * 20, red=True)
