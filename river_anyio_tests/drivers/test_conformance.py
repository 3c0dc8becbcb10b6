"""One driver conformance suite, run against every driver (PostgreSQL and SQLite) on both loops.

Everything here goes through the public ``Driver``/``Executor``/``Listener`` protocol only.
"""

from __future__ import annotations

import datetime as dt
import json

import anyio
import pytest

import river_anyio as river
from river_anyio._unique import unique_states_mask
from river_anyio.drivers import TOPIC_CONTROL, TOPIC_INSERT

from .support import open_driver, params, ph

pytestmark = pytest.mark.anyio
UTC = dt.UTC
S = river.JobState


async def test_insert_fast_many_round_trip(database_url: str) -> None:
    at = dt.datetime(2030, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    async with open_driver(database_url) as driver:
        async with driver.transaction() as tx:
            rows = await tx.job_insert_fast_many(
                [
                    params(1),
                    params(
                        2,
                        kind="other_kind",
                        max_attempts=3,
                        metadata=b'{"k":"v","nested":{"x":[1,2]}}',
                        priority=4,
                        queue="q2",
                        state=S.SCHEDULED,
                        scheduled_at=at,
                        tags=("a-tag", "b_tag"),
                    ),
                    params(3, state=S.PENDING),
                ]
            )
        assert [r.unique_skipped_as_duplicate for r in rows] == [False, False, False]
        a, b, c = (r.job for r in rows)
        assert a.id < b.id < c.id
        assert (a.args, a.kind, a.state, a.queue, a.priority) == (
            {"n": 1},
            "conformance",
            S.AVAILABLE,
            "default",
            1,
        )
        assert (b.kind, b.max_attempts, b.priority, b.queue, b.state) == (
            "other_kind",
            3,
            4,
            "q2",
            S.SCHEDULED,
        )
        # SQLite inserts carry River's duplicate-detection nonce in every job's metadata
        meta = {k: v for k, v in b.metadata.items() if k != "river:unique_nonce"}
        assert meta == {"k": "v", "nested": {"x": [1, 2]}}
        if driver.dialect != "postgres":  # River's SQLite text keeps milliseconds (rounded)
            at = at.replace(microsecond=123000)
        assert b.scheduled_at == at
        assert b.tags == ("a-tag", "b_tag")
        assert c.state is S.PENDING
        got = await driver.executor().job_get_by_id(b.id)
        assert got is not None and got.id == b.id and got.scheduled_at == at
        assert got.created_at.utcoffset() == dt.timedelta(0)
        assert await driver.executor().job_get_by_id(10**12) is None


async def test_unique_conflicts_return_the_existing_row(database_url: str) -> None:
    key = bytes(range(32))
    mask = unique_states_mask(
        [S.AVAILABLE, S.COMPLETED, S.PENDING, S.RETRYABLE, S.RUNNING, S.SCHEDULED]
    )
    async with open_driver(database_url) as driver:
        async with driver.transaction() as tx:
            (first,) = await tx.job_insert_fast_many(
                [params(1, unique_key=key, unique_states=mask)]
            )
        async with driver.transaction() as tx:
            again = await tx.job_insert_fast_many(
                [params(2), params(3, unique_key=key, unique_states=mask), params(4)]
            )
        assert [r.unique_skipped_as_duplicate for r in again] == [False, True, False]
        assert again[1].job.id == first.job.id
        assert again[1].job.args == {"n": 1}
        assert first.job.unique_key == key
        assert first.job.unique_states == frozenset(
            {S.AVAILABLE, S.COMPLETED, S.PENDING, S.RETRYABLE, S.RUNNING, S.SCHEDULED}
        )
        # a row whose state is outside its own mask does not block a new one
        ex = driver.executor()
        p = ph(database_url)
        await ex.execute(
            f"UPDATE river_job SET state = 'cancelled', finalized_at = {p} WHERE id = {p}",
            (dt.datetime.now(UTC) if p == "%s" else "2030-01-01 00:00:00", first.job.id),
        )
        async with driver.transaction() as tx:
            (fresh,) = await tx.job_insert_fast_many(
                [params(5, unique_key=key, unique_states=mask)]
            )
        assert not fresh.unique_skipped_as_duplicate and fresh.job.id != first.job.id


async def test_insert_no_returning_counts(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        async with driver.transaction() as tx:
            n = await tx.job_insert_fast_many_no_returning([params(i) for i in range(1000)])
        assert n == 1000
        rows = await driver.executor().job_list(limit=2000)
        assert sorted(r.args["n"] for r in rows) == list(range(1000))


async def test_job_list_filters_and_order(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        async with driver.transaction() as tx:
            inserted = await tx.job_insert_fast_many(
                [
                    params(0),
                    params(1, kind="k2"),
                    params(2, queue="other"),
                    params(3, state=S.SCHEDULED, scheduled_at=dt.datetime(2031, 1, 1, tzinfo=UTC)),
                    params(4),
                ]
            )
        ids = [r.job.id for r in inserted]
        ex = driver.executor()
        assert [r.id for r in await ex.job_list()] == ids
        assert [r.id for r in await ex.job_list(kinds=["k2"])] == [ids[1]]
        assert [r.id for r in await ex.job_list(queues=["other"])] == [ids[2]]
        assert [r.id for r in await ex.job_list(states=[S.SCHEDULED])] == [ids[3]]
        assert [r.id for r in await ex.job_list(ids=[ids[4], ids[0]])] == [ids[0], ids[4]]
        assert [r.id for r in await ex.job_list(after_id=ids[2], limit=1)] == [ids[3]]
        assert [
            r.id
            for r in await ex.job_list(
                kinds=["conformance"], queues=["default"], states=[S.AVAILABLE]
            )
        ] == [
            ids[0],
            ids[4],
        ]


async def test_transaction_rolls_back_on_error_and_on_cancel(database_url: str) -> None:
    async with open_driver(database_url) as driver:

        class Boom(Exception):
            pass

        with pytest.raises(Boom):
            async with driver.transaction() as tx:
                await tx.job_insert_fast_many([params(1)])
                raise Boom
        with anyio.CancelScope() as scope:
            async with driver.transaction() as tx:
                await tx.job_insert_fast_many([params(2)])
                scope.cancel()
                await anyio.sleep(1)
        assert scope.cancelled_caught
        assert await driver.executor().job_list() == []
        # the driver is still usable afterwards
        async with driver.transaction() as tx:
            await tx.job_insert_fast_many([params(3)])
        assert [r.args["n"] for r in await driver.executor().job_list()] == [3]


async def test_generic_access(database_url: str) -> None:
    p = ph(database_url)
    async with open_driver(database_url) as driver:
        ex = driver.executor()
        assert await ex.table_exists("river_job")
        assert not await ex.table_exists("no_such_table")
        assert await ex.column_exists("river_job", "unique_states")
        assert not await ex.column_exists("river_job", "nope")
        assert await ex.fetch_all(f"SELECT {p} + 1", (41,)) == [(42,)]
        await ex.exec_script("CREATE TABLE scratch (a integer); CREATE TABLE scratch2 (b integer);")
        assert await ex.execute(f"INSERT INTO scratch (a) VALUES ({p})", (1,)) == 1
        assert await ex.fetch_all("SELECT a FROM scratch") == [(1,)]
        assert ex.dialect == driver.dialect


async def test_database_errors_are_translated(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        ex = driver.executor()
        with pytest.raises(river.IntegrityError):
            await ex.execute("INSERT INTO river_job (args, kind, priority) VALUES ('{}', 'k', 9)")
        await ex.exec_script("CREATE TABLE uniq (a integer PRIMARY KEY)")
        await ex.execute("INSERT INTO uniq (a) VALUES (1)")
        with pytest.raises(river.UniqueViolationError):
            await ex.execute("INSERT INTO uniq (a) VALUES (1)")
        with pytest.raises(river.DatabaseError):
            await ex.fetch_all("SELECT * FROM missing_table")


async def test_notifications_arrive_after_commit_only(database_url: str) -> None:
    async with open_driver(database_url) as sender, open_driver(database_url) as receiver:
        async with receiver.listener() as listener:
            await listener.listen(TOPIC_INSERT)
            await listener.listen(TOPIC_CONTROL)
            with pytest.raises(RuntimeError):
                async with sender.transaction() as tx:
                    await tx.notify_many(TOPIC_INSERT, ['{"queue": "rolled_back"}'])
                    raise RuntimeError
            async with sender.transaction() as tx:
                await tx.notify_many(TOPIC_INSERT, ['{"queue": "a"}', '{"queue": "b"}'])
                await tx.notify_many(TOPIC_CONTROL, ['{"action":"pause","queue":"a"}'])
            got = []
            with anyio.fail_after(10):
                async for note in listener:
                    got.append((note.topic, json.loads(note.payload)))
                    if len(got) == 3:
                        break
            assert sorted(got, key=str) == sorted(
                [
                    (TOPIC_INSERT, {"queue": "a"}),
                    (TOPIC_INSERT, {"queue": "b"}),
                    (TOPIC_CONTROL, {"action": "pause", "queue": "a"}),
                ],
                key=str,
            )
            # unlistened topics are not delivered
            await listener.unlisten(TOPIC_CONTROL)
            async with sender.transaction() as tx:
                await tx.notify_many(TOPIC_CONTROL, ['{"action":"resume","queue":"a"}'])
                await tx.notify_many(TOPIC_INSERT, ['{"queue": "last"}'])
            with anyio.fail_after(10):
                async for note in listener:
                    assert note.topic == TOPIC_INSERT
                    assert json.loads(note.payload) == {"queue": "last"}
                    break


async def test_custom_schema_postgres(pg_schema_url: str) -> None:
    from ..conftest import CUSTOM_SCHEMA

    async with (
        open_driver(pg_schema_url, schema=CUSTOM_SCHEMA) as driver,
        driver.listener() as listener,
    ):
        await listener.listen(TOPIC_INSERT)
        async with driver.transaction() as tx:
            (row,) = await tx.job_insert_fast_many([params(7)])
            await tx.notify_many(TOPIC_INSERT, ['{"queue": "default"}'])
        assert (await driver.executor().job_get_by_id(row.job.id)) is not None
        with anyio.fail_after(10):
            async for note in listener:
                assert note.topic == TOPIC_INSERT
                break
        # the rows live in the custom schema, not in public
        n = await driver.executor().fetch_all(f'SELECT count(*) FROM "{CUSTOM_SCHEMA}".river_job')
        assert n == [(1,)]
        assert not await driver.executor().fetch_all(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = 'public' AND table_name = 'river_job'"
        )


async def test_timestamps_written_by_river_go_on_sqlite_are_read(sqlite_url: str) -> None:
    async with open_driver(sqlite_url) as driver:
        async with driver.transaction() as tx:
            (row,) = await tx.job_insert_fast_many([params(1)])
        ex = driver.executor()
        await ex.execute(
            "UPDATE river_job SET state = 'completed', attempted_at = ?, finalized_at = ?, "
            "scheduled_at = ?, created_at = ? WHERE id = ?",
            (
                "2026-03-04 05:06:07.123",
                "2026-03-04 07:06:08.5 +0200 CEST m=+12.000000001",
                "2026-03-04 05:06:07",
                "2026-03-04 05:06:06.999999999 +0000 UTC",
                row.job.id,
            ),
        )
        job = await ex.job_get_by_id(row.job.id)
    assert job is not None
    assert job.attempted_at == dt.datetime(2026, 3, 4, 5, 6, 7, 123000, tzinfo=UTC)
    assert job.finalized_at == dt.datetime(2026, 3, 4, 5, 6, 8, 500000, tzinfo=UTC)
    assert job.scheduled_at == dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    assert job.created_at == dt.datetime(2026, 3, 4, 5, 6, 6, 999999, tzinfo=UTC)


# --- observability ------------------------------------------------------------------------------


async def test_job_count_by_queue_and_state(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        ex = driver.executor()
        assert await ex.job_count_by_queue_and_state(states=list(S)) == []
        async with driver.transaction() as tx:
            await tx.job_insert_fast_many(
                [
                    params(1),
                    params(2),
                    params(3, state=S.SCHEDULED, scheduled_at=dt.datetime(2040, 1, 1, tzinfo=UTC)),
                    params(4, queue="other", state=S.RETRYABLE),
                    params(5, queue="other", state=S.RETRYABLE),
                    params(6, queue="other", state=S.PENDING),
                ]
            )
        counts = await ex.job_count_by_queue_and_state(states=list(S))
        assert counts == [
            ("default", S.AVAILABLE, 2),
            ("default", S.SCHEDULED, 1),
            ("other", S.PENDING, 1),
            ("other", S.RETRYABLE, 2),
        ]
        assert all(isinstance(state, river.JobState) for _, state, _ in counts)
        assert await ex.job_count_by_queue_and_state(states=[S.AVAILABLE, S.RETRYABLE]) == [
            ("default", S.AVAILABLE, 2),
            ("other", S.RETRYABLE, 2),
        ]
        assert await ex.job_count_by_queue_and_state(states=[]) == []


# --- one-round-trip insert (runtime speed-ups) ----------------------------------------------


async def test_insert_fast_many_notify_inserts_and_notifies_together(database_url: str) -> None:
    mask = unique_states_mask([S.AVAILABLE, S.RUNNING])
    async with open_driver(database_url) as sender, open_driver(database_url) as receiver:
        async with receiver.listener() as listener:
            await listener.listen(TOPIC_INSERT)
            ex = sender.executor()
            rows = await ex.job_insert_fast_many_notify(
                [params(1, unique_key=b"k", unique_states=mask), params(2, queue="q2")],
                topic=TOPIC_INSERT,
                payloads=['{"queue": "default"}', '{"queue": "q2"}'],
            )
            assert [(r.job.args, r.unique_skipped_as_duplicate) for r in rows] == [
                ({"n": 1}, False),
                ({"n": 2}, False),
            ]
            got = []
            with anyio.fail_after(10):
                async for note in listener:
                    got.append((note.topic, json.loads(note.payload)))
                    if len(got) == 2:
                        break
            assert sorted(got, key=str) == [
                (TOPIC_INSERT, {"queue": "default"}),
                (TOPIC_INSERT, {"queue": "q2"}),
            ]
            # a unique duplicate comes back flagged, in input order; no payloads: no notice
            again = await ex.job_insert_fast_many_notify(
                [params(3), params(4, unique_key=b"k", unique_states=mask)],
                topic=TOPIC_INSERT,
                payloads=[],
            )
            assert [r.unique_skipped_as_duplicate for r in again] == [False, True]
            assert again[1].job.id == rows[0].job.id
            # inside a transaction both roll back with it
            with pytest.raises(RuntimeError):
                async with sender.transaction() as tx:
                    await tx.job_insert_fast_many_notify(
                        [params(5)], topic=TOPIC_INSERT, payloads=['{"queue": "gone"}']
                    )
                    raise RuntimeError
            await ex.notify_many(TOPIC_INSERT, ['{"queue": "sentinel"}'])
            with anyio.fail_after(10):
                async for note in listener:
                    assert json.loads(note.payload) == {"queue": "sentinel"}
                    break
            assert await ex.fetch_all("SELECT count(*) FROM river_job") == [(3,)]
