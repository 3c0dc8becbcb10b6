"""The Flask how-to's application and its tests, as the page shows them, run with pytest
against a PostgreSQL database migrated as the page says."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from river_anyio_tests.test_docs_examples import _env, _project

pytest.importorskip("flask")


def test_the_flask_howto_application_passes_its_tests(pg_url: str, tmp_path: Path) -> None:
    files = _project("flask")
    assert set(files) == {"app.py", "test_app.py"}
    for path, text in files.items():
        (tmp_path / path).write_text(textwrap.dedent(text))
    env = _env(tmp_path)
    env["DATABASE_URL"] = pg_url
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "2 passed" in out, out
