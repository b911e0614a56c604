-- Claims, partitioned (Config.Partition): one row per effect applied, in the partition of the
-- claim's creation time truncated to the {{bucket_unit}} in UTC. The key is (tenant, consumer,
-- event_id) alone: a claim takes an advisory lock on the key and looks for it in every
-- partition before inserting (Store.ClaimTx), as the primary key must include the bucket.
-- Retention drops whole partitions instead of deleting rows. This statement creates no
-- partition: Store.EnsurePartitions does (Migrate calls it), and must run at least once per
-- Config.Partition.Ahead (DeleteExpiredClaims runs it too).
CREATE TABLE IF NOT EXISTS "{{schema}}"."{{prefix}}claims" (
    tenant      text        NOT NULL,
    consumer    text        NOT NULL,  -- full name with effect version, "ledger@v1"
    event_id    text        NOT NULL,
    bucket      timestamptz NOT NULL,  -- start of the claim's {{bucket_unit}}, UTC
    fingerprint bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant, consumer, event_id, bucket),
    -- Its name records the bucket width, which Migrate reads back to refuse a store configured
    -- with another one.
    CONSTRAINT "{{prefix}}claims_bucket_{{bucket_unit}}"
        CHECK (bucket = date_trunc('{{bucket_unit}}', bucket, 'UTC'))
) PARTITION BY RANGE (bucket);
