DROP TABLE /*river:schema*/river_client_queue;
DROP TABLE /*river:schema*/river_client;

-- Also drops river_job_kind_unique_key_idx, which is built on this column.
ALTER TABLE /*river:schema*/river_job DROP COLUMN unique_key;

-- Go back to the version-only migration table. Rows of other migration lines
-- would be lost, so their presence makes this version irreversible. As on the
-- way up, a schema without the table is left alone.
DO $migrate$
BEGIN
    IF to_regclass('/*river:schema*/river_migration') IS NULL THEN
        RETURN;
    END IF;

    IF EXISTS (SELECT 1 FROM /*river:schema*/river_migration WHERE line <> 'main') THEN
        RAISE EXCEPTION 'version 005 cannot be reverted: river_migration holds rows of migration lines other than main, which the old table shape cannot record';
    END IF;

    ALTER TABLE /*river:schema*/river_migration RENAME TO river_migration_old;

    CREATE TABLE /*river:schema*/river_migration (
        id         bigserial PRIMARY KEY,
        created_at timestamptz NOT NULL DEFAULT now(),
        version    bigint NOT NULL,
        CONSTRAINT version CHECK (version >= 1)
    );

    CREATE UNIQUE INDEX ON /*river:schema*/river_migration (version);

    INSERT INTO /*river:schema*/river_migration (version, created_at)
    SELECT old.version, old.created_at
    FROM /*river:schema*/river_migration_old AS old;

    DROP TABLE /*river:schema*/river_migration_old;
END
$migrate$;
