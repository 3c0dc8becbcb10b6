-- Line river_anyio: river_anyio's own tables, beside River's (line main), which
-- River Go's migrator leaves alone. Version 001 holds named leases for
-- single-flight work across replicas (Client.with_lease, Client.lease).
-- A lease is free when it has no row or its row has expired; expiry is judged
-- by the database's clock, so the replicas' clocks never matter.
CREATE TABLE /*river:schema*/river_anyio_lease (
    name       text PRIMARY KEY,
    holder     text NOT NULL,
    taken_at   timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,

    CONSTRAINT name_length CHECK (char_length(name) > 0 AND char_length(name) < 256),
    CONSTRAINT holder_length CHECK (char_length(holder) > 0 AND char_length(holder) < 256),
    CONSTRAINT expires_after_taken CHECK (expires_at > taken_at)
);
