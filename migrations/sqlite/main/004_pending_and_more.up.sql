-- The river_job changes of this version (mandatory args and metadata, the
-- 'pending' state, the stricter finalized_at check) are part of the table
-- version 006 creates on SQLite.

-- One row per queue that clients have worked recently (pause state, liveness).
CREATE TABLE /*river:schema*/river_queue (
    name       text PRIMARY KEY NOT NULL,
    created_at timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
    metadata   blob NOT NULL DEFAULT (json('{}')),
    paused_at  timestamp,
    updated_at timestamp NOT NULL
);

-- A single leader per schema: the only allowed name is 'default'. SQLite cannot
-- change a column's default or checks in place, so the table is recreated. The
-- lease is transient, so its row is not carried over.
DROP TABLE /*river:schema*/river_leader;

CREATE TABLE /*river:schema*/river_leader (
    elected_at timestamp NOT NULL,
    expires_at timestamp NOT NULL,
    leader_id  text NOT NULL,
    name       text PRIMARY KEY NOT NULL DEFAULT 'default' CHECK (name = 'default'),
    CONSTRAINT name_length CHECK (length(name) > 0 AND length(name) < 128),
    CONSTRAINT leader_id_length CHECK (length(leader_id) > 0 AND length(leader_id) < 128)
);
