"""The PostgreSQL executor and driver: inserts, reads, notifications, errors, configuration."""

from __future__ import annotations

import datetime as dt
import json

import attrs
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from river_anyio import _errors
from river_anyio._job import AttemptError, JobState
from river_anyio._unique import unique_states_mask
from river_anyio.drivers._protocol import JobInsertParams
from river_anyio.drivers.postgres import AnyioConnection, PostgresExecutor, open_postgres
from river_anyio.drivers.postgres._errors import translate_error

pytestmark = pytest.mark.anyio

UTC = dt.UTC
DEFAULT_UNIQUE = frozenset(
    {
        JobState.AVAILABLE,
        JobState.COMPLETED,
        JobState.PENDING,
        JobState.RETRYABLE,
        JobState.RUNNING,
        JobState.SCHEDULED,
    }
)


def job(i: int = 0, **overrides: object) -> JobInsertParams:
    values: dict[str, object] = {
        "encoded_args": json.dumps({"i": i}).encode(),
        "kind": "test_kind",
        "max_attempts": 25,
        "metadata": b"{}",
        "priority": 1,
        "queue": "default",
        "state": JobState.AVAILABLE,
        "tags": (),
    }
    values.update(overrides)
    return JobInsertParams(**values)  # type: ignore[arg-type]


# --- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"url": "sqlite://x.db"}, "url"),
        ({"url": ""}, "url"),
        ({"url": 5}, "url"),
        ({"schema": "1abc"}, "schema"),
        ({"schema": "a-b"}, "schema"),
        ({"schema": "a" * 47}, "schema"),
        ({"pool_max_size": 0}, "pool_max_size"),
        ({"pool_max_size": True}, "pool_max_size"),
        ({"acquire_timeout": 0}, "acquire_timeout"),
        ({"acquire_timeout": float("inf")}, "acquire_timeout"),
        ({"connect_timeout": -1}, "connect_timeout"),
        ({"connect_timeout": "3"}, "connect_timeout"),
        ({"prepare_threshold": -1}, "prepare_threshold"),
        ({"prepare_threshold": 1.5}, "prepare_threshold"),
    ],
)
async def test_open_postgres_validates_arguments(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"url": "postgresql://localhost/x", **kwargs}
    url = args.pop("url")
    with pytest.raises(_errors.ConfigError) as info:
        open_postgres(url, **args)  # type: ignore[arg-type]
    assert info.value.field == field


async def test_url_forms_and_session_settings(pg_url: str) -> None:
    params = conninfo_to_dict(pg_url)
    url = (
        f"postgres://{params['user']}@{params['host']}:{params['port']}/{params['dbname']}"
        "?options=-c%20statement_timeout%3D12345"
    )
    for target in (url, url.replace("postgres://", "postgresql://", 1), pg_url):
        async with open_postgres(target, schema="a" * 46) as driver:
            rows = await driver.executor().fetch_all(
                "SELECT current_setting('TimeZone'), current_setting('statement_timeout')"
            )
            assert rows[0][0] == "UTC"
            if target != pg_url:
                assert rows[0][1] == "12345ms"


async def test_unreachable_server_fails_at_open(pg_url: str) -> None:
    params = conninfo_to_dict(pg_url)
    params["port"] = "1"
    with pytest.raises(_errors.ConnectionLostError) as info:
        async with open_postgres(make_conninfo("", **params), connect_timeout=2):
            pass
    assert isinstance(info.value.__cause__, psycopg.OperationalError)


# --- inserts --------------------------------------------------------------------------------


