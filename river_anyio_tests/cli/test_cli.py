"""The ``river-anyio`` command line: exit codes and output, on both backends."""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
import urllib.parse
import venv
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest

from river_anyio import ConfigOptions, open_client
from river_anyio._bench import (
    InsertSchedule,
    InsertStyle,
    _insert_at_rate,
    _open_connections,
    _parts,
    parse_duration,
    run_bench,
)
from river_anyio._cli import main
from river_anyio.drivers.postgres import PostgresDriver
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
    if url.startswith("sqlite:"):
        # validate reads: it does not create the file, so give it an empty database
        assert "no SQLite database at" in run("validate", "--database-url", url)[2]
        Path(url.removeprefix("sqlite://")).write_bytes(b"")
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


def test_line_river_anyio_up_list_validate_down(database_url: str) -> None:
    """river_anyio's own line (leases, queue limits) through the same verbs, beside line main."""
    url = database_url
    line = ("--line", "river_anyio")
    versions = ["001 create_river_anyio_lease", "002 create_river_anyio_queue_limit"]
    code, out, _ = run("migrate-list", "--database-url", url, *line)
    assert code == 0 and out.splitlines() == versions  # none applied
    assert run("validate", "--database-url", url, *line)[0] == 1
    code, out, err = run("migrate-up", "--database-url", url, *line)
    assert code == 0, err
    applied = out.splitlines()
    assert len(applied) == 2
    assert re.match(r"applied migration 001 \[up\] create_river_anyio_lease +\[.+\]$", applied[0])
    assert run("validate", "--database-url", url, *line)[0] == 0
    assert run("validate", "--database-url", url)[0] == 0  # line main still current
    code, out, _ = run("migrate-list", "--database-url", url, *line)
    assert out.splitlines() == [f"  {versions[0]}", f"* {versions[1]}"]  # * marks the current
    code, out, _ = run("migrate-list", "--database-url", url)
    assert out.splitlines()[-1].startswith(f"* {LATEST:03d} ")  # main's list: main's rows only
    code, out, _ = run("migrate-down", "--database-url", url, *line, "--target-version", "0")
    assert code == 0 and out.splitlines()[-1].startswith(
        "applied migration 001 [down] create_river_anyio_lease"
    )
    code, out, _ = run("migrate-list", "--database-url", url, *line)
    assert out.splitlines() == versions
    code, out, _ = run("migrate-get", "--version", "1", "--up", *line)
    assert code == 0 and out.startswith("-- River river_anyio migration 001 [up]\n")
    assert "CREATE TABLE river_anyio_lease" in out


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
        (["migrate-up"], 2, "either PG* environment variables or --database-url must be set"),
        (["bench", "--schema", "x", "-n", "1", "--database-url", "mysql://x/y"], 1, "libpq"),
        (["migrate-up", "--database-url", "mysql://x/y"], 1, "libpq key/value string"),
        (["migrate-up", "--database-url", "sqlite://"], 1, "names no file"),
        (["migrate-list", "--database-url", "sqlite:///x"], 1, "migrate-list does not create"),
        (["validate", "--database-url", "sqlite:///x"], 1, "validate does not create"),
        (["-v", "migrate-up", "--debug"], 2, "mutually exclusive"),
        (["migrate-up", "-v", "--debug"], 2, "not allowed with argument"),
        (["--statement-timeout", "1ms", "migrate-list"], 2, "greater than 1ms"),
        (["migrate-list", "--statement-timeout", "soon"], 2, "invalid duration"),
        (["demo", "--database-url", "sqlite:///x"], 2, "pass --yes"),
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
    argv: list[str], code: int, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGDATABASE", raising=False)
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "2")
    if "demo" in argv:
        (tmp_path / "x.db").write_bytes(b"")  # an existing database
    argv = [a.replace("sqlite:///x", f"sqlite://{tmp_path / 'x.db'}") for a in argv]
    got, _out, err = run(*argv)
    assert got == code, err
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("river-anyio: error: ")


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
        f"sqlite://{tmp_path / 'demo.db'}",
        "--loop",
        "trio",
    )
    assert code == 0, err
    assert "second insert skipped as duplicate = True" in out
    assert "worked 54 jobs" in out
    assert "default    send_email       completed  50" in out
    assert "default    flaky            cancelled  1" in out
    assert "completed on attempt 2 after: temporary failure" in out


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
        [str(cli), "migrate-up", "--database-url", f"sqlite://{db}"],
        capture_output=True, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    assert len(up.stdout.splitlines()) == LATEST
    listed = subprocess.run(
        [str(cli), "migrate-list", "--database-url", f"sqlite://{db}"],
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
    assert "worked 300 jobs" in out and "claiming ahead" not in out
    code, out, err = run("bench", "-n", "300", "--claim-ahead")
    assert code == 0, err
    assert "worked 300 jobs" in out and "max_workers 50, claiming ahead," in out
    assert re.search(r"pickup latency p50 [\d.]+ ms, p95 [\d.]+ ms", out)
    url = f"sqlite://{tmp_path / 'bench.db'}"
    code, out, err = run("bench", "-n", "10", "--database-url", url)
    assert code == 2 and "pass --yes" in err
    code, out, err = run("bench", "-n", "20", "--database-url", url, "--yes", "--schema", "nope")
    assert code == 1 and "no attached database named 'nope'" in err, err
    code, out, err = run(
        "bench", "--duration", "1s", "--rate", "50", "--database-url", url, "--yes"
    )
    assert code == 0, err
    assert re.search(r"worked \d+ jobs", out)
    _check_enqueue_to_start(out)
    assert "inserted by the working client" in out
    assert run("bench", "--duration", "soon")[0] == 2
    assert run("bench", "-n", "5", "--duration", "1s")[0] == 2
    for bad in (
        ["--inserter", "process", "-n", "5"],  # needs --rate
        ["--backlog", "10", "--duration", "1s", "--rate", "5"],  # --backlog is continuous only
        ["--backlog", "0", "--duration", "1s"],
        ["--fetch-poll-interval", "0", "-n", "5"],
    ):
        code, _, err = run("bench", *bad)
        assert code == 2, (bad, err)
    code, _, err = run(
        "bench", "--duration", "1s", "--rate", "5", "--inserter", "process",
        "--database-url", "sqlite://:memory:",
    )  # fmt: skip
    assert code == 2 and "another process can open" in err


def _percentiles(line: str) -> list[float]:
    found = [float(v) for v in re.findall(r"p(?:50|95|99) ([\d.]+) ms", line)]
    assert len(found) % 3 == 0 and found, line
    for i in range(0, len(found), 3):
        p50, p95, p99 = found[i : i + 3]
        assert 0 <= p50 <= p95 <= p99, line
    return found


def _check_enqueue_to_start(out: str) -> int:
    """The steady-rate report: every inserted job worked, ordered percentiles, and
    enqueue-to-start in parts that add up."""
    worked = int(re.search(r"worked ([\d,]+) jobs", out)[1].replace(",", ""))  # type: ignore[index]
    m = re.search(r"enqueue-to-start over ([\d,]+) jobs: (.*)", out)
    assert m, out
    inserted = int(m[1].replace(",", ""))
    assert worked == inserted, out
    p99 = _percentiles(m[2])[2]
    pickup = next(line for line in out.splitlines() if line.startswith("pickup latency"))
    assert len(_percentiles(pickup)) == 6  # pickup and end-to-end, each p50/p95/p99
    parts = re.search(
        r"in parts \(p50 / p99 / mean over the slowest 1%\): "
        r"insert call (\S+) / (\S+) / (\S+) ms; inserted to claimed (\S+) / (\S+) / (\S+) ms; "
        r"claimed to start (\S+) / (\S+) / (\S+) ms",
        out,
    )
    assert parts, out
    values = [float(v) for v in parts.groups()]
    insert, to_start = values[0:3], values[6:9]
    assert 0 < insert[0] <= insert[1] and 0 <= to_start[0] <= to_start[1], out
    # Each job's parts add up to its enqueue-to-start. With fewer than 100 jobs, the slowest
    # 1% is the slowest job, whose enqueue-to-start is the p99: the parts' means add up to it.
    assert inserted < 100, out
    assert sum(values[2::3]) == pytest.approx(p99, abs=0.02), out
    return inserted


@pytest.mark.parametrize(
    ("backend", "loop"),
    [("postgres", "trio"), ("sqlite", "asyncio")],
    ids=["pg-trio", "sqlite-asyncio"],
)
def test_bench_inserts_from_a_separate_process(
    backend: str, loop: str, request: pytest.FixtureRequest
) -> None:
    """``--inserter process``: a child process with its own client inserts at the rate; every
    job it inserted is worked and the enqueue-to-start percentiles are reported."""
    url = str(request.getfixturevalue("pg_url" if backend == "postgres" else "sqlite_url"))
    code, out, err = run(
        "bench", "--duration", "1s", "--rate", "40", "--inserter", "process", "--loop", loop,
        "--database-url", url, "--yes",
    )  # fmt: skip
    assert code == 0, err
    assert "inserted by the separate inserter process" in out
    inserted = _check_enqueue_to_start(out)
    assert 30 <= inserted <= 40  # the schedule: one every 25 ms while the second lasts
    assert _achieved(out, 40, "one insert each, up to 16 at once") == inserted


def _achieved(out: str, asked: int, how: str) -> int:
    """The inserter's report: the count it inserted, its rate and the rate asked."""
    m = re.search(
        r"inserted ([\d,]+) jobs in ([\d.]+)s: ([\d,]+)/s \(asked ([\d,]+)/s; (.*)\)$", out
    )
    assert m, out
    count, seconds, rate = int(m[1].replace(",", "")), float(m[2]), int(m[3].replace(",", ""))
    assert int(m[4].replace(",", "")) == asked, out
    assert m[5] == how, out
    assert seconds > 0, out
    assert rate == round(count / seconds), out
    return count


@pytest.mark.parametrize(
    ("backend", "loop", "inserter", "flags", "rate", "size", "how"),
    [
        ("postgres", "asyncio", "client", ["--insert", "one", "--insert-size", "1"], 40, 1,
         "one insert each, up to 16 at once"),
        ("postgres", "asyncio", "process", ["--insert", "burst"], 40, 10,
         "bursts of 10 concurrent inserts, up to 2 bursts at once"),
        ("postgres", "trio", "client", ["--insert", "many", "--insert-size", "5"], 20, 5,
         "insert_many of 5 each, up to 16 at once"),
        ("sqlite", "trio", "client", ["--insert", "burst", "--insert-size", "3"], 24, 3,
         "bursts of 3 concurrent inserts, up to 5 bursts at once"),
        ("sqlite", "asyncio", "process", ["--insert", "many"], 40, 10,
         "insert_many of 10 each, up to 16 at once"),
        ("postgres", "trio", "process", ["--in-flight", "1"], 40, 1,
         "one insert each, one at a time"),
        ("sqlite", "asyncio", "client", ["--insert", "burst", "--insert-size", "2",
         "--in-flight", "1"], 24, 2, "bursts of 2 concurrent inserts, one burst at a time"),
        ("postgres", "asyncio", "client", ["--insert", "many", "--in-flight", "3"], 40, 10,
         "insert_many of 10 each, up to 3 at once"),
    ],
    ids=["pg-client-one", "pg-process-burst", "pg-client-many", "sqlite-client-burst",
         "sqlite-process-many", "pg-process-one-at-a-time", "sqlite-client-burst-one-at-a-time",
         "pg-client-many-3"],
)  # fmt: skip
def test_bench_insert_styles(
    backend: str,
    loop: str,
    inserter: str,
    flags: list[str],
    rate: int,
    size: int,
    how: str,
    request: pytest.FixtureRequest,
) -> None:
    """``--insert one|burst|many``, by either inserter: whole ticks of ``--insert-size`` jobs
    on the schedule (at most rate x duration jobs), every one worked, and the inserter's own
    count and rate reported."""
    url = str(request.getfixturevalue("pg_url" if backend == "postgres" else "sqlite_url"))
    code, out, err = run(
        "bench", "--duration", "0.5s", "--rate", str(rate), "--inserter", inserter,
        "--loop", loop, *flags, "--database-url", url, "--yes",
    )  # fmt: skip
    assert code == 0, err
    assert f"({how})" in out.splitlines()[0], out  # the header says how jobs are inserted
    inserted = _check_enqueue_to_start(out)
    assert 0 < inserted <= rate // 2, out
    assert inserted % size == 0, out  # a tick inserts all its jobs
    assert _achieved(out, rate, how) == inserted


def test_bench_parts_of_enqueue_to_start() -> None:
    """Each part's p50 and p99 over every job, and its mean over the slowest 1% of jobs by
    their sum (here the slowest 2 of 200), whatever part made them slow."""
    jobs = [(1.0, 0.5, 0.25)] * 150 + [(2.0, 1.0, 0.5)] * 48 + [(1.0, 9.0, 0.5), (7.0, 1.0, 3.0)]
    parts = _parts(jobs)
    assert parts is not None
    assert parts.insert == (1.0, 2.0, 4.0)
    assert parts.to_claim == (0.5, 1.0, 5.0)
    assert parts.to_start == (0.25, 0.5, 1.75)
    assert _parts([]) is None


@pytest.mark.anyio
async def test_bench_opens_the_inserts_connections_first(database_url: str) -> None:
    """Before its schedule starts, the steady-rate mode opens the connections its inserts will
    use (as many as may be in flight, no more than the pool holds) and gives them back, so
    the first inserts do not wait for connections; SQLite has no pool to fill."""
    options: ConfigOptions = {}
    if database_url.startswith("postgres"):
        options["driver_options"] = {"pool_max_size": 12}
    async with open_client(database_url, **options) as run:
        driver = run.client.driver
        with anyio.fail_after(10):
            await _open_connections(run.client, 10)
        if not isinstance(driver, PostgresDriver):
            return
        stats = driver.statistics()
        # (the client's own services hold a few at most, never ten at once)
        assert stats.size >= 10 and stats.in_use <= 2, stats
        with anyio.fail_after(10):
            await _open_connections(run.client, 16)  # more than the pool holds: all of it
        stats = driver.statistics()
        assert stats.size == 12 and stats.in_use <= 2, stats


class _Overlap:
    """An insert hook that makes every insert call last 0.2 s (many ticks at the rates below)
    and counts the calls in it at once. (A hook, not a middleware: a middleware runs inside
    the insert's transaction, where SQLite's one writer would make the calls take turns.)"""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    async def insert_begin(self, params: Any) -> None:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await anyio.sleep(0.2)
        finally:
            self.now -= 1


@pytest.mark.anyio
@pytest.mark.parametrize(("max_ticks", "style", "size", "most"), [
    (1, "one", 1, 1), (3, "one", 1, 3), (None, "one", 1, 16), (1, "burst", 4, 4),
    (None, "burst", 4, 16),
])  # fmt: skip
async def test_bench_in_flight_caps_the_calls_at_once(
    database_url: str, max_ticks: int | None, style: InsertStyle, size: int, most: int
) -> None:
    """``--in-flight``: ticks every 5 ms whose calls each last 0.2 s have exactly as many calls
    in flight at once as the cap allows (1: each call waits for the one before), the default
    being 16 calls (four bursts of 4); every tick taken inserts all its jobs."""
    overlap = _Overlap()
    options: ConfigOptions = {"hooks": [overlap]}
    if database_url.startswith("postgres"):
        options["driver_options"] = {"pool_max_size": 20}
    schedule = InsertSchedule(
        rate=200 * size, duration=0.3, style=style, size=size, max_ticks=max_ticks
    )
    returned: dict[int, float] = {}
    async with open_client(database_url, **options) as run:
        with anyio.fail_after(20):
            inserted, _ = await _insert_at_rate(run.client, schedule, None, None, returned)
        assert overlap.most == most
        assert inserted == len(returned) and inserted % size == 0
        listed = await run.client.jobs.list(limit=1000)
        assert sorted(job.args["n"] for job in listed.jobs) == sorted(returned)


def test_bench_insert_flag_errors() -> None:
    """``--insert``/``--insert-size`` misuse: one line on stderr, exit status 2."""
    steady = ["--duration", "1s", "--rate", "5"]
    for bad, says in (
        ([*steady, "--insert-size", "3"], "--insert-size is for --insert burst or many"),
        ([*steady, "--insert", "one", "--insert-size", "2"], "--insert one inserts one job"),
        ([*steady, "--insert", "burst", "--insert-size", "0"], "--insert-size must be at least 1"),
        ([*steady, "--insert", "many", "--insert-size", "-1"], "--insert-size must be at least 1"),
        ([*steady, "--insert", "often"], "invalid choice: 'often'"),
        ([*steady, "--insert", "many", "--insert-size", "x"], "invalid int value: 'x'"),
        (["-n", "5", "--insert", "many"], "--insert and --insert-size need --rate"),
        (["--duration", "1s", "--insert", "burst"], "--insert and --insert-size need --rate"),
        ([*steady, "--in-flight", "0"], "--in-flight must be between 1 and 100"),
        ([*steady, "--in-flight", "101"], "--in-flight must be between 1 and 100"),
        ([*steady, "--in-flight", "two"], "invalid int value: 'two'"),
        (["--duration", "1s", "--in-flight", "1"], "--in-flight needs --rate"),
        (["-n", "5", "--in-flight", "4"], "--in-flight needs --rate"),
    ):
        code, out, err = run("bench", *bad)
        assert code == 2, (bad, err)
        assert says in err, (bad, err)
        assert len(err.splitlines()) == 1, err
        assert out == "", out

    # run_bench itself refuses them too, before anything runs
    def bench(rate: float | None, insert: Literal["one", "burst", "many"], size: int | None) -> int:
        return run_bench(
            database_url=None, total=None, duration=1.0, rate=rate, max_workers=5,
            loop="asyncio", yes=False, fetch_cooldown=None, insert=insert, insert_size=size,
        )  # fmt: skip

    with pytest.raises(ValueError, match="--insert one inserts one job per call"):
        bench(5.0, "one", 2)
    with pytest.raises(ValueError, match="--insert-size must be at least 1"):
        bench(5.0, "many", 0)
    with pytest.raises(ValueError, match="need --rate"):
        bench(None, "burst", None)


@pytest.mark.parametrize(
    ("backend", "loop"),
    [("postgres", "asyncio"), ("sqlite", "trio")],
    ids=["pg-asyncio", "sqlite-trio"],
)
def test_bench_continuous_keeps_a_backlog(
    backend: str, loop: str, request: pytest.FixtureRequest
) -> None:
    """``--duration`` without ``--rate``: River's method, a backlog inserted before the client
    starts and topped up while it works; River's settings are accepted as flags."""
    url = str(request.getfixturevalue("pg_url" if backend == "postgres" else "sqlite_url"))
    code, out, err = run(
        "bench", "--duration", "1s", "--backlog", "300", "--loop", loop, "--max-workers", "200",
        "--fetch-cooldown", "0.002", "--fetch-poll-interval", "0.02", "--database-url", url,
        "--yes",
    )  # fmt: skip
    assert code == 0, err
    assert "1s continuous, backlog 300" in out
    assert "inserted 300 jobs" in out  # before the client started, as River's bench
    assert int(re.search(r"worked ([\d,]+) jobs", out)[1].replace(",", "")) > 0  # type: ignore[index]
    assert "pickup latency" not in out  # jobs wait behind the backlog by design


VERBS = ["migrate-up", "migrate-down", "migrate-get", "migrate-list", "validate", "version"]
VERBS += ["bench", "demo"]


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_and_flag_has_help(verb: str) -> None:
    from river_anyio._cli import _build_parser

    parser = _build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        verb
    ]
    assert sub.description and len(sub.description) > 40, verb
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help and len(action.help) > 10, (verb, action.option_strings)
    out = sub.format_help()
    for flag in ("--verbose", "--debug", "--statement-timeout"):
        assert flag in out, (verb, flag)
    # the root lists every verb with its summary, and River's PG* fallback
    root = parser.format_help()
    assert verb in root and "PGDATABASE" in root and "sqlite://river.db" in root


