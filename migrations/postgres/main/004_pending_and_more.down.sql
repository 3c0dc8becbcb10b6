-- The enum value 'pending' stays: Postgres cannot drop an enum value safely.

ALTER TABLE /*river:schema*/river_leader
    ALTER COLUMN name DROP DEFAULT,
    DROP CONSTRAINT name_length,
    ADD CONSTRAINT name_length CHECK (char_length(name) > 0 AND char_length(name) < 128);

DROP TABLE /*river:schema*/river_queue;

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

ALTER TABLE /*river:schema*/river_job DROP CONSTRAINT finalized_or_finalized_at_null;
ALTER TABLE /*river:schema*/river_job ADD CONSTRAINT finalized_or_finalized_at_null CHECK (
    (state IN ('cancelled', 'completed', 'discarded') AND finalized_at IS NOT NULL)
    OR finalized_at IS NULL
);

-- Both columns end up nullable; metadata also loses its default.
ALTER TABLE /*river:schema*/river_job
    ALTER COLUMN metadata DROP DEFAULT,
    ALTER COLUMN metadata DROP NOT NULL,
    ALTER COLUMN args DROP NOT NULL;