async def test_insert_fast_many_defaults_and_order(pg_url: str) -> None:
    scheduled = dt.datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    created = dt.datetime(2020, 6, 7, 8, 9, 10, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    async with open_postgres(pg_url) as driver:
        ex = driver.executor()
        (now,) = (await ex.fetch_all("SELECT now()"))[0]
        params = [
            job(0),
            job(
                1,
                kind="other",
                queue="q1",
                priority=3,
                max_attempts=7,
                tags=("a_b", "c-d"),
                metadata=b'{"m": [1, 2]}',
                encoded_args=b'{"s": "\\"quoted\\\\ \\u00e9\\n", "z": 1, "a": null}',
                scheduled_at=scheduled,
                created_at=created,
                state=JobState.SCHEDULED,
            ),
            job(2, state=JobState.PENDING, metadata=b""),
            job(3, encoded_args=b""),
        ]
        results = await ex.job_insert_fast_many(params)
        assert [r.unique_skipped_as_duplicate for r in results] == [False] * 4
        jobs = [r.job for r in results]
        assert [j.id for j in jobs] == sorted(j.id for j in jobs)
        assert [j.args.get("i") for j in jobs] == [0, None, 2, None]
        first, second, third, fourth = jobs
        assert fourth.args == {}
        assert first.kind == "test_kind"
        assert first.queue == "default"
        assert first.state is JobState.AVAILABLE
        assert first.tags == ()
        assert first.metadata == {}
        assert first.attempt == 0
        assert first.attempted_at is None
        assert first.attempted_by == ()
        assert first.errors == ()
        assert first.finalized_at is None
        assert first.unique_key is None
        assert first.unique_states is None
        assert first.created_at >= now
        assert first.scheduled_at == first.created_at
        assert first.created_at.utcoffset() == dt.timedelta(0)
        assert first.encoded_args == b'{"i": 0}'
        assert second.kind == "other"
        assert (second.queue, second.priority, second.max_attempts) == ("q1", 3, 7)
        assert second.tags == ("a_b", "c-d")
        assert second.metadata == {"m": [1, 2]}
        assert second.args == {"s": '"quoted\\ é\n', "z": 1, "a": None}
        assert json.loads(second.encoded_args) == second.args
        assert second.scheduled_at == scheduled
        assert second.created_at == created
        assert second.state is JobState.SCHEDULED
        assert third.state is JobState.PENDING
        assert third.metadata == {}
        assert await ex.job_get_by_id(second.id) == second


async def test_insert_fast_many_unique_duplicates(pg_url: str) -> None:
    key_a, key_b = b"a" * 32, b"b" * 32
    async with open_postgres(pg_url) as driver:
        ex = driver.executor()
        (existing,) = await ex.job_insert_fast_many(
            [job(1, unique_key=key_a, unique_states=245, metadata=b'{"first": true}')]
        )
        assert not existing.unique_skipped_as_duplicate
        assert existing.job.unique_key == key_a
        assert existing.job.unique_states == DEFAULT_UNIQUE
        rows = await ex.fetch_all(
            "SELECT unique_states::text FROM river_job WHERE id = %s", [existing.job.id]
        )
        assert rows == [("11110101",)]

        results = await ex.job_insert_fast_many(
            [
                job(2),
                job(3, unique_key=key_a, unique_states=245, kind="renamed"),
                job(4, unique_key=key_b, unique_states=245),
                job(5),
            ]
        )
        assert [r.unique_skipped_as_duplicate for r in results] == [False, True, False, False]
        assert [r.job.args.get("i") for r in results] == [2, 1, 4, 5]
        duplicate = results[1].job
        assert duplicate.id == existing.job.id
        assert duplicate.kind == "test_kind"  # the existing row, unchanged
        assert duplicate.metadata == {"first": True}

        # A row whose state is outside its own unique states does not block.
        await ex.execute(
            "UPDATE river_job SET state = 'cancelled', finalized_at = now() WHERE id = %s",
            [existing.job.id],
        )
        (fresh,) = await ex.job_insert_fast_many([job(6, unique_key=key_a, unique_states=245)])
        assert not fresh.unique_skipped_as_duplicate
        assert fresh.job.id != existing.job.id


async def test_unique_states_mask_round_trip(pg_url: str) -> None:
    async with open_postgres(pg_url) as driver:
        ex = driver.executor()
        for i, states in enumerate(
            [DEFAULT_UNIQUE, frozenset(JobState), frozenset({JobState.SCHEDULED})]
        ):
            mask = unique_states_mask(states)
            (r,) = await ex.job_insert_fast_many(
                [job(i, unique_key=bytes([i]) * 32, unique_states=mask)]
            )
            assert r.job.unique_states == states
        assert unique_states_mask(DEFAULT_UNIQUE) == 0xF5


async def test_insert_fast_many_large_batch_is_one_statement(pg_url: str) -> None:
    n = 5000
    async with open_postgres(pg_url) as driver:
        results = await driver.executor().job_insert_fast_many(
            [job(i, tags=("t1",) if i % 2 else ()) for i in range(n)]
        )
        assert [r.job.args["i"] for r in results] == list(range(n))
        assert results[1].job.tags == ("t1",)
        assert results[0].job.tags == ()
        assert await driver.executor().fetch_all("SELECT count(*) FROM river_job") == [(n,)]


_WHEN = dt.datetime(2031, 5, 6, 7, 8, 9, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"encoded_args": b""},
        {"tags": ("a", "b c"), "priority": 3, "max_attempts": 5, "queue": "q"},
        {"metadata": b'{"m": [1, "x"]}', "created_at": _WHEN},
        {"scheduled_at": _WHEN, "state": JobState.SCHEDULED},
        {"state": JobState.PENDING},
        {"unique_states": unique_states_mask([JobState.AVAILABLE])},
    ],
    ids=["plain", "empty_args", "tags", "metadata_created", "scheduled", "pending", "states"],
)
async def test_one_job_is_written_as_in_a_batch(pg_url: str, overrides: dict[str, object]) -> None:
    """A single job without a unique key takes the single-row statement: every column comes
    out as the batch statement writes it (with and without the insert notification)."""
    async with open_postgres(pg_url) as driver:
        ex = driver.executor()
        (alone,) = await ex.job_insert_fast_many([job(1, **overrides)])
        (notified,) = await ex.job_insert_fast_many_notify(
            [job(1, **overrides)], topic="river_insert", payloads=['{"queue": "q"}']
        )
        batch = await ex.job_insert_fast_many([job(1, **overrides), job(2)])
        for single in (alone, notified):
            assert not single.unique_skipped_as_duplicate
            ours = attrs.asdict(single.job)
            theirs = attrs.asdict(batch[0].job)
            # the id differs; times the job does not set are the server's now()
            for name in ("id", "created_at", "scheduled_at"):
                if name not in overrides:
                    ours.pop(name)
                    theirs.pop(name)
            assert ours == theirs
        if "created_at" in overrides:
            assert alone.job.created_at == _WHEN
        if "scheduled_at" in overrides:
            assert alone.job.scheduled_at == _WHEN
        elif "created_at" not in overrides:  # both the server's now(), as for a batch
            assert alone.job.scheduled_at == alone.job.created_at


