"""SQL text for the PostgreSQL executor, built once per schema.

Every reference to a River table, type or function carries the schema prefix (``"schema".``
when one is configured, nothing otherwise so ``search_path`` decides). Column lists are always
explicit: a prepared ``SELECT *`` breaks when another connection alters the table.
"""

from __future__ import annotations

import functools

import attrs
from psycopg import sql

__all__ = ["JOB_COLUMNS", "QUEUE_COLUMNS", "Queries", "quote_ident"]

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


def quote_ident(name: str) -> str:
    """A double-quoted SQL identifier (embedded quotes doubled)."""
    return sql.Identifier(name).as_string(None)


def _channel(schema: str | None, topic: str) -> str:
    """SQL for a notification channel: ``<schema>.<topic>``, the session's current schema when
    none is configured."""
    if schema:
        return sql.Literal(f"{schema}.{topic}").as_string(None)
    return f"(current_schema() || {sql.Literal('.' + topic).as_string(None)})"


def _job_select(prefix: str = "") -> str:
    return ", ".join(prefix + c for c in JOB_COLUMNS)


@attrs.frozen
class Queries:
    """The statements of one schema (``schema`` None: unqualified names)."""

    schema: str | None
    prefix: str
    job_insert_fast_many: str
    job_copy: str
    job_get_by_id: str
    job_list_head: str
    notify_many: str
    job_get_available: str
    job_get_available_kinds: str
    job_set_state_if_running_many: str
    job_set_state_if_running_many_lean: str
    job_cancel: str
    queue_create_or_set_updated_at: str
    queue_get: str
    queue_list: str
    queue_pause: str
    queue_resume: str
    #: ``notify_many`` and ``job_insert_fast_many`` in one statement: the notification's
    #: parameters first, then the insert's; an extra last column counts the notifications
    job_insert_fast_many_notify: str

    @classmethod
    def build(cls, schema: str | None) -> Queries:
        p = quote_ident(schema) + "." if schema else ""
        cols = _job_select()
        # The batch arrives as one text parameter per column: every element preceded by a
        # chr(30) separator (so an empty element survives), tags of one job joined by chr(31).
        # Splitting server-side avoids per-element adaptation in Python; the first (empty)
        # element is dropped with [2:].
        fields = ", ".join("(string_to_array(%s, chr(30)))[2:]" for _ in INSERT_COLUMNS)
        insert_fast_many = f"""
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
RETURNING {cols}, xmax::text <> '0'"""
        notify_many = (
            "SELECT pg_notify(%s, payload) FROM unnest(%s::text[]) AS n(payload)"
            if schema
            else "SELECT pg_notify(concat(current_schema(), '.', %s::text), payload) "
            "FROM unnest(%s::text[]) AS n(payload)"
        )
        claim = _claim(p, kinds=False)
        claim_kinds = _claim(p, kinds=True)
        control = _channel(schema, "river_control")
        qcols = ", ".join(QUEUE_COLUMNS)
        return cls(
            schema=schema,
            prefix=p,
            job_insert_fast_many=insert_fast_many,
            job_copy=f"COPY {p}river_job (%s) FROM STDIN",
            job_get_by_id=f"SELECT {cols} FROM {p}river_job WHERE id = %s",
            job_list_head=f"SELECT {cols} FROM {p}river_job",
            notify_many=notify_many,
            job_get_available=claim,
            job_get_available_kinds=claim_kinds,
            job_set_state_if_running_many=_set_state_many(p),
            job_set_state_if_running_many_lean=_set_state_many(p, lean=True),
            job_cancel=_cancel(p, control),
            queue_create_or_set_updated_at=f"""
INSERT INTO {p}river_queue AS q (name, created_at, metadata, paused_at, updated_at)
VALUES (%s::text, now(), coalesce(%s::jsonb, '{{}}'), NULL, now())
ON CONFLICT (name) DO UPDATE SET updated_at = now()
RETURNING {qcols}""",
            queue_get=f"SELECT {qcols} FROM {p}river_queue WHERE name = %s::text",
            queue_list=f"SELECT {qcols} FROM {p}river_queue ORDER BY name LIMIT %s",
            queue_pause=_queue_control(
                p,
                control,
                "pause",
                "paused_at = coalesce(paused_at, now()), "
                "updated_at = CASE WHEN paused_at IS NULL THEN now() ELSE updated_at END",
            ),
            queue_resume=_queue_control(
                p,
                control,
                "resume",
                "paused_at = NULL, "
                "updated_at = CASE WHEN paused_at IS NULL THEN updated_at ELSE now() END",
            ),
            # The count forces the notification CTE to run (once, whatever the row count);
            # RETURNING order is the insert's input order.
            job_insert_fast_many_notify=(
                f"WITH notified AS MATERIALIZED ({notify_many}),\n"
                f"inserted AS ({insert_fast_many})\n"
                "SELECT inserted.*, (SELECT count(*) FROM notified) FROM inserted"
            ),
        )

    def state_cast(self) -> str:
        return f"{self.prefix}river_job_state"

    def qualified(self, table: str) -> str:
        """``table`` qualified with the schema (for ``to_regclass``)."""
        return self.prefix + quote_ident(table)


