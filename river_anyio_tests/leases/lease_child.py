"""A client in a process of its own, for the multi-process lease tests.

``python -m river_anyio_tests.leases.lease_child MODE URL BACKEND LOG``:

- ``rounds``: prints ``ready``, then for each round number read from stdin calls
  ``with_lease(f"round-{n}", fn, ttl=30)``, where ``fn`` appends ``"<n> <pid>"`` to the file
  ``LOG`` (opened for appending, one write per line), and prints ``<n> 1`` or ``<n> 0``;
  stops at end of input.
- ``hold``: takes ``crash-with`` with ``with_lease`` and holds ``crash-block`` with ``lease``
  (short terms, renewed), prints ``held``, and waits to be killed.
"""

from __future__ import annotations

import os
import sys

import anyio
import anyio.to_thread

import river_anyio as river

HOLD_TTL = 1.0


def say(text: str) -> None:
    print(text, flush=True)


async def rounds(client: river.Client, log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while line := await anyio.to_thread.run_sync(sys.stdin.readline):
            n = int(line)

            async def fn(n: int = n) -> None:
                os.write(fd, f"{n} {os.getpid()}\n".encode())

            ran = await client.with_lease(f"round-{n}", fn, ttl=30)
            say(f"{n} {int(ran)}")
    finally:
        os.close(fd)


async def hold(client: river.Client) -> None:
    async def nothing() -> None:
        pass

    assert await client.with_lease("crash-with", nothing, ttl=HOLD_TTL)
    async with client.lease("crash-block", ttl=HOLD_TTL) as held:
        assert held is not None
        say("held")
        await anyio.sleep_forever()


async def main(mode: str, url: str, log: str) -> None:
    async with river.open_client(url) as run:
        if mode == "rounds":
            say("ready")
            await rounds(run.client, log)
        else:
            await hold(run.client)


if __name__ == "__main__":
    mode, url, backend, log = sys.argv[1:5]
    anyio.run(main, mode, url, log, backend=backend)
