"""Faults: internal crashes, start-up failures, the database failing under the completer,
notifier reconnects, the attempt guard, and poll-only mode.

Faults are real wherever the database is involved (triggers that refuse writes, a second
connection holding SQLite's write lock, PostgreSQL refusing and terminating connections); the
"impossible" internal crashes are injected through the fault-injecting driver
(``river_anyio_tests/faulty.py``), which raises what no driver should.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import anyio
import pytest

import river_anyio as river
from river_anyio._config import ClientConfig
from river_anyio._runtime._completer import river_event_kind

from ..faulty import FaultyDriver, open_faulty
from .lifecycle_support import (
    SOON,
    Blocker,
    Gate,
    admin_exec,
    drain,
    next_event,
    other_driver,
    param,
    pg_connections_refused,
    pg_dbname,
    queues,
    read_job,
    refuse_completions,
    refuse_queue_named_broken,
    sqlite_write_lock,
    wait_until,
)

pytestmark = pytest.mark.anyio

CLIENT = "faults-client"
#: Short completer retry timings (River's are 1 s, 2 s, 4 s pauses and 10 s per try).
#: (the private tuning hook: a ClientConfig as ``config``)
FAST_COMPLETER: dict[str, Any] = {
    "config": ClientConfig(completer_pauses=(0.01,), completer_try_timeout=5.0)
}


class BodyError(Exception):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- internal crashes -------------------------------------------------------------------------


async def test_a_crashing_service_stops_the_run_and_raises_client_crashed(
    database_url: str,
) -> None:
    gate = Gate(mode="forever")
    async with river.open_client(database_url) as inserter:
        job = (await inserter.client.insert(Blocker())).job
    async with open_faulty(database_url) as faulty:
        # the producer's second claim raises what no driver should: a bug
        faulty.fail("job_get_available", lambda: RuntimeError("producer bug"), skip=1)
        with anyio.fail_after(SOON):
            with pytest.raises(river.ClientCrashedError) as info:
                async with river.open_client(
                    faulty,
                    id=CLIENT,
                    queues=queues(),
                    workers=gate.workers(),
                    soft_stop_timeout=60,
                ) as run:
                    sub = run.subscribe()
                    await gate.started_event(job.id).wait()
                    await run.client.insert(Blocker("second"))  # the next fetch crashes
                    await anyio.sleep_forever()  # cancelled by the crash
    assert "RuntimeError: producer bug" in str(info.value)
    group = info.value.__cause__
    assert isinstance(group, BaseExceptionGroup)
    assert pytest.RaisesGroup(
        pytest.RaisesExc(RuntimeError, match="^producer bug$"), flatten_subgroups=True
    ).matches(group)
    # full cleanup: the running job was interrupted and written back
    assert gate.cancelled == [job.id]
    assert [e.job.id for e in drain(sub) if e.kind is river.EventKind.JOB_INTERRUPTED] == [job.id]
    row = await read_job(database_url, job.id)
    assert (row.state, row.attempt, row.errors) == (river.JobState.AVAILABLE, 0, ())
    await run.wait()
    assert run.stopping


def fail_on_cleanup(faulty: FaultyDriver) -> None:
    """The notifier's listener raises once it has closed: a service failing in its cleanup."""
    faulty.fail("listener_close", lambda: RuntimeError("cleanup bug"))


async def test_a_body_exception_wins_over_a_service_failure(database_url: str) -> None:
    gate = Gate(mode="forever")
    err = BodyError("from the body")
    async with open_faulty(database_url) as faulty:
        fail_on_cleanup(faulty)
        with anyio.fail_after(SOON):
            with pytest.raises(BodyError) as info:
                async with river.open_client(
                    faulty, id=CLIENT, queues=queues(), workers=gate.workers()
                ) as run:
                    job = (await run.client.insert(Blocker())).job
                    await gate.started_event(job.id).wait()
                    raise err
    assert info.value is err
    context = info.value.__context__
    assert isinstance(context, BaseExceptionGroup)
    assert pytest.RaisesGroup(
        pytest.RaisesExc(RuntimeError, match="^cleanup bug$"), flatten_subgroups=True
    ).matches(context)
    row = await read_job(database_url, job.id)
    assert (row.state, row.attempt) == (river.JobState.AVAILABLE, 0)


