-- Version 002: one row per queue with global limits (QueueConfig.rate_limit,
-- global_max_workers). SQLite serialises writers, so a limited claim's write
-- transaction is the lock. starts is the rate limit's window: JSON text
-- [[microseconds since the epoch, jobs started], ...], one entry per claim.
CREATE TABLE /*river:schema*/river_anyio_queue_limit (
    queue      text PRIMARY KEY NOT NULL,
    starts     text NOT NULL DEFAULT '[]',
    updated_at timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP,
    CONSTRAINT queue_length CHECK (length(queue) > 0 AND length(queue) < 128)
);
