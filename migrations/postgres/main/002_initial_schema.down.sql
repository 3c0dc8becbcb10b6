DROP TABLE /*river:schema*/river_leader;

-- The table goes first: its trigger depends on the function, its column on the type.
DROP TABLE /*river:schema*/river_job;
DROP FUNCTION /*river:schema*/river_job_notify();
DROP TYPE /*river:schema*/river_job_state;
