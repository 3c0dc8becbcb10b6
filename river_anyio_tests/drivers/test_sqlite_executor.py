"""The SQLite executor: inserts (unique handling, order, defaults), reads, row conversion."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import anyio
import apsw
import pytest

from river_anyio._errors import (
    DatabaseError,
    IntegrityError,
    UniqueViolationError,
    ValidationError,
)
from river_anyio._job import AttemptError, JobState
from river_anyio._timeutil import format_sqlite_timestamp
from river_anyio._unique import UNIQUE_STATES_BY_MASK, unique_states_mask
from river_anyio.drivers._protocol import JobInsertParams
from river_anyio.drivers.sqlite import SQLiteExecutor, open_sqlite
from river_anyio.drivers.sqlite._connection import ConnectionThread, path_from_url
from river_anyio.drivers.sqlite._queries import Queries

pytestmark = pytest.mark.anyio

UTC = dt.UTC
DEFAULT_MASK = 0xF5  # available, completed, pending, retryable, running, scheduled


def params(n: int = 0, **kw: Any) -> JobInsertParams:
    base: dict[str, Any] = {
        "encoded_args": json.dumps({"n": n}).encode(),
        "kind": "test_kind",
        "max_attempts": 25,
        "metadata": b"{}",
        "priority": 1,
        "queue": "default",
        "state": JobState.AVAILABLE,
        "tags": (),
    }
    base.update(kw)
    return JobInsertParams(**base)


KEY_A = bytes(range(32))
KEY_B = bytes(range(1, 33))


# ---------------------------------------------------------------------------------------------


def test_unique_states_bits() -> None:
    assert UNIQUE_STATES_BY_MASK[DEFAULT_MASK] == frozenset(
        {
            JobState.AVAILABLE,
            JobState.COMPLETED,
            JobState.PENDING,
            JobState.RETRYABLE,
            JobState.RUNNING,
            JobState.SCHEDULED,
        }
    )
    assert unique_states_mask([JobState.AVAILABLE]) == 1
    assert unique_states_mask([JobState.SCHEDULED]) == 128
    assert UNIQUE_STATES_BY_MASK[0] == frozenset()


async def test_insert_returning_roundtrip(sqlite_url: str) -> None:
    sched = dt.datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        before = dt.datetime.now(UTC) - dt.timedelta(seconds=5)
        [a, b] = await ex.job_insert_fast_many(
            [
                params(
                    1,
                    encoded_args=b'{"z": 1, "a": "\\u00e9\\"x"}',
                    metadata=b'{"m": {"deep": [1, 2]}}',
                    tags=("alpha", "beta"),
                    priority=3,
                    max_attempts=7,
                    queue="other_q",
                ),
                params(2, state=JobState.SCHEDULED, scheduled_at=sched, created_at=sched),
            ]
        )
        ja = a.job
        assert not a.unique_skipped_as_duplicate
        assert ja.args == {"z": 1, "a": 'é"x'}
        assert json.loads(ja.encoded_args) == ja.args
        assert list(ja.args) == ["z", "a"]  # SQLite keeps key order
        assert ja.metadata["m"] == {"deep": [1, 2]}
        assert len(ja.metadata["river:unique_nonce"]) == 16
        assert ja.tags == ("alpha", "beta")
        assert (ja.priority, ja.max_attempts, ja.queue, ja.kind) == (3, 7, "other_q", "test_kind")
        assert ja.state is JobState.AVAILABLE
        assert ja.attempt == 0 and ja.attempted_at is None and ja.attempted_by == ()
        assert ja.errors == () and ja.finalized_at is None
        assert ja.unique_key is None and ja.unique_states is None
        assert before < ja.created_at < dt.datetime.now(UTC) + dt.timedelta(seconds=5)
        assert ja.created_at.tzinfo is not None
        assert ja.scheduled_at == ja.created_at

        jb = b.job
        assert jb.state is JobState.SCHEDULED
        # stored as River does: rounded to the millisecond (halves up)
        stored = sched.replace(microsecond=679000)
        assert jb.scheduled_at == stored and jb.created_at == stored
        assert jb.id > ja.id
        # stored as UTC text River can compare and parse
        raw = await ex.fetch_all("SELECT scheduled_at FROM river_job WHERE id = ?", [jb.id])
        assert raw[0][0] == "2030-01-02 01:04:05.679"
        # read back equals what was returned
        assert await ex.job_get_by_id(ja.id) == ja
        assert await ex.job_get_by_id(999_999) is None


async def test_unique_duplicates_across_batches_and_a_batch_repeating_a_key(
    sqlite_url: str,
) -> None:
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        # River refuses a batch holding one unique key twice, before anything is written
        with pytest.raises(ValidationError, match=r"params\[2\]\.unique_key: .*params\[0\]"):
            await ex.job_insert_fast_many(
                [
                    params(1, unique_key=KEY_A, unique_states=DEFAULT_MASK),
                    params(2),
                    params(3, unique_key=KEY_A, unique_states=DEFAULT_MASK, kind="other_kind"),
                ]
            )
        assert await ex.fetch_all("SELECT count(*) FROM river_job") == [(0,)]
        first = await ex.job_insert_fast_many(
            [
                params(1, unique_key=KEY_A, unique_states=DEFAULT_MASK),
                params(2),
                params(4, unique_key=KEY_B, unique_states=DEFAULT_MASK),
            ]
        )
        assert [r.unique_skipped_as_duplicate for r in first] == [False, False, False]
        assert first[0].job.unique_key == KEY_A
        assert first[0].job.unique_states == UNIQUE_STATES_BY_MASK[DEFAULT_MASK]

        second = await ex.job_insert_fast_many(
            [
                params(5, unique_key=KEY_B, unique_states=DEFAULT_MASK),
                params(6),
                params(7, unique_key=KEY_A, unique_states=DEFAULT_MASK, kind="other_kind"),
            ]
        )
        assert [r.unique_skipped_as_duplicate for r in second] == [True, False, True]
        assert second[0].job.id == first[2].job.id
        assert second[2].job.id == first[0].job.id
        assert second[2].job.args == {"n": 1}
        assert second[2].job.kind == "test_kind"  # the existing row is returned unchanged
        assert second[1].job.args == {"n": 6}  # input order kept
        count = await ex.fetch_all("SELECT count(*) FROM river_job")
        assert count == [(4,)]


async def test_unique_key_only_blocks_states_in_its_mask(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        # a mask without 'available': available jobs don't take part in the unique index
        mask = DEFAULT_MASK & ~unique_states_mask([JobState.AVAILABLE])
        res = await ex.job_insert_fast_many(
            [params(1, unique_key=KEY_A, unique_states=mask) for _ in range(2)]
        )
        assert [r.unique_skipped_as_duplicate for r in res] == [False, False]
        assert res[0].job.id != res[1].job.id
        # a finalized duplicate does not block a new insert
        await ex.execute(
            "UPDATE river_job SET state = 'cancelled', finalized_at = datetime('now', 'subsec') "
        )
        [again] = await ex.job_insert_fast_many(
            [params(2, unique_key=KEY_A, unique_states=DEFAULT_MASK)]
        )
        assert not again.unique_skipped_as_duplicate


async def test_insert_no_returning(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        n = await ex.job_insert_fast_many_no_returning(
            [
                params(1, unique_key=KEY_A, unique_states=DEFAULT_MASK),
                params(2),
                params(3, unique_key=KEY_A, unique_states=DEFAULT_MASK),
            ]
        )
        assert n == 2
        assert await ex.job_insert_fast_many_no_returning([]) == 0
        assert await ex.job_insert_fast_many([]) == []
        rows = await ex.job_list()
        assert [r.args["n"] for r in rows] == [1, 2]
        assert "river:unique_nonce" not in rows[0].metadata


async def test_metadata_nonce_merging(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        res = await ex.job_insert_fast_many(
            [
                params(1, metadata=b""),
                params(2, metadata=b' { "a" : 1 } '),
                params(3, metadata=b'{"river:unique_nonce":"old","b":2}'),
            ]
        )
        metas = [r.job.metadata for r in res]
        assert set(metas[0]) == {"river:unique_nonce"}
        assert metas[1]["a"] == 1
        assert metas[2]["b"] == 2 and metas[2]["river:unique_nonce"] != "old"
        assert not any(r.unique_skipped_as_duplicate for r in res)


async def test_malformed_args_fail_whole_batch(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        with pytest.raises(DatabaseError):
            await ex.job_insert_fast_many([params(1), params(2, encoded_args=b"{not json")])
        with pytest.raises(IntegrityError):  # CHECK priority_in_range
            await ex.job_insert_fast_many([params(1), params(2, priority=9)])
        assert await ex.fetch_all("SELECT count(*) FROM river_job") == [(0,)]


async def test_job_list_filters(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        res = await ex.job_insert_fast_many(
            [
                params(1, kind="k1"),
                params(2, kind="k2", queue="q2"),
                params(3, kind="k1", state=JobState.PENDING),
                params(4, kind="k3", queue="q2"),
            ]
        )
        ids = [r.job.id for r in res]
        assert [j.id for j in await ex.job_list()] == ids
        assert [j.id for j in await ex.job_list(kinds=["k1"])] == [ids[0], ids[2]]
        assert [j.id for j in await ex.job_list(queues=["q2"])] == [ids[1], ids[3]]
        assert [j.id for j in await ex.job_list(states=[JobState.PENDING])] == [ids[2]]
        assert [j.id for j in await ex.job_list(ids=[ids[3], ids[0]])] == [ids[0], ids[3]]
        assert [j.id for j in await ex.job_list(after_id=ids[1], limit=1)] == [ids[2]]
        assert await ex.job_list(kinds=["k1"], queues=["q2"]) == []
        assert await ex.job_list(ids=[]) == []


# River's SQLite rows hold timestamps in several text formats.
TIMESTAMP_CASES = [
    ("2024-05-06 07:08:09", dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)),
    ("2024-05-06 07:08:09.5", dt.datetime(2024, 5, 6, 7, 8, 9, 500000, tzinfo=UTC)),
    ("2024-05-06 07:08:09.123", dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)),
    ("2024-05-06 07:08:09.123456", dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)),
    (
        "2024-05-06 07:08:09.123456789 +0000 UTC",
        dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC),
    ),
    (
        "2024-05-06 09:08:09.123456789 +0200 CEST m=+12.345678901",
        dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC),
    ),
    (
        "2024-05-06 02:08:09 -0500 EST",
        dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC),
    ),
]


async def test_timestamp_formats_read_back(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        errors = [
            {
                "at": "2024-05-06T09:08:09.123456789+02:00",
                "attempt": 1,
                "error": "boom",
                "trace": "t",
            },
            {"at": "2024-05-06T07:08:10Z", "attempt": 2, "error": "again", "trace": ""},
        ]
        for i, (text, expected) in enumerate(TIMESTAMP_CASES):
            key = KEY_A[:-1] + bytes([i])
            await ex.execute(
                "INSERT INTO river_job (args, kind, created_at, scheduled_at, attempted_at, "
                "finalized_at, state, attempt, attempted_by, errors, unique_key, unique_states) "
                "VALUES (jsonb('{}'), 'k', ?1, ?1, ?1, ?1, 'completed', 2, jsonb(?2), jsonb(?3), "
                "?4, ?5)",
                [text, '["client_a","client_b"]', json.dumps(errors), key, 0x04],
            )
            job = (await ex.job_list(limit=1000))[-1]
            for value in (job.created_at, job.scheduled_at, job.attempted_at, job.finalized_at):
                assert value == expected, text
                assert value is not None and value.utcoffset() == dt.timedelta(0)
            assert job.state is JobState.COMPLETED
            assert job.attempted_by == ("client_a", "client_b")
            assert job.unique_key == key
            assert job.unique_states == frozenset({JobState.COMPLETED})
            assert job.errors == (
                AttemptError(
                    at=dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC),
                    attempt=1,
                    error="boom",
                    trace="t",
                    at_nanosecond=789,  # the nanoseconds Go wrote past the microseconds
                ),
                AttemptError(
                    at=dt.datetime(2024, 5, 6, 7, 8, 10, tzinfo=UTC), attempt=2, error="again"
                ),
            )


async def test_generic_access(sqlite_url: str, tmp_path: Path) -> None:
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        assert ex.dialect == "sqlite" and driver.dialect == "sqlite"
        assert driver.supports_listen_notify and driver.schema is None
        await ex.exec_script(
            "CREATE TABLE t1 (a integer, b text); INSERT INTO t1 VALUES (1, 'x'); "
            "INSERT INTO t1 VALUES (2, 'y'); SELECT * FROM t1;"
        )
        assert await ex.table_exists("t1")
        assert not await ex.table_exists("t2")
        assert await ex.table_exists("river_job")
        assert await ex.column_exists("t1", "b")
        assert not await ex.column_exists("t1", "c")
        assert not await ex.column_exists("t2", "a")
        assert await ex.execute("UPDATE t1 SET b = ? WHERE a >= ?", ["z", 1]) == 2
        assert await ex.execute("SELECT * FROM t1") == 0
        assert await ex.fetch_all("SELECT a, b FROM t1 ORDER BY a") == [(1, "z"), (2, "z")]
        with pytest.raises(DatabaseError, match="incomplete input"):
            await ex.exec_script("CREATE TABLE oops (")
        await ex.notify_many("river_control", ['{"action":"pause","queue":"*"}', "{}"])
        assert await ex.fetch_all("SELECT topic, payload FROM river_notification ORDER BY id") == [
            ("river_control", '{"action":"pause","queue":"*"}'),
            ("river_control", "{}"),
        ]
        with pytest.raises(UniqueViolationError):
            await ex.execute("INSERT INTO river_queue (name) VALUES ('a'), ('a')")


async def test_executor_for(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver, open_sqlite(sqlite_url) as other:
        ex = driver.executor()
        assert driver.executor_for(ex) is ex
        with pytest.raises(TypeError, match="only an executor of this driver"):
            driver.executor_for(other.executor())
        with pytest.raises(TypeError, match="apsw"):
            driver.executor_for(apsw.Connection(":memory:"))


async def test_attached_schema(sqlite_url: str, tmp_path: Path) -> None:
    river_db = path_from_url(sqlite_url)
    main_db = tmp_path / "app.sqlite3"
    async with open_sqlite(str(main_db), schema="river", attach={"river": river_db}) as driver:
        assert driver.schema == "river"
        ex = driver.executor()
        assert await ex.table_exists("river_job")
        assert await ex.column_exists("river_job", "unique_states")
        [res] = await ex.job_insert_fast_many(
            [params(1, unique_key=KEY_A, unique_states=DEFAULT_MASK)]
        )
        [dup] = await ex.job_insert_fast_many(
            [params(2, unique_key=KEY_A, unique_states=DEFAULT_MASK)]
        )
        assert dup.unique_skipped_as_duplicate and dup.job.id == res.job.id
        assert await ex.job_get_by_id(res.job.id) == res.job
        await ex.notify_many("river_insert", ["{}"])
        assert await ex.table_exists("river_notification")
        assert await ex.fetch_all("SELECT count(*) FROM river.river_notification") == [(1,)]
        assert await ex.fetch_all("SELECT count(*) FROM main.sqlite_master") == [(0,)]


async def test_big_insert_is_one_hop(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    hops = 0
    original = ConnectionThread._submit

    async def counting(self: ConnectionThread, *args: Any) -> Any:
        nonlocal hops
        hops += 1
        return await original(self, *args)

    monkeypatch.setattr(ConnectionThread, "_submit", counting)
    batch = [params(i, tags=("t1",), metadata=b'{"k":"v"}') for i in range(20_000)]
    async with open_sqlite(sqlite_url) as driver:
        ex: SQLiteExecutor = driver.executor()
        hops = 0
        t0 = time.perf_counter()
        res = await ex.job_insert_fast_many(batch)
        elapsed = time.perf_counter() - t0
        assert hops == 1
        assert len(res) == 20_000 and not any(r.unique_skipped_as_duplicate for r in res)
        assert [r.job.args["n"] for r in res[:3]] == [0, 1, 2]
        assert elapsed < 20  # ~1 s on a small VM; guards against accidental per-row hops
        hops = 0
        assert await ex.job_insert_fast_many_no_returning(batch) == 20_000
        assert hops == 1
        async with driver.transaction() as tx:
            hops = 0
            await tx.job_insert_fast_many(batch[:10])
            await tx.notify_many("river_insert", ['{"queue":"default"}'])
        assert hops == 3  # two statements + COMMIT (BEGIN rides with the first)


async def test_insert_in_transaction_visible_only_after_commit(sqlite_url: str) -> None:
    path = path_from_url(sqlite_url)
    async with open_sqlite(sqlite_url) as driver:
        async with driver.transaction() as tx:
            [res] = await tx.job_insert_fast_many([params(1)])
            assert await tx.job_get_by_id(res.job.id) == res.job

            def outside_count() -> int:
                conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
                try:
                    return int(conn.execute("SELECT count(*) FROM river_job").fetchone()[0])  # type: ignore[index]
                finally:
                    conn.close()

            assert await anyio.to_thread.run_sync(outside_count) == 0
        assert await anyio.to_thread.run_sync(outside_count) == 1


class _Statements:
    """The statements of the apsw connections opened while installed (an exec trace)."""

    def __init__(self) -> None:
        self.sql: list[str] = []

    def __enter__(self) -> _Statements:
        apsw.connection_hooks.append(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        apsw.connection_hooks.remove(self._hook)

    def _hook(self, conn: apsw.Connection) -> None:
        conn.exec_trace = self._trace

    def _trace(self, cursor: object, sql: str, bindings: object) -> bool:
        self.sql.append(" ".join(sql.split()[:2]))
        return True


async def test_idle_claims_and_schedules_are_one_statement(sqlite_url: str) -> None:
    """What an idle client repeats: a claim finding nothing is one read (no write lock, no
    BEGIN/COMMIT), and the scheduler's transaction with nothing due never begins (one read);
    with something due each still does its work (a claim: the read, then one autocommit
    update)."""
    with _Statements() as seen:
        async with open_sqlite(sqlite_url) as driver:
            ex = driver.executor()
            now = dt.datetime.now(UTC)
            seen.sql.clear()
            assert await ex.job_get_available(queue="default", max_to_lock=5, client_id="c") == []
            assert seen.sql == ["SELECT id"]
            seen.sql.clear()
            async with driver.transaction() as tx:
                assert await tx.job_schedule(horizon=now, now=now, limit=10) == []
            assert seen.sql == ["SELECT id,"]

            [job] = await ex.job_insert_fast_many(
                [params(state=JobState.SCHEDULED, scheduled_at=now - dt.timedelta(seconds=1))]
            )
            seen.sql.clear()
            async with driver.transaction() as tx:
                moved = await tx.job_schedule(horizon=now, now=now, limit=10)
            assert [m.job.id for m in moved] == [job.job.id]
            assert seen.sql[1] == "BEGIN IMMEDIATE" and seen.sql[-1] == "COMMIT"
            seen.sql.clear()
            claimed = await ex.job_get_available(queue="default", max_to_lock=5, client_id="c")
            assert seen.sql == ["SELECT id", "UPDATE river_job"]
            assert [j.id for j in claimed] == [job.job.id]
            assert claimed[0].state == JobState.RUNNING


async def test_a_claim_updates_only_candidates_still_due_and_available(sqlite_url: str) -> None:
    """A claim reads its candidates without the write lock, so another process may take or
    change some of them before its update: the update claims only those still available,
    due and in the queue."""
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        inserted = await ex.job_insert_fast_many([params(n) for n in range(4)])
        taken, moved, later, free = (r.job.id for r in inserted)
    _, update = Queries(None).job_get_available
    now = format_sqlite_timestamp(dt.datetime.now(UTC))
    other = apsw.Connection(path_from_url(sqlite_url))
    try:
        # what other processes did between the claim's read and its update
        other.execute("UPDATE river_job SET state = 'running', attempt = 1 WHERE id = ?", (taken,))
        other.execute("UPDATE river_job SET queue = 'elsewhere' WHERE id = ?", (moved,))
        other.execute(
            "UPDATE river_job SET scheduled_at = '2999-01-01 00:00:00.000000' WHERE id = ?",
            (later,),
        )
        chosen = json.dumps([taken, moved, later, free])
        rows = other.execute(update, ("default", chosen, now, 100, None, "c")).fetchall()
        assert [r[0] for r in rows] == [free]
        attempts = dict(other.execute("SELECT id, attempt FROM river_job").fetchall())
        assert attempts == {taken: 1, moved: 0, later: 0, free: 1}
    finally:
        other.close()
