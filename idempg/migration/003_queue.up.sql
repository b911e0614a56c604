-- The queue table: the embedded broker in the application's own database. A fetch leases a row
-- until lease_until and increments its fencing token; ack, nak and extend must present the
-- token, so a worker that lost its lease can neither ack nor commit over its successor.
CREATE TABLE IF NOT EXISTS "{{schema}}"."{{prefix}}queue" (
    id           bigserial   PRIMARY KEY,
    queue        text        NOT NULL,
    event_id     text        NOT NULL,
    tenant       text        NOT NULL DEFAULT '',
    type         text        NOT NULL DEFAULT '',
    payload      bytea,
    headers      jsonb       NOT NULL DEFAULT '{}',
    occurred_at  timestamptz,
    enqueued_at  timestamptz NOT NULL,
    available_at timestamptz NOT NULL,
    lease_until  timestamptz,
    token        bigint      NOT NULL DEFAULT 0,
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text        NOT NULL DEFAULT ''
);

CREATE INDEX IF NOT EXISTS "{{prefix}}queue_fetch"
    ON "{{schema}}"."{{prefix}}queue" (queue, available_at, id);
