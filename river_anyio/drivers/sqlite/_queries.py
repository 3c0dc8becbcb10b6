"""SQL text for River's SQLite schema, built once per schema prefix.

Conventions of River's SQLite tables: JSON columns are JSONB blobs (read them through ``json()``,
write them through ``jsonb()``), ``unique_states`` is an integer bitmask and timestamps are text.
"""

from __future__ import annotations

import functools
from typing import Final

import attrs

from ._connection import quote_ident

__all__ = ["FINAL_STATES", "JOB_COLUMNS", "QUEUE_COLUMNS", "Queries"]

#: Columns read for a JobRow, in the order ``_executor.job_rows`` expects.
JOB_COLUMNS: Final = (
    "id, json(args), attempt, attempted_at, json(attempted_by), created_at, json(errors), "
    "finalized_at, kind, max_attempts, json(metadata), priority, queue, scheduled_at, state, "
    "json(tags), unique_key, unique_states"
)

#: Columns read for a QueueRow, in the order ``_executor.queue_rows`` expects.
QUEUE_COLUMNS: Final = "name, created_at, json(metadata), paused_at, updated_at"

#: States whose rows carry ``finalized_at`` (the table's CHECK insists on it).
FINAL_STATES: Final = "('cancelled', 'completed', 'discarded')"

# The predicate of the partial unique index river_job_unique_idx. An upsert's conflict target
# must repeat it (as the same expression) for SQLite to pick that index.
_UNIQUE_INDEX_PREDICATE: Final = """unique_key IS NOT NULL
        AND unique_states IS NOT NULL
        AND CASE state
            WHEN 'available' THEN unique_states & (1 << 0)
            WHEN 'cancelled' THEN unique_states & (1 << 1)
            WHEN 'completed' THEN unique_states & (1 << 2)
            WHEN 'discarded' THEN unique_states & (1 << 3)
            WHEN 'pending'   THEN unique_states & (1 << 4)
            WHEN 'retryable' THEN unique_states & (1 << 5)
            WHEN 'running'   THEN unique_states & (1 << 6)
            WHEN 'scheduled' THEN unique_states & (1 << 7)
            ELSE 0
        END >= 1"""

#: Position of each field in one element of the insert batch (a JSON array per job). The
#: returning insert's metadata already carries the job's ``river:unique_nonce``.
BATCH_FIELDS: Final = (
    "args",
    "kind",
    "max_attempts",
    "metadata",
    "priority",
    "queue",
    "state",
    "tags",
    "created_at",
    "scheduled_at",
    "unique_key_hex",
    "unique_states",
)


def _insert_many(prefix: str, *, returning: bool) -> str:
    # ?1 is the whole batch: a JSON array with one array per job (see BATCH_FIELDS).
    tail = f"DO UPDATE SET kind = j.kind\nRETURNING {JOB_COLUMNS}" if returning else "DO NOTHING"
    return f"""
INSERT INTO {prefix}river_job AS j (
    args, kind, max_attempts, metadata, priority, queue, state, tags,
    created_at, scheduled_at, unique_key, unique_states
)
SELECT
    jsonb(b.value -> 0),
    b.value ->> 1,
    b.value ->> 2,
    jsonb(b.value -> 3),
    b.value ->> 4,
    b.value ->> 5,
    b.value ->> 6,
    jsonb(b.value -> 7),
    coalesce(b.value ->> 8, datetime('now', 'subsec')),
    coalesce(b.value ->> 9, datetime('now', 'subsec')),
    unhex(b.value ->> 10),
    nullif(b.value ->> 11, 0)
FROM json_each(?1) AS b
WHERE true
ON CONFLICT (unique_key) WHERE {_UNIQUE_INDEX_PREDICATE}
{tail}"""


