"""The adapter's server: one request per stdin line, one response per stdout line, in order.

Lifetimes are the nesting in :func:`serve`: the driver (one pool, every schema a view of it)
lives in an exit stack around the task group that holds the worker client's run and each open
transaction's task; closing stdin stops the client (stop and cancel), rolls back what is open
and leaves.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import json
import logging
import os
import sys
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import anyio.abc
import attrs

import river_anyio as river
from river_anyio.drivers import Driver, Executor, open_driver
from river_anyio.migrate import Migrator

from ._protocol import (
    CODE_INTERNAL,
    CODE_INVALID_REQUEST,
    CODE_NOT_FOUND,
    CODE_PARSE_ERROR,
    CODE_REJECTED,
    KIND_ECHO,
    PERIODIC_JOB_ID,
    PERIODIC_MARKER_JOB_ID,
    ProtocolError,
    decode_params,
    invalid,
    job_json,
    not_found,
)
from ._worker import (
    ARGS_BY_KIND,
    Barriers,
    CancellingErrorHandler,
    EchoArgs,
    EchoWorker,
    FixedRetryPolicy,
    Stats,
)

logger = logging.getLogger("river_anyio_tests.conformance")

#: The event kinds ``stats`` reports, as River Go's adapter subscribes to them.
EVENT_KINDS = (
    river.EventKind.JOB_CANCELLED,
    river.EventKind.JOB_COMPLETED,
    river.EventKind.JOB_FAILED,
    river.EventKind.JOB_SNOOZED,
    river.EventKind.QUEUE_PAUSED,
    river.EventKind.QUEUE_RESUMED,
)
#: A graceful stop's bound before running jobs are cancelled (River Go's adapter: 10 s).
STOP_TIMEOUT = 10.0
#: Connections of the one pool every schema's requests share (``Driver.with_schema``): the
#: harness asks for at most 10 per adapter, and the worker client's listener (one client runs
#: at a time) takes one more outside the pool.
POOL_MAX_SIZE = 9


@attrs.frozen
class Settings:
    driver: str
    database_url: str
    application_name: str


def settings_from_env() -> Settings:
    driver = os.environ.get("RIVER_CONFORMANCE_DRIVER", "")
    url = os.environ.get("RIVER_CONFORMANCE_DATABASE_URL", "")
    if driver not in ("postgres", "sqlite"):
        raise SystemExit(f"unsupported RIVER_CONFORMANCE_DRIVER {driver!r}")
    if not url:
        raise SystemExit("RIVER_CONFORMANCE_DATABASE_URL is required")
    name = os.environ.get("RIVER_CONFORMANCE_APPLICATION_NAME", "")
    if driver == "postgres" and name:
        url = _with_query(url, "application_name", name)
    elif driver == "sqlite" and not url.startswith("sqlite:"):
        url = "sqlite://" + (url if url.startswith("/") else os.path.abspath(url))
    return Settings(driver=driver, database_url=url, application_name=name)


def _with_query(url: str, key: str, value: str) -> str:
    parts = urllib.parse.urlsplit(url)
    pair = f"{key}={urllib.parse.quote(value, safe='')}"
    return urllib.parse.urlunsplit(
        parts._replace(query=f"{parts.query}&{pair}" if parts.query else pair)
    )


@attrs.define
class OpenTx:
    """A transaction held open by its own task until ``tx_end`` says how it ends."""

    executor: Executor
    decide: anyio.abc.ObjectSendStream[bool]
    outcome: anyio.abc.ObjectReceiveStream[BaseException | None]


@attrs.define
class Running:
    """The worker client ``start`` started."""

    run: river.ClientRun
    stats: Stats
    claim_barrier: str
    done: anyio.Event
    failure: list[BaseException]


class Server:
    """Handles the contract's methods for one database."""

    def __init__(self, settings: Settings, stack: contextlib.AsyncExitStack) -> None:
        self._settings = settings
        self._stack = stack
        self._driver: Driver | None = None
        self._clients: dict[str, river.Client] = {}
        self._txs: dict[str, OpenTx] = {}
        self._barriers = Barriers()
        self._running: Running | None = None

    # --- plumbing -------------------------------------------------------------------------

    async def driver(self, schema: str) -> Driver:
        """The database's one driver (opened on first use) under ``schema`` ("": the URL's
        search_path on PostgreSQL, ``main`` on SQLite)."""
        driver = self._driver
        if driver is None:
            options: dict[str, Any] = {}
            if self._settings.driver == "postgres":
                options["pool_max_size"] = POOL_MAX_SIZE
            driver = await self._stack.enter_async_context(
                open_driver(self._settings.database_url, **options)
            )
            self._driver = driver
        return driver.with_schema(schema or None)

    async def client(self, schema: str) -> river.Client:
        client = self._clients.get(schema)
        if client is None:
            driver = await self.driver(schema)
            client = river.Client(driver, id="conformance-api", max_attempts=25)
            self._clients[schema] = client
        return client

    def tx(self, name: str | None) -> Executor | None:
        if not name:
            return None
        open_tx = self._txs.get(name)
        if open_tx is None:
            raise not_found(f'transaction "{name}" is not open')
        return open_tx.executor

    async def handle(self, method: str, raw: Any, tg: anyio.abc.TaskGroup) -> Any:
        params = decode_params(method, raw)
        if method == "handshake":
            return {
                "driver": self._settings.driver,
                "implementation": "river_anyio",
                "version": river.__version__,
            }
        if method == "insert":
            return await self.insert(params)
        if method in ("cancel", "retry"):
            return await self.job(method, params)
        if method == "list":
            return await self.list(params)
        if method == "migrate":
            return await self.migrate(params)
        if method == "queue":
            await self.queue(params)
            return {}
        if method == "release":
            self._barriers.release(params.get("name", ""))
            return {}
        if method == "request_resign":
            await self.request_resign(params)
            return {}
        if method == "start":
            await self.start(params, tg)
            return {}
        if method == "stats":
            if self._running is None:
                raise ProtocolError(CODE_REJECTED, "no client is running")
            return self._running.stats.snapshot()
        if method == "stop":
            if self._running is None:
                raise ProtocolError(CODE_REJECTED, "no client is running")
            await self.stop(cancel=params.get("cancel", False))
            return {}
        if method == "tx_begin":
            await self.tx_begin(params, tg)
            return {}
        if method == "tx_end":
            await self.tx_end(params)
            return {}
        raise ProtocolError(CODE_INTERNAL, f"unhandled method {method!r}")

    # --- jobs ---------------------------------------------------------------------------------

    async def insert(self, params: dict[str, Any]) -> Any:
        client = await self.client(params.get("schema", ""))
        tx = self.tx(params.get("tx"))
        many = [
            river.InsertManyParams(
                EchoArgs(
                    behavior=job.get("behavior", ""),
                    duration_ms=job.get("duration_ms", 0),
                    message=job.get("message", ""),
                ),
                insert_opts(job.get("opts")),
            )
            for job in params.get("jobs", [])
        ]
        if tx is not None:
            results = await client.insert_many_tx(tx, many)
        else:
            results = await client.insert_many(many)
        return {
            "results": [
                {
                    "job": job_json(r.job),
                    "unique_skipped_as_duplicate": r.unique_skipped_as_duplicate,
                }
                for r in results
            ]
        }

    async def job(self, method: str, params: dict[str, Any]) -> Any:
        client = await self.client(params.get("schema", ""))
        tx = self.tx(params.get("tx"))
        job_id = params.get("id", 0)
        if method == "cancel":
            row = await (
                client.jobs.cancel_tx(tx, job_id) if tx is not None else client.jobs.cancel(job_id)
            )
        else:
            row = await (
                client.jobs.retry_tx(tx, job_id) if tx is not None else client.jobs.retry(job_id)
            )
        return job_json(row)

    async def list(self, params: dict[str, Any]) -> Any:
        client = await self.client(params.get("schema", ""))
        tx = self.tx(params.get("tx"))
        options: dict[str, Any] = {}
        if params.get("after"):
            try:
                options["after"] = river.JobListCursor.decode(params["after"])
            except river.ValidationError as exc:
                raise invalid(f"invalid cursor: {exc}") from None
        for field in ("ids", "kinds", "priorities", "queues", "states", "tags_all"):
            if params.get(field):
                options[field] = params[field]
        if params.get("limit", 0) > 0:
            options["limit"] = params["limit"]
        if params.get("metadata") is not None:
            options["metadata"] = json.dumps(params["metadata"])
        direction = params.get("direction") or "asc"
        if direction not in ("asc", "desc"):
            raise invalid(f'unknown direction "{direction}"')
        options["order"] = direction
        options["order_by"] = params.get("order_by") or "id"
        if tx is not None:
            listed = await client.jobs.list_tx(tx, **options)
        else:
            listed = await client.jobs.list(**options)
        cursor = None if listed.last_cursor is None else listed.last_cursor.encode()
        return {"cursor": cursor, "jobs": [job_json(row) for row in listed.jobs]}

    # --- schema, queues, leadership -----------------------------------------------------------

    async def migrate(self, params: dict[str, Any]) -> Any:
        direction = params.get("direction") or "up"
        if direction not in ("up", "down"):
            raise invalid(f'unknown direction "{direction}"')
        driver = await self.driver(params.get("schema", ""))
        target = params.get("target_version")
        migrator = Migrator(driver)
        if direction == "down" and target is None:
            result = await migrator.migrate("down", max_steps=1)
        else:
            result = await migrator.migrate(direction, target_version=target)
        return {"versions": [v.version for v in result.versions]}

    async def queue(self, params: dict[str, Any]) -> None:
        client = await self.client(params.get("schema", ""))
        tx = self.tx(params.get("tx"))
        action = params.get("action", "")
        name = params.get("name", "")
        if action == "pause":
            await (client.queues.pause_tx(tx, name) if tx else client.queues.pause(name))
        elif action == "resume":
            await (client.queues.resume_tx(tx, name) if tx else client.queues.resume(name))
        elif action == "update":
            metadata = params.get("metadata")
            if tx is not None:
                await client.queues.update_tx(tx, name, metadata=metadata)
            else:
                await client.queues.update(name, metadata=metadata)
        else:
            raise invalid(f'unknown queue action "{action}"')

    async def request_resign(self, params: dict[str, Any]) -> None:
        client = await self.client(params.get("schema", ""))
        tx = self.tx(params.get("tx"))
        if tx is not None:
            await client.request_resign_tx(tx)
        else:
            await client.request_resign()

    # --- the worker client --------------------------------------------------------------------

    async def start(self, params: dict[str, Any], tg: anyio.abc.TaskGroup) -> None:
        if self._running is not None:
            raise ProtocolError(CODE_REJECTED, "a client is already running")
        stats = Stats()
        config = worker_config(params, self._barriers, stats)
        driver = await self.driver(params.get("schema", ""))
        claim_barrier = params.get("claim_barrier", "")
        if claim_barrier:
            config = attrs.evolve(
                config, hooks=(*config.hooks, ClaimBarrierHook(self._barriers, claim_barrier))
            )
        running: Running = await tg.start(self._run_worker, driver, config, stats, claim_barrier)
        self._running = running

    async def _run_worker(
        self,
        driver: Driver,
        config: river.Config,
        stats: Stats,
        claim_barrier: str,
        *,
        task_status: anyio.abc.TaskStatus[Running],
    ) -> None:
        done = anyio.Event()
        failure: list[BaseException] = []
        try:
            async with river.open_client(driver, config) as run:
                with run.subscribe(*EVENT_KINDS) as events:
                    async with anyio.create_task_group() as consumers:
                        consumers.start_soon(_consume, events, stats)
                        task_status.started(Running(run, stats, claim_barrier, done, failure))
                        await run.wait_stopping()
                        await run.wait()
                        consumers.cancel_scope.cancel("the client stopped")
        except Exception as exc:
            if not done.is_set() and not failure and task_status is not None:
                failure.append(exc)
            logger.exception("the worker client failed")
        finally:
            done.set()

    async def stop(self, *, cancel: bool) -> None:
        running = self._running
        assert running is not None
        self._running = None
        if running.claim_barrier:
            self._barriers.release(running.claim_barrier)
        if cancel:
            running.run.stop_and_cancel()
        else:
            running.run.stop(STOP_TIMEOUT)
        with anyio.move_on_after(STOP_TIMEOUT + 5):
            await running.done.wait()
        if running.failure:
            raise running.failure[0]

    # --- transactions -------------------------------------------------------------------------

    async def tx_begin(self, params: dict[str, Any], tg: anyio.abc.TaskGroup) -> None:
        name = params.get("tx", "")
        if not name:
            raise invalid("tx is required")
        if name in self._txs:
            raise ProtocolError(CODE_REJECTED, f'transaction "{name}" is already open')
        driver = await self.driver("")
        self._txs[name] = await tg.start(_hold_tx, driver)

    async def tx_end(self, params: dict[str, Any]) -> None:
        name = params.get("tx", "")
        self.tx(name)
        open_tx = self._txs.pop(name)
        await open_tx.decide.send(params.get("commit", False))
        failure = await open_tx.outcome.receive()
        if failure is not None:
            raise failure

    async def shutdown(self) -> None:
        if self._running is not None:
            with contextlib.suppress(Exception):
                await self.stop(cancel=True)
        for name in list(self._txs):
            open_tx = self._txs.pop(name)
            with contextlib.suppress(Exception):
                await open_tx.decide.send(False)
                await open_tx.outcome.receive()


