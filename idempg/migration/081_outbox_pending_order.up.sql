-- A relay fetches the next rows of its partitions in id order. Through outbox_pending
-- (partition, id) that means reading every pending row of those partitions and sorting them for
-- each batch: a round costs as much as the backlog. Walking this index in id order and skipping
-- the rows of other partitions stops after the batch (about a batch times the number of relays
-- sharing the outbox), so a round costs the same with a million rows waiting as with a hundred.
CREATE INDEX IF NOT EXISTS "{{prefix}}outbox_pending_id"
    ON "{{schema}}"."{{prefix}}outbox" (id)
    WHERE published_at IS NULL AND NOT dead;
