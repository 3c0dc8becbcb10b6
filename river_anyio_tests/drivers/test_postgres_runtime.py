"""PostgreSQL specifics of the runtime operations: row locks, prepared statements, schemas."""

from __future__ import annotations

import datetime as dt
import json

import anyio
import attrs
import pytest
from psycopg import pq

from river_anyio._job import JobState
from river_anyio.drivers import TOPIC_CONTROL, JobCompletion, JobInsertParams
from river_anyio.drivers.postgres import PostgresDriver, PostgresExecutor, open_postgres

pytestmark = pytest.mark.anyio
UTC = dt.UTC
S = JobState


def job(i: int = 0, **overrides: object) -> JobInsertParams:
    values: dict[str, object] = {
        "encoded_args": json.dumps({"i": i}).encode(),
        "kind": "pg_runtime",
        "max_attempts": 25,
        "metadata": b"{}",
        "priority": 1,
        "queue": "default",
        "state": S.AVAILABLE,
        "tags": (),
    }
    values.update(overrides)
    return JobInsertParams(**values)  # type: ignore[arg-type]


async def insert(driver: PostgresDriver, n: int, **overrides: object) -> list[int]:
    rows = await driver.executor().job_insert_fast_many([job(i, **overrides) for i in range(n)])
    return [r.job.id for r in rows]


async def prepared(ex: PostgresExecutor, marker: str) -> int:
    rows = await ex.fetch_all(
        "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", (f"%{marker}%",)
    )
    return int(rows[0][0])


async def test_claims_skip_rows_locked_by_another_transaction(pg_url: str) -> None:
    async with open_postgres(pg_url) as driver:
        ids = await insert(driver, 5)
        async with driver.transaction() as tx:
            held = await tx.job_get_available(queue="default", max_to_lock=2, client_id="a")
            assert [j.id for j in held] == ids[:2]
            with anyio.fail_after(5):  # SKIP LOCKED: no wait on the held rows
                rest = await driver.executor().job_get_available(
                    queue="default", max_to_lock=10, client_id="b"
                )
            assert [j.id for j in rest] == ids[2:]
        # the held claim committed: nothing is left
        assert (
            await driver.executor().job_get_available(
                queue="default", max_to_lock=10, client_id="b"
            )
            == []
        )


async def test_hot_statements_stay_one_prepared_statement(pg_url: str) -> None:
    """Parameter types do not vary with values (limits, ids, batch sizes), so psycopg keeps
    one prepared statement per hot query."""
    async with open_postgres(pg_url, prepare_threshold=0) as driver:
        small = await insert(driver, 20)
        await driver.executor().execute("SELECT setval('river_job_id_seq', 5000000000)")
        big = await insert(driver, 20)
        now = dt.datetime.now(UTC)
        async with driver.transaction() as tx:
            assert isinstance(tx, PostgresExecutor)
            for limit in (1, 3, 40_000, 70_000, 2):
                await tx.job_get_available(
                    queue="default", max_to_lock=limit, client_id="c", max_attempted_by=100
                )
            await tx.job_get_available(queue="nothing", max_to_lock=1, client_id="c", kinds=["k"])
            await tx.job_get_available(
                queue="nothing", max_to_lock=99_999, client_id="c", kinds=["k", "l"]
            )
            for batch in (small[:1], small[1:], big[:1], big[1:], [*small, *big]):
                await tx.job_set_state_if_running_many(
                    [
                        JobCompletion(id=i, attempt=1, state=S.COMPLETED, finalized_at=now)
                        for i in batch
                    ],
                    client_id="c",
                )
            await tx.job_cancel(job_id=small[0], cancel_attempted_at=now)
            await tx.job_cancel(job_id=big[0], cancel_attempted_at=now)
            assert await prepared(tx, "FOR UPDATE SKIP LOCKED") == 2  # with and without kinds
            assert await prepared(tx, "WITH ORDINALITY AS r(") == 1
            assert await prepared(tx, "'cancel'") == 1
        rows = await driver.executor().job_list(states=[S.COMPLETED], limit=100)
        assert len(rows) == 40


