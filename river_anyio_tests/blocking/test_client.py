"""The blocking client on PostgreSQL and SQLite: every method on its own connections, the
async client's rules (precedence, unique keys, errors, middleware), and threads."""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio import blocking
from river_anyio.drivers.sqlite._connection import MIN_SQLITE_VERSION

from ..api.support import client_on

T = TypeVar("T")
UTC = dt.UTC


@attrs.frozen
class Email:
    kind: ClassVar[str] = "blk_email"
    to: str
    subject: str = "hi"


@attrs.frozen
class Report:
    kind: ClassVar[str] = "blk_report"
    insert_opts: ClassVar[river.InsertOpts] = river.InsertOpts(
        queue="reports", priority=2, tags=["kind-tag"]
    )
    report_id: int


@attrs.frozen
class NotAJob:
    n: int = 0  # no kind


@pytest.fixture
def client(database_url: str) -> Iterator[blocking.Client]:
    with blocking.Client(database_url, id="blocking-test") as c:
        yield c


def on_async(url: str, call: Callable[[river.Client], Awaitable[T]]) -> T:
    """``call`` on an async client of the same database (an event loop of the test's own)."""

    async def main() -> T:
        async with client_on(url) as c:
            return await call(c)

    return anyio.run(main)


# --- inserting ------------------------------------------------------------------------------


def test_insert_returns_the_row(client: blocking.Client) -> None:
    res = client.insert(
        Email(to="a@example.com"),
        river.InsertOpts(tags=["welcome"], metadata={"source": "test"}, max_attempts=3),
    )
    job = res.job
    assert not res.unique_skipped_as_duplicate
    assert job.id > 0 and job.kind == "blk_email"
    assert job.args == {"to": "a@example.com", "subject": "hi"}
    assert job.state is river.JobState.AVAILABLE
    assert (job.queue, job.priority, job.max_attempts, job.tags) == ("default", 1, 3, ("welcome",))
    assert job.metadata["source"] == "test"
    assert client.jobs.get(job.id) == job


def test_option_precedence_is_the_async_clients(database_url: str) -> None:
    """Call site > the args class's insert_opts > client > River's defaults."""
    with blocking.Client(database_url, max_attempts=7) as c:
        from_kind = c.insert(Report(report_id=1)).job
        from_call = c.insert(Report(report_id=2), river.InsertOpts(priority=4, tags=[])).job
        plain = c.insert(Email(to="x")).job
    assert (from_kind.queue, from_kind.priority, from_kind.tags) == ("reports", 2, ("kind-tag",))
    assert from_kind.max_attempts == 7  # the client's, the class sets none
    assert (from_call.queue, from_call.priority, from_call.tags) == ("reports", 4, ())
    assert (plain.queue, plain.priority, plain.max_attempts) == ("default", 1, 7)
    at = dt.datetime(2031, 2, 3, 4, 5, 6, 789000, tzinfo=UTC)
    with blocking.Client(database_url) as c:
        scheduled = c.insert(Email(to="s"), river.InsertOpts(scheduled_at=at)).job
        pending = c.insert(Email(to="p"), river.InsertOpts(pending=True)).job
        assert plain.max_attempts == 7 and c.insert(Email(to="d")).job.max_attempts == 25
    assert (scheduled.state, scheduled.scheduled_at) == (river.JobState.SCHEDULED, at)
    assert pending.state is river.JobState.PENDING


UNIQUE_CASES = [
    river.UniqueOpts(by_args=True),
    river.UniqueOpts(by_args=True, by_queue=True),
    river.UniqueOpts(by_period=dt.timedelta(hours=1)),
    river.UniqueOpts(by_args=True, by_period=dt.timedelta(minutes=15), exclude_kind=True),
]


