"""Jobs across languages: River Go inserts and river_anyio works, and the other way round;
errors, snoozes, retries, cancellations and metadata written by one are read right by the
other (both read every row and must agree field by field)."""

from __future__ import annotations

import datetime as dt
from typing import ClassVar

import attrs
import pytest

import river_anyio as river
from river_anyio.drivers import open_driver

from ._river_go import RiverGo
from ._shared import (
    CLIENT_OPTIONS,
    QUEUE,
    Plain,
    ScriptedWorker,
    Task,
    assert_same_row,
    collect,
    task_json,
    workers,
)

pytestmark = pytest.mark.anyio

E = river.EventKind
FAR = 3600.0
PLAIN_ARGS = {
    "name": 'ünïcode <&> \u2028 "quoted"',
    "count": -(2**53) + 1,
    "ratio": 1e21,
    "tags": ["a", "b"],
    "meta": {"z": [1, 2.5, None, True], "a": {"nested": "x"}},
}


async def read_rows(url: str, ids: list[int]) -> dict[int, river.JobRow]:
    async with open_driver(url) as driver:
        rows = {}
        for job_id in ids:
            row = await driver.executor().job_get_by_id(job_id)
            assert row is not None
            rows[job_id] = row
        return rows


async def assert_both_read_the_same(river_go: RiverGo, url: str, ids: list[int]) -> None:
    go_rows = await river_go.call("get", url, "-ids", ",".join(map(str, ids)))
    ours = await read_rows(url, ids)
    for go_row in go_rows:
        assert_same_row(go_row, ours[go_row["id"]])


async def test_jobs_inserted_by_go_are_worked_by_river_anyio(
    river_go: RiverGo, database_url: str
) -> None:
    url = database_url
    worker = ScriptedWorker()
    plain: list[river.Job[Plain]] = []
    async with river.open_client(
        url,
        queues={QUEUE: river.QueueConfig(max_workers=10)},
        workers=workers(worker, plain=plain),
        **CLIENT_OPTIONS,
    ) as run:
        with run.subscribe() as sub:
            specs = [
                {"type": "plain", "kind": Plain.kind, "queue": QUEUE, "args": PLAIN_ARGS},
                task_json(action="complete", label="done"),
                task_json(action="error", message="boom from python", retry_in_seconds=FAR),
                {**task_json(action="error", message="last try"), "max_attempts": 1},
                task_json(action="snooze", snooze_seconds=FAR),
                task_json(action="cancel", message="no thanks"),
                task_json(action="output", output={"answer": 42, "list": ["x"]}),
                {**task_json(label="tagged"), "tags": ["tag1", "tag2"], "priority": 3,
                 "metadata": {"from": "go", "n": 1}},
            ]  # fmt: skip
            inserted = await river_go.call("insert", url, stdin=specs)
            ids = [r["id"] for r in inserted]
            events = await collect(sub, ids)
    _plain_id, done, retry, last, snoozed, cancelled, output, tagged = ids

    assert [events[i].kind for i in ids] == [
        E.JOB_COMPLETED,
        E.JOB_COMPLETED,
        E.JOB_FAILED,
        E.JOB_FAILED,
        E.JOB_SNOOZED,
        E.JOB_CANCELLED,
        E.JOB_COMPLETED,
        E.JOB_COMPLETED,
    ]
    # args decoded from Go's encoding
    (pj,) = plain
    assert pj.args == Plain(**PLAIN_ARGS)  # type: ignore[arg-type]
    assert {j.id: j.args.label for j in worker.jobs}[done] == "done"
    tagged_job = next(j for j in worker.jobs if j.id == tagged)
    assert tagged_job.metadata == {**({"from": "go", "n": 1}), **_nonce(tagged_job.metadata)}
    assert tagged_job.row.tags == ("tag1", "tag2") and tagged_job.row.priority == 3

    rows = await read_rows(url, ids)
    assert rows[retry].state is river.JobState.RETRYABLE
    (err,) = rows[retry].errors
    assert (err.attempt, err.error, err.trace) == (1, "boom from python", "")
    assert rows[retry].scheduled_at > dt.datetime.now(dt.UTC) + dt.timedelta(minutes=50)
    assert rows[last].state is river.JobState.DISCARDED and rows[last].errors[0].error.endswith(
        "last try"
    )
    assert rows[snoozed].state is river.JobState.SCHEDULED
    assert rows[snoozed].attempt == 0 and rows[snoozed].metadata["snoozes"] == 1
    assert rows[cancelled].state is river.JobState.CANCELLED
    assert rows[cancelled].errors[0].error.endswith("no thanks")
    assert rows[output].metadata["output"] == {"answer": 42, "list": ["x"]}
    # and River Go reads every outcome exactly as river_anyio does
    await assert_both_read_the_same(river_go, url, ids)


