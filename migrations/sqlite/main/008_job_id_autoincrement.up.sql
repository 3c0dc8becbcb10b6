-- Make river_job.id AUTOINCREMENT. A plain INTEGER PRIMARY KEY may hand out the
-- id of the most recently deleted highest row again; AUTOINCREMENT never does,
-- matching Postgres sequences.

-- Refuse to run while River Pro objects exist: they hang off river_job and a
-- rebuild would silently discard them. SQLite's RAISE() only works inside a
-- trigger, hence the temporary table and trigger, which are removed again.
CREATE TEMP TABLE river_migration_008_check (probe integer);

CREATE TEMP TRIGGER river_migration_008_check_pro
BEFORE INSERT ON river_migration_008_check
WHEN EXISTS (
    SELECT 1
    FROM /*river:schema*/sqlite_master
    WHERE name IN ('river_job_sequence', 'river_job_workflow_scheduling', 'river_workflow')
)
BEGIN
    SELECT RAISE(ABORT, 'River SQLite migration 008 cannot run while River Pro schema objects are installed');
END;

INSERT INTO river_migration_008_check (probe) VALUES (1);

DROP TRIGGER river_migration_008_check_pro;
DROP TABLE river_migration_008_check;

-- The rebuild also restores the usual column order (max_attempts after kind).
-- The old table keeps its indexes through the rename and loses them when it is
-- dropped, which frees the index names for the new table.
ALTER TABLE /*river:schema*/river_job RENAME TO river_job_old;

CREATE TABLE /*river:schema*/river_job (
    id            integer PRIMARY KEY AUTOINCREMENT,
    args          blob NOT NULL DEFAULT (jsonb('{}')),
    attempt       integer NOT NULL DEFAULT 0,
    attempted_at  timestamp,
    attempted_by  blob,
    created_at    timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
    errors        blob,
    finalized_at  timestamp,
    kind          text NOT NULL,
    max_attempts  integer NOT NULL DEFAULT 25,
    metadata      blob NOT NULL DEFAULT (jsonb('{}')),
    priority      integer NOT NULL DEFAULT 1,
    queue         text NOT NULL DEFAULT 'default',
    state         text NOT NULL DEFAULT 'available',
    scheduled_at  timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
    tags          blob NOT NULL DEFAULT (jsonb('[]')),
    unique_key    blob,
    unique_states integer,
    CONSTRAINT finalized_or_finalized_at_null CHECK (
        (finalized_at IS NULL AND state NOT IN ('cancelled', 'completed', 'discarded'))
        OR (finalized_at IS NOT NULL AND state IN ('cancelled', 'completed', 'discarded'))
    ),
    CONSTRAINT priority_in_range CHECK (priority >= 1 AND priority <= 4),
    CONSTRAINT queue_length CHECK (length(queue) > 0 AND length(queue) < 128),
    CONSTRAINT kind_length CHECK (length(kind) > 0 AND length(kind) < 128),
    CONSTRAINT state_valid CHECK (
        state IN ('available', 'cancelled', 'completed', 'discarded', 'pending', 'retryable', 'running', 'scheduled')
    )
);

INSERT INTO /*river:schema*/river_job (
    id,
    args,
    attempt,
    attempted_at,
    attempted_by,
    created_at,
    errors,
    finalized_at,
    kind,
    max_attempts,
    metadata,
    priority,
    queue,
    state,
    scheduled_at,
    tags,
    unique_key,
    unique_states
)
SELECT
    old.id,
    old.args,
    old.attempt,
    old.attempted_at,
    old.attempted_by,
    old.created_at,
    old.errors,
    old.finalized_at,
    old.kind,
    old.max_attempts,
    old.metadata,
    old.priority,
    old.queue,
    old.state,
    old.scheduled_at,
    old.tags,
    old.unique_key,
    old.unique_states
FROM /*river:schema*/river_job_old AS old;

DROP TABLE /*river:schema*/river_job_old;

CREATE INDEX /*river:schema*/river_job_kind ON river_job (kind);
CREATE INDEX /*river:schema*/river_job_state_and_finalized_at_index ON river_job (state, finalized_at)
    WHERE finalized_at IS NOT NULL;
CREATE INDEX /*river:schema*/river_job_prioritized_fetching_index ON river_job (state, queue, priority, scheduled_at, id);

-- SQLite has no SQL functions, so the state-to-bit test that Postgres keeps in
-- river_job_state_in_bitmask is written out here. Bit n (value 1 << n) stands
-- for the n-th state in alphabetical order. Inserts name this exact predicate
-- in their ON CONFLICT clause, so it must not be reworded.
CREATE UNIQUE INDEX /*river:schema*/river_job_unique_idx ON river_job (unique_key)
    WHERE unique_key IS NOT NULL
      AND unique_states IS NOT NULL
      AND CASE state
              WHEN 'available' THEN unique_states & (1 << 0)
              WHEN 'cancelled' THEN unique_states & (1 << 1)
              WHEN 'completed' THEN unique_states & (1 << 2)
              WHEN 'discarded' THEN unique_states & (1 << 3)
              WHEN 'pending' THEN unique_states & (1 << 4)
              WHEN 'retryable' THEN unique_states & (1 << 5)
              WHEN 'running' THEN unique_states & (1 << 6)
              WHEN 'scheduled' THEN unique_states & (1 << 7)
              ELSE 0
          END >= 1;
