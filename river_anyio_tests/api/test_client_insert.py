"""Inserting through the client, on PostgreSQL and SQLite, under asyncio and trio."""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import ClassVar

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio.drivers import TOPIC_INSERT, open_driver

pytestmark = pytest.mark.anyio

UTC = dt.UTC


@attrs.frozen
class Email:
    kind: ClassVar[str] = "email"
    to: str
    subject: str = "hi"


@attrs.frozen
class Report:
    kind: ClassVar[str] = "report"
    insert_opts: ClassVar[river.InsertOpts] = river.InsertOpts(queue="reports", priority=2)
    report_id: int


async def test_insert_returns_the_row(database_url: str) -> None:
    async with river.open_client(database_url, id="client-a") as run:
        res = await run.client.insert(
            Email(to="a@example.com"),
            river.InsertOpts(tags=["welcome"], metadata={"source": "test"}, max_attempts=3),
        )
    job = res.job
    assert not res.unique_skipped_as_duplicate
    assert job.id > 0
    assert job.kind == "email"
    assert job.args == {"to": "a@example.com", "subject": "hi"}
    assert json.loads(job.encoded_args) == {"to": "a@example.com", "subject": "hi"}
    assert job.state is river.JobState.AVAILABLE
    assert (job.queue, job.priority, job.max_attempts, job.attempt) == ("default", 1, 3, 0)
    assert job.tags == ("welcome",)
    # SQLite inserts carry River's duplicate-detection nonce, as River Go's do
    assert {k: v for k, v in job.metadata.items() if k != "river:unique_nonce"} == {
        "source": "test"
    }
    assert job.errors == () and job.attempted_by == () and job.attempted_at is None
    assert job.finalized_at is None
    assert job.created_at.tzinfo is not None
    assert abs((job.created_at - dt.datetime.now(UTC)).total_seconds()) < 60
    assert job.scheduled_at <= dt.datetime.now(UTC) + dt.timedelta(seconds=1)
    assert job.unique_key is None and job.unique_states is None


async def test_max_attempts_beyond_smallint_are_clamped_on_postgres(database_url: str) -> None:
    """As River: PostgreSQL's smallint column gets 32,767 for a wider max_attempts (insert,
    batch and COPY alike); SQLite stores it as given."""
    wide = river.InsertOpts(max_attempts=40_000)
    expected = 40_000 if database_url.startswith("sqlite") else 32_767
    async with river.open_client(database_url, max_attempts=50_000) as run:
        client = run.client
        one = (await client.insert(Email(to="one"), wide)).job
        many = await client.insert_many(
            [river.InsertManyParams(Email(to="many"), wide), Email(to="default")]
        )
        assert await client.insert_many_fast([river.InsertManyParams(Email(to="fast"), wide)]) == 1
        rows = {r.args["to"]: r for r in await client.driver.executor().job_list(limit=10)}
    assert one.max_attempts == many[0].job.max_attempts == expected
    assert many[1].job.max_attempts == (50_000 if expected == 40_000 else 32_767)
    assert {to: r.max_attempts for to, r in rows.items()} == {
        "one": expected,
        "many": expected,
        "default": many[1].job.max_attempts,
        "fast": expected,
    }


async def test_insert_scheduled_pending_and_kind_defaults(database_url: str) -> None:
    at = dt.datetime(2031, 2, 3, 4, 5, 6, 789000, tzinfo=UTC)
    async with river.open_client(database_url) as run:
        scheduled = (await run.client.insert(Email(to="x"), river.InsertOpts(scheduled_at=at))).job
        pending = (await run.client.insert(Email(to="y"), river.InsertOpts(pending=True))).job
        report = (await run.client.insert(Report(report_id=1))).job
    assert scheduled.state is river.JobState.SCHEDULED
    assert scheduled.scheduled_at == at
    assert pending.state is river.JobState.PENDING
    assert (report.queue, report.priority) == ("reports", 2)


