-- Idempotency keys of the HTTP middleware (package idemkey): one row per (principal, route,
-- key), identified by their SHA-256 (id), in flight until the handler's transaction stores its
-- response here. Every change increments token and is conditional on it. The text columns are
-- binary, like the claims' key, and sized for idemkey's bounds.
CREATE TABLE IF NOT EXISTS {{prefix}}http_keys (
    id              BINARY(32)     NOT NULL,
    principal       VARBINARY(256) NOT NULL,
    route           VARBINARY(512) NOT NULL,
    idem_key        VARBINARY(255) NOT NULL,
    fingerprint     BINARY(32)     NOT NULL,
    status          TINYINT        NOT NULL COMMENT '1 in flight, 2 completed',
    token           BIGINT         NOT NULL,
    locked_until    BIGINT         NOT NULL COMMENT 'unix microseconds, UTC',
    created_at      BIGINT         NOT NULL COMMENT 'unix microseconds, UTC',
    expires_at      BIGINT         NOT NULL COMMENT 'unix microseconds, UTC',
    response_status INT            NOT NULL DEFAULT 0,
    response_header MEDIUMBLOB,
    response_body   LONGBLOB,
    PRIMARY KEY (id),
    KEY {{prefix}}http_keys_expires_at (expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
