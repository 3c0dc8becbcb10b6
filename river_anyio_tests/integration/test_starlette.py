"""river_anyio.contrib.starlette end to end: Hypercorn serving a Starlette app in-process,
under its trio worker and its asyncio worker, on PostgreSQL and SQLite; a real HTTP request
inserts a job that a worker runs; shutting the server down stops the client gracefully; a
crashing client stops the server with the error; the readiness route answers 503 while the
database is down and 200 once it answers."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar

import anyio
import attrs
import pytest
from hypercorn.config import Config
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import river_anyio as river
from river_anyio.contrib.starlette import (
    RiverLifespan,
    health_endpoint,
    health_response,
    health_route,
    river_lifespan,
)
from river_anyio.drivers import open_driver

from ..faulty import open_faulty
from ..pgproxy import PgProxy

pytestmark = pytest.mark.anyio

SOON = 20.0


@attrs.frozen
class Welcome:
    kind: ClassVar[str] = "welcome"
    email: str


async def signup(request: Request) -> JSONResponse:
    payload = await request.json()
    run: river.ClientRun = request.state.river
    result = await run.client.insert(Welcome(email=payload["email"]))
    return JSONResponse({"id": result.job.id, "greeting": request.state.greeting}, status_code=201)


def make_app(lifespan: RiverLifespan) -> Starlette:
    return Starlette(routes=[Route("/signup", signup, methods=["POST"])], lifespan=lifespan)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def serve(
    backend: str, app: Starlette, port: int, trigger: Callable[[], Awaitable[Any]]
) -> None:
    """Hypercorn's worker for the backend, serving ``app`` until ``trigger`` returns."""
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.graceful_timeout = 10
    config.accesslog = None
    if backend == "trio":
        from hypercorn.trio import serve as trio_serve

        await trio_serve(app, config, shutdown_trigger=trigger)
    else:
        from hypercorn.asyncio import serve as asyncio_serve

        await asyncio_serve(app, config, shutdown_trigger=trigger)


async def wait_listening(port: int) -> None:
    """Wait for the server to accept connections (it listens once the lifespan started)."""
    with anyio.fail_after(SOON):
        while True:
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.01)
                continue
            await stream.aclose()
            return


async def post_json(port: int, path: str, payload: object | None) -> tuple[int, Any]:
    """A plain HTTP/1.1 request over a socket (a GET when ``payload`` is None); returns the
    status and the decoded body."""
    body = b"" if payload is None else json.dumps(payload).encode()
    method = "GET" if payload is None else "POST"
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    chunks = []
    with anyio.fail_after(SOON):
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(head + body)
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    chunks.append(await stream.receive())
    response = b"".join(chunks)
    status_line, _, rest = response.partition(b"\r\n")
    _, _, content = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), json.loads(content) if content else None


async def wait_until(predicate: Callable[[], bool]) -> None:
    with anyio.fail_after(SOON):
        while not predicate():  # noqa: ASYNC110 - ClientRun.stopping has no event
            await anyio.sleep(0.01)


def flatten(exc: BaseException) -> list[BaseException]:
    """Every exception in a tree of groups, causes and contexts."""
    out: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop()
        if e in out:
            continue
        out.append(e)
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    return out


