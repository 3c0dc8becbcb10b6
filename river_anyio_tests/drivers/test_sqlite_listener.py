"""The SQLite outbox listener: commit visibility, no replay, topics, other writers."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import apsw
import pytest

from river_anyio.drivers._protocol import TOPIC_CONTROL, TOPIC_INSERT, Notification
from river_anyio.drivers.sqlite import SQLiteDriver, SQLiteListener, open_sqlite
from river_anyio.drivers.sqlite._connection import path_from_url
from river_anyio.drivers.sqlite._listener import IDLE_CHECK

pytestmark = pytest.mark.anyio

# Upper bound for a notification to arrive (a commit is noticed in milliseconds).
ARRIVAL = 5.0


async def _next(listener: SQLiteListener) -> Notification:
    with anyio.fail_after(ARRIVAL):
        return await listener.__anext__()


def _external_notify(path: str, topic: str, payload: str) -> None:
    """Another process's writer (River Go) appending to the outbox."""
    conn = apsw.Connection(path)
    conn.set_busy_timeout(int(ARRIVAL * 1000))
    try:
        conn.execute(
            "INSERT INTO river_notification (topic, payload) VALUES (?, ?)", (topic, payload)
        )
    finally:
        conn.close()


async def _visible_rows(listener: SQLiteListener) -> int:
    rows = await listener._reader.run(
        lambda c: c.execute("SELECT count(*) FROM river_notification").fetchall()
    )
    count = rows[0][0]
    assert isinstance(count, int)
    return count


