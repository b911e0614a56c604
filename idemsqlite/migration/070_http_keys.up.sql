-- Idempotency keys of the HTTP middleware (package idemkey): one row per (principal, route,
-- key), identified by their SHA-256 (id), in flight until the handler's transaction stores its
-- response here. Every change increments token and is conditional on it. A rowid table, so
-- that garbage collection deletes in bounded batches by rowid.
CREATE TABLE IF NOT EXISTS {{prefix}}http_keys (
    id              BLOB    NOT NULL PRIMARY KEY CHECK (length(id) = 32),
    principal       TEXT    NOT NULL,
    route           TEXT    NOT NULL,
    idem_key        TEXT    NOT NULL,
    fingerprint     BLOB    NOT NULL CHECK (length(fingerprint) = 32),
    status          INTEGER NOT NULL, -- 1 in flight, 2 completed
    token           INTEGER NOT NULL,
    locked_until    INTEGER NOT NULL, -- unix microseconds, UTC
    created_at      INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL,
    response_status INTEGER NOT NULL DEFAULT 0,
    response_header BLOB,
    response_body   BLOB
);

CREATE INDEX IF NOT EXISTS {{prefix}}http_keys_expires_at ON {{prefix}}http_keys (expires_at);
