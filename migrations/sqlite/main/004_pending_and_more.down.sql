-- Recreate the leader table in its version 002 shape (its row is not kept).
DROP TABLE /*river:schema*/river_leader;

CREATE TABLE /*river:schema*/river_leader (
    elected_at timestamp NOT NULL,
    expires_at timestamp NOT NULL,
    leader_id  text NOT NULL,
    name       text PRIMARY KEY NOT NULL,
    CONSTRAINT name_length CHECK (length(name) > 0 AND length(name) < 128),
    CONSTRAINT leader_id_length CHECK (length(leader_id) > 0 AND length(leader_id) < 128)
);

DROP TABLE /*river:schema*/river_queue;
