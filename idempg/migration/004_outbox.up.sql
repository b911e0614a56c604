-- The transactional outbox: producers insert in their own transaction, relays publish. Rows
-- are hashed into partitions by ordering key, and one relay owns a partition at a time.
CREATE TABLE IF NOT EXISTS "{{schema}}"."{{prefix}}outbox" (
    id              bigserial   PRIMARY KEY,
    partition       integer     NOT NULL,
    event_id        text        NOT NULL,
    tenant          text        NOT NULL DEFAULT '',
    topic           text        NOT NULL,
    ordering_key    text        NOT NULL DEFAULT '',
    type            text        NOT NULL DEFAULT '',
    payload         bytea,
    headers         jsonb       NOT NULL DEFAULT '{}',
    occurred_at     timestamptz,
    created_at      timestamptz NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text        NOT NULL DEFAULT '',
    next_attempt_at timestamptz NOT NULL,
    published_at    timestamptz,
    dead            boolean     NOT NULL DEFAULT false
);

-- What a relay fetches: the unpublished, live rows of its partitions, in enqueue order.
CREATE INDEX IF NOT EXISTS "{{prefix}}outbox_pending"
    ON "{{schema}}"."{{prefix}}outbox" (partition, id)
    WHERE published_at IS NULL AND NOT dead;

-- Cleanup deletes published rows by age.
CREATE INDEX IF NOT EXISTS "{{prefix}}outbox_published"
    ON "{{schema}}"."{{prefix}}outbox" (published_at)
    WHERE published_at IS NOT NULL;

-- Leases: named, expiring ownership (relay partitions, relay membership). The token increases
-- every time the lease changes owner.
CREATE TABLE IF NOT EXISTS "{{schema}}"."{{prefix}}leases" (
    name        text        PRIMARY KEY,
    owner       text        NOT NULL,
    token       bigint      NOT NULL,
    lease_until timestamptz NOT NULL
);
