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
from ..._job import AttemptError, JobRow, JobState
from ..._timeutil import format_rfc3339nano, parse_rfc3339
from .._protocol import CompletionResult, InsertedJob, JobCompletion, JobInsertParams, QueueRow
from ._connection import AnyioConnection
from ._errors import is_cached_plan_error, map_errors
from ._queries import INSERT_COLUMNS, Queries

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
    return JobRow(
        id=row[0],
        args=args,
        encoded_args=row[1].encode(),
        attempt=row[2],
        attempted_at=row[3],
        attempted_by=tuple(attempted_by) if attempted_by else (),
        created_at=row[5],
        errors=tuple(_attempt_error(e) for e in errors) if errors else (),
        finalized_at=row[7],
        kind=row[8],
        max_attempts=row[9],
        metadata=metadata,
        priority=row[11],
        queue=row[12],
        scheduled_at=row[13],
        state=_STATE_BY_NAME[row[14]],
        tags=tuple(row[15]),
        unique_key=bytes(unique_key) if unique_key is not None else None,
        unique_states=_STATES_BY_MASK[unique_states] if unique_states is not None else None,
    )


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


def _completion_columns(completions: Sequence[JobCompletion], client_id: str) -> list[str]:
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
    return [
        ",".join([f"{c.id:d}" for c in completions]),
        ",".join([f"{c.attempt:d}" for c in completions]),
        ",".join([_STATE_VALUE[c.state] for c in completions]),
        ","
        + ",".join(["" if c.attempt_new is None else f"{c.attempt_new:d}" for c in completions]),
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
        columns = _batch_columns(params)
        query = self._q.job_insert_fast_many

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
            cur = await conn.execute(query, columns)
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
        self, completions: Sequence[JobCompletion], *, client_id: str, return_rows: bool = True
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
        if not return_rows:  # (id, applied, ordinal)
            return [CompletionResult(id=row[0], applied=row[1]) for row in rows]
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

    async def notify_many(self, topic: str, payloads: Sequence[str]) -> None:
        if not payloads:
            return
        channel = f"{self._q.schema}.{topic}" if self._q.schema else topic
        query = self._q.notify_many
        values = (channel, list(payloads))

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
