-- Tags become mandatory, defaulting to an empty array; existing NULLs are filled first.
ALTER TABLE /*river:schema*/river_job ALTER COLUMN tags SET DEFAULT '{}';

UPDATE /*river:schema*/river_job
SET tags = '{}'
WHERE tags IS NULL;

ALTER TABLE /*river:schema*/river_job ALTER COLUMN tags SET NOT NULL;
