"""The ``river-anyio`` command line: exit codes and output, on both backends."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from river_anyio._cli import main
from river_anyio.migrate import all_migrations

LATEST = len(all_migrations("sqlite"))
REPO = Path(__file__).resolve().parents[2]


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_version() -> None:
    code, out, _ = run("version")
    assert code == 0
    assert out.startswith("river-anyio version ")
    assert "Built with Python" in out
    assert run("--version")[0] == 0


def test_migrate_up_list_validate_down(empty_database_url: str) -> None:
    url = empty_database_url
    code, _, err = run("validate", "--database-url", url)
    assert code == 1 and "Unapplied migrations: [1 2 3" in err

    code, out, err = run("migrate-up", "--database-url", url, "--max-steps", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert re.match(r"applied migration 001 \[up\] create_river_migration +\[.+\]$", lines[0])
    assert re.match(r"applied migration 002 \[up\] initial_schema +\[.+\]$", lines[1])

    code, out, _ = run("migrate-list", "--database-url", url)
    assert code == 0
    assert out.splitlines()[:3] == [
        "  001 create_river_migration",
        "* 002 initial_schema",
        "  003 river_job_tags_non_null",
    ]

    code, out, _ = run("migrate-up", "--database-url", url)
    assert code == 0 and len(out.splitlines()) == LATEST - 2
    assert run("validate", "--database-url", url)[0] == 0
    assert run("migrate-up", "--database-url", url)[1] == "no migrations to apply\n"

    code, out, _ = run("migrate-down", "--database-url", url)
    assert code == 0 and out.startswith(f"applied migration {LATEST:03d} [down]")
    code, out, _ = run(
        "migrate-down", "--database-url", url, "--max-steps", "2", "--dry-run", "--show-sql"
    )
    assert code == 0
    assert out.splitlines()[0] == f"migration {LATEST - 1:03d} [down] [DRY RUN]"
    assert "-" * 80 in out and f"-- River main migration {LATEST - 1:03d} [down]" in out
    code, out, _ = run("migrate-down", "--database-url", url, "--target-version", "0")
    assert code == 0 and len(out.splitlines()) == LATEST - 1
    code, out, _ = run("migrate-list", "--database-url", url)
    assert not any(line.startswith("*") for line in out.splitlines())


def test_migrate_get_needs_no_database() -> None:
    code, out, _ = run("migrate-get", "--version", "3", "--up")
    assert code == 0
    assert out.startswith("-- River main migration 003 [up]\n")
    code, out, _ = run(
        "migrate-get", "--all", "--down", "--exclude-version", "1", "--database-url", "sqlite://"
    )
    assert code == 0
    headers = [line for line in out.splitlines() if line.startswith("-- River main migration")]
    assert headers[0] == f"-- River main migration {LATEST:03d} [down]"
    assert headers[-1] == "-- River main migration 002 [down]"
    code, out, _ = run("migrate-get", "--version", "2,4", "--up", "--schema", "custom")
    assert code == 0 and '"custom".river_job' in out
    assert "/*river:schema*/" not in out


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["migrate-up"], 2, "--database-url must be set"),
        (["migrate-up", "--database-url", "mysql://x/y"], 1, "must start with postgres://"),
        (["migrate-get", "--up"], 2, "one of the arguments --all --version is required"),
        (["migrate-get", "--all", "--up", "--down"], 2, "not allowed with argument"),
        (["migrate-get", "--version", "99", "--up"], 1, "version 99 is not a valid"),
        (
            ["migrate-up", "--database-url", "sqlite:///x", "--line", "mian"],
            1,
            "did you mean 'main'",
        ),
        (["no-such-verb"], 2, "invalid choice"),
        (["migrate-up", "--max-steps", "x"], 2, "invalid int value"),
    ],
)
def test_errors_are_one_line_with_nonzero_exit(
    argv: list[str], code: int, message: str, tmp_path: Path
) -> None:
    argv = [a.replace("sqlite:///x", f"sqlite:///{tmp_path / 'x.db'}") for a in argv]
    got, _out, err = run(*argv)
    assert got == code
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("river-anyio: error: ")


def test_password_is_never_printed() -> None:
    secret = "s3cr3t-pa55"
    url = f"postgresql://river:{secret}@127.0.0.1:1/nothing?connect_timeout=2"
    code, out, err = run("migrate-list", "--database-url", url)
    assert code == 1
    assert secret not in out + err
    code, out, err = run("migrate-up", "--database-url", f"mysql://river:{secret}@h/db")
    assert code == 1 and secret not in out + err and "***" in err


def test_python_dash_m() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "river_anyio", "version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("river-anyio version")


def test_demo_runs_on_sqlite(tmp_path: Path) -> None:
    code, out, err = run(
        "demo",
        "--jobs",
        "50",
        "--database-url",
        f"sqlite:///{tmp_path / 'demo.db'}",
        "--loop",
        "trio",
    )
    assert code == 0, err
    assert "second insert skipped as duplicate = True" in out
    assert "worked 54 jobs" in out
    assert "default    send_email       completed  50" in out
    assert "default    flaky            cancelled  1" in out
    assert "completed on attempt 2 after: RuntimeError: temporary failure" in out


@pytest.mark.slow
def test_built_wheel_carries_the_sql(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO)],
        check=True, capture_output=True,
    )  # fmt: skip
    wheel = next(dist.glob("river_anyio-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{wheel}[sqlite]"],
        check=True, capture_output=True,
    )  # fmt: skip
    db = tmp_path / "wheel.sqlite3"
    cli = env_dir / "bin" / "river-anyio"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    up = subprocess.run(
        [str(cli), "migrate-up", "--database-url", f"sqlite:///{db}"],
        capture_output=True, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    assert len(up.stdout.splitlines()) == LATEST
    listed = subprocess.run(
        [str(cli), "migrate-list", "--database-url", f"sqlite:///{db}"],
        capture_output=True, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[-1].startswith(f"* {LATEST:03d} ")
    where = subprocess.run(
        [str(py), "-c", "import river_anyio.migrate._migrator as m; print(m._sql_root())"],
        capture_output=True, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert str(env_dir) in where.stdout  # the SQL came from the installed wheel


def test_bench_works_jobs_and_reports(tmp_path: Path) -> None:
    code, out, err = run("bench", "-n", "300", "--loop", "trio")
    assert code == 0, err
    assert "worked 300 jobs" in out
    assert re.search(r"pickup latency p50 [\d.]+ ms, p95 [\d.]+ ms", out)
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    code, out, err = run("bench", "-n", "10", "--database-url", url)
    assert code == 2 and "pass --yes" in err
    code, out, err = run(
        "bench", "--duration", "1s", "--rate", "50", "--database-url", url, "--yes"
    )
    assert code == 0, err
    assert re.search(r"worked \d+ jobs", out)
    assert run("bench", "--duration", "soon")[0] == 2
    assert run("bench", "-n", "5", "--duration", "1s")[0] == 2
