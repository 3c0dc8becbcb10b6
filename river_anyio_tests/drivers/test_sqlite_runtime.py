"""The SQLite executor's runtime operations, beyond the shared conformance suite: timestamp text
on claimed and completed rows against River's own formats, River 0.51's metadata merges (top-level keys replaced, nulls kept),
one-hop / one-statement batching, rollback of a cancelled batch, outbox rows."""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import apsw
import pytest

from river_anyio._job import JobRow, JobState
from river_anyio._timeutil import format_sqlite_timestamp, parse_sqlite_timestamp
from river_anyio.drivers._protocol import JobCompletion
from river_anyio.drivers.sqlite import SQLiteDriver, open_sqlite
from river_anyio.drivers.sqlite import _executor as sqlite_executor
from river_anyio.drivers.sqlite._connection import path_from_url
from river_anyio.drivers.sqlite._dbapi import _timestamp_text
from river_anyio.drivers.sqlite._executor import _parse_timestamp, _sqlite_ts

from .support import params as _params

pytestmark = pytest.mark.anyio

UTC = dt.UTC
params = functools.partial(_params, kind="runtime")
S = JobState
CLIENT = "client-a"
#: ``YYYY-MM-DD HH:MM:SS.fff``, what River and we write.
OUR_FORMAT = r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3}$"


def now() -> dt.datetime:
    return dt.datetime.now(UTC)


async def running(driver: SQLiteDriver, n: int, **kw: Any) -> list[JobRow]:
    ex = driver.executor()
    inserted = await ex.job_insert_fast_many([params(i, **kw) for i in range(n)])
    jobs = await ex.job_get_available(queue="default", max_to_lock=n, client_id=CLIENT)
    assert sorted(j.id for j in jobs) == sorted(r.job.id for r in inserted)
    return sorted(jobs, key=lambda j: j.id)


def done(job: JobRow, **kw: Any) -> JobCompletion:
    base: dict[str, Any] = {
        "id": job.id,
        "attempt": job.attempt,
        "state": S.COMPLETED,
        "finalized_at": now(),
    }
    base.update(kw)
    return JobCompletion(**base)


async def raw(driver: SQLiteDriver, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    return await driver.executor().fetch_all(sql, args)


async def on_writer(driver: SQLiteDriver, fn: Callable[[apsw.Connection], Any]) -> Any:
    """Run ``fn`` on the driver's writer connection (test plumbing)."""
    return await driver._writer.run(fn)


# ---------------------------------------------------------------------------------------------
# timestamp text


def test_fast_timestamp_helpers_match_the_reference() -> None:
    plus2 = dt.timezone(dt.timedelta(hours=2))
    minus7 = dt.timezone(dt.timedelta(hours=-7, minutes=-30))
    for value in (
        now(),
        now().replace(microsecond=0),
        now().astimezone(plus2),
        dt.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=minus7),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999499, tzinfo=UTC),
        dt.datetime(2024, 12, 31, 23, 59, 59, 999500, tzinfo=plus2),  # rounds into next year
        dt.datetime(2024, 1, 1, 0, 0, 0, 1499, tzinfo=minus7),
    ):
        assert _sqlite_ts(value) == format_sqlite_timestamp(value)
    with pytest.raises(ValueError, match="naive"):
        _sqlite_ts(dt.datetime(2024, 1, 1))
    for text in (
        "2024-01-02 03:04:05",  # CURRENT_TIMESTAMP
        "2024-01-02 03:04:05.123",  # datetime('now', 'subsec')
        "2024-01-02 03:04:05.5",  # River's trimmed timeString
        "2024-01-02 03:04:05.123456",  # earlier river_anyio versions
        "2024-01-02 03:04:05.1234567",
        "2024-01-02T03:04:05.123456789Z",
        "2024-01-02T05:04:05+02:00",
        "2024-01-02 03:04:05.999999999 +0000 UTC",  # Go's Time.String()
        "2024-01-02 05:04:05.1 +0200 CEST m=+1.5",
    ):
        assert _parse_timestamp(text) == parse_sqlite_timestamp(text), text


