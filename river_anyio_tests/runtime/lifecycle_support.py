"""Helpers for the lifecycle, fault and config tests (jobs that block on events, row reads,
condition waits, real database faults)."""

from __future__ import annotations

import contextlib
import threading
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, ClassVar

import anyio
import anyio.to_thread
import attrs

import river_anyio as river
from river_anyio.drivers import open_driver

#: Generous bound for anything that should happen "soon" (a condition, an event).
SOON = 15.0


@attrs.frozen
class Blocker:
    """A job whose worker blocks on a per-test gate."""

    kind: ClassVar[str] = "blocker"
    name: str = "job"


@attrs.define(eq=False)
class Gate:
    """A worker that reports each start and then waits to be released (or runs forever).

    ``mode``: "release" waits for ``release``; "forever" sleeps until cancelled.
    """

    mode: str = "release"
    started: dict[int, anyio.Event] = attrs.field(factory=dict)
    any_started: anyio.Event = attrs.field(factory=anyio.Event)
    release: anyio.Event = attrs.field(factory=anyio.Event)
    cancelled: list[int] = attrs.field(factory=list)
    finished: list[int] = attrs.field(factory=list)
    on_start: Callable[[river.WorkContext, river.Job[Any]], None] | None = None

    def started_event(self, job_id: int) -> anyio.Event:
        return self.started.setdefault(job_id, anyio.Event())

    async def work(self, ctx: river.WorkContext, job: river.Job[Blocker]) -> None:
        if self.on_start is not None:
            self.on_start(ctx, job)
        self.started_event(job.id).set()
        self.any_started.set()
        try:
            if self.mode == "forever":
                await anyio.sleep_forever()
            await self.release.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled.append(job.id)
            raise
        self.finished.append(job.id)

    def workers(self) -> river.Workers:
        workers = river.Workers()
        workers.add(Blocker, self.work)
        return workers


def queues(n: int = 5, *names: str) -> dict[str, river.QueueConfig]:
    return {name: river.QueueConfig(max_workers=n) for name in (names or ("default",))}


async def wait_until(predicate: Callable[[], bool], within: float = SOON) -> None:
    """Wait for a condition that has no event of its own (polled every 10 ms)."""
    with anyio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 - diagnostics counters have no event
            await anyio.sleep(0.01)


async def next_event(
    sub: river.Subscription,
    kind: river.EventKind,
    job_id: int | None = None,
    within: float = SOON,
) -> river.Event:
    """The next event of ``kind`` (for ``job_id`` if given), skipping others."""
    with anyio.fail_after(within):
        async for event in sub:
            if event.kind != kind:
                continue
            if (
                job_id is not None
                and (event.job is None or event.job.id != job_id)
                and job_id not in event.details.get("job_ids", ())
            ):
                continue
            return event
    raise AssertionError(f"subscription ended without a {kind} event")


