-- When a job was first fetched (unix microseconds, like the table's other times), so that a
-- consumer's retry budget (elapsed time) counts from the first attempt even when the process
-- that made it is gone. A fetch sets it once (coalesce); a release that takes the job's only
-- attempt back clears it. NULL: never fetched, or fetched before this migration (the next fetch
-- sets it). No index holds it: the fetch plans of 051 are unchanged.
ALTER TABLE {{prefix}}queue ADD COLUMN first_fetched_at INTEGER;