class _Rollback(Exception):
    """Raised inside a held transaction to roll it back."""


async def _hold_tx(driver: Driver, *, task_status: anyio.abc.TaskStatus[OpenTx]) -> None:
    decide_send, decide_receive = anyio.create_memory_object_stream[bool](1)
    outcome_send, outcome_receive = anyio.create_memory_object_stream[BaseException | None](1)
    failure: BaseException | None = None
    try:
        async with driver.transaction() as tx:
            task_status.started(OpenTx(tx, decide_send, outcome_receive))
            commit = await decide_receive.receive()
            if not commit:
                raise _Rollback
    except _Rollback:
        pass
    except Exception as exc:
        failure = exc
    await outcome_send.send(failure)


async def _consume(events: river.Subscription, stats: Stats) -> None:
    async for event in events:
        stats.events.append(str(event.kind.value))


class ClaimBarrierHook:
    """Holds the client's first claim that finds jobs until the barrier is released (River
    Go's adapter: a pilot holding the claim): the claim has committed and its jobs wait to
    start while the producer goes on hearing notifications, such as a remote cancel. A stop
    releases the barrier."""

    def __init__(self, barriers: Barriers, name: str) -> None:
        self._barriers = barriers
        self._name = name
        self._waited = False

    async def jobs_claimed(self, rows: Sequence[river.JobRow]) -> None:
        if self._waited or not rows:
            return
        self._waited = True
        await self._barriers.wait(self._name)