def _claim(prefix: str, *, kinds: bool) -> str:
    # ?1 queue, ?2 max_to_lock, ?3 now, ?4 max_attempted_by, ?5 kinds (JSON array), ?6 client.
    # attempted_by keeps its last (?4 - 1) entries once full, then gets the client appended.
    kind_filter = "\n        AND kind IN (SELECT k.value FROM json_each(?5) AS k)" if kinds else ""
    return f"""
UPDATE {prefix}river_job
SET state = 'running',
    attempt = attempt + 1,
    attempted_at = ?3,
    attempted_by = jsonb_insert(
        CASE
            WHEN attempted_by IS NULL THEN jsonb('[]')
            WHEN json_array_length(attempted_by) < ?4 THEN attempted_by
            ELSE (
                SELECT jsonb_group_array(e.value ORDER BY e.key)
                FROM json_each(attempted_by) AS e
                WHERE e.key > json_array_length(attempted_by) - ?4
            )
        END,
        '$[#]',
        ?6
    )
WHERE id IN (
    SELECT id
    FROM {prefix}river_job
    WHERE state = 'available'
        AND queue = ?1
        AND priority >= 0
        AND scheduled_at <= ?3{kind_filter}
    ORDER BY priority, scheduled_at, id
    LIMIT ?2
)
RETURNING {JOB_COLUMNS}"""


def _complete(prefix: str, merge: str) -> str:
    # ?1: the batch, a JSON array with one array per completion (see COMPLETION_FIELDS);
    # ?2: now; ?3: the client id. Only rows whose attempt guard holds are updated; the join is
    # driven by the batch (+state keeps the planner off the state index: rowid lookups).
    # cancel: a retry or snooze of a job whose cancellation was requested ends it instead.
    cancel = (
        "(c.state IN ('available', 'retryable', 'scheduled') "
        "AND (j.metadata -> 'cancel_attempted_at') IS NOT NULL)"
    )
    return f"""
UPDATE {prefix}river_job AS j
SET state = CASE WHEN {cancel} THEN 'cancelled' ELSE c.state END,
    attempt = CASE WHEN {cancel} THEN j.attempt ELSE coalesce(c.attempt_new, j.attempt) END,
    errors = CASE
        WHEN c.error IS NULL THEN j.errors
        ELSE jsonb_insert(coalesce(j.errors, jsonb('[]')), '$[#]', jsonb(c.error))
    END,
    finalized_at = CASE
        WHEN {cancel} THEN ?2
        WHEN c.state IN {FINAL_STATES} THEN coalesce(c.finalized_at, j.finalized_at, ?2)
        ELSE NULL
    END,
    scheduled_at = CASE
        WHEN {cancel} THEN j.scheduled_at
        ELSE coalesce(c.scheduled_at, j.scheduled_at)
    END,
    metadata = CASE
        WHEN c.updates IS NULL THEN j.metadata
        ELSE {merge.format(doc="j.metadata", patch="c.updates")}
    END
FROM (
    SELECT
        b.value ->> 0 AS id,
        b.value ->> 1 AS attempt,
        b.value ->> 2 AS state,
        b.value ->> 3 AS finalized_at,
        b.value ->> 4 AS scheduled_at,
        b.value ->> 5 AS error,
        b.value ->> 6 AS updates,
        b.value ->> 7 AS attempt_new
    FROM json_each(?1) AS b
) AS c
WHERE j.id = c.id
    AND +j.state = 'running'
    AND j.attempt = c.attempt
    AND j.attempted_by ->> '$[#-1]' = ?3
RETURNING {JOB_COLUMNS}"""


#: Position of each field in one element of the completion batch (a JSON array per job).
COMPLETION_FIELDS: Final = (
    "id",
    "attempt",
    "state",
    "finalized_at",
    "scheduled_at",
    "error",
    "metadata_updates",
    "attempt_new",
)


#: How completions merge metadata updates into a row's metadata, as River Go 0.51's SQLite
#: driver does and like PostgreSQL's ``||``: each top-level key of the update replaces the
#: row's (nested objects are not merged) and nulls are stored. Keys keep their position.
METADATA_MERGE: Final = """(
    SELECT jsonb_group_object(m.key, json(m.val)) FROM (
        SELECT d.key AS key,
               CASE WHEN json_type({patch}, d.fullkey) IS NULL
                    THEN {doc} -> d.fullkey ELSE {patch} -> d.fullkey END AS val
        FROM json_each({doc}) AS d
        UNION ALL
        SELECT p.key, {patch} -> p.fullkey
        FROM json_each({patch}) AS p
        WHERE json_type({doc}, p.fullkey) IS NULL
    ) AS m
)"""


