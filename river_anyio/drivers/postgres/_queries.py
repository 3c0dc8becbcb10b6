"""Every statement the PostgreSQL executor runs, one named property each, built once per schema.

Every reference to a River table, type or function carries the schema prefix (``"schema".``
when one is configured, nothing otherwise so ``search_path`` decides). Column lists are always
explicit: a prepared ``SELECT *`` breaks when another connection alters the table.

Parameters are positional (``%s``) except in the leadership and maintenance statements, which
name theirs (``%(name)s``); there a ``now`` of NULL means the database's ``now()``, as River's
queries do unless a test time is set. A statement that depends on a call's values (a list's
filters, an index name) is a method completing the statement's text.
"""

from __future__ import annotations

import datetime as dt
from functools import cached_property

from psycopg import sql
from psycopg.types.numeric import Int8

from .._shared import ListDialect, require_aware
from ._capabilities import POSTGRES, ServerCapabilities

__all__ = ["INSERT_COLUMNS", "JOB_COLUMNS", "QUEUE_COLUMNS", "Queries", "quote_ident"]

#: Column order of a job row as the executor reads it (see ``_executor.row_to_job``).
JOB_COLUMNS = (
    "id",
    "args::text",
    "attempt",
    "attempted_at",
    "attempted_by",
    "created_at",
    "errors::text[]",
    "finalized_at",
    "kind",
    "max_attempts",
    "metadata::text",
    "priority",
    "queue",
    "scheduled_at",
    "state::text",
    "tags::text[]",
    "unique_key",
    "unique_states::integer",
)

#: Column order of a queue row as the executor reads it (see ``_executor.row_to_queue``).
QUEUE_COLUMNS = ("name", "created_at", "metadata::text", "paused_at", "updated_at")

#: Columns written by the fast insert paths, in the order parameters are passed.
INSERT_COLUMNS = (
    "args",
    "created_at",
    "kind",
    "max_attempts",
    "metadata",
    "priority",
    "queue",
    "scheduled_at",
    "state",
    "tags",
    "unique_key",
    "unique_states",
)

_FINAL_STATES = "('cancelled', 'completed', 'discarded')"
_LEADER_COLUMNS = "leader_id, elected_at, expires_at"
_LEASE_COLUMNS = "name, holder, taken_at, expires_at"
_NOW = "coalesce(%(now)s::timestamptz, now())"
#: The job columns read through the alias ``j``.
_JCOLS = ", ".join("j." + c for c in JOB_COLUMNS)
_COLS = ", ".join(JOB_COLUMNS)
_LCOLS = ", ".join("l." + c for c in JOB_COLUMNS)
_TCOLS = ", ".join("t." + c for c in JOB_COLUMNS)
#: A claim's filter that leaves GIN pending-list merges to other statements (see ``_claim``).
_NO_GIN_MERGE = "(SELECT set_config('gin_pending_list_limit', '2GB', true)) IS NOT NULL"
_QCOLS = ", ".join(QUEUE_COLUMNS)


def quote_ident(name: str) -> str:
    """A double-quoted SQL identifier (embedded quotes doubled)."""
    return sql.Identifier(name).as_string(None)


def _after_time(value: dt.datetime) -> dt.datetime:
    require_aware(value, "after_time")
    return value


def _from_micros(expr: str) -> str:
    """SQL for the timestamptz ``expr`` microseconds after the epoch (exact over the whole
    timestamp range: the float multiplications involved are exact)."""
    return (
        f"(timestamptz 'epoch' + ({expr} / 1000000) * interval '1 second'"
        f" + mod({expr}, 1000000) * interval '1 microsecond')"
    )


