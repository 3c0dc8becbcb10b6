"""A client in a process of its own, for the multi-process global-limit tests.

``python -m river_anyio_tests.runtime.limits_child URL CLIENT_ID BACKEND`` works two queues:
``rated`` (``RateLimit(RATE, per=1 s)``, 10 local workers) and ``capped``
(``global_max_workers=CAP``, 10 local workers), prints ``ready`` once started, and stops
gracefully on SIGTERM (printing ``stopped``).
"""

from __future__ import annotations

import datetime as dt
import signal
import sys
from typing import ClassVar

import anyio
import attrs

import river_anyio as river

RATE = 20
CAP = 4
LOCAL_WORKERS = 10


@attrs.frozen
class Quick:
    kind: ClassVar[str] = "limits_quick"


@attrs.frozen
class Slow:
    kind: ClassVar[str] = "limits_slow"
    ms: int


async def quick(ctx: river.WorkContext, job: river.Job[Quick]) -> None:
    pass


async def slow(ctx: river.WorkContext, job: river.Job[Slow]) -> None:
    await anyio.sleep(job.args.ms / 1000)


def queues() -> dict[str, river.QueueConfig]:
    return {
        "rated": river.QueueConfig(
            max_workers=LOCAL_WORKERS, rate_limit=river.RateLimit(RATE, per=dt.timedelta(seconds=1))
        ),
        "capped": river.QueueConfig(max_workers=LOCAL_WORKERS, global_max_workers=CAP),
    }


async def main(url: str, client_id: str) -> None:
    workers = river.Workers()
    workers.add(Quick, quick)
    workers.add(Slow, slow)
    async with river.open_client(
        url,
        id=client_id,
        queues=queues(),
        workers=workers,
        leader_election_disabled=True,
        fetch_cooldown=0.02,
        soft_stop_timeout=2.0,
    ) as run:
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            print("ready", flush=True)
            async for _ in signals:
                run.stop()
                break
    print("stopped", flush=True)


if __name__ == "__main__":
    url, client_id, backend = sys.argv[1:4]
    anyio.run(main, url, client_id, backend=backend)
