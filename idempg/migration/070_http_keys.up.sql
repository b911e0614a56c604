-- Idempotency keys of the HTTP middleware (package idemkey): one row per (principal, route,
-- key), identified by their SHA-256 (id), in flight until the handler's transaction stores its
-- response here. Every change increments token and is conditional on it.
CREATE TABLE IF NOT EXISTS "{{schema}}"."{{prefix}}http_keys" (
    id              bytea       PRIMARY KEY CHECK (octet_length(id) = 32),
    principal       text        NOT NULL,
    route           text        NOT NULL,
    idem_key        text        NOT NULL,
    fingerprint     bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    status          smallint    NOT NULL, -- 1 in flight, 2 completed
    token           bigint      NOT NULL,
    locked_until    timestamptz NOT NULL,
    created_at      timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL,
    response_status integer     NOT NULL DEFAULT 0,
    response_header bytea,
    response_body   bytea
);

-- Garbage collection deletes by expiry.
CREATE INDEX IF NOT EXISTS "{{prefix}}http_keys_expires_at"
    ON "{{schema}}"."{{prefix}}http_keys" (expires_at);
