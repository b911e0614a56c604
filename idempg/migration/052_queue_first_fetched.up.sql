-- When a job was first fetched, so that a consumer's retry budget (elapsed time) counts from the
-- first attempt even when the process that made it is gone. A fetch sets it once (COALESCE); a
-- release that takes the job's only attempt back clears it. NULL: never fetched, or fetched
-- before this migration (the next fetch sets it). No index reads it, so updates stay HOT.
ALTER TABLE "{{schema}}"."{{prefix}}queue" ADD COLUMN IF NOT EXISTS first_fetched_at timestamptz;
