-- Claims: one row per effect (tenant, consumer@version, event_id), inserted in the handler's
-- transaction. The fingerprint tells a redelivery (same content) from key reuse (other content).
-- A rowid table, so that garbage collection can delete in bounded batches by rowid.
CREATE TABLE IF NOT EXISTS {{prefix}}claims (
    tenant      TEXT    NOT NULL,
    consumer    TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    fingerprint BLOB    NOT NULL,
    created_at  INTEGER NOT NULL, -- unix microseconds, UTC
    PRIMARY KEY (tenant, consumer, event_id)
);

CREATE INDEX IF NOT EXISTS {{prefix}}claims_created_at ON {{prefix}}claims (created_at);