async def test_delivered_only_after_commit(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver, driver.listener() as listener:
        await listener.listen(TOPIC_INSERT)
        async with driver.transaction() as tx:
            await tx.notify_many(TOPIC_INSERT, ['{"queue": "a"}', '{"queue": "b"}'])
            assert await _visible_rows(listener) == 0  # not committed yet
        first = await _next(listener)
        second = await _next(listener)
        assert first == Notification(topic=TOPIC_INSERT, payload='{"queue": "a"}')
        assert second.payload == '{"queue": "b"}'

        # a rolled-back transaction notifies nobody
        with pytest.raises(KeyError):
            async with driver.transaction() as tx:
                await tx.notify_many(TOPIC_INSERT, ["lost"])
                raise KeyError("x")
        await driver.executor().notify_many(TOPIC_INSERT, ["after"])
        assert (await _next(listener)).payload == "after"


async def test_no_replay_from_before_connect(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver:
        await driver.executor().notify_many(TOPIC_INSERT, ["old1", "old2"])
        async with driver.listener() as listener:
            await listener.listen(TOPIC_INSERT)
            await driver.executor().notify_many(TOPIC_INSERT, ["new"])
            assert (await _next(listener)).payload == "new"


async def test_topics_filtered_and_subscription_start(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver, driver.listener() as listener:
        await listener.listen(TOPIC_CONTROL)
        ex = driver.executor()
        await ex.notify_many(TOPIC_INSERT, ["insert-before-listen"])
        await ex.notify_many(TOPIC_CONTROL, ["control-1"])
        assert (await _next(listener)).payload == "control-1"
        # rows of a topic written before it was subscribed are not delivered
        await listener.listen(TOPIC_INSERT)
        await listener.listen(TOPIC_INSERT)  # idempotent
        assert listener.topics == {TOPIC_INSERT, TOPIC_CONTROL}
        await ex.notify_many(TOPIC_INSERT, ["insert-1"])
        assert (await _next(listener)) == Notification(topic=TOPIC_INSERT, payload="insert-1")
        await listener.unlisten(TOPIC_CONTROL)
        await ex.notify_many(TOPIC_CONTROL, ["control-2"])
        await ex.notify_many(TOPIC_INSERT, ["insert-2"])
        assert (await _next(listener)).payload == "insert-2"


async def test_rows_from_other_writers(sqlite_url: str) -> None:
    path = path_from_url(sqlite_url)
    async with open_sqlite(sqlite_url) as driver, driver.listener() as listener:
        await listener.listen(TOPIC_INSERT)
        await anyio.to_thread.run_sync(_external_notify, path, TOPIC_INSERT, "from-go")
        await anyio.to_thread.run_sync(_external_notify, path, "river_leadership", "skip")
        assert (await _next(listener)).payload == "from-go"
        # many rows (more than one poll batch) arrive in order
        conn = apsw.Connection(path)
        try:
            conn.execute(
                "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 600) "
                "INSERT INTO river_notification (topic, payload) SELECT ?, x FROM r",
                (TOPIC_INSERT,),
            )
        finally:
            conn.close()
        got = [int((await _next(listener)).payload) for _ in range(600)]
        assert got == list(range(1, 601))


async def test_async_for_and_close(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver:
        received: list[str] = []
        async with driver.listener() as listener:
            await listener.listen(TOPIC_INSERT)
            await driver.executor().notify_many(TOPIC_INSERT, ["1", "2", "3"])
            with anyio.fail_after(ARRIVAL):
                async for n in listener:
                    received.append(n.payload)
                    if len(received) == 3:
                        break
            await listener.aclose()
            async for _ in listener:  # a closed listener ends iteration
                raise AssertionError("unexpected notification")
        assert received == ["1", "2", "3"]


async def test_listener_wakes_consumer_waiting_without_topics(sqlite_url: str) -> None:
    async with open_sqlite(sqlite_url) as driver, driver.listener() as listener:
        got: list[Notification] = []
        async with anyio.create_task_group() as tg:

            async def consume() -> None:
                got.append(await _next(listener))

            tg.start_soon(consume)
            await anyio.wait_all_tasks_blocked()
            await listener.listen(TOPIC_INSERT)
            await driver.executor().notify_many(TOPIC_INSERT, ["x"])
        assert got == [Notification(topic=TOPIC_INSERT, payload="x")]


async def test_listener_not_blocked_by_busy_writer(sqlite_url: str) -> None:
    # The poll runs on the listener's own read-only connection: an external writer holding
    # the write lock does not stop it from seeing committed rows.
    path = path_from_url(sqlite_url)
    async with open_sqlite(sqlite_url) as driver, driver.listener() as listener:
        await listener.listen(TOPIC_INSERT)
        await anyio.to_thread.run_sync(_external_notify, path, TOPIC_INSERT, "committed")
        holder = apsw.Connection(path)
        holder.execute("BEGIN IMMEDIATE")
        try:
            assert (await _next(listener)).payload == "committed"
        finally:
            holder.execute("ROLLBACK")
            holder.close()


# ---- noticing other connections' commits without SQL ------------------------------------------


@contextlib.asynccontextmanager
async def _forwarded(
    listener: SQLiteListener,
) -> AsyncIterator[Callable[[], Awaitable[Notification]]]:
    """The listener iterated all along by a task of its own (so it watches between
    notifications rather than reading once per ``__anext__``); yields "the next one"."""
    send, receive = anyio.create_memory_object_stream[Notification](100)

    async def forward() -> None:
        async for note in listener:
            await send.send(note)

    async def next_one() -> Notification:
        with anyio.fail_after(ARRIVAL):
            return await receive.receive()

    async with send, receive, anyio.create_task_group() as tg:
        tg.start_soon(forward)
        yield next_one
        tg.cancel_scope.cancel("the test is done with the listener")


class _OutboxReads:
    """Counts the outbox queries (``SELECT id, topic, payload FROM river_notification``) of
    the apsw connections opened while installed: an exec trace on each."""

    def __init__(self) -> None:
        self.n = 0

    def __enter__(self) -> _OutboxReads:
        apsw.connection_hooks.append(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        apsw.connection_hooks.remove(self._hook)

    def _hook(self, conn: apsw.Connection) -> None:
        conn.exec_trace = self._trace

    def _trace(self, cursor: object, sql: str, bindings: object) -> bool:
        if sql.startswith("SELECT id, topic, payload FROM"):
            self.n += 1
        return True


def _external(path: str, sql: str) -> None:
    """Another connection's statement (as another process's would be), in its own commit."""
    conn = apsw.Connection(path)
    try:
        conn.execute(sql)
    finally:
        conn.close()


async def _until(predicate: Callable[[], bool]) -> None:
    with anyio.fail_after(ARRIVAL):
        while not predicate():  # noqa: ASYNC110 - a counter bumped in the reader thread
            await anyio.sleep(0.01)


async def test_idle_listener_reads_the_outbox_only_after_a_commit(sqlite_url: str) -> None:
    """While nothing commits, the listener runs no outbox query (over a window longer than its
    idle check); another connection's commit is noticed without a poke and delivered."""
    path = path_from_url(sqlite_url)
    with _OutboxReads() as reads:
        async with open_sqlite(sqlite_url) as driver, driver.listener() as listener:
            assert listener.watching
            if sys.platform.startswith("linux"):  # woken by inotify on the -wal file
                assert listener._watch is not None and listener._watch.inotify is not None
            await listener.listen(TOPIC_INSERT)
            base = reads.n
            async with _forwarded(listener) as next_one:
                # listen() poked it: one read for that; then the listener waits (nothing
                # commits here)
                await _until(lambda: reads.n >= base + 1)
                settled = reads.n
                assert settled == base + 1
                await anyio.sleep(IDLE_CHECK * 1.5)  # the idle window under test
                assert reads.n == settled  # the WAL index did not change: no query

                await anyio.to_thread.run_sync(
                    _external, path, "INSERT INTO river_notification (topic, payload) "
                    "VALUES ('river_insert', 'theirs')",
                )  # fmt: skip
                assert (await next_one()).payload == "theirs"
                assert reads.n > settled


@pytest.mark.parametrize("mode", ["TRUNCATE", "RESTART", "PASSIVE"])
async def test_notifications_after_a_checkpoint_are_not_missed(sqlite_url: str, mode: str) -> None:
    """A checkpoint resets (TRUNCATE: empties) the -wal file; the next commits of another
    connection, which rewrite it from its start, are still noticed."""
    path = path_from_url(sqlite_url)
    async with open_sqlite(sqlite_url) as driver, driver.listener() as listener:
        await listener.listen(TOPIC_INSERT)
        for i in range(3):
            await anyio.to_thread.run_sync(_external, path, f"PRAGMA wal_checkpoint({mode})")
            if mode == "TRUNCATE":
                assert (await anyio.Path(path + "-wal").stat()).st_size == 0
            await anyio.to_thread.run_sync(_external_notify, path, TOPIC_INSERT, f"after-{i}")
            assert (await _next(listener)).payload == f"after-{i}"


async def test_cancelling_an_idle_listener_is_prompt(sqlite_url: str) -> None:
    """The reader thread's wait is woken by the cancellation (not left to its idle check)."""
    async with open_sqlite(sqlite_url) as driver, driver.listener() as listener:
        await listener.listen(TOPIC_INSERT)
        for _ in range(3):
            with anyio.fail_after(IDLE_CHECK * 0.8):
                with anyio.move_on_after(0.05):
                    await listener.__anext__()
        await driver.executor().notify_many(TOPIC_INSERT, ["still-listening"])
        assert (await _next(listener)).payload == "still-listening"


# ---- the driver's own commits ------------------------------------------------------------------


async def _own_write(driver: SQLiteDriver, i: int) -> None:
    """A commit of the driver's writer that writes no notification."""
    await driver.executor().queue_create_or_set_updated_at(name=f"q{i % 7}")


async def test_this_drivers_own_commits_cause_no_outbox_reads(sqlite_url: str) -> None:
    """The writer's own commits change the WAL index but are accounted for without a read
    (what they notify pokes the listener); another connection's commit is still read."""
    path = path_from_url(sqlite_url)
    with _OutboxReads() as reads:
        async with open_sqlite(sqlite_url) as driver, driver.listener() as listener:
            assert listener.watching
            await listener.listen(TOPIC_INSERT)
            base = reads.n
            async with _forwarded(listener) as next_one:
                await _until(lambda: reads.n >= base + 1)  # listen()'s poke, as above
                settled = reads.n
                for i in range(200):
                    await _own_write(driver, i)
                await anyio.to_thread.run_sync(_external_notify, path, TOPIC_INSERT, "theirs")
                assert (await next_one()).payload == "theirs"
                # One read for the other connection's commit, and a few where the listener
                # looked while a unit of the writer was under way and stopped waiting for it
                # (1-4 seen on a loaded machine). Without the accounting: 31-52, a read per own
                # commit, at most one per 2 ms.
                assert reads.n - settled <= 10


async def test_only_the_writers_own_commits_are_taken_for_its_own(sqlite_url: str) -> None:
    """The proof itself: a WAL index change made of the writer's commits is explained; one that
    includes another connection's commit, before or among them, is not."""
    path = path_from_url(sqlite_url)
    async with open_sqlite(sqlite_url) as driver, driver.listener() as listener:
        watch = listener._watch  # not followed by any task here: the test reads it
        assert watch is not None and watch.own is not None
        watch.pending()
        watch.seen()
        for i in range(3):
            await _own_write(driver, i)
        assert watch.pending() and watch.explained() is True
        assert not watch.pending()  # marked seen

        await _own_write(driver, 3)
        await anyio.to_thread.run_sync(_external_notify, path, TOPIC_INSERT, "among")
        await _own_write(driver, 4)
        assert watch.pending() and watch.explained() is False
        watch.seen()

        await anyio.to_thread.run_sync(_external_notify, path, TOPIC_INSERT, "before")
        await _own_write(driver, 5)
        assert watch.pending() and watch.explained() is False
        watch.seen()

        await _own_write(driver, 6)
        await anyio.to_thread.run_sync(_external_notify, path, TOPIC_INSERT, "after")
        assert watch.pending() and watch.explained() is False


async def test_other_connections_commits_between_own_commits_are_all_delivered(
    sqlite_url: str,
) -> None:
    """Commits of another connection landing among the writer's own, in any order, are never
    taken for its own: each notification arrives while the writer keeps committing."""
    path = path_from_url(sqlite_url)
    async with (
        open_sqlite(sqlite_url) as driver,
        driver.listener() as listener,
        _forwarded(listener) as next_one,
    ):
        await listener.listen(TOPIC_INSERT)
        async with anyio.create_task_group() as tg:

            async def write_own() -> None:
                i = 0
                while True:
                    await _own_write(driver, i)
                    i += 1

            tg.start_soon(write_own)
            for n in range(40):
                await anyio.to_thread.run_sync(_external_notify, path, TOPIC_INSERT, f"t{n}")
                assert (await next_one()).payload == f"t{n}"
            tg.cancel_scope.cancel("test done")
        # and once the writer is idle, the last of them is not left behind either
        await anyio.to_thread.run_sync(_external_notify, path, TOPIC_INSERT, "last")
        assert (await next_one()).payload == "last"


async def test_sql_run_through_the_executor_into_the_outbox_is_delivered(sqlite_url: str) -> None:
    """The executor's generic SQL may write notifications itself: they are delivered although
    the commit is the driver's own."""
    async with (
        open_sqlite(sqlite_url) as driver,
        driver.listener() as listener,
        _forwarded(listener) as next_one,
    ):
        await listener.listen(TOPIC_INSERT)
        ex = driver.executor()
        await _own_write(driver, 0)
        await ex.execute(
            "INSERT INTO river_notification (topic, payload) VALUES (?, ?)", (TOPIC_INSERT, "x")
        )
        assert (await next_one()).payload == "x"
        await ex.fetch_all(
            "INSERT INTO river_notification (topic, payload) VALUES (?, ?) RETURNING id",
            (TOPIC_INSERT, "y"),
        )
        assert (await next_one()).payload == "y"
        await ex.exec_script(
            f"INSERT INTO river_notification (topic, payload) VALUES ('{TOPIC_INSERT}', 'z')"
        )
        assert (await next_one()).payload == "z"