async def test_custom_schema(pg_schema_url: str) -> None:
    from ..conftest import CUSTOM_SCHEMA

    async with (
        open_postgres(pg_schema_url, schema=CUSTOM_SCHEMA) as driver,
        driver.listener() as listener,
    ):
        await listener.listen(TOPIC_CONTROL)
        ex = driver.executor()
        ids = await insert(driver, 3, queue="sq")
        claimed = await ex.job_get_available(queue="sq", max_to_lock=2, client_id="c")
        assert [j.id for j in claimed] == ids[:2]
        now = dt.datetime.now(UTC)
        (res,) = await ex.job_set_state_if_running_many(
            [JobCompletion(id=ids[0], attempt=1, state=S.COMPLETED, finalized_at=now)],
            client_id="c",
        )
        assert res.applied and res.job.state is S.COMPLETED
        cancelled = await ex.job_cancel(job_id=ids[2], cancel_attempted_at=now)
        assert cancelled is not None and cancelled.state is S.CANCELLED
        await ex.queue_create_or_set_updated_at(name="sq")
        assert await ex.queue_pause("sq") == 1
        got = []
        with anyio.fail_after(10):
            async for note in listener:
                got.append(json.loads(note.payload))
                if len(got) == 2:
                    break
        assert got == [
            {"action": "cancel", "job_id": ids[2], "queue": "sq"},
            {"action": "pause", "queue": "sq"},
        ]
        n = await ex.fetch_all(
            f'SELECT count(*) FROM "{CUSTOM_SCHEMA}".river_queue WHERE paused_at IS NOT NULL'
        )
        assert n == [(1,)]


async def test_cancel_payload_matches_river(pg_url: str) -> None:
    """River builds the cancel payload with json_build_object (spaces around colons)."""
    async with open_postgres(pg_url) as driver, driver.listener() as listener:
        await listener.listen(TOPIC_CONTROL)
        (job_id,) = await insert(driver, 1, queue="pq")
        await driver.executor().job_cancel(job_id=job_id, cancel_attempted_at=dt.datetime.now(UTC))
        with anyio.fail_after(10):
            async for note in listener:
                assert (
                    note.payload == f'{{"action" : "cancel", "job_id" : {job_id}, "queue" : "pq"}}'
                )
                break


async def test_completion_times_keep_microseconds_and_must_be_aware(pg_url: str) -> None:
    from river_anyio import ValidationError

    async with open_postgres(pg_url) as driver:
        ex = driver.executor()
        a, b = await insert(driver, 2)
        await ex.job_get_available(queue="default", max_to_lock=2, client_id="c")
        fin = dt.datetime(
            2031, 2, 3, 4, 5, 6, 123457, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))
        )
        far = dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
        with pytest.raises(ValidationError):
            await ex.job_set_state_if_running_many(
                [
                    JobCompletion(
                        id=a, attempt=1, state=S.COMPLETED, finalized_at=dt.datetime(2030, 1, 1)
                    )
                ],
                client_id="c",
            )
        r1, r2 = await ex.job_set_state_if_running_many(
            [
                JobCompletion(id=a, attempt=1, state=S.COMPLETED, finalized_at=fin),
                JobCompletion(id=b, attempt=1, state=S.RETRYABLE, scheduled_at=far),
            ],
            client_id="c",
        )
        assert r1.job.finalized_at == fin
        assert r2.job.scheduled_at == far and r2.job.state is S.RETRYABLE


