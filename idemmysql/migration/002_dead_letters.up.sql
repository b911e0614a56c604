-- Dead letters: deliveries that will not be retried, with everything an operator needs to
-- inspect, replay or discard them. The message's fields are binary and unbounded: a message
-- that arrived with an oversized or non-UTF-8 id is exactly what must be kept. key_hash is the
-- SHA-256 of (consumer, tenant, event_id), computed by the store, so that a lookup by key uses a
-- short index whatever the id's length.
CREATE TABLE IF NOT EXISTS {{prefix}}dead_letters (
    id              BIGINT         NOT NULL AUTO_INCREMENT,
    consumer        VARBINARY(256) NOT NULL,
    tenant          BLOB           NOT NULL,
    event_id        BLOB           NOT NULL,
    type            BLOB           NOT NULL,
    payload         LONGBLOB,
    headers         MEDIUMTEXT     NOT NULL COMMENT 'JSON object of string to string',
    published_at    BIGINT         NULL COMMENT 'unix microseconds, UTC',
    occurred_at     BIGINT         NULL,
    fingerprint     BINARY(32)     NOT NULL COMMENT '32 zero bytes when not computed',
    key_hash        BINARY(32)     NOT NULL,
    reason          VARCHAR(64)    NOT NULL,
    error           MEDIUMTEXT     NOT NULL,
    attempts        INT            NOT NULL DEFAULT 0,
    first_failed_at BIGINT         NOT NULL,
    last_failed_at  BIGINT         NOT NULL,
    status          VARCHAR(16)    NOT NULL DEFAULT 'pending',
    source          TEXT           NOT NULL,
    recovered_at    BIGINT         NULL,
    -- MySQL has no partial index: pending_key is the key hash while the row is pending and NULL
    -- after, and a unique index ignores NULLs, so there is one pending dead letter per delivery.
    pending_key     BINARY(32) AS (IF(status = 'pending', key_hash, NULL)) STORED,
    PRIMARY KEY (id),
    UNIQUE KEY {{prefix}}dead_letters_pending (pending_key, fingerprint),
    KEY {{prefix}}dead_letters_key (key_hash, status),
    KEY {{prefix}}dead_letters_status_last_failed (status, last_failed_at),
    CONSTRAINT {{prefix}}dead_letters_status CHECK (status IN ('pending', 'replayed', 'discarded'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Audit: what operators did with dead letters, and why.
CREATE TABLE IF NOT EXISTS {{prefix}}audit (
    id             BIGINT        NOT NULL AUTO_INCREMENT,
    at             BIGINT        NOT NULL,
    actor          TEXT          NOT NULL,
    action         VARCHAR(16)   NOT NULL,
    dead_letter_id BIGINT        NOT NULL,
    event_id       BLOB          NOT NULL,
    reason         TEXT          NOT NULL,
    PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