async def test_a_request_inserts_a_job_that_is_worked_and_shutdown_is_graceful(
    database_url: str, anyio_backend: str
) -> None:
    started = anyio.Event()
    release = anyio.Event()
    worked: list[river.Job[Welcome]] = []

    async def work(ctx: river.WorkContext, job: river.Job[Welcome]) -> None:
        started.set()
        await release.wait()  # still running when the server shuts down
        worked.append(job)

    workers = river.Workers()
    workers.add(Welcome, work)
    seen_in_inner: list[object] = []

    @contextlib.asynccontextmanager
    async def app_lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        seen_in_inner.append(app.state.river)  # the client is open before the app's own
        yield {"greeting": "hello"}

    lifespan = river_lifespan(
        database_url,
        lifespan=app_lifespan,
        queues={"default": river.QueueConfig(max_workers=2)},
        workers=workers,
        fetch_cooldown=0.01,
        soft_stop_timeout=30,
    )
    app = make_app(lifespan)
    port = free_port()
    shutdown = anyio.Event()
    with anyio.fail_after(SOON * 2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve, anyio_backend, app, port, shutdown.wait)
            await wait_listening(port)
            run = lifespan.run
            assert isinstance(run, river.ClientRun)
            assert seen_in_inner == [run] and app.state.river is run

            status, body = await post_json(port, "/signup", {"email": "a@example.com"})
            assert status == 201, body
            assert body["greeting"] == "hello"
            await started.wait()

            shutdown.set()  # the server stops; the client stops gracefully with it
            await wait_until(lambda: run.stopping)
            assert not worked  # the job is still running ...
            release.set()  # ... and may finish: a graceful stop does not interrupt it
    assert [j.id for j in worked] == [body["id"]]
    assert worked[0].args == Welcome(email="a@example.com")
    async with open_driver(database_url) as driver:
        row = await driver.executor().job_get_by_id(body["id"])
    assert row is not None
    assert (row.state, row.attempt, row.errors) == (river.JobState.COMPLETED, 1, ())
    assert lifespan.run is None and lifespan.crash is None
    assert not hasattr(app.state, "river")


def noop_workers() -> river.Workers:
    async def work(ctx: river.WorkContext, job: river.Job[Welcome]) -> None:
        pass

    workers = river.Workers()
    workers.add(Welcome, work)
    return workers


@contextlib.asynccontextmanager
async def greeting(app: Starlette) -> AsyncIterator[dict[str, Any]]:
    yield {"greeting": "hello"}


@contextlib.asynccontextmanager
async def crashing_lifespan(url: str) -> AsyncIterator[RiverLifespan]:
    """A lifespan whose client crashes on its producer's second claim (after an insert): a
    bug injected through the driver protocol, so the client's own fetch path raises it."""
    async with open_faulty(url) as faulty:
        faulty.fail("job_get_available", lambda: RuntimeError("producer bug"), skip=1)
        yield river_lifespan(
            faulty,
            lifespan=greeting,
            queues={"default": river.QueueConfig(max_workers=2)},
            workers=noop_workers(),
            fetch_cooldown=0.01,
        )


