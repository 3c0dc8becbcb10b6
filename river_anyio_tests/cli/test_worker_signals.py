"""The worker command's signal handling, in process: what each signal does to a running
client, and the structured record it logs (``river_event`` "worker_signal")."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import ClassVar

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio._worker_cli import _Stopper

pytestmark = pytest.mark.anyio


@attrs.frozen
class Noop:
    kind: ClassVar[str] = "noop"


async def noop(ctx: river.WorkContext, job: river.Job[Noop]) -> None:
    pass


def signal_records(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str | None]]:
    return [
        (r.river_signal, r.river_action, r.river_client_id)  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "river_event", None) == "worker_signal"
    ]


async def test_a_signal_before_the_start_aborts_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="river_anyio")
    with anyio.CancelScope() as abort:
        _Stopper(abort=abort, timeout=None).signal(signal.SIGTERM)
        await anyio.sleep_forever()
    assert abort.cancelled_caught
    assert signal_records(caplog) == [("SIGTERM", "abort_start", None)]


async def test_signals_stop_then_cancel_a_running_client(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="river_anyio")
    url = f"sqlite://{tmp_path / 'signals.sqlite3'}"
    workers = river.Workers()
    workers.add(Noop, noop)
    async with river.open_client(
        url, id="signals", queues={"default": river.QueueConfig(max_workers=1)},
        workers=workers, auto_migrate=True,
    ) as run:  # fmt: skip
        stopper = _Stopper(abort=anyio.CancelScope(), timeout=30, run=run)
        stopper.signal(signal.SIGTERM)
        await run.wait_stopping()
        stopper.signal(signal.SIGINT)
        stopper.signal(signal.SIGTERM)
        with anyio.fail_after(10):
            await run.wait()
    assert signal_records(caplog) == [
        ("SIGTERM", "stop", "signals"),
        ("SIGINT", "stop_and_cancel", "signals"),
        ("SIGTERM", "none", "signals"),
    ]
