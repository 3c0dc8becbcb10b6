"""The separate inserter of ``river-anyio bench --inserter process``: a process of its own with
its own client, inserting ``--rate`` stamped jobs a second for ``--duration`` seconds into the
database named by ``RIVER_ANYIO_BENCH_URL``; prints how many it inserted as its last line."""

from __future__ import annotations

import argparse
import os

import anyio

from ._bench import URL_VARIABLE, insert_process_main


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m river_anyio._bench_inserter")
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--loop", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--schema", default=None)
    args = parser.parse_args()
    url = os.environ[URL_VARIABLE]
    inserted = anyio.run(
        lambda: insert_process_main(
            url, schema=args.schema, rate=args.rate, duration=args.duration
        ),
        backend=args.loop,
    )
    print(inserted, flush=True)


if __name__ == "__main__":
    main()
