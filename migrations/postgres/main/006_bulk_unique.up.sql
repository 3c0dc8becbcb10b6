-- Second-generation unique jobs: a unique_states bitmask selects the states in
-- which a unique_key must be unique. The function maps a state to its bit;
-- get_bit counts from the most significant bit, so 'available' (bit 7) is the
-- lowest-order bit of the byte. It must stay IMMUTABLE to appear in an index
-- predicate, and it needs 'pending', which version 004 committed.
CREATE OR REPLACE FUNCTION /*river:schema*/river_job_state_in_bitmask(
    bitmask bit(8),
    state /*river:schema*/river_job_state
) RETURNS boolean
IMMUTABLE
LANGUAGE sql
AS $fn$
  SELECT CASE state
    WHEN 'available' THEN get_bit(bitmask, 7)
    WHEN 'cancelled' THEN get_bit(bitmask, 6)
    WHEN 'completed' THEN get_bit(bitmask, 5)
    WHEN 'discarded' THEN get_bit(bitmask, 4)
    WHEN 'pending' THEN get_bit(bitmask, 3)
    WHEN 'retryable' THEN get_bit(bitmask, 2)
    WHEN 'running' THEN get_bit(bitmask, 1)
    WHEN 'scheduled' THEN get_bit(bitmask, 0)
    ELSE 0
  END = 1;
$fn$;

-- IF NOT EXISTS on the column and the index lets operators prepare both ahead
-- of time (the index CONCURRENTLY) on large tables.
ALTER TABLE /*river:schema*/river_job ADD COLUMN IF NOT EXISTS unique_states bit(8);

CREATE UNIQUE INDEX IF NOT EXISTS river_job_unique_idx
    ON /*river:schema*/river_job (unique_key)
    WHERE unique_key IS NOT NULL
        AND unique_states IS NOT NULL
        AND /*river:schema*/river_job_state_in_bitmask(unique_states, state);

-- Replaced by river_job_unique_idx.
DROP INDEX /*river:schema*/river_job_kind_unique_key_idx;
