"""``river-anyio worker MODULE:ATTR`` end to end: a real process on each loop and database,
stopped by real signals, its jobs checked in the database.

The command runs through a launcher script outside the application's directory (as the
``river-anyio`` console script does), so ``sys.path[0]`` is not the current directory: the
command itself makes the application importable.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

import river_anyio as river
from river_anyio._worker_cli import DEFAULT_MAX_WORKERS, DatabaseSource, database_from
from river_anyio.drivers import open_driver
from river_anyio.migrate import Migrator

from ..pgproxy import PgProxy

REPO = Path(__file__).resolve().parents[2]
#: Bounds on waits for conditions (they are met in well under a second normally).
START = 60.0
WITHIN = 30.0

APP = textwrap.dedent(
    '''
    from __future__ import annotations

    import datetime as dt
    from pathlib import Path
    from typing import Any, ClassVar

    import anyio
    import attrs

    import river_anyio as river

    HERE = Path(__file__).parent


    @attrs.frozen
    class Block:
        """Runs until cancelled."""

        kind: ClassVar[str] = "block"


    @attrs.frozen
    class Gate:
        """Runs until the file ``release`` exists next to this module."""

        kind: ClassVar[str] = "gate"


    workers = river.Workers()


    @workers.register(Block)
    async def block(ctx: river.WorkContext, job: river.Job[Block]) -> None:
        await anyio.sleep_forever()


    @workers.register(Gate)
    async def gate(ctx: river.WorkContext, job: river.Job[Gate]) -> None:
        while not await anyio.Path(HERE / "release").exists():
            await anyio.sleep(0.02)


    config = river.Config(queues={"q1": river.QueueConfig(max_workers=3)}, workers=workers)
    empty = river.Workers()
    number = 42


    def make_workers() -> river.Workers:
        return workers


    def make_config() -> river.Config:
        return config


    def needs_argument(x: int) -> river.Workers:
        return workers


    def returns_number() -> int:
        return 42


    def raises() -> river.Workers:
        raise RuntimeError("factory broke")


    class CrashingClock:
        """The wall clock, until the file ``crash`` exists next to this module."""

        def now(self) -> dt.datetime:
            if (HERE / "crash").exists():
                raise RuntimeError("clock broke")
            return dt.datetime.now(dt.UTC)


    crashing = river.Config(workers=workers, clock=CrashingClock())

    # quick to call its database unreachable
    probed = river.Config(
        workers=workers,
        health=river.HealthConfig(database_failing_after=0.5, fetch_failing_after=0.5),
    )
    '''
)

LAUNCHER = "import sys\nfrom river_anyio._cli import main\nsys.exit(main())\n"


@attrs.frozen
class Block:
    kind = "block"


@attrs.frozen
class Gate:
    kind = "gate"


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    """A directory holding the application module ``workerapp`` (and two broken ones)."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "workerapp.py").write_text(APP)
    (app / "broken.py").write_text("raise ValueError('broken at import')\n")
    (app / "needsdep.py").write_text("import river_anyio_no_such_dependency\n")
    (app / "badconfig.py").write_text(
        "import river_anyio as river\n"
        "config = river.Config(workers=river.Workers(), id='x' * 101)"
        "  # postgres://u:hunter2@h/d\n"
    )
    (app / "leaky.py").write_text("raise RuntimeError('cannot reach postgres://u:hunter2@h/d')\n")
    return app


@pytest.fixture
def launcher(tmp_path: Path) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    path = bindir / "river-anyio-launcher.py"
    path.write_text(LAUNCHER)
    return path


def _env(*pythonpath: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PG") and k not in ("RIVER_DATABASE_URL", "DATABASE_URL")
    }
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (REPO, *pythonpath))
    env.update(extra)
    return env