async def test_insert_rejects_bad_input_before_writing(pg_url: str) -> None:
    async with open_postgres(pg_url) as driver:
        ex = driver.executor()
        naive = dt.datetime(2030, 1, 1)
        with pytest.raises(_errors.ValidationError):
            await ex.job_insert_fast_many([job(scheduled_at=naive)])
        with pytest.raises(_errors.ValidationError):
            await ex.job_insert_fast_many_no_returning([job(created_at=naive)])
        with pytest.raises(_errors.ValidationError):
            await ex.job_insert_fast_many([job(kind="a\x1eb")])
        with pytest.raises(_errors.ValidationError):
            await ex.job_insert_fast_many([job(tags=("a\x1fb",))])
        with pytest.raises(_errors.ValidationError):
            await ex.job_insert_fast_many([job(encoded_args=b"\xff")])
        assert await ex.job_insert_fast_many([]) == []
        assert await ex.job_insert_fast_many_no_returning([]) == 0
        assert await ex.fetch_all("SELECT count(*) FROM river_job") == [(0,)]


async def test_insert_no_returning_copy(pg_url: str) -> None:
    when = dt.datetime(2031, 5, 6, 7, 8, 9, 1, tzinfo=UTC)
    async with open_postgres(pg_url) as driver:
        ex = driver.executor()
        (now,) = (await ex.fetch_all("SELECT now()"))[0]
        count = await ex.job_insert_fast_many_no_returning(
            [
                job(0),
                job(
                    1,
                    tags=("x-y", 'we"ird\\tag', "t\tab"),
                    encoded_args=b'{"s": "tab\\t back\\\\slash \\"q\\"\\n"}',
                    metadata=b'{"k": "v"}',
                    unique_key=b"\x00\x01\xff" * 11,
                    unique_states=245,
                    priority=4,
                ),
            ]
        )
        assert count == 2
        first, second = await ex.job_list()
        assert first.args == {"i": 0}
        assert first.created_at >= now  # database clock (column default)
        assert second.tags == ("x-y", 'we"ird\\tag', "t\tab")
        assert second.args == {"s": 'tab\t back\\slash "q"\n'}
        assert second.metadata == {"k": "v"}
        assert second.unique_key == b"\x00\x01\xff" * 11
        assert second.unique_states == DEFAULT_UNIQUE
        assert second.priority == 4

        # Mixed timestamps: given ones kept, missing ones take a current time.
        count = await ex.job_insert_fast_many_no_returning(
            [job(2, scheduled_at=when, state=JobState.SCHEDULED), job(3)]
        )
        assert count == 1 + 1
        third, fourth = await ex.job_list(after_id=second.id)
        assert third.scheduled_at == when
        assert abs(fourth.scheduled_at - dt.datetime.now(UTC)) < dt.timedelta(minutes=5)

        # COPY has no conflict handling: a duplicate unique key fails the whole batch.
        with pytest.raises(_errors.UniqueViolationError):
            await ex.job_insert_fast_many_no_returning(
                [job(9), job(10, unique_key=b"\x00\x01\xff" * 11, unique_states=245)]
            )
        assert len(await ex.job_list()) == 4


