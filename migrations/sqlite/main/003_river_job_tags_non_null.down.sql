-- Nothing to undo on SQLite; see the up migration.
SELECT 1;
