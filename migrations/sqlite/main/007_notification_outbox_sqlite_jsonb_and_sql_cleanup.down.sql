DROP TABLE /*river:schema*/river_notification;

-- river_job back to its version 006 layout: JSON stored as text, max_attempts
-- in its original position and without a default.
-- The old table keeps its indexes through the rename and loses them when it is
-- dropped, which frees the index names for the new table.
ALTER TABLE /*river:schema*/river_job RENAME TO river_job_old;

CREATE TABLE /*river:schema*/river_job (
    id            integer PRIMARY KEY,
    args          blob NOT NULL DEFAULT '{}',
    attempt       integer NOT NULL DEFAULT 0,
    attempted_at  timestamp,
    attempted_by  blob,
    created_at    timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
    errors        blob,
    finalized_at  timestamp,
    kind          text NOT NULL,
    max_attempts  integer NOT NULL,
    metadata      blob NOT NULL DEFAULT (json('{}')),
    priority      integer NOT NULL DEFAULT 1,
    queue         text NOT NULL DEFAULT 'default',
    state         text NOT NULL DEFAULT 'available',
    scheduled_at  timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
    tags          blob NOT NULL DEFAULT (json('[]')),
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
    json(old.args),
    old.attempt,
    old.attempted_at,
    json(old.attempted_by),
    old.created_at,
    json(old.errors),
    old.finalized_at,
    old.kind,
    old.max_attempts,
    json(old.metadata),
    old.priority,
    old.queue,
    old.state,
    old.scheduled_at,
    json(old.tags),
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

-- river_queue back to JSON text metadata and no default for updated_at.
ALTER TABLE /*river:schema*/river_queue RENAME TO river_queue_old;

CREATE TABLE /*river:schema*/river_queue (
    name       text PRIMARY KEY NOT NULL,
    created_at timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
    metadata   blob NOT NULL DEFAULT (json('{}')),
    paused_at  timestamp,
    updated_at timestamp NOT NULL
);

INSERT INTO /*river:schema*/river_queue (name, created_at, metadata, paused_at, updated_at)
SELECT old.name, old.created_at, json(old.metadata), old.paused_at, old.updated_at
FROM /*river:schema*/river_queue_old AS old;

DROP TABLE /*river:schema*/river_queue_old;

-- Restore the client registry tables in their version 006 form.
CREATE TABLE /*river:schema*/river_client (
    id         text PRIMARY KEY NOT NULL,
    created_at timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
    metadata   blob NOT NULL DEFAULT (json('{}')),
    paused_at  timestamp,
    updated_at timestamp NOT NULL,
    CONSTRAINT name_length CHECK (length(id) > 0 AND length(id) < 128)
);

CREATE TABLE /*river:schema*/river_client_queue (
    river_client_id    text NOT NULL REFERENCES river_client (id) ON DELETE CASCADE,
    name               text NOT NULL,
    created_at         timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
    max_workers        integer NOT NULL DEFAULT 0,
    metadata           blob NOT NULL DEFAULT (json('{}')),
    num_jobs_completed integer NOT NULL DEFAULT 0,
    num_jobs_running   integer NOT NULL DEFAULT 0,
    updated_at         timestamp NOT NULL,
    PRIMARY KEY (river_client_id, name),
    CONSTRAINT name_length CHECK (length(name) > 0 AND length(name) < 128),
    CONSTRAINT num_jobs_completed_zero_or_positive CHECK (num_jobs_completed >= 0),
    CONSTRAINT num_jobs_running_zero_or_positive CHECK (num_jobs_running >= 0)
);
