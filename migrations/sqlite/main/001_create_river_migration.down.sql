-- Removing the bookkeeping table also removes every record of applied versions.
DROP TABLE /*river:schema*/river_migration;
