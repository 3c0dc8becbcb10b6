-- Nothing to do on Postgres: river_job.id comes from a sequence, which never
-- hands out the same value twice. (On SQLite this version rebuilds river_job.)
SELECT 1;