@attrs.frozen
class RenamedOrder:
    """The Go program's ``OrderArgs`` with Python attribute names of its own: fields are read
    under their JSON names (Go's ``json:"..."`` tags)."""

    kind: ClassVar[str] = "interop_order_renamed"
    customer: str = attrs.field(metadata={"json": "customer_id"})
    trace: str = attrs.field(metadata={"json": "trace_id"})
    amount: float


async def test_go_args_decoded_into_classes_with_json_names(
    river_go: RiverGo, database_url: str
) -> None:
    url = database_url
    seen: list[river.Job[RenamedOrder]] = []

    async def work(ctx: river.WorkContext, job: river.Job[RenamedOrder]) -> None:
        seen.append(job)

    w = river.Workers()
    w.add(RenamedOrder, work)
    args = {"customer_id": "c9", "trace_id": "t9", "amount": 12.5}
    async with river.open_client(
        url, queues={QUEUE: river.QueueConfig(max_workers=2)}, workers=w, **CLIENT_OPTIONS
    ) as run:
        with run.subscribe() as sub:
            spec = {"type": "order", "kind": RenamedOrder.kind, "queue": QUEUE, "args": args}
            (inserted,) = await river_go.call("insert", url, stdin=[spec])
            events = await collect(sub, [inserted["id"]])
    assert events[inserted["id"]].kind is E.JOB_COMPLETED
    assert [j.args for j in seen] == [RenamedOrder(customer="c9", trace="t9", amount=12.5)]


def _nonce(metadata: object) -> dict[str, object]:
    """SQLite inserts (River's and ours) leave a ``river:unique_nonce`` key behind."""
    assert isinstance(metadata, dict) or hasattr(metadata, "items")
    return {k: v for k, v in metadata.items() if k == "river:unique_nonce"}  # type: ignore[attr-defined]


async def test_jobs_inserted_by_river_anyio_are_worked_by_go(
    river_go: RiverGo, database_url: str
) -> None:
    url = database_url
    async with river.open_client(url) as run:
        client = run.client
        q = river.InsertOpts(queue=QUEUE)
        args = [
            Plain(**PLAIN_ARGS),  # type: ignore[arg-type]
            Task(action="complete"),
            Task(action="error", message="boom from go", retry_in_seconds=FAR),
            Task(action="error", message="go's last try"),
            Task(action="snooze", snooze_seconds=FAR),
            Task(action="cancel", message="go says no"),
            Task(action="output", output={"answer": 43}),
        ]
        results = [
            await client.insert(a, q if i != 3 else river.InsertOpts(queue=QUEUE, max_attempts=1))
            for i, a in enumerate(args)
        ]
        tagged = await client.insert(
            Task(label="tagged"),
            river.InsertOpts(queue=QUEUE, tags=["tag"], priority=2, metadata={"from": "python"}),
        )
    ids = [r.job.id for r in results] + [tagged.job.id]
    plain_id, done, retry, last, snoozed, cancelled, output, tagged_id = ids

    async with river_go.run(url, queues={QUEUE: 10}, kinds=[Task.kind, Plain.kind]) as go:
        outcomes = {}
        for job_id in ids:
            line = await go.wait_until(
                lambda job_id=job_id: next(
                    (
                        ln
                        for ln in go.lines
                        if ln.get("id") == job_id and ln["event"].startswith("job_")
                        and ln["event"] != "job_started"
                    ),
                    None,
                ),
                f"an outcome for job {job_id}",
            )  # fmt: skip
            outcomes[job_id] = line["event"]
        started = {ln["id"]: ln for ln in go.find("job_started")}
    assert [outcomes[i] for i in ids] == [
        "job_completed",
        "job_completed",
        "job_failed",
        "job_failed",
        "job_snoozed",
        "job_cancelled",
        "job_completed",
        "job_completed",
    ]
    # Go decoded the args river_anyio encoded, and saw its metadata and tags
    assert started[plain_id]["args"] == PLAIN_ARGS
    assert started[tagged_id]["metadata"]["from"] == "python"

    rows = await read_rows(url, ids)
    assert rows[retry].state is river.JobState.RETRYABLE
    (err,) = rows[retry].errors
    assert (err.attempt, err.error, err.trace) == (1, "boom from go", "")
    assert err.at.utcoffset() == dt.timedelta(hours=5, minutes=30)  # Go's local time (TZ)
    assert rows[retry].attempted_at is not None
    assert abs(err.at - rows[retry].attempted_at) < dt.timedelta(seconds=5)  # Go's clock
    assert rows[last].state is river.JobState.DISCARDED
    assert rows[snoozed].state is river.JobState.SCHEDULED
    assert rows[snoozed].metadata["snoozes"] == 1 and rows[snoozed].attempt == 0
    assert rows[cancelled].state is river.JobState.CANCELLED
    assert "go says no" in rows[cancelled].errors[0].error
    assert rows[output].metadata["output"] == {"answer": 43}
    assert rows[done].attempted_by == (go.client_id,)
    await assert_both_read_the_same(river_go, url, ids)


