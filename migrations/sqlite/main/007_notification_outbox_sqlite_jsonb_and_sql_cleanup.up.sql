-- Notification outbox: SQLite has no LISTEN/NOTIFY, so notifications are rows
-- that listeners poll for by increasing id. AUTOINCREMENT keeps ids from being
-- reused after deletes.
CREATE TABLE /*river:schema*/river_notification (
    id         integer PRIMARY KEY AUTOINCREMENT,
    created_at timestamp NOT NULL DEFAULT (datetime('now', 'subsec')),
    payload    text NOT NULL,
    topic      text NOT NULL,
    CONSTRAINT topic_length CHECK (length(topic) > 0 AND length(topic) < 128)
);

CREATE INDEX /*river:schema*/river_notification_created_at_idx ON river_notification (created_at);
CREATE INDEX /*river:schema*/river_notification_topic_id_idx ON river_notification (topic, id);

-- Cleanup: the client registry tables were never used.
DROP TABLE /*river:schema*/river_client_queue;
DROP TABLE /*river:schema*/river_client;

-- Switch JSON columns from text to JSONB. SQLite cannot change a column's
-- default in place, so river_job is rebuilt. The same rebuild gives
-- max_attempts its default of 25; it is the last column from here on (the
-- layout an in-place add of that column would produce).
-- The old table keeps its indexes through the rename and loses them when it is
-- dropped, which frees the index names for the new table.
ALTER TABLE /*river:schema*/river_job RENAME TO river_job_old;

CREATE TABLE /*river:schema*/river_job (
    id            integer PRIMARY KEY,
    args          blob NOT NULL DEFAULT (jsonb('{}')),
    attempt       integer NOT NULL DEFAULT 0,
    attempted_at  timestamp,
    attempted_by  blob,
    created_at    timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
    errors        blob,
    finalized_at  timestamp,
    kind          text NOT NULL,
    metadata      blob NOT NULL DEFAULT (jsonb('{}')),
    priority      integer NOT NULL DEFAULT 1,
    queue         text NOT NULL DEFAULT 'default',
    state         text NOT NULL DEFAULT 'available',
    scheduled_at  timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
    tags          blob NOT NULL DEFAULT (jsonb('[]')),
    unique_key    blob,
    unique_states integer,
    max_attempts  integer NOT NULL DEFAULT 25,
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
    metadata,
    priority,
    queue,
    state,
    scheduled_at,
    tags,
    unique_key,
    unique_states,
    max_attempts
)
SELECT
    old.id,
    jsonb(old.args),
    old.attempt,
    old.attempted_at,
    jsonb(old.attempted_by),
    old.created_at,
    jsonb(old.errors),
    old.finalized_at,
    old.kind,
    jsonb(old.metadata),
    old.priority,
    old.queue,
    old.state,
    old.scheduled_at,
    jsonb(old.tags),
    old.unique_key,
    old.unique_states,
    old.max_attempts
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

-- river_queue: JSONB metadata, and updated_at defaults to the current time.
ALTER TABLE /*river:schema*/river_queue RENAME TO river_queue_old;

CREATE TABLE /*river:schema*/river_queue (
    name       text PRIMARY KEY NOT NULL,
    created_at timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
    metadata   blob NOT NULL DEFAULT (jsonb('{}')),
    paused_at  timestamp,
    updated_at timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP
);

INSERT INTO /*river:schema*/river_queue (name, created_at, metadata, paused_at, updated_at)
SELECT old.name, old.created_at, jsonb(old.metadata), old.paused_at, old.updated_at
FROM /*river:schema*/river_queue_old AS old;

DROP TABLE /*river:schema*/river_queue_old;
