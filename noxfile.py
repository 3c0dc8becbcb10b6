"""Developer sessions: ``nox`` runs lint, types, the full test suite and the documentation
build; ``nox -s demo`` the demo."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "types", "tests", "docs"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite, both event loops, PostgreSQL and SQLite (PostgreSQL is started here)."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


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
    session.install("-e", ".[all,opentelemetry,prometheus,starlette]", "pytest>=8.3", "mypy>=1.13")
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
