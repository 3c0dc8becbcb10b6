-- Bookkeeping table listing the applied migration versions. This first shape
-- has a surrogate id; version 005 rebuilds it around (line, version).
CREATE TABLE /*river:schema*/river_migration (
    id         bigserial PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    version    bigint NOT NULL,
    CONSTRAINT version CHECK (version >= 1)
);

-- Deliberately unnamed: Postgres picks river_migration_version_idx.
CREATE UNIQUE INDEX ON /*river:schema*/river_migration (version);
