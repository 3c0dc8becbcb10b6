"""Kind aliases (River's ``KindAliases``): a worker renamed from an old kind keeps working the
jobs stored under that kind, with or without ``fetch_only_known_kinds``, while inserts use the
new kind; the rescuer finds the renamed worker too; a kind or alias is claimed once.

The runtime tests run on asyncio and trio, on PostgreSQL and SQLite.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

import attrs
import pytest

import river_anyio as river
from river_anyio._runtime._maintenance import RESCUE_ERROR, JobRescuer

from .conftest import FixedClock, get_row, next_event, running
from .test_maintenance import env, get, insert, update

S = river.JobState
K = river.EventKind
H = dt.timedelta(hours=1)


@attrs.frozen
class Before:
    """The args as they were before the rename."""

    kind: ClassVar[str] = "alias_before"
    n: int = 0


@attrs.frozen
class After:
    """The same args renamed, the old kind kept as an alias."""

    kind: ClassVar[str] = "alias_after"
    kind_aliases: ClassVar[tuple[str, ...]] = ("alias_before",)
    n: int = 0


@attrs.frozen
class Stranger:
    kind: ClassVar[str] = "alias_stranger"


@attrs.frozen
class Squatter:
    """Another class claiming the old kind as its own."""

    kind: ClassVar[str] = "alias_before"


@attrs.frozen
class Rival:
    """Another class claiming the old kind as an alias too."""

    kind: ClassVar[str] = "alias_rival"
    kind_aliases: ClassVar[tuple[str, ...]] = ("alias_before",)


async def _noop(ctx: river.WorkContext, job: river.Job[Any]) -> None:
    return None


# --- the registry -----------------------------------------------------------------------------


def test_an_alias_resolves_to_its_registration() -> None:
    workers = river.Workers()
    workers.add(After, _noop)
    reg = workers.get("alias_before")
    assert reg is not None and reg is workers.get("alias_after")
    assert reg.args_cls is After and reg.kind == "alias_after"
    assert reg.kind_aliases == ("alias_before",)
    assert "alias_before" in workers and "alias_after" in workers
    assert workers.kinds() == ["alias_after", "alias_before"]
    assert len(workers) == 1 and list(workers) == [reg]


@pytest.mark.parametrize(
    ("first", "second", "rule"),
    [
        (
            After,
            Squatter,
            "worker for kind 'alias_before' is already registered as an alias of "
            "'alias_after' (After.kind_aliases)",
        ),
        (
            Squatter,
            After,
            "worker for kind 'alias_before' (After.kind_aliases) is already registered as "
            "the kind of Squatter",
        ),
        (
            After,
            Rival,
            "worker for kind 'alias_before' (Rival.kind_aliases) is already registered as an "
            "alias of 'alias_after' (After.kind_aliases)",
        ),
    ],
)
def test_a_kind_or_alias_claimed_twice_is_rejected(first: type, second: type, rule: str) -> None:
    workers = river.Workers()
    workers.add(first, _noop)
    with pytest.raises(river.ConfigError) as info:
        workers.add(second, _noop)
    assert (info.value.field, info.value.rule, info.value.value) == (
        "workers",
        rule,
        "alias_before",
    )
    assert len(workers) == 1  # nothing half-registered
    claimed = {getattr(first, "kind", ""), *getattr(first, "kind_aliases", ())}
    assert workers.kinds() == sorted(claimed)


@pytest.mark.parametrize(
    ("aliases", "rule"),
    [
        ("alias_old", "Bad.kind_aliases must be a tuple of kinds (str), not 'alias_old'"),
        (3, "Bad.kind_aliases must be a tuple of kinds (str), not 3"),
        ((1,), "Bad.kind_aliases must hold non-empty strings, not 1"),
        (("",), "Bad.kind_aliases must hold non-empty strings, not ''"),
        (("alias_bad",), "Bad lists kind 'alias_bad' more than once (kind, kind_aliases)"),
        (("a1", "a1"), "Bad lists kind 'a1' more than once (kind, kind_aliases)"),
    ],
)
def test_malformed_aliases_are_rejected(aliases: object, rule: str) -> None:
    @attrs.frozen
    class Bad:
        kind: ClassVar[str] = "alias_bad"
        kind_aliases: ClassVar[object] = aliases

    workers = river.Workers()
    with pytest.raises(river.ConfigError) as info:
        workers.add(Bad, _noop)
    assert (info.value.field, info.value.rule) == ("workers", rule)
    assert len(workers) == 0 and workers.kinds() == []


# --- working jobs of an alias -----------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("fetch_only_known_kinds", [False, True], ids=["any", "known"])
async def test_a_renamed_worker_works_both_kinds(
    database_url: str, clock: FixedClock, fetch_only_known_kinds: bool
) -> None:
    workers = river.Workers()
    seen: list[tuple[str, Any]] = []

    @workers.register(After)
    async def work(ctx: river.WorkContext, job: river.Job[After]) -> None:
        seen.append((job.kind, job.args))

    async with running(
        database_url, workers, clock=clock, fetch_only_known_kinds=fetch_only_known_kinds
    ) as run:
        with run.subscribe(K.JOB_COMPLETED, K.JOB_FAILED) as events:
            # one claim sees them all: the stranger first in claim order
            stranger, old, new = await run.client.insert_many([Stranger(), Before(1), After(2)])
            expected = {old.job.id, new.job.id}
            if not fetch_only_known_kinds:
                expected.add(stranger.job.id)  # claimed and failed
            done: set[int] = set()
            while done != expected:
                ev = await next_event(events)
                assert ev.job is not None
                done.add(ev.job.id)
            old_row = await get_row(run, old.job.id)
            new_row = await get_row(run, new.job.id)
            stranger_row = await get_row(run, stranger.job.id)

    assert new.job.kind == "alias_after"  # inserts use the new kind
    assert sorted(seen) == [("alias_after", After(2)), ("alias_before", After(1))]
    for row in (old_row, new_row):
        assert row.state is S.COMPLETED and row.attempt == 1
    assert old_row.kind == "alias_before"  # the stored kind is left as it was
    if fetch_only_known_kinds:
        assert stranger_row.state is S.AVAILABLE
        assert (stranger_row.attempt, stranger_row.attempted_by) == (0, ())
    else:
        [error] = stranger_row.errors
        assert error.error.endswith("Workers bundle: alias_stranger")


@pytest.mark.anyio
async def test_the_rescuer_retries_a_stuck_job_of_an_alias(database_url: str) -> None:
    t0 = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(days=3)
    async with env(database_url, FixedClock(t0)) as e:
        jobs = []
        for kind in ("alias_before", "alias_stranger"):
            job = await insert(e.driver, kind=kind)
            await update(e.driver, job.id, state="running", attempt=1, attempted_at=t0 - 2 * H)
            jobs.append(job)
        workers = river.Workers()
        workers.add(After, _noop)
        await e.service(JobRescuer, workers=workers).run_once()
        ex = e.driver.executor()
        renamed, stranger = [await get(ex, job.id) for job in jobs]

    # the alias's worker is known: retried on the retry policy, not discarded
    assert renamed.state is S.RETRYABLE and renamed.finalized_at is None
    assert renamed.scheduled_at > t0
    assert [x.error for x in renamed.errors] == [RESCUE_ERROR]
    assert stranger.state is S.DISCARDED and stranger.finalized_at == t0
