"""river_anyio.testing's require_* assertions, on PostgreSQL and SQLite, under asyncio and trio."""

from __future__ import annotations

import datetime as dt
from typing import ClassVar

import attrs
import pytest

import river_anyio as river
from river_anyio.testing import (
    ExpectedJob,
    RiverAssertionError,
    require_inserted,
    require_inserted_tx,
    require_many_inserted,
    require_many_inserted_tx,
    require_not_inserted,
    require_not_inserted_tx,
)

pytestmark = pytest.mark.anyio

UTC = dt.UTC


@attrs.frozen
class Email:
    kind: ClassVar[str] = "email"
    to: str


@attrs.frozen
class Report:
    kind: ClassVar[str] = "report"
    report_id: int


@attrs.frozen
class Unrelated:
    kind: ClassVar[str] = "unrelated"


def failure(info: pytest.ExceptionInfo[RiverAssertionError]) -> str:
    assert isinstance(info.value, AssertionError)
    assert str(info.value).startswith("River assertion failure:\n    ")
    return info.value.detail


async def test_require_inserted_finds_exactly_one_and_decodes_it(database_url: str) -> None:
    async with river.open_client(database_url) as run:
        with pytest.raises(RiverAssertionError) as info:
            await require_inserted(run, Email)
        assert failure(info) == "No jobs found with kind: email"

        await run.client.insert(Unrelated())
        inserted = (await run.client.insert(Email(to="a@example.com"))).job
        job = await require_inserted(run.client, Email)
        assert job.args == Email(to="a@example.com")
        assert job.row == inserted
        # a driver works as the source too
        assert (await require_inserted(run.client.driver, Email)).id == inserted.id

        await run.client.insert(Email(to="b@example.com"))
        with pytest.raises(RiverAssertionError) as info:
            await require_inserted(run, Email)
        assert failure(info) == (
            "More than one job found with kind: email "
            "(you might want require_many_inserted instead)"
        )


async def test_require_inserted_checks_every_given_property(database_url: str) -> None:
    # whole milliseconds: what SQLite stores as River does (compared to the microsecond)
    at = dt.datetime(2031, 5, 6, 7, 8, 9, 123000, tzinfo=UTC)
    async with river.open_client(database_url) as run:
        await run.client.insert(
            Email(to="x"),
            river.InsertOpts(
                queue="mail", priority=2, max_attempts=7, tags=["a-tag"], scheduled_at=at
            ),
        )
        job = await require_inserted(
            run,
            Email,
            queue="mail",
            priority=2,
            max_attempts=7,
            state=river.JobState.SCHEDULED,
            scheduled_at=at.astimezone(dt.timezone(dt.timedelta(hours=2))),  # same instant
            tags=["a-tag"],
        )
        assert job.args.to == "x"
        with pytest.raises(RiverAssertionError) as info:
            await require_inserted(
                run,
                Email,
                queue="other",
                priority=3,
                max_attempts=1,
                state="available",
                scheduled_at=at + dt.timedelta(microseconds=1),
                tags=(),
            )
        assert failure(info) == (
            "Job with kind 'email' max attempts 7 not equal to expected 1, "
            "priority 2 not equal to expected 3, queue 'mail' not equal to expected 'other', "
            "scheduled at 2031-05-06T07:08:09.123Z not equal to expected "
            "2031-05-06T07:08:09.123001Z, state 'scheduled' not equal to expected 'available', "
            "tags ['a-tag'] not equal to expected []"
        )
        # only the properties given are checked
        with pytest.raises(RiverAssertionError) as info:
            await require_inserted(run, Email, queue="mail", priority=9)
        assert failure(info) == "Job with kind 'email' priority 2 not equal to expected 9"


