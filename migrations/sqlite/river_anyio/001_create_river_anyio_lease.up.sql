-- Line river_anyio: river_anyio's own tables, beside River's (line main), which
-- River Go's migrator leaves alone. Version 001 holds named leases for
-- single-flight work across replicas (Client.with_lease, Client.lease).
-- Timestamps are UTC text as River's SQLite tables keep them, written and
-- compared with the database's datetime('now', 'subsec').
CREATE TABLE /*river:schema*/river_anyio_lease (
    name       text PRIMARY KEY NOT NULL,
    holder     text NOT NULL,
    taken_at   timestamp NOT NULL,
    expires_at timestamp NOT NULL,
    CONSTRAINT name_length CHECK (length(name) > 0 AND length(name) < 256),
    CONSTRAINT holder_length CHECK (length(holder) > 0 AND length(holder) < 256),
    CONSTRAINT expires_after_taken CHECK (expires_at > taken_at)
);