async def _wait_for_lock_waiter(driver: PostgresDriver) -> None:
    """Until some backend waits on a row lock (the statement under test is blocked)."""
    with anyio.fail_after(10):
        while True:
            rows = await driver.executor().fetch_all(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            if rows[0][0]:
                return
            await anyio.sleep(0.01)


@pytest.mark.parametrize("concurrent", ["rescued", "still_running"])
async def test_completion_judges_a_row_changed_meanwhile_on_its_newest_version(
    pg_url: str, concurrent: str
) -> None:
    """A completion that waits for a row another transaction is changing applies according
    to the row as that transaction left it: not when the row was rescued meanwhile (it
    is no longer running this attempt; its metadata update still merges), and as usual when
    the row is still running it."""
    async with open_postgres(pg_url) as driver:
        [job_id] = await insert(driver, 1)
        [claimed] = await driver.executor().job_get_available(
            queue="default", max_to_lock=1, client_id="me"
        )
        assert claimed.id == job_id
        now = dt.datetime.now(UTC)
        completion = JobCompletion(
            id=job_id,
            attempt=claimed.attempt,
            state=S.COMPLETED,
            finalized_at=now,
            metadata_updates=b'{"seen": true}',
        )
        results = []

        async def complete() -> None:
            results.extend(
                await driver.executor().job_set_state_if_running_many([completion], client_id="me")
            )

        change = (
            "UPDATE river_job SET state = 'available', scheduled_at = now() WHERE id = %s"
            if concurrent == "rescued"
            else "UPDATE river_job SET metadata = metadata || '{\"other\": 1}' WHERE id = %s"
        )
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                async with driver.transaction() as tx:
                    await tx.execute(change, (job_id,))
                    tg.start_soon(complete)
                    await _wait_for_lock_waiter(driver)
                # committed: the waiting completion goes on, and the group waits for it
        [result] = results
        row = await driver.executor().job_get_by_id(job_id)
        assert row is not None
        assert row.metadata["seen"] is True  # merged either way
        if concurrent == "rescued":
            assert not result.applied
            assert row.state == S.AVAILABLE
            assert row.finalized_at is None
        else:
            assert result.applied
            assert row.state == S.COMPLETED
            assert row.metadata["other"] == 1
            assert row.finalized_at is not None


async def test_completion_finds_its_rows_by_id_whatever_the_statistics(pg_url: str) -> None:
    """The completion's rows come by primary key even when the planner believes few rows are
    running (statistics taken before a claim) and plans generically, as a prepared statement
    does: a plan driven by the state index would read every running job of every client for
    each completion."""
    from river_anyio.drivers.postgres._executor import _completion_columns

    async with open_postgres(pg_url) as driver:
        await insert(driver, 2000)
        await driver.executor().execute("ANALYZE river_job")  # none running yet
        claimed = await driver.executor().job_get_available(
            queue="default", max_to_lock=2000, client_id="c"
        )
        now = dt.datetime.now(UTC)
        completions = [
            JobCompletion(id=j.id, attempt=j.attempt, state=S.COMPLETED, finalized_at=now)
            for j in claimed[:50]
        ]
        query = driver._queries.job_set_state_if_running_many_lean
        async with driver.transaction() as tx:
            await tx.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            plan = await tx.fetch_all(
                "EXPLAIN (COSTS OFF) " + query, _completion_columns(completions, "c")
            )
        text = "\n".join(row[0] for row in plan)
        applied = text[text.index("CTE applied") : text.index("CTE merged")]
        # (a seq scan may be cheapest on a table this small; an index on state never is)
        assert "Index Cond: (state" not in applied, text
        assert "river_job_prioritized_fetching_index" not in applied, text


async def test_notifications_carry_their_payloads_exactly(pg_url: str) -> None:
    """Payloads travel as one text parameter: each arrives as sent, an empty one and ones
    with commas, quotes and non-ASCII included; one with the separator is refused."""
    from river_anyio import ValidationError
    from river_anyio.drivers import TOPIC_INSERT

    payloads = ['{"queue": "a,b"}', "", '{"x": "é ü \\" 中"}', "plain text"]
    async with open_postgres(pg_url) as sender, open_postgres(pg_url) as receiver:
        async with receiver.listener() as listener:
            await listener.listen(TOPIC_INSERT)
            await sender.executor().notify_many(TOPIC_INSERT, payloads)
            got = []
            with anyio.fail_after(10):
                async for note in listener:
                    got.append(note.payload)
                    if len(got) == len(payloads):
                        break
            assert got == payloads
        with pytest.raises(ValidationError, match="U\\+001E"):
            await sender.executor().notify_many(TOPIC_INSERT, ["a\x1eb"])


async def test_hot_statements_on_the_direct_path_survive_errors_and_cancellation(
    pg_url: str,
) -> None:
    """Claims, single inserts and lean completions run on the connection's direct path: a
    statement failing there, or cancelled mid-flight, leaves the connection usable; each is
    prepared once; one whose prepared statement was dropped behind the driver's back (as by
    ``DEALLOCATE ALL`` or a pooler's ``DISCARD ALL``) is prepared again; and the last result
    is not held once its rows are read."""
    from river_anyio import DatabaseError
    from river_anyio.drivers.postgres import AnyioConnection

    async with open_postgres(pg_url) as driver:
        conn = await AnyioConnection.connect(pg_url)
        try:
            ex = driver.executor_for(conn)
            [first] = await ex.job_insert_fast_many([job(1)])
            bad = JobCompletion(  # the server refuses the metadata: not JSON
                id=first.job.id, attempt=1, state=S.COMPLETED, metadata_updates=b"{nope"
            )
            with pytest.raises(DatabaseError):
                await ex.job_set_state_if_running_many([bad], client_id="c", return_rows=False)
            with anyio.move_on_after(0.001):  # cancelled while the claim may be in flight
                await ex.job_get_available(queue="default", max_to_lock=1, client_id="c")
            assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
            [second] = await ex.job_insert_fast_many([job(2)])
            await conn.execute("DEALLOCATE ALL")  # behind the direct path's back
            claimed = await ex.job_get_available(queue="default", max_to_lock=10, client_id="c")
            # the cancelled claim may have taken the first job before it was cancelled
            assert second.job.id in {j.id for j in claimed}
            assert conn._direct_tx is not None and conn._direct_tx.pgresult is None
            now = dt.datetime.now(UTC)
            done = [
                JobCompletion(id=j.id, attempt=j.attempt, state=S.COMPLETED, finalized_at=now)
                for j in claimed
            ]
            results = await ex.job_set_state_if_running_many(done, client_id="c", return_rows=False)
            assert results == []  # every completion applied
            for _ in range(3):
                await ex.job_get_available(queue="default", max_to_lock=10, client_id="c")
                await ex.job_insert_fast_many([job(3)])
            assert await prepared(ex, "FOR UPDATE SKIP LOCKED") == 1
            assert await prepared(ex, "INSERT INTO") == 1
            rows = await ex.job_list(states=[S.COMPLETED], limit=10)
            assert {r.id for r in rows} == {j.id for j in claimed}
        finally:
            await conn.close()


async def test_the_direct_path_prepares_nothing_without_prepared_statements(pg_url: str) -> None:
    """With ``prepare_threshold=None`` (a pooler without prepared statements) the direct path
    sends each statement with its text and prepares none."""
    async with open_postgres(pg_url, prepare_threshold=None) as driver:
        async with driver.transaction() as tx:  # one connection throughout
            assert isinstance(tx, PostgresExecutor)
            await tx.job_insert_fast_many([job(1)])
            [claimed] = await tx.job_get_available(queue="default", max_to_lock=5, client_id="c")
            now = dt.datetime.now(UTC)
            done = JobCompletion(id=claimed.id, attempt=1, state=S.COMPLETED, finalized_at=now)
            assert (
                await tx.job_set_state_if_running_many([done], client_id="c", return_rows=False)
                == []
            )
            rows = await tx.fetch_all("SELECT count(*) FROM pg_prepared_statements")
            assert rows[0][0] == 0


async def test_claims_leave_gin_pending_list_merges_to_other_statements(pg_url: str) -> None:
    """A claim's updated rows add entries to the pending lists of River's GIN indexes
    (``args``, ``metadata``) but the claim never merges a list that outgrew
    ``gin_pending_list_limit``: the merge holds the statement that does it for 100 ms or more
    on a busy table, and a claim held that long delays its whole queue. Other statements
    still merge it, and the claim's raised limit ends with its transaction."""
    wide = {f"key_{k}": f"value {k} " * 4 for k in range(12)}
    async with open_postgres(pg_url, pool_max_size=1) as driver:  # one session throughout
        ex = driver.executor()
        await insert(driver, 600, encoded_args=json.dumps(wide).encode())
        await ex.execute("SET gin_pending_list_limit = '64kB'")  # 8 pages
        clean = "SELECT gin_clean_pending_list('river_job_args_index'::regclass)"
        await ex.fetch_all(clean)  # empty to begin with
        claimed = 0
        while batch := await ex.job_get_available(queue="default", max_to_lock=50, client_id="c"):
            claimed += len(batch)
        assert claimed == 600
        # 600 claimed rows' entries are still pending: far past the session's 8 pages
        [(pages,)] = await ex.fetch_all(clean)
        assert pages > 16
        assert (await ex.fetch_all("SHOW gin_pending_list_limit")) == [("64kB",)]
        # any other statement past the limit merges it (here an update of the same rows)
        await ex.execute("UPDATE river_job SET args = args || '{\"k\": 1}'")
        [(pages,)] = await ex.fetch_all(clean)
        assert pages <= 8


async def test_claims_and_completions_reach_their_rows_by_id(pg_url: str) -> None:
    """A claim or a completion of a few hundred rows reads those rows through the primary
    key, not by scanning the whole table: on an analyzed table of a few thousand rows the
    planner would otherwise hash-join the batch with a scan of every row (a completion of 800
    on 20,000 rows took 23.6 ms that way, 13.8 by id)."""
    async with open_postgres(pg_url) as driver:
        await insert(driver, 3000)
        await driver.executor().execute("ANALYZE river_job")
        async with driver.transaction() as tx:  # the transaction's own table statistics
            claimed = await tx.job_get_available(queue="default", max_to_lock=300, client_id="c")
            assert len(claimed) == 300
            now = dt.datetime.now(UTC)
            done = [
                JobCompletion(id=j.id, attempt=j.attempt, state=S.COMPLETED, finalized_at=now)
                for j in claimed
            ]
            results = await tx.job_set_state_if_running_many(done, client_id="c")
            assert len(results) == 300 and all(r.applied for r in results)
            # again, with metadata updates: none applies now, the updates merge anyway
            again = [attrs.evolve(c, metadata_updates=b'{"again": true}') for c in done]
            missed = await tx.job_set_state_if_running_many(again, client_id="c", return_rows=False)
            assert sorted(r.id for r in missed) == sorted(j.id for j in claimed)
            [(scans,)] = await tx.fetch_all(
                "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'river_job'::regclass"
            )
            assert scans == 0
            [(merged,)] = await tx.fetch_all(
                "SELECT count(*) FROM river_job WHERE metadata @> '{\"again\": true}'"
            )
            assert merged == 300