async def work_one_job(faulty: FaultyDriver, worked: list[river.JobRow]) -> None:
    """A client on ``faulty`` works one job (appended to ``worked`` once inserted) to its
    completion, then stops gracefully."""
    gate = Gate()
    gate.release.set()
    async with river.open_client(faulty, id=CLIENT, queues=queues(), workers=gate.workers()) as run:
        with run.subscribe(river.EventKind.JOB_COMPLETED) as sub:
            job = (await run.client.insert(Blocker())).job
            worked.append(job)
            await next_event(sub, river.EventKind.JOB_COMPLETED, job.id)


async def test_a_service_failing_during_a_graceful_stop_is_a_crash(sqlite_url: str) -> None:
    worked: list[river.JobRow] = []
    async with open_faulty(sqlite_url) as faulty:
        fail_on_cleanup(faulty)
        with pytest.raises(river.ClientCrashedError) as info:
            await work_one_job(faulty, worked)
    assert pytest.RaisesGroup(RuntimeError, flatten_subgroups=True).matches(info.value.__cause__)
    assert (await read_job(sqlite_url, worked[0].id)).state is river.JobState.COMPLETED


# --- start-up failures ------------------------------------------------------------------------


async def test_an_unreachable_server_fails_the_start_with_one_plain_exception() -> None:
    url = f"postgresql://postgres@127.0.0.1:{_free_port()}/nothing?connect_timeout=2"
    gate = Gate()
    with anyio.fail_after(SOON):
        with pytest.raises(river.DatabaseError) as info:
            async with river.open_client(url, queues=queues(), workers=gate.workers()):
                pytest.fail("the body must not run")
    assert not isinstance(info.value, BaseExceptionGroup)
    assert isinstance(info.value, river.ConnectionLostError)


async def test_a_missing_sqlite_directory_fails_with_one_plain_exception(tmp_path: Any) -> None:
    gate = Gate()
    with pytest.raises(river.RiverError) as info:
        async with river.open_client(
            f"sqlite://{tmp_path}/missing/river.sqlite3", queues=queues(), workers=gate.workers()
        ):
            pytest.fail("the body must not run")
    assert not isinstance(info.value, BaseExceptionGroup)


async def test_a_notifier_that_cannot_listen_fails_the_start(
    database_url: str, pg_server: str | None
) -> None:
    gate = Gate()
    async with contextlib.AsyncExitStack() as stack:
        if database_url.startswith("sqlite"):
            # the SQLite notifier follows the river_notification outbox: take it away
            async with other_driver(database_url) as driver:
                await driver.executor().exec_script("DROP TABLE river_notification")
        else:
            # the notifier's dedicated connection is the run's first: refuse it
            assert pg_server is not None
            await stack.enter_async_context(pg_connections_refused(pg_server, database_url))
        with anyio.fail_after(SOON):
            with pytest.raises(river.DatabaseError) as info:
                async with river.open_client(database_url, queues=queues(), workers=gate.workers()):
                    pytest.fail("the body must not run")
    assert not isinstance(info.value, BaseExceptionGroup)


@pytest.mark.parametrize("order", [("broken", "default"), ("default", "broken")])
async def test_a_queue_that_cannot_start_fails_the_start(
    database_url: str, order: tuple[str, ...]
) -> None:
    """A producer's start fails (its queue row is refused): one plain exception, and the
    producers that did start, or never started, are all cleaned up (no hang)."""
    await refuse_queue_named_broken(database_url)
    gate = Gate()
    with anyio.fail_after(SOON):
        with pytest.raises(river.DatabaseError, match="no new queues") as info:
            async with river.open_client(
                database_url, queues=queues(5, *order), workers=gate.workers()
            ):
                pytest.fail("the body must not run")
    assert not isinstance(info.value, BaseExceptionGroup)


# --- the database failing under the completer ---------------------------------------------------


