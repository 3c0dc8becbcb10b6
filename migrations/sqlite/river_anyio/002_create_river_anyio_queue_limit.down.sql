DROP TABLE /*river:schema*/river_anyio_queue_limit;
