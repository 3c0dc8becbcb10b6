"""The client: inserting jobs, on a driver opened from a URL or brought by the caller.

``open_client`` is the entry point::

    async with river_anyio.open_client("sqlite://jobs.db") as run:
        await run.client.insert(SendEmail(to="a@example.com"))
"""

from __future__ import annotations

import contextlib
import datetime as dt
import inspect
import logging
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio.lowlevel

from ._errors import ConfigError, ValidationError
from ._insert import InsertManyParams, build_insert_params
from ._job import InsertOpts, InsertResult, JobState
from ._jobs_api import JobsAPI
from ._lease import Lease, check_lease_name, lease_ttl_seconds, take_lease
from ._limiter import KeyedBurstLimiter
from ._periodic import PeriodicJob, PeriodicJobs
from ._queues_api import LocalQueues, QueuesAPI
from ._runtime._lease import hold_lease
from ._sqlalchemy import async_dbapi_connection, is_async_sqlalchemy
from ._timeutil import utc_now
from ._wait import JobWaiters
from .drivers import TOPIC_INSERT, TOPIC_LEADERSHIP, Driver, Executor, JobInsertParams

__all__ = ["Client", "default_client_id"]

logger = logging.getLogger("river_anyio.client")

_SCHEMA_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_ID_MAX = 100
#: Rows of an ``insert_many`` built between two checkpoints (about 1.5 ms of the loop's time).
_BUILD_ROWS = 500
#: River's FetchCooldown default: insert notifications per queue are limited per this window
#: (see :mod:`river_anyio._limiter` for the burst allowance).
NOTIFY_COOLDOWN = 0.1
#: River's leadership notification asking the leader to resign, as River Go encodes it.
REQUEST_RESIGN_PAYLOAD = '{"action":"request_resign","leader_id":""}'


def default_client_id(now: dt.datetime | None = None) -> str:
    """River's default client ID: host name (``.`` → ``_``, ≤ 60 chars) and UTC start time."""
    host = socket.gethostname().replace(".", "_")[:60] or "unknown_host"
    now = now or utc_now()
    return f"{host}_{now.astimezone(dt.UTC).strftime('%Y_%m_%dT%H_%M_%S_%f')}"


def _validate_schema(schema: object) -> str | None:
    if schema is None:
        return None
    if not isinstance(schema, str) or not _SCHEMA_RE.match(schema) or len(schema) > 46:
        raise ConfigError(
            "schema", "must match ^[a-zA-Z_][a-zA-Z0-9_]*$ and be at most 46 characters", schema
        )
    return schema


def _validate_id(client_id: object) -> str:
    if not isinstance(client_id, str) or not client_id:
        raise ConfigError("id", "must be a non-empty str", client_id)
    if len(client_id) > _ID_MAX:
        raise ConfigError("id", f"ID cannot be longer than {_ID_MAX} characters", client_id)
    return client_id