_FINAL_STATES = "('cancelled', 'completed', 'discarded')"


def _claim(p: str, *, kinds: bool) -> str:
    """The claim: lock due available rows in fetch order, skipping rows other claimers hold,
    then mark them running. Parameters: queue, [kinds,] limit, max_attempted_by, client id.

    ``attempted_by`` keeps its newest ``max - 1`` entries before the client id is appended.
    The outer query restores the fetch order (an UPDATE's RETURNING has none).
    """
    kind_filter = "\n        AND kind = ANY(%s::text[])" if kinds else ""
    jcols = ", ".join("j." + c for c in JOB_COLUMNS)
    return f"""
WITH picked AS (
    SELECT id
    FROM {p}river_job
    WHERE state = 'available'
        AND queue = %s::text
        AND scheduled_at <= now(){kind_filter}
    ORDER BY priority, scheduled_at, id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {p}river_job AS j
    SET state = 'running',
        attempt = j.attempt + 1,
        attempted_at = now(),
        attempted_by = CASE
            WHEN cardinality(j.attempted_by) >= %s::integer
            THEN j.attempted_by[cardinality(j.attempted_by) - %s::integer + 2 :]
            ELSE coalesce(j.attempted_by, '{{}}')
        END || %s::varchar(255)
    FROM picked
    WHERE j.id = picked.id
    RETURNING {jcols}
)
SELECT * FROM claimed ORDER BY priority, scheduled_at, id"""


def _from_micros(expr: str) -> str:
    """SQL for the timestamptz ``expr`` microseconds after the epoch (exact over the whole
    timestamp range: the float multiplications involved are exact)."""
    return (
        f"(timestamptz 'epoch' + ({expr} / 1000000) * interval '1 second'"
        f" + mod({expr}, 1000000) * interval '1 microsecond')"
    )