def _ms(value: int) -> dt.timedelta:
    return dt.timedelta(milliseconds=value)


def insert_opts(opts: dict[str, Any] | None) -> river.InsertOpts | None:
    if not opts:
        return None
    unique = None
    if opts.get("unique") is not None:
        u = opts["unique"]
        unique = river.UniqueOpts(
            by_args=u.get("by_args", False),
            by_period=_ms(u["by_period_ms"]) if u.get("by_period_ms") else None,
            by_queue=u.get("by_queue", False),
            by_state=u.get("by_state") or None,
            exclude_kind=u.get("exclude_kind", False),
        )
    metadata = opts.get("metadata")
    return river.InsertOpts(
        max_attempts=opts.get("max_attempts") or None,
        priority=opts.get("priority") or None,
        queue=opts.get("queue") or None,
        scheduled_at=opts.get("scheduled_at"),
        pending=opts.get("pending", False),
        tags=opts.get("tags") or None,
        metadata=metadata,
        unique=unique,
    )


def worker_config(params: dict[str, Any], barriers: Barriers, stats: Stats) -> river.Config:
    workers = river.Workers()
    worker = EchoWorker(barriers, stats)
    for kind in params.get("worker_kinds") or [KIND_ECHO]:
        args_cls = ARGS_BY_KIND.get(kind)
        if args_cls is None:
            raise invalid(f'unknown worker kind "{kind}"')
        workers.add(args_cls, worker)
    max_workers = params.get("max_workers") or 4
    queues = {
        q: river.QueueConfig(max_workers=max_workers) for q in params.get("queues") or ["default"]
    }
    tuning = params.get("tuning") or {}
    maintenance: dict[str, Any] = {}
    if params.get("rescue_after_ms"):
        maintenance["rescue_after"] = _ms(params["rescue_after_ms"])
    if tuning.get("rescuer_interval_ms"):
        maintenance["rescuer_interval"] = _ms(tuning["rescuer_interval_ms"])
    if tuning.get("scheduler_interval_ms"):
        maintenance["scheduler_interval"] = _ms(tuning["scheduler_interval_ms"])
    options: dict[str, Any] = {
        "queues": queues,
        "workers": workers,
        "fetch_cooldown": 0.001,
        "fetch_only_known_kinds": params.get("fetch_only_known_kinds", False),
        "leader_election_disabled": params.get("leader_election_disabled", False),
        "poll_only": params.get("poll_only", False),
        "maintenance": river.MaintenanceConfig(**maintenance),
        "hooks": [PeriodicStartHook(stats)],
    }
    if params.get("client_id"):
        options["id"] = params["client_id"]
    if params.get("fetch_poll_interval_ms"):
        options["fetch_poll_interval"] = _ms(params["fetch_poll_interval_ms"])
    if params.get("job_timeout_ms"):
        options["job_timeout"] = _ms(params["job_timeout_ms"])
    if params.get("error_handler_cancel"):
        options["error_handler"] = CancellingErrorHandler(stats)
    if params.get("retry_delay_ms", 0) > 0:
        options["retry_policy"] = FixedRetryPolicy(_ms(params["retry_delay_ms"]))
    if params.get("periodic_unique") and not params.get("periodic_run_on_start"):
        raise invalid("periodic_unique requires periodic_run_on_start")
    if params.get("periodic_run_on_start"):
        unique = params.get("periodic_unique", False)
        jobs = [_periodic(PERIODIC_JOB_ID, "periodic run on start", unique=unique)]
        if unique:
            jobs.append(_periodic(PERIODIC_MARKER_JOB_ID, "periodic marker", unique=False))
        options["periodic_jobs"] = jobs
    return river.Config(**options)