def test_converted_timestamps_are_given_back_as_the_text_read() -> None:
    """A ``sqlite3`` connection converting ``timestamp`` columns hands River's text back as
    that text: milliseconds, or every digit a longer stored fraction had."""
    assert _timestamp_text(dt.datetime(2026, 1, 2, 3, 4, 5, 123000)) == "2026-01-02 03:04:05.123"
    assert _timestamp_text(dt.datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02 03:04:05.000"
    assert _timestamp_text(dt.datetime(2026, 1, 2, 3, 4, 5, 123456)) == "2026-01-02 03:04:05.123456"
    plus2 = dt.timezone(dt.timedelta(hours=2))
    assert (
        _timestamp_text(dt.datetime(2026, 1, 2, 5, 4, 5, 7000, tzinfo=plus2))
        == "2026-01-02 03:04:05.007"
    )


async def test_claim_and_completion_write_our_text_format(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        a, b = await running(driver, 2)
        [(attempted_at,)] = await raw(
            driver, "SELECT attempted_at FROM river_job WHERE id = ?", a.id
        )
        assert attempted_at is not None
        assert re.match(OUR_FORMAT, attempted_at)
        assert parse_sqlite_timestamp(attempted_at) == a.attempted_at
        finalized = dt.datetime(
            2031, 5, 6, 9, 8, 7, 123456, tzinfo=dt.timezone(dt.timedelta(hours=3))
        )
        retry_at = dt.datetime(2032, 1, 1, 0, 0, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
        results = await ex.job_set_state_if_running_many(
            [
                done(a, finalized_at=finalized),
                done(b, state=S.RETRYABLE, finalized_at=None, scheduled_at=retry_at),
            ],
            client_id=CLIENT,
        )
        assert [r.applied for r in results] == [True, True]
        rows = await raw(driver, "SELECT finalized_at, scheduled_at FROM river_job ORDER BY id")
        assert rows[0][0] == "2031-05-06 06:08:07.123"  # UTC, milliseconds
        assert rows[1] == (None, "2032-01-01 05:00:00.000")
        assert results[0].job.finalized_at == finalized.replace(microsecond=123000)
        assert results[1].job.scheduled_at == retry_at


async def test_claims_within_one_millisecond_get_distinct_times(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims share no ``attempted_at`` although SQLite keeps milliseconds: the rows of a claim
    whose reply was lost are told from those of the claim before it, however close."""
    frozen = dt.datetime(2030, 1, 1, 0, 0, 0, 400, tzinfo=UTC)  # stored as .000
    monkeypatch.setattr(sqlite_executor, "utc_now", lambda: frozen)
    monkeypatch.setattr(sqlite_executor, "_claim_clock", sqlite_executor._ClaimClock())
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        await ex.job_insert_fast_many([params(i) for i in range(4)])
        seen = await ex.job_get_available(queue="default", max_to_lock=1, client_id=CLIENT)
        lost = await ex.job_get_available(queue="default", max_to_lock=2, client_id=CLIENT)
        last = await ex.job_get_available(queue="default", max_to_lock=1, client_id=CLIENT)
        times = [j.attempted_at for j in (*seen, *lost, *last)]
        ms = dt.timedelta(milliseconds=1)
        start = frozen.replace(microsecond=0)
        assert times == [start, start + ms, start + ms, start + 2 * ms]  # one time per claim
        given = await ex.job_give_back_lost_claims(
            queue="default",
            client_id=CLIENT,
            claimed_after=seen[0].attempted_at,
            within=60.0,
            running=(last[0].id,),
        )
        assert [j.id for j in given] == [j.id for j in lost]


def test_the_claim_clock_steps_a_millisecond_and_follows_a_clock_set_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    at = [dt.datetime(2030, 1, 1, 0, 0, 0, 999600, tzinfo=UTC)]  # rounds to 00:00:01.000
    monkeypatch.setattr(sqlite_executor, "utc_now", lambda: at[0])
    clock = sqlite_executor._ClaimClock()
    second = dt.datetime(2030, 1, 1, 0, 0, 1, tzinfo=UTC)
    ms = dt.timedelta(milliseconds=1)
    assert [clock() for _ in range(3)] == [second, second + ms, second + 2 * ms]
    at[0] = second + dt.timedelta(seconds=5)  # the clock moves on: followed
    assert clock() == at[0]
    at[0] = second  # set back further than a second: followed, not stepped from the last
    assert clock() == second


async def test_claim_orders_and_compares_rivers_text_formats(sqlite_url: str) -> None:
    """Rows in other text forms (whole seconds, trimmed or six-digit fractions) sort and compare
    correctly against the millisecond text, both in the claim order and in the due test."""
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        jobs = [r.job for r in await ex.job_insert_fast_many([params(i) for i in range(6)])]
        texts = [
            "2020-01-01 00:00:00.5",  # River's timeString, trailing zeros trimmed
            "2020-01-01 00:00:00.123",  # datetime('now', 'subsec')
            "2020-01-01 00:00:00",  # CURRENT_TIMESTAMP
            "2020-01-01 00:00:00.300000",  # earlier river_anyio versions
            "2020-01-01 00:00:00.45",
            None,  # the future, in River's millisecond form
        ]
        future = (now() + dt.timedelta(seconds=30)).strftime("%Y-%m-%d %H:%M:%S.%f")[:23]
        for job, text in zip(jobs, texts, strict=True):
            await ex.execute(
                "UPDATE river_job SET scheduled_at = ? WHERE id = ?", (text or future, job.id)
            )
        claimed = await ex.job_get_available(queue="default", max_to_lock=10, client_id=CLIENT)
        assert [j.args["n"] for j in claimed] == [2, 1, 3, 4, 0]
        assert [j.scheduled_at.microsecond for j in claimed] == [0, 123000, 300000, 450000, 500000]
        # a job due a moment ago in River's own "now" format is claimed by our "now"
        await ex.execute(
            "UPDATE river_job SET scheduled_at = datetime('now', 'subsec', '-0.05 seconds') "
            "WHERE id = ?",
            (jobs[5].id,),
        )
        (last,) = await ex.job_get_available(queue="default", max_to_lock=10, client_id=CLIENT)
        assert last.id == jobs[5].id


async def test_completed_rows_compare_against_river_horizons(sqlite_url: str) -> None:
    """finalized_at as we write it against the millisecond horizons River's cleaner uses."""
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        (job,) = await running(driver, 1)
        at = dt.datetime(2030, 6, 1, 12, 0, 0, 250500, tzinfo=UTC)  # stored as .251
        await ex.job_set_state_if_running_many([done(job, finalized_at=at)], client_id=CLIENT)
        count = "SELECT count(*) FROM river_job WHERE finalized_at < ?"
        assert await ex.fetch_all(count, ["2030-06-01 12:00:00.252"]) == [(1,)]
        assert await ex.fetch_all(count, ["2030-06-01 12:00:00.251"]) == [(0,)]
        assert await ex.fetch_all(count, ["2030-06-01 12:00:00"]) == [(0,)]
        assert await ex.fetch_all(count, ["2030-06-01 12:00:01"]) == [(1,)]


async def test_rows_in_gos_time_string_format_are_read(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        (job,) = await running(driver, 1)
        await ex.execute(
            "UPDATE river_job SET scheduled_at = ? WHERE id = ?",
            ("2020-01-01 02:00:00.123456789 +0200 EET m=+3.25", job.id),
        )
        (res,) = await ex.job_set_state_if_running_many(
            [done(job, state=S.CANCELLED)], client_id=CLIENT
        )
        assert res.job.scheduled_at == dt.datetime(2020, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)


async def test_final_target_without_finalized_at_gets_now(sqlite_url: str) -> None:
    """The table's CHECK wants finalized_at on final rows: None means "now" there."""
    async with open_sqlite(sqlite_url) as driver:
        (job,) = await running(driver, 1)
        before = now()
        (res,) = await driver.executor().job_set_state_if_running_many(
            [done(job, finalized_at=None)], client_id=CLIENT
        )
        assert res.applied and res.job.finalized_at is not None
        assert before - dt.timedelta(seconds=1) <= res.job.finalized_at <= now()


# ---------------------------------------------------------------------------------------------
# metadata merges


@pytest.mark.parametrize(
    ("before", "updates", "after"),
    [
        ({"a": {"x": 1, "y": {"z": 1}}}, {"a": {"y": {"w": 2}}}, {"a": {"y": {"w": 2}}}),
        ({"a": {"x": 1}, "b": 1}, {"a": {"x": None}, "b": None}, {"a": {"x": None}, "b": None}),
        ({"a": [1, 2, 3]}, {"a": [4]}, {"a": [4]}),
        ({"a": {"x": 1}}, {"a": 5}, {"a": 5}),
        ({"a": 5, "t": True}, {"b": False, "s": "x", "f": 1.5}, {"a": 5, "t": True, "b": False, "s": "x", "f": 1.5}),
        ({"k": "v"}, {}, {"k": "v"}),
        ({"we\"ird.key": 1}, {"we\"ird.key": 2, "$x": [None]}, {"we\"ird.key": 2, "$x": [None]}),
        ({"river:log": [{"attempt": 1, "log": "x"}]}, {"river:log": [{"attempt": 2, "log": "y"}]},
         {"river:log": [{"attempt": 2, "log": "y"}]}),
    ],
)  # fmt: skip
async def test_metadata_merge_replaces_top_level_keys(
    sqlite_url: str, before: dict[str, Any], updates: dict[str, Any], after: dict[str, Any]
) -> None:
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        a, b = await running(driver, 2, metadata=json.dumps(before).encode())
        encoded = json.dumps(updates).encode()
        # applied, and not applied (a stale attempt): the same merge either way
        results = await ex.job_set_state_if_running_many(
            [done(a, metadata_updates=encoded), done(b, attempt=9, metadata_updates=encoded)],
            client_id=CLIENT,
        )
        assert [r.applied for r in results] == [True, False]
        for res in results:
            got = dict(res.job.metadata)
            got.pop("river:unique_nonce")
            assert got == after


# ---------------------------------------------------------------------------------------------
# batching


class _Counter:
    def __init__(self) -> None:
        self.hops = 0
        self.statements: list[str] = []

    def trace(self, cursor: apsw.Cursor, sql: str, bindings: Any) -> bool:
        self.statements.append(" ".join(sql.split())[:40])
        return True


async def _counting(driver: SQLiteDriver, monkeypatch: pytest.MonkeyPatch) -> _Counter:
    counter = _Counter()
    writer = driver._writer
    original = writer.run

    async def run(fn: Any, *args: Any) -> Any:
        counter.hops += 1
        return await original(fn, *args)

    monkeypatch.setattr(writer, "run", run)
    await on_writer(driver, lambda c: setattr(c, "exec_trace", counter.trace))
    counter.hops = 0
    return counter


async def test_large_batch_is_one_hop_and_one_statement(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_sqlite(sqlite_url) as driver:
        jobs = await running(driver, 5000)
        counter = await _counting(driver, monkeypatch)
        results = await driver.executor().job_set_state_if_running_many(
            [done(j) for j in reversed(jobs)], client_id=CLIENT
        )
        assert len(results) == 5000 and all(r.applied for r in results)
        assert [r.job.id for r in results] == [j.id for j in reversed(jobs)]
        assert counter.hops == 1
        assert counter.statements[0] == "BEGIN IMMEDIATE"
        assert counter.statements[1].startswith("UPDATE river_job AS j")
        assert counter.statements[2:] == ["COMMIT"]


async def test_mixed_batch_is_one_hop(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard failures, a missing row and a repeated id still take one hop and one transaction."""
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        a, b, c, d = await running(driver, 4, metadata=b'{"k":0}')
        counter = await _counting(driver, monkeypatch)
        results = await ex.job_set_state_if_running_many(
            [
                done(a, metadata_updates=b'{"first":1}'),
                done(b, attempt=5),  # stale: read back as is
                JobCompletion(id=10**9, attempt=1, state=S.COMPLETED, finalized_at=now()),
                done(c, attempt=5, metadata_updates=b'{"stale":true}'),  # stale: merged
                done(a, state=S.DISCARDED, metadata_updates=b'{"second":2,"k":null}'),
                done(d, state=S.RETRYABLE, finalized_at=None, scheduled_at=now()),
            ],
            client_id=CLIENT,
        )
        assert counter.hops == 1
        assert counter.statements.count("BEGIN IMMEDIATE") == 1
        assert counter.statements[-1] == "COMMIT"
        assert [(r.job.id, r.applied) for r in results] == [
            (a.id, True),
            (b.id, False),
            (c.id, False),
            (a.id, False),
            (d.id, True),
        ]
        first, stale, merged, again, retry = (r.job for r in results)
        # the repeated id runs after the first completion: no longer running, only merged
        assert first.state is S.COMPLETED and first.metadata["first"] == 1
        assert "second" not in first.metadata
        assert again.state is S.COMPLETED
        assert again.metadata["second"] == 2 and again.metadata["k"] is None  # nulls are kept
        assert stale.state is S.RUNNING and stale.metadata["k"] == 0
        assert merged.state is S.RUNNING and merged.metadata["stale"] is True
        assert retry.state is S.RETRYABLE and retry.finalized_at is None


async def test_completion_and_claim_plans(sqlite_url: str) -> None:
    """The completion join is driven by the batch (rowid lookups); the claim's read uses River's
    fetching index and its update the ids it read. A wrong plan is quadratic in the batch
    size."""
    async with open_sqlite(sqlite_url) as driver:
        q = driver._queries
        ex = driver.executor()
        plan = await ex.fetch_all("EXPLAIN QUERY PLAN " + q.job_complete_if_running, ["[]", "", ""])
        details = [row[3] for row in plan]
        assert details[:2] == [
            "SCAN b VIRTUAL TABLE INDEX 1:",
            "SEARCH j USING INTEGER PRIMARY KEY (rowid=?)",
        ]
        # the rest are the metadata merge's subqueries over the row's own JSON, never a scan
        # of river_job
        assert not any(d.startswith(("SCAN j", "SCAN river_job")) for d in details)
        candidates, update = q.job_get_available
        plan = await ex.fetch_all("EXPLAIN QUERY PLAN " + candidates, ["q", 1, ""])
        assert any("river_job_prioritized_fetching_index" in row[3] for row in plan), plan
        # the update finds the candidates by id, never through an index walk or a scan
        plan = await ex.fetch_all("EXPLAIN QUERY PLAN " + update, ["q", "[1]", "", 100, None, "c"])
        details = [row[3] for row in plan]
        assert details[0] == "SEARCH river_job USING INTEGER PRIMARY KEY (rowid=?)", details
        assert not any(d.startswith("SCAN river_job") for d in details), details


async def test_cancelled_batch_rolls_back(sqlite_url: str) -> None:
    """Cancelling the caller while the batch's statement runs interrupts it and rolls the whole
    batch back; the connection stays usable."""
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        jobs = await running(driver, 200)
        middle = jobs[100]
        reached = threading.Event()

        def install(conn: apsw.Connection) -> None:
            def block(*_: Any) -> int:
                # Runs inside the batch's UPDATE, on the writer thread: wait for the interrupt.
                reached.set()
                deadline = time.monotonic() + 10
                while not conn.is_interrupted and time.monotonic() < deadline:
                    time.sleep(0.001)
                return 0

            conn.create_scalar_function("river_test_block", block, 0)
            conn.execute(
                "CREATE TEMP TRIGGER river_test_block AFTER UPDATE OF state ON main.river_job "
                f"WHEN new.id = {middle.id} BEGIN SELECT river_test_block(); END"
            )

        await on_writer(driver, install)
        outcome: list[str] = []

        async def complete(scope: anyio.CancelScope) -> None:
            with scope:
                await ex.job_set_state_if_running_many([done(j) for j in jobs], client_id=CLIENT)
                outcome.append("finished")
            if scope.cancelled_caught:
                outcome.append("cancelled")

        scope = anyio.CancelScope()
        async with anyio.create_task_group() as tg:
            tg.start_soon(complete, scope)
            assert await anyio.to_thread.run_sync(reached.wait, 10)
            scope.cancel()
        assert outcome == ["cancelled"]
        await on_writer(driver, lambda c: c.execute("DROP TRIGGER temp.river_test_block"))
        rows = await raw(driver, "SELECT state, count(*) FROM river_job GROUP BY state")
        assert rows == [("running", 200)]
        # usable afterwards, and the batch can be retried
        results = await ex.job_set_state_if_running_many([done(j) for j in jobs], client_id=CLIENT)
        assert all(r.applied for r in results)


# ---------------------------------------------------------------------------------------------
# claims, cancel and queues: SQLite specifics


async def test_claim_of_rows_without_attempted_by(sqlite_url: str) -> None:
    """River Go leaves attempted_by NULL on insert."""
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        await ex.job_insert_fast_many([params(1)])
        await ex.execute("UPDATE river_job SET attempted_by = NULL")
        (job,) = await ex.job_get_available(queue="default", max_to_lock=1, client_id="x")
        assert job.attempted_by == ("x",)
        (res,) = await ex.job_set_state_if_running_many(
            [done(job, state=S.AVAILABLE, finalized_at=None)], client_id="x"
        )
        assert res.applied
        (again,) = await ex.job_get_available(
            queue="default", max_to_lock=1, client_id="y", max_attempted_by=1
        )
        assert again.attempted_by == ("y",)


async def test_outbox_rows(sqlite_url: str) -> None:
    """Cancel, pause and resume write River's control payloads as compact JSON rows."""
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        (job,) = await running(driver, 1)
        await ex.queue_create_or_set_updated_at(name="default")
        at = dt.datetime(2030, 1, 1, 1, 2, 3, 456000, tzinfo=dt.timezone(dt.timedelta(hours=1)))
        got = await ex.job_cancel(job_id=job.id, cancel_attempted_at=at)
        assert got is not None and got.metadata["cancel_attempted_at"] == "2030-01-01T00:02:03.456Z"
        await ex.queue_pause("default")
        await ex.queue_resume("*")
        await ex.queue_pause("nope")  # no row matched: nothing sent
        rows = await raw(driver, "SELECT topic, payload FROM river_notification ORDER BY id")
        assert rows == [
            ("river_control", f'{{"action":"cancel","job_id":{job.id},"queue":"default"}}'),
            ("river_control", '{"action":"pause","queue":"default"}'),
            ("river_control", '{"action":"resume","queue":"*"}'),
        ]


async def test_queue_rows_written_by_river(sqlite_url: str) -> None:
    """Queue rows with River's defaults (CURRENT_TIMESTAMP text, jsonb metadata) are read."""
    async with open_sqlite(sqlite_url) as driver:
        ex = driver.executor()
        await ex.execute(
            "INSERT INTO river_queue (name, metadata, paused_at) "
            "VALUES ('go', jsonb('{\"a\":[1]}'), '2024-05-06 07:08:09.5')"
        )
        q = await ex.queue_get("go")
        assert q is not None
        assert q.metadata == {"a": [1]}
        assert q.paused_at == dt.datetime(2024, 5, 6, 7, 8, 9, 500000, tzinfo=UTC)
        assert q.created_at.tzinfo is not None and q.created_at == q.updated_at
        bumped = await ex.queue_create_or_set_updated_at(name="go")
        assert bumped.metadata == {"a": [1]} and bumped.paused_at == q.paused_at
        assert bumped.updated_at > q.updated_at and bumped.created_at == q.created_at


async def test_attached_schema(sqlite_url: str, tmp_path: Path) -> None:
    river_db = path_from_url(sqlite_url)
    app_db = str(tmp_path / "app.sqlite3")
    async with open_sqlite(app_db, schema="river", attach={"river": river_db}) as driver:
        ex = driver.executor()
        a, b = await running(driver, 2)
        results = await ex.job_set_state_if_running_many(
            [done(a), done(b, attempt=7, metadata_updates=b'{"x":1}')], client_id=CLIENT
        )
        assert [r.applied for r in results] == [True, False]
        assert results[1].job.metadata["x"] == 1
        cancelled = await ex.job_cancel(job_id=b.id, cancel_attempted_at=now())
        assert cancelled is not None and "cancel_attempted_at" in cancelled.metadata
        await ex.queue_create_or_set_updated_at(name="default")
        assert await ex.queue_pause("default") == 1
        assert [q.name for q in await ex.queue_list()] == ["default"]
        assert await ex.fetch_all("SELECT count(*) FROM river.river_notification") == [(2,)]
        assert await ex.fetch_all("SELECT count(*) FROM main.sqlite_master") == [(0,)]
