"""SQL text for leader election and the leader's maintenance services (SQLite).

Timestamps are text compared as text (River's SQLite convention); a NULL ``now`` means the
database's ``datetime('now', 'subsec')``. Lease terms are matched with ``unixepoch(…,
'subsec')`` so a term written by River Go in another text format still matches.
"""

from __future__ import annotations

import functools

import attrs

from ._queries import _UNIQUE_INDEX_PREDICATE, JOB_COLUMNS

__all__ = ["MaintenanceQueries", "maintenance_queries"]

_LEADER_COLUMNS = "leader_id, elected_at, expires_at"
_DB_NOW = "datetime('now', 'subsec')"


@attrs.frozen
class MaintenanceQueries:
    leader_delete_expired: str
    leader_attempt_elect: str
    leader_attempt_reelect: str
    leader_resign: str
    leader_get_elected: str
    schedule_eligible: str
    schedule_collision: str
    schedule_set_available: str
    schedule_set_discarded: str
    job_get_many: str
    job_get_stuck: str
    job_rescue: str
    job_delete_before: str
    queue_delete_expired: str
    notification_delete_before: str
    notify_one: str
    index_exists: str


@functools.cache
def maintenance_queries(prefix: str) -> MaintenanceQueries:
    """The statements for a schema prefix (``"name".`` of an attached database, or "")."""
    p = prefix
    # the partial unique index's predicate, on the row aliased `other`
    held = _UNIQUE_INDEX_PREDICATE.replace("unique_", "other.unique_").replace(
        "CASE state", "CASE other.state"
    )
    return MaintenanceQueries(
        # ?1 now (NULL: the database's)
        leader_delete_expired=(
            f"DELETE FROM {p}river_leader WHERE expires_at < coalesce(?1, {_DB_NOW})"
        ),
        # ?1 leader id, ?2 ttl modifier ('+15.000 seconds'), ?3 now
        leader_attempt_elect=f"""
INSERT INTO {p}river_leader (leader_id, elected_at, expires_at)
SELECT ?1, t.now, datetime(t.now, 'subsec', ?2)
FROM (SELECT coalesce(?3, {_DB_NOW}) AS now) AS t
WHERE true
ON CONFLICT (name) DO NOTHING
RETURNING {_LEADER_COLUMNS}""",
        # ?1 leader id, ?2 ttl modifier, ?3 now, ?4 elected_at
        leader_attempt_reelect=f"""
UPDATE {p}river_leader
SET expires_at = datetime(coalesce(?3, {_DB_NOW}), 'subsec', ?2)
WHERE unixepoch(elected_at, 'subsec') = unixepoch(?4, 'subsec')
    AND expires_at >= coalesce(?3, {_DB_NOW})
    AND leader_id = ?1
RETURNING {_LEADER_COLUMNS}""",
        # ?1 leader id, ?2 elected_at
        leader_resign=f"""
DELETE FROM {p}river_leader
WHERE unixepoch(elected_at, 'subsec') = unixepoch(?2, 'subsec') AND leader_id = ?1""",
        leader_get_elected=f"SELECT {_LEADER_COLUMNS} FROM {p}river_leader",
        # ?1 horizon, ?2 limit
        schedule_eligible=f"""
SELECT id, unique_key IS NOT NULL AND unique_states IS NOT NULL
FROM {p}river_job
WHERE state IN ('retryable', 'scheduled')
    AND priority >= 0
    AND scheduled_at <= ?1
ORDER BY priority, scheduled_at, id
LIMIT ?2""",
        # ?1 id: does another row hold this row's unique key in one of its unique states?
        schedule_collision=f"""
SELECT EXISTS (
    SELECT 1
    FROM {p}river_job AS me
    JOIN {p}river_job AS other ON other.unique_key = me.unique_key AND other.id <> me.id
    WHERE me.id = ?1 AND {held}
)""",
        # ?1 JSON array of ids
        schedule_set_available=(
            f"UPDATE {p}river_job SET state = 'available' "
            "WHERE id IN (SELECT value FROM json_each(?1))"
        ),
        # ?1 JSON array of ids, ?2 now
        schedule_set_discarded=f"""
UPDATE {p}river_job
SET state = 'discarded',
    finalized_at = ?2,
    metadata = jsonb_set(metadata, '$.unique_key_conflict', 'scheduler_discarded')
WHERE id IN (SELECT value FROM json_each(?1))""",
        job_get_many=(
            f"SELECT {JOB_COLUMNS} FROM {p}river_job WHERE id IN (SELECT value FROM json_each(?1))"
        ),
        # ?1 stuck horizon, ?2 after id, ?3 limit
        job_get_stuck=f"""
SELECT {JOB_COLUMNS}
FROM {p}river_job
WHERE state = 'running' AND id > ?2 AND attempted_at < ?1
ORDER BY id
LIMIT ?3""",
        # ?1 id, ?2 error (JSON text), ?3 finalized_at, ?4 scheduled_at, ?5 state, ?6 horizon
        job_rescue=f"""
UPDATE {p}river_job
SET errors = jsonb_insert(coalesce(errors, jsonb('[]')), '$[#]', jsonb(?2)),
    finalized_at = ?3,
    scheduled_at = ?4,
    state = ?5,
    metadata = jsonb_set(
        metadata,
        '$."river:rescue_count"',
        coalesce(
            CASE json_type(metadata, '$."river:rescue_count"')
                WHEN 'integer' THEN metadata ->> '$."river:rescue_count"'
                WHEN 'real' THEN cast(metadata ->> '$."river:rescue_count"' AS integer)
            END,
            0
        ) + 1
    )
WHERE id = ?1 AND state = 'running' AND attempted_at < ?6""",
        # ?1 cancelled, ?2 completed, ?3 discarded horizons (NULL: keep), ?4 limit
        job_delete_before=f"""
DELETE FROM {p}river_job
WHERE id IN (
    SELECT id
    FROM {p}river_job
    WHERE (state = 'cancelled' AND finalized_at < ?1)
        OR (state = 'completed' AND finalized_at < ?2)
        OR (state = 'discarded' AND finalized_at < ?3)
    ORDER BY id
    LIMIT ?4
)""",
        # ?1 horizon, ?2 limit
        queue_delete_expired=f"""
DELETE FROM {p}river_queue
WHERE name IN (
    SELECT name FROM {p}river_queue WHERE updated_at < ?1 ORDER BY name LIMIT ?2
)
RETURNING name""",
        notification_delete_before=f"""
DELETE FROM {p}river_notification
WHERE id IN (
    SELECT id FROM {p}river_notification
    WHERE created_at < ?1
    ORDER BY created_at, id
    LIMIT ?2
)""",
        notify_one=f"INSERT INTO {p}river_notification (topic, payload) VALUES (?1, ?2)",
        index_exists=f"SELECT count(*) FROM {p}sqlite_master WHERE type = 'index' AND name = ?1",
    )
