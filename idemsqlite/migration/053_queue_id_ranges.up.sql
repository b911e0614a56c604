-- Each queue gets a range of ids of its own, 2^44 wide (queue_ranges.base, a multiple of 2^44,
-- never reused), and the table keeps no index: a fetch walks the queue's range of the table's
-- own B-tree in id order, and ack, nak, extend and release find their job by id there too. A
-- job is one B-tree entry: a fetch rewrites only its row, an ack deletes only its row. Before,
-- each fetch rewrote the job's entry of queue_next (lease_until was in it) and each ack deleted
-- it, a second B-tree and a second page in every ack's commit.
--
-- last_id is the last id given to the queue; a publish takes the next ones. Ids only grow, so
-- a stale (id, token) can never match a newer job (what AUTOINCREMENT did before). The jobs
-- already queued are renumbered into their queue's range in their order, keeping everything
-- else; a lease held across this migration can then no longer be acked by its old id (the
-- handler rolls back, the job comes again when its lease ends). Processes of an older version
-- must be stopped first: their inserts name no id, and would take one past the end of some other
-- queue's range (which that queue's next publish would then collide with), so the trigger below
-- refuses them.
CREATE TABLE {{prefix}}queue_ranges (
    queue   TEXT    NOT NULL PRIMARY KEY,
    base    INTEGER NOT NULL,
    last_id INTEGER NOT NULL
) WITHOUT ROWID;

INSERT INTO {{prefix}}queue_ranges (queue, base, last_id)
    SELECT queue, (row_number() OVER (ORDER BY queue)) << 44,
        ((row_number() OVER (ORDER BY queue)) << 44) + count(*)
    FROM {{prefix}}queue GROUP BY queue;

CREATE TABLE {{prefix}}queue_053 (
    id               INTEGER PRIMARY KEY,
    queue            TEXT    NOT NULL,
    event_id         TEXT    NOT NULL,
    tenant           TEXT    NOT NULL DEFAULT '',
    type             TEXT    NOT NULL DEFAULT '',
    payload          BLOB,
    headers          TEXT    NOT NULL DEFAULT '{}',
    occurred_at      INTEGER,
    enqueued_at      INTEGER NOT NULL,
    available_at     INTEGER NOT NULL,
    lease_until      INTEGER,
    token            INTEGER NOT NULL DEFAULT 0,
    attempts         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT    NOT NULL DEFAULT '',
    first_fetched_at INTEGER
);

INSERT INTO {{prefix}}queue_053 (id, queue, event_id, tenant, type, payload, headers, occurred_at,
        enqueued_at, available_at, lease_until, token, attempts, last_error, first_fetched_at)
    SELECT r.base + row_number() OVER (PARTITION BY q.queue ORDER BY q.id), q.queue, q.event_id,
        q.tenant, q.type, q.payload, q.headers, q.occurred_at, q.enqueued_at, q.available_at,
        q.lease_until, q.token, q.attempts, q.last_error, q.first_fetched_at
    FROM {{prefix}}queue q JOIN {{prefix}}queue_ranges r ON r.queue = q.queue;

DROP TABLE {{prefix}}queue;
DELETE FROM sqlite_sequence WHERE name = '{{prefix}}queue';
ALTER TABLE {{prefix}}queue_053 RENAME TO {{prefix}}queue;

CREATE TRIGGER {{prefix}}queue_needs_id BEFORE INSERT ON {{prefix}}queue
    WHEN NEW.id IS NULL OR NEW.id < 0
BEGIN
    SELECT RAISE(ABORT, 'idemsqlite: a queue job needs an id from its queue''s range (migration 053): this process runs a version of idem older than the database');
END;
