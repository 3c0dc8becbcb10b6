"""Every statement the SQLite executor runs, one named property each, built once per schema.

Conventions of River's SQLite tables: JSON columns are JSONB blobs (read them through ``json()``,
write them through ``jsonb()``), ``unique_states`` is an integer bitmask and timestamps are text
compared as text. In the leadership and maintenance statements a NULL ``now`` means the
database's ``datetime('now', 'subsec')``; lease terms are matched with ``unixepoch(…,
'subsec')`` so a term written by River Go in another text format still matches. A statement
that depends on a call's values (a list's filters, an index name) is a method completing the
statement's text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from typing import Any, Final

from ..._timeutil import format_sqlite_timestamp
from ..._unique import JOB_STATES
from .._shared import ListDialect
from ._connection import quote_ident

__all__ = [
    "BATCH_FIELDS",
    "COMPLETION_FIELDS",
    "FINAL_STATES",
    "JOB_COLUMNS",
    "QUEUE_COLUMNS",
    "Queries",
    "sortable_time",
]


def _valid(column: str) -> str:
    """``column`` holds JSON. River writes its JSON columns as JSONB blobs; a column changed
    out of band may hold text that is not JSON, on which SQLite's JSON functions fail
    ("malformed JSON"), so only text is checked (``json_valid``'s flags for JSONB are not in
    every SQLite River runs on). Statements that touch a job's JSON leave such a value as
    it is."""
    return f"(typeof({column}) <> 'text' OR json_valid({column}))"


def _json_text(column: str) -> str:
    """``column`` as JSON text, or as the text it holds when that is not JSON (the row
    reader reports the row as undecodable)."""
    return f"CASE WHEN {_valid(column)} THEN json({column}) ELSE {column} END"


#: Columns read for a JobRow, in the order ``_executor.job_rows`` expects.
JOB_COLUMNS: Final = (
    f"id, {_json_text('args')}, attempt, attempted_at, {_json_text('attempted_by')}, "
    f"created_at, {_json_text('errors')}, finalized_at, kind, max_attempts, "
    f"{_json_text('metadata')}, priority, queue, scheduled_at, state, {_json_text('tags')}, "
    "unique_key, unique_states"
)

#: Columns read for a QueueRow, in the order ``_executor.queue_rows`` expects.
QUEUE_COLUMNS: Final = "name, created_at, json(metadata), paused_at, updated_at"

#: States whose rows carry ``finalized_at`` (the table's CHECK insists on it).
FINAL_STATES: Final = "('cancelled', 'completed', 'discarded')"

_LEADER_COLUMNS: Final = "leader_id, elected_at, expires_at"
_LEASE_COLUMNS: Final = "name, holder, taken_at, expires_at"
_DB_NOW: Final = "datetime('now', 'subsec')"


def _unique_index_predicate(row: str = "") -> str:
    """The predicate of the partial unique index river_job_unique_idx, on the row aliased
    ``row`` (none: unqualified). An upsert's conflict target must repeat it (as the same
    expression) for SQLite to pick that index. The bits are River's (``_unique.JOB_STATES``)."""
    r = f"{row}." if row else ""
    cases = "".join(
        f"\n            WHEN '{state}' THEN {r}unique_states & (1 << {bit})"
        for bit, state in enumerate(JOB_STATES)
    )
    return f"""{r}unique_key IS NOT NULL
        AND {r}unique_states IS NOT NULL
        AND CASE {r}state{cases}
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


#: A job's errors with one error appended (``{error}``: its JSON text), as River Go's SQLite
#: driver appends it: errors changed out of band to something other than an array are
#: wrapped in one first (as a string when not JSON), so nothing is lost.
_APPEND_ERROR: Final = f"""CASE
        WHEN {{error}} IS NULL THEN j.errors
        WHEN NOT {_valid("j.errors")} THEN jsonb_array(j.errors, jsonb({{error}}))
        WHEN coalesce(json_type(j.errors), 'array') <> 'array'
        THEN jsonb_array(jsonb(j.errors), jsonb({{error}}))
        ELSE jsonb_insert(coalesce(j.errors, jsonb('[]')), '$[#]', jsonb({{error}}))
    END"""


def sortable_time(column: str) -> str:
    """``column`` (timestamp text) in River's ``YYYY-MM-DD HH:MM:SS.fff`` layout, so texts
    written without a fraction (``CURRENT_TIMESTAMP``) compare and sort as the instants they
    are against the millisecond texts River and this driver write. Longer fractions are cut
    to milliseconds."""
    return (
        f"CASE WHEN length({column}) = 19 THEN {column} || '.000' "
        f"ELSE substr({column} || '000', 1, 23) END"
    )


def _json_array(values: Sequence[Any]) -> str:
    return json.dumps(list(values))


class Queries:
    """Every statement the executor runs, for one schema (attached database) or none."""

    def __init__(self, schema: str | None) -> None:
        self.schema = schema
        self.prefix = f"{quote_ident(schema)}." if schema else ""

    # --- jobs -------------------------------------------------------------------------------

    def _insert_many(self, *, returning: bool) -> str:
        # ?1 is the whole batch: a JSON array with one array per job (see BATCH_FIELDS).
        tail = (
            f"DO UPDATE SET kind = j.kind\nRETURNING {JOB_COLUMNS}" if returning else "DO NOTHING"
        )
        return f"""
