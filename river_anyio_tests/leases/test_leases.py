"""Leases in one process, on both loops and both databases: ``with_lease`` runs once per term,
the ``lease`` block is renewed, released, or cancelled when the lease is lost; a database
without line ``river_anyio`` is one clear error; unused leases cost no statement."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio._timeutil import parse_sqlite_timestamp
from river_anyio.drivers import open_driver
from river_anyio.migrate import LINE_RIVER_ANYIO, Migrator, all_migrations
from river_anyio.testing import sqlite_test_database

from ..faulty import FaultyDriver

pytestmark = pytest.mark.anyio

WITHIN = 10.0


async def install_leases(url: str) -> None:
    async with open_driver(url) as driver:
        await Migrator(driver, line=LINE_RIVER_ANYIO).up()


@pytest.fixture
async def lease_url(database_url: str) -> str:
    """A fresh database with lines main and river_anyio."""
    await install_leases(database_url)
    return database_url


async def wait_for(predicate: Callable[[], Awaitable[bool]], within: float = WITHIN) -> None:
    """Poll a database condition (a lease's term has no event to wait on)."""
    with anyio.fail_after(within):
        while not await predicate():  # noqa: ASYNC110 - a database condition, no event
            await anyio.sleep(0.02)


def counter() -> tuple[list[int], Callable[[], Awaitable[None]]]:
    runs: list[int] = []

    async def fn() -> None:
        runs.append(1)

    return runs, fn


async def lease_rows(client: river.Client) -> list[tuple[Any, ...]]:
    """(name, holder, taken_at, expires_at) of every lease row, times as aware datetimes."""
    rows = await client.driver.executor().fetch_all(
        "SELECT name, holder, taken_at, expires_at FROM river_anyio_lease ORDER BY name"
    )
    return [
        (
            name,
            holder,
            *(t if isinstance(t, dt.datetime) else parse_sqlite_timestamp(t) for t in ts),
        )
        for name, holder, *ts in rows
    ]


async def test_with_lease_runs_once_per_term(lease_url: str) -> None:
    async with river.open_client(lease_url) as run:
        client = run.client
        runs, fn = counter()
        assert await client.with_lease("nightly", fn, ttl=0.5) is True
        assert await client.with_lease("nightly", fn, ttl=0.5) is False  # held: skipped
        assert await client.with_lease("other", fn, ttl=dt.timedelta(seconds=30)) is True
        assert len(runs) == 2
        probe = await client.driver.executor().lease_take(name="nightly", holder="probe", ttl=1)
        assert probe is None  # still held by the client
        rows = await lease_rows(client)
        assert [(r[0], r[1]) for r in rows] == [("nightly", client.id), ("other", client.id)]

        # once the term passes, the next caller takes it (no release happened in between)
        async def taken_again() -> bool:
            return await client.with_lease("nightly", fn, ttl=0.5)

        await wait_for(taken_again)
        assert len(runs) == 3

        # fn's exception propagates, and the lease stays taken for its term
        async def boom() -> None:
            raise LookupError("boom")

        with pytest.raises(LookupError, match="boom"):
            await client.with_lease("failing", boom, ttl=30)
        assert await client.with_lease("failing", fn, ttl=30) is False
        assert len(runs) == 3


async def test_racing_callers_in_one_process_run_once(lease_url: str) -> None:
    async with river.open_client(lease_url) as run:
        results: list[bool] = []
        runs, fn = counter()

        async def contend() -> None:
            results.append(await run.client.with_lease("race", fn, ttl=30))

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(contend)
    assert sorted(results) == [False] * 7 + [True]
    assert runs == [1]


async def test_an_expired_lease_is_taken_after_its_term(lease_url: str) -> None:
    """The new term starts no earlier than the old one ended, on the database's clock."""
    async with river.open_client(lease_url) as run:
        ex = run.client.driver.executor()
        old = await ex.lease_take(name="x", holder="crashed", ttl=0.3)
        assert old is not None and old.holder == "crashed"
        runs, fn = counter()
        assert not await run.client.with_lease("x", fn, ttl=5)

        async def taken() -> bool:
            return await run.client.with_lease("x", fn, ttl=5)

        await wait_for(taken)
        (row,) = await lease_rows(run.client)
    assert runs == [1]
    assert row[1] == run.client.id
    assert row[2] >= old.expires_at


BAD_ARGUMENTS: list[tuple[Any, Any, str, str]] = [
    ("", 1, "name", "1 to 255 characters"),
    ("x" * 256, 1, "name", "1 to 255 characters"),
    (b"x", 1, "name", "must be a str"),
    ("a\x00b", 1, "name", "NUL"),
    ("ok", 0, "ttl", "between 10 ms and 366 days"),
    ("ok", 0.001, "ttl", "between 10 ms and 366 days"),
    ("ok", -1.0, "ttl", "between 10 ms and 366 days"),
    ("ok", float("nan"), "ttl", "between 10 ms and 366 days"),
    ("ok", float("inf"), "ttl", "between 10 ms and 366 days"),
    ("ok", dt.timedelta(days=400), "ttl", "between 10 ms and 366 days"),
    ("ok", True, "ttl", r"seconds \(a number\) or a timedelta"),
    ("ok", "5", "ttl", r"seconds \(a number\) or a timedelta"),
]


async def test_bad_arguments_are_validation_errors_before_any_sql(sqlite_url: str) -> None:
    async with open_driver(sqlite_url) as inner:
        faulty = FaultyDriver(inner)
        async with river.open_client(faulty) as run:
            runs, fn = counter()
            for name, ttl, field, rule in BAD_ARGUMENTS:
                with pytest.raises(river.ValidationError, match=rule) as info:
                    await run.client.with_lease(name, fn, ttl=ttl)
                assert info.value.field == field
                with pytest.raises(river.ValidationError, match=rule):
                    run.client.lease(name, ttl=ttl)  # checked by the call, not on entry
            assert not [op for op in faulty.calls if op.startswith("lease_")]
            assert runs == []
            with pytest.raises(river.ValidationError, match="async callable") as info:
                await run.client.with_lease("f", "not callable", ttl=1)  # type: ignore[arg-type]
            assert info.value.field == "fn"
            await install_leases(sqlite_url)
            with pytest.raises(river.ValidationError, match="non-awaitable"):
                await run.client.with_lease("f", lambda: None, ttl=1)  # type: ignore[arg-type,return-value]


async def test_a_database_without_the_line_names_the_command(database_url: str) -> None:
    """Line main only: one MigrationError giving the command that installs line river_anyio."""
    async with river.open_client(database_url) as run:
        runs, fn = counter()
        with pytest.raises(river.MigrationError) as info:
            await run.client.with_lease("n", fn, ttl=1)
        with pytest.raises(river.MigrationError):
            async with run.client.lease("n", ttl=1):
                pytest.fail("the block must not run")
    message = str(info.value)
    assert "river-anyio migrate-up --line river_anyio --database-url " in message
    assert "river_anyio_lease" in message and "\n" not in message
    assert runs == []


async def test_the_command_redacts_the_password(pg_url: str) -> None:
    scheme, rest = pg_url.split("://", 1)
    userinfo, host = rest.split("@", 1)
    url = f"{scheme}://{userinfo.split(':')[0]}:s3cret@{host}"
    async with river.open_client(url) as run:
        _runs, fn = counter()
        with pytest.raises(river.MigrationError) as info:
            await run.client.with_lease("n", fn, ttl=1)
    message = str(info.value)
    assert "s3cret" not in message
    assert f"--line river_anyio --database-url '{scheme}://postgres:***@{host}'" in message


async def test_auto_migrate_installs_line_river_anyio(empty_database_url: str) -> None:
    async with river.open_client(empty_database_url, auto_migrate=True) as run:
        runs, fn = counter()
        assert await run.client.with_lease("n", fn, ttl=1)
        assert runs == [1]
        lines = await run.client.driver.executor().fetch_all(
            "SELECT line, max(version) FROM river_migration GROUP BY line ORDER BY line"
        )
    dialect = run.client.driver.dialect
    latest_main = len(all_migrations(dialect))
    latest_line = len(all_migrations(dialect, LINE_RIVER_ANYIO))
    assert [tuple(r) for r in lines] == [("main", latest_main), ("river_anyio", latest_line)]


# --- the lease block --------------------------------------------------------------------------


async def test_a_held_lease_is_renewed_and_released(lease_url: str) -> None:
    async with river.open_client(lease_url) as run:
        client = run.client
        async with client.lease("block", ttl=0.3) as held:
            assert isinstance(held, river.Lease)
            assert held.name == "block" and held.holder == client.id and held.ttl == 0.3
            first_expiry = held.expires_at
            seen = [first_expiry]

            async def renewed_past_first_term() -> bool:
                if held.expires_at != seen[-1]:
                    seen.append(held.expires_at)
                return len(seen) >= 5  # four renewals: 4 × ttl/3 > ttl has passed

            await wait_for(renewed_past_first_term)
            async with client.lease("block", ttl=0.3) as other:
                assert other is None  # still ours, well past the first term
            assert seen == sorted(seen) and seen[-1] > first_expiry
        # released on exit: taken again at once
        async with client.lease("block", ttl=5) as again:
            assert again is not None
        assert await lease_rows(client) == []
        # the block's exception propagates unchanged (not as a group), and the lease is released
        with pytest.raises(KeyError, match="inside"):
            async with client.lease("exc", ttl=5):
                raise KeyError("inside")
        assert await lease_rows(client) == []


async def test_a_lease_held_elsewhere_gives_none_and_starts_nothing(lease_url: str) -> None:
    async with open_driver(lease_url) as inner:
        faulty = FaultyDriver(inner)
        async with river.open_client(faulty) as run:
            assert await faulty.executor().lease_take(name="busy", holder="someone", ttl=30)
            faulty.calls.clear()
            async with run.client.lease("busy", ttl=1) as held:
                assert held is None
            assert dict(faulty.calls) == {"lease_take": 1}  # no renewal, no release


async def test_a_transient_renewal_failure_is_retried(lease_url: str) -> None:
    async with open_driver(lease_url) as inner:
        faulty = FaultyDriver(inner)
        async with river.open_client(faulty) as run:
            fault = faulty.fail("lease_renew", times=1)
            async with run.client.lease("flaky", ttl=0.9) as held:
                assert held is not None
                start = held.expires_at

                async def renewed() -> bool:
                    return held.expires_at > start

                await wait_for(renewed)
            assert fault.hits == 1


async def test_a_lease_that_cannot_be_renewed_cancels_the_block(lease_url: str) -> None:
    async with open_driver(lease_url) as inner:
        faulty = FaultyDriver(inner)
        async with river.open_client(faulty) as run:
            faulty.fail("lease_renew", times=None)
            reached_end = []
            with anyio.fail_after(WITHIN), pytest.raises(river.LeaseLostError) as info:
                async with run.client.lease("doomed", ttl=0.3):
                    await anyio.sleep_forever()
                    reached_end.append(1)
            assert info.value.name == "doomed" and "term ended" in str(info.value)
            assert reached_end == []


async def test_a_lease_whose_row_is_gone_cancels_the_block(lease_url: str) -> None:
    async with river.open_client(lease_url) as run:
        with anyio.fail_after(WITHIN), pytest.raises(river.LeaseLostError, match="row is gone"):
            async with run.client.lease("stolen", ttl=0.3):
                await run.client.driver.executor().execute(
                    "DELETE FROM river_anyio_lease WHERE name = "
                    + ("?" if lease_url.startswith("sqlite:") else "%s"),
                    ("stolen",),
                )
                await anyio.sleep_forever()


@attrs.frozen
class Nop:
    kind: ClassVar[str] = "lease_nop"


async def test_unused_leases_cost_no_statement(lease_url: str) -> None:
    """A working client that never asks for a lease runs no lease statement."""
    workers = river.Workers()
    done = anyio.Event()

    @workers.register(Nop)
    async def nop(ctx: river.WorkContext, job: river.Job[Nop]) -> None:
        done.set()

    async with open_driver(lease_url) as inner:
        faulty = FaultyDriver(inner)
        async with river.open_client(
            faulty, queues={"default": river.QueueConfig(max_workers=1)}, workers=workers
        ) as run:
            await run.client.insert(Nop())
            with anyio.fail_after(WITHIN):
                await done.wait()
    assert faulty.calls  # the client did run statements through the driver
    assert not [op for op in faulty.calls if op.startswith("lease_")]


async def test_test_databases_have_the_lease_table(tmp_path: Path) -> None:
    """river_anyio.testing's databases are migrated as auto_migrate does: leases work there."""
    async with sqlite_test_database(tmp_path / "t.sqlite3") as db, db.open_client() as run:
        runs, fn = counter()
        assert await run.client.with_lease("in-a-test", fn, ttl=1)
    assert runs == [1]