async def test_a_crashing_client_stops_the_server_with_the_error(
    database_url: str,
    anyio_backend: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With ``shutdown_trigger`` (needed by Hypercorn's asyncio worker, which otherwise
    reports a lifespan failure only at shutdown) the server stops by itself."""
    async with crashing_lifespan(database_url) as lifespan:
        await _crash_with_trigger(lifespan, anyio_backend, caplog)


async def _crash_with_trigger(
    lifespan: RiverLifespan, anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    never = anyio.Event()
    caplog.set_level(logging.ERROR, logger="river_anyio.client")
    with anyio.fail_after(SOON * 2):
        with pytest.raises(BaseException) as info:  # noqa: PT011 - checked below
            async with anyio.create_task_group() as tg:

                async def server() -> None:
                    await serve(
                        anyio_backend,
                        make_app(lifespan),
                        port,
                        lifespan.shutdown_trigger(never.wait),
                    )

                tg.start_soon(server)
                await wait_listening(port)
                status, _ = await post_json(port, "/signup", {"email": "b@example.com"})
                assert status == 201  # the insert wakes the producer, whose fetch crashes
                await anyio.sleep_forever()  # the server must stop by itself
    errors = flatten(info.value)
    crashes = [e for e in errors if isinstance(e, river.ClientCrashedError)]
    assert crashes, errors
    assert any("RuntimeError: producer bug" in str(e) for e in crashes)
    assert isinstance(lifespan.crash, river.ClientCrashedError)
    assert lifespan.run is None
    assert any("river_anyio client crashed" in r.getMessage() for r in caplog.records), (
        caplog.records
    )


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_under_hypercorns_trio_worker_a_crash_ends_the_server_without_a_trigger(
    sqlite_url: str, anyio_backend: str
) -> None:
    port = free_port()
    never = anyio.Event()
    with anyio.fail_after(SOON * 2):
        with pytest.raises(BaseException) as info:  # noqa: PT011 - checked below
            async with crashing_lifespan(sqlite_url) as lifespan, anyio.create_task_group() as tg:
                tg.start_soon(serve, "trio", make_app(lifespan), port, never.wait)
                await wait_listening(port)
                status, _ = await post_json(port, "/signup", {"email": "c@example.com"})
                assert status == 201
                await anyio.sleep_forever()
    # the lifespan failure carries the crash's traceback text
    assert any("ClientCrashedError" in str(e) for e in flatten(info.value)), info.value


async def test_a_start_up_failure_fails_the_apps_start(tmp_path: Any, anyio_backend: str) -> None:
    missing = f"sqlite://{tmp_path / 'not-migrated.sqlite3'}"
    lifespan = river_lifespan(
        missing, queues={"default": river.QueueConfig(max_workers=1)}, workers=noop_workers()
    )
    never = anyio.Event()
    with anyio.fail_after(SOON):
        with pytest.raises(BaseException) as info:  # noqa: PT011 - checked below
            await serve(anyio_backend, make_app(lifespan), free_port(), never.wait)
    assert any(
        "has no River schema: run river-anyio migrate-up" in str(e) for e in flatten(info.value)
    ), info.value


def test_options_are_checked_when_the_lifespan_is_built() -> None:
    with pytest.raises(river.ConfigError, match="not_an_option"):
        river_lifespan("sqlite://x.db", not_an_option=1)
    with pytest.raises(river.ConfigError, match="database_url"):
        river_lifespan("mysql://x")
    with pytest.raises(river.ConfigError, match="state_key"):
        river_lifespan("sqlite://x.db", state_key="not valid")


# --- readiness -------------------------------------------------------------------------------


async def get_until(port: int, path: str, status: int) -> Any:
    """GET ``path`` until it answers ``status`` (polled like a probe); returns the body."""
    with anyio.fail_after(SOON):
        while True:
            got, body = await post_json(port, path, None)
            if got == status:
                return body
            await anyio.sleep(0.05)


async def test_the_health_route_answers_503_until_the_database_answers(
    pg_url: str, anyio_backend: str
) -> None:
    """``wait_for_database``: the app starts serving while the database is down, its
    readiness route answers 503 with the reason, then 200 once the client works."""
    proxy = PgProxy(pg_url)
    proxy.go_down()
    port = free_port()
    shutdown = anyio.Event()
    with anyio.fail_after(SOON * 2):
        async with anyio.create_task_group() as tg:
            await tg.start(proxy.serve)
            lifespan = river_lifespan(
                proxy.url(pg_url),
                queues={"default": river.QueueConfig(max_workers=2)},
                workers=noop_workers(),
                wait_for_database=True,
                fetch_cooldown=0.01,
                soft_stop_timeout=5,
            )
            routes = [health_route("/healthz"), Route("/ready", health_endpoint)]
            app = Starlette(routes=routes, lifespan=lifespan)
            tg.start_soon(serve, anyio_backend, app, port, shutdown.wait)
            await wait_listening(port)
            for path in ("/healthz", "/ready"):
                status, body = await post_json(port, path, None)
                assert status == 503, body
                assert body["ok"] is False and body["database"]["waiting"] is True
                assert body["reasons"][0].startswith("waiting for the database")

            proxy.come_up()
            body = await get_until(port, "/healthz", 200)
            assert body["ok"] is True and body["reasons"] == []
            assert body["database"]["reachable"] is True
            assert set(body["queues"]) == {"default"}
            assert (await post_json(port, "/ready", None))[0] == 200
            shutdown.set()
            await wait_until(lambda: lifespan.run is None)
            tg.cancel_scope.cancel("test over")


def test_the_health_response_of_no_client_is_503() -> None:
    response = health_response(None)
    assert response.status_code == 503
    assert json.loads(bytes(response.body)) == {
        "ok": False,
        "reasons": ["the river_anyio client is not running"],
    }
    assert response.headers["cache-control"] == "no-store"
    with pytest.raises(river.ConfigError, match="state_key"):
        health_route(state_key="not valid")
