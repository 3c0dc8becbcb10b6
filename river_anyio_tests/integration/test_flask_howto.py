"""The Flask how-to's applications and their tests, as the page shows them, run with pytest:
on PostgreSQL and on an SQLite file, each migrated as the page says."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from river_anyio_tests.test_docs_examples import _env, _project

pytest.importorskip("flask")


@pytest.mark.parametrize("database", ["postgres", "sqlite"])
def test_the_flask_howto_applications_pass_their_tests(
    database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    project = "flask" if database == "postgres" else "flask-sqlite"
    files = _project(project)
    assert set(files) == {"app.py", "test_app.py"}
    for path, text in files.items():
        (tmp_path / path).write_text(textwrap.dedent(text))
    env = _env(tmp_path)
    if database == "postgres":
        env["DATABASE_URL"] = request.getfixturevalue("pg_url")
    else:  # the page's first step
        subprocess.run(
            [sys.executable, "-m", "river_anyio", "migrate-up", "--database-url",
             "sqlite://signups.sqlite3"],
            cwd=tmp_path, env=env, check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"{2 if database == 'postgres' else 1} passed" in out, out