def _periodic(job_id: str, message: str, *, unique: bool) -> river.PeriodicJob:
    opts = river.InsertOpts(
        metadata={"periodic": True},
        unique=river.UniqueOpts(by_args=True, by_queue=True) if unique else None,
    )
    return river.PeriodicJob(
        river.every(dt.timedelta(hours=1)),
        lambda: EchoArgs(message=message),
        opts=opts,
        id=job_id,
        run_on_start=True,
    )


class PeriodicStartHook:
    """Counts starts of the client's periodic job enqueuer."""

    def __init__(self, stats: Stats) -> None:
        self._stats = stats

    def periodic_jobs_start(self, params: river.PeriodicJobsStartParams) -> None:
        self._stats.periodic_starts += 1


# --- the transport ---------------------------------------------------------------------------


def _error_response(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}, "id": request_id, "jsonrpc": "2.0"}


def _code_for(exc: BaseException) -> int:
    if isinstance(exc, ProtocolError):
        return exc.code
    if isinstance(exc, river.NotFoundError):
        return CODE_NOT_FOUND
    return CODE_REJECTED


async def respond(server: Server, line: bytes, tg: anyio.abc.TaskGroup) -> dict[str, Any]:
    try:
        request = json.loads(line)
        if not isinstance(request, dict):
            raise ValueError("a request must be an object")
    except ValueError as exc:
        return _error_response(0, CODE_PARSE_ERROR, str(exc))
    request_id = request.get("id", 0)
    if request.get("jsonrpc") != "2.0":
        return _error_response(request_id, CODE_INVALID_REQUEST, "jsonrpc must be 2.0")
    method = request.get("method")
    try:
        result = await server.handle(str(method), request.get("params"), tg)
    except Exception as exc:
        message = exc.message if isinstance(exc, ProtocolError) else str(exc) or repr(exc)
        if not isinstance(exc, ProtocolError | river.RiverError):
            logger.warning("%s failed", method, exc_info=True)
        return _error_response(request_id, _code_for(exc), message)
    return {"id": request_id, "jsonrpc": "2.0", "result": result}


