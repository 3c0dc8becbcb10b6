"""Jobs inserted by River's official insert-only Python client read back through river_anyio.

The ``riverqueue`` package (SQLAlchemy driver) is PostgreSQL-only. Its unique inserts target
River's pre-006 unique index and fail on River's current schema (River Go's schema does the
same); that defect is asserted here rather than hidden.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

import anyio.to_thread
import pytest

import river_anyio as river
from river_anyio.drivers import open_driver

riverqueue = pytest.importorskip("riverqueue")
sqlalchemy = pytest.importorskip("sqlalchemy")
from riverqueue.driver import riversqlalchemy  # noqa: E402

pytestmark = pytest.mark.anyio
UTC = dt.UTC


@dataclasses.dataclass
class SortArgs:
    strings: list[str]
    kind: str = "sort"

    def to_json(self) -> str:
        return json.dumps({"strings": self.strings})


def _engine(url: str) -> Any:
    return sqlalchemy.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


def assert_same(theirs: Any, ours: river.JobRow) -> None:
    assert ours.id == theirs.id
    assert ours.kind == theirs.kind
    assert ours.args == theirs.args
    assert ours.attempt == theirs.attempt
    assert ours.attempted_at == theirs.attempted_at
    assert list(ours.attempted_by) == list(theirs.attempted_by or [])
    assert ours.created_at == theirs.created_at
    assert list(ours.errors) == list(theirs.errors or [])
    assert ours.finalized_at == theirs.finalized_at
    assert ours.max_attempts == theirs.max_attempts
    assert dict(ours.metadata) == theirs.metadata
    assert ours.priority == theirs.priority
    assert ours.queue == theirs.queue
    assert ours.scheduled_at == theirs.scheduled_at
    assert ours.state.value == str(getattr(theirs.state, "value", theirs.state))
    assert list(ours.tags) == list(theirs.tags)


async def test_jobs_inserted_by_riverqueue_read_back_identically(pg_url: str) -> None:
    at = dt.datetime(2032, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)

    def insert() -> list[Any]:
        engine = _engine(pg_url)
        try:
            client = riverqueue.Client(riversqlalchemy.Driver(engine))
            a = client.insert(SortArgs(strings=["whale", "tiger"]))
            b = client.insert(
                SortArgs(strings=["ünïcode", "<&>"]),
                insert_opts=riverqueue.InsertOpts(
                    max_attempts=17, priority=3, queue="sorting", tags=["custom"], scheduled_at=at
                ),
            )
            with engine.begin() as conn:
                c = client.insert_tx(conn, SortArgs(strings=["in", "tx"]))
            n = client.insert_many(
                [
                    SortArgs(strings=["many1"]),
                    riverqueue.InsertManyParams(SortArgs(strings=["many2"])),
                ]
            )
            assert n == 2
            return [a.job, b.job, c.job]
        finally:
            engine.dispose()

    theirs = await anyio.to_thread.run_sync(insert)
    async with open_driver(pg_url) as driver:
        ex = driver.executor()
        for job in theirs:
            ours = await ex.job_get_by_id(job.id)
            assert ours is not None
            assert_same(job, ours)
        rows = await ex.job_list(kinds=["sort"], limit=10)
    assert [r.args["strings"] for r in rows] == [
        ["whale", "tiger"],
        ["ünïcode", "<&>"],
        ["in", "tx"],
        ["many1"],
        ["many2"],
    ]
    assert rows[1].state is river.JobState.SCHEDULED and rows[1].scheduled_at == at


async def test_riverqueue_unique_insert_fails_on_current_schema(pg_url: str) -> None:
    def insert_unique() -> None:
        engine = _engine(pg_url)
        try:
            client = riverqueue.Client(riversqlalchemy.Driver(engine))
            client.insert(
                SortArgs(strings=["u"]),
                insert_opts=riverqueue.InsertOpts(unique_opts=riverqueue.UniqueOpts(by_args=True)),
            )
        finally:
            engine.dispose()

    with pytest.raises(
        Exception, match="no unique or exclusion constraint matching the ON CONFLICT"
    ):
        await anyio.to_thread.run_sync(insert_unique)
