"""Developer sessions: ``nox`` runs lint, types, the full test suite and the documentation
build; ``nox -s floors`` the suite's core on the oldest supported dependencies; ``nox -s demo``
the demo."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import nox

nox.options.sessions = ["lint", "types", "tests", "docs"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

#: The suite's core: drivers, runtime, command line and migrations.
CORE = [
    "river_anyio_tests/drivers",
    "river_anyio_tests/runtime",
    "river_anyio_tests/cli",
    "river_anyio_tests/migrate",
]
#: The integrations' tests, run on the floors of their extras too.
INTEGRATIONS = [
    "river_anyio_tests/blocking/test_tx.py",
    "river_anyio_tests/blocking/test_sqlalchemy_async.py",
    "river_anyio_tests/contrib_django",
    "river_anyio_tests/observability",
    "river_anyio_tests/integration/test_starlette.py",
]
#: The extras whose lower bounds the floors run pins too (the core's come first).
FLOOR_EXTRAS = [
    "postgres", "sqlite", "trio", "starlette", "django", "opentelemetry", "prometheus",
    "sqlalchemy",
]  # fmt: skip
#: What the integrations' tests need beside the extras: test-only packages, the OpenTelemetry
#: SDK at the API's floor (they are released together).
FLOOR_TEST_TOOLS = [
    "pytest>=8.3,<9",
    "pytest-timeout>=2.3",
    "pytest-xdist>=3.6",
    "blockbuster>=1.5.5",
    "hypercorn>=0.17",
    "greenlet>=3.0",
    "pysqlite3-binary>=0.5.4; sys_platform == 'linux' and platform_machine == 'x86_64'",
]
#: Left out of the floors run to keep CI short: they repeat a scenario many times, or run
#: clients or the worker command as subprocesses, over code paths the rest of the core
#: already covers in process.
CORE_LEFT_OUT = [
    "river_anyio_tests/runtime/test_stop_claims.py",
    "river_anyio_tests/runtime/test_leadership_processes.py",
    "river_anyio_tests/runtime/test_queue_limits_processes.py",
    "river_anyio_tests/runtime/test_sqlite_other_process.py",
    "river_anyio_tests/cli/test_worker.py",
    "river_anyio_tests/cli/test_passwords.py",
]

#: Test processes per run (pytest-xdist): much of a test's time is waiting on its databases, so
#: two processes on two cores take about 60% of one's time. Each runs its own PostgreSQL cluster
#: when none is given. ``nox -- -n 0`` runs in one process.
WORKERS = str(min(os.cpu_count() or 1, 4))


def floor_requirements() -> list[str]:
    """Every direct dependency (the core's and ``FLOOR_EXTRAS``') pinned to its lower bound, as
    pyproject.toml states it: ``anyio>=4.14`` becomes ``anyio==4.14``; plus the OpenTelemetry
    SDK at the API's floor."""
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    pins = []
    otel = ""
    requirements = list(project["dependencies"])
    for extra in FLOOR_EXTRAS:
        requirements += [r for r in extras[extra] if not r.startswith("river_anyio")]
    for req in requirements:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+(?:\[[^]]*\])?)>=([^,;]+)(?:,.*)?", req.strip())
        if m is None:
            raise ValueError(f"{req!r}: every direct dependency needs a >= lower bound")
        pins.append(f"{m[1]}=={m[2]}")
        if m[1] == "opentelemetry-api":
            otel = m[2]
    if otel:
        pins.append(f"opentelemetry-sdk=={otel}")
    return pins


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite, both event loops, PostgreSQL and SQLite (PostgreSQL is started here)."""
    session.install("-e", ".[test]")
    session.run("pytest", "-n", WORKERS, *session.posargs)


@nox.session
def floors(session: nox.Session) -> None:
    """The suite's core (drivers, runtime, CLI, migrations) and the integrations' tests
    (blocking transactions, SQLAlchemy, Django, OpenTelemetry, Prometheus, Starlette) on
    exactly the lower bound of every direct dependency, the extras' included, so the bounds in
    pyproject.toml are the oldest releases that work. pytest stays below 9: anyio's pytest
    plugin before 4.15 uses an API pytest 9 deprecates."""
    session.install(*floor_requirements(), *FLOOR_TEST_TOOLS)
    session.install("--no-deps", "-e", ".")
    session.run("python", "-m", "pip", "list", "--format=freeze")
    ignore = [f"--ignore={path}" for path in CORE_LEFT_OUT]
    session.run(
        "pytest", "-n", WORKERS, "-m", "not slow", *ignore, *CORE, *INTEGRATIONS, *session.posargs
    )


@nox.session
def pytest_trio(session: nox.Session) -> None:
    """The pytest plugin's fixtures under pytest-trio, in their own pytest run (the main suite
    runs with pytest-trio disabled, and runs this suite in a subprocess too)."""
    session.install("-e", ".[test]")
    session.run(
        "pytest", "-p", "trio", "-p", "river_anyio.pytest_plugin",
        "river_anyio_tests/pytest_trio_compat", *session.posargs,
    )  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.8")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def types(session: nox.Session) -> None:
    session.install(
        "-e", ".[all,opentelemetry,prometheus,starlette,sqlalchemy,django]", "pytest>=8.3",
        "mypy>=1.13",
    )  # fmt: skip
    session.run("mypy")


@nox.session
def demo(session: nox.Session) -> None:
    """Insert and list jobs on an embedded SQLite database."""
    session.install(".[sqlite,trio]")
    session.run("python", "-m", "river_anyio", "demo", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """The Sphinx site, with every warning an error (``-W``), into ``docs/_build/html``."""
    session.install("-e", ".[docs]")
    session.run(
        "sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html",
        *session.posargs,
    )  # fmt: skip


@nox.session
def conformance(session: nox.Session) -> None:
    """River's cross-language conformance harness against river_anyio's adapter: the tiers
    given (default ``pr``; ``chaos``, ``perf``, ``soak``, ``nightly``), both drivers, asyncio
    (``-- --backend trio``, ``--drivers sqlite``: see ``river_anyio_tests/conformance/run.py``)."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "river_anyio_tests.conformance.run", *session.posargs)