async def test_job_get_and_list(pg_url: str) -> None:
    async with open_postgres(pg_url) as driver:
        ex = driver.executor()
        jobs = [
            r.job
            for r in await ex.job_insert_fast_many(
                [
                    job(0, kind="k1", queue="q1"),
                    job(1, kind="k2", queue="q1"),
                    job(2, kind="k1", queue="q2", state=JobState.PENDING),
                ]
            )
        ]
        assert await ex.job_get_by_id(10_000_000) is None
        assert await ex.job_get_by_id(jobs[2].id) == jobs[2]
        assert await ex.job_list() == jobs
        assert await ex.job_list(kinds=["k1"]) == [jobs[0], jobs[2]]
        assert await ex.job_list(queues=["q1"], kinds=["k1"]) == [jobs[0]]
        assert await ex.job_list(states=[JobState.PENDING]) == [jobs[2]]
        assert await ex.job_list(ids=[jobs[1].id, jobs[2].id]) == jobs[1:]
        assert await ex.job_list(after_id=jobs[0].id, limit=1) == [jobs[1]]
        assert await ex.job_list(ids=[]) == []


async def test_errors_and_attempted_by_are_converted(pg_url: str) -> None:
    async with open_postgres(pg_url) as driver:
        ex = driver.executor()
        (r,) = await ex.job_insert_fast_many([job()])
        errors = [
            '{"at": "2025-01-02T03:04:05.123456789+02:00", "attempt": 1, "error": "boom",'
            ' "trace": "main.go:1"}',
            '{"at": "2025-01-02T03:04:06Z", "attempt": 2, "error": "again", "trace": ""}',
        ]
        await ex.execute(
            "UPDATE river_job SET errors = %s::jsonb[], attempted_by = %s, attempt = 2,"
            " attempted_at = now(), state = 'retryable' WHERE id = %s",
            [errors, ["client_a", "client_b"], r.job.id],
        )
        got = await ex.job_get_by_id(r.job.id)
        assert got is not None
        assert got.errors == (
            AttemptError(
                at=dt.datetime(
                    2025, 1, 2, 3, 4, 5, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2))
                ),
                attempt=1,
                error="boom",
                trace="main.go:1",
                at_nanosecond=789,  # the nanoseconds Go wrote past the microseconds
            ),
            AttemptError(at=dt.datetime(2025, 1, 2, 3, 4, 6, tzinfo=UTC), attempt=2, error="again"),
        )
        assert got.attempted_by == ("client_a", "client_b")
        assert got.state is JobState.RETRYABLE
        assert got.attempted_at is not None