async def test_retries_and_snoozes_cross_languages(river_go: RiverGo, database_url: str) -> None:
    """A job fails (or snoozes) in one language and is retried in the other, which sees the
    first attempt's error element, attempt count and metadata."""
    url = database_url
    worker = ScriptedWorker()
    opts = {"queues": {QUEUE: river.QueueConfig(max_workers=5)}, "workers": workers(worker)}

    # 1. river_anyio fails attempt 1; River Go works attempt 2.
    async with river.open_client(url, **opts, **CLIENT_OPTIONS) as run:
        with run.subscribe(E.JOB_FAILED, E.JOB_SNOOZED) as sub:
            py_first = await run.client.insert(
                Task(action="error", message="py failed", fail_attempts=1, retry_in_seconds=1.0),
                river.InsertOpts(queue=QUEUE),
            )
            py_snooze = await run.client.insert(
                Task(action="snooze", snooze_seconds=1.0, snooze_times=1),
                river.InsertOpts(queue=QUEUE),
            )
            ids = [py_first.job.id, py_snooze.job.id]
            await collect(sub, ids)
            run.stop()  # before the retry is due
    after_py = await read_rows(url, ids)
    assert after_py[ids[0]].state is river.JobState.AVAILABLE  # River's near-future fast path
    assert after_py[ids[1]].state is river.JobState.AVAILABLE

    async with river_go.run(url, queues={QUEUE: 5}, kinds=[Task.kind]) as go:
        for job_id in ids:
            await go.wait_for("job_completed", id=job_id)
        started = {ln["id"]: ln for ln in go.find("job_started")}
    retry = started[ids[0]]
    assert retry["attempt"] == 2
    (err,) = retry["errors"]
    mine = after_py[ids[0]].errors[0]
    assert (err["attempt"], err["error"], err["trace"]) == (1, mine.error, mine.trace)
    assert (mine.error, mine.trace) == ("py failed", "")
    assert river_parse(err["at"]) == mine.at
    assert started[ids[1]]["attempt"] == 1 and started[ids[1]]["metadata"]["snoozes"] == 1
    await assert_both_read_the_same(river_go, url, ids)

    # 2. River Go fails attempt 1 (and snoozes); river_anyio works the next attempt.
    specs = [
        task_json(action="error", message="go failed", fail_attempts=1, retry_in_seconds=1.0),
        task_json(action="snooze", snooze_seconds=1.0, snooze_times=1),
    ]
    async with river_go.run(url, queues={QUEUE: 5}, kinds=[Task.kind]) as go:
        inserted = await river_go.call("insert", url, stdin=specs)
        go_ids = [r["id"] for r in inserted]
        await go.wait_for("job_failed", id=go_ids[0])
        await go.wait_for("job_snoozed", id=go_ids[1])
    after_go = await read_rows(url, go_ids)
    worker.jobs.clear()
    async with river.open_client(url, **opts, **CLIENT_OPTIONS) as run:
        with run.subscribe(E.JOB_COMPLETED) as sub:
            await collect(sub, go_ids)
    by_id = {j.id: j for j in worker.jobs}
    second = by_id[go_ids[0]]
    assert second.attempt == 2
    assert second.row.errors == after_go[go_ids[0]].errors
    (err_row,) = second.row.errors
    assert (err_row.attempt, err_row.error) == (1, "go failed")
    assert err_row.at.utcoffset() == dt.timedelta(hours=5, minutes=30)
    assert by_id[go_ids[1]].attempt == 1 and by_id[go_ids[1]].metadata["snoozes"] == 1
    await assert_both_read_the_same(river_go, url, go_ids)


def river_parse(text: str) -> dt.datetime:
    from river_anyio._timeutil import parse_rfc3339

    return parse_rfc3339(text)


async def test_go_bench_works_every_job_it_inserts(river_go: RiverGo, pg_url: str) -> None:
    """River Go's side of the side-by-side benchmark (``riverinterop bench``): it inserts its
    no-op jobs, works them all with River's client and reports the drain."""
    result = await river_go.call("bench", pg_url, "-n", "300", "-fetch-cooldown", "2ms")
    assert result["jobs"] == 300
    assert result["seconds"] > 0 and result["jobs_per_second"] > 0
    async with open_driver(pg_url) as driver:
        rows = await driver.executor().fetch_all(
            "SELECT kind, state::text, count(*) FROM river_job GROUP BY 1, 2"
        )
    assert rows == [("river_go_bench", "completed", 300)]