def test_unique_keys_are_the_async_clients(client: blocking.Client, database_url: str) -> None:
    """The same args and options give byte-identical ``unique_key`` columns, so each async
    insert after a blocking one is the same job, skipped as a duplicate (and vice versa)."""
    at = dt.datetime(2030, 5, 6, 7, 8, 9, tzinfo=UTC)
    for i, unique in enumerate(UNIQUE_CASES):
        opts = river.InsertOpts(unique=unique, scheduled_at=at, queue=f"q{i}")
        args = Email(to=f"u{i}@example.com")
        first = client.insert(args, opts)
        again = on_async(database_url, lambda c, a=args, o=opts: c.insert(a, o))  # type: ignore[misc]
        assert not first.unique_skipped_as_duplicate
        assert again.unique_skipped_as_duplicate and again.job.id == first.job.id
        assert first.job.unique_key is not None
        assert again.job.unique_key == first.job.unique_key
    # and an async insert first, then the blocking one
    opts = river.InsertOpts(unique=river.UniqueOpts(by_args=True), scheduled_at=at)
    made = on_async(database_url, lambda c: c.insert(Email(to="first-async"), opts))
    dup = client.insert(Email(to="first-async"), opts)
    assert dup.unique_skipped_as_duplicate and dup.job.unique_key == made.job.unique_key


def test_insert_many_in_order_with_duplicates(client: blocking.Client) -> None:
    opts = river.InsertOpts(unique=river.UniqueOpts(by_args=True))
    existing = client.insert(Email(to="u"), opts).job
    results = client.insert_many(
        [
            Email(to="a"),
            river.InsertManyParams(Email(to="b"), river.InsertOpts(queue="other")),
            river.InsertManyParams(Email(to="u"), opts),
            river.InsertManyParams(Email(to="v"), opts),
        ]
    )
    assert [r.job.args["to"] for r in results] == ["a", "b", "u", "v"]
    assert results[1].job.queue == "other"
    assert [r.unique_skipped_as_duplicate for r in results] == [False, False, True, False]
    assert results[2].job.id == existing.id


def test_insert_many_fast_counts(client: blocking.Client) -> None:
    assert client.insert_many_fast([Email(to=str(i)) for i in range(30)]) == 30
    listed = client.jobs.list(kinds=["blk_email"], limit=100).jobs
    assert sorted(j.args["to"] for j in listed) == sorted(str(i) for i in range(30))


# --- jobs and queues ------------------------------------------------------------------------


def test_jobs_get_list_cancel_retry_delete(client: blocking.Client) -> None:
    ids = [r.job.id for r in client.insert_many([Email(to=str(i)) for i in range(5)])]
    client.insert(Report(report_id=9))
    assert client.jobs.get(ids[0]).args == {"to": "0", "subject": "hi"}
    page = client.jobs.list(kinds=["blk_email"], limit=3)
    assert [j.id for j in page.jobs] == ids[:3]
    rest = client.jobs.list(kinds=["blk_email"], limit=3, after=page.last_cursor)
    assert [j.id for j in rest.jobs] == ids[3:]
    assert [j.kind for j in client.jobs.list(queues=["reports"]).jobs] == ["blk_report"]

    cancelled = client.jobs.cancel(ids[0])
    assert cancelled.state is river.JobState.CANCELLED and cancelled.finalized_at is not None
    retried = client.jobs.retry(ids[0])
    assert retried.state is river.JobState.AVAILABLE and retried.finalized_at is None
    deleted = client.jobs.delete(ids[1])
    assert deleted.id == ids[1]
    with pytest.raises(river.NotFoundError):
        client.jobs.get(ids[1])
    with pytest.raises(river.NotFoundError):
        client.jobs.cancel(10**9)


def test_queues_get_list_pause_resume(client: blocking.Client, database_url: str) -> None:
    on_async(
        database_url,
        lambda c: c.driver.executor().queue_create_or_set_updated_at(name="mail"),
    )
    assert client.queues.get("mail").paused_at is None
    client.queues.pause("mail")
    assert client.queues.get("mail").paused_at is not None
    assert [q.name for q in client.queues.list()] == ["mail"]
    client.queues.resume("mail")
    assert client.queues.get("mail").paused_at is None
    with pytest.raises(river.NotFoundError):
        client.queues.pause("nope")


# --- the same errors as the async client ------------------------------------------------------


