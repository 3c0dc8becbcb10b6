CREATE UNIQUE INDEX IF NOT EXISTS river_job_kind_unique_key_idx
    ON /*river:schema*/river_job (kind, unique_key)
    WHERE unique_key IS NOT NULL;

DROP INDEX /*river:schema*/river_job_unique_idx;

ALTER TABLE /*river:schema*/river_job DROP COLUMN unique_states;

DROP FUNCTION /*river:schema*/river_job_state_in_bitmask(bit, /*river:schema*/river_job_state);
