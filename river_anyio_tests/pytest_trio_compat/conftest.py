"""Run with ``pytest -p trio -p river_anyio.pytest_plugin river_anyio_tests/pytest_trio_compat``
(``nox -s pytest_trio``; the main suite runs it too, in a subprocess). Without
``--river-database-url`` the PostgreSQL fixtures use the suite's own throwaway server."""

from __future__ import annotations

import pytest


@pytest.fixture
def river_postgres_url(pytestconfig: pytest.Config, request: pytest.FixtureRequest) -> str:
    url = pytestconfig.getoption("river_database_url")
    if url:
        return str(url)
    return str(request.getfixturevalue("pg_url"))
