"""River's operations on the SQLite writer connection.

Every public method is one hop to the writer thread: the synchronous ``_op_*`` functions below
do a whole operation there, including building parameters and converting rows, so the event
loop only waits. Outside a transaction, writes run in ``BEGIN IMMEDIATE`` … ``COMMIT``.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import apsw

from ..._errors import MigrationError, ValidationError
from ..._job import AttemptError, JobRow, JobState, UndecodableJobRow
from ..._queue_limits import RateLimit, RateWindow, limits_table_missing, micros
from ..._timeutil import (
    format_rfc3339nano,
    format_sqlite_timestamp,
    parse_sqlite_timestamp,
    utc_now,
)
from ..._unique import UNIQUE_STATES_BY_MASK
from .._decode import (
    attempt_error_value,
    attempt_errors_json,
    decode_failure,
    json_type,
    string_list,
)
from .._protocol import (
    TOPIC_CONTROL,
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
    where_text,
)
from ._connection import write_unit

if TYPE_CHECKING:
    from ._connection import ConnectionThread, Session
    from ._queries import Queries

__all__ = ["SQLiteExecutor", "job_rows", "queue_rows"]

T = TypeVar("T")

_NONCE_KEY: Final = UNIQUE_NONCE_KEY
_MASK64: Final = (1 << 64) - 1
_json_decode = json.JSONDecoder().decode
#: A column's value when it is not JSON.
_UNDECODED: Final = object()


def _parse_timestamp(text: str) -> dt.datetime:
    """:func:`parse_sqlite_timestamp`, with a fast path for the ISO-like texts most rows hold."""
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:  # Go's Time.String() form, among others
        return parse_sqlite_timestamp(text)
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


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
            value = self._cache[text] = _parse_timestamp(text)
        return value

    def optional(self, text: str | None) -> dt.datetime | None:
        return None if text is None else self(text)


def job_rows(rows: Sequence[Sequence[Any]]) -> list[JobRow]:
    """JobRows from rows selected with :data:`~._queries.JOB_COLUMNS`.

    The JSON columns of all rows are decoded by one ``json.loads`` call: per-call overhead
    dominates for River's small documents. A row whose columns do not decode that way (text
    that is not JSON, values of the wrong shape, attempt errors River did not write) is
    decoded on its own by :func:`_job_row`.
    """
    if not rows:
        return []
    ts = _Timestamps()
    try:
        decoded = json.loads(
            "["
            + ",".join(f"[{r[1]},{r[10]},{r[15]},{r[4] or 'null'},{r[6] or 'null'}]" for r in rows)
            + "]"
        )
        out: list[JobRow] = []
        append = out.append
        for r, (args, metadata, tags, attempted_by, errors) in zip(rows, decoded, strict=True):
            errs = [attempt_error_value(e) for e in errors] if errors else ()
            by = string_list(attempted_by)
            tag_list = string_list(tags)
            if (
                type(metadata) is not dict
                or by is None
                or tag_list is None
                or None in errs
                or type(errors) not in (list, type(None))
                or (r[17] is not None and not 0 <= r[17] <= 0xFF)
            ):
                append(_job_row(r, ts))
                continue
            append(
                make_job(  # positional, in JobRow's field order
                    r[0],
                    args,
                    r[1].encode(),
                    r[2],
                    ts.optional(r[3]),
                    by,
                    ts(r[5]),
                    tuple(errs),
                    ts.optional(r[7]),
                    r[8],
                    r[9],
                    metadata,
                    r[11],
                    r[12],
                    ts(r[13]),
                    STATE_BY_NAME[r[14]],
                    tag_list,
                    bytes(r[16]) if r[16] is not None else None,
                    None if r[17] is None else UNIQUE_STATES_BY_MASK[r[17]],
                )
            )
    except ValueError:  # some row holds text that is not JSON
        return [_job_row(r, ts) for r in rows]
    return out


def _job_row(r: Sequence[Any], ts: _Timestamps) -> JobRow:
    """One row, each JSON column decoded on its own: a row with a column that cannot be
    decoded is an :class:`UndecodableJobRow`, that column left empty, as River Go's SQLite
    driver reads it."""
    problems: list[str] = []

    def decoded(column: str, text: str | None) -> Any:
        try:
            return None if text is None else _json_decode(text)
        except ValueError as exc:
            problems.append(decode_failure(column, exc))
            return _UNDECODED

    args = decoded("args", r[1])
    encoded_args = r[1].encode() if args is not _UNDECODED else b""
    if args is _UNDECODED:
        args = {}
    strings: dict[str, tuple[str, ...]] = {}
    for column, text in (("attempted_by", r[4]), ("tags", r[15])):
        value = decoded(column, text)
        got = string_list(value) if value is not _UNDECODED else ()
        if got is None:
            problems.append(decode_failure(column, f"cannot unmarshal {json_type(value)}"))
        strings[column] = got or ()
    errors: tuple[AttemptError, ...] = ()
    if r[6] is not None:
        try:
            errors = attempt_errors_json(r[6])
        except ValueError as exc:
            problems.append(decode_failure("errors", exc))
    metadata = decoded("metadata", r[10])
    if metadata is not _UNDECODED and type(metadata) is not dict:
        problems.append(
            decode_failure("metadata", f"cannot unmarshal {json_type(metadata)} into an object")
        )
    unique_states = r[17]
    if unique_states is not None and not 0 <= unique_states <= 0xFF:
        problems.append(f"value out of range for byte: {unique_states}")
        unique_states = None
    fields: dict[str, Any] = {
        "id": r[0],
        "args": args,
        "encoded_args": encoded_args,
        "attempt": r[2],
        "attempted_at": ts.optional(r[3]),
        "attempted_by": strings["attempted_by"],
        "created_at": ts(r[5]),
        "errors": errors,
        "finalized_at": ts.optional(r[7]),
        "kind": r[8],
        "max_attempts": r[9],
        "metadata": metadata if type(metadata) is dict else {},
        "priority": r[11],
        "queue": r[12],
        "scheduled_at": ts(r[13]),
        "state": STATE_BY_NAME[r[14]],
        "tags": strings["tags"],
        "unique_key": bytes(r[16]) if r[16] is not None else None,
        "unique_states": None if unique_states is None else UNIQUE_STATES_BY_MASK[unique_states],
    }
    if problems:
        return UndecodableJobRow(**fields, decode_error="\n".join(problems))
    return JobRow(**fields)


def queue_rows(rows: Sequence[Sequence[Any]]) -> list[QueueRow]:
    """QueueRows from rows selected with :data:`~._queries.QUEUE_COLUMNS`."""
    parse = parse_sqlite_timestamp
    return [
        QueueRow(
            name=r[0],
            created_at=parse(r[1]),
            metadata=json.loads(r[2]) if r[2] is not None else {},
            paused_at=parse(r[3]) if r[3] is not None else None,
            updated_at=parse(r[4]),
        )
        for r in rows
    ]


def _now() -> str:
    """This moment as River's SQLite timestamp text (the writer thread's clock)."""
    return format_sqlite_timestamp(utc_now())


def _control(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# the insert batch


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
            metadata = metadata_with_nonce(metadata, nonces[i])
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


# ---------------------------------------------------------------------------------------------
# the runtime's hot path


class _ClaimClock:
    """Claim times (``attempted_at``) strictly increasing in this process.

    River's SQLite text holds milliseconds, so two claims within one would share a time, and
    the recovery of a claim whose reply was lost (the client's rows attempted *after* the last
    claim whose rows arrived) could not tell them apart. A claim within the millisecond of the
    previous one (or up to a second before it: a claim rate beyond one per millisecond) takes
    the next millisecond; a clock set further back is followed.
    """

    __slots__ = ("_last", "_lock")

    _STEP: Final = dt.timedelta(milliseconds=1)
    _FOLLOW_BACK: Final = dt.timedelta(seconds=1)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dt.datetime | None = None

    def __call__(self) -> dt.datetime:
        """This moment, to the millisecond as stored, after every time returned before."""
        at = utc_now() + _HALF_MS  # rounded to the millisecond as stored (halves up)
        at = at.replace(microsecond=at.microsecond - at.microsecond % 1000)
        with self._lock:
            last = self._last
            if last is not None and last - self._FOLLOW_BACK < at <= last:
                at = last + self._STEP
            self._last = at
        return at


_claim_clock: Final = _ClaimClock()


def _op_claim(
    conn: apsw.Connection, sql: tuple[str, str], args: tuple[Any, ...], now: str | None = None
) -> list[JobRow]:
    """``args``: queue, max_to_lock, max_attempted_by, kinds (JSON or None), client id.
    ``now``: the claim's time (default: the claim clock's next)."""
    candidates, update = sql
    queue, max_to_lock, max_attempted_by, kinds, client_id = args
    at = format_sqlite_timestamp(_claim_clock()) if now is None else now
    read = (queue, max_to_lock, at) if kinds is None else (queue, max_to_lock, at, None, kinds)
    ids = [str(row[0]) for row in conn.execute(candidates, read)]
    if not ids:
        return []
    chosen = "[" + ",".join(ids) + "]"
    rows = conn.execute(update, (queue, chosen, at, max_attempted_by, kinds, client_id)).fetchall()
    # RETURNING order is unspecified: put the rows back in claim order (the columns compared
    # are the ones the claim sorted on, as stored).
    rows.sort(key=lambda r: (r[11], r[13], r[0]))
    return job_rows(rows)


def _op_claim_limited(
    conn: apsw.Connection,
    q: Queries,
    sql: tuple[str, str],
    args: tuple[Any, ...],
    rate_limit: RateLimit | None,
    global_max_workers: int | None,
) -> LimitedClaim:
    """A claim bounded by the queue's global limits, inside the claim's write transaction
    (``args``: the claim's, ``limit`` second). SQLite serialises writers, so the transaction
    is the lock."""
    queue, wanted = args[0], args[1]
    try:
        (starts,) = conn.execute(q.queue_limit_lock, (queue,)).fetchone()  # type: ignore[misc]
    except Exception as exc:  # apsw.SQLError, or a sqlite_module's OperationalError
        if "no such table" in str(exc):
            raise MigrationError(limits_table_missing(queue)) from None
        raise
    at = _claim_clock()
    now_text, now = format_sqlite_timestamp(at), micros(at)
    window = RateWindow.decode(starts) if rate_limit is not None else None
    allowed = wanted
    if window is not None and rate_limit is not None:
        allowed = min(allowed, window.allowance(now, rate_limit))
    if global_max_workers is not None and allowed > 0:
        (running,) = conn.execute(q.queue_limit_running, (queue,)).fetchone()  # type: ignore[misc]
        allowed = max(0, min(allowed, global_max_workers - running))
    jobs = _op_claim(conn, sql, (queue, allowed, *args[2:]), now_text) if allowed > 0 else []
    reopens_in = 0.0
    if window is not None and rate_limit is not None:
        if jobs:
            window.record(now, len(jobs), rate_limit)
            conn.execute(q.queue_limit_save, (window.encode(), queue, now_text))
        reopens_in = window.reopens_in(now, rate_limit)
    return LimitedClaim(jobs=jobs, allowed=allowed, reopens_in=reopens_in)


_HALF_MS: Final = dt.timedelta(microseconds=500)
_TS_MAX: Final = dt.datetime.max.replace(tzinfo=dt.UTC) - _HALF_MS


def _sqlite_ts(value: dt.datetime) -> str:
    """:func:`format_sqlite_timestamp` (milliseconds, rounded halves up), several times faster
    (the completion batch's hot spot)."""
    offset = value.utcoffset()
    if offset is None or value >= _TS_MAX:
        return format_sqlite_timestamp(value)  # raises: naive datetimes are refused
    if offset:
        value = value.astimezone(dt.UTC)
    return (value + _HALF_MS).isoformat(" ", "milliseconds")[:23]  # without the "+00:00"


def _json_text(value: bytes | None) -> str:
    return value.decode() if value else "null"


def _completion_batch(completions: Sequence[Completion]) -> str:
    """The completions as one JSON array of arrays (positions: ``COMPLETION_FIELDS``).

    ``error`` and ``metadata_updates`` are encoded JSON objects, spliced in verbatim.
    """
    parts: list[str] = []
    append = parts.append
    for c in completions:
        fin = "null" if c.finalized_at is None else '"' + _sqlite_ts(c.finalized_at) + '"'
        sched = "null" if c.scheduled_at is None else '"' + _sqlite_ts(c.scheduled_at) + '"'
        new = "null" if c.attempt_new is None else str(int(c.attempt_new))
        append(
            f'[{int(c.id)},{int(c.attempt)},"{c.state}",{fin},{sched},'
            f"{_json_text(c.error)},{_json_text(c.metadata_updates)},{new}]"
        )
    return "[" + ",".join(parts) + "]"


def _waves(completions: Sequence[Completion]) -> list[list[int]]:
    """Input positions grouped so that no id repeats within a group; the n-th group holds the
    n-th completion of each id, so repeated ids are applied in input order."""
    seen: dict[int, int] = {}
    waves: list[list[int]] = []
    for i, c in enumerate(completions):
        n = seen.get(c.id, 0)
        seen[c.id] = n + 1
        if n == len(waves):
            waves.append([])
        waves[n].append(i)
    return waves


def _op_complete(
    conn: apsw.Connection,
    q: Queries,
    completions: Sequence[Completion],
    client_id: str,
    return_rows: bool = True,
) -> list[CompletionResult]:
    """Every completion, in the caller's transaction: one guarded UPDATE for the batch, then
    (only for completions whose guard failed) a metadata merge or a plain read."""
    now = _now()
    found: list[tuple[Any, bool] | None] = [None] * len(completions)
    for wave in _waves(completions):
        batch = [completions[i] for i in wave]
        rows = _op_rows(conn, q.job_complete_if_running, (_completion_batch(batch), now, client_id))
        by_id: dict[int, tuple[Any, bool]] = {r[0]: (r, True) for r in rows}
        if len(by_id) < len(batch):
            rest = [c for c in batch if c.id not in by_id]
            merge = [
                f"[{int(c.id)},{c.metadata_updates.decode()}]" for c in rest if c.metadata_updates
            ]
            if merge:
                rows = _op_rows(conn, q.job_merge_metadata, ("[" + ",".join(merge) + "]",))
                by_id.update((r[0], (r, False)) for r in rows)
            plain = [int(c.id) for c in rest if c.id not in by_id]
            if plain:
                rows = _op_rows(conn, q.job_get_many, (json.dumps(plain),))
                by_id.update((r[0], (r, False)) for r in rows)
        for i, c in zip(wave, batch, strict=True):
            found[i] = by_id.get(c.id)
    hits = [f for f in found if f is not None]
    if not return_rows:
        return [CompletionResult(id=row[0], applied=False) for row, applied in hits if not applied]
    jobs = job_rows([row for row, _ in hits])
    return [
        CompletionResult(id=job.id, job=job, applied=applied)
        for job, (_, applied) in zip(jobs, hits, strict=True)
    ]


def _op_cancel(
    conn: apsw.Connection, q: Queries, job_id: int, attempted_at: str, notify: bool
) -> tuple[JobRow | None, bool]:
    """The job after River's JobCancel, and whether a notification row was written."""
    rows = conn.execute(q.job_cancel, (job_id, attempted_at, _now())).fetchall()
    if not rows:  # finalized (returned as is) or missing
        rows = conn.execute(q.job_get_by_id, (job_id,)).fetchall()
        return (job_rows(rows)[0] if rows else None), False
    job = job_rows(rows)[0]
    if notify:
        payload = _control({"action": "cancel", "job_id": job.id, "queue": job.queue})
        conn.execute(q.notify_one, (TOPIC_CONTROL, payload))
    return job, notify


def _op_queue_upsert(conn: apsw.Connection, q: Queries, name: str, metadata: str) -> QueueRow:
    rows = conn.execute(q.queue_create_or_set_updated_at, (name, metadata, _now())).fetchall()
    return queue_rows(rows)[0]


def _op_queue_set_paused(
    conn: apsw.Connection, q: Queries, name: str, action: Literal["pause", "resume"]
) -> int:
    sql = q.queue_pause if action == "pause" else q.queue_resume
    conn.execute(sql, (name, _now())).fetchall()
    matched = conn.changes()
    if matched or name == "*":
        conn.execute(q.notify_one, (TOPIC_CONTROL, _control({"action": action, "queue": name})))
    return matched


def _op_notify_many(conn: apsw.Connection, q: Queries, topic: str, payloads: str) -> None:
    conn.execute(q.notify_many, (topic, payloads))


def _op_exec_script(conn: apsw.Connection, sql: str) -> None:
    for _ in conn.execute(sql):  # statements returning rows only run as they are iterated
        pass


# One statement, one way of reading its result: the operations below are built from these.


def _op_rows(conn: apsw.Connection, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    return conn.execute(sql, params).fetchall()


def _op_jobs(conn: apsw.Connection, sql: str, params: tuple[Any, ...]) -> list[JobRow]:
    return job_rows(conn.execute(sql, params).fetchall())


def _op_job(conn: apsw.Connection, sql: str, params: tuple[Any, ...]) -> JobRow | None:
    rows = conn.execute(sql, params).fetchall()
    return job_rows(rows)[0] if rows else None


def _op_queue(conn: apsw.Connection, sql: str, params: tuple[Any, ...]) -> QueueRow | None:
    rows = conn.execute(sql, params).fetchall()
    return queue_rows(rows)[0] if rows else None


def _op_execute(conn: apsw.Connection, sql: str, params: tuple[Any, ...]) -> int:
    before = conn.total_changes()
    conn.execute(sql, params).fetchall()
    return conn.total_changes() - before


def _op_count(conn: apsw.Connection, sql: str, params: tuple[Any, ...]) -> int:
    row = conn.execute(sql, params).fetchone()
    return int(row[0]) if row else 0


# ---------------------------------------------------------------------------------------------


class SQLiteExecutor(SharedOperations):
    """River's operations on the SQLite writer connection (one hop per call).

    Two flavours: the driver's own (``driver.executor()``: each call is its own unit of work,
    writes wrapped in ``BEGIN IMMEDIATE`` … ``COMMIT``) and a transaction's (the one
    ``driver.transaction()`` yields: calls run inside that transaction, and only while it is
    open).
    """

    __slots__ = ("_on_notify", "_q", "_session", "_writer")

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

    @property
    def dialect(self) -> Literal["sqlite"]:
        return "sqlite"

    @property
    def in_transaction(self) -> bool:
        """Whether this executor belongs to a ``driver.transaction()`` block."""
        return self._session is not None

    @property
    def schema(self) -> str | None:
        """The attached database River's tables are in (None: ``main``)."""
        return self._q.schema

    def on_schema(self, queries: Queries, on_notify: Callable[[], None] | None) -> SQLiteExecutor:
        """This executor's connection (and transaction, if any) with the statements of another
        attached database; ``on_notify`` pokes that driver's listeners."""
        return SQLiteExecutor(self._writer, queries, session=self._session, on_notify=on_notify)

    # ---- plumbing -------------------------------------------------------------------------------

    def _check(self) -> None:
        session = self._session
        if session is not None and session.ended:
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

    async def _write_one(self, fn: Callable[[apsw.Connection], T]) -> T:
        """A write that is ONE statement: outside a transaction it runs in autocommit, where
        SQLite takes the write lock when the statement starts (busy handler and all, as
        ``BEGIN IMMEDIATE``) and commits when it ends, saving the BEGIN and COMMIT round trips
        (an idle client's fetch poll and leader re-election: 3 statements become 1)."""
        self._check()
        if self._session is not None:
            return await self._session.run(fn)
        return await self._writer.run(fn)

    # ---- jobs ---------------------------------------------------------------------------------

    async def job_insert_fast_many(self, params: Sequence[JobInsertParams]) -> list[InsertedJob]:
        """Insert a batch in one statement; unique conflicts return the existing row, flagged.

        Results are in input order. A batch holding one unique key twice is refused, as River
        refuses it.
        """
        refuse_repeated_unique_keys(params)
        q = self._q
        batch = list(params)
        return await self._write(lambda c: _op_insert_fast_many(c, q, batch))

    async def job_insert_fast_many_no_returning(self, params: Sequence[JobInsertParams]) -> int:
        """Insert a batch, skipping unique conflicts; returns how many rows were inserted."""
        q = self._q
        batch = list(params)
        return await self._write(lambda c: _op_insert_no_returning(c, q, batch))

    async def job_get_by_id(self, job_id: int) -> JobRow | None:
        sql = self._q.job_get_by_id
        return await self._read(lambda c: _op_job(c, sql, (job_id,)))

    # ---- the runtime's hot path -------------------------------------------------------------

    async def job_get_available(
        self,
        *,
        queue: str,
        max_to_lock: int,
        client_id: str,
        max_attempted_by: int = 100,
        kinds: Sequence[str] | None = None,
    ) -> list[JobRow]:
        """Claim up to ``max_to_lock`` due ``available`` jobs of ``queue``, in claim order.

        The candidates' ids read without the write lock, then one ``UPDATE … RETURNING`` of
        those still available (see ``Queries._claim``); ``attempted_at`` is the writer's clock.
        """
        if max_to_lock <= 0 or (kinds is not None and not kinds):
            return []
        if kinds is None:
            sql, kinds_json = self._q.job_get_available, None
        else:
            sql, kinds_json = self._q.job_get_available_kinds, json.dumps(list(kinds))
        args = (queue, int(max_to_lock), max(int(max_attempted_by), 1), kinds_json, client_id)
        return await self._write_one(lambda c: _op_claim(c, sql, args))

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
        """:meth:`job_get_available` bounded by the queue's global limits: one hop, one
        write transaction."""
        if max_to_lock <= 0 or (kinds is not None and not kinds):
            return LimitedClaim(jobs=[], allowed=0)
        q = self._q
        if kinds is None:
            sql, kinds_json = q.job_get_available, None
        else:
            sql, kinds_json = q.job_get_available_kinds, json.dumps(list(kinds))
        args = (queue, int(max_to_lock), max(int(max_attempted_by), 1), kinds_json, client_id)
        return await self._write(
            lambda c: _op_claim_limited(c, q, sql, args, rate_limit, global_max_workers)
        )

    async def job_set_state_if_running_many(
        self, completions: Sequence[Completion], *, client_id: str, return_rows: bool = True
    ) -> list[CompletionResult]:
        """Persist finished attempts: one hop, one transaction, results in input order.

        One statement over the batch (a repeated id runs after its earlier completion), with
        the attempt guard; metadata updates are merged (top-level keys replaced) either way.
        """
        if not completions:
            return []
        q = self._q
        batch = list(completions)
        return await self._write(lambda c: _op_complete(c, q, batch, client_id, return_rows))

    async def job_cancel(
        self, *, job_id: int, cancel_attempted_at: dt.datetime, notify: bool = True
    ) -> JobRow | None:
        """River's JobCancel, plus a ``river_control`` cancel row when the job changed."""
        q = self._q
        at = format_rfc3339nano(cancel_attempted_at.astimezone(dt.UTC))
        job, notified = await self._write(lambda c: _op_cancel(c, q, int(job_id), at, notify))
        if notified:
            self._notified()
        return job

    # ---- queues ----------------------------------------------------------------------------

    async def queue_create_or_set_updated_at(
        self, *, name: str, metadata: bytes = b"{}"
    ) -> QueueRow:
        """Insert the queue's row, or bump its ``updated_at`` (metadata is kept); return it."""
        q = self._q
        text = metadata.decode() or "{}"
        return await self._write(lambda c: _op_queue_upsert(c, q, name, text))

    async def queue_get(self, name: str) -> QueueRow | None:
        sql = self._q.queue_get
        return await self._read(lambda c: _op_queue(c, sql, (name,)))

    async def queue_list(self, *, limit: int = 100) -> list[QueueRow]:
        """Queues ordered by name."""
        sql, bound = self._q.queue_list, (int(limit),)
        return await self._read(lambda c: queue_rows(_op_rows(c, sql, bound)))

    async def queue_pause(self, name: str) -> int:
        """Pause ``name`` (``"*"``: all) unless paused; returns the rows matched.

        A ``pause`` control notification is written when a row matched (always for ``"*"``).
        """
        return await self._set_paused(name, "pause")

    async def queue_resume(self, name: str) -> int:
        """Resume ``name`` (``"*"``: all); returns the rows matched; notifies as pause does."""
        return await self._set_paused(name, "resume")

    async def _set_paused(self, name: str, action: Literal["pause", "resume"]) -> int:
        q = self._q
        matched = await self._write(lambda c: _op_queue_set_paused(c, q, name, action))
        if matched or name == "*":
            self._notified()
        return matched

    # ---- notifications ----------------------------------------------------------------------------

    def _notified(self) -> None:
        """Notification rows were written: poke listeners (after commit, in a transaction)."""
        if self._session is not None:
            self._session.notified = True
        elif self._on_notify is not None:
            self._on_notify()

    async def notify_many(self, topic: str, payloads: Sequence[str]) -> None:
        """Append rows to River's ``river_notification`` outbox (visible at commit)."""
        if not payloads:
            return
        q = self._q
        encoded = json.dumps(list(payloads))
        await self._write(lambda c: _op_notify_many(c, q, topic, encoded))
        self._notified()

    # ---- generic access ----------------------------------------------------------------------------

    # SQL given here may write to the outbox: listeners are poked after it as after a
    # notification, since they account for this driver's commits without reading it.

    async def exec_script(self, sql: str) -> None:
        """Run a multi-statement script (inside a transaction: don't include BEGIN/COMMIT)."""
        await self._write(lambda c: _op_exec_script(c, sql))
        self._notified()

    async def fetch_all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (``?`` placeholders) and return its rows.

        Outside a transaction it runs in autocommit mode: one statement is its own transaction.
        """
        bound = tuple(params)
        rows = await self._read(lambda c: _op_rows(c, sql, bound))
        self._notified()
        return rows

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement (``?`` placeholders); returns the number of rows it changed."""
        bound = tuple(params)
        changed = await self._write(lambda c: _op_execute(c, sql, bound))
        self._notified()
        return changed

    async def table_exists(self, table: str) -> bool:
        sql = self._q.table_exists
        return await self._read(lambda c: _op_count(c, sql, (table,))) > 0

    async def column_exists(self, table: str, column: str) -> bool:
        sql = self._q.column_exists
        schema = self._q.schema or "main"
        return await self._read(lambda c: _op_count(c, sql, (table, schema, column))) > 0

    # ---- observability ------------------------------------------------------------------------

    async def job_count_by_queue_and_state(
        self, *, states: Sequence[JobState]
    ) -> list[tuple[str, JobState, int]]:
        if not states:
            return []
        sql = self._q.job_count_by_queue_and_state(len(states))
        bound = tuple(str(s) for s in states)
        rows = await self._read(lambda c: _op_rows(c, sql, bound))
        return [(q, JobState(st), int(n)) for q, st, n in rows]

    # ---- client job and queue APIs (River's JobList/JobRetry/JobDelete/JobUpdate/QueueUpdate)

    async def job_list_query(self, query: JobListQuery) -> list[JobRow]:
        """River's JobList; a ``metadata`` containment filter is PostgreSQL only."""
        sql, args = job_list_statement(query, self._q.listing)
        bound = tuple(args)
        return await self._read(lambda c: _op_jobs(c, sql, bound))

    async def job_retry(self, job_id: int) -> JobRow | None:
        sql = self._q.job_retry
        get = self._q.job_get_by_id
        return await self._write(lambda c: _op_update_or_get(c, sql, (int(job_id), _now()), get))

    async def job_delete(self, job_id: int) -> JobRow | None:
        sql = self._q.job_delete
        get = self._q.job_get_by_id
        return await self._write(lambda c: _op_update_or_get(c, sql, (int(job_id),), get))

    async def job_delete_many(self, query: JobListQuery) -> list[JobRow]:
        where, args = list_where(query, self._q.listing)
        sql = self._q.job_delete_many(where_text(where))
        bound = (*args, int(query.limit))
        return await self._write(lambda c: sorted(_op_jobs(c, sql, bound), key=lambda r: r.id))

    async def job_update_metadata(self, job_id: int, metadata_updates: bytes) -> JobRow | None:
        sql = self._q.job_update_metadata
        bound = (int(job_id), metadata_updates.decode())
        return await self._write(lambda c: _op_job(c, sql, bound))

    async def queue_update(self, name: str, *, metadata: bytes | None = None) -> QueueRow | None:
        sql = self._q.queue_update
        text = metadata.decode() if metadata is not None else None
        return await self._write(lambda c: _op_queue(c, sql, (name, text, _now())))

    # ---- leadership and maintenance ----------------------------------------------------------

    async def leader_delete_expired(self, *, now: dt.datetime | None = None) -> int:
        sql, at = self._q.leader_delete_expired, _ts_or_none(now)
        return await self._write(lambda c: _op_changes(c, sql, (at,)))

    async def lease_take(self, *, name: str, holder: str, ttl: float) -> LeaseRow | None:
        sql = self._q.lease_take
        args = (name, holder, _ttl_modifier(ttl))
        rows = await self._write(lambda c: _op_rows(c, sql, args))
        return _lease(rows[0]) if rows else None

    async def lease_renew(
        self, *, name: str, holder: str, taken_at: dt.datetime, ttl: float
    ) -> LeaseRow | None:
        sql = self._q.lease_renew
        args = (name, holder, format_sqlite_timestamp(taken_at), _ttl_modifier(ttl))
        rows = await self._write(lambda c: _op_rows(c, sql, args))
        return _lease(rows[0]) if rows else None

    async def lease_release(self, *, name: str, holder: str, taken_at: dt.datetime) -> bool:
        sql = self._q.lease_release
        args = (name, holder, format_sqlite_timestamp(taken_at))
        return await self._write(lambda c: _op_changes(c, sql, args)) > 0

    async def leader_attempt_elect(
        self, *, leader_id: str, ttl: float, now: dt.datetime | None = None
    ) -> LeaderRow | None:
        sql = self._q.leader_attempt_elect
        args = (leader_id, _ttl_modifier(ttl), _ts_or_none(now))
        rows = await self._write(lambda c: _op_rows(c, sql, args))
        return _leader(rows[0]) if rows else None

    async def leader_attempt_reelect(
        self,
        *,
        leader_id: str,
        elected_at: dt.datetime,
        ttl: float,
        now: dt.datetime | None = None,
    ) -> LeaderRow | None:
        sql = self._q.leader_attempt_reelect
        args = (
            leader_id,
            _ttl_modifier(ttl),
            _ts_or_none(now),
            format_sqlite_timestamp(elected_at),
        )
        rows = await self._write_one(lambda c: _op_rows(c, sql, args))
        return _leader(rows[0]) if rows else None

    async def leader_resign(self, *, leader_id: str, elected_at: dt.datetime) -> bool:
        # As River's SQLite driver: no `resigned` notification (River's PostgreSQL driver
        # sends one), so followers take over at their next bid; the outbox carries what
        # River Go's clients write, no more.
        q = self._q
        at = format_sqlite_timestamp(elected_at)
        return await self._write(lambda c: _op_leader_resign(c, q, leader_id, at))

    async def leader_get_elected(self) -> LeaderRow | None:
        sql = self._q.leader_get_elected
        rows = await self._read(lambda c: _op_rows(c, sql, ()))
        return _leader(rows[0]) if rows else None

    async def job_schedule(
        self, *, horizon: dt.datetime, now: dt.datetime, limit: int
    ) -> list[ScheduledJob]:
        q = self._q
        h, n = format_sqlite_timestamp(horizon), format_sqlite_timestamp(now)
        if self._session is None:
            return await self._write(lambda c: _op_schedule(c, q, h, n, int(limit)))
        self._check()
        # The scheduler's transaction starts with this: when nothing is due (nearly always),
        # it never begins (one read instead of BEGIN IMMEDIATE, the read and COMMIT).
        return await self._session.run_if(
            lambda c: _op_schedule_due(c, q, h),
            lambda c: _op_schedule(c, q, h, n, int(limit)),
            [],
        )

    async def job_get_cancel_requested(self, ids: Sequence[int]) -> list[int]:
        if not ids:
            return []
        sql = self._q.job_get_cancel_requested
        args = (json.dumps([int(i) for i in ids]),)
        rows = await self._read(lambda c: _op_rows(c, sql, args))
        return [int(row[0]) for row in rows]

    async def job_get_stuck(
        self, *, stuck_horizon: dt.datetime, after_id: int = 0, limit: int
    ) -> list[JobRow]:
        sql = self._q.job_get_stuck
        args = (format_sqlite_timestamp(stuck_horizon), int(after_id), int(limit))
        return await self._read(lambda c: _op_jobs(c, sql, args))

    async def job_rescue_many(
        self, rescues: Sequence[JobRescue], *, stuck_horizon: dt.datetime
    ) -> int:
        if not rescues:
            return 0
        sql = self._q.job_rescue
        batch = _rescue_batch(rescues, stuck_horizon)
        return await self._write(lambda c: _op_changes_many(c, sql, batch))

    async def job_rescue_many_returning(
        self, rescues: Sequence[JobRescue], *, stuck_horizon: dt.datetime
    ) -> list[JobRow]:
        if not rescues:
            return []
        sql = self._q.job_rescue_returning
        batch = _rescue_batch(rescues, stuck_horizon)
        return await self._write(lambda c: _op_jobs_many(c, sql, batch))

    async def job_delete_before(
        self,
        *,
        cancelled_before: dt.datetime | None,
        completed_before: dt.datetime | None,
        discarded_before: dt.datetime | None,
        limit: int,
    ) -> int:
        sql = self._q.job_delete_before
        args = (
            _ts_or_none(cancelled_before),
            _ts_or_none(completed_before),
            _ts_or_none(discarded_before),
            int(limit),
        )
        return await self._write(lambda c: _op_changes(c, sql, args))

    async def queue_delete_expired(self, *, updated_before: dt.datetime, limit: int) -> list[str]:
        sql = self._q.queue_delete_expired
        args = (format_sqlite_timestamp(updated_before), int(limit))
        rows = await self._write(lambda c: _op_rows(c, sql, args))
        return [str(r[0]) for r in rows]

    async def notification_delete_before(self, *, created_before: dt.datetime, limit: int) -> int:
        sql = self._q.notification_delete_before
        args = (format_sqlite_timestamp(created_before), int(limit))
        return await self._write(lambda c: _op_changes(c, sql, args))

    async def index_exists(self, name: str) -> bool:
        sql = self._q.index_exists
        return await self._read(lambda c: _op_count(c, sql, (name,))) > 0

    async def index_reindex_artifacts(self, name: str) -> list[str]:
        return []  # SQLite's REINDEX is not concurrent: it leaves nothing behind

    async def index_reindex(self, name: str) -> None:
        sql = self._q.index_reindex(name)
        await self._write(lambda c: _op_exec_script(c, sql))

    async def index_drop_if_exists(self, name: str) -> None:
        sql = self._q.index_drop_if_exists(name)
        await self._write(lambda c: _op_exec_script(c, sql))

    # --- one-round-trip insert (runtime speed-ups) ------------------------------------------

    async def job_insert_fast_many_notify(
        self, params: Sequence[JobInsertParams], *, topic: str, payloads: Sequence[str]
    ) -> list[InsertedJob]:
        """Insert a batch and append its notifications to the outbox, in one transaction."""
        refuse_repeated_unique_keys(params)
        q = self._q
        batch = list(params)
        encoded = json.dumps(list(payloads)) if payloads else None

        def op(c: apsw.Connection) -> list[InsertedJob]:
            inserted = _op_insert_fast_many(c, q, batch)
            if encoded is not None:
                _op_notify_many(c, q, topic, encoded)
            return inserted

        rows = await self._write(op)
        if encoded is not None:
            self._notified()
        return rows

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
        """One statement, rows by id. The claim sets ``attempted_at`` from the writer's clock,
        so the window is measured on that clock too."""
        if not within > 0:
            raise ValidationError("within", "must be > 0", within)
        if claimed_after is not None and claimed_after.utcoffset() is None:
            raise ValidationError("claimed_after", "must be timezone-aware", claimed_after)
        sql = self._q.job_give_back_lost_claims
        after = "" if claimed_after is None else format_sqlite_timestamp(claimed_after)
        ids = json.dumps([int(i) for i in running])

        def op(c: apsw.Connection) -> list[JobRow]:
            now = utc_now()
            since = format_sqlite_timestamp(now - dt.timedelta(seconds=within))
            args = (queue, client_id, after, since, ids, format_sqlite_timestamp(now))
            rows = job_rows(c.execute(sql, args).fetchall())
            return sorted(rows, key=lambda r: r.id)

        return await self._write(op)


def _op_update_or_get(
    conn: apsw.Connection, sql: str, args: tuple[Any, ...], get: str
) -> JobRow | None:
    """The row a single-job statement returned, or (when it matched nothing) the row as it
    is, or None when there is none."""
    rows = conn.execute(sql, args).fetchall() or conn.execute(get, (args[0],)).fetchall()
    return job_rows(rows)[0] if rows else None


# ---------------------------------------------------------------------------------------------
# leadership and maintenance


def _ts_or_none(value: dt.datetime | None) -> str | None:
    return None if value is None else format_sqlite_timestamp(value)


def _ttl_modifier(ttl: float) -> str:
    """A ``datetime()`` modifier adding ``ttl`` seconds (River's ``'15.000 seconds'``)."""
    return f"{float(ttl):+.3f} seconds"


def _lease(row: Sequence[Any]) -> LeaseRow:
    return LeaseRow(
        name=str(row[0]),
        holder=str(row[1]),
        taken_at=parse_sqlite_timestamp(row[2]),
        expires_at=parse_sqlite_timestamp(row[3]),
    )


def _leader(row: Sequence[Any]) -> LeaderRow:
    return LeaderRow(
        leader_id=str(row[0]),
        elected_at=parse_sqlite_timestamp(row[1]),
        expires_at=parse_sqlite_timestamp(row[2]),
    )


def _op_changes(conn: apsw.Connection, sql: str, args: tuple[Any, ...]) -> int:
    conn.execute(sql, args).fetchall()
    return conn.changes()


def _rescue_batch(
    rescues: Sequence[JobRescue], stuck_horizon: dt.datetime
) -> list[tuple[Any, ...]]:
    horizon = format_sqlite_timestamp(stuck_horizon)
    return [
        (
            int(r.id),
            r.error.decode(),
            _ts_or_none(r.finalized_at),
            format_sqlite_timestamp(r.scheduled_at),
            JobState(r.state).value,
            horizon,
        )
        for r in rescues
    ]


def _op_jobs_many(conn: apsw.Connection, sql: str, batch: list[tuple[Any, ...]]) -> list[JobRow]:
    rows: list[Any] = []
    for args in batch:
        rows.extend(conn.execute(sql, args).fetchall())
    return job_rows(rows)


def _op_changes_many(conn: apsw.Connection, sql: str, batch: list[tuple[Any, ...]]) -> int:
    total = 0
    for args in batch:
        conn.execute(sql, args).fetchall()
        total += conn.changes()
    return total


def _op_leader_resign(conn: apsw.Connection, q: Queries, leader_id: str, elected_at: str) -> bool:
    conn.execute(q.leader_resign, (leader_id, elected_at)).fetchall()
    return bool(conn.changes())


def _op_schedule_due(conn: apsw.Connection, q: Queries, horizon: str) -> bool:
    """Whether any job is due for :func:`_op_schedule` (a read, outside any transaction)."""
    return conn.execute(q.schedule_eligible, (horizon, 1)).fetchone() is not None


def _op_schedule(
    conn: apsw.Connection, q: Queries, horizon: str, now: str, limit: int
) -> list[ScheduledJob]:
    """River's SQLite JobSchedule in one unit: unique jobs one at a time (so two eligible jobs
    sharing a key see each other's move), the rest in bulk."""
    eligible = [(int(i), bool(u)) for i, u in conn.execute(q.schedule_eligible, (horizon, limit))]
    plain: list[int] = []
    discard: list[int] = []
    for job_id, unique in eligible:
        if not unique:
            plain.append(job_id)
            continue
        (taken,) = conn.execute(q.schedule_collision, (job_id,)).fetchone() or (0,)
        if taken:
            discard.append(job_id)
        else:
            conn.execute(q.schedule_set_available, (json.dumps([job_id]),))
    if plain:
        conn.execute(q.schedule_set_available, (json.dumps(plain),))
    if discard:
        conn.execute(q.schedule_set_discarded, (json.dumps(discard), now))
    if not eligible:
        return []
    ids = [job_id for job_id, _ in eligible]
    by_id = {j.id: j for j in job_rows(conn.execute(q.job_get_many, (json.dumps(ids),)).fetchall())}
    dropped = set(discard)
    return [ScheduledJob(job=by_id[i], conflict_discarded=i in dropped) for i in ids if i in by_id]