class Queries:
    """The statements of one schema (``schema`` None: unqualified names), for a server with
    ``capabilities`` (see ``_capabilities``): without LISTEN/NOTIFY no statement calls
    ``pg_notify``; with ``unique_nonce`` no statement reads ``xmax`` (the executor tells a
    duplicate by the metadata nonce)."""

    def __init__(self, schema: str | None, capabilities: ServerCapabilities = POSTGRES) -> None:
        self.schema = schema
        self.prefix = quote_ident(schema) + "." if schema else ""
        self.capabilities = capabilities
        #: notifications are sent (the server delivers them)
        self.notify = capabilities.listen_notify
        #: unique inserts carry a metadata nonce, and their duplicate flag is left to it
        self.unique_nonce = capabilities.unique_nonce

    def _channel(self, topic: str) -> str:
        """SQL for a notification channel: ``<schema>.<topic>``, the session's current schema
        when none is configured."""
        if self.schema:
            return sql.Literal(f"{self.schema}.{topic}").as_string(None)
        return f"(current_schema() || {sql.Literal('.' + topic).as_string(None)})"

    def qualified(self, table: str) -> str:
        """``table`` qualified with the schema (for ``to_regclass``)."""
        return self.prefix + quote_ident(table)

    # --- jobs -------------------------------------------------------------------------------

    @cached_property
    def job_insert_fast_many(self) -> str:
        """The batch arrives as one text parameter per column: every element preceded by a
        chr(30) separator (so an empty element survives), tags of one job joined by chr(31).
        Splitting server-side avoids per-element adaptation in Python; the first (empty)
        element is dropped with [2:]."""
        p = self.prefix
        fields = ", ".join("(string_to_array(%s, chr(30)))[2:]" for _ in INSERT_COLUMNS)
        return f"""
INSERT INTO {p}river_job (
    args, created_at, kind, max_attempts, metadata, priority, queue, scheduled_at, state,
    tags, unique_key, unique_states
)
SELECT
    coalesce(nullif(b.args, ''), '{{}}')::jsonb,
    coalesce(nullif(b.created_at, '')::timestamptz, now()),
    b.kind,
    b.max_attempts::smallint,
    coalesce(nullif(b.metadata, ''), '{{}}')::jsonb,
    b.priority::smallint,
    b.queue,
    coalesce(nullif(b.scheduled_at, '')::timestamptz, now()),
    b.state::{p}river_job_state,
    string_to_array(b.tags, chr(31))::varchar(255)[],
    decode(nullif(b.unique_key, ''), 'hex'),
    nullif(nullif(b.unique_states, ''), '0')::integer::bit(8)
FROM unnest({fields}) WITH ORDINALITY AS b(
    args, created_at, kind, max_attempts, metadata, priority, queue, scheduled_at, state,
    tags, unique_key, unique_states, ord
)
ORDER BY b.ord
ON CONFLICT (unique_key)
    WHERE unique_key IS NOT NULL
        AND unique_states IS NOT NULL
        AND {p}river_job_state_in_bitmask(unique_states, state)
    DO UPDATE SET unique_key = excluded.unique_key
RETURNING {_COLS}, {"false" if self.unique_nonce else "xmax::text <> '0'"}"""

    @cached_property
    def job_insert_one(self) -> str:
        """One job without a unique key: the columns of ``job_insert_fast_many`` as one text
        parameter each, a plain ``INSERT ... VALUES`` (no unnesting, no conflict arbiter,
        which a job without a unique key cannot meet: less server time for a single row).
        Same RETURNING columns, the duplicate flag always false."""
        p = self.prefix
        return f"""
INSERT INTO {p}river_job (
    args, created_at, kind, max_attempts, metadata, priority, queue, scheduled_at, state,
    tags, unique_key, unique_states
)
VALUES (
    coalesce(nullif(%s, ''), '{{}}')::jsonb,
    coalesce(nullif(%s, '')::timestamptz, now()),
    %s::text,
    %s::smallint,
    coalesce(nullif(%s, ''), '{{}}')::jsonb,
    %s::smallint,
    %s::text,
    coalesce(nullif(%s, '')::timestamptz, now()),
    %s::{p}river_job_state,
    string_to_array(%s, chr(31))::varchar(255)[],
    decode(nullif(%s, ''), 'hex'),
    nullif(nullif(%s, ''), '0')::integer::bit(8)
)
RETURNING {_COLS}, false"""

    @cached_property
    def job_insert_one_notify(self) -> str:
        """``notify_many`` and ``job_insert_one`` in one statement (as
        ``job_insert_fast_many_notify``)."""
        return (
            f"WITH notified AS MATERIALIZED ({self.notify_many}),\n"
            f"inserted AS ({self.job_insert_one})\n"
            "SELECT inserted.*, (SELECT count(*) FROM notified) FROM inserted"
        )

    @cached_property
    def job_insert_fast_many_notify(self) -> str:
        """``notify_many`` and ``job_insert_fast_many`` in one statement: the notification's
        parameters first, then the insert's; an extra last column counts the notifications.
        The count forces the notification CTE to run (once, whatever the row count);
        RETURNING order is the insert's input order."""
        return (
            f"WITH notified AS MATERIALIZED ({self.notify_many}),\n"
            f"inserted AS ({self.job_insert_fast_many})\n"
            "SELECT inserted.*, (SELECT count(*) FROM notified) FROM inserted"
        )

    def job_copy(self, columns: str) -> str:
        """COPY of the named columns (text format)."""
        return f"COPY {self.prefix}river_job ({columns}) FROM STDIN"

    @cached_property
    def job_get_by_id(self) -> str:
        return f"SELECT {_COLS} FROM {self.prefix}river_job WHERE id = %s"

    @cached_property
    def listing(self) -> ListDialect:
        """How a job list is written here (see ``_shared.job_list_statement``)."""
        return ListDialect(
            name="PostgreSQL",
            head=f"SELECT {_COLS} FROM {self.prefix}river_job",
            placeholder="%s",
            member="{column} = ANY(%s::{type}[])",
            state_type=f"text[]::{self.prefix}river_job_state",
            array=list,
            tags_all="tags @> %s::varchar[]",
            tags_any="tags && %s::varchar[]",
            metadata_contains="metadata @> %s::jsonb",
            bind_int=Int8,
            bind_time=_after_time,
            time_column=quote_ident,
        )

    @cached_property
    def job_count_by_queue_and_state(self) -> str:
        """The state filter lets River's fetching index (state, queue, ...) serve the count."""
        p = self.prefix
        return (
            f"SELECT queue, state::text, count(*) FROM {p}river_job"
            f" WHERE state = ANY(%s::{p}river_job_state[])"
            " GROUP BY queue, state ORDER BY queue, state::text"
        )

    # --- the runtime's hot path ---------------------------------------------------------------

    def _claim(self, *, kinds: bool, at: bool = False) -> str:
        """The claim: lock due available rows in fetch order, skipping rows other claimers
        hold, then mark them running. Parameters: queue, [kinds,] limit, [at,]
        max_attempted_by (twice), client id. ``at``: ``attempted_at`` is given (microseconds
        since the epoch; the rate-limited claim) rather than the transaction's now().

        ``attempted_by`` keeps its newest ``max - 1`` entries before the client id is appended.
        The outer query restores the fetch order (an UPDATE's RETURNING has none).

        The update finds the picked rows through the primary key (``id = ANY(ARRAY(...))``):
        joined with the CTE instead, a claim of a few hundred rows on a table of a few
        thousand is planned as a hash join over a scan of the whole table, which costs
        more than updating the rows.

        The claim never merges a GIN index's pending list (River's indexes on ``args`` and
        ``metadata``): whichever statement's index entries take the list past
        ``gin_pending_list_limit`` merges it, which holds that statement for 100 ms or more
        on a busy table, and a claim held that long delays every job of its queue. The
        claim raises the limit for its own transaction (``set_config(..., true)``, a one-time
        filter run before any row is updated); completions, inserts and autovacuum merge
        the list as before.
        """
        p = self.prefix
        kind_filter = "\n        AND kind = ANY(%s::text[])" if kinds else ""
        at_value = "'epoch'::timestamptz + %s::bigint * interval '1 microsecond'" if at else "now()"
        return f"""
WITH picked AS (
    SELECT id
    FROM {p}river_job
    WHERE state = 'available'
        AND queue = %s::text
        AND scheduled_at <= now(){kind_filter}
        AND {_NO_GIN_MERGE}
    ORDER BY priority, scheduled_at, id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {p}river_job AS j
    SET state = 'running',
        attempt = j.attempt + 1,
        attempted_at = {at_value},
        attempted_by = CASE
            WHEN cardinality(j.attempted_by) >= %s::integer
            THEN j.attempted_by[cardinality(j.attempted_by) - %s::integer + 2 :]
            ELSE coalesce(j.attempted_by, '{{}}')
        END || %s::varchar(255)
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING {_JCOLS}
)
SELECT * FROM claimed ORDER BY priority, scheduled_at, id"""

    @cached_property
    def job_get_available(self) -> str:
        return self._claim(kinds=False)

    @cached_property
    def job_get_available_kinds(self) -> str:
        return self._claim(kinds=True)

    @cached_property
    def job_get_available_at(self) -> str:
        return self._claim(kinds=False, at=True)

    @cached_property
    def job_get_available_kinds_at(self) -> str:
        return self._claim(kinds=True, at=True)

    # --- global queue limits (migration line river_anyio) -----------------------------------

    @cached_property
    def queue_limit_lock(self) -> str:
        """Lock the queue's limiter row (created on first use) until the transaction ends,
        and read its rate window and the clock once the lock is held, in microseconds since
        the epoch: the instant a rate-limited claim stamps ``attempted_at`` with, so those
        instants increase from one holder of the lock to the next. Parameter: the queue."""
        return f"""
INSERT INTO {self.prefix}river_anyio_queue_limit AS l (queue)
VALUES (%s::text)
ON CONFLICT (queue) DO UPDATE SET queue = l.queue
RETURNING l.starts, round(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"""

    @cached_property
    def queue_limit_running(self) -> str:
        """The queue's running jobs (River's (state, queue, ...) index). Parameter: queue."""
        return (
            f"SELECT count(*) FROM {self.prefix}river_job "
            "WHERE state = 'running' AND queue = %s::text"
        )

    @cached_property
    def queue_limit_save(self) -> str:
        """Store the rate window. Parameters: the window's JSON text, the queue."""
        return (
            f"UPDATE {self.prefix}river_anyio_queue_limit "
            "SET starts = %s::text, updated_at = now() WHERE queue = %s::text"
        )

    def _set_state_many(self, *, lean: bool) -> str:
        """The batch completion. Parameters (one text per column, see ``_executor``): ids,
        attempts and states joined by commas; new attempts, finalized_at and scheduled_at
        (microseconds since the epoch) each element preceded by a comma, so an empty one is
        NULL; errors and metadata updates each preceded by chr(30); then the client id.

        A row takes the new state only while it is running the given attempt for this client
        (the guard); metadata updates merge either way. The guard is the UPDATE's own
        condition, so a row changed concurrently is judged on its newest version (PostgreSQL
        re-checks it after waiting for the row's lock), with no separate locking pass (one
        costs about a fifth of the statement). Each update also reaches its rows through
        the primary key (``id = ANY(ARRAY(...))`` beside the join), or a batch of a few
        hundred on a table of a few thousand rows is planned as a hash join over a scan of
        the whole table. Rows left alone are read back as they are;
        results follow the input order. ``lean``: only the ids of the completions that did
        not apply (usually none: nothing to decode when nobody needs the rows).
        """
        p = self.prefix
        jcols = "j.id" if lean else _JCOLS
        cancel = (
            "(i.state IN ('available', 'retryable', 'scheduled') "
            "AND j.metadata ? 'cancel_attempted_at')"
        )
        return f"""
WITH input AS (
    SELECT
        r.id,
        r.attempt,
        r.state,
        r.state::{p}river_job_state AS new_state,
        nullif(r.attempt_new, '')::smallint AS attempt_new,
        {_from_micros("nullif(r.finalized_at, '')::bigint")} AS finalized_at,
        {_from_micros("nullif(r.scheduled_at, '')::bigint")} AS scheduled_at,
        nullif(r.error, '')::jsonb AS error,
        nullif(r.metadata, '')::jsonb AS metadata,
        r.ord
    FROM unnest(
        string_to_array(%s, ',')::bigint[],
        string_to_array(%s, ',')::smallint[],
        string_to_array(%s, ','),
        (string_to_array(%s, ','))[2:],
        (string_to_array(%s, ','))[2:],
        (string_to_array(%s, ','))[2:],
        (string_to_array(%s, chr(30)))[2:],
        (string_to_array(%s, chr(30)))[2:]
    ) WITH ORDINALITY AS r(
        id, attempt, state, attempt_new, finalized_at, scheduled_at, error, metadata, ord
    )
), applied AS (
    UPDATE {p}river_job AS j
    SET state = CASE WHEN {cancel} THEN 'cancelled' ELSE i.new_state END,
        attempt = CASE
            WHEN i.attempt_new IS NOT NULL AND NOT {cancel} THEN i.attempt_new
            ELSE j.attempt
        END,
        errors = CASE
            WHEN i.error IS NOT NULL THEN array_append(j.errors, i.error)
            ELSE j.errors
        END,
        finalized_at = CASE
            WHEN {cancel} THEN now()
            WHEN i.state IN {_FINAL_STATES} THEN coalesce(i.finalized_at, j.finalized_at)
            ELSE NULL
        END,
        scheduled_at = CASE
            WHEN i.scheduled_at IS NOT NULL AND NOT {cancel} THEN i.scheduled_at
            ELSE j.scheduled_at
        END,
        metadata = CASE WHEN i.metadata IS NULL THEN j.metadata ELSE j.metadata || i.metadata END
    FROM input AS i
    WHERE j.id = i.id
        AND j.id = ANY(ARRAY(SELECT id FROM input))
        -- one expression, so no index on state can drive the join: the rows come by id
        AND CASE
            WHEN j.state = 'running'
            THEN j.attempt = i.attempt AND j.attempted_by[cardinality(j.attempted_by)] = %s::text
            ELSE false
        END
    RETURNING {jcols}, true, i.ord
), merged AS (
    UPDATE {p}river_job AS j
    SET metadata = j.metadata || i.metadata
    FROM input AS i
    WHERE j.id = i.id
        AND j.id = ANY(ARRAY(SELECT id FROM input WHERE metadata IS NOT NULL))
        AND i.metadata IS NOT NULL
        AND i.id NOT IN (SELECT id FROM applied)
    RETURNING {jcols}, false, i.ord
)
{"SELECT * FROM applied WHERE false" if lean else "SELECT * FROM applied"}
UNION ALL
SELECT * FROM merged
UNION ALL
SELECT {jcols}, false, i.ord
FROM input AS i
JOIN {p}river_job AS j ON j.id = i.id
WHERE i.metadata IS NULL AND i.id NOT IN (SELECT id FROM applied)
ORDER BY {(1 if lean else len(JOB_COLUMNS)) + 2}"""

    @cached_property
    def job_set_state_if_running_many(self) -> str:
        return self._set_state_many(lean=False)

    @cached_property
    def job_set_state_if_running_many_lean(self) -> str:
        return self._set_state_many(lean=True)

    @cached_property
    def job_cancel(self) -> str:
        """River's JobCancel. Parameters: id, notify flag, cancel_attempted_at (RFC 3339 text).

        A running row keeps running (its worker is told through the control notification); any
        other non-final row is cancelled. A final row is read back unchanged: as the lock
        returned it, since a plain read would see the statement's snapshot, taken before a
        lock wait, and miss the change that finalized the row (a cancel that lost a race).
        """
        p = self.prefix
        return f"""
WITH locked AS (
    SELECT {_JCOLS}, j.state IN {_FINAL_STATES} OR j.finalized_at IS NOT NULL AS final
    FROM {p}river_job AS j
    WHERE j.id = %s
    FOR UPDATE
), notified AS (
    SELECT pg_notify(
        {self._channel("river_control")},
        json_build_object('action', 'cancel', 'job_id', id, 'queue', queue)::text
    )
    FROM locked
    WHERE NOT final AND %s::boolean
), updated AS (
    UPDATE {p}river_job AS j
    SET state = CASE WHEN l.state = 'running' THEN j.state ELSE 'cancelled' END,
        finalized_at = CASE WHEN l.state = 'running' THEN j.finalized_at ELSE now() END,
        metadata = jsonb_set(j.metadata, '{{cancel_attempted_at}}', to_jsonb(%s::text))
    FROM locked AS l
    WHERE j.id = l.id AND NOT l.final
    RETURNING {_JCOLS}
)
SELECT *, (SELECT count(*) FROM notified) FROM updated
UNION ALL
SELECT {_LCOLS}, 0
FROM locked AS l
WHERE l.final"""

    # --- queues -----------------------------------------------------------------------------

    @cached_property
    def queue_create_or_set_updated_at(self) -> str:
        return f"""
INSERT INTO {self.prefix}river_queue AS q (name, created_at, metadata, paused_at, updated_at)
VALUES (%s::text, now(), coalesce(%s::jsonb, '{{}}'), NULL, now())
ON CONFLICT (name) DO UPDATE SET updated_at = now()
RETURNING {_QCOLS}"""

    @cached_property
    def queue_get(self) -> str:
        return f"SELECT {_QCOLS} FROM {self.prefix}river_queue WHERE name = %s::text"

    @cached_property
    def queue_list(self) -> str:
        return f"SELECT {_QCOLS} FROM {self.prefix}river_queue ORDER BY name LIMIT %s"

    def _queue_control(self, action: str, assignments: str) -> str:
        """Pause or resume a queue (``*``: all) and send the control notification in the same
        statement, as River does, unless a named queue matched nothing (or the server has no
        notifications). Parameters: the name, four times. Returns the rows matched."""
        notify = f"""count(pg_notify(
        {self._channel("river_control")},
        json_build_object('action', '{action}', 'queue', %s::text)::text
    )::text)"""
        if not self.notify:  # the same parameters, nothing sent
            notify = "count(%s::text)"
        return f"""
WITH updated AS (
    UPDATE {self.prefix}river_queue
    SET {assignments}
    WHERE %s::text = '*' OR name = %s::text
    RETURNING 1
), matched AS (
    SELECT count(*) AS n FROM updated
)
SELECT m.n, (
    SELECT {notify}
    WHERE m.n > 0 OR %s::text = '*'
)
FROM matched AS m"""

    @cached_property
    def queue_pause(self) -> str:
        return self._queue_control(
            "pause",
            "paused_at = coalesce(paused_at, now()), "
            "updated_at = CASE WHEN paused_at IS NULL THEN now() ELSE updated_at END",
        )

    @cached_property
    def queue_resume(self) -> str:
        return self._queue_control(
            "resume",
            "paused_at = NULL, "
            "updated_at = CASE WHEN paused_at IS NULL THEN updated_at ELSE now() END",
        )

    # --- notifications and generic access ---------------------------------------------------

    @cached_property
    def notify_many(self) -> str:
        """Parameters: the topic (the channel, when a schema is configured), the payloads as
        one text, each preceded by chr(30) (one text parameter is adapted several times
        faster than a list: this is on every single insert's path)."""
        payloads = "unnest((string_to_array(%s::text, chr(30)))[2:]) AS n(payload)"
        if self.schema:
            return f"SELECT pg_notify(%s, payload) FROM {payloads}"
        return f"SELECT pg_notify(concat(current_schema(), '.', %s::text), payload) FROM {payloads}"

    table_exists = "SELECT to_regclass(%s) IS NOT NULL"
    column_exists = (
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute"
        " WHERE attrelid = to_regclass(%s) AND attname = %s"
        " AND attnum > 0 AND NOT attisdropped)"
    )

    # --- client job and queue APIs (River's JobRetry/JobDelete/JobUpdate/QueueUpdate) -------

    @cached_property
    def job_retry(self) -> str:
        """Parameter: the id. The row is locked first; a running job, or an available one
        already due, is read back unchanged, as the lock returned it (a plain read would see
        the statement's snapshot, from before a lock wait, and miss a retry that won a race)."""
        p = self.prefix
        return f"""
WITH target AS (
    SELECT {_JCOLS} FROM {p}river_job AS j WHERE j.id = %s FOR UPDATE
), retried AS (
    UPDATE {p}river_job AS j
    SET state = 'available',
        max_attempts = CASE
            WHEN j.attempt = j.max_attempts THEN j.max_attempts + 1 ELSE j.max_attempts
        END,
        finalized_at = NULL,
        metadata = j.metadata - 'cancel_attempted_at',
        scheduled_at = now()
    FROM target AS t
    WHERE j.id = t.id
        AND j.state <> 'running'
        AND NOT (j.state = 'available' AND j.scheduled_at < now())
    RETURNING {_JCOLS}
)
SELECT * FROM retried
UNION ALL
SELECT {_TCOLS}
FROM target AS t
WHERE NOT EXISTS (SELECT 1 FROM retried)"""

    @cached_property
    def job_delete(self) -> str:
        """Parameter: the id. A running row is returned undeleted."""
        p = self.prefix
        return f"""
WITH target AS (
    SELECT id, state = 'running' AS running FROM {p}river_job WHERE id = %s FOR UPDATE
), deleted AS (
    DELETE FROM {p}river_job AS j
    USING target AS t
    WHERE j.id = t.id AND NOT t.running
    RETURNING {_JCOLS}
)
SELECT * FROM deleted
UNION ALL
SELECT {_JCOLS}
FROM {p}river_job AS j
JOIN target AS t ON t.id = j.id
WHERE t.running"""

    def job_delete_many(self, where: str) -> str:
        """``where`` is a list's filter text (``_shared.list_where``; its parameters come
        first), then the limit."""
        p = self.prefix
        return f"""
WITH picked AS (
    SELECT id
    FROM {p}river_job
    WHERE {where} AND state <> 'running'
    ORDER BY id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM {p}river_job AS j
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING {_JCOLS}
)
SELECT * FROM deleted ORDER BY id"""

    @cached_property
    def job_update_metadata(self) -> str:
        """Parameters: the encoded metadata updates, the id."""
        return f"""
UPDATE {self.prefix}river_job
SET metadata = metadata || %s::jsonb
WHERE id = %s
RETURNING {_COLS}"""

    @cached_property
    def queue_update(self) -> str:
        """Parameters: the new metadata (NULL keeps it), the name."""
        return f"""
UPDATE {self.prefix}river_queue
SET metadata = coalesce(%s::jsonb, metadata),
    updated_at = now()
WHERE name = %s::text
RETURNING {_QCOLS}"""

    # --- leadership and maintenance (named parameters) --------------------------------------

    @cached_property
    def leader_delete_expired(self) -> str:
        return f"DELETE FROM {self.prefix}river_leader WHERE expires_at < {_NOW}"

    @cached_property
    def leader_attempt_elect(self) -> str:
        return f"""
INSERT INTO {self.prefix}river_leader (leader_id, elected_at, expires_at)
SELECT %(leader_id)s::text, t.now, t.now + make_interval(secs => %(ttl)s::double precision)
FROM (SELECT {_NOW} AS now) AS t
ON CONFLICT (name) DO NOTHING
RETURNING {_LEADER_COLUMNS}"""

    @cached_property
    def leader_attempt_reelect(self) -> str:
        return f"""
UPDATE {self.prefix}river_leader AS l
SET expires_at = t.now + make_interval(secs => %(ttl)s::double precision)
FROM (SELECT {_NOW} AS now) AS t
WHERE l.elected_at = %(elected_at)s::timestamptz
    AND l.expires_at >= t.now
    AND l.leader_id = %(leader_id)s::text
RETURNING l.leader_id, l.elected_at, l.expires_at"""

    @cached_property
    def leader_resign(self) -> str:
        """The row is deleted and followers told, in one statement (as River; without
        notifications, followers find the seat empty when they next poll)."""
        notify = f"""pg_notify(
    {self._channel("river_leadership")},
    json_build_object('leader_id', leader_id, 'action', 'resigned')::text
)"""
        return f"""
WITH resigned AS (
    DELETE FROM {self.prefix}river_leader
    WHERE elected_at = %(elected_at)s::timestamptz AND leader_id = %(leader_id)s::text
    RETURNING leader_id
)
SELECT count({notify if self.notify else "*"})
FROM resigned"""

    @cached_property
    def leader_get_elected(self) -> str:
        return f"SELECT {_LEADER_COLUMNS} FROM {self.prefix}river_leader"

    # --- named leases (line river_anyio; named parameters) ----------------------------------

    @cached_property
    def lease_take(self) -> str:
        """An insert that overwrites only an expired row: racing takers serialise on the
        primary key, and each re-checks the row the previous one left."""
        t = f"{self.prefix}river_anyio_lease"
        return f"""
INSERT INTO {t} AS l (name, holder, taken_at, expires_at)
VALUES (
    %(name)s::text,
    %(holder)s::text,
    now(),
    now() + make_interval(secs => %(ttl)s::double precision)
)
ON CONFLICT (name) DO UPDATE
SET holder = EXCLUDED.holder, taken_at = EXCLUDED.taken_at, expires_at = EXCLUDED.expires_at
WHERE l.expires_at <= EXCLUDED.taken_at
RETURNING {_LEASE_COLUMNS}"""

    @cached_property
    def lease_renew(self) -> str:
        return f"""
UPDATE {self.prefix}river_anyio_lease
SET expires_at = now() + make_interval(secs => %(ttl)s::double precision)
WHERE name = %(name)s::text
    AND holder = %(holder)s::text
    AND taken_at = %(taken_at)s::timestamptz
    AND expires_at > now()
RETURNING {_LEASE_COLUMNS}"""

    @cached_property
    def lease_release(self) -> str:
        return f"""
DELETE FROM {self.prefix}river_anyio_lease
WHERE name = %(name)s::text AND holder = %(holder)s::text AND taken_at = %(taken_at)s::timestamptz"""

    @cached_property
    def job_schedule(self) -> str:
        """River's JobSchedule in one statement. Parameters: horizon, limit, now.

        Eligible rows are locked in fetch order. A unique row (key and states set) is discarded
        when another row holds its key in a state of that row's own unique states, or when an
        earlier eligible row shares its key; every other row becomes available.
        """
        p = self.prefix
        return f"""
WITH eligible AS (
    SELECT id, unique_key, unique_states, priority, scheduled_at
    FROM {p}river_job
    WHERE state IN ('retryable', 'scheduled')
        AND priority >= 0
        AND queue IS NOT NULL
        AND scheduled_at <= %(horizon)s::timestamptz
    ORDER BY priority, scheduled_at, id
    LIMIT %(limit)s
    FOR UPDATE
), ranked AS (
    SELECT e.id, e.unique_key,
        CASE WHEN e.unique_key IS NOT NULL AND e.unique_states IS NOT NULL
            THEN row_number() OVER (
                PARTITION BY e.unique_key ORDER BY e.priority, e.scheduled_at, e.id
            )
        END AS key_rank
    FROM eligible AS e
), taken AS (
    SELECT DISTINCT r.unique_key
    FROM ranked AS r
    JOIN {p}river_job AS other
        ON other.unique_key = r.unique_key AND other.id <> r.id
    WHERE r.key_rank IS NOT NULL
        AND other.unique_states IS NOT NULL
        AND {p}river_job_state_in_bitmask(other.unique_states, other.state)
), decided AS (
    SELECT r.id, (r.key_rank IS NOT NULL AND (t.unique_key IS NOT NULL OR r.key_rank > 1))
        AS discard
    FROM ranked AS r
    LEFT JOIN taken AS t ON t.unique_key = r.unique_key
), moved AS (
    UPDATE {p}river_job AS j
    SET state = CASE WHEN d.discard THEN 'discarded' ELSE 'available' END::{p}river_job_state,
        finalized_at = CASE
            WHEN d.discard THEN coalesce(%(now)s::timestamptz, now())
            ELSE j.finalized_at
        END,
        metadata = CASE
            WHEN d.discard THEN j.metadata || '{{"unique_key_conflict": "scheduler_discarded"}}'
            ELSE j.metadata
        END
    FROM decided AS d
    WHERE j.id = d.id AND j.id = ANY(ARRAY(SELECT id FROM eligible))
    RETURNING {_JCOLS}, d.discard
)
SELECT * FROM moved ORDER BY priority, scheduled_at, id"""

    @cached_property
    def job_get_cancel_requested(self) -> str:
        """Parameter: the ids (bigint[])."""
        return f"""
SELECT id FROM {self.prefix}river_job
WHERE id = ANY(%s::bigint[])
    AND state = 'running'
    AND metadata ? 'cancel_attempted_at'
ORDER BY id"""

    @cached_property
    def job_get_stuck(self) -> str:
        return f"""
SELECT {_JCOLS}
FROM {self.prefix}river_job AS j
WHERE j.state = 'running'
    AND j.id > %(after_id)s
    AND j.attempted_at < %(stuck_horizon)s::timestamptz
ORDER BY j.id
LIMIT %(limit)s"""

    @cached_property
    def job_rescue_many(self) -> str:
        p = self.prefix
        return f"""
UPDATE {p}river_job AS j
SET errors = array_append(j.errors, r.error),
    finalized_at = r.finalized_at,
    scheduled_at = r.scheduled_at,
    state = r.state::{p}river_job_state,
    metadata = j.metadata || jsonb_build_object(
        'river:rescue_count',
        coalesce(
            CASE WHEN jsonb_typeof(j.metadata -> 'river:rescue_count') = 'number'
                THEN (j.metadata ->> 'river:rescue_count')::numeric::bigint
            END,
            0
        ) + 1
    )
FROM unnest(
    %(ids)s::bigint[],
    %(errors)s::text[]::jsonb[],
    %(finalized_at)s::timestamptz[],
    %(scheduled_at)s::timestamptz[],
    %(states)s::text[]
) AS r(id, error, finalized_at, scheduled_at, state)
WHERE j.id = r.id
    AND j.id = ANY(%(ids)s::bigint[])
    AND j.state = 'running'
    AND j.attempted_at < %(stuck_horizon)s::timestamptz"""

    @cached_property
    def job_rescue_many_returning(self) -> str:
        return f"{self.job_rescue_many}\nRETURNING {_JCOLS}"

    @cached_property
    def job_delete_before(self) -> str:
        p = self.prefix
        return f"""
DELETE FROM {p}river_job
WHERE id IN (
    SELECT id
    FROM {p}river_job
    WHERE (state = 'cancelled' AND finalized_at < %(cancelled)s::timestamptz)
        OR (state = 'completed' AND finalized_at < %(completed)s::timestamptz)
        OR (state = 'discarded' AND finalized_at < %(discarded)s::timestamptz)
    ORDER BY id
    LIMIT %(limit)s
)"""

    @cached_property
    def queue_delete_expired(self) -> str:
        p = self.prefix
        return f"""
DELETE FROM {p}river_queue
WHERE name IN (
    SELECT name FROM {p}river_queue
    WHERE updated_at < %(horizon)s::timestamptz
    ORDER BY name
    LIMIT %(limit)s
)
RETURNING name"""

    @cached_property
    def notification_delete_before(self) -> str:
        p = self.prefix
        return f"""
DELETE FROM {p}river_notification
WHERE id IN (
    SELECT id FROM {p}river_notification
    WHERE created_at < %(horizon)s::timestamptz
    ORDER BY created_at, id
    LIMIT %(limit)s
)"""

    @cached_property
    def _namespace(self) -> str:
        return "%(schema)s::text" if self.schema else "current_schema()"

    @cached_property
    def index_exists(self) -> str:
        return f"""
SELECT EXISTS (
    SELECT 1
    FROM pg_catalog.pg_class AS c
    JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.relname = %(name)s::text AND c.relkind = 'i' AND n.nspname = {self._namespace}
)"""

    @cached_property
    def index_reindex_artifacts(self) -> str:
        """What REINDEX CONCURRENTLY leaves behind when interrupted: <name>_ccnew[N],
        _ccold[N]."""
        return f"""
SELECT c.relname::text
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.relkind = 'i'
    AND n.nspname = {self._namespace}
    AND left(c.relname, length(%(name)s::text)) = %(name)s::text
    AND substring(c.relname FROM length(%(name)s::text) + 1) ~ '^_cc(new|old)[0-9]*$'
ORDER BY 1"""

    def index_reindex(self, name: str) -> str:
        return f"REINDEX INDEX CONCURRENTLY {self.prefix}{quote_ident(name)}"

    def index_drop_if_exists(self, name: str) -> str:
        return f"DROP INDEX CONCURRENTLY IF EXISTS {self.prefix}{quote_ident(name)}"

    @cached_property
    def job_give_back_lost_claims(self) -> str:
        """Rows a claim of this client left ``running`` without the client knowing (see
        ``Executor.job_give_back_lost_claims``), made ``available`` again (``cancelled`` when a
        cancellation was requested meanwhile). Parameters (named): queue, client_id,
        claimed_after (NULL: no bound), within (seconds before now()), running (ids to leave)."""
        cancel = "j.metadata ? 'cancel_attempted_at'"
        return f"""
WITH lost AS (
    SELECT id
    FROM {self.prefix}river_job
    WHERE state = 'running'
        AND queue = %(queue)s::text
        AND attempted_by[cardinality(attempted_by)] = %(client_id)s::text
        AND attempted_at > coalesce(%(claimed_after)s::timestamptz, '-infinity')
        AND attempted_at >= now() - %(within)s::float8 * interval '1 second'
        AND id <> ALL(%(running)s::bigint[])
    ORDER BY id
    FOR UPDATE
), given AS (
    UPDATE {self.prefix}river_job AS j
    SET state = CASE
            WHEN {cancel} THEN 'cancelled'::{self.prefix}river_job_state
            ELSE 'available'::{self.prefix}river_job_state
        END,
        attempt = CASE WHEN {cancel} THEN j.attempt ELSE greatest(j.attempt - 1, 0) END,
        finalized_at = CASE WHEN {cancel} THEN now() ELSE NULL END
    FROM lost
    WHERE j.id = lost.id
    RETURNING {_JCOLS}
)
SELECT * FROM given ORDER BY id"""