async def test_a_refused_completion_is_dropped_and_the_job_left_running(
    database_url: str,
) -> None:
    await refuse_completions(database_url)
    gate = Gate()
    gate.release.set()
    with anyio.fail_after(SOON):
        async with river.open_client(
            database_url, id=CLIENT, queues=queues(), workers=gate.workers(), **FAST_COMPLETER
        ) as run:
            with run.subscribe(river.EventKind.COMPLETION_DROPPED) as sub:
                job = (await run.client.insert(Blocker())).job
                event = await next_event(sub, river.EventKind.COMPLETION_DROPPED, job.id)
            assert event.details["job_ids"] == [job.id]
            stats = run.diagnostics.completer
            assert stats is not None
            assert (stats.dropped, stats.requeued, stats.pending) == (1, 0, 0)
    assert gate.finished == [job.id]
    row = await read_job(database_url, job.id)
    assert (row.state, row.attempt, row.finalized_at) == (river.JobState.RUNNING, 1, None)


async def test_a_locked_sqlite_database_requeues_completions_until_released(
    sqlite_url: str,
) -> None:
    gate = Gate()
    with anyio.fail_after(SOON):
        async with river.open_client(
            sqlite_url,
            id=CLIENT,
            queues=queues(),
            workers=gate.workers(),
            driver_options={"busy_timeout": 0.05},
            **FAST_COMPLETER,
        ) as run:
            with run.subscribe(river.EventKind.JOB_COMPLETED) as sub:
                job = (await run.client.insert(Blocker())).job
                await gate.started_event(job.id).wait()
                async with sqlite_write_lock(sqlite_url):
                    gate.release.set()
                    await wait_until(lambda: _stats(run).requeued >= 1)
                    assert _stats(run).written == 0
                # the lock is gone: the requeued completion is written
                event = await next_event(sub, river.EventKind.JOB_COMPLETED, job.id)
            assert event.job is not None and event.job.state is river.JobState.COMPLETED
            assert _stats(run).dropped == 0
    assert (await read_job(sqlite_url, job.id)).state is river.JobState.COMPLETED


async def test_a_postgres_outage_requeues_completions_until_it_ends(
    pg_url: str, pg_server: str
) -> None:
    gate = Gate()
    with anyio.fail_after(SOON * 2):
        async with river.open_client(
            pg_url, id=CLIENT, queues=queues(), workers=gate.workers(), **FAST_COMPLETER
        ) as run:
            with run.subscribe(river.EventKind.JOB_COMPLETED) as sub:
                job = (await run.client.insert(Blocker())).job
                await gate.started_event(job.id).wait()
                async with pg_connections_refused(pg_server, pg_url):
                    gate.release.set()
                    await wait_until(lambda: _stats(run).requeued >= 1)
                    assert _stats(run).written == 0
                event = await next_event(sub, river.EventKind.JOB_COMPLETED, job.id)
            assert event.job is not None and event.job.state is river.JobState.COMPLETED
            assert _stats(run).dropped == 0
    assert (await read_job(pg_url, job.id)).state is river.JobState.COMPLETED


async def test_stop_finishes_while_the_database_is_failing(
    database_url: str, pg_server: str | None
) -> None:
    """Leaving the body while completions cannot be written: the stop still ends; the first
    persistent failure leaves the jobs running for the rescuer."""
    gate = Gate()
    async with contextlib.AsyncExitStack() as stack:
        with anyio.fail_after(SOON):
            async with river.open_client(
                database_url,
                id=CLIENT,
                queues=queues(),
                workers=gate.workers(),
                driver_options={"busy_timeout": 0.05} if "sqlite" in database_url else None,
                **FAST_COMPLETER,
            ) as run:
                sub = run.subscribe()
                jobs = [r.job for r in await run.client.insert_many([Blocker("a"), Blocker("b")])]
                for job in jobs:
                    await gate.started_event(job.id).wait()
                if database_url.startswith("sqlite"):
                    await stack.enter_async_context(sqlite_write_lock(database_url))
                else:
                    assert pg_server is not None
                    await stack.enter_async_context(pg_connections_refused(pg_server, database_url))
                gate.release.set()
            # stopped, with the database still failing
            stats = _stats(run)
            assert stats.dropped == 2 and stats.pending == 0
    dropped = [e for e in drain(sub) if e.kind is river.EventKind.COMPLETION_DROPPED]
    assert sorted(i for e in dropped for i in e.details["job_ids"]) == sorted(j.id for j in jobs)
    for job in jobs:
        assert (await read_job(database_url, job.id)).state is river.JobState.RUNNING


