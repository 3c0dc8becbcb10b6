"""The pytest plugin, run the way an application runs it: in a separate pytest process with
the plugin enabled by ``-p`` (the installed ``pytest11`` entry point has the same name, so
the two are one registration). Under AnyIO's plugin here; under pytest-trio through the
``pytest_trio_compat`` suite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import river_anyio

ROOT = Path(river_anyio.__file__).resolve().parent.parent
PLUGIN = "river_anyio.pytest_plugin"


def run_pytest(cwd: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    environ = {k: v for k, v in os.environ.items() if k != "RIVER_TEST_DATABASE_URL"}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH")]))
    environ.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", *args],
        cwd=cwd, env=environ, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


USER_TESTS = """
from __future__ import annotations

from typing import ClassVar

import anyio
import attrs
import pytest
import sniffio

import river_anyio as river
from river_anyio.testing import require_inserted, require_not_inserted, work_with_client

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


@attrs.frozen
class Ping:
    kind: ClassVar[str] = "ping"
    n: int


async def ping(ctx, job):
    ctx.set_metadata("output", job.args.n * 2)


@pytest.fixture
def river_workers():
    workers = river.Workers()
    workers.add(Ping, ping)
    return workers


async def test_sqlite_client(river_sqlite_client, anyio_backend):
    assert sniffio.current_async_library() == anyio_backend
    assert river_sqlite_client.driver.dialect == "sqlite"
    await require_not_inserted(river_sqlite_client, Ping)
    await river_sqlite_client.insert(Ping(n=1))
    assert (await require_inserted(river_sqlite_client, Ping)).args == Ping(n=1)


async def test_postgres_client(river_postgres_client, anyio_backend):
    assert sniffio.current_async_library() == anyio_backend
    assert river_postgres_client.driver.dialect == "postgres"
    await require_not_inserted(river_postgres_client, Ping)
    await river_postgres_client.insert(Ping(n=2))
    await require_inserted(river_postgres_client, Ping)


async def test_running_client(river_running_client, river_database):
    assert river_running_client.client.driver.dialect == DIALECT
    with river_running_client.subscribe(river.EventKind.JOB_COMPLETED) as events:
        job = (await river_running_client.client.insert(Ping(n=21))).job
        with anyio.fail_after(10):
            event = await events.__anext__()
    assert event.job.id == job.id and event.job.metadata["output"] == 42


async def test_work_with_client(river_client, river_workers):
    result = await work_with_client(river_client, Ping(n=5), workers=river_workers)
    assert result.output == 10 and result.job.state is river.JobState.COMPLETED
"""


def write_user_tests(path: Path, dialect: str) -> None:
    (path / "test_user.py").write_text(USER_TESTS.replace("DIALECT", repr(dialect)))


def test_fixtures_under_the_anyio_plugin_on_both_loops(tmp_path: Path, pg_url: str) -> None:
    write_user_tests(tmp_path, "postgres")
    rc, out = run_pytest(tmp_path, "-W", "error", "-rA", "--river-database-url", pg_url)
    assert rc == 0, out
    assert "8 passed" in out, out


def test_the_url_can_come_from_the_environment(tmp_path: Path, pg_url: str) -> None:
    write_user_tests(tmp_path, "postgres")
    rc, out = run_pytest(
        tmp_path, "-W", "error", "-k", "postgres_client",
        env={"RIVER_TEST_DATABASE_URL": pg_url},
    )  # fmt: skip
    assert rc == 0, out
    assert "2 passed" in out, out


def test_without_a_url_postgres_fixtures_skip_and_the_rest_use_sqlite(tmp_path: Path) -> None:
    write_user_tests(tmp_path, "sqlite")
    rc, out = run_pytest(tmp_path, "-W", "error", "-rs")
    assert rc == 0, out
    assert "6 passed, 2 skipped" in out, out
    assert "no PostgreSQL database: pass --river-database-url or set RIVER_TEST_DATABASE_URL" in out


def test_a_running_client_without_workers_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "test_none.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.fixture
            def anyio_backend():
                return "asyncio"

            @pytest.mark.anyio
            async def test_it(river_running_client):
                pass
            """
        )
    )
    rc, out = run_pytest(tmp_path)
    assert rc != 0
    assert "river_running_client needs workers: override the river_workers fixture" in out


def test_the_plugin_suite_passes_under_pytest_trio(pg_url: str) -> None:
    """``river_anyio_tests/pytest_trio_compat`` in its own pytest run, as ``nox -s pytest_trio``
    runs it (the main suite runs with pytest-trio disabled)."""
    rc, out = run_pytest(
        ROOT, "-p", "trio", "-q", "--river-database-url", pg_url,
        "river_anyio_tests/pytest_trio_compat",
    )  # fmt: skip
    assert rc == 0, out
    assert "5 passed" in out, out


def test_the_entry_point_names_the_plugin_module() -> None:
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["entry-points"]["pytest11"] == {PLUGIN: PLUGIN}


def test_the_testing_module_does_not_import_pytest() -> None:
    code = "import sys, river_anyio.testing; assert 'pytest' not in sys.modules, 'pytest'"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
