-- The SQLite backend arrived long after this version, so the real river_job
-- table is only created by version 006. Until then a one-column stand-in keeps
-- the set of tables the same as on Postgres.
CREATE TABLE /*river:schema*/river_job (
    id integer PRIMARY KEY
);

-- Leadership lease.
CREATE TABLE /*river:schema*/river_leader (
    elected_at timestamp NOT NULL,
    expires_at timestamp NOT NULL,
    leader_id  text NOT NULL,
    name       text PRIMARY KEY NOT NULL,
    CONSTRAINT name_length CHECK (length(name) > 0 AND length(name) < 128),
    CONSTRAINT leader_id_length CHECK (length(leader_id) > 0 AND length(leader_id) < 128)
);
