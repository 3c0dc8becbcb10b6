"""Conformance of the lease operations (River's river_leader queries) on every driver."""

from __future__ import annotations

import datetime as dt
import json

import anyio
import pytest

from river_anyio.drivers import TOPIC_LEADERSHIP

from .support import open_driver

pytestmark = pytest.mark.anyio
UTC = dt.UTC


async def test_elect_reelect_expire_and_resign(database_url: str) -> None:
    t0 = dt.datetime(2030, 1, 2, 3, 4, 5, 123000, tzinfo=UTC)
    async with open_driver(database_url) as driver:
        ex = driver.executor()
        async with driver.transaction() as tx:
            assert await tx.leader_delete_expired(now=t0) == 0
            won = await tx.leader_attempt_elect(leader_id="a", ttl=15, now=t0)
        assert won is not None
        assert (won.leader_id, won.elected_at, won.expires_at) == (
            "a",
            t0,
            t0 + dt.timedelta(seconds=15),
        )
        # held: nobody else gets it, and it is not expired yet
        assert await ex.leader_attempt_elect(leader_id="b", ttl=15, now=t0) is None
        assert await ex.leader_delete_expired(now=t0 + dt.timedelta(seconds=14)) == 0
        # renewed only by its holder, for its term, while unexpired
        t1 = t0 + dt.timedelta(seconds=5)
        kept = await ex.leader_attempt_reelect(leader_id="a", elected_at=t0, ttl=15, now=t1)
        assert kept is not None and kept.expires_at == t1 + dt.timedelta(seconds=15)
        assert kept.elected_at == t0
        other_term = t0 + dt.timedelta(milliseconds=1)
        assert await ex.leader_attempt_reelect(leader_id="a", elected_at=other_term, ttl=15) is None
        assert await ex.leader_attempt_reelect(leader_id="b", elected_at=t0, ttl=15, now=t1) is None
        late = t1 + dt.timedelta(seconds=16)
        assert (
            await ex.leader_attempt_reelect(leader_id="a", elected_at=t0, ttl=15, now=late) is None
        )
        # expired: deleted, and someone else is elected (with the database's clock)
        assert await ex.leader_delete_expired(now=late) == 1
        b = await ex.leader_attempt_elect(leader_id="b", ttl=15)
        assert b is not None and b.leader_id == "b"
        got = await ex.leader_get_elected()
        assert got == b
        assert await ex.leader_resign(leader_id="a", elected_at=t0) is False

        async with driver.listener() as listener:
            await listener.listen(TOPIC_LEADERSHIP)
            assert await ex.leader_resign(leader_id="b", elected_at=b.elected_at) is True
            # a marker after it: on SQLite, as River's driver, resigning notifies nothing
            await ex.notify_many(TOPIC_LEADERSHIP, ['{"marker":true}'])
            notes = aiter(listener)
            with anyio.fail_after(10):
                note = await anext(notes)
                if driver.dialect != "sqlite":
                    assert json.loads(note.payload) == {"leader_id": "b", "action": "resigned"}
                    note = await anext(notes)
        assert json.loads(note.payload) == {"marker": True}
        assert await ex.leader_get_elected() is None


async def test_index_operations(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        ex = driver.executor()
        assert await ex.index_exists("river_job_kind")
        assert not await ex.index_exists("river_job_nonexistent")
        assert await ex.index_reindex_artifacts("river_job_kind") == []
        await ex.index_reindex("river_job_kind")
        assert await ex.index_exists("river_job_kind")
        await ex.exec_script("CREATE INDEX river_job_scratch ON river_job (queue)")
        await ex.index_drop_if_exists("river_job_scratch")
        await ex.index_drop_if_exists("river_job_scratch")
        assert not await ex.index_exists("river_job_scratch")