async def test_unique_insert_skips_duplicates(database_url: str) -> None:
    opts = river.InsertOpts(unique=river.UniqueOpts(by_args=True))
    async with river.open_client(database_url) as run:
        first = await run.client.insert(Email(to="u@example.com"), opts)
        second = await run.client.insert(Email(to="u@example.com"), opts)
        other = await run.client.insert(Email(to="v@example.com"), opts)
    assert not first.unique_skipped_as_duplicate
    assert second.unique_skipped_as_duplicate
    assert second.job.id == first.job.id
    assert not other.unique_skipped_as_duplicate and other.job.id != first.job.id
    assert first.job.unique_key is not None and len(first.job.unique_key) == 32
    assert first.job.unique_states == frozenset(
        {
            river.JobState.AVAILABLE,
            river.JobState.COMPLETED,
            river.JobState.PENDING,
            river.JobState.RETRYABLE,
            river.JobState.RUNNING,
            river.JobState.SCHEDULED,
        }
    )


async def test_insert_many_in_order_with_duplicates(database_url: str) -> None:
    unique = river.InsertOpts(unique=river.UniqueOpts(by_args=True))
    async with river.open_client(database_url) as run:
        existing = await run.client.insert(Email(to="dup"), unique)
        results = await run.client.insert_many(
            [
                Email(to="one"),
                river.InsertManyParams(Email(to="dup"), unique),
                river.InsertManyParams(Report(report_id=2), river.InsertOpts(priority=4)),
                Email(to="two"),
            ]
        )
    assert [r.job.args.get("to", r.job.args.get("report_id")) for r in results] == [
        "one",
        "dup",
        2,
        "two",
    ]
    assert [r.unique_skipped_as_duplicate for r in results] == [False, True, False, False]
    assert results[1].job.id == existing.job.id
    assert results[2].job.priority == 4 and results[2].job.queue == "reports"


async def test_a_batch_repeating_a_unique_key_is_refused(database_url: str) -> None:
    """As River: ``insert_many`` refuses a batch holding one unique key twice (River's SQLite
    driver checks first, PostgreSQL's ON CONFLICT cannot change a row twice), writing nothing.
    ``insert_many_fast`` is River's COPY on PostgreSQL (the repeat violates the index) and an
    insert skipping conflicts on SQLite."""
    unique = river.InsertOpts(unique=river.UniqueOpts(by_args=True))
    repeating = [
        river.InsertManyParams(Email(to="a"), unique),
        Email(to="plain"),
        river.InsertManyParams(Email(to="a"), unique),
    ]
    async with river.open_client(database_url) as run:
        client = run.client
        with pytest.raises(river.ValidationError, match="more than once in batch"):
            await client.insert_many(repeating)
        async with client.transaction() as tx:
            with pytest.raises(river.ValidationError, match="more than once in batch"):
                await client.insert_many_tx(tx, repeating)
        ex = client.driver.executor()
        assert await ex.job_list(kinds=["email"], limit=100) == []
        fast = [river.InsertManyParams(Email(to="d"), unique)] * 2 + [Email(to="plain")]
        if database_url.startswith("sqlite"):
            assert await client.insert_many_fast(fast) == 2
            expected = ["d", "plain"]
        else:
            with pytest.raises(river.UniqueViolationError):
                await client.insert_many_fast(fast)
            expected = []
        rows = await ex.job_list(kinds=["email"], limit=100)
    assert sorted(r.args["to"] for r in rows) == expected


async def test_insert_many_fast_counts(database_url: str) -> None:
    async with river.open_client(database_url) as run:
        n = await run.client.insert_many_fast([Email(to=f"{i}") for i in range(250)])
        rows = await run.client.driver.executor().job_list(kinds=["email"], limit=1000)
    assert n == 250
    assert sorted(r.args["to"] for r in rows) == sorted(str(i) for i in range(250))


async def test_insert_tx_commits_and_rolls_back(database_url: str) -> None:
    async with river.open_client(database_url) as run:
        client = run.client
        async with client.transaction() as tx:
            kept = await client.insert_tx(tx, Email(to="kept"))
            many = await client.insert_many_tx(tx, [Email(to="kept2")])
            fast = await client.insert_many_fast_tx(tx, [Email(to="kept3")])

        class Boom(Exception):
            pass

        with pytest.raises(Boom):
            async with client.transaction() as tx:
                lost = await client.insert_tx(tx, Email(to="lost"))
                raise Boom
        ex = client.driver.executor()
        assert await ex.job_get_by_id(kept.job.id) is not None
        assert await ex.job_get_by_id(many[0].job.id) is not None
        assert fast == 1
        assert await ex.job_get_by_id(lost.job.id) is None