BAD_CALLS: list[tuple[str, Callable[[Any], Any]]] = [
    ("not attrs", lambda c: c.insert({"to": "x"})),
    ("no kind", lambda c: c.insert(NotAJob())),
    ("bad opts", lambda c: c.insert(Email(to="x"), {"queue": "q"})),
    ("bad queue", lambda c: c.insert(Email(to="x"), river.InsertOpts(queue="no spaces"))),
    ("bad tag", lambda c: c.insert(Email(to="x"), river.InsertOpts(tags=["a,b"]))),
    ("empty batch", lambda c: c.insert_many([])),
    ("str batch", lambda c: c.insert_many("abc")),
    ("bad item", lambda c: c.insert_many([Email(to="x"), NotAJob()])),
    ("fast empty", lambda c: c.insert_many_fast([])),
    ("job id", lambda c: c.jobs.get("1")),
    ("list limit", lambda c: c.jobs.list(limit=0)),
    ("list states", lambda c: c.jobs.list(states=["nope"])),
]


def test_bad_input_errors_match_the_async_client(
    client: blocking.Client, database_url: str
) -> None:
    """Each bad call raises the same exception type with the same message on both clients."""
    sync_errors: list[BaseException] = []
    for _, call in BAD_CALLS:
        with pytest.raises((river.ValidationError, river.NotFoundError)) as err:
            call(client)
        sync_errors.append(err.value)

    async def async_errors(c: river.Client) -> list[BaseException]:
        out: list[BaseException] = []
        for name, call in BAD_CALLS:
            try:
                await call(c)
            except Exception as exc:
                out.append(exc)
            else:
                raise AssertionError(f"the async client accepted {name}")
        return out

    for (name, _), mine, theirs in zip(
        BAD_CALLS, sync_errors, on_async(database_url, async_errors), strict=True
    ):
        assert isinstance(theirs, river.ValidationError | river.NotFoundError), name
        assert (type(mine), str(mine)) == (type(theirs), str(theirs)), name


def test_config_errors_are_configs() -> None:
    with pytest.raises(river.ConfigError, match="max_attempts"):
        blocking.Client("sqlite://x.db", max_attempts=0)
    with pytest.raises(river.ConfigError, match="database_url"):
        blocking.Client("mysql://x")
    with pytest.raises(river.ConfigError, match="'pool_size' is not an option"):
        blocking.Client("sqlite://x.db", driver_options={"pool_size": 2})
    with pytest.raises(river.ConfigError, match="schema"):
        blocking.Client("postgresql://localhost/x", schema="no-dashes")
    with pytest.raises(river.ConfigError, match="pool_max_size"):
        blocking.Client("postgresql://localhost/x", driver_options={"pool_max_size": 0})
    with pytest.raises(river.ConfigError, match="sqlite_module: must be a sqlite3-API module"):
        blocking.Client("sqlite://x.db", driver_options={"sqlite_module": object()})
    if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
        with pytest.raises(river.ConfigError, match=r"sqlite_module: .*pysqlite3-binary"):
            blocking.Client("sqlite://x.db", driver_options={"sqlite_module": sqlite3})


def test_wrong_connection_types(client: blocking.Client) -> None:
    with pytest.raises(TypeError, match="insert_tx\\(\\) on"):
        client.insert_tx(object(), Email(to="x"))


# --- middleware and hooks ---------------------------------------------------------------------


@attrs.define
class Tagging:
    """Insert middleware adding a tag and recording what it saw (as the async client runs it)."""

    seen: list[str] = attrs.field(factory=list)

    async def insert(self, params: Sequence[Any], nxt: Any) -> Any:
        self.seen.extend(p.kind for p in params)
        return await nxt([attrs.evolve(p, tags=(*p.tags, "mw")) for p in params])


@attrs.define
class Hook:
    seen: list[str] = attrs.field(factory=list)

    def insert_begin(self, params: Any) -> None:
        self.seen.append(params.queue)


@attrs.define
class Suspends:
    async def insert(self, params: Sequence[Any], nxt: Any) -> Any:
        await asyncio.sleep(0)
        return await nxt(params)


