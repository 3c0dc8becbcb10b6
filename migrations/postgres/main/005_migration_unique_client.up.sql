-- river_migration becomes keyed by (line, version) so that other migration lines
-- can share it. Existing rows all belong to line 'main'.
--
-- Schemas managed by an external migration tool may lack the table entirely
-- (they never ran 001); in that case there is nothing to rebuild.
DO $migrate$
BEGIN
    IF to_regclass('/*river:schema*/river_migration') IS NULL THEN
        RETURN;
    END IF;

    -- The renamed table keeps the name river_migration_pkey until it is dropped,
    -- so the new primary key ends up as river_migration_pkey1.
    ALTER TABLE /*river:schema*/river_migration RENAME TO river_migration_old;

    CREATE TABLE /*river:schema*/river_migration (
        line       text NOT NULL,
        version    bigint NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT line_length CHECK (char_length(line) > 0 AND char_length(line) < 128),
        CONSTRAINT version_gte_1 CHECK (version >= 1),
        PRIMARY KEY (line, version)
    );

    INSERT INTO /*river:schema*/river_migration (line, version, created_at)
    SELECT 'main', old.version, old.created_at
    FROM /*river:schema*/river_migration_old AS old;

    DROP TABLE /*river:schema*/river_migration_old;
END
$migrate$;

-- First-generation unique jobs. IF NOT EXISTS lets operators with large tables
-- add the column and build the index CONCURRENTLY before running this version.
ALTER TABLE /*river:schema*/river_job ADD COLUMN IF NOT EXISTS unique_key bytea;

CREATE UNIQUE INDEX IF NOT EXISTS river_job_kind_unique_key_idx
    ON /*river:schema*/river_job (kind, unique_key)
    WHERE unique_key IS NOT NULL;

-- Reserved client registry tables (never written; dropped again in 007).
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
