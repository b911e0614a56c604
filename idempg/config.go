package idempg

import (
	"fmt"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// Defaults for Config.
const (
	// SchemaDefault is the schema idem's tables live in when Config.Schema is empty.
	SchemaDefault = "public"
	// PrefixDefault starts the name of every table, index and notification channel the store
	// uses, so idem's tables sit beside the application's without clashing.
	PrefixDefault = "idem_"
	// identMaxLen bounds Schema and Prefix: a prefix of this length plus the longest suffix the
	// store appends ("claims_p2026113013", "claims_bucket_hour") still fits PostgreSQL's 63-byte
	// identifiers, so no name is truncated.
	identMaxLen = 41

	// PartitionAheadDayDefault is how far ahead day partitions exist when Partition.Ahead is 0.
	PartitionAheadDayDefault = 7 * 24 * time.Hour
	// PartitionAheadHourDefault is how far ahead hour partitions exist when Partition.Ahead is 0.
	PartitionAheadHourDefault = 48 * time.Hour
	// PartitionLockTimeoutDefault bounds how long one partition statement waits for a lock.
	PartitionLockTimeoutDefault = 10 * time.Second
	// partitionsMax bounds the partitions one configuration keeps: every claim that cannot be
	// pruned to one partition (a release in a batch) visits them all.
	partitionsMax = 5000
)

// Config configures a Store. Zero fields take the documented defaults (see WithDefaults).
type Config struct {
	// Schema holds idem's tables (default SchemaDefault, "public"); Migrate creates it when it is
	// missing. It must be an SQL identifier: a letter or underscore, then up to 40 letters, digits
	// or underscores. It is quoted in SQL, so its case is kept. Tests use a schema per test.
	Schema string
	// Prefix starts the name of every table and index (default PrefixDefault, "idem_") and of
	// the notification channels {Prefix}queue and {Prefix}outbox. It must be an SQL identifier
	// like Schema; an empty Prefix takes the default.
	Prefix string
	// OutboxPartitions is the number of partitions outbox rows are hashed into (default
	// idemstore.OutboxPartitionsDefault). It is fixed per database: changing it re-hashes ordering
	// keys and breaks per-key order for rows already enqueued.
	OutboxPartitions int
	// Partition chooses the partitioned inbox layout; the zero value keeps the plain claims table.
	Partition PartitionConfig
}

// PartitionConfig turns the claims table into one range-partitioned by the claim's creation
// time (the consumer's now) truncated to Bucket, in UTC. The key stays (tenant, consumer,
// event_id) alone: a claim takes an advisory lock on its key and looks for it in every live
// partition before inserting, so deliveries of one event apply once whatever their
// OccurredAt and whichever bucket the first claim went to. Retention then drops whole
// partitions (DropExpiredPartitions) instead of deleting rows: a claim lives at least Retention
// after its creation. Partitions are created ahead of time (EnsurePartitions). Transactions
// must run at READ COMMITTED (PostgreSQL's default): the store refuses a higher default
// isolation.
//
// The layout is fixed when Migrate creates the table: Migrate refuses a database whose claims
// table has another layout or bucket width than this config.
//
// A claim looks up its key in every partition (one primary-key probe each), so the claim's
// cost grows with the number of partitions: prefer day buckets for a long retention.
type PartitionConfig struct {
	// Bucket is the partition width: 0 keeps the plain table (the default), time.Hour or
	// 24*time.Hour partitions it. Anything else is refused.
	Bucket time.Duration
	// Ahead is how far past now partitions exist (default PartitionAheadDayDefault for day
	// buckets, PartitionAheadHourDefault for hour buckets; at least one Bucket). A claim for a
	// bucket without a partition fails with ErrPartitionMissing, which is transient.
	Ahead time.Duration
	// Retention is required when Bucket is set: partitions whose upper bound is at or before
	// now - Retention are dropped, and Migrate creates partitions back to that horizon. It must
	// be at least the Retention of every consumer of the store (plus any clock skew between the
	// hosts), since a consumer only refuses an event as too_old once it is older than its own
	// Retention.
	Retention time.Duration
	// LockTimeout bounds how long one partition statement (attach, detach, drop) waits for a
	// lock, so maintenance never queues behind a long transaction indefinitely (default
	// PartitionLockTimeoutDefault). A detach that times out is finished by the next run.
	LockTimeout time.Duration
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Schema == "" {
		c.Schema = SchemaDefault
	}
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
	if c.OutboxPartitions == 0 {
		c.OutboxPartitions = idemstore.OutboxPartitionsDefault
	}
	if p := &c.Partition; p.Bucket != 0 {
		if p.Ahead == 0 {
			switch p.Bucket {
			case 24 * time.Hour:
				p.Ahead = PartitionAheadDayDefault
			case time.Hour:
				p.Ahead = PartitionAheadHourDefault
			}
		}
		if p.LockTimeout == 0 {
			p.LockTimeout = PartitionLockTimeoutDefault
		}
	}
	return c
}

// validate reports the first invalid field, naming it and its value. Schema and Prefix are
// pasted into SQL, so nothing but plain identifiers may pass.
func (c Config) validate() error {
	if c.Schema == "" || !validIdent(c.Schema) {
		return fmt.Errorf("idempg: Config.Schema %q is not an SQL identifier "+
			"(want a letter or underscore, then up to 40 letters, digits or underscores)", c.Schema)
	}
	if !validIdent(c.Prefix) {
		return fmt.Errorf("idempg: Config.Prefix %q is not an SQL identifier "+
			"(want a letter or underscore, then up to 40 letters, digits or underscores)", c.Prefix)
	}
	if c.OutboxPartitions < 1 {
		return fmt.Errorf("idempg: Config.OutboxPartitions is %d, want at least 1", c.OutboxPartitions)
	}
	return c.Partition.validate()
}

// validate reports the first invalid Partition field, naming it.
func (p PartitionConfig) validate() error {
	if p.Bucket == 0 {
		if p != (PartitionConfig{}) {
			return fmt.Errorf("idempg: Config.Partition has Ahead %v, Retention %v, LockTimeout %v but Bucket 0, "+
				"which keeps the plain claims table: set Partition.Bucket to time.Hour or 24*time.Hour to partition it",
				p.Ahead, p.Retention, p.LockTimeout)
		}
		return nil
	}
	if p.Bucket != time.Hour && p.Bucket != 24*time.Hour {
		return fmt.Errorf("idempg: Config.Partition.Bucket is %v, want 0 (the plain claims table), 1h or 24h", p.Bucket)
	}
	if p.Retention <= 0 {
		return fmt.Errorf("idempg: Config.Partition.Retention is %v, want the claims' retention "+
			"(at least every consumer's Retention) when Partition.Bucket is set", p.Retention)
	}
	if p.Ahead < p.Bucket {
		return fmt.Errorf("idempg: Config.Partition.Ahead is %v, want at least Partition.Bucket (%v) "+
			"so the next partition exists before it is needed", p.Ahead, p.Bucket)
	}
	if p.LockTimeout < 0 {
		return fmt.Errorf("idempg: Config.Partition.LockTimeout is %v, want > 0", p.LockTimeout)
	}
	if n := (p.Retention+p.Ahead)/p.Bucket + 2; n > partitionsMax {
		return fmt.Errorf("idempg: Config.Partition.Retention (%v) + Ahead (%v) in %v buckets is %d partitions, want at most %d "+
			"(use day buckets for a long retention)", p.Retention, p.Ahead, p.Bucket, n, partitionsMax)
	}
	return nil
}

// validIdent reports whether s matches ^[A-Za-z_][A-Za-z0-9_]{0,40}$ or is empty.
func validIdent(s string) bool {
	if len(s) > identMaxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
