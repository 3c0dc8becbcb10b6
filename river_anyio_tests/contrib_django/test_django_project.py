"""The Django project under ``river_anyio_tests/django_project`` end to end, in processes of
its own as ``manage.py`` runs it: River's schema by ``manage.py river_migrate``, requests
through Django's test client, a worker process (``manage.py river_worker``) stopped by
SIGTERM. On PostgreSQL (Django's psycopg 3 backend) and on a SQLite file (Django's SQLite
backend on pysqlite3; and on the standard library's sqlite3, too old, for its error).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

PROJECT = Path(__file__).resolve().parents[1] / "django_project"
REPO = PROJECT.parents[1]
#: A password the test server does not ask for (trust authentication): it must never be shown.
PASSWORD = "s3cret-pw"
#: Bounds on waits for conditions (met within a second or two normally).
WITHIN = 30.0

pytest.importorskip("django")

#: Requests through Django's test client, after River's and Django's migrations.
REQUESTS = """
import io, json, os
import django

django.setup()
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.test import Client

import river_anyio.contrib.django as river_django
from shop.jobs import ShipOrder

try:
    call_command("river_migrate", "validate")
except CommandError as exc:
    pending = str(exc)
else:
    pending = None
call_command("river_migrate", "up")
listed = io.StringIO()
call_command("river_migrate", "list", stdout=listed)
call_command("migrate", verbosity=0)

client = Client(raise_request_exception=False)
ok = client.post("/orders", {"item": "book"})
failed = client.post("/orders-then-fail", {"item": "lamp"})
# outside any transaction.atomic(): committed at once
alone = river_django.insert(ShipOrder(order_id=-1))
with transaction.atomic():
    many = river_django.insert_many([ShipOrder(order_id=-2), ShipOrder(order_id=-3)])
    fast = river_django.insert_many_fast([ShipOrder(order_id=-4)])
try:
    with transaction.atomic():
        river_django.insert_many([ShipOrder(order_id=-5)])
        river_django.insert_many_fast([ShipOrder(order_id=-6)])
        raise RuntimeError("rolled back")
except RuntimeError:
    pass
# the process's client reads with its own connections (on SQLite, through Django's module)
seen = [job.id for job in river_django.get_client().jobs.list(kinds=["ship_order"]).jobs]
conflict = None
if os.environ["SHOP_DATABASE_URL"].startswith("sqlite:"):
    # a Config choosing apsw for the ORM's file: a usage error, before the worker starts
    try:
        call_command("river_worker", "shop.jobs:apsw_config")
    except CommandError as exc:
        conflict = [exc.returncode, str(exc)]
print(json.dumps({
    "seen": seen,
    "pending": pending,
    "listed": listed.getvalue(),
    "ok": [ok.status_code, ok.json()],
    "failed": failed.status_code,
    "alone": alone.job.id,
    "created_at": alone.job.created_at.isoformat(),
    "many": [r.job.id for r in many],
    "fast": fast,
    "conflict": conflict,
}))
"""

#: The standard library's sqlite3 (SQLite 3.40 here): the first enqueue, and the system check.
TOO_OLD = """
import json, sqlite3
import django

django.setup()
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.test import Client

from shop.models import Order

call_command("migrate", verbosity=0)
try:
    Client().post("/orders", {"item": "book"})
except Exception as exc:
    raised = f"{type(exc).__name__}: {exc}"
else:
    raised = None
try:
    call_command("check")
except SystemCheckError as exc:
    check = str(exc)
else:
    check = None
try:
    call_command("river_worker", "shop.jobs:nothing")
except CommandError as exc:
    usage = [exc.returncode, str(exc)]
