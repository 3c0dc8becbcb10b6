"""The LISTEN connection: topics, delivery at commit, listen changes while waiting, close."""

from __future__ import annotations

import anyio
import pytest

from river_anyio.drivers._protocol import Notification
from river_anyio.drivers.postgres import (
    AnyioConnection,
    PostgresDriver,
    PostgresListener,
    open_postgres,
)

pytestmark = pytest.mark.anyio


async def _next(listener: PostgresListener) -> Notification:
    with anyio.fail_after(10):
        return await listener.__anext__()


async def _notify(driver: PostgresDriver, topic: str, *payloads: str) -> None:
    await driver.executor().notify_many(topic, list(payloads))


async def test_receives_bare_topics_in_order(pg_url: str) -> None:
    async with open_postgres(pg_url) as driver, driver.listener() as listener:
        await listener.listen("river_insert")
        await listener.listen("river_control")
        assert listener.topics == {"river_insert", "river_control"}
        await _notify(driver, "river_insert", '{"queue": "a"}', '{"queue": "b"}')
        await _notify(driver, "river_control", '{"action":"pause","queue":"*"}')
        got = [await _next(listener) for _ in range(3)]
        assert got == [
            Notification(topic="river_insert", payload='{"queue": "a"}'),
            Notification(topic="river_insert", payload='{"queue": "b"}'),
            Notification(topic="river_control", payload='{"action":"pause","queue":"*"}'),
        ]


async def test_channel_uses_current_schema(pg_url: str) -> None:
    async with open_postgres(pg_url) as driver, driver.listener() as listener:
        await listener.listen("river_insert")
        async with await AnyioConnection.connect(pg_url) as other:
            await other.execute("SELECT pg_notify('public.river_insert', 'raw')")
        assert await _next(listener) == Notification(topic="river_insert", payload="raw")


async def test_configured_schema_prefixes_channel(pg_schema_url: str) -> None:
    async with open_postgres(pg_schema_url, schema="river_custom") as driver:
        async with driver.listener() as listener:
            await listener.listen("river_leadership")
            async with await AnyioConnection.connect(pg_schema_url) as other:
                await other.execute("SELECT pg_notify('public.river_leadership', 'wrong')")
                await other.execute("SELECT pg_notify('river_custom.river_leadership', 'raw')")
            await _notify(driver, "river_leadership", "sent")
            assert await _next(listener) == Notification(topic="river_leadership", payload="raw")
            assert await _next(listener) == Notification(topic="river_leadership", payload="sent")


async def test_delivered_only_after_commit(pg_url: str) -> None:
    async with open_postgres(pg_url) as driver, driver.listener() as listener:
        await listener.listen("river_insert")
        async with driver.transaction() as tx:
            await tx.notify_many("river_insert", ["in-tx-1", "in-tx-2"])
            # A marker sent outside the transaction arrives, the transaction's do not.
            await _notify(driver, "river_insert", "marker")
            assert (await _next(listener)).payload == "marker"
        assert (await _next(listener)).payload == "in-tx-1"
        assert (await _next(listener)).payload == "in-tx-2"

        with pytest.raises(ZeroDivisionError):
            async with driver.transaction() as tx:
                await tx.notify_many("river_insert", ["rolled-back"])
                raise ZeroDivisionError
        await _notify(driver, "river_insert", "after")
        assert (await _next(listener)).payload == "after"


async def test_listen_and_unlisten(pg_url: str) -> None:
    async with open_postgres(pg_url) as driver, driver.listener() as listener:
        await listener.listen("river_insert")
        await listener.listen("river_control")
        await listener.unlisten("river_insert")
        assert listener.topics == {"river_control"}
        await _notify(driver, "river_insert", "ignored")
        await _notify(driver, "river_control", "seen")
        assert await _next(listener) == Notification(topic="river_control", payload="seen")


async def test_listen_changes_while_a_consumer_waits_lose_nothing(pg_url: str) -> None:
    count = 50
    async with open_postgres(pg_url) as driver, driver.listener() as listener:
        await listener.listen("river_insert")
        received: list[str] = []
        done = anyio.Event()
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:

                async def consume() -> None:
                    async for n in listener:
                        if n.topic == "river_insert":
                            received.append(n.payload)
                        if len(received) == count:
                            done.set()
                            return

                async def produce() -> None:
                    for i in range(count):
                        await _notify(driver, "river_insert", str(i))

                tg.start_soon(consume)
                await anyio.wait_all_tasks_blocked()
                tg.start_soon(produce)
                # Interrupt the consumer's wait again and again while notifications flow.
                for _ in range(20):
                    await listener.listen("river_control")
                    await listener.unlisten("river_control")
                    await listener.ping()
                await done.wait()
        assert received == [str(i) for i in range(count)]


async def test_listen_while_consumer_blocked_takes_effect(pg_url: str) -> None:
    async with open_postgres(pg_url) as driver, driver.listener() as listener:
        got: list[Notification] = []
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:

                async def consume() -> None:
                    got.append(await listener.__anext__())

                tg.start_soon(consume)
                await anyio.wait_all_tasks_blocked()
                await listener.listen("river_insert")
                await _notify(driver, "river_insert", "x")
        assert got == [Notification(topic="river_insert", payload="x")]


async def test_close_wakes_a_blocked_consumer(pg_url: str) -> None:
    async with open_postgres(pg_url) as driver:
        ended = anyio.Event()
        with anyio.fail_after(10):
            async with driver.listener() as listener:
                await listener.listen("river_insert")
                async with anyio.create_task_group() as tg:

                    async def consume() -> None:
                        async for _ in listener:
                            pytest.fail("no notification was sent")
                        ended.set()

                    tg.start_soon(consume)
                    await anyio.wait_all_tasks_blocked()
                    await listener.aclose()
        assert ended.is_set()
        # Iterating a closed listener ends at once.
        assert [n async for n in listener] == []


async def test_single_consumer(pg_url: str) -> None:
    async with open_postgres(pg_url) as driver, driver.listener() as listener:
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.__anext__)
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(RuntimeError, match="already iterating"):
                await listener.__anext__()
            tg.cancel_scope.cancel()


async def test_invalid_topic(pg_url: str) -> None:
    from river_anyio._errors import ValidationError

    async with open_postgres(pg_url) as driver, driver.listener() as listener:
        with pytest.raises(ValidationError):
            await listener.listen("")


async def test_listener_connection_is_outside_the_pool(pg_url: str) -> None:
    async with open_postgres(pg_url, pool_max_size=1) as driver:
        async with driver.listener() as listener, driver.pool.connection():
            await listener.listen("river_insert")
            assert driver.statistics().in_use == 1