async def test_require_not_inserted(database_url: str) -> None:
    async with river.open_client(database_url) as run:
        await require_not_inserted(run, Email)
        await run.client.insert(Email(to="x"), river.InsertOpts(queue="mail", priority=2))
        await run.client.insert(Email(to="y"), river.InsertOpts(queue="mail", priority=3))
        with pytest.raises(RiverAssertionError) as info:
            await require_not_inserted(run, Email)
        assert failure(info) == "2 jobs found with kind, but expected to find none: email"
        # a job differing in any one given property is not a match
        await require_not_inserted(run, Email, queue="mail", priority=4)
        await require_not_inserted(run, Email, queue="other")
        await require_not_inserted(run, Report)
        with pytest.raises(RiverAssertionError) as info:
            await require_not_inserted(run, Email, queue="mail", priority=3)
        assert failure(info) == (
            "Job with kind 'email' priority equal to excluded 3, queue equal to excluded 'mail'"
        )


async def test_require_many_inserted(database_url: str) -> None:
    async with river.open_client(database_url) as run:
        rows = [
            (await run.client.insert(Email(to="1"))).job,
            (await run.client.insert(Report(report_id=1), river.InsertOpts(queue="r"))).job,
            (await run.client.insert(Unrelated())).job,
            (await run.client.insert(Email(to="2"), river.InsertOpts(priority=4))).job,
        ]
        got = await require_many_inserted(
            run, [Email, ExpectedJob(args_cls=Report, queue="r"), ExpectedJob(args_cls=Email)]
        )
        assert [r.id for r in got] == [rows[0].id, rows[1].id, rows[3].id]
        # every job of the mentioned kinds, in order: a repeated kind must be listed again
        with pytest.raises(RiverAssertionError) as info:
            await require_many_inserted(run, [Email, Report])
        assert failure(info) == (
            "Inserted jobs didn't match expectation; "
            "expected: ['email', 'report'], actual: ['email', 'report', 'email']"
        )
        with pytest.raises(RiverAssertionError) as info:
            await require_many_inserted(run, [Report, Email, Email])
        assert "expected: ['report', 'email', 'email']" in failure(info)
        with pytest.raises(RiverAssertionError) as info:
            await require_many_inserted(
                run, [Email, Report, ExpectedJob(args_cls=Email, priority=1)]
            )
        assert failure(info) == (
            "Job with kind 'email' (expected job slice index 2) priority 4 not equal to expected 1"
        )


async def test_tx_variants_read_through_an_uncommitted_transaction(database_url: str) -> None:
    class Rollback(Exception):
        pass

    async with river.open_client(database_url) as run:
        with pytest.raises(Rollback):
            async with run.client.transaction() as tx:
                await run.client.insert_tx(tx, Email(to="tx"))
                await run.client.insert_tx(tx, Report(report_id=5))
                job = await require_inserted_tx(run, tx, Email)
                assert job.args == Email(to="tx")
                rows = await require_many_inserted_tx(run, tx, [Email, Report])
                assert [r.kind for r in rows] == ["email", "report"]
                await require_not_inserted_tx(run, tx, Unrelated)
                with pytest.raises(RiverAssertionError):
                    await require_not_inserted_tx(run.client, tx, Report)
                raise Rollback
        # rolled back: nothing was ever committed
        await require_not_inserted(run, Email)
        await require_not_inserted(run, Report)


async def test_bad_arguments_are_rejected_clearly(sqlite_url: str) -> None:
    async with river.open_client(sqlite_url) as run:
        with pytest.raises(TypeError, match="pass the job args class"):
            await require_inserted(run, Email(to="x"))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="timezone-aware"):
            await require_inserted(run, Email, scheduled_at=dt.datetime(2030, 1, 1))
        with pytest.raises(ValueError, match="bogus"):
            await require_inserted(run, Email, state="bogus")
        with pytest.raises(TypeError, match="Client, ClientRun or driver"):
            await require_inserted(object(), Email)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="Client, ClientRun or driver"):
            await require_inserted_tx(object(), object(), Email)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="sequence"):
            await require_many_inserted(run, Email)  # type: ignore[arg-type]
