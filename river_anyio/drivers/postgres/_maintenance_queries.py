"""SQL text for leader election and the leader's maintenance services (PostgreSQL).

Parameters are named (``%(name)s``). ``now`` parameters of NULL mean the database's ``now()``,
as River's queries do unless a test time is set.
"""

from __future__ import annotations

import functools

import attrs

from ._queries import JOB_COLUMNS, _channel, quote_ident

__all__ = ["MaintenanceQueries", "maintenance_queries"]

_LEADER_COLUMNS = "leader_id, elected_at, expires_at"
_NOW = "coalesce(%(now)s::timestamptz, now())"


@attrs.frozen
class MaintenanceQueries:
    leader_delete_expired: str
    leader_attempt_elect: str
    leader_attempt_reelect: str
    leader_resign: str
    leader_get_elected: str
    job_schedule: str
    job_get_stuck: str
    job_rescue_many: str
    job_delete_before: str
    queue_delete_expired: str
    notification_delete_before: str
    index_exists: str
    index_reindex_artifacts: str


@functools.cache
def maintenance_queries(schema: str | None) -> MaintenanceQueries:
    """The statements for ``schema`` (None: unqualified names, ``search_path`` decides)."""
    p = quote_ident(schema) + "." if schema else ""
    cols = ", ".join("j." + c for c in JOB_COLUMNS)
    leadership = _channel(schema, "river_leadership")
    namespace = "%(schema)s::text" if schema else "current_schema()"
    return MaintenanceQueries(
        leader_delete_expired=f"DELETE FROM {p}river_leader WHERE expires_at < {_NOW}",
        leader_attempt_elect=f"""
INSERT INTO {p}river_leader (leader_id, elected_at, expires_at)
SELECT %(leader_id)s::text, t.now, t.now + make_interval(secs => %(ttl)s::double precision)
FROM (SELECT {_NOW} AS now) AS t
ON CONFLICT (name) DO NOTHING
RETURNING {_LEADER_COLUMNS}""",
        leader_attempt_reelect=f"""
UPDATE {p}river_leader AS l
SET expires_at = t.now + make_interval(secs => %(ttl)s::double precision)
FROM (SELECT {_NOW} AS now) AS t
WHERE l.elected_at = %(elected_at)s::timestamptz
    AND l.expires_at >= t.now
    AND l.leader_id = %(leader_id)s::text
RETURNING l.leader_id, l.elected_at, l.expires_at""",
        # The row is deleted and followers told, in one statement (as River).
        leader_resign=f"""
WITH resigned AS (
    DELETE FROM {p}river_leader
    WHERE elected_at = %(elected_at)s::timestamptz AND leader_id = %(leader_id)s::text
    RETURNING leader_id
)
SELECT count(pg_notify(
    {leadership}, json_build_object('leader_id', leader_id, 'action', 'resigned')::text
))
FROM resigned""",
        leader_get_elected=f"SELECT {_LEADER_COLUMNS} FROM {p}river_leader",
        job_schedule=_job_schedule(p),
        job_get_stuck=f"""
SELECT {cols}
FROM {p}river_job AS j
WHERE j.state = 'running'
    AND j.id > %(after_id)s
    AND j.attempted_at < %(stuck_horizon)s::timestamptz
ORDER BY j.id
LIMIT %(limit)s""",
        job_rescue_many=f"""
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
    AND j.state = 'running'
    AND j.attempted_at < %(stuck_horizon)s::timestamptz""",
        job_delete_before=f"""
DELETE FROM {p}river_job
WHERE id IN (
    SELECT id
    FROM {p}river_job
    WHERE (state = 'cancelled' AND finalized_at < %(cancelled)s::timestamptz)
        OR (state = 'completed' AND finalized_at < %(completed)s::timestamptz)
        OR (state = 'discarded' AND finalized_at < %(discarded)s::timestamptz)
    ORDER BY id
    LIMIT %(limit)s
)""",
        queue_delete_expired=f"""
DELETE FROM {p}river_queue
WHERE name IN (
    SELECT name FROM {p}river_queue
    WHERE updated_at < %(horizon)s::timestamptz
    ORDER BY name
    LIMIT %(limit)s
)
RETURNING name""",
        notification_delete_before=f"""
DELETE FROM {p}river_notification
WHERE id IN (
    SELECT id FROM {p}river_notification
    WHERE created_at < %(horizon)s::timestamptz
    ORDER BY created_at, id
    LIMIT %(limit)s
)""",
        index_exists=f"""
SELECT EXISTS (
    SELECT 1
    FROM pg_catalog.pg_class AS c
    JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.relname = %(name)s::text AND c.relkind = 'i' AND n.nspname = {namespace}
)""",
        # What REINDEX CONCURRENTLY leaves behind when interrupted: <name>_ccnew[N], _ccold[N].
        index_reindex_artifacts=f"""
SELECT c.relname::text
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.relkind = 'i'
    AND n.nspname = {namespace}
    AND left(c.relname, length(%(name)s::text)) = %(name)s::text
    AND substring(c.relname FROM length(%(name)s::text) + 1) ~ '^_cc(new|old)[0-9]*$'
ORDER BY 1""",
    )


def _job_schedule(p: str) -> str:
    """River's JobSchedule in one statement. Parameters: horizon, limit, now.

    Eligible rows are locked in fetch order. A unique row (key and states set) is discarded
    when another row holds its key in a state of that row's own unique states, or when an
    earlier eligible row shares its key; every other row becomes available.
    """
    cols = ", ".join("j." + c for c in JOB_COLUMNS)
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
    WHERE j.id = d.id
    RETURNING {cols}, d.discard
)
SELECT * FROM moved ORDER BY priority, scheduled_at, id"""
