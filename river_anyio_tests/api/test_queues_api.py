"""The queue API (``client.queues``) on PostgreSQL and SQLite, under asyncio and trio: rows,
River's control notifications, ``*_tx`` variants and bad input. Effects on running clients'
producers are tested in ``runtime/test_client_apis.py``."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

import river_anyio as river
from river_anyio.drivers import TOPIC_CONTROL, Listener

from .support import Undo, client_on

pytestmark = pytest.mark.anyio


async def controls(listener: Listener, n: int) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    with anyio.fail_after(10):
        async for note in listener:
            assert note.topic == TOPIC_CONTROL
            got.append(json.loads(note.payload))
            if len(got) == n:
                break
    return got


async def sentinel(client: river.Client, listener: Listener) -> None:
    """Nothing else was sent before a sentinel sent now."""
    await client.driver.executor().notify_many(TOPIC_CONTROL, ['{"action":"sentinel"}'])
    assert await controls(listener, 1) == [{"action": "sentinel"}]


async def test_get_and_list(database_url: str) -> None:
    async with client_on(database_url) as client:
        ex = client.driver.executor()
        for name in ("b", "a", "c"):
            await ex.queue_create_or_set_updated_at(name=name)
        assert (await client.queues.get("a")).name == "a"
        with pytest.raises(river.NotFoundError):
            await client.queues.get("zzz")
        assert [q.name for q in await client.queues.list()] == ["a", "b", "c"]
        assert [q.name for q in await client.queues.list(limit=2)] == ["a", "b"]
        with pytest.raises(river.ValidationError, match="limit"):
            await client.queues.list(limit=0)
        with pytest.raises(Undo):
            async with client.transaction() as tx:
                await client.driver.executor_for(tx).queue_create_or_set_updated_at(name="d")
                assert (await client.queues.get_tx(tx, "d")).name == "d"
                assert len(await client.queues.list_tx(tx)) == 4
                raise Undo
        with pytest.raises(river.NotFoundError):
            await client.queues.get("d")


async def test_pause_resume_notify_every_client(database_url: str) -> None:
    async with client_on(database_url) as client, client.driver.listener() as listener:
        await listener.listen(TOPIC_CONTROL)
        ex = client.driver.executor()
        await ex.queue_create_or_set_updated_at(name="q")
        await client.queues.pause("q")
        assert (await client.queues.get("q")).paused_at is not None
        assert await controls(listener, 1) == [{"action": "pause", "queue": "q"}]
        await client.queues.resume("*")
        assert (await client.queues.get("q")).paused_at is None
        assert await controls(listener, 1) == [{"action": "resume", "queue": "*"}]
        with pytest.raises(river.NotFoundError):
            await client.queues.pause("nope")
        with pytest.raises(river.NotFoundError):
            await client.queues.resume("nope")
        with pytest.raises(river.ValidationError):
            await client.queues.pause("")
        # in a transaction: applied and announced at commit, or not at all
        with pytest.raises(Undo):
            async with client.transaction() as tx:
                await client.queues.pause_tx(tx, "q")
                assert (await client.queues.get_tx(tx, "q")).paused_at is not None
                raise Undo
        assert (await client.queues.get("q")).paused_at is None
        async with client.transaction() as tx:
            await client.queues.pause_tx(tx, "*")
        assert (await client.queues.get("q")).paused_at is not None
        assert await controls(listener, 1) == [{"action": "pause", "queue": "*"}]
        async with client.transaction() as tx:
            await client.queues.resume_tx(tx, "q")
        assert await controls(listener, 1) == [{"action": "resume", "queue": "q"}]
        await sentinel(client, listener)


async def test_update_metadata(database_url: str) -> None:
    async with client_on(database_url) as client, client.driver.listener() as listener:
        await listener.listen(TOPIC_CONTROL)
        await client.driver.executor().queue_create_or_set_updated_at(name="q")
        row = await client.queues.update("q", metadata={"region": "eu", "n": 1})
        assert row.metadata == {"region": "eu", "n": 1}
        assert (await client.queues.get("q")).metadata == {"region": "eu", "n": 1}
        assert await controls(listener, 1) == [
            {"action": "metadata_changed", "metadata": {"region": "eu", "n": 1}, "queue": "q"}
        ]
        with pytest.raises(Undo):
            async with client.transaction() as tx:
                inner = await client.queues.update_tx(tx, "q", metadata={"gone": True})
                assert inner.metadata == {"gone": True}
                raise Undo
        assert (await client.queues.get("q")).metadata == {"region": "eu", "n": 1}
        # no metadata: only updated_at moves, nobody is told
        assert (await client.queues.update("q")).metadata == {"region": "eu", "n": 1}
        with pytest.raises(river.NotFoundError):
            await client.queues.update("nope", metadata={})
        with pytest.raises(river.ValidationError, match="metadata"):
            await client.queues.update("q", metadata=[1])  # type: ignore[arg-type]
        await sentinel(client, listener)


async def test_local_queues_need_a_running_client(database_url: str) -> None:
    async with client_on(database_url) as client:
        with pytest.raises(river.ValidationError, match="running client"):
            await client.local_queues.add("extra", river.QueueConfig(max_workers=1))
        with pytest.raises(river.ValidationError, match="running client"):
            await client.local_queues.remove("extra")
    async with river.open_client(database_url) as run:  # no workers: works no jobs
        with pytest.raises(river.ValidationError, match="no workers"):
            await run.client.local_queues.add("extra", river.QueueConfig(max_workers=1))
