"""The job API (``client.jobs``): River's JobGet, JobList, JobCancel, JobRetry, JobDelete,
JobDeleteMany and JobUpdate.

Every call runs on the client's own database (each in its own unit of work) and has a
``*_tx`` twin that runs inside the caller's transaction (one of ours, or under asyncio a stock
psycopg ``AsyncConnection``), taking effect, notifications included, when it commits.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import datetime as dt
import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, TypedDict, Unpack

import anyio
import attrs

from . import _gojson as gojson
from ._api_common import ClientAPI, validate_limit
from ._errors import (
    DatabaseError,
    JobRunningError,
    JobWaitTimeoutError,
    NotFoundError,
    ValidationError,
)
from ._job import FINALIZED_STATES, JobRow, JobState
from ._timeutil import format_rfc3339nano, parse_rfc3339, utc_now
from .drivers import JobListQuery

__all__ = [
    "MAX_OUTPUT_BYTES",
    "JobListCursor",
    "JobListOptions",
    "JobListResult",
    "JobsAPI",
    "encode_output",
    "metadata_updates",
]

logger = logging.getLogger("river_anyio.client")

#: ``jobs.wait`` reads the row again after this, doubling up to its ``poll_interval``.
WAIT_FIRST_POLL: Final = 0.05

#: River's limit on a job's recorded output (32 MiB of encoded JSON).
MAX_OUTPUT_BYTES: Final = 32 * 1024 * 1024

OrderBy = Literal["id", "time", "scheduled_at", "finalized_at"]
_ORDER_FIELDS: Final = ("id", "time", "scheduled_at", "finalized_at")
_FINAL: Final = frozenset({JobState.CANCELLED, JobState.COMPLETED, JobState.DISCARDED})
#: Go's zero ``time.Time`` as it appears in a cursor: "no time".
_GO_ZERO_TIME: Final = "0001-01-01T00:00:00Z"
_ZERO: Final = dt.datetime(1, 1, 1, tzinfo=dt.UTC)


def encode_output(value: object) -> bytes:
    """A job output as JSON, within River's 32 MiB limit (River's error text otherwise)."""
    try:
        encoded = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise ValidationError("output", f"must be JSON-encodable: {exc}", value) from None
    if len(encoded) > MAX_OUTPUT_BYTES:
        raise ValidationError(
            "output", f"output is too large: {len(encoded)} bytes (max 32 MB)", len(encoded)
        )
    return encoded


def metadata_updates(metadata: object, field: str = "metadata") -> dict[str, Any]:
    """Validated user metadata updates: a mapping of str keys, none ``river:``-prefixed, with
    JSON-encodable values."""
    if not isinstance(metadata, Mapping):
        raise ValidationError(field, "must be a mapping of str keys to JSON values", metadata)
    out: dict[str, Any] = {}
    for key, value in metadata.items():
        if not isinstance(key, str) or key.startswith("river:"):
            raise ValidationError(field, "keys must be str and may not start with 'river:'", key)
        out[key] = value
    try:
        json.dumps(out, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(field, f"must be JSON-encodable: {exc}", metadata) from None
    return out


# --- listing --------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class JobListCursor:
    """Where a job list stopped: pass it as ``after=`` to get the next page.

    Its text form (``str(cursor)``, :meth:`decode`) is River's: URL-safe base64 of
    ``{"id", "kind", "queue", "sort_field", "time"}``, so cursors travel between River clients
    of any language. ``time`` is None when the order has no time or the row's was NULL.
    """

    id: int
    kind: str
    queue: str
    sort_field: str
    time: dt.datetime | None = None

    def encode(self) -> str:
        """River's text of this cursor, byte for byte: its JSON is Go's ``json.Marshal``'s
        (``<``, ``>``, ``&``, U+2028 and U+2029 escaped), so both write the same cursor for the
        same page."""
        doc = {
            "id": self.id,
            "kind": self.kind,
            "queue": self.queue,
            "sort_field": self.sort_field,
            "time": _GO_ZERO_TIME if self.time is None else format_rfc3339nano(self.time),
        }
        return base64.urlsafe_b64encode(gojson.encode(doc)).decode()

    def __str__(self) -> str:
        return self.encode()

    @classmethod
    def decode(cls, text: str) -> JobListCursor:
        """A cursor from its text form; ValidationError when it is not one."""
        try:
            doc = json.loads(base64.urlsafe_b64decode(text.encode()))
            if not isinstance(doc, dict):
                raise TypeError("not an object")
            job_id = doc["id"]
            if isinstance(job_id, bool) or not isinstance(job_id, int):
                raise TypeError("id is not an integer")
            raw_time = doc.get("time") or _GO_ZERO_TIME
            at = parse_rfc3339(raw_time)
            return cls(
                id=job_id,
                kind=str(doc.get("kind", "")),
                queue=str(doc.get("queue", "")),
                sort_field=str(doc.get("sort_field", "id")),
                time=None if at == _ZERO else at,
            )
        except (binascii.Error, ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
            raise ValidationError("after", f"is not a job list cursor: {exc}", text) from None


@attrs.frozen(kw_only=True)
class JobListResult:
    """A page of jobs and the cursor after its last one (None when the page is empty)."""

    jobs: list[JobRow]
    last_cursor: JobListCursor | None


def _time_field_for(state: JobState) -> str:
    if state is JobState.RUNNING:
        return "attempted_at"
    if state in _FINAL:
        return "finalized_at"
    return "scheduled_at"


def _time_of(job: JobRow, field: str) -> dt.datetime | None:
    value: dt.datetime | None = getattr(job, field)
    return value


@attrs.frozen
class _ListPlan:
    """A validated list request: what to ask the driver, and how to make cursors."""

    query: JobListQuery
    sort_field: str
    time_field: str | None

    def cursor(self, job: JobRow) -> JobListCursor:
        at = _time_of(job, self.time_field) if self.time_field else None
        return JobListCursor(
            id=job.id, kind=job.kind, queue=job.queue, sort_field=self.sort_field, time=at
        )


def _seq(value: object, field: str, kind: type | tuple[type, ...]) -> tuple[Any, ...] | None:
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | frozenset | set):
        raise ValidationError(field, "must be a sequence (or None for no filter)", value)
    items = tuple(value)
    if not items:
        raise ValidationError(field, "must not be empty (pass None for no filter)", value)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, kind):
            raise ValidationError(field, f"has an element of the wrong type: {item!r}", value)
    return items


def _states(value: object, field: str = "states") -> tuple[JobState, ...] | None:
    items = _seq(value, field, (str, JobState))
    if items is None:
        return None
    try:
        return tuple(JobState(s) for s in items)
    except ValueError:
        raise ValidationError(
            field, f"must be job states ({', '.join(s.value for s in JobState)})", value
        ) from None


def _job_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError("job_id", "must be an int", value)
    return value


class JobListOptions(TypedDict, total=False):
    """The filters, order and page of :meth:`JobsAPI.list` (River's ``JobListParams``), as
    typed keyword options: every filter unset by default, ``order_by="id"``,
    ``order="asc"``, ``limit=100``."""

    ids: Sequence[int] | None
    kinds: Sequence[str] | None
    priorities: Sequence[int] | None
    queues: Sequence[str] | None
    states: Sequence[JobState | str] | None
    tags_all: Sequence[str] | None
    tags_any: Sequence[str] | None
    metadata: Mapping[str, Any] | str | None
    order_by: OrderBy
    order: Literal["asc", "desc"]
    limit: int
    after: JobListCursor | str | JobRow | None


def _plan_list(
    *,
    dialect: str,
    ids: object = None,
    kinds: object = None,
    priorities: object = None,
    queues: object = None,
    states: object = None,
    tags_all: object = None,
    tags_any: object = None,
    metadata: object = None,
    order_by: object = "id",
    order: object = "asc",
    limit: object = 100,
    after: object = None,
) -> _ListPlan:
    if order_by not in _ORDER_FIELDS:
        raise ValidationError("order_by", f"must be one of {', '.join(_ORDER_FIELDS)}", order_by)
    if order not in ("asc", "desc"):
        raise ValidationError("order", "must be 'asc' or 'desc'", order)
    state_filter = _states(states)
    if order_by == "finalized_at":
        if state_filter is None:
            state_filter = (JobState.CANCELLED, JobState.COMPLETED, JobState.DISCARDED)
        unfinal = [s.value for s in state_filter if s not in _FINAL]
        if unfinal:
            raise ValidationError(
                "order_by",
                f"cannot order by finalized_at with non-finalized state filters {unfinal}",
                order_by,
            )
    encoded_meta: bytes | None = None
    if metadata is not None:
        if dialect != "postgres":
            raise ValidationError(
                "metadata", "JSON containment filters are supported on PostgreSQL only", metadata
            )
        if isinstance(metadata, str):
            try:
                json.loads(metadata)
            except ValueError as exc:
                raise ValidationError("metadata", f"is not JSON: {exc}", metadata) from None
            encoded_meta = metadata.encode()
        else:
            try:
                encoded_meta = json.dumps(metadata, allow_nan=False).encode()
            except (TypeError, ValueError) as exc:
                raise ValidationError("metadata", f"must be JSON: {exc}", metadata) from None
    # River's time column for the order, and whether it may be NULL in the rows listed
    time_field: str | None
    if order_by == "id":
        time_field = None
    elif order_by == "time":
        time_field = _time_field_for(state_filter[0] if state_filter else JobState.AVAILABLE)
    else:
        time_field = str(order_by)
    nullable = time_field == "attempted_at" or (
        time_field == "finalized_at"
        and (metadata is not None or not state_filter or any(s not in _FINAL for s in state_filter))
    )
    plan = _ListPlan(
        JobListQuery(
            ids=_seq(ids, "ids", int),
            kinds=_seq(kinds, "kinds", str),
            priorities=_seq(priorities, "priorities", int),
            queues=_seq(queues, "queues", str),
            states=state_filter,
            tags_all=_seq(tags_all, "tags_all", str),
            tags_any=_seq(tags_any, "tags_any", str),
            metadata=encoded_meta,
            order_by=time_field or "id",  # type: ignore[arg-type]
            descending=order == "desc",
            time_nullable=nullable,
            limit=validate_limit(limit),
        ),
        str(order_by),
        time_field,
    )
    if after is None:
        return plan
    if isinstance(after, str):
        after = JobListCursor.decode(after)
    if isinstance(after, JobRow):
        after = plan.cursor(after)
    if not isinstance(after, JobListCursor):
        raise ValidationError("after", "must be a JobListCursor, its text or a JobRow", after)
    if after.time is not None and (after.time.tzinfo is None or after.time.utcoffset() is None):
        raise ValidationError("after", "the cursor's time must be timezone-aware", after)
    return attrs.evolve(
        plan, query=attrs.evolve(plan.query, after_id=after.id, after_time=after.time)
    )


# --- the API --------------------------------------------------------------------------------


class JobsAPI(ClientAPI):
    """``client.jobs``: River's job API. See the module docs for the ``*_tx`` variants."""

    # get

    async def get(self, job_id: int) -> JobRow:
        """The job; :class:`NotFoundError` when there is none."""
        return await self._get(None, job_id)

    async def get_tx(self, tx: object, job_id: int) -> JobRow:
        return await self._get(tx, job_id)

    async def _get(self, tx: object | None, job_id: int) -> JobRow:
        return _found(await self._ex(tx).job_get_by_id(_job_id(job_id)), job_id)

    # wait

    async def wait(
        self,
        job_id: int,
        *,
        timeout: float | dt.timedelta | None = None,  # noqa: ASYNC109 (raises its own error)
        poll_interval: float | dt.timedelta = 1.0,
    ) -> JobRow:
        """Wait until the job is finalized (``completed``, ``cancelled`` or ``discarded``) and
        return its row; what the worker recorded with ``ctx.record_output`` is ``row.output``.

        Works on any client, one that works no queues included. The row is read at once,
        then again after 50 ms, doubling up to ``poll_interval`` seconds between reads; when
        this client finalizes the job itself (its completer, its rescuer, its
        :meth:`cancel`) the wait is woken at once. A job retried meanwhile is waited for
        through its retries. Transient database failures are logged and the wait goes on.

        Raises :class:`JobWaitTimeoutError` (also a :class:`TimeoutError`) when the job is
        not finalized within ``timeout`` seconds (None: no limit), :class:`NotFoundError`
        when the job does not exist or is deleted while waited for.
        """
        job_id = _job_id(job_id)
        limit = _seconds(timeout, "timeout", allow_none=True)
        cap = _seconds(poll_interval, "poll_interval")
        assert cap is not None
        ex = self._client.driver.executor()
        last: JobRow | None = None
        delay = min(WAIT_FIRST_POLL, cap)
        with anyio.move_on_after(limit), self._client._job_waiters.watch(job_id) as woken:
            while True:
                try:
                    last = _found(await ex.job_get_by_id(job_id), job_id)
                except DatabaseError as exc:
                    if not exc.transient:
                        raise
                    logger.warning(
                        "waiting for job %d: reading it failed (reading again in %.2gs): %s",
                        job_id,
                        delay,
                        exc,
                        extra={
                            "river_event": "job_wait_failed",
                            "river_client_id": self._client.id,
                            "river_job_id": job_id,
                        },
                    )
                else:
                    if last.state in FINALIZED_STATES:
                        return last
                with anyio.move_on_after(delay):
                    await woken.wait()
                delay = min(delay * 2, cap)
        assert limit is not None
        raise JobWaitTimeoutError(job_id, limit, last)

    # list

    async def list(self, **options: Unpack[JobListOptions]) -> JobListResult:
        """River's JobList: jobs matching every given filter, a page at a time.

        ``order_by``: ``"id"``; ``"time"`` (the time that matters for the first state filtered
        on: ``scheduled_at``, ``attempted_at`` for running, ``finalized_at`` for final
        states); ``"scheduled_at"``; ``"finalized_at"`` (final states only; they are the
        default filter then). Ties are broken by id. ``metadata`` is a JSON containment filter
        (PostgreSQL only). ``after`` resumes after a cursor (``result.last_cursor``, its text,
        or a job row). ``limit`` is 1 to 10,000.
        """
        return await self._list(None, options)

    async def list_tx(self, tx: object, **options: Unpack[JobListOptions]) -> JobListResult:
        return await self._list(tx, options)

    async def _list(self, tx: object | None, options: JobListOptions) -> JobListResult:
        plan = _plan_list(dialect=self._client.driver.dialect, **options)
        jobs = await self._ex(tx).job_list_query(plan.query)
        return JobListResult(jobs=jobs, last_cursor=plan.cursor(jobs[-1]) if jobs else None)

    # cancel

    async def cancel(self, job_id: int) -> JobRow:
        """River's JobCancel. A job that is not running and not finalized becomes
        ``cancelled`` now; a running one is flagged and its worker, on whichever client (and
        in whichever language) runs it, is cancelled through River's control notification;
        a finalized one is returned unchanged. :class:`NotFoundError` when there is none."""
        job = await self._cancel(None, job_id)
        if job.state == JobState.CANCELLED and self._client._job_waiters:
            self._client._job_waiters.wake((job.id,))
        self._client._control_local(
            job.queue, {"action": "cancel", "job_id": job.id, "queue": job.queue}
        )
        return job

    async def cancel_tx(self, tx: object, job_id: int) -> JobRow:
        """:meth:`cancel` inside the caller's transaction (the worker hears of it at commit)."""
        return await self._cancel(tx, job_id)

    async def _cancel(self, tx: object | None, job_id: int) -> JobRow:
        job = await self._ex(tx).job_cancel(
            job_id=_job_id(job_id), cancel_attempted_at=utc_now(), notify=True
        )
        return _found(job, job_id)

    # retry

    async def retry(self, job_id: int) -> JobRow:
        """River's JobRetry: make the job ``available`` now, whatever its state, unless it is
        running (left alone) or available and already due. Its errors and attempt count stay;
        a job that used all its attempts gets one more. :class:`NotFoundError` if missing."""
        return await self._retry(None, job_id)

    async def retry_tx(self, tx: object, job_id: int) -> JobRow:
        return await self._retry(tx, job_id)

    async def _retry(self, tx: object | None, job_id: int) -> JobRow:
        return _found(await self._ex(tx).job_retry(_job_id(job_id)), job_id)

    # delete

    async def delete(self, job_id: int) -> JobRow:
        """River's JobDelete: delete the job and return it as it was. Raises
        :class:`JobRunningError` for a running job, :class:`NotFoundError` for a missing one."""
        return await self._delete(None, job_id)

    async def delete_tx(self, tx: object, job_id: int) -> JobRow:
        return await self._delete(tx, job_id)

    async def _delete(self, tx: object | None, job_id: int) -> JobRow:
        job = _found(await self._ex(tx).job_delete(_job_id(job_id)), job_id)
        if job.state is JobState.RUNNING:
            raise JobRunningError(f"job {job_id} is running; running jobs cannot be deleted")
        return job

    async def delete_many(
        self,
        *,
        ids: Sequence[int] | None = None,
        kinds: Sequence[str] | None = None,
        priorities: Sequence[int] | None = None,
        queues: Sequence[str] | None = None,
        states: Sequence[JobState | str] | None = None,
        limit: int = 100,
        unsafe_all: bool = False,
    ) -> builtins.list[JobRow]:
        """River's JobDeleteMany: delete up to ``limit`` (1 to 10,000) jobs matching every
        filter, lowest ids first, never running ones; returns them. Without any filter it
        refuses, unless ``unsafe_all=True`` says that deleting every job is meant."""
        return await self._delete_many(None, **_kw(locals()))

    async def delete_many_tx(
        self,
        tx: object,
        *,
        ids: Sequence[int] | None = None,
        kinds: Sequence[str] | None = None,
        priorities: Sequence[int] | None = None,
        queues: Sequence[str] | None = None,
        states: Sequence[JobState | str] | None = None,
        limit: int = 100,
        unsafe_all: bool = False,
    ) -> builtins.list[JobRow]:
        return await self._delete_many(tx, **_kw(locals()))

    async def _delete_many(
        self,
        tx: object | None,
        *,
        ids: object,
        kinds: object,
        priorities: object,
        queues: object,
        states: object,
        limit: object,
        unsafe_all: object,
    ) -> builtins.list[JobRow]:
        query = JobListQuery(
            ids=_seq(ids, "ids", int),
            kinds=_seq(kinds, "kinds", str),
            priorities=_seq(priorities, "priorities", int),
            queues=_seq(queues, "queues", str),
            states=_states(states),
            limit=validate_limit(limit),
        )
        filtered = any(
            v is not None
            for v in (query.ids, query.kinds, query.priorities, query.queues, query.states)
        )
        if unsafe_all is not True and unsafe_all is not False:
            raise ValidationError("unsafe_all", "must be a bool", unsafe_all)
        if not filtered and not unsafe_all:
            raise ValidationError(
                "delete_many",
                "delete with no filters is refused so every job is not deleted by accident; "
                "give a filter (ids, kinds, priorities, queues, states) or unsafe_all=True",
            )
        if filtered and unsafe_all:
            raise ValidationError(
                "unsafe_all", "is meaningless with filters; drop one or the other"
            )
        return await self._ex(tx).job_delete_many(query)

    # update

    async def update(
        self, job_id: int, *, output: Any = None, metadata: Mapping[str, Any] | None = None
    ) -> JobRow:
        """River's JobUpdate: write the job's ``output`` (any JSON value but null, within 32
        MiB) and merge ``metadata`` (top-level keys replaced; no ``river:`` keys) now, whatever
        its state. Returns the row after it; :class:`NotFoundError` if missing."""
        return await self._update(None, job_id, output, metadata)

    async def update_tx(
        self,
        tx: object,
        job_id: int,
        *,
        output: Any = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> JobRow:
        return await self._update(tx, job_id, output, metadata)

    async def _update(
        self, tx: object | None, job_id: int, output: Any, metadata: object
    ) -> JobRow:
        job_id = _job_id(job_id)
        updates = metadata_updates(metadata) if metadata is not None else {}
        if output is not None:
            updates.pop("output", None)
        encoded = json.dumps(updates, separators=(",", ":")).encode()
        if output is not None:  # spliced in: a large output is encoded once
            out = encode_output(output)
            encoded = encoded[:-1] + (b',"output":' if updates else b'"output":') + out + b"}"
        ex = self._ex(tx)
        if encoded == b"{}":
            job = await ex.job_get_by_id(job_id)
        else:
            job = await ex.job_update_metadata(job_id, encoded)
        return _found(job, job_id)


def _seconds(value: object, field: str, *, allow_none: bool = False) -> float | None:
    """A positive, finite duration in seconds (a number or a timedelta)."""
    if value is None and allow_none:
        return None
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        rule = "must be a positive number of seconds or a timedelta"
        raise ValidationError(field, rule + (" (or None)" if allow_none else ""), value)
    return float(value)


def _found(job: JobRow | None, job_id: int) -> JobRow:
    """The job a call touched; :class:`NotFoundError` when there was none."""
    if job is None:
        raise NotFoundError(f"job {job_id} not found")
    return job


def _kw(local: dict[str, Any]) -> dict[str, Any]:
    """A method's keyword arguments, from its ``locals()``."""
    return {k: v for k, v in local.items() if k not in ("self", "tx")}
