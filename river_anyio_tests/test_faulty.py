"""The fault-injecting driver itself (``river_anyio_tests/faulty.py``), on both databases and
both loops: each fault does what it says to a real database, and nothing else changes."""

from __future__ import annotations

import inspect
import json
from typing import Any, ClassVar

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio.drivers import TOPIC_CONTROL, Executor

from .drivers.support import params
from .faulty import FaultyDriver, open_faulty

pytestmark = pytest.mark.anyio
S = river.JobState


async def insert(driver: FaultyDriver, n: int = 1, **kw: Any) -> list[river.JobRow]:
    rows = await driver.inner.executor().job_insert_fast_many([params(i, **kw) for i in range(n)])
    return [r.job for r in rows]


async def claim(ex: Executor, n: int = 10, queue: str = "default") -> list[river.JobRow]:
    return await ex.job_get_available(queue=queue, max_to_lock=n, client_id="c")


async def state(driver: FaultyDriver, job_id: int) -> river.JobState:
    row = await driver.inner.executor().job_get_by_id(job_id)
    assert row is not None
    return row.state


async def test_fail_raises_a_transient_connection_error_without_running(database_url: str) -> None:
    async with open_faulty(database_url) as faulty:
        (job,) = await insert(faulty)
        fault = faulty.fail("job_get_available")
        with pytest.raises(river.ConnectionLostError) as info:
            await claim(faulty.executor())
        assert info.value.transient
        assert (fault.hits, fault.hit.is_set()) == (1, True)
        assert await state(faulty, job.id) is S.AVAILABLE  # it never ran
        # times=1: the next call goes through
        assert [j.id for j in await claim(faulty.executor())] == [job.id]
        assert faulty.calls["job_get_available"] == 2


async def test_fail_with_a_permanent_error_or_any_exception(database_url: str) -> None:
    async with open_faulty(database_url) as faulty:
        faulty.fail("job_get_by_id", river.DatabaseError("permanent"))
        faulty.fail("queue_get", lambda: RuntimeError("a bug"), times=None)
        with pytest.raises(river.DatabaseError, match=r"^permanent$") as info:
            await faulty.executor().job_get_by_id(1)
        assert not info.value.transient
        for _ in range(3):
            with pytest.raises(RuntimeError, match="a bug"):
                await faulty.executor().queue_get("default")
        assert await faulty.executor().job_get_by_id(1) is None


async def test_drop_reply_runs_the_operation_for_real(database_url: str) -> None:
    async with open_faulty(database_url) as faulty:
        a, b = await insert(faulty, 2)
        fault = faulty.drop_reply("job_get_available")
        with pytest.raises(river.ConnectionLostError):
            await claim(faulty.executor())
        # committed: both rows are running, and the lost reply is kept
        assert [await state(faulty, j.id) for j in (a, b)] == [S.RUNNING, S.RUNNING]
        (reply,) = fault.replies
        assert [j.id for j in reply] == [a.id, b.id]
        assert fault.hit.is_set()
        assert await claim(faulty.executor()) == []


async def test_delay_holds_the_call_until_released(database_url: str) -> None:
    async with open_faulty(database_url) as faulty:
        (job,) = await insert(faulty)
        release = anyio.Event()
        fault = faulty.delay("job_get_available", until=release)
        got: list[river.JobRow] = []

        async def claimer() -> None:
            got.extend(await claim(faulty.executor()))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(claimer)
                await fault.hit.wait()
                assert await state(faulty, job.id) is S.AVAILABLE  # held before it runs
                release.set()
        assert [j.id for j in got] == [job.id]


async def test_delay_by_a_time(database_url: str) -> None:
    async with open_faulty(database_url) as faulty:
        fault = faulty.delay("queue_list", 30.0)
        with anyio.move_on_after(0.1) as scope:
            await faulty.executor().queue_list()
        assert scope.cancelled_caught and fault.hits == 1  # still waiting, then cancelled
        assert await faulty.executor().queue_list() == []  # times=1: no more delay


