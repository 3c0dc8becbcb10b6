DROP TABLE /*river:schema*/river_client_queue;
DROP TABLE /*river:schema*/river_client;

-- Back to the version-only migration table. Rows are copied by version; the
-- line column is not checked here (a clash of versions between lines fails
-- on the unique index).
ALTER TABLE /*river:schema*/river_migration RENAME TO river_migration_old;

CREATE TABLE /*river:schema*/river_migration (
    id         integer PRIMARY KEY,
    created_at timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
    version    integer NOT NULL,
    CONSTRAINT version CHECK (version >= 1)
);

CREATE UNIQUE INDEX /*river:schema*/river_migration_version_idx ON river_migration (version);

INSERT INTO /*river:schema*/river_migration (version, created_at)
SELECT old.version, old.created_at
FROM /*river:schema*/river_migration_old AS old;

DROP TABLE /*river:schema*/river_migration_old;