def drain(sub: river.Subscription) -> list[river.Event]:
    """Every event still buffered in a subscription, which is then closed."""
    out = []
    with sub:
        while True:
            try:
                out.append(sub.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return out


@contextlib.asynccontextmanager
async def other_driver(url: str) -> AsyncIterator[Any]:
    """A driver of its own (another process's view of the database)."""
    async with open_driver(url) as driver:
        yield driver


async def read_job(url: str, job_id: int) -> river.JobRow:
    async with other_driver(url) as driver:
        row = await driver.executor().job_get_by_id(job_id)
    assert row is not None, f"job {job_id} is gone"
    return row


def is_postgres(url: str) -> bool:
    return url.startswith(("postgres://", "postgresql://"))


def param(url: str) -> str:
    """The backend's placeholder."""
    return "%s" if is_postgres(url) else "?"


def pg_dbname(url: str) -> str:
    return urllib.parse.urlsplit(url).path.lstrip("/")


async def admin_exec(admin_url: str, *statements: str) -> list[Any]:
    """Run statements on the PostgreSQL server as the admin (off the loop)."""

    def run() -> list[Any]:
        import psycopg

        out: list[Any] = []
        with psycopg.connect(admin_url, autocommit=True) as conn:
            for sql in statements:
                cur = conn.execute(sql)
                out.append(cur.fetchall() if cur.description else None)
        return out

    return await anyio.to_thread.run_sync(run)


# --- real faults ------------------------------------------------------------------------------

#: A trigger that makes every attempt to finish a job fail (not transient).
_FAIL_COMPLETION_PG = """
CREATE FUNCTION river_test_fail_completion() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'river_test: completions are refused';
END $$;
CREATE TRIGGER river_test_fail_completion BEFORE UPDATE ON river_job
    FOR EACH ROW WHEN (OLD.state = 'running' AND NEW.state <> 'running')
    EXECUTE FUNCTION river_test_fail_completion();
"""
_FAIL_COMPLETION_SQLITE = """
CREATE TRIGGER river_test_fail_completion BEFORE UPDATE ON river_job
    FOR EACH ROW WHEN OLD.state = 'running' AND NEW.state <> 'running'
    BEGIN SELECT RAISE(ABORT, 'river_test: completions are refused'); END;
"""
_UNFAIL_COMPLETION_PG = """
DROP TRIGGER river_test_fail_completion ON river_job;
DROP FUNCTION river_test_fail_completion();
"""
_UNFAIL_COMPLETION_SQLITE = "DROP TRIGGER river_test_fail_completion;"

#: A trigger that makes creating a queue row fail.
_FAIL_QUEUE_PG = """
CREATE FUNCTION river_test_fail_queue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'river_test: no new queues';
END $$;
CREATE TRIGGER river_test_fail_queue BEFORE INSERT ON river_queue
    FOR EACH ROW WHEN (NEW.name = 'broken') EXECUTE FUNCTION river_test_fail_queue();
"""
_FAIL_QUEUE_SQLITE = """
CREATE TRIGGER river_test_fail_queue BEFORE INSERT ON river_queue
    FOR EACH ROW WHEN NEW.name = 'broken'
    BEGIN SELECT RAISE(ABORT, 'river_test: no new queues'); END;
"""


async def refuse_completions(url: str, refuse: bool = True) -> None:
    async with other_driver(url) as driver:
        if is_postgres(url):
            await driver.executor().exec_script(
                _FAIL_COMPLETION_PG if refuse else _UNFAIL_COMPLETION_PG
            )
        else:
            await driver.executor().exec_script(
                _FAIL_COMPLETION_SQLITE if refuse else _UNFAIL_COMPLETION_SQLITE
            )


async def refuse_queue_named_broken(url: str) -> None:
    async with other_driver(url) as driver:
        await driver.executor().exec_script(
            _FAIL_QUEUE_PG if is_postgres(url) else _FAIL_QUEUE_SQLITE
        )


#: How long taking SQLite's write lock may wait for the client's own writes to finish.
LOCK_WAIT = 5.0


@contextlib.asynccontextmanager
async def sqlite_write_lock(url: str) -> AsyncIterator[Callable[[], None]]:
    """Hold SQLite's write lock from another connection (BEGIN IMMEDIATE in a thread of its
    own) until the yielded ``release()`` is called or the block ends.

    The client under test may be writing at that moment (a claim, a completion): taking the
    lock waits for it like any other writer, and a failure to take it is raised here rather
    than leaving the caller waiting for a lock that never comes."""
    import apsw

    from river_anyio.drivers.sqlite import path_from_url

    path = path_from_url(url)
    locked = threading.Event()
    release = threading.Event()
    failed: list[BaseException] = []

    def hold() -> None:
        conn = apsw.Connection(path)
        try:
            conn.set_busy_timeout(int(LOCK_WAIT * 1000))
            try:
                conn.execute("BEGIN IMMEDIATE")
            except BaseException as exc:
                failed.append(exc)
                return
            finally:
                locked.set()
            release.wait()
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    # a plain thread, not a task: this block may be left outside the scope it was entered in
    thread = threading.Thread(target=hold, name="river-test-sqlite-lock", daemon=True)
    thread.start()
    await anyio.to_thread.run_sync(locked.wait)
    if failed:
        await anyio.to_thread.run_sync(thread.join)
        raise failed[0]
    try:
        yield release.set
    finally:
        release.set()
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(thread.join)


@contextlib.asynccontextmanager
async def pg_connections_refused(admin_url: str, url: str) -> AsyncIterator[Callable[[], Any]]:
    """Make the test database refuse new connections and end the existing ones (a database
    outage). The yielded coroutine function, or leaving the block, ends the outage."""
    db = pg_dbname(url)
    ended = False

    async def end() -> None:
        nonlocal ended
        if not ended:
            ended = True
            await admin_exec(admin_url, f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')

    await admin_exec(
        admin_url,
        f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false',
        f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}' "
        "AND pid <> pg_backend_pid()",
    )
    try:
        yield end
    finally:
        with anyio.CancelScope(shield=True):
            await end()


def leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for e in exc.exceptions:
            yield from leaves(e)
    else:
        yield exc