def test_global_flags_go_before_or_after_the_verb(sqlite_url: str) -> None:
    for argv in (
        ["-v", "migrate-list", "--database-url", sqlite_url],
        ["migrate-list", "--database-url", sqlite_url, "--debug"],
        ["--statement-timeout", "5s", "validate", "--database-url", sqlite_url],
        ["validate", "--database-url", sqlite_url, "--statement-timeout", "1m"],
    ):
        code, _, err = run(*argv)
        assert code == 0, (argv, err)


def test_debug_logs_to_stderr_and_verbose_less(sqlite_url: str) -> None:
    code, out, err = run("--debug", "migrate-list", "--database-url", sqlite_url)
    assert code == 0 and "DEBUG" in err and "sqlite: opened" in err
    assert "DEBUG" not in out  # stdout is the command's own output
    code, _, err = run("migrate-list", "--database-url", sqlite_url)
    assert code == 0 and err == ""
    code, _, err = run("-v", "migrate-list", "--database-url", sqlite_url)
    assert code == 0 and "DEBUG" not in err


def test_read_only_verbs_never_create_a_sqlite_file(tmp_path: Path) -> None:
    missing = tmp_path / "typo.sqlite3"
    for verb in ("migrate-list", "validate"):
        code, out, err = run(verb, "--database-url", f"sqlite://{missing}")
        assert code == 1 and out == ""
        assert f"no SQLite database at {missing}" in err and "migrate-up" in err
        assert len(err.splitlines()) == 1
    code, _, _ = run("migrate-get", "--all", "--up", "--database-url", f"sqlite://{missing}")
    assert code == 0
    assert list(tmp_path.iterdir()) == []


