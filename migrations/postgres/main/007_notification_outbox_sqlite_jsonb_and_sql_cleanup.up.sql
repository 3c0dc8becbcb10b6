-- Notification outbox. Only the SQLite backend writes to it; on Postgres the
-- table exists so that both backends share one schema.
CREATE TABLE /*river:schema*/river_notification (
    id         bigserial PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    payload    text NOT NULL,
    topic      text NOT NULL,
    CONSTRAINT topic_length CHECK (length(topic) > 0 AND length(topic) < 128)
);

CREATE INDEX river_notification_topic_id_idx ON /*river:schema*/river_notification (topic, id);
CREATE INDEX river_notification_created_at_idx ON /*river:schema*/river_notification (created_at);

-- The JSONB conversion done by this version on SQLite has nothing to do here:
-- the Postgres columns have been jsonb from the start.

-- Cleanup: the client registry tables were never used.
DROP TABLE /*river:schema*/river_client_queue;
DROP TABLE /*river:schema*/river_client;

-- Column defaults.
ALTER TABLE /*river:schema*/river_queue ALTER COLUMN updated_at SET DEFAULT CURRENT_TIMESTAMP;
ALTER TABLE /*river:schema*/river_job ALTER COLUMN max_attempts SET DEFAULT 25;
