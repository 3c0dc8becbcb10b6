"""River's operations on the SQLite writer connection.

Every public method is one hop to the writer thread: the synchronous ``_op_*`` functions below
do a whole operation there, including building parameters and converting rows, so the event
loop only waits. Outside a transaction, writes run in ``BEGIN IMMEDIATE`` … ``COMMIT``.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import apsw

from ..._job import AttemptError, JobRow, JobState
from ..._timeutil import format_sqlite_timestamp, parse_rfc3339, parse_sqlite_timestamp
from .._protocol import InsertedJob, JobInsertParams
from ._connection import write_unit

if TYPE_CHECKING:
    from ._connection import ConnectionThread, Session
    from ._queries import Queries

__all__ = ["SQLiteExecutor", "job_rows", "unique_states_from_int"]

T = TypeVar("T")

_NONCE_KEY: Final = "river:unique_nonce"
_MASK64: Final = (1 << 64) - 1

# Bit n of unique_states is the n-th state in alphabetical order (River's layout).
_STATE_BITS: Final = tuple(sorted(JobState, key=lambda s: s.value))
_UNIQUE_STATES: Final = tuple(
    frozenset(s for n, s in enumerate(_STATE_BITS) if mask & (1 << n)) for mask in range(256)
)
_STATES_BY_VALUE: Final = {s.value: s for s in JobState}


def unique_states_from_int(mask: int | None) -> frozenset[JobState] | None:
    """The states of an 8-bit ``unique_states`` mask (``None`` stays ``None``)."""
    if mask is None:
        return None
    return _UNIQUE_STATES[mask & 0xFF]


def state_bit(state: JobState) -> int:
    return 1 << _STATE_BITS.index(state)


class _Timestamps:
    """Parses timestamp text, remembering recent values (a batch shares a handful)."""

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[str, dt.datetime] = {}

    def __call__(self, text: str) -> dt.datetime:
        value = self._cache.get(text)
        if value is None:
            if len(self._cache) > 256:
                self._cache.clear()
            value = self._cache[text] = parse_sqlite_timestamp(text)
        return value

    def optional(self, text: str | None) -> dt.datetime | None:
        return None if text is None else self(text)


def _attempt_error(obj: dict[str, Any]) -> AttemptError:
    return AttemptError(
        at=parse_rfc3339(obj["at"]),
        attempt=int(obj["attempt"]),
        error=str(obj.get("error", "")),
        trace=str(obj.get("trace") or ""),
    )


def job_rows(rows: Sequence[Sequence[Any]]) -> list[JobRow]:
    """JobRows from rows selected with :data:`~._queries.JOB_COLUMNS`.

    The JSON columns of all rows are decoded by one ``json.loads`` call: per-call overhead
    dominates for River's small documents.
    """
    if not rows:
        return []
    decoded = json.loads(
        "["
        + ",".join(f"[{r[1]},{r[10]},{r[15]},{r[4] or 'null'},{r[6] or 'null'}]" for r in rows)
        + "]"
    )
    ts = _Timestamps()
    out: list[JobRow] = []
    append = out.append
    for r, (args, metadata, tags, attempted_by, errors) in zip(rows, decoded, strict=True):
        append(
            JobRow(
                id=r[0],
                args=args,
                encoded_args=r[1].encode(),
                attempt=r[2],
                attempted_at=ts.optional(r[3]),
                attempted_by=tuple(attempted_by) if attempted_by else (),
                created_at=ts(r[5]),
                errors=tuple(_attempt_error(e) for e in errors) if errors else (),
                finalized_at=ts.optional(r[7]),
                kind=r[8],
                max_attempts=r[9],
                metadata=metadata,
                priority=r[11],
                queue=r[12],
                scheduled_at=ts(r[13]),
                state=_STATES_BY_VALUE[r[14]],
                tags=tuple(tags),
                unique_key=bytes(r[16]) if r[16] is not None else None,
                unique_states=unique_states_from_int(r[17]),
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# the insert batch


def _with_nonce(metadata: str, nonce: str) -> str:
    """``metadata`` (a JSON object) with ``river:unique_nonce`` set, edited as text when safe."""
    text = metadata.strip()
    if _NONCE_KEY not in text and text.endswith("}"):
        body = text[:-1].rstrip()
        sep = "" if body.endswith("{") else ","
        return f'{body}{sep}"{_NONCE_KEY}":"{nonce}"}}'
    obj = json.loads(text or "{}")
    obj[_NONCE_KEY] = nonce
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _batch(params: Sequence[JobInsertParams], nonces: Sequence[str] | None) -> str:
    """The whole batch as one JSON array of per-job arrays (positions: ``BATCH_FIELDS``).

    ``encoded_args`` and ``metadata`` are already JSON and are spliced in verbatim (SQLite
    validates them); repeated strings (kind, queue, state, tags) are encoded once.
    """
    dumps = json.dumps
    strings: dict[str, str] = {}
    tag_lists: dict[tuple[str, ...], str] = {}
    parts: list[str] = []
    for i, p in enumerate(params):
        kind = strings.get(p.kind) or strings.setdefault(p.kind, dumps(p.kind))
        queue = strings.get(p.queue) or strings.setdefault(p.queue, dumps(p.queue))
        state = strings.get(p.state) or strings.setdefault(p.state, dumps(str(p.state)))
        tags = tag_lists.get(p.tags)
        if tags is None:
            tags = tag_lists[p.tags] = dumps(list(p.tags))
        created = (
            '"' + format_sqlite_timestamp(p.created_at) + '"'
            if p.created_at is not None
            else "null"
        )
        scheduled = (
            '"' + format_sqlite_timestamp(p.scheduled_at) + '"'
            if p.scheduled_at is not None
            else "null"
        )
        unique_key = '"' + p.unique_key.hex() + '"' if p.unique_key else "null"
        unique_states = str(int(p.unique_states)) if p.unique_states else "null"
        metadata = p.metadata.decode() or "{}"
        if nonces is not None:
            metadata = _with_nonce(metadata, nonces[i])
        parts.append(
            f"[{p.encoded_args.decode() or '{}'},{kind},{int(p.max_attempts)},"
            f"{metadata},{int(p.priority)},{queue},{state},{tags},"
            f"{created},{scheduled},{unique_key},{unique_states}]"
        )
    return "[" + ",".join(parts) + "]"


def _nonces(n: int) -> list[str]:
    # 16 hex characters each, like River's; distinct within the batch.
    base = secrets.randbits(64)
    return [f"{(base + i) & _MASK64:016x}" for i in range(n)]


def _op_insert_fast_many(
    conn: apsw.Connection, q: Queries, params: Sequence[JobInsertParams]
) -> list[InsertedJob]:
    if not params:
        return []
    nonces = _nonces(len(params))
    rows = conn.execute(q.job_insert_fast_many, (_batch(params, nonces),)).fetchall()
    jobs = job_rows(rows)
    # Match rows to inputs by nonce, not by RETURNING order (which SQLite doesn't promise): an
    # input whose own nonce came back was inserted; any other input hit a unique conflict and
    # got back the existing row, the one holding its unique key.
    by_nonce: dict[object, JobRow] = {}
    by_key: dict[bytes, JobRow] = {}
    for row in jobs:
        by_nonce[row.metadata.get(_NONCE_KEY)] = row
        if row.unique_key is not None:
            by_key[row.unique_key] = row
    out: list[InsertedJob] = []
    for p, nonce in zip(params, nonces, strict=True):
        inserted = by_nonce.get(nonce)
        if inserted is not None:
            out.append(InsertedJob(job=inserted, unique_skipped_as_duplicate=False))
            continue
        existing = by_key.get(p.unique_key) if p.unique_key else None
        if existing is None:  # pragma: no cover - would be a SQLite behaviour change
            raise RuntimeError("sqlite: an inserted job came back neither inserted nor conflicting")
        out.append(InsertedJob(job=existing, unique_skipped_as_duplicate=True))
    return out


def _op_insert_no_returning(
    conn: apsw.Connection, q: Queries, params: Sequence[JobInsertParams]
) -> int:
    if not params:
        return 0
    before = conn.total_changes()
    conn.execute(q.job_insert_fast_many_no_returning, (_batch(params, None),))
    return conn.total_changes() - before


def _op_job_get(conn: apsw.Connection, q: Queries, job_id: int) -> JobRow | None:
    rows = conn.execute(q.job_get_by_id, (job_id,)).fetchall()
    return job_rows(rows)[0] if rows else None


def _op_job_list(
    conn: apsw.Connection, q: Queries, where: list[str], args: list[Any], limit: int
) -> list[JobRow]:
    sql = q.job_list_select
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY id LIMIT ?"
    return job_rows(conn.execute(sql, (*args, limit)).fetchall())


def _op_notify_many(conn: apsw.Connection, q: Queries, topic: str, payloads: str) -> None:
    conn.execute(q.notify_many, (topic, payloads))


def _op_exec_script(conn: apsw.Connection, sql: str) -> None:
    for _ in conn.execute(sql):  # statements returning rows only run as they are iterated
        pass


def _op_fetch_all(
    conn: apsw.Connection, sql: str, params: tuple[Any, ...]
) -> list[tuple[Any, ...]]:
    return conn.execute(sql, params).fetchall()


def _op_execute(conn: apsw.Connection, sql: str, params: tuple[Any, ...]) -> int:
    before = conn.total_changes()
    conn.execute(sql, params).fetchall()
    return conn.total_changes() - before


def _op_count(conn: apsw.Connection, sql: str, params: tuple[Any, ...]) -> int:
    row = conn.execute(sql, params).fetchone()
    return int(row[0]) if row else 0


# ---------------------------------------------------------------------------------------------


class SQLiteExecutor:
    """River's operations on the SQLite writer connection (one hop per call).

    Two flavours: the driver's own (``driver.executor()``: each call is its own unit of work,
    writes wrapped in ``BEGIN IMMEDIATE`` … ``COMMIT``) and a transaction's (the one
    ``driver.transaction()`` yields: calls run inside that transaction, and only while it is
    open).
    """

    __slots__ = ("_closed", "_on_notify", "_q", "_session", "_writer")

    def __init__(
        self,
        writer: ConnectionThread,
        queries: Queries,
        *,
        session: Session | None = None,
        on_notify: Callable[[], None] | None = None,
    ) -> None:
        self._writer = writer
        self._q = queries
        self._session = session
        self._on_notify = on_notify
        self._closed = False

    @property
    def dialect(self) -> Literal["sqlite"]:
        return "sqlite"

    @property
    def in_transaction(self) -> bool:
        """Whether this executor belongs to a ``driver.transaction()`` block."""
        return self._session is not None

    # ---- plumbing -------------------------------------------------------------------------------

    def _check(self) -> None:
        if self._closed:
            raise RuntimeError(
                "this SQLite executor's transaction has ended; use it only inside its "
                "'async with driver.transaction()' block"
            )

    async def _read(self, fn: Callable[[apsw.Connection], T]) -> T:
        self._check()
        if self._session is not None:
            return await self._session.run(fn)
        return await self._writer.run(fn)

    async def _write(self, fn: Callable[[apsw.Connection], T]) -> T:
        self._check()
        if self._session is not None:
            return await self._session.run(fn)
        return await self._writer.run(write_unit, fn)

    # ---- jobs ---------------------------------------------------------------------------------

    async def job_insert_fast_many(self, params: Sequence[JobInsertParams]) -> list[InsertedJob]:
        """Insert a batch in one statement; unique conflicts return the existing row, flagged.

        Results are in input order. A job whose unique key repeats an earlier job's in the same
        batch comes back as a duplicate of that job.
        """
        q = self._q
        batch = list(params)
        return await self._write(lambda c: _op_insert_fast_many(c, q, batch))

    async def job_insert_fast_many_no_returning(self, params: Sequence[JobInsertParams]) -> int:
        """Insert a batch, skipping unique conflicts; returns how many rows were inserted."""
        q = self._q
        batch = list(params)
        return await self._write(lambda c: _op_insert_no_returning(c, q, batch))

    async def job_get_by_id(self, job_id: int) -> JobRow | None:
        q = self._q
        return await self._read(lambda c: _op_job_get(c, q, job_id))

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
        """Jobs matching every given filter, ordered by id ascending."""
        where: list[str] = []
        args: list[Any] = []
        for column, values in (("id", ids), ("kind", kinds), ("queue", queues)):
            if values is not None:
                where.append(f"{column} IN (SELECT value FROM json_each(?))")
                args.append(json.dumps(list(values)))
        if states is not None:
            where.append("state IN (SELECT value FROM json_each(?))")
            args.append(json.dumps([JobState(s).value for s in states]))
        if after_id is not None:
            where.append("id > ?")
            args.append(int(after_id))
        q = self._q
        return await self._read(lambda c: _op_job_list(c, q, where, args, int(limit)))

    # ---- notifications ----------------------------------------------------------------------------

    async def notify_many(self, topic: str, payloads: Sequence[str]) -> None:
        """Append rows to River's ``river_notification`` outbox (visible at commit)."""
        if not payloads:
            return
        q = self._q
        encoded = json.dumps(list(payloads))
        await self._write(lambda c: _op_notify_many(c, q, topic, encoded))
        if self._session is not None:
            self._session.notified = True
        elif self._on_notify is not None:
            self._on_notify()

    # ---- generic access ----------------------------------------------------------------------------

    async def exec_script(self, sql: str) -> None:
        """Run a multi-statement script (inside a transaction: don't include BEGIN/COMMIT)."""
        await self._write(lambda c: _op_exec_script(c, sql))

    async def fetch_all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (``?`` placeholders) and return its rows.

        Outside a transaction it runs in autocommit mode: one statement is its own transaction.
        """
        bound = tuple(params)
        return await self._read(lambda c: _op_fetch_all(c, sql, bound))

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement (``?`` placeholders); returns the number of rows it changed."""
        bound = tuple(params)
        return await self._write(lambda c: _op_execute(c, sql, bound))

    async def table_exists(self, table: str) -> bool:
        sql = self._q.table_exists
        return await self._read(lambda c: _op_count(c, sql, (table,))) > 0

    async def column_exists(self, table: str, column: str) -> bool:
        sql = self._q.column_exists
        schema = self._q.schema or "main"
        return await self._read(lambda c: _op_count(c, sql, (table, schema, column))) > 0
