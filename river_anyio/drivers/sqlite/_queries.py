"""SQL text for River's SQLite schema, built once per schema prefix.

Conventions of River's SQLite tables: JSON columns are JSONB blobs (read them through ``json()``,
write them through ``jsonb()``), ``unique_states`` is an integer bitmask and timestamps are text.
"""

from __future__ import annotations

from typing import Final

import attrs

from ._connection import quote_ident

__all__ = ["JOB_COLUMNS", "Queries"]

#: Columns read for a JobRow, in the order ``_executor.job_rows`` expects.
JOB_COLUMNS: Final = (
    "id, json(args), attempt, attempted_at, json(attempted_by), created_at, json(errors), "
    "finalized_at, kind, max_attempts, json(metadata), priority, queue, scheduled_at, state, "
    "json(tags), unique_key, unique_states"
)

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
        )