async def test_insert_tx_rejects_foreign_objects(database_url: str) -> None:
    async with river.open_client(database_url) as run:
        with pytest.raises(TypeError):
            await run.client.insert_tx(object(), Email(to="x"))


async def test_validation_happens_before_any_write(database_url: str) -> None:
    async with river.open_client(database_url) as run:
        with pytest.raises(river.ValidationError, match="no jobs to insert"):
            await run.client.insert_many([])
        with pytest.raises(river.ValidationError) as info:
            await run.client.insert_many([Email(to="fine"), {"not": "args"}])
        assert info.value.field == "params[1]"
        rows = await run.client.driver.executor().job_list()
    assert rows == []


async def test_insert_notifies_listeners_after_commit(database_url: str) -> None:
    async with (
        river.open_client(database_url) as run,
        open_driver(database_url) as other,
        other.listener() as listener,
    ):
        await listener.listen(TOPIC_INSERT)
        async with run.client.transaction() as tx:
            await run.client.insert_tx(tx, Email(to="n"), river.InsertOpts(queue="notified"))
        # scheduled jobs are not announced; the scheduler does that when they come due
        await run.client.insert(
            Email(to="s"),
            river.InsertOpts(queue="later", scheduled_at=dt.datetime(2040, 1, 1, tzinfo=UTC)),
        )
        await run.client.insert(Email(to="m"), river.InsertOpts(queue="marker"))
        seen = []
        with anyio.fail_after(10):
            async for note in listener:
                seen.append(json.loads(note.payload)["queue"])
                if seen[-1] == "marker":
                    break
    assert seen == ["notified", "marker"]


async def test_open_client_borrows_a_driver(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        async with river.open_client(driver) as run:
            await run.client.insert(Email(to="borrowed"))
        # still open after the client is gone
        rows = await driver.executor().job_list()
        assert [r.args["to"] for r in rows] == ["borrowed"]


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"database": "mysql://x"}, "database_url", "libpq key/value string"),
        ({"database": 42}, "database", "must be a database URL or a driver"),
        ({"database": "sqlite://x.db", "schema": "1bad"}, "schema", "must match"),
        ({"database": "sqlite://x.db", "schema": "a" * 47}, "schema", "at most 46"),
        ({"database": "sqlite://x.db", "id": ""}, "id", "non-empty"),
        ({"database": "sqlite://x.db", "id": "x" * 101}, "id", "longer than 100"),
        ({"database": "sqlite://x.db", "max_attempts": 0}, "max_attempts", "between 1"),
        ({"database": "sqlite://x.db", "driver_options": [1]}, "driver_options", "dict"),
    ],
)
async def test_open_client_validates_arguments(kwargs: dict, field: str, message: str) -> None:
    with pytest.raises(river.ConfigError, match=message) as info:
        async with river.open_client(**kwargs):
            pass
    assert info.value.field == field


async def test_insert_middleware_and_hooks(database_url: str) -> None:
    import attrs as _attrs

    calls: list[str] = []

    class Tagging:
        async def insert(self, params, next):
            calls.append(f"mw:{len(params)}")
            tagged = [_attrs.evolve(p, tags=(*p.tags, "via-mw")) for p in params]
            return await next(tagged)

    class Observer:
        def insert_begin(self, params) -> None:
            calls.append(f"hook:{params.kind}")

    class Broken:
        def insert_begin(self, params) -> None:
            raise RuntimeError("observer bug")

    async with river.open_client(
        database_url, middleware=[Tagging()], hooks=[Broken(), Observer()]
    ) as run:
        one = await run.client.insert(Email(to="m"))
        many = await run.client.insert_many([Email(to="a"), Report(report_id=3)])
        n = await run.client.insert_many_fast([Email(to="f")])
        rows = await run.client.driver.executor().job_list()
    assert one.job.tags == ("via-mw",)
    assert [r.job.tags for r in many] == [("via-mw",), ("via-mw",)]
    assert n == 1
    assert all(r.tags == ("via-mw",) for r in rows)
    assert calls == [
        "hook:email",
        "mw:1",
        "hook:email",
        "hook:report",
        "mw:2",
        "hook:email",
        "mw:1",
    ]