def _stats(run: river.ClientRun) -> Any:
    stats = run.diagnostics.completer
    assert stats is not None
    return stats


# --- notifier reconnects (PostgreSQL) ------------------------------------------------------------


async def _terminate_listener(pg_server: str, url: str) -> None:
    [rows] = await admin_exec(
        pg_server,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = '{pg_dbname(url)}' AND query LIKE 'LISTEN%'",
    )
    assert rows == [(True,)], rows


async def test_the_notifier_reconnects_and_notifications_work_again(
    pg_url: str, pg_server: str
) -> None:
    gate = Gate()
    gate.release.set()
    # polling every 30 s: a job picked up at once was announced by a notification
    slow_poll = {"default": river.QueueConfig(max_workers=5, fetch_poll_interval=30)}
    with anyio.fail_after(SOON * 2):
        async with river.open_client(
            pg_url, id=CLIENT, queues=slow_poll, workers=gate.workers()
        ) as run:
            with run.subscribe(river.EventKind.JOB_COMPLETED) as sub:
                await _terminate_listener(pg_server, pg_url)
                await wait_until(lambda: run.diagnostics.notifier_reconnects >= 1)
                async with river.open_client(pg_url) as other:  # another client inserts
                    for name in ("first", "second"):
                        job = (await other.client.insert(Blocker(name))).job
                        await next_event(sub, river.EventKind.JOB_COMPLETED, job.id, within=10)
            assert run.diagnostics.notifier_reconnects == 1


async def test_the_notifiers_loops_are_closed_when_the_client_stops(database_url: str) -> None:
    # a listener's notifications may come from an async generator: a loop left at a
    # cancellation must close it, not leave it to the garbage collector (trio warns)
    async with open_faulty(database_url) as faulty:
        with anyio.fail_after(SOON):
            await work_one_job(faulty, [])
    assert faulty.loops and all(loop.closed for loop in faulty.loops)


