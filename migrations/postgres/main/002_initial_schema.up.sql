-- Job states. 'pending' joins the list in version 004.
CREATE TYPE /*river:schema*/river_job_state AS ENUM (
    'available', 'cancelled', 'completed', 'discarded',
    'retryable', 'running', 'scheduled'
);

-- Column order is physical order; later versions append to it, so it is fixed.
CREATE TABLE /*river:schema*/river_job (
    id           bigserial PRIMARY KEY,
    state        /*river:schema*/river_job_state NOT NULL DEFAULT 'available',
    attempt      smallint NOT NULL DEFAULT 0,
    max_attempts smallint NOT NULL,
    attempted_at timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    finalized_at timestamptz,
    scheduled_at timestamptz NOT NULL DEFAULT now(),
    priority     smallint NOT NULL DEFAULT 1,
    args         jsonb,
    attempted_by text[],
    errors       jsonb[],
    kind         text NOT NULL,
    metadata     jsonb NOT NULL DEFAULT '{}',
    queue        text NOT NULL DEFAULT 'default',
    tags         varchar(255)[],

    CONSTRAINT kind_length CHECK (char_length(kind) > 0 AND char_length(kind) < 128),
    CONSTRAINT queue_length CHECK (char_length(queue) > 0 AND char_length(queue) < 128),
    CONSTRAINT priority_in_range CHECK (priority >= 1 AND priority <= 4),
    CONSTRAINT max_attempts_is_positive CHECK (max_attempts > 0),
    CONSTRAINT finalized_or_finalized_at_null CHECK (
        (state IN ('cancelled', 'completed', 'discarded') AND finalized_at IS NOT NULL)
        OR finalized_at IS NULL
    )
);

CREATE INDEX river_job_prioritized_fetching_index
    ON /*river:schema*/river_job USING btree (state, queue, priority, scheduled_at, id);
CREATE INDEX river_job_state_and_finalized_at_index
    ON /*river:schema*/river_job USING btree (state, finalized_at)
    WHERE finalized_at IS NOT NULL;
CREATE INDEX river_job_kind ON /*river:schema*/river_job USING btree (kind);
CREATE INDEX river_job_args_index ON /*river:schema*/river_job USING gin (args);
CREATE INDEX river_job_metadata_index ON /*river:schema*/river_job USING gin (metadata);

-- Wakes listeners on 'river_insert' whenever an available job is inserted.
-- Version 004 retires this in favour of notifications sent by the client.
CREATE OR REPLACE FUNCTION /*river:schema*/river_job_notify() RETURNS trigger
LANGUAGE plpgsql
AS $fn$
DECLARE
  payload json;
BEGIN
  IF NEW.state = 'available' THEN
    payload = json_build_object('queue', NEW.queue);
    PERFORM pg_notify('river_insert', payload::text);
  END IF;
  RETURN NULL;
END;
$fn$;

CREATE TRIGGER river_notify
    AFTER INSERT ON /*river:schema*/river_job
    FOR EACH ROW
    EXECUTE FUNCTION /*river:schema*/river_job_notify();

-- Leadership lease. Unlogged: losing it on a crash only triggers a re-election.
CREATE UNLOGGED TABLE /*river:schema*/river_leader (
    elected_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    leader_id  text NOT NULL,
    name       text PRIMARY KEY,

    CONSTRAINT leader_id_length CHECK (char_length(leader_id) > 0 AND char_length(leader_id) < 128),
    CONSTRAINT name_length CHECK (char_length(name) > 0 AND char_length(name) < 128)
);
