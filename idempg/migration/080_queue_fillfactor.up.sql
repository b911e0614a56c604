-- A fetch updates a job's lease, token and attempts, none of them indexed: with room left on its
-- page the update is HOT (no new index entries, no page of its own), so a fetch writes one page
-- instead of three. New pages keep half free for that; a queue's rows are short-lived, so the
-- space costs little. Existing pages get the room as they are vacuumed and refilled.
ALTER TABLE "{{schema}}"."{{prefix}}queue" SET (fillfactor = 50);
