"""River UI (River's web dashboard, the Go binary pinned in ``_build.py``) on a database that
river_anyio migrated and worked: it counts our jobs' states, lists and shows our jobs with the
errors river_anyio recorded, shows a queue we paused as paused, and its actions
(resume a queue, cancel a running job) reach a running river_anyio client.

PostgreSQL only: River UI's command opens PostgreSQL (pgx) and nothing else.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

import river_anyio as river
from river_anyio._timeutil import parse_rfc3339

from ._build import VERSION
from ._scenario import PAUSED_QUEUE, Export, Workers, open_mix_client, work_the_mix
from ._server import RiverUI, serve

pytestmark = pytest.mark.anyio

E = river.EventKind
STATES = ("available", "cancelled", "completed", "discarded", "pending", "retryable",
          "running", "scheduled")  # fmt: skip


async def our_counts(client: river.Client) -> dict[str, int]:
    return {
        state: len((await client.jobs.list(states=[state], limit=10_000)).jobs) for state in STATES
    }


def listed_ids(answer: dict[str, Any]) -> list[int]:
    return [job["id"] for job in answer["data"]]


async def test_river_ui_shows_our_jobs_states_and_errors(riverui_binary: Path, pg_url: str) -> None:
    workers = Workers()
    async with open_mix_client(pg_url, workers) as run, serve(riverui_binary, pg_url) as ui:
        mix = await work_the_mix(run, workers)
        assert (await ui.get("/api/version"))["version"] == VERSION

        states = await ui.get("/api/states")
        assert (
            {s: states[s]["count"] for s in STATES} == mix.counts() == await our_counts(run.client)
        )
        assert {states[s]["accuracy"] for s in STATES} == {"exact"}

        # Each state's list holds exactly our jobs in that state.
        completed = await ui.get("/api/jobs?state=completed&limit=100")
        assert sorted(listed_ids(completed)) == sorted(mix.completed)
        assert all(j["kind"] == "send_email" and j["queue"] == "default" for j in completed["data"])
        assert listed_ids(await ui.get("/api/jobs")) == [mix.running]  # the default: running
        assert listed_ids(await ui.get("/api/jobs?state=available")) == mix.available
        for state, job_id in [("retryable", mix.retryable), ("discarded", mix.discarded),
                              ("cancelled", mix.cancelled), ("pending", mix.pending)]:  # fmt: skip
            assert listed_ids(await ui.get(f"/api/jobs?state={state}")) == [job_id], state
        assert sorted(listed_ids(await ui.get("/api/jobs?state=scheduled"))) == sorted(
            [mix.snoozed, mix.scheduled]
        )

        # A job's detail: every field as river_anyio recorded it, errors included.
        for job_id in (mix.retryable, mix.discarded, mix.cancelled, mix.completed[0]):
            await assert_detail_matches(ui, await run.client.jobs.get(job_id))

        discarded = await ui.get(f"/api/jobs/{mix.discarded}")
        [err] = discarded["errors"]
        assert err["attempt"] == 1
        # the exception's message as River records an error's, and no trace (River records
        # one only for a Go panic)
        assert err["error"] == "card declined for globex: insufficient funds (999 cents)"
        assert err["trace"] == ""
        [cancel_err] = (await ui.get(f"/api/jobs/{mix.cancelled}"))["errors"]
        assert "initech reopened the account" in cancel_err["error"]
        retryable = await ui.get(f"/api/jobs/{mix.retryable}")
        assert parse_rfc3339(retryable["scheduled_at"]) > dt.datetime.now(dt.UTC) + dt.timedelta(
            minutes=50
        )
        assert (await ui.get(f"/api/jobs/{mix.completed[0]}"))["metadata"]["delivered_to"] == (
            "user0@example.com"
        )


async def assert_detail_matches(ui: RiverUI, ours: river.JobRow) -> None:
    theirs = await ui.get(f"/api/jobs/{ours.id}")
    assert theirs["id"] == ours.id
    assert json.loads(theirs["args"]) == dict(ours.args)
    assert theirs["attempt"] == ours.attempt
    assert parse_rfc3339(theirs["attempted_at"]) == ours.attempted_at
    assert theirs["attempted_by"] == list(ours.attempted_by) == [ours.attempted_by[0]]
    assert parse_rfc3339(theirs["created_at"]) == ours.created_at
    finalized = theirs["finalized_at"]
    assert (parse_rfc3339(finalized) if finalized else None) == ours.finalized_at
    assert (theirs["kind"], theirs["queue"], theirs["state"]) == (
        ours.kind,
        ours.queue,
        ours.state.value,
    )
    assert (theirs["max_attempts"], theirs["priority"]) == (ours.max_attempts, ours.priority)
    assert parse_rfc3339(theirs["scheduled_at"]) == ours.scheduled_at
    assert theirs["tags"] == list(ours.tags)
    assert theirs["metadata"] == dict(ours.metadata)
    assert len(theirs["errors"]) == len(ours.errors)
    for shown, recorded in zip(theirs["errors"], ours.errors, strict=True):
        assert parse_rfc3339(shown["at"]) == recorded.at
        assert (shown["attempt"], shown["error"], shown["trace"]) == (
            recorded.attempt,
            recorded.error,
            recorded.trace,
        )


async def test_paused_queue_shows_paused_and_resume_from_river_ui_reaches_our_client(
    riverui_binary: Path, pg_url: str
) -> None:
    workers = Workers()
    async with open_mix_client(pg_url, workers) as run, serve(riverui_binary, pg_url) as ui:
        mix = await work_the_mix(run, workers)
        assert run.diagnostics.queues[PAUSED_QUEUE].paused

        queues = {q["name"]: q for q in (await ui.get("/api/queues"))["data"]}
        assert set(queues) == {"billing", "default", PAUSED_QUEUE}
        paused = queues[PAUSED_QUEUE]
        ours = await run.client.queues.get(PAUSED_QUEUE)
        assert ours.paused_at is not None
        assert parse_rfc3339(paused["paused_at"]) == ours.paused_at
        assert paused["count_available"] == len(mix.available)
        assert paused["count_running"] == 0
        assert queues["default"]["paused_at"] is None
        assert queues["default"]["count_running"] == 1  # the export
        one = await ui.get(f"/api/queues/{PAUSED_QUEUE}")
        assert (one["name"], one["paused_at"]) == (PAUSED_QUEUE, paused["paused_at"])

        with run.subscribe(E.QUEUE_RESUMED, E.JOB_COMPLETED) as sub:
            assert await ui.put(f"/api/queues/{PAUSED_QUEUE}/resume") == {"status": "ok"}
            resumed: list[str | None] = []
            completed: set[int] = set()
            with anyio.fail_after(30):
                async for event in sub:
                    if event.kind is E.QUEUE_RESUMED:
                        resumed.append(event.queue)
                    elif event.job is not None and event.job.queue == PAUSED_QUEUE:
                        completed.add(event.job.id)
                        if completed == set(mix.available):
                            break
        # River UI's resume reached our producer (by river_control) before it worked the jobs.
        assert resumed == [PAUSED_QUEUE]
        assert not run.diagnostics.queues[PAUSED_QUEUE].paused
        assert (await ui.get(f"/api/queues/{PAUSED_QUEUE}"))["paused_at"] is None
        assert (await ui.get("/api/states"))["available"]["count"] == 0


async def test_cancel_from_river_ui_stops_a_job_running_in_our_client(
    riverui_binary: Path, pg_url: str
) -> None:
    workers = Workers()
    async with open_mix_client(pg_url, workers) as run, serve(riverui_binary, pg_url) as ui:
        mix = await work_the_mix(run, workers)
        assert (await ui.get(f"/api/jobs/{mix.running}"))["state"] == "running"
        with run.subscribe(E.JOB_CANCELLED) as sub:
            # River UI sends ids as strings (its int64String); numbers are accepted too.
            assert await ui.post("/api/jobs/cancel", {"ids": [str(mix.running)]}) == {
                "status": "ok"
            }
            with anyio.fail_after(30):
                await workers.cancelled(mix.running).wait()
                async for event in sub:
                    if event.job is not None and event.job.id == mix.running:
                        break
        row = await run.client.jobs.get(mix.running)
        assert row.state is river.JobState.CANCELLED
        assert "cancel_attempted_at" in row.metadata
        assert row.finalized_at is not None
        shown = await ui.get(f"/api/jobs/{mix.running}")
        assert shown["state"] == "cancelled"
        assert parse_rfc3339(shown["finalized_at"]) == row.finalized_at
        assert listed_ids(await ui.get("/api/jobs")) == []  # nothing running any more
        assert listed_ids(await ui.get("/api/jobs?state=cancelled")) == [
            mix.running,
            mix.cancelled,
        ]
        assert Export.kind == shown["kind"]
