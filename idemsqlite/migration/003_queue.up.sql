-- Queue: the embedded broker. A fetch leases a row until lease_until and increments its fencing
-- token; ack, nak and extend must present the current token. AUTOINCREMENT keeps a deleted job's
-- id from being reused, so that a stale (id, token) can never match a newer job.
CREATE TABLE IF NOT EXISTS {{prefix}}queue (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    queue        TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    tenant       TEXT    NOT NULL DEFAULT '',
    type         TEXT    NOT NULL DEFAULT '',
    payload      BLOB,
    headers      TEXT    NOT NULL DEFAULT '{}',
    occurred_at  INTEGER,
    enqueued_at  INTEGER NOT NULL,
    available_at INTEGER NOT NULL,
    lease_until  INTEGER,
    token        INTEGER NOT NULL DEFAULT 0,
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT    NOT NULL DEFAULT ''
);

CREATE INDEX IF NOT EXISTS {{prefix}}queue_fetch ON {{prefix}}queue (queue, available_at, id);
