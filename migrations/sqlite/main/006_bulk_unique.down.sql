DROP TABLE /*river:schema*/river_job;

-- Back to the one-column stand-in created by version 002.
CREATE TABLE /*river:schema*/river_job (
    id integer PRIMARY KEY
);