def test_middleware_and_hooks_apply(database_url: str) -> None:
    mw, hook = Tagging(), Hook()
    with blocking.Client(database_url, middleware=[mw], hooks=[hook]) as c:
        job = c.insert(Email(to="m")).job
        many = c.insert_many([Report(report_id=1)])
        fast = c.insert_many_fast([Email(to="f")])
        assert job.tags == ("mw",) and many[0].job.tags == ("kind-tag", "mw") and fast == 1
    assert mw.seen == ["blk_email", "blk_report", "blk_email"]
    assert hook.seen == ["default", "reports", "default"]


def test_middleware_that_awaits_async_io_is_refused(database_url: str) -> None:
    with blocking.Client(database_url, middleware=[Suspends()]) as c:
        with pytest.raises(RuntimeError, match="must not await async I/O"):
            c.insert(Email(to="x"))
        assert c.jobs.list().jobs == []


# --- threads ----------------------------------------------------------------------------------


def test_threads_share_one_client(database_url: str) -> None:
    """Eight threads on a pool of two: every plain insert lands once; one unique job, inserted
    by every thread at once, exists once."""
    threads, each = 8, 15
    start = threading.Barrier(threads)
    unique = river.InsertOpts(unique=river.UniqueOpts(by_args=True))

    def work(t: int) -> tuple[list[int], bool]:
        start.wait()
        ids = [c.insert(Email(to=f"{t}-{i}")).job.id for i in range(each)]
        ids += [r.job.id for r in c.insert_many([Report(report_id=t * 100 + i) for i in range(3)])]
        dup = c.insert(Email(to="shared"), unique).unique_skipped_as_duplicate
        return ids, dup

    with blocking.Client(database_url, driver_options={"pool_max_size": 2}) as c:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(work, range(threads)))
        ids = [i for r, _ in results for i in r]
        assert len(ids) == len(set(ids)) == threads * (each + 3)
        assert [d for _, d in results].count(False) == 1
        listed = c.jobs.list(limit=1000).jobs
        assert len(listed) == threads * (each + 3) + 1


@attrs.define
class Gate:
    """Insert middleware that holds its transaction (and its pooled connection) open until
    released."""

    entered: threading.Event = attrs.field(factory=threading.Event)
    release: threading.Event = attrs.field(factory=threading.Event)

    async def insert(self, params: Sequence[Any], nxt: Any) -> Any:
        if params[0].queue == "held":
            self.entered.set()
            assert self.release.wait(10)
        return await nxt(params)


def test_a_full_pool_times_out_clearly(database_url: str) -> None:
    gate = Gate()
    options = {"pool_max_size": 1, "acquire_timeout": 0.2}
    with (
        blocking.Client(database_url, middleware=[gate], driver_options=options) as c,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        held = pool.submit(c.insert, Email(to="h"), river.InsertOpts(queue="held"))
        assert gate.entered.wait(10)
        with pytest.raises(river.PoolTimeoutError, match=r"within 0\.2s \(pool max size 1\)"):
            c.insert(Email(to="x"))
        gate.release.set()
        assert held.result(10).job.queue == "held"
        assert [j.queue for j in c.jobs.list().jobs] == ["held"]


def test_a_custom_postgres_schema(pg_schema_url: str) -> None:
    """River's tables in schema ``river_custom``: inserts land there, and the notification
    goes to the schema's channel."""
    import psycopg

    listen = psycopg.connect(pg_schema_url, autocommit=True)
    listen.execute('LISTEN "river_custom.river_insert"')
    with blocking.Client(pg_schema_url, schema="river_custom") as c:
        job = c.insert(Email(to="s")).job
        with psycopg.connect(pg_schema_url) as conn:
            tx_job = c.insert_tx(conn, Email(to="t"), river.InsertOpts(queue="tx")).job
        assert {j.id for j in c.jobs.list().jobs} == {job.id, tx_job.id}
        with psycopg.connect(pg_schema_url) as other:
            count = other.execute("SELECT count(*) FROM river_custom.river_job").fetchone()
        assert count == (2,)
    queues = []
    for n in listen.notifies(timeout=10):
        queues.append(n.payload)
        if len(queues) == 2:
            break
    listen.close()
    assert queues == ['{"queue": "default"}', '{"queue": "tx"}']
