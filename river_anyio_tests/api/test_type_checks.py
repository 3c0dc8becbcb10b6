"""The public types hold under mypy strict: the files in ``river_anyio_tests/type_tests`` are
checked, and each line marked ``# error: CODE`` must get exactly that error, every other line
none (so a misspelled or mistyped ``open_client`` option is caught before anything runs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import river_anyio

ROOT = Path(river_anyio.__file__).resolve().parent.parent
TYPE_TESTS = ROOT / "river_anyio_tests" / "type_tests"
EXPECTED = re.compile(r"#\s*error:\s*([a-z-]+)\s*$")
REPORTED = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")


def _expected(path: Path) -> dict[int, str]:
    out = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        m = EXPECTED.search(line)
        if m:
            out[number] = m.group(1)
    return out


@pytest.mark.parametrize("path", sorted(TYPE_TESTS.glob("*.py")), ids=lambda p: p.name)
def test_type_expectations(path: Path, pytestconfig: pytest.Config) -> None:
    pytest.importorskip("mypy")
    expected = _expected(path)
    assert expected, f"{path.name} marks no expected errors"
    cache_plugin = getattr(pytestconfig, "cache", None)  # absent with -p no:cacheprovider
    cache = cache_plugin.mkdir("mypy") if cache_plugin is not None else None
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    if cache is not None:
        cmd += ["--cache-dir", str(cache)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [*cmd, "--show-error-codes", "--no-pretty", "--no-error-summary", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
        check=False,
    )
    reported: dict[int, list[str]] = {}
    for line in proc.stdout.splitlines():
        m = REPORTED.match(line)
        if m and Path(m.group("file")).name == path.name:
            reported.setdefault(int(m.group("line")), []).append(m.group("code"))
        elif ": error:" in line:
            pytest.fail(f"mypy error outside {path.name}: {line}")
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert reported == {n: [code] for n, code in expected.items()}, proc.stdout
