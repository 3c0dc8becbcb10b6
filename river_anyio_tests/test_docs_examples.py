"""The code in README.md and docs/: every block parses, and the runnable ones run.

Every ``python`` block is preceded by a marker comment (invisible on GitHub and in the site)
saying what it is:

``<!-- run -->``
    A whole program: run as is, on SQLite, in a directory holding its migrated database files
    (each ``"sqlite://NAME"`` it opens), under asyncio and then under trio (so the second run
    also finds the first run's rows, as a reader running it twice would).
``<!-- run: NAME -->``
    Part of the program NAME: the page's blocks with that name, concatenated, run as above.
``<!-- project: NAME -->``
    A file of the pytest project NAME (its path on the block's first line, ``# conftest.py``),
    run with pytest against this module's stand-in application.
``<!-- not-run: why -->``
    A fragment, or a program needing what the tests cannot provide: compiled only.

Python blocks are compiled with top-level ``await`` allowed (fragments show the body of an
``async`` function); ``toml`` and ``json`` blocks are parsed.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import attrs
import pytest

import river_anyio

ROOT = Path(river_anyio.__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"^<!--\s*(run|not-run|project)(?:\s*:\s*(.*?))?\s*-->$")
#: A program's whole run, each loop (a first run of a process importing psycopg and apsw
#: takes a few seconds on a loaded machine).
RUN_TIMEOUT = 90
#: The SQLite URLs a program opens (River's relative form: a file in the current directory).
SQLITE_URL = re.compile(r"\"(sqlite://[\w.-]+)\"")


@attrs.frozen
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str | None  # run, not-run, project
    name: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        fence = lines[i].strip()
        if not fence.startswith("```"):
            i += 1
            continue
        lang = fence[3:].strip().split(" ")[0]
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        code = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
        marker = name = None
        m = MARKER.match(lines[i - 1].strip()) if i > 0 else None
        if m:
            marker, name = m.group(1), m.group(2) or None
        out.append(Block(page, i + 1, lang, code, marker, name))
        i = end + 1
    return out


BLOCKS = [b for page in PAGES for b in _blocks(page)]
PYTHON = [b for b in BLOCKS if b.lang == "python"]


def _programs() -> dict[str, str]:
    """Each runnable program's source, by a readable id."""
    programs: dict[str, str] = {}
    for b in PYTHON:
        if b.marker != "run":
            continue
        key = f"{b.page.relative_to(ROOT)}:{b.name}" if b.name else b.where
        programs[key] = programs.get(key, "") + b.code
    return programs


PROGRAMS = _programs()


def _project(name: str) -> dict[str, str]:
    files: dict[str, str] = {}
    for b in BLOCKS:
        if b.marker == "project" and b.name == name:
            first, _, rest = b.code.partition("\n")
            assert first.startswith("# "), f"{b.where}: first line must be '# <file name>'"
            files[first[2:].strip()] = rest
    return files


def test_every_python_block_says_whether_it_runs() -> None:
    unmarked = [b.where for b in PYTHON if b.marker is None]
    assert not unmarked, f"python blocks without a run/not-run/project marker: {unmarked}"
    named = [b.where for b in PYTHON if b.marker == "project" and not b.name]
    assert not named, f"project blocks need a project name: {named}"


def test_the_pages_have_runnable_examples() -> None:
    # the tutorial's program, the README's, and the how-tos' whole programs are all run
    assert "docs/tutorial/first-worker.md:tutorial" in PROGRAMS
    assert any(key.startswith("README.md:") for key in PROGRAMS)
    assert len(PROGRAMS) >= 6
    assert set(_project("pytest-trio")) == {
        "pyproject.toml",
        "conftest.py",
        "test_jobs.py",
        "myapp/__init__.py",
        "myapp/jobs.py",
        "myapp/signup.py",
    }


@pytest.mark.parametrize("block", PYTHON, ids=[b.where for b in PYTHON])
def test_python_blocks_compile(block: Block) -> None:
    compile(block.code, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


OTHER = [b for b in BLOCKS if b.lang in ("toml", "json")]


@pytest.mark.parametrize("block", OTHER, ids=[b.where for b in OTHER])
def test_toml_and_json_blocks_parse(block: Block) -> None:
    if block.lang == "toml":
        tomllib.loads(block.code)
    else:
        json.loads(block.code)


def _env(*paths: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIVER_")}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(ROOT)])
    return env


#: Runs a page's program with ``anyio.run`` defaulting to the backend given as argv[1].
RUNNER = """
import functools, runpy, sys
import anyio
anyio.run = functools.partial(anyio.run, backend=sys.argv[1])
runpy.run_path("example.py", run_name="__main__")
"""


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_runnable_examples_run(program: str, tmp_path: Path) -> None:
    source = PROGRAMS[program]
    (tmp_path / "example.py").write_text(source)
    # the page's first step, as a reader types it, for each database file the program uses
    migrate = [sys.executable, "-m", "river_anyio", "migrate-up"]
    for url in sorted(set(SQLITE_URL.findall(source))):
        subprocess.run(
            [*migrate, "--database-url", url],
            cwd=tmp_path, env=_env(), check=True, capture_output=True, timeout=RUN_TIMEOUT,
        )  # fmt: skip
    for backend in ("asyncio", "trio"):
        proc = subprocess.run(
            [sys.executable, "-c", RUNNER, backend],
            cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT,
        )  # fmt: skip
        assert proc.returncode == 0, f"{program} under {backend}:\n{proc.stdout}{proc.stderr}"


# --- the testing how-to's pytest-trio project, against a small application --------------------


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_the_testing_howto_project_passes(
    database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    args = ["-p", "river_anyio.pytest_plugin", "-p", "no:cacheprovider", "-q"]
    if database == "postgres":
        args += ["--river-database-url", request.getfixturevalue("pg_url")]
    for path, text in _project("pytest-trio").items():  # the page shows every file
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(textwrap.dedent(text))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "4 passed" in out, out


def test_each_howto_program_has_its_own_database_file() -> None:
    """Run in one directory, the how-tos' programs must not mix their jobs."""
    owners: dict[str, str] = {}
    for key, source in PROGRAMS.items():
        if not key.startswith("docs/howto/"):
            continue
        for url in set(SQLITE_URL.findall(source)):
            assert url not in owners, f"{key} and {owners[url]} share {url}"
            owners[url] = key
        page = (ROOT / key.split(":")[0]).read_text()
        for url in set(SQLITE_URL.findall(source)):  # the program or the page creates it
            assert "auto_migrate=True" in source or f"migrate-up --database-url {url}" in page, key
    assert len(owners) >= 3


def test_the_readme_keeps_two_set_up_commands() -> None:
    """One demo and one full test suite, each making its own venv (PEP 668 systems refuse a
    bare pip install); .ci/run runs them as written."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Set-up", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    commands = block.strip().splitlines()
    assert len(commands) == 2
    demo, tests = commands
    assert demo.split("#")[0].rstrip().endswith("-m nox -s demo")
    assert tests.split("#")[0].rstrip().endswith("-m nox")
    for command in commands:
        assert command.startswith("python3 -m venv ") and "--python .venv/bin/python" in command
