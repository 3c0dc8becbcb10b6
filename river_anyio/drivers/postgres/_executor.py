"""River's operations on PostgreSQL (the :class:`~river_anyio.drivers.Executor` protocol)."""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import psycopg
from psycopg import pq
from psycopg.types.numeric import Int8

from ..._errors import DatabaseError, ValidationError
from ..._fastinit import positional_constructor
from ..._job import AttemptError, JobRow, JobState
from ..._timeutil import format_rfc3339nano, parse_rfc3339
from .._protocol import (
    Completion,
    CompletionResult,
    InsertedJob,
    JobInsertParams,
    JobListQuery,
    JobRescue,
    LeaderRow,
    QueueRow,
    ScheduledJob,
)
from ._connection import AnyioConnection
from ._errors import is_cached_plan_error, map_errors
from ._maintenance_queries import MaintenanceQueries, maintenance_queries
from ._queries import (
    INSERT_COLUMNS,
    Queries,
    api_job_delete,
    api_job_delete_many,
    api_job_retry,
    api_job_update_metadata,
    api_queue_update,
    job_give_back_lost_claims,
    quote_ident,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from ._pool import Pool

__all__ = ["PostgresExecutor", "row_to_job", "row_to_queue", "rows_to_jobs"]

logger = logging.getLogger("river_anyio.driver")

T = TypeVar("T")

_UTC = dt.UTC
_SEP = "\x1e"  # between elements of a batch column (chr(30) in SQL)
_TAG_SEP = "\x1f"  # between the tags of one job (chr(31) in SQL)
_COPY_CHUNK = 1 << 20

# unique_states is a bit(8) whose most significant bit is "scheduled" and least significant
# "available" (River's layout): bit i of the integer value is this state.
_STATE_BITS = (
    JobState.AVAILABLE,
    JobState.CANCELLED,
    JobState.COMPLETED,
    JobState.DISCARDED,
    JobState.PENDING,
    JobState.RETRYABLE,
    JobState.RUNNING,
    JobState.SCHEDULED,
)
_STATES_BY_MASK: tuple[frozenset[JobState], ...] = tuple(
    frozenset(s for i, s in enumerate(_STATE_BITS) if mask >> i & 1) for mask in range(256)
)
_STATE_BY_NAME = {s.value: s for s in JobState}
_json_decode = json.JSONDecoder().decode


def unique_states_to_mask(states: frozenset[JobState]) -> int:
    """The bit(8) integer value of a set of states (River's unique_states layout)."""
    return sum(1 << _STATE_BITS.index(s) for s in states)


def _attempt_error(text: str) -> AttemptError:
    obj = _json_decode(text)
    return AttemptError(
        at=parse_rfc3339(obj["at"]),
        attempt=int(obj.get("attempt", 0)),
        error=str(obj.get("error", "")),
        trace=str(obj.get("trace", "")),
    )


def row_to_job(row: Sequence[Any]) -> JobRow:
    """A :class:`JobRow` from a row selected with ``_queries.JOB_COLUMNS``."""
    metadata_text: str = row[10]
    return _job(
        row,
        _json_decode(row[1]),
        {} if metadata_text == "{}" else _json_decode(metadata_text),
    )


def rows_to_jobs(rows: Sequence[Sequence[Any]]) -> list[JobRow]:
    """:func:`row_to_job` over many rows, every JSON column decoded by one call (the
    per-call overhead dominates for River's small documents)."""
    if not rows:
        return []
    parts: list[str] = []
    for r in rows:
        parts.append(r[1])
        parts.append(r[10])
    values = _json_decode("[" + ",".join(parts) + "]")
    return [_job(r, values[2 * i], values[2 * i + 1]) for i, r in enumerate(rows)]


def _job(row: Sequence[Any], args: Any, metadata: Any) -> JobRow:
    errors = row[6]
    unique_key = row[16]
    unique_states = row[17]
    attempted_by = row[4]
    # positional, in JobRow's field order
    return _make_job(
        row[0],
        args,
        row[1].encode(),
        row[2],
        row[3],
        tuple(attempted_by) if attempted_by else (),
        row[5],
        tuple(_attempt_error(e) for e in errors) if errors else (),
        row[7],
        row[8],
        row[9],
        metadata,
        row[11],
        row[12],
        row[13],
        _STATE_BY_NAME[row[14]],
        tuple(row[15]),
        bytes(unique_key) if unique_key is not None else None,
        _STATES_BY_MASK[unique_states] if unique_states is not None else None,
    )


_make_job = positional_constructor(JobRow)


def row_to_queue(row: Sequence[Any]) -> QueueRow:
    """A :class:`QueueRow` from a row selected with ``_queries.QUEUE_COLUMNS``."""
    return QueueRow(
        name=row[0],
        created_at=row[1],
        metadata=_json_decode(row[2]),
        paused_at=row[3],
        updated_at=row[4],
    )


def _check_column(name: str, blob: str, expected: int) -> None:
    if blob.count(_SEP) != expected:
        raise ValidationError(name, "must not contain the control character U+001E")


def _require_aware(value: dt.datetime, field: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(field, "must be timezone-aware (naive datetimes are ambiguous)")


def _time_text(value: dt.datetime | None, field: str) -> str:
    if value is None:
        return ""
    _require_aware(value, field)
    return value.isoformat()


def _batch_columns(params: Sequence[JobInsertParams]) -> list[str]:
    """One text parameter per inserted column (see ``Queries.build``), checked so no value
    can shift the columns out of line."""
    n = len(params)
    try:
        args = _SEP + _SEP.join([p.encoded_args.decode() for p in params])
        metadata = _SEP + _SEP.join([p.metadata.decode() for p in params])
    except UnicodeDecodeError as exc:
        raise ValidationError("encoded_args", f"must be UTF-8 JSON: {exc}") from None
    kinds = _SEP + _SEP.join([p.kind for p in params])
    queues = _SEP + _SEP.join([p.queue for p in params])
    tags = _SEP + _SEP.join([_TAG_SEP.join(p.tags) if p.tags else "" for p in params])
    _check_column("encoded_args", args, n)
    _check_column("metadata", metadata, n)
    _check_column("kind", kinds, n)
    _check_column("queue", queues, n)
    _check_column("tags", tags, n)
    if tags.count(_TAG_SEP) != sum(len(p.tags) - 1 for p in params if p.tags):
        raise ValidationError("tags", "must not contain the control character U+001F")
    created = [_time_text(p.created_at, "created_at") for p in params]
    scheduled = [_time_text(p.scheduled_at, "scheduled_at") for p in params]
    return [
        args,
        _SEP + _SEP.join(created),
        kinds,
        _SEP + _SEP.join([str(p.max_attempts) for p in params]),
        metadata,
        _SEP + _SEP.join([str(p.priority) for p in params]),
        queues,
        _SEP + _SEP.join(scheduled),
        _SEP + _SEP.join([p.state.value for p in params]),
        tags,
        _SEP + _SEP.join([p.unique_key.hex() if p.unique_key else "" for p in params]),
        _SEP + _SEP.join([str(p.unique_states) if p.unique_states else "" for p in params]),
    ]


def _completion_columns(completions: Sequence[Completion], client_id: str) -> list[str]:
    """The parameters of ``Queries.job_set_state_if_running_many``: one text per column, so
    the statement's parameter types never change (it stays prepared) and nothing is adapted
    per element."""
    n = len(completions)
    try:
        errors = _SEP + _SEP.join([c.error.decode() if c.error else "" for c in completions])
        metadata = _SEP + _SEP.join(
            [c.metadata_updates.decode() if c.metadata_updates else "" for c in completions]
        )
    except UnicodeDecodeError as exc:
        raise ValidationError("error", f"must be UTF-8 JSON: {exc}") from None
    _check_column("error", errors, n)
    _check_column("metadata_updates", metadata, n)
    # Times travel as microseconds since the epoch (exact, and ~5x cheaper than isoformat).
    try:
        finalized = "," + ",".join(
            [
                "" if c.finalized_at is None else str((c.finalized_at - _EPOCH) // _US)
                for c in completions
            ]
        )
        scheduled = "," + ",".join(
            [
                "" if c.scheduled_at is None else str((c.scheduled_at - _EPOCH) // _US)
                for c in completions
            ]
        )
    except TypeError:
        raise ValidationError(
            "finalized_at/scheduled_at", "must be timezone-aware (naive datetimes are ambiguous)"
        ) from None
    # ids and attempts are ints (str() of anything else fails the server-side cast)
    return [
        ",".join([str(c.id) for c in completions]),
        ",".join([str(c.attempt) for c in completions]),
        ",".join([_STATE_VALUE[c.state] for c in completions]),
        "," + ",".join(["" if c.attempt_new is None else str(c.attempt_new) for c in completions]),
        finalized,
        scheduled,
        errors,
        metadata,
        client_id,
    ]


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)
_US = dt.timedelta(microseconds=1)


_STATE_VALUE: dict[Any, str] = {
    **{s: s.value for s in JobState},
    **{s.value: s.value for s in JobState},
}


# COPY text format: backslash, and the characters that delimit fields and rows, are escaped.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(value: str) -> str:
    return value.translate(_COPY_ESCAPES)


def _copy_array(values: tuple[str, ...]) -> str:
    if not values:
        return "{}"
    inner = ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
    return _copy_text("{" + inner + "}")


def _copy_buffer(params: Sequence[JobInsertParams], columns: Sequence[str]) -> str:
    """The batch in COPY text format, for the columns named (timestamps may be left out)."""
    now = dt.datetime.now(_UTC).isoformat()
    with_created = "created_at" in columns
    with_scheduled = "scheduled_at" in columns
    lines = []
    for p in params:
        fields = [_copy_text(p.encoded_args.decode()) if p.encoded_args else "{}"]
        if with_created:
            fields.append(_time_text(p.created_at, "created_at") or now)
        fields.append(_copy_text(p.kind))
        fields.append(str(p.max_attempts))
        fields.append(_copy_text(p.metadata.decode()) if p.metadata else "{}")
        fields.append(str(p.priority))
        fields.append(_copy_text(p.queue))
        if with_scheduled:
            fields.append(_time_text(p.scheduled_at, "scheduled_at") or now)
        fields.append(p.state.value)
        fields.append(_copy_array(p.tags))
        fields.append("\\\\x" + p.unique_key.hex() if p.unique_key else "\\N")
        fields.append(format(p.unique_states, "08b") if p.unique_states else "\\N")
        lines.append("\t".join(fields))
    lines.append("")
    return "\n".join(lines)


class PostgresExecutor:
    """River's operations on one PostgreSQL connection, or on pooled connections with each
    call in its own unit of work (autocommit)."""

    def __init__(
        self,
        queries: Queries,
        *,
        pool: Pool | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> None:
        if (pool is None) == (conn is None):
            raise TypeError("an executor needs exactly one of pool= or conn=")
        self._q = queries
        self._pool = pool
        self._conn = conn

    @property
    def dialect(self) -> Literal["postgres"]:
        return "postgres"

    @property
    def schema(self) -> str | None:
        return self._q.schema

    @property
    def connection(self) -> psycopg.AsyncConnection[Any] | None:
        """The connection this executor is bound to (None for a pool-backed executor)."""
        return self._conn

    async def _run(self, op: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
        """Run ``op`` on our connection, or on a pooled one, translating errors."""
        with map_errors():
            conn = self._conn
            if conn is not None:
                try:
                    return await op(conn)
                except psycopg.errors.FeatureNotSupported as exc:
                    if is_cached_plan_error(exc) and isinstance(conn, AnyioConnection):
                        conn.reset_prepared = True  # the pool deallocates on return
                    raise
            pool = self._pool
            assert pool is not None
            conn = await pool.getconn()
            try:
                try:
                    return await op(conn)
                except psycopg.errors.FeatureNotSupported as exc:
                    if (
                        not is_cached_plan_error(exc)
                        or conn.pgconn.transaction_status != pq.TransactionStatus.IDLE
                    ):
                        raise
                    # A statement prepared here went stale after DDL on another connection:
                    # drop the server's prepared statements and retry once (autocommit, so
                    # nothing was written).
                    logger.info("prepared statements went stale; deallocating and retrying")
                    await conn.execute("DEALLOCATE ALL")
                    return await op(conn)
            finally:
                await pool.putconn(conn)

    # --- jobs ---------------------------------------------------------------------------------

    async def job_insert_fast_many(self, params: Sequence[JobInsertParams]) -> list[InsertedJob]:
        if not params:
            return []
        return await self._insert(self._q.job_insert_fast_many, _batch_columns(params), params)

    async def _insert(
        self, query: str, values: Sequence[Any], params: Sequence[JobInsertParams]
    ) -> list[InsertedJob]:
        """Run a batch insert returning one row per job (and its duplicate flag)."""

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
            cur = await conn.execute(query, values)
            return await cur.fetchall()

        rows = await self._run(op)
        if len(rows) != len(params):
            raise DatabaseError(f"insert returned {len(rows)} rows for {len(params)} jobs")
        return [
            InsertedJob(job=row_to_job(row), unique_skipped_as_duplicate=row[18]) for row in rows
        ]

    async def job_insert_fast_many_no_returning(self, params: Sequence[JobInsertParams]) -> int:
        if not params:
            return 0
        # Leave a timestamp column out when no job sets it: the column default (the
        # database's now()) applies. Otherwise missing values take this process's clock.
        columns = [
            c
            for c in INSERT_COLUMNS
            if not (c == "created_at" and all(p.created_at is None for p in params))
            and not (c == "scheduled_at" and all(p.scheduled_at is None for p in params))
        ]
        try:
            data = _copy_buffer(params, columns).encode()
        except UnicodeDecodeError as exc:
            raise ValidationError("encoded_args", f"must be UTF-8 JSON: {exc}") from None
        statement = self._q.job_copy % ", ".join(columns)

        async def op(conn: psycopg.AsyncConnection[Any]) -> int:
            cur = conn.cursor()
            async with cur.copy(statement) as copy:
                view = memoryview(data)
                for start in range(0, len(view), _COPY_CHUNK):
                    await copy.write(view[start : start + _COPY_CHUNK])
            return cur.rowcount

        return await self._run(op)

    async def job_get_by_id(self, job_id: int) -> JobRow | None:
        query = self._q.job_get_by_id

        async def op(conn: psycopg.AsyncConnection[Any]) -> Any:
            cur = await conn.execute(query, (job_id,))
            return await cur.fetchone()

        row = await self._run(op)
        return row_to_job(row) if row is not None else None

    async def job_list(
        self,
        *,
        ids: Sequence[int] | None = None,
        kinds: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        states: Sequence[JobState] | None = None,
        after_id: int | None = None,
        limit: int = 100,
    ) -> list[JobRow]:
        where: list[str] = []
        args: list[Any] = []
        if ids is not None:
            where.append("id = ANY(%s::bigint[])")
            args.append(list(ids))
        if kinds is not None:
            where.append("kind = ANY(%s::text[])")
            args.append(list(kinds))
        if queues is not None:
            where.append("queue = ANY(%s::text[])")
            args.append(list(queues))
        if states is not None:
            where.append(f"state = ANY(%s::text[]::{self._q.state_cast()}[])")
            args.append([JobState(s).value for s in states])
        if after_id is not None:
            where.append("id > %s")
            args.append(after_id)
        query = self._q.job_list_head
        if where:
            query += " WHERE " + " AND ".join(where)
        query += " ORDER BY id LIMIT %s"
        args.append(limit)

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
            cur = await conn.execute(query, args)
            return await cur.fetchall()

        return [row_to_job(row) for row in await self._run(op)]

    # --- the runtime's hot path -----------------------------------------------------------------

    async def job_get_available(
        self,
        *,
        queue: str,
        max_to_lock: int,
        client_id: str,
        max_attempted_by: int = 100,
        kinds: Sequence[str] | None = None,
    ) -> list[JobRow]:
        if max_to_lock <= 0 or (kinds is not None and not kinds):
            return []
        if max_attempted_by < 1:
            raise ValidationError("max_attempted_by", "must be >= 1", max_attempted_by)
        # Int8 everywhere: psycopg would otherwise pick int2/int4 by value, and each choice
        # is a different prepared statement.
        by = Int8(max_attempted_by)
        values: tuple[Any, ...]
        if kinds is None:
            query = self._q.job_get_available
            values = (queue, Int8(max_to_lock), by, by, client_id)
        else:
            query = self._q.job_get_available_kinds
            values = (queue, list(kinds), Int8(max_to_lock), by, by, client_id)

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
            # binary results: timestamps and arrays load faster
            cur = await conn.cursor(binary=True).execute(query, values)
            return await cur.fetchall()

        return rows_to_jobs(await self._run(op))

    async def job_set_state_if_running_many(
        self, completions: Sequence[Completion], *, client_id: str, return_rows: bool = True
    ) -> list[CompletionResult]:
        if not completions:
            return []
        values = _completion_columns(completions, client_id)
        q = self._q
        query = (
            q.job_set_state_if_running_many if return_rows else q.job_set_state_if_running_many_lean
        )

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
            cur = await conn.cursor(binary=True).execute(query, values)
            return await cur.fetchall()

        rows = await self._run(op)
        if not return_rows:  # (id, applied, ordinal), only where it did not apply
            return [CompletionResult(id=row[0], applied=False) for row in rows]
        return [
            CompletionResult(id=job.id, job=job, applied=row[18])
            for job, row in zip(rows_to_jobs(rows), rows, strict=True)
        ]

    async def job_cancel(
        self, *, job_id: int, cancel_attempted_at: dt.datetime, notify: bool = True
    ) -> JobRow | None:
        _require_aware(cancel_attempted_at, "cancel_attempted_at")
        values = (
            Int8(job_id),
            bool(notify),
            format_rfc3339nano(cancel_attempted_at.astimezone(_UTC)),
        )
        query = self._q.job_cancel

        async def op(conn: psycopg.AsyncConnection[Any]) -> Any:
            cur = await conn.execute(query, values)
            return await cur.fetchone()

        row = await self._run(op)
        return row_to_job(row) if row is not None else None

    # --- queues -------------------------------------------------------------------------------

    async def queue_create_or_set_updated_at(
        self, *, name: str, metadata: bytes = b"{}"
    ) -> QueueRow:
        values = (name, metadata.decode() if metadata else None)
        query = self._q.queue_create_or_set_updated_at

        async def op(conn: psycopg.AsyncConnection[Any]) -> Any:
            cur = await conn.execute(query, values)
            return await cur.fetchone()

        row = await self._run(op)
        if row is None:
            raise DatabaseError(f"queue upsert returned no row for {name!r}")
        return row_to_queue(row)

    async def queue_get(self, name: str) -> QueueRow | None:
        query = self._q.queue_get

        async def op(conn: psycopg.AsyncConnection[Any]) -> Any:
            cur = await conn.execute(query, (name,))
            return await cur.fetchone()

        row = await self._run(op)
        return row_to_queue(row) if row is not None else None

    async def queue_list(self, *, limit: int = 100) -> list[QueueRow]:
        query = self._q.queue_list

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
            cur = await conn.execute(query, (Int8(limit),))
            return await cur.fetchall()

        return [row_to_queue(row) for row in await self._run(op)]

    async def queue_pause(self, name: str) -> int:
        return await self._queue_control(self._q.queue_pause, name)

    async def queue_resume(self, name: str) -> int:
        return await self._queue_control(self._q.queue_resume, name)

    async def _queue_control(self, query: str, name: str) -> int:
        values = (name, name, name, name)

        async def op(conn: psycopg.AsyncConnection[Any]) -> Any:
            cur = await conn.execute(query, values)
            return await cur.fetchone()

        row = await self._run(op)
        return int(row[0]) if row is not None else 0

    # --- notifications ------------------------------------------------------------------------

    def _channel(self, topic: str) -> str:
        """River's channel for ``topic``: prefixed with the schema when one is configured."""
        return f"{self._q.schema}.{topic}" if self._q.schema else topic

    async def notify_many(self, topic: str, payloads: Sequence[str]) -> None:
        if not payloads:
            return
        query = self._q.notify_many
        values = (self._channel(topic), list(payloads))

        async def op(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(query, values)

        await self._run(op)

    # --- generic access -----------------------------------------------------------------------

    async def exec_script(self, sql_text: str) -> None:
        async def op(conn: psycopg.AsyncConnection[Any]) -> None:
            # No parameters: sent as a simple query, so several statements may run.
            await conn.execute(sql_text.encode(), prepare=False)

        await self._run(op)

    async def fetch_all(self, sql_text: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        # Without parameters the text is sent as is (a literal % needs no escaping), as
        # psycopg's own execute() does.
        values = params or None

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            cur = await conn.execute(sql_text, values)
            if cur.description is None:
                return []
            return [tuple(r) for r in await cur.fetchall()]

        return await self._run(op)

    async def execute(self, sql_text: str, params: Sequence[Any] = ()) -> int:
        values = params or None

        async def op(conn: psycopg.AsyncConnection[Any]) -> int:
            cur = await conn.execute(sql_text, values)
            return cur.rowcount

        return await self._run(op)

    async def table_exists(self, table: str) -> bool:
        name = self._q.qualified(table)

        async def op(conn: psycopg.AsyncConnection[Any]) -> bool:
            cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,))
            row = await cur.fetchone()
            return bool(row and row[0])

        return await self._run(op)

    async def column_exists(self, table: str, column: str) -> bool:
        name = self._q.qualified(table)

        async def op(conn: psycopg.AsyncConnection[Any]) -> bool:
            cur = await conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute"
                " WHERE attrelid = to_regclass(%s) AND attname = %s"
                " AND attnum > 0 AND NOT attisdropped)",
                (name, column),
            )
            row = await cur.fetchone()
            return bool(row and row[0])

        return await self._run(op)

    # --- observability ----------------------------------------------------------------------

    async def job_count_by_queue_and_state(
        self, *, states: Sequence[JobState]
    ) -> list[tuple[str, JobState, int]]:
        if not states:
            return []
        # The state filter lets River's fetching index (state, queue, ...) serve the count.
        query = (
            f"SELECT queue, state::text, count(*) FROM {self._q.prefix}river_job"
            f" WHERE state = ANY(%s::{self._q.prefix}river_job_state[])"
            " GROUP BY queue, state ORDER BY queue, state::text"
        )
        values = ([str(s) for s in states],)

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
            cur = await conn.execute(query, values)
            return await cur.fetchall()

        return [(q, JobState(st), int(n)) for q, st, n in await self._run(op)]

    # --- client job and queue APIs (River's JobList/JobRetry/JobDelete/JobUpdate/QueueUpdate) ---

    async def _fetch_jobs(self, query: str, values: Sequence[Any]) -> list[JobRow]:
        async def op(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
            cur = await conn.execute(query, values)
            return await cur.fetchall()

        return [row_to_job(row) for row in await self._run(op)]

    async def _fetch_job(self, query: str, values: Sequence[Any]) -> JobRow | None:
        rows = await self._fetch_jobs(query, values)
        return rows[0] if rows else None

    async def job_list_query(self, query: JobListQuery) -> list[JobRow]:
        where, args = _list_where(query, self._q.state_cast())
        order = "DESC" if query.descending else "ASC"
        if query.order_by != "id":
            column = quote_ident(query.order_by)
            where.extend(_cursor_predicate(query, column, args))
            order_by = f"{column} {order}, id {order}"
        else:
            if query.after_id is not None:
                where.append(f"id {'<' if query.descending else '>'} %s")
                args.append(Int8(query.after_id))
            order_by = f"id {order}"
        sql_text = self._q.job_list_head
        if where:
            sql_text += " WHERE " + " AND ".join(where)
        sql_text += f" ORDER BY {order_by} LIMIT %s"
        args.append(Int8(query.limit))
        return await self._fetch_jobs(sql_text, args)

    async def job_retry(self, job_id: int) -> JobRow | None:
        return await self._fetch_job(api_job_retry(self._q.prefix), (Int8(job_id),))

    async def job_delete(self, job_id: int) -> JobRow | None:
        return await self._fetch_job(api_job_delete(self._q.prefix), (Int8(job_id),))

    async def job_delete_many(self, query: JobListQuery) -> list[JobRow]:
        where, args = _list_where(query, self._q.state_cast())
        sql_text = api_job_delete_many(self._q.prefix, " AND ".join(where) or "true")
        return await self._fetch_jobs(sql_text, [*args, Int8(query.limit)])

    async def job_update_metadata(self, job_id: int, metadata_updates: bytes) -> JobRow | None:
        values = (metadata_updates.decode(), Int8(job_id))
        return await self._fetch_job(api_job_update_metadata(self._q.prefix), values)

    async def queue_update(self, name: str, *, metadata: bytes | None = None) -> QueueRow | None:
        query = api_queue_update(self._q.prefix)
        values = (metadata.decode() if metadata is not None else None, name)

        async def op(conn: psycopg.AsyncConnection[Any]) -> Any:
            cur = await conn.execute(query, values)
            return await cur.fetchone()

        row = await self._run(op)
        return row_to_queue(row) if row is not None else None

    # --- leadership and maintenance ---------------------------------------------------------------

    async def _maint_rows(self, query: str, values: dict[str, Any] | None) -> list[Any]:
        async def op(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
            cur = await conn.execute(query, values)
            if cur.description is None:
                return []
            return await cur.fetchall()

        return await self._run(op)

    async def _maint_count(self, query: str, values: dict[str, Any]) -> int:
        async def op(conn: psycopg.AsyncConnection[Any]) -> int:
            cur = await conn.execute(query, values)
            return cur.rowcount

        return await self._run(op)

    @property
    def _mq(self) -> MaintenanceQueries:
        return maintenance_queries(self._q.schema)

    async def leader_delete_expired(self, *, now: dt.datetime | None = None) -> int:
        return await self._maint_count(
            self._mq.leader_delete_expired, {"now": _aware_or_none(now, "now")}
        )

    async def leader_attempt_elect(
        self, *, leader_id: str, ttl: float, now: dt.datetime | None = None
    ) -> LeaderRow | None:
        rows = await self._maint_rows(
            self._mq.leader_attempt_elect,
            {"leader_id": leader_id, "ttl": float(ttl), "now": _aware_or_none(now, "now")},
        )
        return _leader(rows[0]) if rows else None

    async def leader_attempt_reelect(
        self,
        *,
        leader_id: str,
        elected_at: dt.datetime,
        ttl: float,
        now: dt.datetime | None = None,
    ) -> LeaderRow | None:
        _require_aware(elected_at, "elected_at")
        rows = await self._maint_rows(
            self._mq.leader_attempt_reelect,
            {
                "leader_id": leader_id,
                "elected_at": elected_at,
                "ttl": float(ttl),
                "now": _aware_or_none(now, "now"),
            },
        )
        return _leader(rows[0]) if rows else None

    async def leader_resign(self, *, leader_id: str, elected_at: dt.datetime) -> bool:
        _require_aware(elected_at, "elected_at")
        rows = await self._maint_rows(
            self._mq.leader_resign,
            {"leader_id": leader_id, "elected_at": elected_at, "schema": self._q.schema},
        )
        return bool(rows and rows[0][0])

    async def leader_get_elected(self) -> LeaderRow | None:
        rows = await self._maint_rows(self._mq.leader_get_elected, None)
        return _leader(rows[0]) if rows else None

    async def job_schedule(
        self, *, horizon: dt.datetime, now: dt.datetime, limit: int
    ) -> list[ScheduledJob]:
        _require_aware(horizon, "horizon")
        rows = await self._maint_rows(
            self._mq.job_schedule,
            {"horizon": horizon, "now": _aware_or_none(now, "now"), "limit": Int8(limit)},
        )
        return [
            ScheduledJob(job=job, conflict_discarded=bool(row[18]))
            for job, row in zip(rows_to_jobs(rows), rows, strict=True)
        ]

    async def job_get_stuck(
        self, *, stuck_horizon: dt.datetime, after_id: int = 0, limit: int
    ) -> list[JobRow]:
        _require_aware(stuck_horizon, "stuck_horizon")
        rows = await self._maint_rows(
            self._mq.job_get_stuck,
            {"stuck_horizon": stuck_horizon, "after_id": Int8(after_id), "limit": Int8(limit)},
        )
        return rows_to_jobs(rows)

    async def job_rescue_many(
        self, rescues: Sequence[JobRescue], *, stuck_horizon: dt.datetime
    ) -> int:
        if not rescues:
            return 0
        _require_aware(stuck_horizon, "stuck_horizon")
        for r in rescues:
            _require_aware(r.scheduled_at, "scheduled_at")
            if r.finalized_at is not None:
                _require_aware(r.finalized_at, "finalized_at")
        try:
            errors = [r.error.decode() for r in rescues]
        except UnicodeDecodeError as exc:
            raise ValidationError("error", f"must be UTF-8 JSON: {exc}") from None
        return await self._maint_count(
            self._mq.job_rescue_many,
            {
                "ids": [r.id for r in rescues],
                "errors": errors,
                "finalized_at": [r.finalized_at for r in rescues],
                "scheduled_at": [r.scheduled_at for r in rescues],
                "states": [JobState(r.state).value for r in rescues],
                "stuck_horizon": stuck_horizon,
            },
        )

    async def job_delete_before(
        self,
        *,
        cancelled_before: dt.datetime | None,
        completed_before: dt.datetime | None,
        discarded_before: dt.datetime | None,
        limit: int,
    ) -> int:
        return await self._maint_count(
            self._mq.job_delete_before,
            {
                "cancelled": _aware_or_none(cancelled_before, "cancelled_before"),
                "completed": _aware_or_none(completed_before, "completed_before"),
                "discarded": _aware_or_none(discarded_before, "discarded_before"),
                "limit": Int8(limit),
            },
        )

    async def queue_delete_expired(self, *, updated_before: dt.datetime, limit: int) -> list[str]:
        _require_aware(updated_before, "updated_before")
        rows = await self._maint_rows(
            self._mq.queue_delete_expired, {"horizon": updated_before, "limit": Int8(limit)}
        )
        return [r[0] for r in rows]

    async def notification_delete_before(self, *, created_before: dt.datetime, limit: int) -> int:
        _require_aware(created_before, "created_before")
        return await self._maint_count(
            self._mq.notification_delete_before,
            {"horizon": created_before, "limit": Int8(limit)},
        )

    async def index_exists(self, name: str) -> bool:
        rows = await self._maint_rows(
            self._mq.index_exists, {"name": name, "schema": self._q.schema}
        )
        return bool(rows and rows[0][0])

    async def index_reindex_artifacts(self, name: str) -> list[str]:
        rows = await self._maint_rows(
            self._mq.index_reindex_artifacts, {"name": name, "schema": self._q.schema}
        )
        return [r[0] for r in rows]

    async def index_reindex(self, name: str) -> None:
        await self._maint_rows(
            f"REINDEX INDEX CONCURRENTLY {self._q.prefix}{quote_ident(name)}", None
        )

    async def index_drop_if_exists(self, name: str) -> None:
        await self._maint_rows(
            f"DROP INDEX CONCURRENTLY IF EXISTS {self._q.prefix}{quote_ident(name)}", None
        )

    # --- one-round-trip insert (runtime speed-ups) ------------------------------------------

    async def job_insert_fast_many_notify(
        self, params: Sequence[JobInsertParams], *, topic: str, payloads: Sequence[str]
    ) -> list[InsertedJob]:
        if not payloads:
            return await self.job_insert_fast_many(params)
        if not params:
            await self.notify_many(topic, payloads)
            return []
        values = [self._channel(topic), list(payloads), *_batch_columns(params)]
        return await self._insert(self._q.job_insert_fast_many_notify, values, params)

    # --- a claim whose reply was lost ----------------------------------------------------------

    async def job_give_back_lost_claims(
        self,
        *,
        queue: str,
        client_id: str,
        claimed_after: dt.datetime | None,
        within: float,
        running: Sequence[int] = (),
    ) -> list[JobRow]:
        """One statement; ``attempted_at`` and the window are both on the server's clock
        (the claim sets ``attempted_at = now()``)."""
        if claimed_after is not None:
            _require_aware(claimed_after, "claimed_after")
        if not within > 0:
            raise ValidationError("within", "must be > 0", within)
        query = job_give_back_lost_claims(self._q.prefix)
        values = {
            "queue": queue,
            "client_id": client_id,
            "claimed_after": claimed_after,
            "within": float(within),
            "running": [Int8(i) for i in running],
        }

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
            cur = await conn.cursor(binary=True).execute(query, values)
            return await cur.fetchall()

        return rows_to_jobs(await self._run(op))


def _list_where(query: JobListQuery, state_type: str) -> tuple[list[str], list[Any]]:
    """The filters of a job list as SQL conditions and their parameters (in order)."""
    where: list[str] = []
    args: list[Any] = []
    if query.ids is not None:
        where.append("id = ANY(%s::bigint[])")
        args.append(list(query.ids))
    if query.kinds is not None:
        where.append("kind = ANY(%s::text[])")
        args.append(list(query.kinds))
    if query.priorities is not None:
        where.append("priority = ANY(%s::smallint[])")
        args.append(list(query.priorities))
    if query.queues is not None:
        where.append("queue = ANY(%s::text[])")
        args.append(list(query.queues))
    if query.states is not None:
        where.append(f"state = ANY(%s::text[]::{state_type}[])")
        args.append([JobState(s).value for s in query.states])
    if query.tags_all is not None:
        where.append("tags @> %s::varchar[]")
        args.append(list(query.tags_all))
    if query.tags_any is not None:
        where.append("tags && %s::varchar[]")
        args.append(list(query.tags_any))
    if query.metadata is not None:
        where.append("metadata @> %s::jsonb")
        args.append(query.metadata.decode())
    return where, args


def _cursor_predicate(query: JobListQuery, column: str, args: list[Any]) -> list[str]:
    """River's keyset condition for resuming after the cursor row, ordered by ``column`` then
    id (PostgreSQL puts NULLs last ascending, first descending)."""
    if query.after_id is None:
        return []
    after = Int8(query.after_id)
    desc = query.descending
    if query.after_time is None and not query.time_nullable:
        args.append(after)
        return [f"id {'<' if desc else '>'} %s"]
    if query.after_time is None:  # the cursor row's time was NULL
        args.append(after)
        if desc:
            return [f"({column} IS NOT NULL OR id < %s)"]
        return [f"({column} IS NULL AND id > %s)"]
    _require_aware(query.after_time, "after_time")
    args.extend([query.after_time, query.after_time, after])
    if desc:
        return [f"({column} < %s OR ({column} = %s AND id < %s))"]
    or_null = f" OR {column} IS NULL" if query.time_nullable else ""
    return [f"({column} > %s OR ({column} = %s AND id > %s){or_null})"]


def _aware_or_none(value: dt.datetime | None, field: str) -> dt.datetime | None:
    if value is not None:
        _require_aware(value, field)
    return value


def _leader(row: Sequence[Any]) -> LeaderRow:
    return LeaderRow(leader_id=row[0], elected_at=row[1], expires_at=row[2])
