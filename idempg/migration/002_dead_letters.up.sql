-- Dead letters: deliveries that will not be retried, with everything an operator needs to
-- inspect, replay or discard them.
CREATE TABLE IF NOT EXISTS "{{schema}}"."{{prefix}}dead_letters" (
    id              bigserial   PRIMARY KEY,
    consumer        text        NOT NULL,
    tenant          text        NOT NULL DEFAULT '',
    event_id        text        NOT NULL,
    type            text        NOT NULL DEFAULT '',
    payload         bytea,
    headers         jsonb       NOT NULL DEFAULT '{}',  -- object of string to string
    published_at    timestamptz,
    occurred_at     timestamptz,
    fingerprint     bytea       NOT NULL,  -- 32 zero bytes when not computed, so uniqueness holds
    reason          text        NOT NULL,
    error           text        NOT NULL DEFAULT '',
    attempts        integer     NOT NULL DEFAULT 0,
    first_failed_at timestamptz NOT NULL,
    last_failed_at  timestamptz NOT NULL,
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'replayed', 'discarded')),
    source          text        NOT NULL DEFAULT '',
    recovered_at    timestamptz
);

-- One pending dead letter per delivery: dead-lettering it again updates that row.
CREATE UNIQUE INDEX IF NOT EXISTS "{{prefix}}dl_pending"
    ON "{{schema}}"."{{prefix}}dead_letters" (consumer, tenant, event_id, fingerprint)
    WHERE status = 'pending';

-- Listing by status and age, and the pending statistics.
CREATE INDEX IF NOT EXISTS "{{prefix}}dl_status_last_failed"
    ON "{{schema}}"."{{prefix}}dead_letters" (status, last_failed_at);

-- RecordRecovery finds the replayed dead letters of one key.
CREATE INDEX IF NOT EXISTS "{{prefix}}dl_key"
    ON "{{schema}}"."{{prefix}}dead_letters" (event_id, consumer, tenant);

-- Audit: what operators did with dead letters, and why.
CREATE TABLE IF NOT EXISTS "{{schema}}"."{{prefix}}audit" (
    id             bigserial   PRIMARY KEY,
    at             timestamptz NOT NULL,
    actor          text        NOT NULL,
    action         text        NOT NULL,  -- "replay" or "discard"
    dead_letter_id bigint      NOT NULL,
    event_id       text        NOT NULL,
    reason         text        NOT NULL DEFAULT ''
);
