-- Outbox: events enqueued in the producer's transaction, published later by a relay.
-- AUTOINCREMENT keeps ids growing after published rows are deleted, so id order stays
-- enqueue order.
CREATE TABLE IF NOT EXISTS {{prefix}}outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    "partition"     INTEGER NOT NULL,
    event_id        TEXT    NOT NULL,
    tenant          TEXT    NOT NULL DEFAULT '',
    topic           TEXT    NOT NULL,
    ordering_key    TEXT    NOT NULL DEFAULT '',
    type            TEXT    NOT NULL DEFAULT '',
    payload         BLOB,
    headers         TEXT    NOT NULL DEFAULT '{}',
    occurred_at     INTEGER,
    created_at      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT    NOT NULL DEFAULT '',
    next_attempt_at INTEGER NOT NULL,
    published_at    INTEGER,
    dead            INTEGER NOT NULL DEFAULT 0
);

CREATE INDEX IF NOT EXISTS {{prefix}}outbox_unpublished
    ON {{prefix}}outbox ("partition", id) WHERE published_at IS NULL AND NOT dead;

CREATE INDEX IF NOT EXISTS {{prefix}}outbox_published_at ON {{prefix}}outbox (published_at);

-- Leases: named, expiring ownership (relay partitions, relay membership). The token grows every
-- time the lease changes owner, so work done under an old token can be told apart.
CREATE TABLE IF NOT EXISTS {{prefix}}leases (
    name        TEXT    PRIMARY KEY,
    owner       TEXT    NOT NULL,
    token       INTEGER NOT NULL,
    lease_until INTEGER NOT NULL
);
