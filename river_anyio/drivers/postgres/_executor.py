"""River's operations on PostgreSQL (the :class:`~river_anyio.drivers.Executor` protocol)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import secrets
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio.lowlevel
import attrs
import psycopg
from psycopg import pq
from psycopg.types.numeric import Int8

from ..._errors import DatabaseError, MigrationError, ValidationError
from ..._job import JobRow, JobState, UndecodableJobRow
from ..._queue_limits import RateLimit, RateWindow, limits_table_missing
from ..._timeutil import format_rfc3339nano
from ..._unique import UNIQUE_STATES_BY_MASK
from .._decode import attempt_error_json, decode_failure, json_type
from .._protocol import (
    Completion,
    CompletionResult,
    InsertedJob,
    JobInsertParams,
    JobListQuery,
    JobRescue,
    LeaderRow,
    LeaseRow,
    LimitedClaim,
    QueueRow,
    ScheduledJob,
)
from .._shared import (
    STATE_BY_NAME,
    UNIQUE_NONCE_KEY,
    SharedOperations,
    job_list_statement,
    list_where,
    make_job,
    metadata_with_nonce,
    refuse_repeated_unique_keys,
    require_aware,
    where_text,
)
from ._capabilities import ServerCapabilities
from ._connection import AnyioConnection, shielded_transaction
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
#: The most River's ``smallint`` columns hold. Wider attempt counts (River Go's are ``int``s,
#: and SQLite stores them as given) are clamped to it on insert, as River's driver does.
_SMALLINT_MAX = 32767
#: Rows of a COPY built between two checkpoints (about 2 ms of the loop's time).
_COPY_ROWS = 1000
_json_decode = json.JSONDecoder().decode


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
    # empty metadata (the usual case) is not decoded: a new dict each
    parts = [r[1] if r[10] == "{}" else f"{r[1]},{r[10]}" for r in rows]
    values = iter(_json_decode("[" + ",".join(parts) + "]"))
    return [_job(r, next(values), {} if r[10] == "{}" else next(values)) for r in rows]


def _job(row: Sequence[Any], args: Any, metadata: Any) -> JobRow:
    errors = row[6]
    unique_key = row[16]
    unique_states = row[17]
    attempted_by = row[4]
    if type(metadata) is not dict:
        return _undecodable(row, args, metadata)
    # positional, in JobRow's field order
    return make_job(
        row[0],
        args,
        row[1].encode(),
        row[2],
        row[3],
        tuple(attempted_by) if attempted_by else (),
        row[5],
        tuple([attempt_error_json(e) for e in errors]) if errors else (),
        row[7],
        row[8],
        row[9],
        metadata,
        row[11],
        row[12],
        row[13],
        STATE_BY_NAME[row[14]],
        tuple(row[15]),
        bytes(unique_key) if unique_key is not None else None,
        UNIQUE_STATES_BY_MASK[unique_states] if unique_states is not None else None,
    )


def _undecodable(row: Sequence[Any], args: Any, metadata: Any) -> JobRow:
    """A row whose metadata is not a JSON object (River Go keeps any JSON there, but a
    JobRow's metadata is a mapping): returned with empty metadata and the reason, so a claim
    fails the job's attempt instead of working it (see :class:`UndecodableJobRow`)."""
    errors = row[6]
    unique_key = row[16]
    unique_states = row[17]
    return UndecodableJobRow(
        id=row[0],
        args=args,
        encoded_args=row[1].encode(),
        attempt=row[2],
        attempted_at=row[3],
        attempted_by=tuple(row[4] or ()),
        created_at=row[5],
        errors=tuple([attempt_error_json(e) for e in errors]) if errors else (),
        finalized_at=row[7],
        kind=row[8],
        max_attempts=row[9],
        metadata={},
        priority=row[11],
        queue=row[12],
        scheduled_at=row[13],
        state=STATE_BY_NAME[row[14]],
        tags=tuple(row[15]),
        unique_key=bytes(unique_key) if unique_key is not None else None,
        unique_states=UNIQUE_STATES_BY_MASK[unique_states] if unique_states is not None else None,
        decode_error=decode_failure(
            "metadata", f"cannot unmarshal {json_type(metadata)} into a JSON object"
        ),
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


def _time_text(value: dt.datetime | None, field: str) -> str:
    if value is None:
        return ""
    require_aware(value, field)
    return value.isoformat()


def _batch_columns(params: Sequence[JobInsertParams]) -> list[str]:
    """One text parameter per inserted column (see ``Queries.job_insert_fast_many``), checked so no value
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
        _SEP + _SEP.join([str(min(p.max_attempts, _SMALLINT_MAX)) for p in params]),
        metadata,
        _SEP + _SEP.join([str(min(p.priority, _SMALLINT_MAX)) for p in params]),
        queues,
        _SEP + _SEP.join(scheduled),
        _SEP + _SEP.join([p.state.value for p in params]),
        tags,
        _SEP + _SEP.join([p.unique_key.hex() if p.unique_key else "" for p in params]),
        _SEP + _SEP.join([str(p.unique_states) if p.unique_states else "" for p in params]),
    ]


def _payloads(payloads: Sequence[str]) -> str:
    """The parameter of ``Queries.notify_many``: every payload preceded by chr(30)."""
    blob = _SEP + _SEP.join(payloads)
    _check_column("payload", blob, len(payloads))
    return blob


def _row_columns(p: JobInsertParams) -> list[str]:
    """The parameters of ``Queries.job_insert_one``: what ``_batch_columns`` makes of a batch
    of one, each column without its leading separator, and the same values refused."""
    try:
        args = p.encoded_args.decode()
        metadata = p.metadata.decode()
    except UnicodeDecodeError as exc:
        raise ValidationError("encoded_args", f"must be UTF-8 JSON: {exc}") from None
    tags = _TAG_SEP.join(p.tags) if p.tags else ""
    for name, value in (
        ("encoded_args", args), ("metadata", metadata), ("kind", p.kind), ("queue", p.queue),
        ("tags", tags),
    ):  # fmt: skip
        _check_column(name, value, 0)
    if p.tags and tags.count(_TAG_SEP) != len(p.tags) - 1:
        raise ValidationError("tags", "must not contain the control character U+001F")
    return [
        args,
        _time_text(p.created_at, "created_at"),
        p.kind,
        str(min(p.max_attempts, _SMALLINT_MAX)),
        metadata,
        str(min(p.priority, _SMALLINT_MAX)),
        p.queue,
        _time_text(p.scheduled_at, "scheduled_at"),
        p.state.value,
        tags,
        p.unique_key.hex() if p.unique_key else "",
        str(p.unique_states) if p.unique_states else "",
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


_COPY_SPECIAL = re.compile(r"[\\\t\n\r]")


def _copy_text(value: str) -> str:
    # most values hold nothing to escape: one scan in C instead of translate's per character
    return value.translate(_COPY_ESCAPES) if _COPY_SPECIAL.search(value) else value


def _copy_array(values: tuple[str, ...]) -> str:
    if not values:
        return "{}"
    inner = ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
    return _copy_text("{" + inner + "}")


def _copy_buffer(params: Sequence[JobInsertParams], columns: Sequence[str], now: str) -> str:
    """The batch in COPY text format, for the columns named (timestamps may be left out);
    ``now`` stands in for the timestamps a job does not set."""
    with_created = "created_at" in columns
    with_scheduled = "scheduled_at" in columns
    text = _copy_text
    lines = []
    for p in params:
        args = text(p.encoded_args.decode()) if p.encoded_args else "{}"
        created = f"{_time_text(p.created_at, 'created_at') or now}\t" if with_created else ""
        metadata = text(p.metadata.decode()) if p.metadata else "{}"
        scheduled = (
            f"{_time_text(p.scheduled_at, 'scheduled_at') or now}\t" if with_scheduled else ""
        )
        tags = _copy_array(p.tags)
        key = "\\\\x" + p.unique_key.hex() if p.unique_key else "\\N"
        states = format(p.unique_states, "08b") if p.unique_states else "\\N"
        lines.append(
            f"{args}\t{created}{text(p.kind)}\t{min(p.max_attempts, _SMALLINT_MAX)}\t"
            f"{metadata}\t{min(p.priority, _SMALLINT_MAX)}\t"
            f"{text(p.queue)}\t{scheduled}{p.state.value}\t{tags}\t{key}\t{states}"
        )
    lines.append("")
    return "\n".join(lines)


class PostgresExecutor(SharedOperations):
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
    def capabilities(self) -> ServerCapabilities:
        """The server's capabilities this executor's statements were written for."""
        return self._q.capabilities

    @property
    def connection(self) -> psycopg.AsyncConnection[Any] | None:
        """The connection this executor is bound to (None for a pool-backed executor)."""
        return self._conn

    def on_schema(self, queries: Queries) -> PostgresExecutor:
        """This executor's connection (or pool) with the statements of another schema."""
        if self._conn is not None:
            return PostgresExecutor(queries, conn=self._conn)
        return PostgresExecutor(queries, pool=self._pool)

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
                    await conn.deallocate_all()
                    return await op(conn)
            finally:
                await pool.putconn(conn)

    # One statement, one way of reading its result: every operation goes through these.

    async def _rows(self, query: str, values: Any = None, *, binary: bool = False) -> list[Any]:
        """The statement's rows (none for a statement that returns none). ``binary``: binary
        results, which load timestamps and arrays faster, read on the connection's direct
        path (see ``AnyioConnection.execute_direct``): the runtime's frequent statements
        (claims, inserts, completions) are these."""

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
            if binary and isinstance(conn, AnyioConnection):
                return await conn.execute_direct(query, values)
            cur = await conn.cursor(binary=binary).execute(query, values)
            # whether it returned columns, read off the result itself: ``cur.description``
            # builds a Column object per column on every call (most of a claim's overhead)
            res = cur.pgresult
            return await cur.fetchall() if res is not None and res.nfields else []

        return await self._run(op)

    async def _row(self, query: str, values: Any = None) -> Any:
        """The statement's first row, or None."""

        async def op(conn: psycopg.AsyncConnection[Any]) -> Any:
            cur = await conn.execute(query, values)
            return await cur.fetchone()

        return await self._run(op)

    async def _count(self, query: str, values: Any = None) -> int:
        """The number of rows the statement affected."""

        async def op(conn: psycopg.AsyncConnection[Any]) -> int:
            cur = await conn.execute(query, values)
            return cur.rowcount

        return await self._run(op)

    async def _jobs(self, query: str, values: Sequence[Any]) -> list[JobRow]:
        return [row_to_job(row) for row in await self._rows(query, values)]

    async def _job(self, query: str, values: Sequence[Any]) -> JobRow | None:
        row = await self._row(query, values)
        return row_to_job(row) if row is not None else None

    async def _queue(self, query: str, values: Sequence[Any]) -> QueueRow | None:
        row = await self._row(query, values)
        return row_to_queue(row) if row is not None else None

    # --- jobs ---------------------------------------------------------------------------------

    async def job_insert_fast_many(self, params: Sequence[JobInsertParams]) -> list[InsertedJob]:
        if not params:
            return []
        q = self._q
        return await self._insert(q.job_insert_fast_many, q.job_insert_one, [], params)

    async def _insert(
        self, query: str, one: str, leading: list[Any], params: Sequence[JobInsertParams]
    ) -> list[InsertedJob]:
        """Run a batch insert (``leading`` values, then the batch's columns) returning one
        row per job and its duplicate flag; a single job without a unique key goes through
        ``one``, the single-row form of ``query``.

        On a server without ``xmax`` (YugabyteDB) every job of the batch carries one random
        ``river:unique_nonce`` in its metadata, as River Go writes it: a row that comes back
        without it is the existing duplicate."""
        nonce: str | None = None
        if self._q.unique_nonce:
            nonce = secrets.token_hex(8)
            params = [
                attrs.evolve(p, metadata=metadata_with_nonce(p.metadata.decode(), nonce).encode())
                for p in params
            ]
        if len(params) == 1 and params[0].unique_key is None:
            rows = await self._rows(one, [*leading, *_row_columns(params[0])], binary=True)
            if len(rows) != 1:
                raise DatabaseError(f"insert returned {len(rows)} rows for 1 job")
            return [InsertedJob(job=row_to_job(rows[0]), unique_skipped_as_duplicate=False)]
        refuse_repeated_unique_keys(params)
        rows = await self._rows(query, [*leading, *_batch_columns(params)], binary=True)
        if len(rows) != len(params):
            raise DatabaseError(f"insert returned {len(rows)} rows for {len(params)} jobs")
        if nonce is not None:
            jobs = [row_to_job(row) for row in rows]
            return [
                InsertedJob(
                    job=job, unique_skipped_as_duplicate=job.metadata.get(UNIQUE_NONCE_KEY) != nonce
                )
                for job in jobs
            ]
        return [
            InsertedJob(job=row_to_job(row), unique_skipped_as_duplicate=row[18]) for row in rows
        ]

    async def job_insert_fast_many_no_returning(self, params: Sequence[JobInsertParams]) -> int:
        if not params:
            return 0
        # A unique key repeated in the batch, or already held, fails the COPY, as River's does.
        # Leave a timestamp column out when no job sets it: the column default (the
        # database's now()) applies. Otherwise missing values take this process's clock.
        columns = [
            c
            for c in INSERT_COLUMNS
            if not (c == "created_at" and all(p.created_at is None for p in params))
            and not (c == "scheduled_at" and all(p.scheduled_at is None for p in params))
        ]
        # Built before the statement (bad input fails before any SQL), a slice at a time with
        # the event loop's other tasks let in between: 5,000 rows take about 9 ms.
        now = dt.datetime.now(_UTC).isoformat()
        chunks: list[bytes] = []
        for start in range(0, len(params), _COPY_ROWS):
            if start:
                await anyio.lowlevel.checkpoint()
            try:
                chunks.append(
                    _copy_buffer(params[start : start + _COPY_ROWS], columns, now).encode()
                )
            except UnicodeDecodeError as exc:
                raise ValidationError("encoded_args", f"must be UTF-8 JSON: {exc}") from None
        statement = self._q.job_copy(", ".join(columns))

        async def op(conn: psycopg.AsyncConnection[Any]) -> int:
            cur = conn.cursor()
            async with cur.copy(statement) as copy:
                for data in chunks:
                    view = memoryview(data)
                    for start in range(0, len(view), _COPY_CHUNK):
                        await copy.write(view[start : start + _COPY_CHUNK])
            return cur.rowcount

        return await self._run(op)

    async def job_get_by_id(self, job_id: int) -> JobRow | None:
        return await self._job(self._q.job_get_by_id, (job_id,))

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
        return rows_to_jobs(await self._rows(query, values, binary=True))

    async def job_get_available_limited(
        self,
        *,
        queue: str,
        max_to_lock: int,
        client_id: str,
        max_attempted_by: int = 100,
        kinds: Sequence[str] | None = None,
        rate_limit: RateLimit | None = None,
        global_max_workers: int | None = None,
    ) -> LimitedClaim:
        if max_to_lock <= 0 or (kinds is not None and not kinds):
            return LimitedClaim(jobs=[], allowed=0)
        if max_attempted_by < 1:
            raise ValidationError("max_attempted_by", "must be >= 1", max_attempted_by)
        q = self._q
        by = Int8(max_attempted_by)

        async def op(conn: psycopg.AsyncConnection[Any]) -> LimitedClaim:
            # Statements after the lock see every claim committed before it was granted
            # (read committed takes a snapshot per statement).
            async with shielded_transaction(conn):
                try:
                    cur = await conn.execute(q.queue_limit_lock, (queue,))
                except psycopg.errors.UndefinedTable:
                    raise MigrationError(limits_table_missing(queue)) from None
                starts, now = await cur.fetchone()  # type: ignore[misc]
                window = RateWindow.decode(starts) if rate_limit is not None else None
                allowed = max_to_lock
                if window is not None and rate_limit is not None:
                    allowed = min(allowed, window.allowance(now, rate_limit))
                if global_max_workers is not None and allowed > 0:
                    cur = await conn.execute(q.queue_limit_running, (queue,))
                    (running,) = await cur.fetchone()  # type: ignore[misc]
                    allowed = max(0, min(allowed, global_max_workers - running))
                jobs: list[JobRow] = []
                if allowed > 0:
                    values: tuple[Any, ...]
                    head: tuple[Any, ...] = (queue,) if kinds is None else (queue, list(kinds))
                    if window is None:
                        query = q.job_get_available if kinds is None else q.job_get_available_kinds
                        values = (*head, Int8(allowed), by, by, client_id)
                    else:  # the starts are stamped with the instant the window was read at
                        query = (
                            q.job_get_available_at
                            if kinds is None
                            else q.job_get_available_kinds_at
                        )
                        values = (*head, Int8(allowed), Int8(now), by, by, client_id)
                    cur = await conn.cursor(binary=True).execute(query, values)
                    jobs = rows_to_jobs(await cur.fetchall())
                reopens_in = 0.0
                if window is not None and rate_limit is not None:
                    if jobs:
                        window.record(now, len(jobs), rate_limit)
                        await conn.execute(q.queue_limit_save, (window.encode(), queue))
                    reopens_in = window.reopens_in(now, rate_limit)
                return LimitedClaim(jobs=jobs, allowed=allowed, reopens_in=reopens_in)

        return await self._run(op)

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
        rows = await self._rows(query, values, binary=True)
        if not return_rows:  # (id, applied, ordinal), only where it did not apply
            return [CompletionResult(id=row[0], applied=False) for row in rows]
        return [
            CompletionResult(id=job.id, job=job, applied=row[18])
            for job, row in zip(rows_to_jobs(rows), rows, strict=True)
        ]

    async def job_cancel(
        self, *, job_id: int, cancel_attempted_at: dt.datetime, notify: bool = True
    ) -> JobRow | None:
        require_aware(cancel_attempted_at, "cancel_attempted_at")
        values = (
            Int8(job_id),
            bool(notify) and self._q.notify,
            format_rfc3339nano(cancel_attempted_at.astimezone(_UTC)),
        )
        return await self._job(self._q.job_cancel, values)

    # --- queues -------------------------------------------------------------------------------

    async def queue_create_or_set_updated_at(
        self, *, name: str, metadata: bytes = b"{}"
    ) -> QueueRow:
        values = (name, metadata.decode() if metadata else None)
        queue = await self._queue(self._q.queue_create_or_set_updated_at, values)
        if queue is None:
            raise DatabaseError(f"queue upsert returned no row for {name!r}")
        return queue

    async def queue_get(self, name: str) -> QueueRow | None:
        return await self._queue(self._q.queue_get, (name,))

    async def queue_list(self, *, limit: int = 100) -> list[QueueRow]:
        return [row_to_queue(row) for row in await self._rows(self._q.queue_list, (Int8(limit),))]

    async def queue_pause(self, name: str) -> int:
        return await self._queue_control(self._q.queue_pause, name)

    async def queue_resume(self, name: str) -> int:
        return await self._queue_control(self._q.queue_resume, name)

    async def _queue_control(self, query: str, name: str) -> int:
        row = await self._row(query, (name, name, name, name))
        return int(row[0]) if row is not None else 0

    # --- notifications ------------------------------------------------------------------------

    def _channel(self, topic: str) -> str:
        """River's channel for ``topic``: prefixed with the schema when one is configured."""
        return f"{self._q.schema}.{topic}" if self._q.schema else topic

    async def notify_many(self, topic: str, payloads: Sequence[str]) -> None:
        """Send notifications; nothing on a server that has none (River sends none there)."""
        if payloads and self._q.notify:
            await self._count(self._q.notify_many, (self._channel(topic), _payloads(payloads)))

    # --- generic access -----------------------------------------------------------------------

    async def exec_script(self, sql_text: str) -> None:
        async def op(conn: psycopg.AsyncConnection[Any]) -> None:
            # No parameters: sent as a simple query, so several statements may run.
            await conn.execute(sql_text.encode(), prepare=False)

        await self._run(op)

    async def fetch_all(self, sql_text: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        # Without parameters the text is sent as is (a literal % needs no escaping), as
        # psycopg's own execute() does.
        return [tuple(r) for r in await self._rows(sql_text, params or None)]

    async def execute(self, sql_text: str, params: Sequence[Any] = ()) -> int:
        return await self._count(sql_text, params or None)

    async def table_exists(self, table: str) -> bool:
        row = await self._row(self._q.table_exists, (self._q.qualified(table),))
        return bool(row and row[0])

    async def column_exists(self, table: str, column: str) -> bool:
        row = await self._row(self._q.column_exists, (self._q.qualified(table), column))
        return bool(row and row[0])

    # --- observability ----------------------------------------------------------------------

    async def job_count_by_queue_and_state(
        self, *, states: Sequence[JobState]
    ) -> list[tuple[str, JobState, int]]:
        if not states:
            return []
        rows = await self._rows(self._q.job_count_by_queue_and_state, ([str(s) for s in states],))
        return [(q, JobState(st), int(n)) for q, st, n in rows]

    # --- client job and queue APIs (River's JobList/JobRetry/JobDelete/JobUpdate/QueueUpdate) ---

    async def job_list_query(self, query: JobListQuery) -> list[JobRow]:
        return await self._jobs(*job_list_statement(query, self._q.listing))

    async def job_retry(self, job_id: int) -> JobRow | None:
        return await self._job(self._q.job_retry, (Int8(job_id),))

    async def job_delete(self, job_id: int) -> JobRow | None:
        return await self._job(self._q.job_delete, (Int8(job_id),))

    async def job_delete_many(self, query: JobListQuery) -> list[JobRow]:
        where, args = list_where(query, self._q.listing)
        return await self._jobs(
            self._q.job_delete_many(where_text(where)), [*args, Int8(query.limit)]
        )

    async def job_update_metadata(self, job_id: int, metadata_updates: bytes) -> JobRow | None:
        values = (metadata_updates.decode(), Int8(job_id))
        return await self._job(self._q.job_update_metadata, values)

    async def queue_update(self, name: str, *, metadata: bytes | None = None) -> QueueRow | None:
        values = (metadata.decode() if metadata is not None else None, name)
        return await self._queue(self._q.queue_update, values)

    # --- named leases ------------------------------------------------------------------------------

    async def lease_take(self, *, name: str, holder: str, ttl: float) -> LeaseRow | None:
        values = {"name": name, "holder": holder, "ttl": float(ttl)}
        rows = await self._rows(self._q.lease_take, values)
        return _lease(rows[0]) if rows else None

    async def lease_renew(
        self, *, name: str, holder: str, taken_at: dt.datetime, ttl: float
    ) -> LeaseRow | None:
        require_aware(taken_at, "taken_at")
        values = {"name": name, "holder": holder, "taken_at": taken_at, "ttl": float(ttl)}
        rows = await self._rows(self._q.lease_renew, values)
        return _lease(rows[0]) if rows else None

    async def lease_release(self, *, name: str, holder: str, taken_at: dt.datetime) -> bool:
        require_aware(taken_at, "taken_at")
        values = {"name": name, "holder": holder, "taken_at": taken_at}
        return await self._count(self._q.lease_release, values) > 0

    # --- leadership and maintenance ---------------------------------------------------------------

    async def leader_delete_expired(self, *, now: dt.datetime | None = None) -> int:
        return await self._count(self._q.leader_delete_expired, {"now": _aware_or_none(now, "now")})

    async def leader_attempt_elect(
        self, *, leader_id: str, ttl: float, now: dt.datetime | None = None
    ) -> LeaderRow | None:
        rows = await self._rows(
            self._q.leader_attempt_elect,
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
        require_aware(elected_at, "elected_at")
        rows = await self._rows(
            self._q.leader_attempt_reelect,
            {
                "leader_id": leader_id,
                "elected_at": elected_at,
                "ttl": float(ttl),
                "now": _aware_or_none(now, "now"),
            },
        )
        return _leader(rows[0]) if rows else None

    async def leader_resign(self, *, leader_id: str, elected_at: dt.datetime) -> bool:
        require_aware(elected_at, "elected_at")
        rows = await self._rows(
            self._q.leader_resign,
            {"leader_id": leader_id, "elected_at": elected_at, "schema": self._q.schema},
        )
        return bool(rows and rows[0][0])

    async def leader_get_elected(self) -> LeaderRow | None:
        rows = await self._rows(self._q.leader_get_elected)
        return _leader(rows[0]) if rows else None

    async def job_schedule(
        self, *, horizon: dt.datetime, now: dt.datetime, limit: int
    ) -> list[ScheduledJob]:
        require_aware(horizon, "horizon")
        rows = await self._rows(
            self._q.job_schedule,
            {"horizon": horizon, "now": _aware_or_none(now, "now"), "limit": Int8(limit)},
        )
        return [
            ScheduledJob(job=job, conflict_discarded=bool(row[18]))
            for job, row in zip(rows_to_jobs(rows), rows, strict=True)
        ]

    async def job_get_cancel_requested(self, ids: Sequence[int]) -> list[int]:
        if not ids:
            return []
        rows = await self._rows(self._q.job_get_cancel_requested, ([int(i) for i in ids],))
        return [int(row[0]) for row in rows]

    async def job_get_stuck(
        self, *, stuck_horizon: dt.datetime, after_id: int = 0, limit: int
    ) -> list[JobRow]:
        require_aware(stuck_horizon, "stuck_horizon")
        rows = await self._rows(
            self._q.job_get_stuck,
            {"stuck_horizon": stuck_horizon, "after_id": Int8(after_id), "limit": Int8(limit)},
        )
        return rows_to_jobs(rows)

    async def job_rescue_many(
        self, rescues: Sequence[JobRescue], *, stuck_horizon: dt.datetime
    ) -> int:
        if not rescues:
            return 0
        return await self._count(self._q.job_rescue_many, _rescue_params(rescues, stuck_horizon))

    async def job_rescue_many_returning(
        self, rescues: Sequence[JobRescue], *, stuck_horizon: dt.datetime
    ) -> list[JobRow]:
        if not rescues:
            return []
        rows = await self._rows(
            self._q.job_rescue_many_returning, _rescue_params(rescues, stuck_horizon)
        )
        return rows_to_jobs(rows)

    async def job_delete_before(
        self,
        *,
        cancelled_before: dt.datetime | None,
        completed_before: dt.datetime | None,
        discarded_before: dt.datetime | None,
        limit: int,
    ) -> int:
        return await self._count(
            self._q.job_delete_before,
            {
                "cancelled": _aware_or_none(cancelled_before, "cancelled_before"),
                "completed": _aware_or_none(completed_before, "completed_before"),
                "discarded": _aware_or_none(discarded_before, "discarded_before"),
                "limit": Int8(limit),
            },
        )

    async def queue_delete_expired(self, *, updated_before: dt.datetime, limit: int) -> list[str]:
        require_aware(updated_before, "updated_before")
        rows = await self._rows(
            self._q.queue_delete_expired, {"horizon": updated_before, "limit": Int8(limit)}
        )
        return [r[0] for r in rows]

    async def notification_delete_before(self, *, created_before: dt.datetime, limit: int) -> int:
        require_aware(created_before, "created_before")
        return await self._count(
            self._q.notification_delete_before,
            {"horizon": created_before, "limit": Int8(limit)},
        )

    async def index_exists(self, name: str) -> bool:
        rows = await self._rows(self._q.index_exists, {"name": name, "schema": self._q.schema})
        return bool(rows and rows[0][0])

    async def index_reindex_artifacts(self, name: str) -> list[str]:
        rows = await self._rows(
            self._q.index_reindex_artifacts, {"name": name, "schema": self._q.schema}
        )
        return [r[0] for r in rows]

    async def index_reindex(self, name: str) -> None:
        await self._rows(self._q.index_reindex(name))

    async def index_drop_if_exists(self, name: str) -> None:
        await self._rows(self._q.index_drop_if_exists(name))

    # --- one-round-trip insert (runtime speed-ups) ------------------------------------------

    async def job_insert_fast_many_notify(
        self, params: Sequence[JobInsertParams], *, topic: str, payloads: Sequence[str]
    ) -> list[InsertedJob]:
        if not payloads or not self._q.notify:
            return await self.job_insert_fast_many(params)
        if not params:
            await self.notify_many(topic, payloads)
            return []
        leading = [self._channel(topic), _payloads(payloads)]
        q = self._q
        return await self._insert(
            q.job_insert_fast_many_notify, q.job_insert_one_notify, leading, params
        )

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
            require_aware(claimed_after, "claimed_after")
        if not within > 0:
            raise ValidationError("within", "must be > 0", within)
        values = {
            "queue": queue,
            "client_id": client_id,
            "claimed_after": claimed_after,
            "within": float(within),
            "running": [Int8(i) for i in running],
        }
        return rows_to_jobs(
            await self._rows(self._q.job_give_back_lost_claims, values, binary=True)
        )


def _rescue_params(rescues: Sequence[JobRescue], stuck_horizon: dt.datetime) -> dict[str, Any]:
    require_aware(stuck_horizon, "stuck_horizon")
    for r in rescues:
        require_aware(r.scheduled_at, "scheduled_at")
        if r.finalized_at is not None:
            require_aware(r.finalized_at, "finalized_at")
    try:
        errors = [r.error.decode() for r in rescues]
    except UnicodeDecodeError as exc:
        raise ValidationError("error", f"must be UTF-8 JSON: {exc}") from None
    return {
        "ids": [r.id for r in rescues],
        "errors": errors,
        "finalized_at": [r.finalized_at for r in rescues],
        "scheduled_at": [r.scheduled_at for r in rescues],
        "states": [JobState(r.state).value for r in rescues],
        "stuck_horizon": stuck_horizon,
    }


def _aware_or_none(value: dt.datetime | None, field: str) -> dt.datetime | None:
    if value is not None:
        require_aware(value, field)
    return value


def _leader(row: Sequence[Any]) -> LeaderRow:
    return LeaderRow(leader_id=row[0], elected_at=row[1], expires_at=row[2])


def _lease(row: Sequence[Any]) -> LeaseRow:
    return LeaseRow(name=row[0], holder=row[1], taken_at=row[2], expires_at=row[3])
