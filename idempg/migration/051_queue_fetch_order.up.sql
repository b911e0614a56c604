-- The fetch takes the lowest ids of a queue that are available and not leased. The index of 003
-- (queue, available_at, id) served the filter but not the order, so with a backlog PostgreSQL
-- either read and sorted every available job of the queue or walked the primary key past the
-- other queues' jobs on each fetch. This one walks one queue in id order, so a
-- fetch reads only the jobs it skips (leased, locked or not yet available) and the ones it takes.
-- The filter columns stay out of the index: the fetch locks the heap row anyway, and updates of
-- lease_until (every fetch, extend and release) then stay HOT instead of adding index entries.
-- Nothing else reads the old index.
CREATE INDEX IF NOT EXISTS "{{prefix}}queue_next"
    ON "{{schema}}"."{{prefix}}queue" (queue, id);
DROP INDEX IF EXISTS "{{schema}}"."{{prefix}}queue_fetch";
