-- Version 002: one row per queue with global limits (QueueConfig.rate_limit,
-- global_max_workers). A limited claim locks its queue's row for the length of
-- its transaction, so the limited claims of a queue run one at a time across
-- every client. starts is the rate limit's window: JSON text
-- [[microseconds since the epoch, jobs started], ...], one entry per claim.
CREATE TABLE /*river:schema*/river_anyio_queue_limit (
    queue      text PRIMARY KEY,
    starts     text NOT NULL DEFAULT '[]',
    updated_at timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT queue_length CHECK (char_length(queue) > 0 AND char_length(queue) < 128)
);
