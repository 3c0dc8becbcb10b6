-- Bookkeeping table listing the applied migration versions. This first shape
-- has a surrogate id; version 005 rebuilds it around (line, version).
CREATE TABLE /*river:schema*/river_migration (
    id         integer PRIMARY KEY,
    created_at timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
    version    integer NOT NULL,
    CONSTRAINT version CHECK (version >= 1)
);

CREATE UNIQUE INDEX /*river:schema*/river_migration_version_idx ON river_migration (version);
