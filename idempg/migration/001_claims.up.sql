-- Claims: one row per effect applied. The primary key is what serialises concurrent deliveries
-- of one event: the first INSERT wins, the others wait for it and then see a duplicate.
CREATE TABLE IF NOT EXISTS "{{schema}}"."{{prefix}}claims" (
    tenant      text        NOT NULL,
    consumer    text        NOT NULL,  -- full name with effect version, "ledger@v1"
    event_id    text        NOT NULL,
    fingerprint bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant, consumer, event_id)
);

-- Garbage collection deletes by age.
CREATE INDEX IF NOT EXISTS "{{prefix}}claims_created_at"
    ON "{{schema}}"."{{prefix}}claims" (created_at);