@attrs.define(eq=False)
class Worker:
    """A running ``river-anyio worker`` process, its start line and its stderr lines."""

    proc: Process
    start_line: str = ""
    stderr: list[str] = attrs.Factory(list)
    _changed: anyio.Event = attrs.Factory(anyio.Event)

    async def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        buffer = ""
        async for chunk in TextReceiveStream(self.proc.stderr):
            buffer += chunk
            *lines, buffer = buffer.split("\n")
            self.stderr.extend(lines)
            self._changed.set()
            self._changed = anyio.Event()
        if buffer:
            self.stderr.append(buffer)
        self._changed.set()

    async def logged(self, text: str) -> str:
        """Wait until a stderr line contains ``text``."""
        with anyio.fail_after(WITHIN):
            while True:
                for line in self.stderr:
                    if text in line:
                        return line
                changed = self._changed
                await changed.wait()

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    async def exit_code(self) -> int:
        with anyio.fail_after(WITHIN):
            return await self.proc.wait()


@contextlib.asynccontextmanager
async def worker(
    launcher: Path, app_dir: Path, *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[Worker]:
    """Start ``river-anyio worker ARGS`` in ``app_dir``; wait for its start line."""
    proc = await anyio.open_process(
        [sys.executable, str(launcher), "worker", *args],
        cwd=app_dir,
        env=env if env is not None else _env(app_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    w = Worker(proc=proc)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(w._read_stderr)
            assert proc.stdout is not None
            out = ""
            with anyio.fail_after(START):
                async for chunk in TextReceiveStream(proc.stdout):
                    out += chunk
                    if "\n" in out:
                        break
            assert out.endswith("\n"), f"no start line; stderr: {w.stderr}"
            w.start_line = out.rstrip("\n")
            yield w
            with anyio.fail_after(WITHIN):
                await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            with anyio.CancelScope(shield=True):
                await proc.wait()
        await proc.aclose()


def _fields(start_line: str) -> dict[str, str]:
    prefix = "river-anyio worker started: "
    assert start_line.startswith(prefix), start_line
    out = {}
    for part in start_line.removeprefix(prefix).split(" "):
        key, sep, value = part.partition("=")
        if sep:
            out[key] = value
    return out


async def _jobs(url: str, *states: river.JobState) -> list[river.JobRow]:
    async with river.open_client(url) as run:
        result = await run.client.jobs.list(states=list(states) or None, limit=1000)
    return list(result.jobs)


async def _insert(url: str, *args: object) -> list[int]:
    async with river.open_client(url) as run:
        results = await run.client.insert_many(list(args))
    return [r.job.id for r in results]


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll the database (through ``check``) until it holds, within a bound."""
    with anyio.move_on_after(WITHIN) as scope:
        while not await check():  # noqa: ASYNC110 - state in another process's database
            await anyio.sleep(0.05)
    assert not scope.cancelled_caught, f"timed out waiting for {what}"


async def _running(url: str, n: int) -> None:
    async def check() -> bool:
        return len(await _jobs(url, river.JobState.RUNNING)) == n

    await _until(check, f"{n} running jobs")


# --- signals ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_sigterm_lets_running_jobs_finish_then_exits_0(
    anyio_backend: str, database_url: str, app_dir: Path, launcher: Path
) -> None:
    async with worker(
        launcher, app_dir, "workerapp:workers", "--database-url", database_url,
        "--queue", "default=4", "--loop", anyio_backend,
    ) as w:  # fmt: skip
        fields = _fields(w.start_line)
        assert fields["queues"] == "default:4"
        assert fields["kinds"] == "block,gate"
        assert fields["loop"] == anyio_backend
        assert fields["soft_stop_timeout"] == "none"
        assert fields["client_id"]
        ids = await _insert(database_url, Gate(), Gate())
        await _running(database_url, 2)

        w.signal(signal.SIGTERM)
        await w.logged("SIGTERM received: stopping")
        # draining: the process waits for its running jobs, which wait for the release file
        assert w.proc.returncode is None
        assert {j.id for j in await _jobs(database_url, river.JobState.RUNNING)} == set(ids)
        (app_dir / "release").touch()
        assert await w.exit_code() == 0

    jobs = await _jobs(database_url)
    assert [(j.id, j.state) for j in jobs] == [(i, river.JobState.COMPLETED) for i in ids]
    assert not any("Traceback" in line for line in w.stderr), w.stderr


@pytest.mark.anyio
async def test_sigterm_mid_drain_interrupts_jobs_past_the_soft_stop_timeout(
    anyio_backend: str, database_url: str, app_dir: Path, launcher: Path
) -> None:
    async with worker(
        launcher, app_dir, "workerapp:workers", "--database-url", database_url,
        "--loop", anyio_backend, "--soft-stop-timeout", "4s",
    ) as w:  # fmt: skip
        assert _fields(w.start_line)["soft_stop_timeout"] == "4s"
        assert _fields(w.start_line)["queues"] == f"default:{DEFAULT_MAX_WORKERS}"
        blocked = await _insert(database_url, Block(), Block())
        finishing = await _insert(database_url, Gate())
        await _running(database_url, 3)
        w.signal(signal.SIGTERM)
        await w.logged("SIGTERM received: stopping; running jobs have 4s to finish")
        (app_dir / "release").touch()  # the gate job finishes while the queue drains
        assert await w.exit_code() == 0

    by_id = {j.id: j for j in await _jobs(database_url)}
    assert not [j for j in by_id.values() if j.state == river.JobState.RUNNING]
    assert by_id[finishing[0]].state == river.JobState.COMPLETED
    for job_id in blocked:  # interrupted: available again, no error, attempt given back
        job = by_id[job_id]
        assert job.state == river.JobState.AVAILABLE
        assert not job.errors
        assert job.attempt == 0


@pytest.mark.anyio
async def test_second_signal_cancels_running_jobs(
    anyio_backend: str, database_url: str, app_dir: Path, launcher: Path
) -> None:
    async with worker(
        launcher, app_dir, "workerapp:workers", "--database-url", database_url,
        "--loop", anyio_backend,
    ) as w:  # fmt: skip
        ids = await _insert(database_url, Block(), Block())
        await _running(database_url, 2)
        w.signal(signal.SIGTERM)
        await w.logged("SIGTERM received: stopping")
        assert w.proc.returncode is None  # no soft stop timeout: it would wait for ever
        w.signal(signal.SIGINT)
        await w.logged("SIGINT received again: cancelling running jobs")
        assert await w.exit_code() == 0

    jobs = await _jobs(database_url)
    assert [(j.id, j.state, j.attempt) for j in jobs] == [
        (i, river.JobState.AVAILABLE, 0) for i in ids
    ]


@pytest.mark.anyio
async def test_a_crashed_client_exits_1_with_one_line(
    anyio_backend: str, database_url: str, app_dir: Path, launcher: Path
) -> None:
    async with worker(
        launcher, app_dir, "workerapp:crashing", "--database-url", database_url,
        "--loop", anyio_backend,
    ) as w:  # fmt: skip
        (app_dir / "crash").touch()
        assert await w.exit_code() == 1
    await w.logged("river-anyio: error: a river_anyio service failed: RuntimeError: clock broke")
    assert w.stderr[-1].startswith("river-anyio: error: "), w.stderr[-3:]


@pytest.mark.anyio
async def test_a_signal_before_the_start_abandons_it(
    anyio_backend: str, pg_url: str, app_dir: Path, launcher: Path
) -> None:
    # The worker's --auto-migrate reads river_migration, which this transaction keeps locked:
    # the worker is held in its start until the signal.
    async with open_driver(pg_url) as driver, driver.transaction() as tx:
        await tx.exec_script("LOCK TABLE river_migration IN ACCESS EXCLUSIVE MODE")
        proc = await anyio.open_process(
            [sys.executable, str(launcher), "worker", "workerapp:workers", "--auto-migrate",
             "--database-url", pg_url, "--loop", anyio_backend],
            cwd=app_dir, env=_env(app_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        async with proc:
            try:

                async def waiting() -> bool:
                    rows = await driver.executor().fetch_all(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                        " AND wait_event_type = 'Lock'"
                    )
                    return bool(rows)

                await _until(waiting, "the worker to wait for the lock")
                proc.send_signal(signal.SIGTERM)
                with anyio.fail_after(WITHIN):
                    code = await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
            assert proc.stdout is not None and proc.stderr is not None
            out = b"".join([chunk async for chunk in proc.stdout]).decode()
            err = b"".join([chunk async for chunk in proc.stderr]).decode()
    assert code == 0, err
    assert out == ""
    assert "SIGTERM received before the client started: not starting" in err
    assert "Traceback" not in err


# --- what it runs ----------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("target", "flags", "queues"),
    [
        ("workerapp:config", (), "q1:3"),
        (
            "workerapp:make_config",
            ("--queue", "a=2", "--queue", "b"),
            f"a:2,b:{DEFAULT_MAX_WORKERS}",
        ),
        ("workerapp:make_workers", ("--queue", "b=7"), "b:7"),
    ],
)
async def test_a_config_or_a_factory_from_the_current_directory(
    anyio_backend: str,
    sqlite_url: str,
    app_dir: Path,
    launcher: Path,
    target: str,
    flags: tuple[str, ...],
    queues: str,
) -> None:
    # PYTHONPATH holds only the library: the module is found in the current directory
    env = _env(RIVER_DATABASE_URL=sqlite_url, DATABASE_URL="postgresql://ignored@nowhere/x")
    async with worker(launcher, app_dir, target, "--loop", anyio_backend, *flags, env=env) as w:
        fields = _fields(w.start_line)
        assert fields["queues"] == queues
        assert fields["database"] == sqlite_url
        w.signal(signal.SIGINT)
        assert await w.exit_code() == 0


@pytest.mark.anyio
async def test_auto_migrate_prepares_an_empty_database(
    anyio_backend: str, empty_database_url: str, app_dir: Path, launcher: Path
) -> None:
    async with worker(
        launcher, app_dir, "workerapp:workers", "--database-url", empty_database_url,
        "--loop", anyio_backend, "--auto-migrate",
    ) as w:  # fmt: skip
        (app_dir / "release").touch()
        await _insert(empty_database_url, Gate())
        await _until(
            lambda: _has_completed(empty_database_url), "the job to be worked after migrating"
        )
        w.signal(signal.SIGTERM)
        assert await w.exit_code() == 0
    async with open_driver(empty_database_url) as driver:
        assert (await Migrator(driver).validate()).ok
    await w.logged("applied migration 001 [up]")


async def _has_completed(url: str) -> bool:
    return len(await _jobs(url, river.JobState.COMPLETED)) == 1


@pytest.mark.anyio
async def test_start_line_and_logs_never_show_the_password(
    anyio_backend: str, pg_url: str, app_dir: Path, launcher: Path
) -> None:
    # the test server trusts local connections, so any password is accepted
    parts = urllib.parse.urlsplit(pg_url)
    secret = "s3cr%2Ft"  # an encoded "/" as well
    with_password = parts._replace(
        netloc=f"{parts.username}:{secret}@{parts.hostname}:{parts.port}"
    ).geturl()
    async with worker(
        launcher, app_dir, "workerapp:workers", "--loop", anyio_backend, "--log-level", "debug",
        env=_env(app_dir, DATABASE_URL=with_password),
    ) as w:  # fmt: skip
        assert _fields(w.start_line)["database"] == with_password.replace(secret, "***")
        w.signal(signal.SIGTERM)
        assert await w.exit_code() == 0

    # libpq's PG* variables, as River's CLI reads them
    pg_env = _env(
        app_dir,
        PGHOST=str(parts.hostname),
        PGPORT=str(parts.port),
        PGUSER=str(parts.username),
        PGDATABASE=parts.path.lstrip("/"),
        PGPASSWORD="pgpass-secret",
    )
    async with worker(launcher, app_dir, "workerapp:workers", env=pg_env) as pg_w:
        assert _fields(pg_w.start_line)["database"] == "postgresql://"
        assert f"PGDATABASE={parts.path.lstrip('/')}" in pg_w.start_line
        pg_w.signal(signal.SIGTERM)
        assert await pg_w.exit_code() == 0
    for line in [w.start_line, *w.stderr, pg_w.start_line, *pg_w.stderr]:
        assert "s3cr" not in line and "pgpass-secret" not in line, line


def test_database_lookup_order() -> None:
    env = {"RIVER_DATABASE_URL": "sqlite:///r.db", "DATABASE_URL": "postgres://u:pw@h/d"}
    assert database_from("sqlite:///flag.db", env) == DatabaseSource(
        url="sqlite:///flag.db", display="sqlite:///flag.db", source="--database-url"
    )
    assert database_from(None, env) == DatabaseSource(
        url="sqlite:///r.db", display="sqlite:///r.db", source="RIVER_DATABASE_URL"
    )
    del env["RIVER_DATABASE_URL"]
    assert database_from(None, env) == DatabaseSource(
        url="postgres://u:pw@h/d", display="postgres://u:***@h/d", source="DATABASE_URL"
    )
    pg = {"PGDATABASE": "jobs", "PGHOST": "db", "PGPASSWORD": "pw"}
    found = database_from(None, pg)
    assert found is not None and found.url == "postgresql://" and found.source == "PG*"
    assert "PGDATABASE=jobs" in found.display and "pw" not in found.display
    assert database_from(None, {"PGHOST": "db"}) is None  # River requires PGDATABASE
    assert database_from("", {}) is None


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "code", "message"),
    [
        ("nosuchmodule:workers", 2, "module 'nosuchmodule' not found"),
        ("workerapp:nope", 2, "'workerapp' has no attribute 'nope'"),
        ("workerapp:config.nope", 2, "'workerapp.config' has no attribute 'nope'"),
        ("workerapp:number", 2, "workerapp:number is an int, not a river_anyio.Workers"),
        ("workerapp:Block", 2, "workerapp:Block is the class Block, not a river_anyio.Workers"),
        ("workerapp:needs_argument", 2, "workerapp:needs_argument must be callable with no"),
        ("workerapp:returns_number", 2, "workerapp:returns_number() returned int, not a"),
        ("workerapp:empty", 2, "no workers are registered"),
        ("workerapp", 2, "argument MODULE:ATTR: expected MODULE:ATTR"),
        ("workerapp:raises", 1, "workerapp:raises() raised RuntimeError: factory broke (workerapp.py:"),
        ("broken:workers", 1, "importing module 'broken' failed: ValueError: broken at import (broken.py:1)"),
        ("needsdep:workers", 1, "No module named 'river_anyio_no_such_dependency' (needsdep.py:1)"),
        ("badconfig:config", 1, "ConfigError: id: ID cannot be longer than 100 characters (badconfig.py:2)"),
        ("leaky:workers", 1, "RuntimeError: cannot reach postgres://u:***@h/d (leaky.py:1)"),
    ],
)  # fmt: skip
def test_bad_module_attr_is_one_line(
    sqlite_url: str, app_dir: Path, launcher: Path, target: str, code: int, message: str
) -> None:
    proc = subprocess.run(
        [sys.executable, str(launcher), "worker", target, "--database-url", sqlite_url],
        cwd=app_dir, env=_env(), capture_output=True, text=True, timeout=WITHIN,
    )  # fmt: skip
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("river-anyio: error: ") and message in proc.stderr, proc.stderr
    assert "hunter2" not in proc.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--queue", "Bad"), "argument --queue: queue name is invalid"),
        (("--queue", "a=0"), "MAX_WORKERS of queue 'a' must be between 1 and 10,000, got 0"),
        (("--queue", "a=x"), "MAX_WORKERS of queue 'a' must be an integer"),
        (("--queue", "a", "--queue", "a=3"), "--queue a is given more than once"),
        (("--soft-stop-timeout", "soon"), "argument --soft-stop-timeout: invalid duration"),
        (("--loop", "uvloop"), "argument --loop: invalid choice"),
        (("--log-level", "loud"), "argument --log-level: invalid choice"),
        (("--database-url", "mysql://u:pw@h/d"), "--database-url: must be a postgres:// or"),
        ((), "no database: pass --database-url, or set RIVER_DATABASE_URL"),
        (("--health-port", "70000"), "argument --health-port: must be between 0 and 65535"),
        (("--health-port", "http"), "argument --health-port: must be a port number"),
    ],
)
def test_bad_flags_are_usage_errors(
    app_dir: Path, launcher: Path, flags: tuple[str, ...], message: str
) -> None:
    proc = subprocess.run(
        [sys.executable, str(launcher), "worker", "workerapp:workers", *flags],
        cwd=app_dir, capture_output=True, text=True, timeout=WITHIN,
        # a database that would be created if anything were opened: nothing is
        env=_env(**({"RIVER_DATABASE_URL": f"sqlite:///{app_dir / 'unused.db'}"} if flags else {})),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("river-anyio: error: ") and message in proc.stderr
    assert "pw@" not in proc.stderr
    assert not (app_dir / "unused.db").exists()


def test_help_describes_every_flag() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "river_anyio", "worker", "--help"],
        env=_env(), capture_output=True, text=True, timeout=WITHIN,
    )  # fmt: skip
    assert proc.returncode == 0
    for flag in (
        "MODULE:ATTR", "--database-url", "--queue", "--loop", "--soft-stop-timeout",
        "--log-level", "--auto-migrate", "--health-port", "--health-host",
        "--wait-for-database",
    ):  # fmt: skip
        assert flag in proc.stdout


# --- GET /health -------------------------------------------------------------------------------


async def _get(url: str) -> tuple[int, dict[str, Any]]:
    """A plain HTTP/1.1 GET; the status and the decoded JSON body."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    with anyio.fail_after(WITHIN):
        async with await anyio.connect_tcp(parts.hostname, parts.port) as stream:
            await stream.send(f"GET {parts.path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            chunks = []
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    chunks.append(await stream.receive())
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), head
    return int(head.split()[1]), json.loads(body)


async def _status_until(url: str, status: int) -> dict[str, Any]:
    """Probe ``url`` until it answers ``status`` (as an orchestrator would)."""
    with anyio.fail_after(WITHIN):
        while True:
            got, body = await _get(url)
            if got == status:
                return body
            await anyio.sleep(0.05)


@pytest.mark.anyio
async def test_health_port_answers_503_until_the_database_answers_when_it_is_gone_or_stopping(
    anyio_backend: str, pg_url: str, app_dir: Path, launcher: Path
) -> None:
    proxy = PgProxy(pg_url)
    proxy.go_down()  # down when the worker starts: it waits for its database
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        async with worker(
            launcher, app_dir, "workerapp:probed", "--database-url", proxy.url(pg_url),
            "--queue", "default=2", "--loop", anyio_backend, "--health-port", "0",
            "--wait-for-database",
        ) as w:  # fmt: skip
            url = _fields(w.start_line)["health"]
            assert url.startswith("http://127.0.0.1:") and url.endswith("/health")
            status, body = await _get(url)
            assert status == 503 and body["database"]["waiting"] is True, body
            assert body["reasons"][0].startswith("waiting for the database")
            await w.logged("the database cannot be reached")
            proxy.come_up()
            body = await _status_until(url, 200)
            assert body["ok"] is True and body["reasons"] == []
            assert set(body["queues"]) == {"default"}
            missing, _ = await _get(url.replace("/health", "/nope"))
            assert missing == 404

            proxy.go_down()
            body = await _status_until(url, 503)
            assert body["database"]["reachable"] is False
            assert body["reasons"][0].startswith("database unreachable for")
            proxy.come_up()
            await _status_until(url, 200)

            (job_id,) = await _insert(pg_url, Gate())
            body = await _status_until(url, 200)
            await _running(pg_url, 1)
            w.signal(signal.SIGTERM)  # stopping, while the job runs
            body = await _status_until(url, 503)
            assert body["stopping"] is True and body["reasons"] == ["the client is stopping"]
            (app_dir / "release").touch()
            assert await w.exit_code() == 0
        tg.cancel_scope.cancel("test over")
    assert [j.id for j in await _jobs(pg_url, river.JobState.COMPLETED)] == [job_id]
