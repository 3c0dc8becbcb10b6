-- args: backfill NULLs, then make the column mandatory. The temporary default
-- only exists so the column can be made NOT NULL and is removed again at the end.
ALTER TABLE /*river:schema*/river_job ALTER COLUMN args SET DEFAULT '{}';
UPDATE /*river:schema*/river_job SET args = '{}' WHERE args IS NULL;
ALTER TABLE /*river:schema*/river_job ALTER COLUMN args SET NOT NULL;
ALTER TABLE /*river:schema*/river_job ALTER COLUMN args DROP DEFAULT;

-- metadata: same treatment, but it keeps its '{}' default.
ALTER TABLE /*river:schema*/river_job ALTER COLUMN metadata SET DEFAULT '{}';
UPDATE /*river:schema*/river_job SET metadata = '{}' WHERE metadata IS NULL;
ALTER TABLE /*river:schema*/river_job ALTER COLUMN metadata SET NOT NULL;

-- New state. An enum value added inside a transaction cannot be used until that
-- transaction commits, so nothing in this version refers to it. IF NOT EXISTS
-- matters: the down migration cannot take the value back out.
ALTER TYPE /*river:schema*/river_job_state ADD VALUE IF NOT EXISTS 'pending' AFTER 'discarded';

-- finalized_at must now be set exactly when the state is final.
ALTER TABLE /*river:schema*/river_job DROP CONSTRAINT finalized_or_finalized_at_null;
ALTER TABLE /*river:schema*/river_job ADD CONSTRAINT finalized_or_finalized_at_null CHECK (
    (finalized_at IS NULL AND state NOT IN ('cancelled', 'completed', 'discarded'))
    OR (finalized_at IS NOT NULL AND state IN ('cancelled', 'completed', 'discarded'))
);

-- Insert notifications are sent by clients from here on.
DROP TRIGGER river_notify ON /*river:schema*/river_job;
DROP FUNCTION /*river:schema*/river_job_notify();

-- One row per queue that clients have worked recently (pause state, liveness).
CREATE TABLE /*river:schema*/river_queue (
    name       text PRIMARY KEY NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    metadata   jsonb NOT NULL DEFAULT '{}'::jsonb,
    paused_at  timestamptz,
    updated_at timestamptz NOT NULL
);

-- A single leader per schema: the only allowed name is 'default'.
ALTER TABLE /*river:schema*/river_leader
    DROP CONSTRAINT name_length,
    ADD CONSTRAINT name_length CHECK (name = 'default'),
    ALTER COLUMN name SET DEFAULT 'default';
