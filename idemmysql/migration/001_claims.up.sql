-- Claims: one row per effect (tenant, consumer@version, event_id), inserted in the handler's
-- transaction. The fingerprint tells a redelivery (same content) from key reuse (other content).
-- The key columns are binary, so that two ids compare equal only when their bytes do (a
-- utf8mb4 collation would fold case and trailing spaces), and sized for idem's identity bounds:
-- 256 + 256 + 1024 bytes, well inside InnoDB's 3072-byte index limit, so the primary key is the
-- key itself and a duplicate claim locks one index record.
CREATE TABLE IF NOT EXISTS {{prefix}}claims (
    tenant      VARBINARY(256)  NOT NULL,
    consumer    VARBINARY(256)  NOT NULL,
    event_id    VARBINARY(1024) NOT NULL,
    fingerprint BINARY(32)      NOT NULL,
    created_at  BIGINT          NOT NULL COMMENT 'unix microseconds, UTC',
    PRIMARY KEY (tenant, consumer, event_id),
    KEY {{prefix}}claims_created_at (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