def test_relative_sqlite_url_is_rivers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run("migrate-up", "--database-url", "sqlite://rel.sqlite3")[0] == 0
    assert (tmp_path / "rel.sqlite3").is_file()
    code, out, _ = run("migrate-list", "--database-url", "sqlite:rel.sqlite3")
    assert code == 0 and out.splitlines()[-1].startswith(f"* {LATEST:03d}")


def _pg_env(url: str) -> dict[str, str]:
    parts = urllib.parse.urlsplit(url)
    return {
        "PGHOST": parts.hostname or "",
        "PGPORT": str(parts.port or 5432),
        "PGUSER": parts.username or "",
        "PGDATABASE": parts.path.lstrip("/"),
    }


@pytest.mark.postgres
def test_pg_environment_fallback(pg_empty_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in _pg_env(pg_empty_url).items():
        monkeypatch.setenv(name, value)
    code, out, err = run("migrate-up")
    assert code == 0 and len(out.splitlines()) == LATEST, err
    assert run("validate")[0] == 0
    # --database-url wins over PG*
    monkeypatch.setenv("PGDATABASE", "no_such_database_here")
    assert run("validate", "--database-url", pg_empty_url)[0] == 0
    code, _, err = run("validate")
    assert code == 1 and "no_such_database_here" in err and len(err.splitlines()) == 1


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("flag", "query", "want"),
    [
        (None, None, "10s"),
        (None, "statement_timeout=2500", "2500ms"),
        ("3s", "statement_timeout=2500", "3s"),
        ("750ms", None, "750ms"),
    ],
)
def test_statement_timeout_precedence(
    pg_url: str, flag: str | None, query: str | None, want: str
) -> None:
    """River's order: the flag, then the URL's statement_timeout parameter, then 10s; seen
    from the server, on the CLI's own connections."""
    import psycopg

    from river_anyio.drivers.postgres import cli_conninfo

    url = pg_url + (f"?{query}" if query else "")
    conninfo = cli_conninfo(
        url,
        statement_timeout_ms=None if flag is None else round(parse_duration(flag) * 1000),
        default_statement_timeout="10s",
        application_name="river-anyio CLI",
    )
    with psycopg.connect(conninfo) as conn:
        got = conn.execute("SHOW statement_timeout").fetchone()
        name = conn.execute("SHOW application_name").fetchone()
        idle = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
    assert got == (want,)
    assert name == ("river-anyio CLI",) and idle == ("11s",)
    # and the CLI accepts the URL with that parameter (libpq alone would reject it)
    argv = ["validate", "--database-url", url] + (["--statement-timeout", flag] if flag else [])
    assert run(*argv)[0] == 0


