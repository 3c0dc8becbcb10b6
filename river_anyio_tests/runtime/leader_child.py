"""A client in a process of its own, for the multi-process leadership tests.

``python -m river_anyio_tests.runtime.leader_child URL CLIENT_ID BACKEND INTERVAL`` works the
``default`` queue and prints one JSON line per leadership event (``{"event": "elected" |
"lost", "id": ..., "t": <wall time>}``, plus ``"ready"`` once started). SIGTERM stops it
gracefully (it resigns at once); SIGKILL is the crash case.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import ClassVar

import anyio
import attrs

import river_anyio as river
from river_anyio._config import ClientConfig


@attrs.frozen
class Nop:
    kind: ClassVar[str] = "leader_child_nop"


async def nop(ctx: river.WorkContext, job: river.Job[Nop]) -> None:
    pass


def say(event: str, client_id: str, **extra: object) -> None:
    print(json.dumps({"event": event, "id": client_id, "t": time.time(), **extra}), flush=True)


async def main(url: str, client_id: str, interval: float) -> None:
    workers = river.Workers()
    workers.add(Nop, nop)
    async with river.open_client(
        url,
        id=client_id,
        queues={"default": river.QueueConfig(max_workers=1)},
        workers=workers,
        soft_stop_timeout=1.0,
        config=ClientConfig(elect_interval=interval, maintenance_stagger=False),
    ) as run:
        kinds = (river.EventKind.LEADER_ELECTED, river.EventKind.LEADER_LOST)
        with run.subscribe(*kinds) as events:
            if run.is_leader:  # elected before the subscription
                say("elected", client_id)
            say("ready", client_id)
            async with anyio.create_task_group() as tg:

                async def stop_on_sigterm() -> None:
                    with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                        async for _ in signals:
                            run.stop()
                            return

                tg.start_soon(stop_on_sigterm)
                async for ev in events:
                    if ev.kind is river.EventKind.LEADER_ELECTED:
                        say("elected", client_id)
                    elif ev.kind is river.EventKind.LEADER_LOST:
                        say("lost", client_id, reason=ev.details.get("reason"))
                tg.cancel_scope.cancel()
    say("stopped", client_id)


if __name__ == "__main__":
    url, client_id, backend, interval = sys.argv[1:5]
    anyio.run(main, url, client_id, float(interval), backend=backend)
