DROP TABLE /*river:schema*/river_leader;
DROP TABLE /*river:schema*/river_job;