@attrs.frozen
class Queries:
    """Every statement the executor runs, for one schema (attached database) or none."""

    schema: str | None
    prefix: str
    job_insert_fast_many: str
    job_insert_fast_many_no_returning: str
    job_get_by_id: str
    job_list_select: str
    notify_many: str
    table_exists: str
    column_exists: str
    notification_last_id: str
    notification_after: str
    # the runtime's hot path
    job_get_available: str
    job_get_available_kinds: str
    job_complete_if_running: str
    job_merge_metadata: str
    job_get_many: str
    job_cancel: str
    notify_one: str
    # queues
    queue_create_or_set_updated_at: str
    queue_get: str
    queue_list: str
    queue_pause: str
    queue_resume: str

    @classmethod
    def for_schema(cls, schema: str | None) -> Queries:
        prefix = f"{quote_ident(schema)}." if schema else ""
        return cls(
            schema=schema,
            prefix=prefix,
            job_insert_fast_many=_insert_many(prefix, returning=True),
            job_insert_fast_many_no_returning=_insert_many(prefix, returning=False),
            job_get_by_id=f"SELECT {JOB_COLUMNS} FROM {prefix}river_job WHERE id = ?1",
            job_list_select=f"SELECT {JOB_COLUMNS} FROM {prefix}river_job",
            notify_many=(
                f"INSERT INTO {prefix}river_notification (topic, payload) "
                "SELECT ?1, p.value FROM json_each(?2) AS p"
            ),
            table_exists=(
                f"SELECT count(*) FROM {prefix}sqlite_master WHERE type = 'table' AND name = ?1"
            ),
            column_exists="SELECT count(*) FROM pragma_table_info(?1, ?2) WHERE name = ?3",
            notification_last_id=(f"SELECT coalesce(max(id), 0) FROM {prefix}river_notification"),
            notification_after=(
                f"SELECT id, topic, payload FROM {prefix}river_notification "
                "WHERE id > ?1 AND topic IN (SELECT t.value FROM json_each(?2) AS t) "
                "ORDER BY id LIMIT ?3"
            ),
            job_get_available=_claim(prefix, kinds=False),
            job_get_available_kinds=_claim(prefix, kinds=True),
            job_complete_if_running=_complete(prefix, METADATA_MERGE),
            # ?1: a JSON array of [id, updates] pairs.
            job_merge_metadata=f"""
UPDATE {prefix}river_job AS j
SET metadata = {METADATA_MERGE.format(doc="j.metadata", patch="c.updates")}
FROM (SELECT b.value ->> 0 AS id, b.value ->> 1 AS updates FROM json_each(?1) AS b) AS c
WHERE j.id = c.id
RETURNING {JOB_COLUMNS}""",
            job_get_many=(
                f"SELECT {JOB_COLUMNS} FROM {prefix}river_job "
                "WHERE id IN (SELECT b.value FROM json_each(?1) AS b)"
            ),
            # A running job is only flagged: its client stops it (told by the notification).
            job_cancel=f"""
UPDATE {prefix}river_job
SET state = CASE WHEN state = 'running' THEN state ELSE 'cancelled' END,
    finalized_at = CASE WHEN state = 'running' THEN finalized_at ELSE ?3 END,
    metadata = jsonb_set(metadata, '$.cancel_attempted_at', ?2)
WHERE id = ?1
    AND state NOT IN {FINAL_STATES}
    AND finalized_at IS NULL
RETURNING {JOB_COLUMNS}""",
            notify_one=f"INSERT INTO {prefix}river_notification (topic, payload) VALUES (?1, ?2)",
            queue_create_or_set_updated_at=f"""
INSERT INTO {prefix}river_queue (name, created_at, metadata, paused_at, updated_at)
VALUES (?1, ?3, jsonb(?2), NULL, ?3)
ON CONFLICT (name) DO UPDATE SET updated_at = excluded.updated_at
RETURNING {QUEUE_COLUMNS}""",
            queue_get=f"SELECT {QUEUE_COLUMNS} FROM {prefix}river_queue WHERE name = ?1",
            queue_list=f"SELECT {QUEUE_COLUMNS} FROM {prefix}river_queue ORDER BY name LIMIT ?1",
            # Both match every row of the name (or all for '*'); only a change moves updated_at.
            queue_pause=f"""
UPDATE {prefix}river_queue
SET paused_at = coalesce(paused_at, ?2),
    updated_at = CASE WHEN paused_at IS NULL THEN ?2 ELSE updated_at END
WHERE ?1 = '*' OR name = ?1""",
            queue_resume=f"""
UPDATE {prefix}river_queue
SET paused_at = NULL,
    updated_at = CASE WHEN paused_at IS NULL THEN updated_at ELSE ?2 END
WHERE ?1 = '*' OR name = ?1""",
        )