def test_demo_says_what_is_deliberate_and_asks_before_writing(tmp_path: Path) -> None:
    db = tmp_path / "mine.db"
    assert run("migrate-up", "--database-url", f"sqlite://{db}")[0] == 0
    code, _, err = run("demo", "--jobs", "5", "--database-url", f"sqlite://{db}")
    assert code == 2 and "already exists; pass --yes" in err
    code, out, err = run("demo", "--jobs", "5", "--database-url", f"sqlite://{db}", "--yes")
    assert code == 0, err
    assert "deliberate outcomes: one flaky job fails once and is retried" in out
    assert "(deliberate)" in out


def test_rivers_in_memory_url_needs_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sqlite://:memory:`` as River's CLI takes it: the verbs run on a database of their own
    that is gone when they end, and nothing is written to disk; bench migrates it first."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run("migrate-up", "--database-url", "sqlite://:memory:")
    assert code == 0, err
    assert f"applied migration {LATEST:03d}" in out
    code, out, err = run("migrate-list", "--database-url", "sqlite::memory:")
    assert code == 0, err
    assert not out.splitlines()[-1].startswith("*")  # a new process's database: empty again
    code, out, err = run("bench", "-n", "50", "--database-url", "sqlite://:memory:")
    assert code == 0, err
    assert "worked 50 jobs" in out
    assert list(tmp_path.iterdir()) == []
