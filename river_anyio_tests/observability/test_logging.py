"""Logging: fixed logger names, no handlers, lazy formatting, and stable fields in ``extra``.

The source checks read every module of the package; the runtime checks run real jobs on both
event loops and both databases and assert on the records' fields.
"""

from __future__ import annotations

import ast
import importlib
import logging
import pkgutil
import traceback
from pathlib import Path
from typing import Any, ClassVar

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio._config import ClientConfig
from river_anyio._logging import LOGGER_NAMES

from ..runtime.lifecycle_support import (
    SOON,
    Blocker,
    Gate,
    next_event,
    queues,
    refuse_completions,
)
from .support import capture, refuse_claims

PACKAGE = Path(river.__file__).parent
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}
CLIENT = "logging-client"
#: (the private tuning hook: a ClientConfig as ``config``)
FAST_COMPLETER: dict[str, Any] = {
    "config": ClientConfig(completer_pauses=(0.01,), completer_try_timeout=5.0)
}


#: The ``river-anyio`` program, not the library: its -v/--debug flags configure logging (a
#: handler on the ``river_anyio`` logger for the command's run), as River's CLI does.
PROGRAM = PACKAGE / "_cli.py"


def _sources() -> list[tuple[Path, ast.Module]]:
    return [
        (p, ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE.rglob("*.py")) if p != PROGRAM
    ]


def _calls(tree: ast.Module) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def _attr(call: ast.Call) -> str | None:
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def test_every_logger_has_a_fixed_documented_name() -> None:
    seen = set()
    for path, tree in _sources():
        for call in _calls(tree):
            if _attr(call) != "getLogger":
                continue
            assert len(call.args) == 1 and isinstance(call.args[0], ast.Constant), (
                f"{path}:{call.lineno}: getLogger needs a literal name (not __name__)"
            )
            name = call.args[0].value
            assert name in LOGGER_NAMES, f"{path}:{call.lineno}: {name!r} is not documented"
            seen.add(name)
    assert seen == set(LOGGER_NAMES)


#: The ``worker`` command configures logging for its own process (a command, not the library).
COMMAND_LINE_MODULES = {"_worker_cli.py"}


def test_the_library_installs_no_handlers_or_configuration() -> None:
    for path, tree in _sources():
        if path.name in COMMAND_LINE_MODULES:
            continue
        for call in _calls(tree):
            name = _attr(call)
            assert name not in ("basicConfig", "addHandler", "dictConfig", "fileConfig"), (
                f"{path}:{call.lineno}: the library must not configure logging"
            )


def test_log_calls_format_lazily() -> None:
    """The message is a literal with %-style arguments: never an f-string, a ``%`` or a
    ``.format()`` evaluated before the logger knows whether the record is wanted."""
    checked = 0
    for path, tree in _sources():
        for call in _calls(tree):
            method = _attr(call)
            receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
            if method not in LOG_METHODS or not (
                isinstance(receiver, ast.Name) and "logger" in receiver.id
            ):
                continue
            msg = call.args[1 if method == "log" else 0]
            assert isinstance(msg, ast.Constant) and isinstance(msg.value, str), (
                f"{path}:{call.lineno}: log message must be a literal with % arguments"
            )
            placeholders = msg.value.replace("%%", "").count("%")
            given = len(call.args) - (2 if method == "log" else 1)
            assert placeholders == given, f"{path}:{call.lineno}: arguments do not match"
            checked += 1
    assert checked > 40


def test_importing_every_module_adds_no_handler() -> None:
    before = {name: list(logging.getLogger(name).handlers) for name in ("", *LOGGER_NAMES)}
    for info in pkgutil.walk_packages([str(PACKAGE)], "river_anyio."):
        if info.name.endswith("__main__"):
            continue
        importlib.import_module(info.name)
    for name in ("river_anyio", *LOGGER_NAMES):
        log = logging.getLogger(name)
        assert log.handlers == before.get(name, []) == [], name
        assert log.propagate, name
    assert logging.getLogger().handlers == before[""]


# --- records of a running client ------------------------------------------------------------


@attrs.frozen
class Failing:
    kind: ClassVar[str] = "failing"


async def _fail(ctx: river.WorkContext, job: river.Job[Failing]) -> None:
    ctx.logger.info("about to fail")
    raise ValueError("boom")