INSERT INTO {self.prefix}river_job AS j (
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
ON CONFLICT (unique_key) WHERE {_unique_index_predicate()}
{tail}"""

    @cached_property
    def job_insert_fast_many(self) -> str:
        return self._insert_many(returning=True)

    @cached_property
    def job_insert_fast_many_no_returning(self) -> str:
        return self._insert_many(returning=False)

    @cached_property
    def job_get_by_id(self) -> str:
        return f"SELECT {JOB_COLUMNS} FROM {self.prefix}river_job WHERE id = ?1"

    @cached_property
    def job_get_many(self) -> str:
        """?1 a JSON array of ids."""
        return (
            f"SELECT {JOB_COLUMNS} FROM {self.prefix}river_job "
            "WHERE id IN (SELECT b.value FROM json_each(?1) AS b)"
        )

    @cached_property
    def listing(self) -> ListDialect:
        """How a job list is written here (see ``_shared.job_list_statement``)."""
        return ListDialect(
            name="SQLite",
            head=f"SELECT {JOB_COLUMNS} FROM {self.prefix}river_job",
            placeholder="?",
            member="{column} IN (SELECT value FROM json_each(?))",
            state_type="text",
            array=_json_array,
            tags_all=(
                "NOT EXISTS (SELECT 1 FROM json_each(?) AS want WHERE NOT EXISTS "
                "(SELECT 1 FROM json_each(tags) AS have WHERE have.value = want.value))"
            ),
            tags_any=(
                "EXISTS (SELECT 1 FROM json_each(tags) AS have "
                "JOIN json_each(?) AS want ON have.value = want.value)"
            ),
            metadata_contains=None,
            bind_int=int,
            bind_time=format_sqlite_timestamp,
            time_column=sortable_time,
        )

    def job_count_by_queue_and_state(self, n_states: int) -> str:
        """One ``?`` per state."""
        marks = ", ".join("?" for _ in range(n_states))
        return (
            f"SELECT queue, state, count(*) FROM {self.prefix}river_job"
            f" WHERE state IN ({marks}) GROUP BY queue, state ORDER BY queue, state"
        )

    # --- the runtime's hot path ---------------------------------------------------------------

    def _claim(self, *, kinds: bool) -> tuple[str, str]:
        """A claim in two statements: the candidates' ids in claim order, read without the
        write lock (an idle poll writes nothing), then the update of those still due and
        available (another process may have taken some in between). One statement with the
        ids' subquery and its LIMIT cost SQLite about 100 µs more per claim.

        The read: ?1 queue, ?2 max_to_lock, ?3 now (?5 kinds, a JSON array). The update: ?1
        queue, ?2 the ids (a JSON array), ?3 now, ?4 max_attempted_by, ?5 kinds, ?6 client.
        attempted_by keeps its last (?4 - 1) entries once full, then gets the client appended;
        one that is not JSON is left as it is (the row reads back undecodable).
        """
        p = self.prefix
        kind_filter = "\n    AND kind IN (SELECT k.value FROM json_each(?5) AS k)" if kinds else ""
        due = f"queue = ?1\n    AND priority >= 0\n    AND scheduled_at <= ?3{kind_filter}"
        candidates = f"""
SELECT id
FROM {p}river_job
WHERE state = 'available'
    AND {due}
ORDER BY priority, scheduled_at, id
LIMIT ?2"""
        # +state: rowid lookups of the ids, not a walk of the state index
        update = f"""
UPDATE {p}river_job
SET state = 'running',
    attempt = attempt + 1,
    attempted_at = ?3,
    attempted_by = CASE WHEN NOT {_valid("attempted_by")} THEN attempted_by ELSE jsonb_insert(
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
    ) END
WHERE id IN (SELECT c.value FROM json_each(?2) AS c)
    AND +state = 'available'
    AND {due}
RETURNING {JOB_COLUMNS}"""
        return candidates, update

    @cached_property
    def job_get_available(self) -> tuple[str, str]:
        return self._claim(kinds=False)

    @cached_property
    def job_get_available_kinds(self) -> tuple[str, str]:
        return self._claim(kinds=True)

    # --- global queue limits (migration line river_anyio) -----------------------------------

    @cached_property
    def queue_limit_lock(self) -> str:
        """The queue's limiter row (created on first use) and its rate window; writes are
        serialised, so the claim's write transaction is the lock. ?1: the queue."""
        return f"""
INSERT INTO {self.prefix}river_anyio_queue_limit (queue) VALUES (?1)
ON CONFLICT (queue) DO UPDATE SET queue = excluded.queue
RETURNING starts"""

    @cached_property
    def queue_limit_running(self) -> str:
        """The queue's running jobs. ?1: the queue."""
        return f"SELECT count(*) FROM {self.prefix}river_job WHERE state = 'running' AND queue = ?1"

    @cached_property
    def queue_limit_save(self) -> str:
        """Store the rate window. ?1: its JSON text; ?2: the queue; ?3: now."""
        return (
            f"UPDATE {self.prefix}river_anyio_queue_limit "
            "SET starts = ?1, updated_at = ?3 WHERE queue = ?2"
        )

    @cached_property
    def job_complete_if_running(self) -> str:
        # ?1: the batch, a JSON array with one array per completion (see COMPLETION_FIELDS);
        # ?2: now; ?3: the client id. Only rows whose attempt guard holds are updated; the
        # join is driven by the batch (+state keeps the planner off the state index: rowid
        # lookups). cancel: a retry or snooze of a job whose cancellation was requested ends
        # it instead. A JSON column changed out of band to text that is not JSON is left as
        # it is (metadata without cancel_attempted_at, attempted_by not checked), except
        # errors, wrapped in an array (as a string when not JSON) to append the new error.
        cancel = (
            "(c.state IN ('available', 'retryable', 'scheduled') "
            f"AND (CASE WHEN {_valid('j.metadata')} "
            "THEN j.metadata -> 'cancel_attempted_at' END) IS NOT NULL)"
        )
        return f"""
UPDATE {self.prefix}river_job AS j
SET state = CASE WHEN {cancel} THEN 'cancelled' ELSE c.state END,
    attempt = CASE WHEN {cancel} THEN j.attempt ELSE coalesce(c.attempt_new, j.attempt) END,
    errors = {_APPEND_ERROR.format(error="c.error")},
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
        WHEN c.updates IS NULL OR NOT {_valid("j.metadata")} THEN j.metadata
        ELSE {METADATA_MERGE.format(doc="j.metadata", patch="c.updates")}
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
    AND CASE
        WHEN {_valid("j.attempted_by")} THEN j.attempted_by ->> '$[#-1]' = ?3
        ELSE 1
    END
RETURNING {JOB_COLUMNS}"""

    @cached_property
    def job_merge_metadata(self) -> str:
        """?1: a JSON array of [id, updates] pairs."""
        return f"""
UPDATE {self.prefix}river_job AS j
SET metadata = CASE
    WHEN {_valid("j.metadata")} THEN {METADATA_MERGE.format(doc="j.metadata", patch="c.updates")}
    ELSE j.metadata
END
FROM (SELECT b.value ->> 0 AS id, b.value ->> 1 AS updates FROM json_each(?1) AS b) AS c
WHERE j.id = c.id
RETURNING {JOB_COLUMNS}"""

    @cached_property
    def job_cancel(self) -> str:
        """?1 id, ?2 cancel_attempted_at, ?3 now. A running job is only flagged: its client
        stops it (told by the notification)."""
        return f"""
UPDATE {self.prefix}river_job
SET state = CASE WHEN state = 'running' THEN state ELSE 'cancelled' END,
    finalized_at = CASE WHEN state = 'running' THEN finalized_at ELSE ?3 END,
    metadata = jsonb_set(metadata, '$.cancel_attempted_at', ?2)
WHERE id = ?1
    AND state NOT IN {FINAL_STATES}
    AND finalized_at IS NULL
RETURNING {JOB_COLUMNS}"""

    # --- queues -----------------------------------------------------------------------------

    @cached_property
    def queue_create_or_set_updated_at(self) -> str:
        return f"""
INSERT INTO {self.prefix}river_queue (name, created_at, metadata, paused_at, updated_at)
VALUES (?1, ?3, jsonb(?2), NULL, ?3)
ON CONFLICT (name) DO UPDATE SET updated_at = excluded.updated_at
RETURNING {QUEUE_COLUMNS}"""

    @cached_property
    def queue_get(self) -> str:
        return f"SELECT {QUEUE_COLUMNS} FROM {self.prefix}river_queue WHERE name = ?1"

    @cached_property
    def queue_list(self) -> str:
        return f"SELECT {QUEUE_COLUMNS} FROM {self.prefix}river_queue ORDER BY name LIMIT ?1"

    # Both match every row of the name (or all for '*'); only a change moves updated_at.

    @cached_property
    def queue_pause(self) -> str:
        return f"""
UPDATE {self.prefix}river_queue
SET paused_at = coalesce(paused_at, ?2),
    updated_at = CASE WHEN paused_at IS NULL THEN ?2 ELSE updated_at END
WHERE ?1 = '*' OR name = ?1"""

    @cached_property
    def queue_resume(self) -> str:
        return f"""
UPDATE {self.prefix}river_queue
SET paused_at = NULL,
    updated_at = CASE WHEN paused_at IS NULL THEN updated_at ELSE ?2 END
WHERE ?1 = '*' OR name = ?1"""

    # --- notifications and generic access ---------------------------------------------------

    @cached_property
    def notify_one(self) -> str:
        return f"INSERT INTO {self.prefix}river_notification (topic, payload) VALUES (?1, ?2)"

    @cached_property
    def notify_many(self) -> str:
        """?1 the topic, ?2 a JSON array of payloads."""
        return (
            f"INSERT INTO {self.prefix}river_notification (topic, payload) "
            "SELECT ?1, p.value FROM json_each(?2) AS p"
        )

    @cached_property
    def notification_last_id(self) -> str:
        return f"SELECT coalesce(max(id), 0) FROM {self.prefix}river_notification"

    @cached_property
    def notification_after(self) -> str:
        """?1 the last id seen, ?2 a JSON array of topics, ?3 the limit."""
        return (
            f"SELECT id, topic, payload FROM {self.prefix}river_notification "
            "WHERE id > ?1 AND topic IN (SELECT t.value FROM json_each(?2) AS t) "
            "ORDER BY id LIMIT ?3"
        )

    @cached_property
    def table_exists(self) -> str:
        return f"SELECT count(*) FROM {self.prefix}sqlite_master WHERE type = 'table' AND name = ?1"

    column_exists = "SELECT count(*) FROM pragma_table_info(?1, ?2) WHERE name = ?3"

    # --- client job and queue APIs (River's JobRetry/JobDelete/JobUpdate/QueueUpdate) -------

    @cached_property
    def job_retry(self) -> str:
        """?1 the id, ?2 now. Matches nothing for a running job or an available one already
        due."""
        return f"""
UPDATE {self.prefix}river_job
SET state = 'available',
    max_attempts = CASE WHEN attempt = max_attempts THEN max_attempts + 1 ELSE max_attempts END,
    finalized_at = NULL,
    metadata = jsonb_remove(metadata, '$.cancel_attempted_at'),
    scheduled_at = ?2
WHERE id = ?1
    AND state <> 'running'
    AND NOT (state = 'available' AND {sortable_time("scheduled_at")} < ?2)
RETURNING {JOB_COLUMNS}"""

    @cached_property
    def job_delete(self) -> str:
        """?1 the id. Matches nothing for a running job."""
        return f"""
DELETE FROM {self.prefix}river_job
WHERE id = ?1 AND state <> 'running'
RETURNING {JOB_COLUMNS}"""

    def job_delete_many(self, where: str) -> str:
        """``where`` is a list's filter text (``_shared.list_where``; its parameters come
        first), then the limit."""
        p = self.prefix
        return f"""
DELETE FROM {p}river_job
WHERE id IN (
    SELECT id
    FROM {p}river_job
    WHERE {where} AND state <> 'running'
    ORDER BY id
    LIMIT ?
)
RETURNING {JOB_COLUMNS}"""

    @cached_property
    def job_update_metadata(self) -> str:
        """?1 the id, ?2 the updates (JSON text), merged as completions merge."""
        return f"""
UPDATE {self.prefix}river_job
SET metadata = {METADATA_MERGE.format(doc="metadata", patch="?2")}
WHERE id = ?1
RETURNING {JOB_COLUMNS}"""

    @cached_property
    def queue_update(self) -> str:
        """?1 the name, ?2 the new metadata (NULL keeps it), ?3 now."""
        return f"""
UPDATE {self.prefix}river_queue
SET metadata = CASE WHEN ?2 IS NULL THEN metadata ELSE jsonb(?2) END,
    updated_at = ?3
WHERE name = ?1
RETURNING {QUEUE_COLUMNS}"""

    # --- leadership and maintenance ---------------------------------------------------------

    @cached_property
    def leader_delete_expired(self) -> str:
        """?1 now (NULL: the database's)."""
        return f"DELETE FROM {self.prefix}river_leader WHERE expires_at < coalesce(?1, {_DB_NOW})"

    @cached_property
    def leader_attempt_elect(self) -> str:
        """?1 leader id, ?2 ttl modifier ('+15.000 seconds'), ?3 now."""
        return f"""
INSERT INTO {self.prefix}river_leader (leader_id, elected_at, expires_at)
SELECT ?1, t.now, datetime(t.now, 'subsec', ?2)
FROM (SELECT coalesce(?3, {_DB_NOW}) AS now) AS t
WHERE true
ON CONFLICT (name) DO NOTHING
RETURNING {_LEADER_COLUMNS}"""

    @cached_property
    def leader_attempt_reelect(self) -> str:
        """?1 leader id, ?2 ttl modifier, ?3 now, ?4 elected_at."""
        return f"""
UPDATE {self.prefix}river_leader
SET expires_at = datetime(coalesce(?3, {_DB_NOW}), 'subsec', ?2)
WHERE unixepoch(elected_at, 'subsec') = unixepoch(?4, 'subsec')
    AND expires_at >= coalesce(?3, {_DB_NOW})
    AND leader_id = ?1
RETURNING {_LEADER_COLUMNS}"""

    @cached_property
    def leader_resign(self) -> str:
        """?1 leader id, ?2 elected_at."""
        return f"""
DELETE FROM {self.prefix}river_leader
WHERE unixepoch(elected_at, 'subsec') = unixepoch(?2, 'subsec') AND leader_id = ?1"""

    @cached_property
    def leader_get_elected(self) -> str:
        return f"SELECT {_LEADER_COLUMNS} FROM {self.prefix}river_leader"

    # --- named leases (line river_anyio) ---------------------------------------------------

    @cached_property
    def lease_take(self) -> str:
        """?1 name, ?2 holder, ?3 ttl modifier. An insert that overwrites only an expired row
        (the table is ours alone, so its timestamps compare as text)."""
        return f"""
INSERT INTO {self.prefix}river_anyio_lease AS l (name, holder, taken_at, expires_at)
SELECT ?1, ?2, t.now, datetime(t.now, 'subsec', ?3)
FROM (SELECT {_DB_NOW} AS now) AS t
WHERE true
ON CONFLICT (name) DO UPDATE
SET holder = excluded.holder, taken_at = excluded.taken_at, expires_at = excluded.expires_at
WHERE l.expires_at <= excluded.taken_at
RETURNING {_LEASE_COLUMNS}"""

    @cached_property
    def lease_renew(self) -> str:
        """?1 name, ?2 holder, ?3 taken_at, ?4 ttl modifier."""
        return f"""
UPDATE {self.prefix}river_anyio_lease
SET expires_at = datetime({_DB_NOW}, 'subsec', ?4)
WHERE name = ?1
    AND holder = ?2
    AND unixepoch(taken_at, 'subsec') = unixepoch(?3, 'subsec')
    AND expires_at > {_DB_NOW}
RETURNING {_LEASE_COLUMNS}"""

    @cached_property
    def lease_release(self) -> str:
        """?1 name, ?2 holder, ?3 taken_at."""
        return f"""
DELETE FROM {self.prefix}river_anyio_lease
WHERE name = ?1 AND holder = ?2 AND unixepoch(taken_at, 'subsec') = unixepoch(?3, 'subsec')"""

    @cached_property
    def schedule_eligible(self) -> str:
        """?1 horizon, ?2 limit."""
        return f"""
SELECT id, unique_key IS NOT NULL AND unique_states IS NOT NULL
FROM {self.prefix}river_job
WHERE state IN ('retryable', 'scheduled')
    AND priority >= 0
    AND scheduled_at <= ?1
ORDER BY priority, scheduled_at, id
LIMIT ?2"""

    @cached_property
    def schedule_collision(self) -> str:
        """?1 id: does another row hold this row's unique key in one of its unique states?"""
        p = self.prefix
        return f"""
SELECT EXISTS (
    SELECT 1
    FROM {p}river_job AS me
    JOIN {p}river_job AS other ON other.unique_key = me.unique_key AND other.id <> me.id
    WHERE me.id = ?1 AND {_unique_index_predicate("other")}
)"""

    @cached_property
    def schedule_set_available(self) -> str:
        """?1 JSON array of ids."""
        return (
            f"UPDATE {self.prefix}river_job SET state = 'available' "
            "WHERE id IN (SELECT value FROM json_each(?1))"
        )

    @cached_property
    def schedule_set_discarded(self) -> str:
        """?1 JSON array of ids, ?2 now."""
        return f"""
UPDATE {self.prefix}river_job
SET state = 'discarded',
    finalized_at = ?2,
    metadata = CASE
        WHEN {_valid("metadata")}
        THEN jsonb_set(metadata, '$.unique_key_conflict', 'scheduler_discarded')
        ELSE metadata
    END
WHERE id IN (SELECT value FROM json_each(?1))"""

    @cached_property
    def job_get_cancel_requested(self) -> str:
        """?1 the ids (a JSON array)."""
        return f"""
SELECT id FROM {self.prefix}river_job
WHERE id IN (SELECT value FROM json_each(?1))
    AND state = 'running'
    AND (metadata -> 'cancel_attempted_at') IS NOT NULL
ORDER BY id"""

    @cached_property
    def job_get_stuck(self) -> str:
        """?1 stuck horizon, ?2 after id, ?3 limit."""
        return f"""
SELECT {JOB_COLUMNS}
FROM {self.prefix}river_job
WHERE state = 'running' AND id > ?2 AND attempted_at < ?1
ORDER BY id
LIMIT ?3"""

    @cached_property
    def job_rescue(self) -> str:
        """?1 id, ?2 error (JSON text), ?3 finalized_at, ?4 scheduled_at, ?5 state, ?6
        horizon."""
        return f"""
UPDATE {self.prefix}river_job
SET errors = {_APPEND_ERROR.format(error="?2").replace("j.errors", "errors")},
    finalized_at = ?3,
    scheduled_at = ?4,
    state = ?5,
    metadata = CASE WHEN NOT {_valid("metadata")} THEN metadata ELSE jsonb_set(
        metadata,
        '$."river:rescue_count"',
        coalesce(
            CASE json_type(metadata, '$."river:rescue_count"')
                WHEN 'integer' THEN metadata ->> '$."river:rescue_count"'
                WHEN 'real' THEN cast(metadata ->> '$."river:rescue_count"' AS integer)
            END,
            0
        ) + 1
    ) END
WHERE id = ?1 AND state = 'running' AND attempted_at < ?6"""

    @cached_property
    def job_rescue_returning(self) -> str:
        return f"{self.job_rescue}\nRETURNING {JOB_COLUMNS}"

    @cached_property
    def job_delete_before(self) -> str:
        """?1 cancelled, ?2 completed, ?3 discarded horizons (NULL: keep), ?4 limit."""
        p = self.prefix
        return f"""
DELETE FROM {p}river_job
WHERE id IN (
    SELECT id
    FROM {p}river_job
    WHERE (state = 'cancelled' AND finalized_at < ?1)
        OR (state = 'completed' AND finalized_at < ?2)
        OR (state = 'discarded' AND finalized_at < ?3)
    ORDER BY id
    LIMIT ?4
)"""

    @cached_property
    def queue_delete_expired(self) -> str:
        """?1 horizon, ?2 limit."""
        p = self.prefix
        return f"""
DELETE FROM {p}river_queue
WHERE name IN (
    SELECT name FROM {p}river_queue WHERE updated_at < ?1 ORDER BY name LIMIT ?2
)
RETURNING name"""

    @cached_property
    def notification_delete_before(self) -> str:
        """?1 horizon, ?2 limit."""
        p = self.prefix
        return f"""
DELETE FROM {p}river_notification
WHERE id IN (
    SELECT id FROM {p}river_notification
    WHERE created_at < ?1
    ORDER BY created_at, id
    LIMIT ?2
)"""

    @cached_property
    def index_exists(self) -> str:
        return f"SELECT count(*) FROM {self.prefix}sqlite_master WHERE type = 'index' AND name = ?1"

    def index_reindex(self, name: str) -> str:
        return f"REINDEX {self.prefix}{quote_ident(name)}"

    def index_drop_if_exists(self, name: str) -> str:
        return f"DROP INDEX IF EXISTS {self.prefix}{quote_ident(name)}"

    @cached_property
    def job_give_back_lost_claims(self) -> str:
        """Rows a claim of this client left ``running`` without the client knowing (see
        ``Executor.job_give_back_lost_claims``), made ``available`` again (``cancelled`` when a
        cancellation was requested meanwhile). ?1 queue, ?2 client id, ?3 claimed after ('' for
        no bound), ?4 the window's start, ?5 ids to leave (a JSON array), ?6 now."""
        attempted = sortable_time("attempted_at")
        cancel = (
            f"(CASE WHEN {_valid('metadata')} THEN metadata -> 'cancel_attempted_at' END) "
            "IS NOT NULL"
        )
        return f"""
UPDATE {self.prefix}river_job
SET state = CASE WHEN {cancel} THEN 'cancelled' ELSE 'available' END,
    attempt = CASE WHEN {cancel} THEN attempt ELSE max(attempt - 1, 0) END,
    finalized_at = CASE WHEN {cancel} THEN ?6 ELSE NULL END
WHERE state = 'running'
    AND queue = ?1
    AND (CASE WHEN {_valid("attempted_by")} THEN attempted_by ->> '$[#-1]' END) = ?2
    AND {attempted} > ?3
    AND {attempted} >= ?4
    AND id NOT IN (SELECT value FROM json_each(?5))
RETURNING {JOB_COLUMNS}"""