# --- generic access, schema -----------------------------------------------------------------


async def test_generic_access(pg_url: str) -> None:
    async with open_postgres(pg_url) as driver:
        ex = driver.executor()
        await ex.exec_script("CREATE TABLE g (a int, b text); INSERT INTO g VALUES (1, 'x');")
        assert await ex.fetch_all("SELECT a, b FROM g WHERE a = %s", [1]) == [(1, "x")]
        assert await ex.execute("UPDATE g SET b = %s", ["y"]) == 1
        assert await ex.fetch_all("UPDATE g SET b = 'z'") == []
        assert await ex.table_exists("g")
        assert await ex.table_exists("river_job")
        assert not await ex.table_exists("nope")
        assert await ex.column_exists("river_job", "unique_states")
        assert not await ex.column_exists("river_job", "nope")
        assert not await ex.column_exists("nope", "a")
        assert ex.dialect == "postgres"
        assert driver.dialect == "postgres"
        assert driver.supports_listen_notify
        assert driver.schema is None


async def test_custom_schema_qualifies_everything(pg_schema_url: str) -> None:
    async with open_postgres(pg_schema_url, schema="river_custom") as driver:
        ex = driver.executor()
        assert driver.schema == "river_custom"
        # search_path does not reach the custom schema: only qualified names work.
        assert await ex.fetch_all("SELECT to_regclass('river_job') IS NULL") == [(True,)]
        assert await ex.table_exists("river_job")
        assert await ex.column_exists("river_job", "unique_key")
        assert not await ex.table_exists("river_nope")
        (r,) = await ex.job_insert_fast_many([job(1, unique_key=b"u" * 32, unique_states=245)])
        (d,) = await ex.job_insert_fast_many([job(2, unique_key=b"u" * 32, unique_states=245)])
        assert d.unique_skipped_as_duplicate
        assert d.job.id == r.job.id
        assert await ex.job_insert_fast_many_no_returning([job(3)]) == 1
        assert [j.args["i"] for j in await ex.job_list(states=[JobState.AVAILABLE])] == [1, 3]
        assert await ex.job_get_by_id(r.job.id) == r.job
    async with open_postgres(pg_schema_url) as driver:
        with pytest.raises(_errors.DatabaseError) as info:
            await driver.executor().job_insert_fast_many([job()])
        assert info.value.sqlstate == "42P01"  # undefined table without the schema


# --- transactions, executor_for -------------------------------------------------------------


async def test_transaction_commit_and_rollback(pg_url: str) -> None:
    async with open_postgres(pg_url) as driver:
        async with driver.transaction() as tx:
            await tx.job_insert_fast_many([job(1)])
        with pytest.raises(ZeroDivisionError):
            async with driver.transaction() as tx:
                await tx.job_insert_fast_many([job(2)])
                assert len(await tx.job_list()) == 2
                raise ZeroDivisionError
        assert [j.args["i"] for j in await driver.executor().job_list()] == [1]
        stats = driver.statistics()
        assert (stats.in_use, stats.discarded) == (0, 0)


async def test_executor_for(pg_url: str, anyio_backend: str) -> None:
    async with open_postgres(pg_url) as driver:
        ex = driver.executor()
        assert driver.executor_for(ex) is ex
        async with await AnyioConnection.connect(pg_url) as conn:
            mine = driver.executor_for(conn)
            assert isinstance(mine, PostgresExecutor)
            assert mine.connection is conn
            async with conn.transaction(force_rollback=True):
                await mine.job_insert_fast_many([job(1)])
                assert len(await mine.job_list()) == 1
            assert await ex.job_list() == []
        with pytest.raises(TypeError, match="accepts"):
            driver.executor_for(object())
        with (
            psycopg.connect(pg_url) as sync_conn,
            pytest.raises(TypeError, match="synchronous"),
        ):
            driver.executor_for(sync_conn)
        if anyio_backend == "asyncio":
            async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as stock:
                stock_ex = driver.executor_for(stock)
                (r,) = await stock_ex.job_insert_fast_many([job(5)])
                assert await ex.job_get_by_id(r.job.id) == r.job
        else:
            stock = object.__new__(psycopg.AsyncConnection)
            with pytest.raises(TypeError, match="only works under asyncio"):
                driver.executor_for(stock)


