-- Nothing to undo on Postgres; see the up migration.
SELECT 1;
