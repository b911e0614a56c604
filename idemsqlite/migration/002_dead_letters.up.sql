-- Dead letters: deliveries that will not be retried, with everything an operator needs to
-- inspect, replay or discard them. AUTOINCREMENT keeps ids from being reused, because audit rows
-- and operators refer to them.
CREATE TABLE IF NOT EXISTS {{prefix}}dead_letters (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer        TEXT    NOT NULL,
    tenant          TEXT    NOT NULL DEFAULT '',
    event_id        TEXT    NOT NULL,
    type            TEXT    NOT NULL DEFAULT '',
    payload         BLOB,
    headers         TEXT    NOT NULL DEFAULT '{}', -- JSON object of string to string
    published_at    INTEGER,                       -- unix microseconds, UTC
    occurred_at     INTEGER,
    fingerprint     BLOB    NOT NULL,              -- 32 zero bytes when not computed
    reason          TEXT    NOT NULL,
    error           TEXT    NOT NULL DEFAULT '',
    attempts        INTEGER NOT NULL DEFAULT 0,
    first_failed_at INTEGER NOT NULL,
    last_failed_at  INTEGER NOT NULL,
    status          TEXT    NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'replayed', 'discarded')),
    source          TEXT    NOT NULL DEFAULT '',
    recovered_at    INTEGER
);

-- One pending dead letter per delivery: dead-lettering it again updates that row.
CREATE UNIQUE INDEX IF NOT EXISTS {{prefix}}dead_letters_pending
    ON {{prefix}}dead_letters (consumer, tenant, event_id, fingerprint) WHERE status = 'pending';

CREATE INDEX IF NOT EXISTS {{prefix}}dead_letters_status_last_failed
    ON {{prefix}}dead_letters (status, last_failed_at);

-- Audit: what operators did with dead letters, and why.
CREATE TABLE IF NOT EXISTS {{prefix}}audit (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    at             INTEGER NOT NULL,
    actor          TEXT    NOT NULL,
    action         TEXT    NOT NULL,
    dead_letter_id INTEGER NOT NULL,
    event_id       TEXT    NOT NULL,
    reason         TEXT    NOT NULL DEFAULT ''
);
