"""The separate inserter of ``river-anyio bench --inserter process``: a process of its own with
its own client, inserting ``--rate`` stamped jobs a second for ``--duration`` seconds (in the
``--insert`` style, ``--insert-size`` jobs a tick, up to ``--in-flight`` ticks at once) into
the database named by ``RIVER_ANYIO_BENCH_URL``; its last line is how many it inserted and in
how many seconds, and ``--returned`` names the file where it writes when each job's insert call
returned."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import anyio

from ._bench import URL_VARIABLE, InsertSchedule, insert_process_main


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m river_anyio._bench_inserter")
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--insert", choices=("one", "burst", "many"), default="one")
    parser.add_argument("--insert-size", type=int, default=1)
    parser.add_argument("--in-flight", type=int, default=None)
    parser.add_argument("--loop", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--schema", default=None)
    parser.add_argument("--returned", type=Path, required=True)
    args = parser.parse_args()
    url = os.environ[URL_VARIABLE]
    schedule = InsertSchedule(
        rate=args.rate,
        duration=args.duration,
        style=args.insert,
        size=args.insert_size,
        max_ticks=args.in_flight,
    )
    returned: dict[int, float] = {}
    inserted, seconds = anyio.run(
        lambda: insert_process_main(url, schema=args.schema, schedule=schedule, returned=returned),
        backend=args.loop,
    )
    args.returned.write_text("".join(f"{n} {at!r}\n" for n, at in returned.items()))
    print(inserted, repr(seconds), flush=True)


if __name__ == "__main__":
    main()