async def test_a_notification_the_limiter_held_back_follows_once_it_allows(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last jobs of a fast stream have no later neighbour whose notification would get
    them claimed: the client sends the notification its limiter refused once the limiter
    lets it through, instead of leaving those jobs to the workers' poll."""
    import river_anyio._client
    from river_anyio._limiter import KeyedBurstLimiter

    from ..runtime.lifecycle_support import wait_until

    # one notification per queue per 0.4 s, none at once beyond the first
    monkeypatch.setattr(
        river_anyio._client, "KeyedBurstLimiter", lambda window: KeyedBurstLimiter(0.4, 1)
    )
    async with (
        river.open_client(database_url) as run,
        open_driver(database_url) as other,
        other.listener() as listener,
    ):
        await listener.listen(TOPIC_INSERT)
        before = time.monotonic()  # the limiter's clock; its one token is taken after this
        await run.client.insert(Email(to="first"), river.InsertOpts(queue="stream"))
        await run.client.insert(Email(to="held"), river.InsertOpts(queue="stream"))
        await run.client.insert(Email(to="held too"), river.InsertOpts(queue="stream"))
        arrivals = []
        with anyio.fail_after(10):
            async for note in listener:
                assert json.loads(note.payload)["queue"] == "stream"
                arrivals.append(time.monotonic() - before)
                if len(arrivals) == 2:
                    break
        # the second waited for the limiter's next token; one for both held-back inserts
        assert arrivals[1] >= 0.4
        trailing = run._trailing
        assert trailing is not None
        await wait_until(lambda: trailing.sent > 0, within=5)  # counted once the send returned
        assert trailing.sent == 1


async def test_a_held_back_notification_is_dropped_once_a_later_insert_notifies(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a steady flow the next insert's own notification (sent after the held-back
    insert committed, so its fetch sees that job too) covers the one owed: nothing extra."""
    import river_anyio._client
    from river_anyio._limiter import KeyedBurstLimiter
    from river_anyio._runtime import _trailing

    from ..runtime.lifecycle_support import wait_until

    monkeypatch.setattr(
        river_anyio._client, "KeyedBurstLimiter", lambda window: KeyedBurstLimiter(0.1, 1)
    )
    monkeypatch.setattr(_trailing, "GRACE", 1.0)  # the owed one waits past the next token
    async with river.open_client(database_url) as run:
        trailing = run._trailing
        assert trailing is not None
        limiter = run.client._limiter
        await run.client.insert(Email(to="first"), river.InsertOpts(queue="flow"))
        await run.client.insert(Email(to="held"), river.InsertOpts(queue="flow"))
        assert "flow" in trailing._owed
        # the next token: the flow's next insert takes it and notifies
        await anyio.sleep(limiter.delay("flow") + 0.01)
        await run.client.insert(Email(to="next"), river.InsertOpts(queue="flow"))
        await wait_until(lambda: not trailing._owed, within=5)
        assert trailing.sent == 0


async def test_a_stopping_client_sends_what_it_owes(database_url: str) -> None:
    """An inserting process that stops right after its last inserts (a script, a batch
    job) still announces them: the owed notifications go out as the client stops."""
    import river_anyio._client
    from river_anyio._limiter import KeyedBurstLimiter

    async with open_driver(database_url) as other, other.listener() as listener:
        await listener.listen(TOPIC_INSERT)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(
                river_anyio._client, "KeyedBurstLimiter", lambda window: KeyedBurstLimiter(60, 1)
            )
            async with river.open_client(database_url) as run:
                await run.client.insert(Email(to="first"), river.InsertOpts(queue="last"))
                await run.client.insert(Email(to="held"), river.InsertOpts(queue="last"))
                assert run._trailing is not None
                assert "last" in run._trailing._owed
            # stopped: the owed notification went out at once, not a minute later
            assert run._trailing._owed == {}
            assert run._trailing.sent == 1
        queues = []
        with anyio.fail_after(10):
            async for note in listener:
                queues.append(json.loads(note.payload)["queue"])
                if len(queues) == 2:
                    break
        assert queues == ["last", "last"]
