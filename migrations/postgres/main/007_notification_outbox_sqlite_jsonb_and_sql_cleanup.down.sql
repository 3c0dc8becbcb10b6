ALTER TABLE /*river:schema*/river_job ALTER COLUMN max_attempts DROP DEFAULT;
ALTER TABLE /*river:schema*/river_queue ALTER COLUMN updated_at DROP DEFAULT;

-- Restore the client registry tables exactly as version 005 created them.
CREATE UNLOGGED TABLE /*river:schema*/river_client (
    id         text PRIMARY KEY NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    metadata   jsonb NOT NULL DEFAULT '{}',
    paused_at  timestamptz,
    updated_at timestamptz NOT NULL,
    CONSTRAINT name_length CHECK (char_length(id) > 0 AND char_length(id) < 128)
);

CREATE UNLOGGED TABLE /*river:schema*/river_client_queue (
    river_client_id    text NOT NULL REFERENCES /*river:schema*/river_client (id) ON DELETE CASCADE,
    name               text NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    max_workers        bigint NOT NULL DEFAULT 0,
    metadata           jsonb NOT NULL DEFAULT '{}',
    num_jobs_completed bigint NOT NULL DEFAULT 0,
    num_jobs_running   bigint NOT NULL DEFAULT 0,
    updated_at         timestamptz NOT NULL,
    PRIMARY KEY (river_client_id, name),
    CONSTRAINT name_length CHECK (char_length(name) > 0 AND char_length(name) < 128),
    CONSTRAINT num_jobs_completed_zero_or_positive CHECK (num_jobs_completed >= 0),
    CONSTRAINT num_jobs_running_zero_or_positive CHECK (num_jobs_running >= 0)
);

DROP TABLE /*river:schema*/river_notification;
