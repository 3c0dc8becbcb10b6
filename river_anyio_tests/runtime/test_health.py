"""``run.health()``: the facts on a healthy client, a database outage under a running client
(not ok within 10 s, ok again within 15 s after it ends), and ``wait_for_database``.

Outages are real. On PostgreSQL the client talks to the server through a TCP proxy that
closes every connection and refuses new ones (the shared server is never stopped). On SQLite
"unreachable" means the database cannot be written: another connection holds its write lock,
so every claim that finds jobs fails with ``DatabaseBusyError`` after the busy timeout; a SQLite client waiting
for its database is started on the fault-injecting driver with every transaction failing as a
lost connection would (a missing directory is a configuration error, never waited for).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import river_anyio as river
from river_anyio._config import ClientConfig
from river_anyio._runtime._health import MAX_REQUEST, HealthServer

from ..faulty import open_faulty
from ..pgproxy import PgProxy
from .lifecycle_support import Blocker, Gate, queues, sqlite_write_lock

pytestmark = pytest.mark.anyio

#: The issue's bounds: not ok within 10 s of the outage, ok within 15 s of its end.
DOWN_WITHIN = 10.0
UP_WITHIN = 15.0


async def health_until(
    run: river.ClientRun, check: Callable[[river.Health], bool], within: float
) -> river.Health:
    """Poll ``run.health()`` until ``check`` holds (health has no event of its own)."""
    with anyio.fail_after(within):
        while not check(health := run.health()):  # noqa: ASYNC110 - polled like a probe
            await anyio.sleep(0.05)
    return health


def fast(**extra: Any) -> dict[str, Any]:
    return {"fetch_cooldown": 0.01, "soft_stop_timeout": 2.0, **extra}


# --- a healthy client --------------------------------------------------------------------------


async def test_a_healthy_client_reports_its_facts(database_url: str) -> None:
    gate = Gate()
    async with river.open_client(
        database_url,
        queues=queues(3, "default", "other"),
        workers=gate.workers(),
        fetch_poll_interval=0.05,
        **fast(),
    ) as run:
        await run.wait_leading()
        first = await health_until(
            run, lambda h: all(q.last_fetch_at for q in h.queues.values()), 5
        )
        # an idle queue keeps claiming (finding nothing) at its poll interval: healthy, and
        # its last fetch stays recent
        await health_until(
            run, lambda h: h.queues["other"].last_fetch_at > first.queues["other"].last_fetch_at, 5
        )
        job = (await run.client.insert(Blocker())).job
        await gate.started_event(job.id).wait()
        health = await health_until(run, lambda h: h.queues["default"].active_jobs == 1, 5)
        assert health.ok and health.reasons == ()
        assert health.leader is True and health.stopping is False
        assert health.database_reachable is True
        assert health.database_failing_for is None and health.database_error is None
        assert health.database_last_ok_age is not None and health.database_last_ok_age < 2
        assert health.notifier_connected is True
        assert health.waiting_for_database is False
        assert health.completer_backlog == 0
        assert set(health.queues) == {"default", "other"}
        for q in health.queues.values():
            assert q.failing_for is None and q.paused is False
            assert q.last_fetch_age is not None and q.last_fetch_age < 2
            assert q.last_fetch_at is not None
            assert abs(q.last_fetch_at - health.checked_at) < dt.timedelta(seconds=2)
        assert health.queues["other"].active_jobs == 0

        data = json.loads(json.dumps(health.as_dict()))
        assert data["ok"] is True and data["reasons"] == []
        assert data["leader"] is True and data["stopping"] is False
        assert data["database"]["reachable"] is True and data["database"]["waiting"] is False
        assert data["queues"]["default"]["active_jobs"] == 1
        assert dt.datetime.fromisoformat(data["checked_at"]) == health.checked_at

        run.stop()
        stopping = run.health()
        assert stopping.stopping is True and stopping.ok is False
        assert stopping.reasons == ("the client is stopping",)
        gate.release.set()


def test_health_thresholds_are_validated() -> None:
    config = river.HealthConfig(database_failing_after=dt.timedelta(seconds=2))
    assert config.database_failing_after == 2.0
    assert river.HealthConfig(notifier_down_after=None).notifier_down_after is None
    for field, value in (
        ("database_failing_after", 0),
        ("fetch_failing_after", -1),
        ("notifier_down_after", float("inf")),
        ("fetch_failing_after", "5"),
        ("completer_backlog_max", 0),
    ):
        with pytest.raises(river.ConfigError) as info:
            river.HealthConfig(**{field: value})
        assert info.value.field == field
    with pytest.raises(river.ConfigError) as info:
        river.Config(health={"database_failing_after": 1})  # type: ignore[arg-type]
    assert info.value.field == "health"
    with pytest.raises(river.ConfigError) as info:
        river.Config(wait_for_database=1)  # type: ignore[arg-type]
    assert info.value.field == "wait_for_database"


# --- the database goes away under a running client ---------------------------------------------


async def test_a_postgres_outage_is_reported_and_its_end_too(pg_url: str) -> None:
    """The issue's test, with the default thresholds: the database goes away under a
    working client (every connection closed, new ones refused) and comes back."""
    gate = Gate()
    proxy = PgProxy(pg_url)
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        async with river.open_client(
            proxy.url(pg_url),
            queues=queues(),
            workers=gate.workers(),
            health=river.HealthConfig(notifier_down_after=1),  # the others: the defaults
            **fast(),
        ) as run:
            await run.wait_leading()
            await health_until(run, lambda h: h.ok and bool(h.queues["default"].last_fetch_at), 5)

            proxy.go_down()
            down = await health_until(
                run,
                lambda h: any(r.startswith("database unreachable for") for r in h.reasons),
                DOWN_WITHIN,
            )
            assert not down.ok and down.database_reachable is False
            assert down.database_error is not None
            assert "password" not in json.dumps(down.as_dict())
            down = await health_until(run, lambda h: h.queues["default"].failing_for, 5)
            assert down.queues["default"].failing_for >= 0
            assert down.notifier_connected is False
            assert any(r.startswith("the listener has been disconnected for") for r in down.reasons)

            proxy.come_up()
            up = await health_until(
                run, lambda h: h.ok and h.queues["default"].failing_for is None, UP_WITHIN
            )
            assert up.database_reachable is True and up.database_failing_for is None
            # and it works again
            job = (await run.client.insert(Blocker())).job
            with anyio.fail_after(UP_WITHIN):
                await gate.started_event(job.id).wait()
            gate.release.set()
        tg.cancel_scope.cancel("test over")
    assert proxy.refused > 0


async def test_a_sqlite_database_that_cannot_be_written_is_reported(sqlite_url: str) -> None:
    """Claims and the completer's writes fail while another connection holds the lock: the
    database, the queue and the results waiting to be written are each a reason. (A claim
    reads its candidates without the lock, so the queue has one waiting: its one worker is
    busy until the lock is taken.)"""
    gate = Gate()
    config = ClientConfig(completer_pauses=(0.05,))  # retried writes: no long pauses
    async with river.open_client(
        sqlite_url,
        config,
        queues=queues(1),
        workers=gate.workers(),
        leader_election_disabled=True,
        fetch_poll_interval=0.1,
        driver_options={"busy_timeout": 0.1},
        health=river.HealthConfig(
            database_failing_after=0.5, fetch_failing_after=0.5, completer_backlog_max=1
        ),
        **fast(),
    ) as run:
        await health_until(run, lambda h: h.ok and bool(h.queues["default"].last_fetch_at), 5)
        job = (await run.client.insert(Blocker())).job
        await gate.started_event(job.id).wait()
        waiting = (await run.client.insert(Blocker())).job
        async with sqlite_write_lock(sqlite_url):
            gate.release.set()  # it finishes; its result cannot be written
            down = await health_until(run, lambda h: not h.ok, DOWN_WITHIN)
            down = await health_until(
                run, lambda h: len(h.reasons) == 3 and h.database_reachable is False, 5
            )
            assert down.reasons[0].startswith("database unreachable for"), down.reasons
            assert down.reasons[1].startswith("queue 'default': fetching jobs has failed for")
            assert down.reasons[2] == "1 finished jobs wait for their results to be written"
            assert down.completer_backlog == 1
            assert "DatabaseBusyError" in (down.database_error or "")
        up = await health_until(run, lambda h: h.ok, UP_WITHIN)
        assert up.completer_backlog == 0
        with anyio.fail_after(UP_WITHIN):
            await gate.started_event(waiting.id).wait()


# --- starting while the database is down -------------------------------------------------------


async def test_a_client_waits_for_postgres_and_starts_when_it_answers(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    gate = Gate()
    proxy = PgProxy(pg_url)
    proxy.go_down()
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        began = anyio.current_time()
        async with river.open_client(
            proxy.url(pg_url),
            queues=queues(),
            workers=gate.workers(),
            wait_for_database=True,
            **fast(),
        ) as run:
            assert anyio.current_time() - began < 5  # entered promptly, the database down
            waiting = await health_until(run, lambda h: h.database_error is not None, 5)
            assert not waiting.ok and waiting.waiting_for_database
            assert waiting.database_reachable is False
            assert waiting.reasons[0].startswith("waiting for the database (unreachable for")
            assert waiting.queues == {}
            with pytest.raises(river.ConnectionLostError, match="wait_for_database"):
                await run.client.insert(Blocker())
            assert any(
                getattr(r, "river_event", None) == "database_unreachable" and r.levelname == "ERROR"
                for r in caplog.records
            )

            proxy.come_up()
            ready = await health_until(run, lambda h: h.ok, UP_WITHIN)
            assert not ready.waiting_for_database and ready.database_reachable
            job = (await run.client.insert(Blocker())).job
            with anyio.fail_after(5):
                await gate.started_event(job.id).wait()
            gate.release.set()
        tg.cancel_scope.cancel("test over")


async def test_a_client_waits_for_sqlite_and_starts_when_it_answers(sqlite_url: str) -> None:
    """On SQLite, through the fault-injecting driver: every transaction fails as a lost
    connection would, until the faults are cleared."""
    gate = Gate()
    async with open_faulty(sqlite_url) as faulty:
        refused = faulty.fail("transaction", times=None)
        async with river.open_client(
            faulty, queues=queues(), workers=gate.workers(), wait_for_database=True, **fast()
        ) as run:
            waiting = await health_until(run, lambda h: h.database_error is not None, 5)
            assert not waiting.ok and waiting.waiting_for_database
            assert "injected fault" in waiting.reasons[0]
            faulty.clear()
            await health_until(run, lambda h: h.ok, UP_WITHIN)
            job = (await run.client.insert(Blocker())).job
            with anyio.fail_after(5):
                await gate.started_event(job.id).wait()
            gate.release.set()
        assert refused.hits >= 1


async def test_a_client_stopped_while_it_waits_ends_cleanly(sqlite_url: str) -> None:
    gate = Gate()
    async with open_faulty(sqlite_url) as faulty:
        faulty.fail("transaction", times=None)
        with anyio.fail_after(5):
            async with river.open_client(
                faulty, queues=queues(), workers=gate.workers(), wait_for_database=True
            ) as run:
                await health_until(run, lambda h: h.database_error is not None, 5)
                run.stop()
                await run.wait()
                health = run.health()
                assert not health.ok and health.stopping
                assert health.reasons == ("the client is stopping",)
        assert faulty.calls["job_get_available"] == 0  # it never started working


# --- the worker's responder ----------------------------------------------------------------------


async def _exchange(port: int, request: bytes) -> bytes:
    with anyio.fail_after(5):
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(request)
            chunks = []
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while True:
                    chunks.append(await stream.receive())
    return b"".join(chunks)


async def test_the_health_responder_speaks_just_enough_http() -> None:
    now = dt.datetime.now(dt.UTC)
    health = river.Health(
        ok=False, reasons=("the client is stopping",), checked_at=now, database_reachable=True,
        database_last_ok_at=now, database_last_ok_age=0.0, database_failing_for=None,
        database_error=None, waiting_for_database=False, notifier_connected=None, queues={},
        completer_backlog=0, leader=False, stopping=True,
    )  # fmt: skip
    server = HealthServer(lambda: health, host="127.0.0.1", port=0)
    async with anyio.create_task_group() as tg:
        port = await tg.start(server.run)
        answer = await _exchange(port, b"GET /health?verbose=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        assert b"Connection: close" in head and b"Cache-Control: no-store" in head
        assert f"Content-Length: {len(body)}".encode() in head
        assert json.loads(body) == health.as_dict()
        answer = await _exchange(port, b"HEAD /health HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 503 ") and answer.endswith(b"\r\n\r\n")
        assert (await _exchange(port, b"POST /health HTTP/1.1\r\n\r\n")).startswith(
            b"HTTP/1.1 405 "
        )
        assert (await _exchange(port, b"GET / HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404 ")
        # nonsense, or too much of it, is dropped without an answer; the server carries on
        assert await _exchange(port, b"\x00" * (MAX_REQUEST + 10)) == b""
        assert (await _exchange(port, b"GET /health HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 503 ")
        tg.cancel_scope.cancel("test over")