print(json.dumps({
    "usage": usage,
    "version": sqlite3.sqlite_version,
    "raised": raised,
    "check": check,
    "orders": Order.objects.count(),
}))
"""


def _env(database_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RIVER_", "SHOP_", "PG"))}
    env.update(
        # an outer PYTHONPATH comes after (a run against another Django release puts it there)
        PYTHONPATH=os.pathsep.join(
            [str(PROJECT), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
        DJANGO_SETTINGS_MODULE="djproject.settings",
        SHOP_DATABASE_URL=database_url,
        **extra,
    )
    return env


def _python(code: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _with_password(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    netloc = f"{parts.username}:{PASSWORD}@{parts.hostname}:{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


Query = Callable[[str], list[tuple[Any, ...]]]


def _pg_query(url: str) -> Query:
    import psycopg

    def query(sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(url, autocommit=True) as conn:
            return list(conn.execute(sql).fetchall())

    return query


@contextlib.contextmanager
def _sqlite_query(path: str) -> Iterator[Query]:
    import apsw

    # A connection opened afresh for every query, in this process (another SQLite library
    # than the worker's). Were the worker process to hold the file with two SQLite libraries
    # (apsw for River, pysqlite3 for the job's ORM), the job's closing its ORM connection
    # would take the other library's locks with it: it would find itself the file's last
    # connection and remove the WAL the worker still writes, and a connection opened afresh
    # would never see the worker's later writes (the job completed).
    def query(sql: str) -> list[tuple[Any, ...]]:
        conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
        try:
            conn.set_busy_timeout(5000)  # the worker writes meanwhile
            return [tuple(row) for row in conn.execute(sql)]
        finally:
            conn.close()

    yield query


@pytest.fixture(params=["postgres", "sqlite"])
def project_db(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, Query]]:
    """A fresh, empty database (no River schema): its URL for the project, the worker's loop,
    and a way to read it."""
    if request.param == "postgres":
        url = str(request.getfixturevalue("pg_empty_url"))
        yield _with_password(url), "asyncio", _pg_query(url)
        return
    pytest.importorskip("pysqlite3", reason="pysqlite3-binary: Linux x86-64 wheels only")
    path = str(request.getfixturevalue("tmp_path") / "shop.sqlite3")
    with _sqlite_query(path) as query:
        yield f"sqlite://{path}", "trio", query


def _wait_for(
    what: str, condition: Callable[[], bool], worker: subprocess.Popen[bytes], log: Path
) -> None:
    deadline = time.monotonic() + WITHIN
    while not condition():
        assert worker.poll() is None, f"the worker exited ({worker.returncode}) before {what}"
        assert time.monotonic() < deadline, f"not within {WITHIN}s: {what}\n{log.read_text()}"
        time.sleep(0.05)


def test_views_commit_the_row_and_job_together_and_a_worker_process_runs_it(
    project_db: tuple[str, str, Query], tmp_path: Path
) -> None:
    url, loop, query = project_db
    # on PostgreSQL, Django's connection loads timestamps naive (USE_TZ = False), in Tokyo
    naive = {"SHOP_USE_TZ": "0", "SHOP_TIME_ZONE": "Asia/Tokyo"} if "postgres" in url else {}
    env = _env(url, SHOP_LOOP=loop, **naive)
    out = _python(REQUESTS, env)
    # River's rows read through Django's connection: aware datetimes, the right instant
    created_at = dt.datetime.fromisoformat(out["created_at"])
    assert created_at.tzinfo is not None, created_at
    assert abs(dt.datetime.now(dt.UTC) - created_at) < dt.timedelta(minutes=5)

    status, body = out["ok"]
    assert status == 201
    assert out["failed"] == 500
    # the failed view's order and job were rolled back together; the others are committed
    assert query("SELECT id, item, state FROM shop_order") == [(body["order"], "book", "new")]
    jobs = query("SELECT id, state FROM river_job WHERE kind = 'ship_order' ORDER BY id")
    assert jobs == [
        (body["job"], "available"),
        (out["alone"], "available"),
        *((job_id, "available") for job_id in out["many"]),
        (max(out["many"]) + 1, "available"),
    ]
    assert out["fast"] == 1
    if url.startswith("sqlite:"):
        code, message = out["conflict"]
        assert code == 2, message
        assert "driver_options['sqlite_module'] is None" in message, message
        assert "two SQLite libraries on one file in one process" in message, message
    else:
        assert out["conflict"] is None
    assert sorted(out["seen"]) == [job_id for job_id, _ in jobs]
    # river_migrate: validate failed before up (an empty database), list marks the last
    assert out["pending"], out["pending"]
    assert out["listed"].splitlines()[-1].startswith("* "), out["listed"]

    log = tmp_path / "worker.log"
    with log.open("wb") as sink:
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "river_worker", "--log-level", "info"],
            cwd=PROJECT, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            _wait_for(
                "the job is completed and the order shipped",
                lambda: (
                    query("SELECT state FROM shop_order") == [("shipped",)]
                    and query("SELECT DISTINCT state FROM river_job") == [("completed",)]
                ),
                worker,
                log,
            )
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(timeout=WITHIN)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    text = log.read_text()
    assert code == 0, text
    assert "river-anyio worker started: queues=default:10 kinds=ship_order" in text, text
    assert f"loop={loop}" in text and "SIGTERM received: stopping" in text, text
    assert PASSWORD not in text
    # on SQLite the worker's client uses Django's sqlite3 module (pysqlite3): no warning
    assert "two SQLite libraries" not in text and "warning" not in text, text


def test_the_standard_librarys_too_old_sqlite3_is_named_with_the_fix(tmp_path: Path) -> None:
    env = _env(f"sqlite://{tmp_path / 'shop.sqlite3'}", SHOP_STDLIB_SQLITE="1")
    out = _python(TOO_OLD, env)
    if tuple(map(int, out["version"].split("."))) >= (3, 47):
        pytest.skip(f"this Python's sqlite3 bundles SQLite {out['version']}, not too old")
    for message in (out["raised"], out["check"]):
        assert message is not None
        assert f"bundles SQLite {out['version']}" in message, message
        assert "3.47 or later" in message and "pysqlite3-binary" in message, message
        assert "sys.modules['sqlite3'] = pysqlite3" in message, message
    assert out["raised"].startswith("ConfigError: DATABASES['default']: ")
    assert "river_anyio.E001" in out["check"]
    assert out["orders"] == 0  # the view's transaction was rolled back
    # river_worker's usage errors are the worker command's, exit code 2
    assert out["usage"] == [2, "'shop.jobs' has no attribute 'nothing'"]