# --- errors ---------------------------------------------------------------------------------


async def test_errors_are_translated(pg_url: str) -> None:
    async with open_postgres(pg_url, acquire_timeout=0.2, pool_max_size=1) as driver:
        ex = driver.executor()
        await ex.exec_script("CREATE TABLE u (a int PRIMARY KEY, b int CHECK (b > 0))")
        await ex.execute("INSERT INTO u VALUES (1, 1)")
        with pytest.raises(_errors.UniqueViolationError) as unique:
            await ex.execute("INSERT INTO u VALUES (1, 1)")
        assert unique.value.sqlstate == "23505"
        assert isinstance(unique.value.__cause__, psycopg.errors.UniqueViolation)
        with pytest.raises(_errors.IntegrityError) as check:
            await ex.execute("INSERT INTO u VALUES (2, -1)")
        assert check.value.sqlstate == "23514"
        assert not isinstance(check.value, _errors.UniqueViolationError)
        with pytest.raises(_errors.IntegrityError):
            await ex.job_insert_fast_many([job(priority=9)])
        with pytest.raises(_errors.DatabaseError) as syntax:
            await ex.fetch_all("SELEC 1")
        assert syntax.value.sqlstate == "42601"
        assert type(syntax.value) is _errors.DatabaseError
        with pytest.raises(_errors.QueryCanceledError) as canceled:
            async with driver.transaction() as tx:
                await tx.execute("SET LOCAL statement_timeout = 50")
                await tx.fetch_all("SELECT pg_sleep(5)")
        assert canceled.value.sqlstate == "57014"
        async with driver.pool.connection():
            with pytest.raises(_errors.PoolTimeoutError):
                await ex.fetch_all("SELECT 1")
        with pytest.raises(_errors.ConnectionLostError, match="nothing was committed"):
            async with driver.transaction() as tx:
                (pid,) = (await tx.fetch_all("SELECT pg_backend_pid()"))[0]
                async with await AnyioConnection.connect(pg_url) as other:
                    await other.execute("SELECT pg_terminate_backend(%s)", [pid])
                with pytest.raises(_errors.ConnectionLostError) as lost:
                    await tx.fetch_all("SELECT 1")
                assert lost.value.transient
        # The dead connection was discarded; the pool works again.
        assert await ex.fetch_all("SELECT 1") == [(1,)]
        assert driver.statistics().discarded == 1


def test_translate_error_mapping() -> None:
    cases = [
        (psycopg.errors.UniqueViolation("x"), _errors.UniqueViolationError),
        (psycopg.errors.ForeignKeyViolation("x"), _errors.IntegrityError),
        (psycopg.errors.NotNullViolation("x"), _errors.IntegrityError),
        (psycopg.errors.QueryCanceled("x"), _errors.QueryCanceledError),
        (psycopg.OperationalError("closed"), _errors.ConnectionLostError),
        (psycopg.errors.AdminShutdown("x"), _errors.ConnectionLostError),
        (psycopg.errors.ConnectionFailure("x"), _errors.ConnectionLostError),
        (psycopg.InterfaceError("the connection is closed"), _errors.ConnectionLostError),
        (psycopg.errors.SerializationFailure("x"), _errors.DatabaseError),
        (psycopg.errors.UndefinedTable("x"), _errors.DatabaseError),
    ]
    for exc, expected in cases:
        assert type(translate_error(exc)) is expected, exc
    assert translate_error(psycopg.errors.UndefinedTable("x")).sqlstate == "42P01"
    # a lost race is worth retrying; other errors are not, unless the connection is gone
    assert translate_error(psycopg.errors.DeadlockDetected("x")).transient
    assert translate_error(psycopg.errors.SerializationFailure("x")).transient
    assert not translate_error(psycopg.errors.UndefinedTable("x")).transient
    assert not _errors.DatabaseError("x").transient
