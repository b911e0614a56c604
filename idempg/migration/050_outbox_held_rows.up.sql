-- The relay's retry budget counts from a row's first publish attempt, not its creation (a relay
-- that was down must not dead-letter a row on its first failure), and a dead row holds its key
-- back until an operator replays or discards its dead letter, which dead_letter_id names.
-- Numbered 050 to stay clear of the consumer side's migrations; versions need not be contiguous.
ALTER TABLE "{{schema}}"."{{prefix}}outbox" ADD COLUMN IF NOT EXISTS first_attempt_at timestamptz;
ALTER TABLE "{{schema}}"."{{prefix}}outbox" ADD COLUMN IF NOT EXISTS dead_letter_id bigint;

-- What a relay fetches besides the live rows: the dead rows still holding their keys.
CREATE INDEX IF NOT EXISTS "{{prefix}}outbox_held"
    ON "{{schema}}"."{{prefix}}outbox" (partition, id)
    WHERE published_at IS NULL AND dead AND dead_letter_id IS NOT NULL;
