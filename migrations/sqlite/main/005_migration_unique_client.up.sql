-- river_migration becomes keyed by (line, version) so that other migration lines
-- can share it. Existing rows all belong to line 'main'. The old table takes its
-- version index with it when it is dropped.
ALTER TABLE /*river:schema*/river_migration RENAME TO river_migration_old;

CREATE TABLE /*river:schema*/river_migration (
    line       text NOT NULL,
    version    integer NOT NULL,
    created_at timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
    CONSTRAINT line_length CHECK (length(line) > 0 AND length(line) < 128),
    CONSTRAINT version_gte_1 CHECK (version >= 1),
    PRIMARY KEY (line, version)
);

INSERT INTO /*river:schema*/river_migration (line, version, created_at)
SELECT 'main', old.version, old.created_at
FROM /*river:schema*/river_migration_old AS old;

DROP TABLE /*river:schema*/river_migration_old;

-- river_job.unique_key and its index come with the table version 006 creates.

-- Reserved client registry tables (never written; dropped again in 007).
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