class Client:
    """Inserts jobs, and manages jobs and queues (``jobs``, ``queues``, ``local_queues``).

    Obtained from :func:`open_client` as ``run.client``, or built on a driver to insert and
    manage jobs without working them.
    """

    def __init__(
        self,
        driver: Driver,
        *,
        id: str,
        max_attempts: int,
        middleware: Sequence[Any] = (),
        hooks: Sequence[Any] = (),
        periodic_jobs: Sequence[PeriodicJob] = (),
        never_leader: bool = False,
        database_url: str | None = None,
    ) -> None:
        self._driver = driver
        #: The URL the client was opened with, for error messages (shown redacted).
        self._database_url = database_url
        self._id = id
        self._max_attempts = max_attempts
        self._insert_middleware = [
            m.insert for m in middleware if callable(getattr(m, "insert", None))
        ]
        self._insert_hooks = [
            h.insert_begin for h in hooks if callable(getattr(h, "insert_begin", None))
        ]
        self._limiter = KeyedBurstLimiter(NOTIFY_COOLDOWN)
        self._periodic_jobs = PeriodicJobs(periodic_jobs, never_leader=never_leader)
        #: Set by a running client: wakes its own producers after a committed insert.
        self._after_insert: Callable[[set[str]], None] | None = None
        #: ``jobs.wait`` calls in progress, woken when this client finalizes their job
        self._job_waiters = JobWaiters()
        # --- job and queue APIs ---
        #: Set by a running client that does not listen for notifications: applies a control
        #: action (cancel, pause, resume) to its own producers at once, as River does.
        self._local_control: Callable[[str, dict[str, Any]], None] | None = None
        #: River's job API (get, list, cancel, retry, delete, update; ``*_tx`` twins).
        self.jobs = JobsAPI(self)
        #: River's queue API (get, list, pause, resume, update; ``*_tx`` twins).
        self.queues = QueuesAPI(self)
        #: The queues this client works, added and removed while it runs.
        self.local_queues = LocalQueues(self)

    def _control_local(self, queue: str, payload: dict[str, Any]) -> None:
        if self._local_control is not None:
            self._local_control(queue, payload)

    @property
    def id(self) -> str:
        return self._id

    @property
    def driver(self) -> Driver:
        return self._driver

    @property
    def periodic_jobs(self) -> PeriodicJobs:
        """The periodic jobs this client inserts while it is the leader; add and remove them
        at any time (River's ``PeriodicJobs()``)."""
        return self._periodic_jobs

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Executor]:
        """A transaction on the client's database, for ``*_tx`` calls and your own queries."""
        return self._driver.transaction()

    # --- leadership -------------------------------------------------------------------------

    async def request_resign(self) -> None:
        """Ask the current leader to resign (River's ``Notify().RequestResign``): a
        ``request_resign`` notification on River's leadership topic, sent in a transaction of
        its own. Whichever client leads, River Go's or river_anyio's, resigns and takes part
        in the next election; nothing happens when no client leads. A leader that only polls
        (``poll_only``) does not hear it."""
        async with self._driver.transaction() as tx:
            await tx.notify_many(TOPIC_LEADERSHIP, [REQUEST_RESIGN_PAYLOAD])

    async def request_resign_tx(self, tx: object) -> None:
        """:meth:`request_resign` inside the caller's transaction: sent when it commits,
        never if it rolls back."""
        await self._driver.executor_for(tx).notify_many(TOPIC_LEADERSHIP, [REQUEST_RESIGN_PAYLOAD])

    # --- leases -----------------------------------------------------------------------------

    async def with_lease(
        self, name: str, fn: Callable[[], Awaitable[object]], *, ttl: float | dt.timedelta
    ) -> bool:
        """Run ``fn()`` (async, no arguments) if this call takes the lease ``name``: True when
        it ran, False, silently, when the lease is held.

        The lease lasts ``ttl`` (seconds or a timedelta) from when it was taken and is not
        released when ``fn`` returns, so a replica that fires a little later also skips;
        a holder that crashed frees it when its term passes. Exceptions of ``fn`` propagate.
        Needs migration line ``river_anyio`` (``auto_migrate`` installs it).
        """
        name = check_lease_name(name)
        seconds = lease_ttl_seconds(ttl)
        if not callable(fn):
            raise ValidationError("fn", "must be an async callable taking no arguments", fn)
        row = await take_lease(
            self._driver, name=name, holder=self._id, ttl=seconds, database_url=self._database_url
        )
        if row is None:
            return False
        result = fn()
        if not inspect.isawaitable(result):
            raise ValidationError(
                "fn", "must be an async callable (it returned a non-awaitable)", fn
            )
        await result
        return True

    def lease(
        self, name: str, *, ttl: float | dt.timedelta
    ) -> contextlib.AbstractAsyncContextManager[Lease | None]:
        """Hold the lease ``name`` across a block: ``async with client.lease(name, ttl=30) as
        held:`` gives a :class:`Lease`, or None when someone else holds it (the block still
        runs; check it). A held lease is renewed every third of ``ttl`` while the block runs
        and released when it ends; if it cannot be renewed before its term ends, the block
        is cancelled and :class:`LeaseLostError` raised.
        """
        name = check_lease_name(name)
        seconds = lease_ttl_seconds(ttl)
        return hold_lease(
            self._driver,
            name=name,
            holder=self._id,
            ttl=seconds,
            database_url=self._database_url,
        )

    # --- building ---------------------------------------------------------------------------

    def _params(
        self, args: object, opts: InsertOpts | None, field: str = "args"
    ) -> JobInsertParams:
        return build_insert_params(
            args, opts, client_max_attempts=self._max_attempts, now=utc_now, field=field
        )

    async def _many(self, items: Sequence[object]) -> list[JobInsertParams]:
        """The rows of a batch; a large one lets the event loop's other tasks run every
        :data:`_BUILD_ROWS` rows (5,000 took it for 15 ms in one go)."""
        if isinstance(items, str | bytes) or not isinstance(items, Sequence):
            raise ValidationError("params", "must be a sequence of args or InsertManyParams", items)
        if not items:
            raise ValidationError("params", "no jobs to insert", items)
        out = []
        for i, item in enumerate(items):
            if i and not i % _BUILD_ROWS:
                await anyio.lowlevel.checkpoint()
            if isinstance(item, InsertManyParams):
                out.append(self._params(item.args, item.opts, f"params[{i}].args"))
            else:
                out.append(self._params(item, None, f"params[{i}]"))
        return out

    async def _notify(self, ex: Executor, params: Sequence[JobInsertParams]) -> None:
        await self._notify_queues(ex, {p.queue for p in params if p.state == JobState.AVAILABLE})

    async def _notify_queues(self, ex: Executor, queues: set[str]) -> None:
        """Insert notifications for ``queues`` in ``ex``'s transaction, through this client's
        per-queue limiter (also used by the leader's scheduler, as River's)."""
        payloads = [f'{{"queue": "{q}"}}' for q in sorted(queues) if self._limiter.try_acquire(q)]
        if payloads and self._driver.supports_listen_notify:
            await ex.notify_many(TOPIC_INSERT, payloads)

    def _insert_payloads(self, params: Sequence[JobInsertParams]) -> list[str]:
        """The insert notifications ``params`` call for (as :meth:`_notify` sends them)."""
        queues = {p.queue for p in params if p.state == JobState.AVAILABLE}
        payloads = [f'{{"queue": "{q}"}}' for q in sorted(queues) if self._limiter.try_acquire(q)]
        return payloads if self._driver.supports_listen_notify else []

    async def _through_middleware(
        self, params: Sequence[JobInsertParams], insert: Callable[[Sequence[JobInsertParams]], Any]
    ) -> Any:
        """Insert hooks (observers: a raising one is logged and ignored), then the insert
        middleware chain (``async def insert(self, params, next)``, outermost first)."""
        for hook in self._insert_hooks:
            for p in params:
                try:
                    res = hook(p)
                    if inspect.isawaitable(res):
                        await res
                except Exception:
                    logger.exception(
                        "insert_begin hook raised; ignored",
                        extra={
                            "river_event": "insert_hook_failed",
                            "river_client_id": self._id,
                            "river_job_kind": p.kind,
                            "river_queue": p.queue,
                        },
                    )
        call = insert
        for mw in reversed(self._insert_middleware):
            call = _wrap_insert(mw, call)
        return await call(params)

    async def _insert_many_on(
        self, ex: Executor, params: Sequence[JobInsertParams]
    ) -> list[InsertResult]:
        async def insert(ps: Sequence[JobInsertParams]) -> list[InsertResult]:
            inserted = await ex.job_insert_fast_many(ps)
            await self._notify(ex, ps)
            return [
                InsertResult(job=r.job, unique_skipped_as_duplicate=r.unique_skipped_as_duplicate)
                for r in inserted
            ]

        if not self._insert_hooks and not self._insert_middleware:
            return await insert(params)
        return list(await self._through_middleware(params, insert))

    async def _insert_fast_on(self, ex: Executor, params: Sequence[JobInsertParams]) -> int:
        async def insert(ps: Sequence[JobInsertParams]) -> int:
            count = await ex.job_insert_fast_many_no_returning(ps)
            await self._notify(ex, ps)
            return count

        if not self._insert_hooks and not self._insert_middleware:
            return await insert(params)
        return int(await self._through_middleware(params, insert))

    # --- public API -------------------------------------------------------------------------

    def _committed(self, params: Sequence[JobInsertParams]) -> None:
        if self._after_insert is not None:
            self._after_insert({p.queue for p in params if p.state == JobState.AVAILABLE})

    async def _insert_many_own(self, params: Sequence[JobInsertParams]) -> list[InsertResult]:
        """Insert in a transaction of its own, with the insert notifications."""
        if self._insert_middleware:  # a middleware failing after the insert rolls it back
            async with self._driver.transaction() as tx:
                results = await self._insert_many_on(tx, params)
        else:
            # one statement, the notifications included: a single round trip
            ex = self._driver.executor()

            async def insert(ps: Sequence[JobInsertParams]) -> list[InsertResult]:
                inserted = await ex.job_insert_fast_many_notify(
                    ps, topic=TOPIC_INSERT, payloads=self._insert_payloads(ps)
                )
                return [
                    InsertResult(
                        job=r.job, unique_skipped_as_duplicate=r.unique_skipped_as_duplicate
                    )
                    for r in inserted
                ]

            if self._insert_hooks:
                results = list(await self._through_middleware(params, insert))
            else:
                results = await insert(params)
        self._committed(params)
        return results

    async def insert(self, args: object, opts: InsertOpts | None = None) -> InsertResult:
        """Insert one job in its own transaction; a unique duplicate returns the existing job."""
        return (await self._insert_many_own([self._params(args, opts)]))[0]

    async def insert_tx(
        self, tx: object, args: object, opts: InsertOpts | None = None
    ) -> InsertResult:
        """Insert one job inside the caller's transaction (visible and notified at its commit).

        ``tx``: a transaction of this client, a psycopg ``AsyncConnection`` (asyncio) or
        :class:`~river_anyio.drivers.postgres.AnyioConnection`, or under asyncio an SQLAlchemy
        ``AsyncConnection``/``AsyncSession`` on ``postgresql+psycopg`` (its transaction,
        begun if none is open).
        """
        params = [self._params(args, opts)]
        if is_async_sqlalchemy(tx):
            tx = await async_dbapi_connection(tx)
        return (await self._insert_many_on(self._driver.executor_for(tx), params))[0]

    async def insert_many(self, params: Sequence[object]) -> list[InsertResult]:
        """Insert a batch in one statement and one transaction; results in input order.

        A batch holding one unique key twice is refused (:class:`ValidationError`), as River
        refuses it: which job would be the other's duplicate is not defined.
        """
        return await self._insert_many_own(await self._many(params))

    async def insert_many_tx(self, tx: object, params: Sequence[object]) -> list[InsertResult]:
        built = await self._many(params)
        if is_async_sqlalchemy(tx):
            tx = await async_dbapi_connection(tx)
        return await self._insert_many_on(self._driver.executor_for(tx), built)

    async def insert_many_fast(self, params: Sequence[object]) -> int:
        """Insert a batch without returning rows (the bulk path); returns the count inserted.

        On PostgreSQL this uses COPY, so a unique conflict (with a stored job or within the
        batch) fails the whole batch, as in River; SQLite skips the conflicting jobs.
        """
        built = await self._many(params)
        async with self._driver.transaction() as tx:
            count = await self._insert_fast_on(tx, built)
        self._committed(built)
        return count

    async def insert_many_fast_tx(self, tx: object, params: Sequence[object]) -> int:
        built = await self._many(params)
        if is_async_sqlalchemy(tx):
            tx = await async_dbapi_connection(tx)
        return await self._insert_fast_on(self._driver.executor_for(tx), built)


def _wrap_insert(
    mw: Callable[..., Any], nxt: Callable[[Sequence[JobInsertParams]], Any]
) -> Callable[[Sequence[JobInsertParams]], Any]:
    async def call(params: Sequence[JobInsertParams]) -> Any:
        return await mw(params, nxt)

    return call