@pytest.mark.anyio
async def test_a_failed_job_logs_its_ids(database_url: str) -> None:
    workers = river.Workers()
    workers.add(Failing, _fail)
    with capture() as records, anyio.fail_after(SOON):
        async with river.open_client(
            database_url, id=CLIENT, queues=queues(), workers=workers, fetch_cooldown=0.01
        ) as run:
            job = (await run.client.insert(Failing(), river.InsertOpts(max_attempts=1))).job
            failed = await records.wait_for("job_failed", lambda r: r.river_job_id == job.id)
    assert failed.name == "river_anyio.executor"
    assert failed.levelno == logging.INFO
    assert failed.getMessage() == f"job {job.id} (failing) failed on attempt 1: boom"
    # the traceback the job's row does not hold (River records none for an error) is here
    assert failed.exc_info is not None
    exc = failed.exc_info[1]
    assert isinstance(exc, ValueError) and exc.args == ("boom",)
    assert "in _fail" in "".join(traceback.format_exception(exc))
    assert (
        failed.river_client_id,
        failed.river_queue,
        failed.river_job_kind,
        failed.river_attempt,
    ) == (CLIENT, "default", "failing", 1)
    # the worker's own logger carries the same fields
    (own,) = [r for r in records.records if r.name == "river_anyio.worker"]
    assert own.getMessage() == "about to fail"
    assert (own.river_job_id, own.river_job_kind, own.river_queue, own.river_attempt) == (
        job.id,
        "failing",
        "default",
        1,
    )
    assert own.river_client_id == CLIENT
    # and the client's own lifecycle records name it
    started = records.of("client_started")
    assert [r.river_client_id for r in started] == [CLIENT]


@pytest.mark.anyio
async def test_completion_retries_and_the_drop_log_the_batch(database_url: str) -> None:
    await refuse_completions(database_url)
    gate = Gate()
    gate.release.set()
    with capture() as records, anyio.fail_after(SOON):
        async with river.open_client(
            database_url, id=CLIENT, queues=queues(), workers=gate.workers(), **FAST_COMPLETER
        ) as run:
            with run.subscribe(river.EventKind.COMPLETION_DROPPED) as sub:
                job = (await run.client.insert(Blocker())).job
                await next_event(sub, river.EventKind.COMPLETION_DROPPED, job.id)
    tries = records.of("completion_failed")
    assert [r.getMessage().split(": ")[1] for r in tries] == [
        "writing 1 completions failed (try 1 of 3)",
        "writing 1 completions failed (try 2 of 3)",
        "writing 1 completions failed (try 3 of 3)",
    ]
    for r in tries:
        assert r.name == "river_anyio.completer"
        assert (r.river_job_ids, r.river_client_id) == ([job.id], CLIENT)
        assert "completions are refused" in r.getMessage()
    (dropped,) = records.of("completion_dropped")
    assert dropped.levelno == logging.ERROR
    assert (dropped.river_job_ids, dropped.river_client_id) == ([job.id], CLIENT)


@pytest.mark.anyio
async def test_a_failing_fetch_logs_its_queue(database_url: str) -> None:
    async with river.open_client(database_url) as inserter:
        await inserter.client.insert(Blocker(), river.InsertOpts(queue="refused"))
    await refuse_claims(database_url)
    gate = Gate()
    with capture() as records, anyio.fail_after(SOON):
        async with river.open_client(
            database_url, id=CLIENT, queues=queues(5, "refused"), workers=gate.workers()
        ):
            record = await records.wait_for("fetch_failed")
    assert record.name == "river_anyio.producer"
    assert record.levelno >= logging.WARNING
    assert (record.river_queue, record.river_client_id) == ("refused", CLIENT)
    assert "claims are refused" in record.getMessage()
    assert record.getMessage().startswith("producer refused: fetching jobs failed (retrying in ")
    assert gate.started == {}


def _event_names() -> set[str]:
    """Every ``river_event`` the library logs: literal ``extra`` dicts and the helpers'
    first arguments."""
    helpers = {"client_extra", "queue_extra", "job_extra", "jobs_extra"}
    names: set[str] = set()
    for _path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                for key, val in zip(node.keys, node.values, strict=True):
                    if (
                        isinstance(key, ast.Constant)
                        and key.value == "river_event"
                        and isinstance(val, ast.Constant)
                    ):
                        names.add(val.value)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in helpers
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names.add(node.args[0].value)
    return names


def test_the_reference_documents_every_logger_and_event() -> None:
    page = (PACKAGE.parent / "docs" / "reference" / "logging.md").read_text()
    for name in LOGGER_NAMES:
        assert f"`{name}`" in page, name
    events = _event_names()
    assert {"job_failed", "fetch_failed", "completion_failed"} <= events
    for event in events:
        assert f"`{event}`" in page, f"river_event {event!r} is not documented"