async def test_skip_times_and_where_choose_the_calls(database_url: str) -> None:
    async with open_faulty(database_url) as faulty:
        await insert(faulty, 3, queue="q")
        fault = faulty.fail(
            "job_get_available",
            skip=1,
            times=2,
            where=lambda call: call.kwargs["queue"] == "q",
        )
        ex = faulty.executor()
        assert await claim(ex, 1, queue="other") == []  # not matched: not counted
        assert len(await claim(ex, 1, queue="q")) == 1  # skipped
        for _ in range(2):
            with pytest.raises(river.ConnectionLostError):
                await claim(ex, 1, queue="q")
        assert len(await claim(ex, 1, queue="q")) == 1  # used up
        assert (fault.seen, fault.hits) == (4, 2)
        faulty.fail("job_get_available", times=None)
        faulty.clear()
        assert len(await claim(ex, 1, queue="q")) == 1


async def test_transactions_and_executor_for_go_through_the_faults(database_url: str) -> None:
    async with open_faulty(database_url) as faulty:
        (job,) = await insert(faulty)
        faulty.fail("transaction")
        with pytest.raises(river.ConnectionLostError):
            async with faulty.transaction():
                pytest.fail("the transaction must not begin")
        faulty.drop_reply("job_get_available")
        with pytest.raises(river.ConnectionLostError):
            async with faulty.transaction() as tx:
                assert faulty.executor_for(tx) is tx
                await claim(tx)
        # in a transaction a lost reply rolls the transaction back
        assert await state(faulty, job.id) is S.AVAILABLE
        assert faulty.calls["transaction"] == 2


async def test_the_listener_goes_through_the_faults(database_url: str) -> None:
    async with open_faulty(database_url) as faulty:
        faulty.fail("listener")
        with pytest.raises(river.ConnectionLostError):
            async with faulty.listener():
                pytest.fail("the listener must not open")
        faulty.fail("notification", skip=1)
        closed = faulty.fail("listener_close", lambda: RuntimeError("close failed"))
        with anyio.fail_after(10), pytest.raises(RuntimeError, match="close failed"):
            async with faulty.listener() as listener:
                await listener.listen(TOPIC_CONTROL)
                await faulty.executor().notify_many(TOPIC_CONTROL, ['{"n":1}', '{"n":2}'])
                got = []
                with pytest.raises(river.ConnectionLostError):
                    async for note in listener:
                        got.append(json.loads(note.payload))
                assert got == [{"n": 1}]
        assert closed.hits == 1
        assert faulty.calls["listen"] == 1


def _protocol_methods() -> list[str]:
    return [
        name
        for name, fn in inspect.getmembers(Executor)
        if not name.startswith("_") and inspect.iscoroutinefunction(fn)
    ]


async def test_every_executor_operation_is_wrapped(database_url: str) -> None:
    names = _protocol_methods()
    assert "job_get_available" in names and "job_give_back_lost_claims" in names
    async with open_faulty(database_url) as faulty:
        ex = faulty.executor()
        assert ex.dialect == faulty.inner.dialect
        for name in names:
            fault = faulty.fail(name, lambda: RuntimeError("wrapped"))
            fn = getattr(ex, name)
            with pytest.raises(RuntimeError, match="wrapped"):
                await fn()  # raised before the arguments reach the real driver
            assert fault.hits == 1
        assert set(faulty.calls) == set(names)


@attrs.frozen
class Plain:
    kind: ClassVar[str] = "plain"
    n: int


async def test_a_client_runs_through_it(database_url: str) -> None:
    async with open_faulty(database_url) as faulty:
        done = anyio.Event()

        async def work(ctx: river.WorkContext, job: river.Job[Plain]) -> None:
            done.set()

        workers = river.Workers()
        workers.add(Plain, work)
        with anyio.fail_after(10):
            async with river.open_client(
                faulty, workers=workers, queues={"default": river.QueueConfig(max_workers=1)}
            ) as run:
                assert run.client.driver is faulty
                await run.client.insert(Plain(1))
                await done.wait()
        assert faulty.calls["job_get_available"] >= 1
        assert faulty.calls["job_set_state_if_running_many"] >= 1
