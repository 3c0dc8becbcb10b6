DROP TABLE /*river:schema*/river_anyio_lease;
