"""SQL text for the PostgreSQL executor, built once per schema.

Every reference to a River table, type or function carries the schema prefix (``"schema".``
when one is configured, nothing otherwise so ``search_path`` decides). Column lists are always
explicit: a prepared ``SELECT *`` breaks when another connection alters the table.
"""

from __future__ import annotations

import attrs
from psycopg import sql

__all__ = ["JOB_COLUMNS", "Queries", "quote_ident"]

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
        return cls(
            schema=schema,
            prefix=p,
            job_insert_fast_many=insert_fast_many,
            job_copy=f"COPY {p}river_job (%s) FROM STDIN",
            job_get_by_id=f"SELECT {cols} FROM {p}river_job WHERE id = %s",
            job_list_head=f"SELECT {cols} FROM {p}river_job",
            notify_many=(
                "SELECT pg_notify(%s, payload) FROM unnest(%s::text[]) AS n(payload)"
                if schema
                else "SELECT pg_notify(concat(current_schema(), '.', %s::text), payload) "
                "FROM unnest(%s::text[]) AS n(payload)"
            ),
        )

    def state_cast(self) -> str:
        return f"{self.prefix}river_job_state"

    def qualified(self, table: str) -> str:
        """``table`` qualified with the schema (for ``to_regclass``)."""
        return self.prefix + quote_ident(table)
