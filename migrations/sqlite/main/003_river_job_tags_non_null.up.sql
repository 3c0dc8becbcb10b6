-- Nothing to do on SQLite: river_job gets its tags column, already NOT NULL
-- with a default, when version 006 creates the table.
SELECT 1;
