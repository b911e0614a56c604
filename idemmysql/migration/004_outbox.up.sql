-- Outbox: events enqueued in the producer's transaction, published later by a relay, in id
-- order per partition. A failed row keeps its first attempt time (the relay's retry budget counts
-- from it); a dead row with a dead letter holds its key back until an operator replays or
-- discards that dead letter, which dead_letter_id names.
CREATE TABLE IF NOT EXISTS {{prefix}}outbox (
    id               BIGINT     NOT NULL AUTO_INCREMENT,
    partition_id     INT        NOT NULL,
    event_id         BLOB       NOT NULL,
    tenant           BLOB       NOT NULL,
    topic            BLOB       NOT NULL,
    ordering_key     BLOB       NOT NULL,
    type             BLOB       NOT NULL,
    payload          LONGBLOB,
    headers          MEDIUMTEXT NOT NULL,
    occurred_at      BIGINT     NULL,
    created_at       BIGINT     NOT NULL,
    attempts         INT        NOT NULL DEFAULT 0,
    last_error       MEDIUMTEXT NOT NULL,
    next_attempt_at  BIGINT     NOT NULL,
    published_at     BIGINT     NULL,
    dead             BOOLEAN    NOT NULL DEFAULT FALSE,
    first_attempt_at BIGINT     NULL,
    dead_letter_id   BIGINT     NULL,
    PRIMARY KEY (id),
    -- Unpublished rows have published_at NULL: the relay's fetch is a lookup of that NULL per
    -- partition, and garbage collection a range scan of the published ones.
    KEY {{prefix}}outbox_unpublished (published_at, partition_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Leases: named, expiring ownership (relay partitions, relay membership). The token grows every
-- time the lease changes owner, so work done under an old token can be told apart.
CREATE TABLE IF NOT EXISTS {{prefix}}leases (
    name        VARBINARY(512) NOT NULL,
    owner       VARBINARY(512) NOT NULL,
    token       BIGINT         NOT NULL,
    lease_until BIGINT         NOT NULL,
    PRIMARY KEY (name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