async def _lines(fd: int) -> AsyncIterator[bytes]:
    """The lines read from ``fd`` until its end, read on the event loop when it is readable:
    the harness times every request's round trip, and a thread's hand-off per line (as
    ``anyio.wrap_file`` reads) added to each, more so while the loop is busy working jobs."""
    os.set_blocking(fd, False)
    buffer = b""
    while True:
        await anyio.wait_readable(fd)
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            continue
        if not data:
            if buffer:
                yield buffer
            return
        *lines, buffer = (buffer + data).split(b"\n")
        for line in lines:
            yield line


async def serve(settings: Settings) -> None:
    stdout = sys.stdout.buffer
    async with contextlib.AsyncExitStack() as stack:
        async with anyio.create_task_group() as tg:
            server = Server(settings, stack)
            lines = _lines(sys.stdin.fileno())
            async with contextlib.aclosing(lines):
                async for line in lines:
                    if not line.strip():
                        continue
                    response = await respond(server, line, tg)
                    data = json.dumps(response, separators=(",", ":"), ensure_ascii=False)
                    stdout.write(data.encode() + b"\n")
                    stdout.flush()
            with anyio.CancelScope(shield=True), anyio.move_on_after(25):
                await server.shutdown()
            tg.cancel_scope.cancel("stdin closed: the adapter is leaving")


def main() -> None:
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    settings = settings_from_env()
    backend = os.environ.get("RIVER_ANYIO_CONFORMANCE_BACKEND", "asyncio")
    # What is imported by now lives as long as the process: kept out of the cyclic
    # collector's full collections, as long-running services do, so that one of them does not
    # hold the event loop for 15-20 ms (all of them walked) in the middle of a scenario, such
    # as the harness's benchmarks of a few hundred 10 ms jobs.
    gc.freeze()
    anyio.run(serve, settings, backend=backend)