def _set_state_many(p: str, *, lean: bool = False) -> str:
    """The batch completion. Parameters (one text per column, see ``_executor``): ids,
    attempts and states joined by commas; new attempts, finalized_at and scheduled_at
    (microseconds since the epoch) each element preceded by a comma, so an empty one is
    NULL; errors and metadata updates each preceded by chr(30); then the client id.

    A row takes the new state only while it is running the given attempt for this client
    (``applies``); metadata updates merge either way. Rows left alone are read back as they
    are; results follow the input order. ``lean``: only the ids of the completions that did not
    apply (usually none: nothing to decode when nobody needs the rows).
    """
    jcols = "j.id" if lean else ", ".join("j." + c for c in JOB_COLUMNS)
    return f"""
WITH input AS (
    SELECT *
    FROM unnest(
        string_to_array(%s, ',')::bigint[],
        string_to_array(%s, ',')::smallint[],
        string_to_array(%s, ','),
        (string_to_array(%s, ','))[2:],
        (string_to_array(%s, ','))[2:],
        (string_to_array(%s, ','))[2:],
        (string_to_array(%s, chr(30)))[2:],
        (string_to_array(%s, chr(30)))[2:]
    ) WITH ORDINALITY AS i(
        id, attempt, state, attempt_new, finalized_at, scheduled_at, error, metadata, ord
    )
), target AS (
    SELECT
        i.ord,
        j.id,
        i.state::{p}river_job_state AS state,
        nullif(i.attempt_new, '')::smallint AS attempt_new,
        {_from_micros("nullif(i.finalized_at, '')::bigint")} AS finalized_at,
        {_from_micros("nullif(i.scheduled_at, '')::bigint")} AS scheduled_at,
        nullif(i.error, '')::jsonb AS error,
        nullif(i.metadata, '')::jsonb AS metadata,
        coalesce(
            j.state = 'running'
                AND j.attempt = i.attempt
                AND j.attempted_by[cardinality(j.attempted_by)] = %s::text,
            false
        ) AS applies,
        i.state IN ('available', 'retryable', 'scheduled') AND j.metadata ? 'cancel_attempted_at'
            AS should_cancel
    FROM input AS i
    JOIN {p}river_job AS j ON j.id = i.id
    ORDER BY j.id
    FOR UPDATE OF j
), updated AS (
    UPDATE {p}river_job AS j
    SET state = CASE
            WHEN NOT t.applies THEN j.state
            WHEN t.should_cancel THEN 'cancelled'
            ELSE t.state
        END,
        attempt = CASE
            WHEN t.applies AND NOT t.should_cancel AND t.attempt_new IS NOT NULL
            THEN t.attempt_new
            ELSE j.attempt
        END,
        errors = CASE
            WHEN t.applies AND t.error IS NOT NULL THEN array_append(j.errors, t.error)
            ELSE j.errors
        END,
        finalized_at = CASE
            WHEN NOT t.applies THEN j.finalized_at
            WHEN t.should_cancel THEN now()
            WHEN t.state IN {_FINAL_STATES} THEN coalesce(t.finalized_at, j.finalized_at)
            ELSE NULL
        END,
        scheduled_at = CASE
            WHEN t.applies AND NOT t.should_cancel AND t.scheduled_at IS NOT NULL
            THEN t.scheduled_at
            ELSE j.scheduled_at
        END,
        metadata = CASE
            WHEN t.metadata IS NULL THEN j.metadata
            ELSE j.metadata || t.metadata
        END
    FROM target AS t
    WHERE j.id = t.id AND (t.applies OR t.metadata IS NOT NULL)
    RETURNING {jcols}, t.applies, t.ord
)
SELECT * FROM updated{" WHERE NOT applies" if lean else ""}
UNION ALL
SELECT {jcols}, false, t.ord
FROM target AS t
JOIN {p}river_job AS j ON j.id = t.id
WHERE NOT t.applies AND t.metadata IS NULL
ORDER BY {(1 if lean else len(JOB_COLUMNS)) + 2}"""


def _cancel(p: str, channel: str) -> str:
    """River's JobCancel. Parameters: id, cancel_attempted_at (RFC 3339 text), notify flag.

    A running row keeps running (its worker is told through the control notification); any
    other non-final row is cancelled. A final row is read back unchanged.
    """
    jcols = ", ".join("j." + c for c in JOB_COLUMNS)
    return f"""
WITH locked AS (
    SELECT id, queue, state, state IN {_FINAL_STATES} OR finalized_at IS NOT NULL AS final
    FROM {p}river_job
    WHERE id = %s
    FOR UPDATE
), notified AS (
    SELECT pg_notify(
        {channel},
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
    RETURNING {jcols}
)
SELECT *, (SELECT count(*) FROM notified) FROM updated
UNION ALL
SELECT {jcols}, 0
FROM {p}river_job AS j
JOIN locked AS l ON l.id = j.id
WHERE l.final"""


def _queue_control(p: str, channel: str, action: str, assignments: str) -> str:
    """Pause or resume a queue (``*``: all) and send the control notification in the same
    statement, as River does, unless a named queue matched nothing. Parameters: the name,
    three times. Returns the rows matched."""
    return f"""
WITH updated AS (
    UPDATE {p}river_queue
    SET {assignments}
    WHERE %s::text = '*' OR name = %s::text
    RETURNING 1
), matched AS (
    SELECT count(*) AS n FROM updated
)
SELECT m.n, (
    SELECT count(pg_notify(
        {channel}, json_build_object('action', '{action}', 'queue', %s::text)::text
    )::text)
    WHERE m.n > 0 OR %s::text = '*'
)
FROM matched AS m"""


