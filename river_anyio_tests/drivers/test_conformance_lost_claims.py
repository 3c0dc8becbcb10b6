"""Conformance of ``job_give_back_lost_claims`` (a claim whose reply was lost), run against
every driver on both loops, through the public protocol only."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

import river_anyio as river
from river_anyio.drivers import Executor

from .support import open_driver, ph
from .test_conformance_runtime import CLIENT, S, claim, get, insert, now, params

pytestmark = pytest.mark.anyio


async def give_back(
    ex: Executor,
    *,
    claimed_after: dt.datetime | None = None,
    within: float = 60.0,
    running: tuple[int, ...] = (),
    queue: str = "default",
    client_id: str = CLIENT,
) -> list[river.JobRow]:
    return await ex.job_give_back_lost_claims(
        queue=queue,
        client_id=client_id,
        claimed_after=claimed_after,
        within=within,
        running=running,
    )


async def test_a_lost_claim_is_given_back_unharmed(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        a, b, c = await insert(driver, params(0), params(1), params(2))
        ex = driver.executor()
        lost = await claim(ex, 2)
        assert [j.id for j in lost] == [a.id, b.id]
        given = await give_back(ex)
        assert [j.id for j in given] == [a.id, b.id]
        for before, after in zip((a, b), given, strict=True):
            assert after.state is S.AVAILABLE
            assert after.attempt == 0
            assert after.errors == ()
            assert after.finalized_at is None
            assert after.scheduled_at == before.scheduled_at  # its place in the queue is kept
            assert after == await get(ex, before.id)
        assert (await get(ex, c.id)).state is S.AVAILABLE  # never claimed: untouched
        # nothing is left to give back, and the jobs can be claimed again
        assert await give_back(ex) == []
        again = await claim(ex, 10)
        assert [j.id for j in again] == [a.id, b.id, c.id]
        assert [j.attempt for j in again] == [1, 1, 1]


async def test_only_rows_of_the_lost_claim_are_given_back(database_url: str) -> None:
    """Rows of claims the client did see (attempted at or before ``claimed_after``), rows it
    runs, rows of another client or queue and rows some other client claimed last are left
    alone."""
    async with open_driver(database_url) as driver:
        jobs = await insert(driver, *(params(i) for i in range(6)), params(9, queue="other"))
        ex = driver.executor()
        seen = await claim(ex, 2)  # a claim whose rows arrived
        claimed_after = seen[0].attempted_at
        assert claimed_after is not None
        lost = await claim(ex, 3)  # the claim whose reply is lost
        assert all(j.attempted_at is not None and j.attempted_at > claimed_after for j in lost)
        theirs = await claim(ex, 1, client_id="client-b")
        lost_other = await claim(ex, 1, queue="other")
        given = await give_back(ex, claimed_after=claimed_after, running=(lost[1].id,))
        assert [j.id for j in given] == [lost[0].id, lost[2].id]
        for job in (*seen, lost[1], *theirs, *lost_other):
            row = await get(ex, job.id)
            assert (row.state, row.attempt) == (S.RUNNING, 1)
        assert len(jobs) == 7
        # the other queue's lost row is given back by that queue's own call
        assert [j.id for j in await give_back(ex, queue="other")] == [lost_other[0].id]


async def test_a_row_claimed_last_by_another_client_is_not_given_back(database_url: str) -> None:
    p = ph(database_url)
    async with open_driver(database_url) as driver:
        (job,) = await insert(driver, params(0))
        ex = driver.executor()
        await claim(ex, 1, client_id="client-b")
        # our id earlier in attempted_by, another client's last
        value: Any = [CLIENT, "client-b"]
        arg: Any = json.dumps(value) if p == "?" else value
        assert await ex.execute(f"UPDATE river_job SET attempted_by = {p}", (arg,)) == 1
        assert await give_back(ex) == []
        assert [j.id for j in await give_back(ex, client_id="client-b")] == [job.id]


async def test_rows_attempted_before_the_window_are_left_to_the_rescuer(
    database_url: str,
) -> None:
    p = ph(database_url)
    async with open_driver(database_url) as driver:
        (job,) = await insert(driver, params(0))
        ex = driver.executor()
        (got,) = await claim(ex, 1)
        assert got.attempted_at is not None
        old = got.attempted_at - dt.timedelta(minutes=10)
        when: Any = old.astimezone(dt.UTC).replace(tzinfo=None).isoformat(" ") if p == "?" else old
        assert await ex.execute(f"UPDATE river_job SET attempted_at = {p}", (when,)) == 1
        assert await give_back(ex, within=60) == []
        assert (await get(ex, job.id)).state is S.RUNNING
        assert [j.id for j in await give_back(ex, within=3600)] == [job.id]


async def test_a_lost_job_cancelled_meanwhile_becomes_cancelled(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        a, b = await insert(driver, params(0), params(1))
        ex = driver.executor()
        await claim(ex, 2)
        flagged = await ex.job_cancel(job_id=a.id, cancel_attempted_at=now(), notify=False)
        assert flagged is not None and flagged.state is S.RUNNING
        before = now()
        given = {j.id: j for j in await give_back(ex)}
        assert sorted(given) == [a.id, b.id]
        cancelled = given[a.id]
        assert cancelled.state is S.CANCELLED
        assert cancelled.attempt == 1 and cancelled.errors == ()
        assert cancelled.finalized_at is not None
        assert cancelled.finalized_at >= before - dt.timedelta(seconds=5)
        assert (given[b.id].state, given[b.id].attempt) == (S.AVAILABLE, 0)


async def test_giving_back_inside_a_transaction_rolls_back(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        (job,) = await insert(driver, params(0))
        await claim(driver.executor(), 1)
        with pytest.raises(RuntimeError):
            async with driver.transaction() as tx:
                assert [j.id for j in await give_back(tx)] == [job.id]
                raise RuntimeError
        assert (await get(driver.executor(), job.id)).state is S.RUNNING


@pytest.mark.parametrize("within", [0.0, -1.0])
async def test_the_window_must_be_positive(database_url: str, within: float) -> None:
    async with open_driver(database_url) as driver:
        with pytest.raises(river.ValidationError, match="within"):
            await give_back(driver.executor(), within=within)


async def test_claimed_after_must_be_aware(database_url: str) -> None:
    async with open_driver(database_url) as driver:
        with pytest.raises(river.ValidationError):
            await give_back(driver.executor(), claimed_after=dt.datetime(2025, 1, 1))
