-- The fetch takes the lowest ids of a queue that are available and not leased. The index of 003
-- (queue, available_at, id) served the filter but not the order: SQLite sorted every waiting job
-- in a temp B-tree on each fetch, under the write lock. This one walks a queue in id order and
-- holds the filter columns, so a fetch reads only the jobs it skips (leased or not yet
-- available) and the ones it takes. Nothing else reads the old index.
CREATE INDEX IF NOT EXISTS {{prefix}}queue_next ON {{prefix}}queue (queue, id, available_at, lease_until);
DROP INDEX IF EXISTS {{prefix}}queue_fetch;