# ---------------------------------------------------------------------------------------------
# client job and queue APIs (River's JobList/JobRetry/JobDelete/JobUpdate/QueueUpdate). Built
# per call from the schema prefix and cached: these are not on the runtime's hot path.


@functools.cache
def api_job_retry(p: str) -> str:
    """Parameter: the id. The row is locked first; a running job, or an available one already
    due, is read back unchanged (the CTE's snapshot predates the update)."""
    jcols = ", ".join("j." + c for c in JOB_COLUMNS)
    return f"""
WITH target AS (
    SELECT id FROM {p}river_job WHERE id = %s FOR UPDATE
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
    RETURNING {jcols}
)
SELECT * FROM retried
UNION ALL
SELECT {jcols}
FROM {p}river_job AS j
JOIN target AS t ON t.id = j.id
WHERE NOT EXISTS (SELECT 1 FROM retried)"""


@functools.cache
def api_job_delete(p: str) -> str:
    """Parameter: the id. A running row is returned undeleted."""
    jcols = ", ".join("j." + c for c in JOB_COLUMNS)
    return f"""
WITH target AS (
    SELECT id, state = 'running' AS running FROM {p}river_job WHERE id = %s FOR UPDATE
), deleted AS (
    DELETE FROM {p}river_job AS j
    USING target AS t
    WHERE j.id = t.id AND NOT t.running
    RETURNING {jcols}
)
SELECT * FROM deleted
UNION ALL
SELECT {jcols}
FROM {p}river_job AS j
JOIN target AS t ON t.id = j.id
WHERE t.running"""


@functools.cache
def api_job_delete_many(p: str, where: str) -> str:
    """``where`` is the filter text of :func:`api_list_where` (its parameters come first),
    then the limit."""
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
    USING picked
    WHERE j.id = picked.id
    RETURNING {", ".join("j." + c for c in JOB_COLUMNS)}
)
SELECT * FROM deleted ORDER BY id"""


@functools.cache
def api_job_update_metadata(p: str) -> str:
    """Parameters: the encoded metadata updates, the id."""
    return f"""
UPDATE {p}river_job
SET metadata = metadata || %s::jsonb
WHERE id = %s
RETURNING {_job_select()}"""


@functools.cache
def api_queue_update(p: str) -> str:
    """Parameters: the new metadata (NULL keeps it), the name."""
    return f"""
UPDATE {p}river_queue
SET metadata = coalesce(%s::jsonb, metadata),
    updated_at = now()
WHERE name = %s::text
RETURNING {", ".join(QUEUE_COLUMNS)}"""


@functools.cache
def job_give_back_lost_claims(p: str) -> str:
    """Rows a claim of this client left ``running`` without the client knowing (see
    ``Executor.job_give_back_lost_claims``), made ``available`` again (``cancelled`` when a
    cancellation was requested meanwhile). Parameters (named): queue, client_id,
    claimed_after (NULL: no bound), within (seconds before now()), running (ids to leave)."""
    cancel = "j.metadata ? 'cancel_attempted_at'"
    return f"""
WITH lost AS (
    SELECT id
    FROM {p}river_job
    WHERE state = 'running'
        AND queue = %(queue)s::text
        AND attempted_by[cardinality(attempted_by)] = %(client_id)s::text
        AND attempted_at > coalesce(%(claimed_after)s::timestamptz, '-infinity')
        AND attempted_at >= now() - %(within)s::float8 * interval '1 second'
        AND id <> ALL(%(running)s::bigint[])
    ORDER BY id
    FOR UPDATE
), given AS (
    UPDATE {p}river_job AS j
    SET state = CASE
            WHEN {cancel} THEN 'cancelled'::{p}river_job_state
            ELSE 'available'::{p}river_job_state
        END,
        attempt = CASE WHEN {cancel} THEN j.attempt ELSE greatest(j.attempt - 1, 0) END,
        finalized_at = CASE WHEN {cancel} THEN now() ELSE NULL END
    FROM lost
    WHERE j.id = lost.id
    RETURNING {", ".join("j." + c for c in JOB_COLUMNS)}
)
SELECT * FROM given ORDER BY id"""