async def test_a_remote_cancel_missed_while_disconnected_is_reconciled(
    pg_url: str, pg_server: str
) -> None:
    gate = Gate(mode="forever")
    db = pg_dbname(pg_url)
    with anyio.fail_after(SOON * 2):
        async with (
            other_driver(pg_url) as other,
            river.open_client(pg_url, id=CLIENT, queues=queues(), workers=gate.workers()) as run,
        ):
            sub = run.subscribe(river.EventKind.JOB_CANCELLED)
            job = (await run.client.insert(Blocker())).job
            await gate.started_event(job.id).wait()
            await other.executor().job_get_by_id(job.id)  # `other` has a live connection
            # the notifier loses its connection and cannot get another one ...
            await admin_exec(pg_server, f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false')
            try:
                await _terminate_listener(pg_server, pg_url)
                # ... while the job is cancelled: its notification reaches nobody
                cancelled = await other.executor().job_cancel(
                    job_id=job.id, cancel_attempted_at=_now()
                )
                assert cancelled is not None and cancelled.state is river.JobState.RUNNING
                assert gate.cancelled == []
            finally:
                await admin_exec(pg_server, f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
            event = await next_event(sub, river.EventKind.JOB_CANCELLED, job.id)
            assert event.job is not None and event.job.state is river.JobState.CANCELLED
            assert run.diagnostics.notifier_reconnects == 1
            sub.close()
    assert gate.cancelled == [job.id]
    assert (await read_job(pg_url, job.id)).state is river.JobState.CANCELLED


def _now() -> Any:
    import datetime as dt

    return dt.datetime.now(dt.UTC)


# --- the attempt guard -----------------------------------------------------------------------------


_K = river.EventKind


@pytest.mark.parametrize(
    ("change", "kinds"),
    [
        # re-claimed: another attempt owns the row, still running: River sends no event
        ("attempt = attempt + 1", [_K.JOB_RACE]),
        # rescued meanwhile: River's completer names the row's state, retryable: failed
        ("state = 'retryable', scheduled_at = created_at", [_K.JOB_FAILED, _K.JOB_RACE]),
        # finished by someone else: completed, or discarded (failed), or cancelled
        ("state = 'completed', finalized_at = created_at", [_K.JOB_COMPLETED, _K.JOB_RACE]),
        ("state = 'discarded', finalized_at = created_at", [_K.JOB_FAILED, _K.JOB_RACE]),
        ("state = 'cancelled', finalized_at = created_at", [_K.JOB_CANCELLED, _K.JOB_RACE]),
    ],
)
async def test_a_completion_for_a_stale_attempt_is_not_applied(
    database_url: str, change: str, kinds: list[river.EventKind]
) -> None:
    """The row is left as it was (but for the metadata, merged); the events are River's for
    the row as it is (River's completer sends them whether its write applied or not), then
    ``job_race``."""

    def on_start(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        ctx.set_metadata("seen_by", "stale attempt")

    gate = Gate(on_start=on_start)
    with anyio.fail_after(SOON):
        # not leading: a leader's scheduler would make the "rescued" row available again
        async with river.open_client(
            database_url,
            id=CLIENT,
            queues=queues(),
            workers=gate.workers(),
            leader_election_disabled=True,
        ) as run:
            with run.subscribe() as sub:
                job = (await run.client.insert(Blocker())).job
                await gate.started_event(job.id).wait()
                async with other_driver(database_url) as other:
                    changed = await other.executor().execute(
                        f"UPDATE river_job SET {change} WHERE id = {param(database_url)}",
                        [job.id],
                    )
                assert changed == 1
                before = await read_job(database_url, job.id)
                gate.release.set()
                seen: list[river.Event] = []
                with anyio.fail_after(SOON):
                    async for ev in sub:
                        if ev.job is not None and ev.job.id == job.id:
                            seen.append(ev)
                            if ev.kind is river.EventKind.JOB_RACE:
                                break
            assert _stats(run).races == 1
    assert [ev.kind for ev in seen] == kinds
    event = seen[-1]
    assert all(ev.job == event.job for ev in seen)
    assert event.job is not None
    assert event.job.state is before.state and event.job.attempt == before.attempt
    row = await read_job(database_url, job.id)
    assert (row.state, row.attempt, row.errors) == (before.state, before.attempt, ())
    assert row.finalized_at == before.finalized_at
    assert row.metadata["seen_by"] == "stale attempt"  # metadata is merged all the same


@pytest.mark.parametrize(
    ("asked", "state", "kind"),
    [
        (_K.JOB_COMPLETED, river.JobState.COMPLETED, _K.JOB_COMPLETED),
        (_K.JOB_COMPLETED, river.JobState.DISCARDED, _K.JOB_FAILED),
        (_K.JOB_COMPLETED, river.JobState.CANCELLED, _K.JOB_CANCELLED),
        (_K.JOB_COMPLETED, river.JobState.RETRYABLE, _K.JOB_FAILED),
        (_K.JOB_COMPLETED, river.JobState.SCHEDULED, _K.JOB_SNOOZED),
        (_K.JOB_COMPLETED, river.JobState.RUNNING, None),
        (_K.JOB_COMPLETED, river.JobState.PENDING, None),
        # available is a retry, a short snooze or an interruption: what was asked says which,
        # and a completion or cancel that found the job available (retried meanwhile) failed
        (_K.JOB_COMPLETED, river.JobState.AVAILABLE, _K.JOB_FAILED),
        (_K.JOB_CANCELLED, river.JobState.AVAILABLE, _K.JOB_FAILED),
        (_K.JOB_FAILED, river.JobState.AVAILABLE, _K.JOB_FAILED),
        (_K.JOB_SNOOZED, river.JobState.AVAILABLE, _K.JOB_SNOOZED),
        (_K.JOB_INTERRUPTED, river.JobState.AVAILABLE, _K.JOB_INTERRUPTED),
        # a retry that found a cancel asked for is written cancelled
        (_K.JOB_FAILED, river.JobState.CANCELLED, _K.JOB_CANCELLED),
    ],
)
def test_completion_events_are_rivers_for_the_row_as_written(
    asked: river.EventKind, state: river.JobState, kind: river.EventKind | None
) -> None:
    assert river_event_kind(asked, state) is kind


# --- poll-only mode ------------------------------------------------------------------------------


async def test_poll_only_works_without_listening(database_url: str) -> None:
    gate = Gate()
    gate.release.set()
    fast_poll = {"default": river.QueueConfig(max_workers=5, fetch_poll_interval=0.2)}
    async with open_faulty(database_url) as faulty:
        listening = faulty.fail(
            "listener", lambda: AssertionError("a poll-only client must not listen"), times=None
        )
        with anyio.fail_after(SOON):
            async with river.open_client(
                faulty, id=CLIENT, poll_only=True, queues=fast_poll, workers=gate.workers()
            ) as run:
                with run.subscribe() as sub:
                    # jobs inserted by another client are found by polling
                    async with river.open_client(database_url) as other:
                        job = (await other.client.insert(Blocker())).job
                        await next_event(sub, river.EventKind.JOB_COMPLETED, job.id)
                        # pause and resume are seen by the 2 s settings poll
                        await other.client.driver.executor().queue_pause("default")
                        await next_event(sub, river.EventKind.QUEUE_PAUSED, within=5)
                        assert run.diagnostics.queues["default"].paused
                        await other.client.driver.executor().queue_resume("default")
                        await next_event(sub, river.EventKind.QUEUE_RESUMED, within=5)
                assert run.diagnostics.notifier_reconnects == 0
        assert (listening.seen, faulty.calls["listener"]) == (0, 0)
    assert (await read_job(database_url, job.id)).state is river.JobState.COMPLETED


# --- a completer backed up while stopping -------------------------------------------------------


async def test_a_stop_does_not_wait_forever_for_a_backed_up_completer(
    database_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Results that cannot reach a completer backed up by a stuck write wait a bounded grace
    once the stop cancels them, then are left ``running`` for the rescuer; the stop ends."""
    from river_anyio._runtime import _completer, _runner

    # one completion taken, one buffered: the third and fourth results must wait
    monkeypatch.setattr(_completer, "BACKLOG_HIGH", 1)
    monkeypatch.setattr(_completer, "STREAM_BUFFER", 1)
    monkeypatch.setattr(_runner, "HAND_OFF_GRACE", 0.2)
    caplog.set_level("ERROR", logger="river_anyio.executor")
    gate = Gate()
    gate.release.set()
    async with river.open_client(database_url) as inserter:
        ids = [r.job.id for r in await inserter.client.insert_many([Blocker()] * 4)]
    write = anyio.Event()

    def handed_off_late() -> list[int]:
        return [
            r.river_job_id  # type: ignore[attr-defined]
            for r in caplog.records
            if getattr(r, "river_event", None) == "completer_hand_off_timeout"
        ]

    async with open_faulty(database_url) as faulty:
        stuck = faulty.delay("job_set_state_if_running_many", until=write)
        async with river.open_client(
            faulty, id=CLIENT, queues=queues(4), workers=gate.workers(), **FAST_COMPLETER
        ) as run:
            await wait_until(lambda: len(gate.finished) == 4 and stuck.hit.is_set())
            run.stop_and_cancel()
            await wait_until(lambda: len(handed_off_late()) == 2)
            write.set()  # the stuck write goes through; the stop completes
            with anyio.fail_after(SOON):
                await run.wait()
    late = handed_off_late()
    for job_id in ids:
        state = (await read_job(database_url, job_id)).state
        expected = river.JobState.RUNNING if job_id in late else river.JobState.COMPLETED
        assert state is expected, (job_id, late)
