ALTER TABLE /*river:schema*/river_job
    ALTER COLUMN tags DROP DEFAULT,
    ALTER COLUMN tags DROP NOT NULL;