# ---------------------------------------------------------------------------------------------
# client job and queue APIs (River's JobList/JobRetry/JobDelete/JobUpdate/QueueUpdate). Built
# per call from the schema prefix and cached: these are not on the runtime's hot path.


def sortable_time(column: str) -> str:
    """``column`` (timestamp text) padded to ``YYYY-MM-DD HH:MM:SS.ffffff``, so texts written
    with fewer fractional digits (SQLite's own ``subsec`` milliseconds) compare and sort as
    the instants they are against the microsecond texts this driver writes."""
    return (
        f"CASE WHEN length({column}) = 19 THEN {column} || '.000000' "
        f"ELSE substr({column} || '000000', 1, 26) END"
    )


@functools.cache
def api_job_retry(prefix: str) -> str:
    """?1 the id, ?2 now. Matches nothing for a running job or an available one already due."""
    return f"""
UPDATE {prefix}river_job
SET state = 'available',
    max_attempts = CASE WHEN attempt = max_attempts THEN max_attempts + 1 ELSE max_attempts END,
    finalized_at = NULL,
    metadata = jsonb_remove(metadata, '$.cancel_attempted_at'),
    scheduled_at = ?2
WHERE id = ?1
    AND state <> 'running'
    AND NOT (state = 'available' AND {sortable_time("scheduled_at")} < ?2)
RETURNING {JOB_COLUMNS}"""


@functools.cache
def api_job_delete(prefix: str) -> str:
    """?1 the id. Matches nothing for a running job."""
    return f"""
DELETE FROM {prefix}river_job
WHERE id = ?1 AND state <> 'running'
RETURNING {JOB_COLUMNS}"""


@functools.cache
def api_job_delete_many(prefix: str, where: str) -> str:
    """``where`` takes the first parameters; the limit follows."""
    return f"""
DELETE FROM {prefix}river_job
WHERE id IN (
    SELECT id
    FROM {prefix}river_job
    WHERE {where} AND state <> 'running'
    ORDER BY id
    LIMIT ?
)
RETURNING {JOB_COLUMNS}"""


@functools.cache
def api_job_update_metadata(prefix: str) -> str:
    """?1 the id, ?2 the updates (JSON text), merged as completions merge."""
    return f"""
UPDATE {prefix}river_job
SET metadata = {METADATA_MERGE.format(doc="metadata", patch="?2")}
WHERE id = ?1
RETURNING {JOB_COLUMNS}"""


@functools.cache
def api_queue_update(prefix: str) -> str:
    """?1 the name, ?2 the new metadata (NULL keeps it), ?3 now."""
    return f"""
UPDATE {prefix}river_queue
SET metadata = CASE WHEN ?2 IS NULL THEN metadata ELSE jsonb(?2) END,
    updated_at = ?3
WHERE name = ?1
RETURNING {QUEUE_COLUMNS}"""


@functools.cache
def job_give_back_lost_claims(prefix: str) -> str:
    """Rows a claim of this client left ``running`` without the client knowing (see
    ``Executor.job_give_back_lost_claims``), made ``available`` again (``cancelled`` when a
    cancellation was requested meanwhile). ?1 queue, ?2 client id, ?3 claimed after ('' for
    no bound), ?4 the window's start, ?5 ids to leave (a JSON array), ?6 now."""
    attempted = sortable_time("attempted_at")
    cancel = "(metadata -> 'cancel_attempted_at') IS NOT NULL"
    return f"""
UPDATE {prefix}river_job
SET state = CASE WHEN {cancel} THEN 'cancelled' ELSE 'available' END,
    attempt = CASE WHEN {cancel} THEN attempt ELSE max(attempt - 1, 0) END,
    finalized_at = CASE WHEN {cancel} THEN ?6 ELSE NULL END
WHERE state = 'running'
    AND queue = ?1
    AND attempted_by ->> '$[#-1]' = ?2
    AND {attempted} > ?3
    AND {attempted} >= ?4
    AND id NOT IN (SELECT value FROM json_each(?5))
RETURNING {JOB_COLUMNS}"""
