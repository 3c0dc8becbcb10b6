"""A large insert lets the event loop's other tasks run while it builds its rows, on
PostgreSQL and SQLite, under asyncio and trio."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, overload

import anyio
import anyio.lowlevel
import attrs
import pytest

import river_anyio as river
from river_anyio.drivers import JobInsertParams

from .support import client_on

pytestmark = pytest.mark.anyio


@attrs.frozen
class Note:
    kind: ClassVar[str] = "note"
    text: str


class Ticker:
    """A task of the event loop that counts its turns."""

    def __init__(self) -> None:
        self.turns = 0

    async def run(self) -> None:
        while True:
            self.turns += 1
            await anyio.lowlevel.checkpoint()


class Watched(Sequence[Any]):
    """A sequence that records the ticker's turns each time one of its items is read."""

    def __init__(self, items: Sequence[Any], ticker: Ticker, seen: list[int]) -> None:
        self._items, self._ticker, self._seen = items, ticker, seen

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return Watched(self._items[index], self._ticker, self._seen)
        self._seen.append(self._ticker.turns)
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Any]:
        for item in self._items:
            self._seen.append(self._ticker.turns)
            yield item


async def test_insert_many_lets_other_tasks_run_while_it_builds_its_rows(
    database_url: str,
) -> None:
    ticker = Ticker()
    seen: list[int] = []
    notes = [Note(text=f"n{i}") for i in range(2_000)]
    async with client_on(database_url) as client, anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        results = await client.insert_many(Watched(notes, ticker, seen))
        count = await client.insert_many_fast(Watched(notes, ticker, []))
        tg.cancel_scope.cancel("test done")
    assert len(seen) == 2_000
    assert seen[-1] > seen[0]  # the ticker ran between the first row built and the last
    assert [r.job.args["text"] for r in results] == [n.text for n in notes]
    assert count == 2_000


async def test_a_large_copy_lets_other_tasks_run_while_it_encodes_its_rows(pg_url: str) -> None:
    """PostgreSQL's COPY rows are encoded a slice at a time; the slices make one COPY whose
    rows are those given, escapes included at the slices' edges."""
    ticker = Ticker()
    seen: list[int] = []

    class Encoded:
        """A job's params, recording the ticker's turns when its args are encoded."""

        def __init__(self, params: JobInsertParams) -> None:
            self._params = params

        def __getattr__(self, name: str) -> Any:
            if name == "encoded_args":
                seen.append(ticker.turns)
            return getattr(self._params, name)

    class Watching:
        async def insert(self, params: Sequence[JobInsertParams], next: Any) -> Any:
            return await next([Encoded(p) for p in params])

    texts = [f"row {i}\t\\ \n{'é' * (i % 3)}" for i in range(2_500)]
    async with river.open_client(pg_url, middleware=[Watching()], queues=None) as run:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker.run)
            count = await run.client.insert_many_fast([Note(text=t) for t in texts])
            tg.cancel_scope.cancel("test done")
        rows = await run.client.driver.executor().fetch_all(
            "SELECT args->>'text' FROM river_job ORDER BY id"
        )
    assert count == 2_500
    assert [r[0] for r in rows] == texts
    assert len(seen) >= 2_500  # each row's args read once at least
    assert seen[-1] > seen[0]  # the ticker ran between the first row encoded and the last
