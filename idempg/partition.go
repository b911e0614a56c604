package idempg

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/idemstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The partitioned inbox (Config.Partition).
//
// Claims live in range partitions of their creation time's bucket (the claim's now, never the
// event's time, which a re-send may change), named
// {prefix}claims_pYYYYMMDD (day buckets) or {prefix}claims_pYYYYMMDDHH (hour buckets) after the
// bucket's start in UTC. Both maintenance operations keep running consumers unblocked, which
// the plain DDL would not:
//
//   - EnsurePartitions creates a partition as a table of its own (CREATE TABLE … LIKE) and then
//     attaches it (ATTACH PARTITION), which takes a SHARE UPDATE EXCLUSIVE lock on the claims
//     table. CREATE TABLE … PARTITION OF takes an ACCESS EXCLUSIVE one instead: it queues
//     behind every open claim transaction and every claim queues behind it.
//   - DropExpiredPartitions detaches a partition with DETACH PARTITION … CONCURRENTLY and then
//     drops the detached table. A DROP TABLE of an attached partition takes an ACCESS EXCLUSIVE
//     lock on the claims table too: measured with four claimers and one 3 s transaction, it
//     stalled every claim for the full 2.8 s, while the concurrent detach kept claims flowing
//     (worst claim 44 ms). The detach still waits for the transactions that may see the
//     partition, but without blocking anyone; CONCURRENTLY needs PostgreSQL 14 and cannot run
//     in a transaction block, so the drop runs on a connection of its own. Dropping a day of
//     200,000 claims under four consumers takes 0.2 to 0.6 s on a loaded two-core test machine
//     (TestPartitionDropUnderLoad in internal/e2e), most of it the wait for in-flight claims.
//
// Every statement runs under Partition.LockTimeout, which bounds the wait for a long
// transaction or for a vacuum of the partition (an anti-wraparound one is not cancelled for
// us). A concurrent detach cut short by it (or by ctx) leaves the partition "detach pending",
// invisible to new claims; the next drop finishes it (DETACH … FINALIZE, which also waits for
// every older snapshot of the database). Maintainers on several hosts serialise on an advisory
// lock.

// ErrPartitionMissing is wrapped by a claim whose bucket (of its creation time) has no
// partition: partitions that were not created in time, or a consumer clock (ConsumerConfig.Now)
// far from the store's. ClassifyError reports it as transient, so the delivery is retried; the
// store also starts creating the partitions of the current window in the background (never one
// for a far-away bucket, which a bad clock could otherwise fill the schema with).
var ErrPartitionMissing = errors.New("idempg: no claims partition for the claim's time bucket")

var _ idemstore.BucketedStore = (*Store)(nil)

// ClaimBucket implements idemstore.BucketedStore: the partition width (Config.Partition.Bucket), or
// 0 for the plain claims table. idem.Consumer then requires each event's OccurredAt (for its
// too_old check); the store places a claim by the claim's own time and ignores the bucket the
// consumer passes.
func (s *Store) ClaimBucket() time.Duration { return s.bucket }

// ClaimRetention is how long partitions are kept (Config.Partition.Retention); a consumer whose
// retention is longer is refused, since it could accept an event whose claim was dropped.
func (s *Store) ClaimRetention() time.Duration { return s.cfg.Partition.Retention }

// The expected columns of the claims table in each layout.
const (
	plainClaimColumns       = "tenant,consumer,event_id,fingerprint,created_at"
	partitionedClaimColumns = "tenant,consumer,event_id,bucket,fingerprint,created_at"
)

// onDemandInterval spaces the background partition creations that failing claims start.
const onDemandInterval = 10 * time.Second

// onDemandTimeout bounds one background partition creation.
const onDemandTimeout = time.Minute

// errNotPartitioned is returned by the partition operations of a plain store.
func errNotPartitioned(op string) error {
	return fmt.Errorf("idempg: %s: the claims table is not partitioned (Config.Partition.Bucket is 0)", op)
}

// partitionLayout is the name format of a partition's bucket.
func (s *Store) partitionLayout() string {
	if s.bucket == time.Hour {
		return "2006010215"
	}
	return "20060102"
}

// partitionName is the name of the partition whose bucket starts at start.
func (s *Store) partitionName(start time.Time) string {
	return s.cfg.Prefix + "claims_p" + start.UTC().Format(s.partitionLayout())
}

// parsePartitionName returns the bucket start a partition name stands for, or false when the
// name is not one of this store's partitions.
func (s *Store) parsePartitionName(name string) (time.Time, bool) {
	digits, ok := strings.CutPrefix(name, s.cfg.Prefix+"claims_p")
	layout := s.partitionLayout()
	if !ok || len(digits) != len(layout) {
		return time.Time{}, false
	}
	if _, err := strconv.ParseUint(digits, 10, 64); err != nil {
		return time.Time{}, false
	}
	t, err := time.ParseInLocation(layout, digits, time.UTC)
	if err != nil || t.Format(layout) != digits {
		return time.Time{}, false
	}
	return t, true
}

// partitionWindow is the first and last bucket start that must have a partition at now: from
// the bucket holding the retention horizon (whose upper bound is past it) to the bucket holding
// now + Ahead.
func (s *Store) partitionWindow(now time.Time) (first, last time.Time) {
	now = now.UTC()
	first = now.Add(-s.cfg.Partition.Retention).Truncate(s.bucket)
	last = now.Add(s.cfg.Partition.Ahead).Truncate(s.bucket)
	return first, last
}

// qualified quotes a table name of the store's schema.
func (s *Store) qualified(name string) string {
	return `"` + s.cfg.Schema + `"."` + name + `"`
}

// lockTimeoutSetting is Partition.LockTimeout as a lock_timeout value (at least 1ms: 0 would
// mean no timeout).
func (s *Store) lockTimeoutSetting() string {
	return strconv.FormatInt(max(s.cfg.Partition.LockTimeout.Milliseconds(), 1), 10) + "ms"
}

// checkLayout refuses a claims table whose layout differs from the config: plain against
// partitioned, or another bucket width. A missing table passes (Migrate creates it).
func (s *Store) checkLayout(ctx context.Context) error {
	var (
		partitioned            bool
		columns, key, bucketBy string
	)
	names := []string{s.cfg.Prefix + "claims_bucket_day", s.cfg.Prefix + "claims_bucket_hour"}
	err := s.pool.QueryRow(ctx, s.q.claimsLayout, s.cfg.Schema, s.cfg.Prefix+"claims", names).
		Scan(&partitioned, &columns, &key, &bucketBy)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	table := s.qualified(s.cfg.Prefix + "claims")
	if err != nil {
		return fmt.Errorf("idempg: read the layout of claims table %s: %w", table, err)
	}
	var width time.Duration
	switch bucketBy {
	case names[0]:
		width = 24 * time.Hour
	case names[1]:
		width = time.Hour
	}
	switch {
	case !partitioned && s.bucket == 0:
		if strings.Contains(","+columns+",", ",bucket,") {
			return fmt.Errorf("idempg: claims table %s has columns (%s), want (%s) for the plain layout", table, columns, plainClaimColumns)
		}
		return nil
	case partitioned && s.bucket == 0:
		return fmt.Errorf("idempg: claims table %s is partitioned (by %s), but Config.Partition.Bucket is 0, "+
			"the plain layout: configure the Partition the table was created with, or use another Schema or Prefix",
			table, describeWidth(width))
	case !partitioned:
		return fmt.Errorf("idempg: claims table %s is a plain table, but Config.Partition.Bucket is %v: "+
			"the layout is chosen when the table is created and Migrate does not convert an existing inbox "+
			"(keep Partition.Bucket 0, or partition a new inbox under another Schema or Prefix)", table, s.bucket)
	case key != "bucket" || columns != partitionedClaimColumns:
		return fmt.Errorf("idempg: claims table %s is partitioned by (%s) with columns (%s), want by (bucket) with (%s)",
			table, key, columns, partitionedClaimColumns)
	case width != s.bucket:
		return fmt.Errorf("idempg: claims table %s is partitioned by %s, but Config.Partition.Bucket is %v: "+
			"another width would put the same event under another key; keep the width the table was created with",
			table, describeWidth(width), s.bucket)
	}
	return nil
}

// describeWidth names a bucket width read back from the database.
func describeWidth(width time.Duration) string {
	switch width {
	case 24 * time.Hour:
		return "day (24h buckets)"
	case time.Hour:
		return "hour (1h buckets)"
	}
	return "an unknown bucket width (no claims_bucket_day or claims_bucket_hour constraint)"
}

// partitionInfo is one table named like a partition of this store.
type partitionInfo struct {
	name  string
	start time.Time
	// attached: a partition of some table; ours: of this store's claims table.
	attached, ours bool
	// pending: a concurrent detach of it was interrupted.
	pending bool
}

// listPartitions returns the tables of the schema named like this store's partitions, in bucket
// order.
func (s *Store) listPartitions(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}) ([]partitionInfo, error) {
	rows, err := q.Query(ctx, s.q.partitionList, s.cfg.Schema, s.cfg.Prefix+"claims_p", s.cfg.Prefix+"claims_q",
		s.qualified(s.cfg.Prefix+"claims"))
	if err != nil {
		return nil, fmt.Errorf("idempg: list claims partitions: %w", err)
	}
	defer rows.Close()
	var parts []partitionInfo
	for rows.Next() {
		var (
			p    partitionInfo
			ours *bool
		)
		if err := rows.Scan(&p.name, &p.attached, &ours, &p.pending); err != nil {
			return nil, fmt.Errorf("idempg: list claims partitions: %w", err)
		}
		p.ours = ours != nil && *ours
		start, ok := s.parsePartitionName(p.name)
		if !ok {
			continue
		}
		p.start = start
		parts = append(parts, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idempg: list claims partitions: %w", err)
	}
	return parts, nil
}

// partitionsPerTx bounds the partitions one transaction of EnsurePartitions creates: one
// transaction each costs a commit per partition (seconds for the 200-odd of an hourly layout),
// one for all holds locks on every new table at once.
const partitionsPerTx = 32

// EnsurePartitions creates the missing partitions from the bucket holding the retention horizon
// (now - Partition.Retention) to the bucket holding now + Partition.Ahead, and reports how many
// it created. It is idempotent and safe to run from several hosts at once, and it does not block
// running claims (see the top of this file). Migrate calls it; run it (or DeleteExpiredClaims,
// which does) at least once per Partition.Ahead, daily for instance. A table of a missing
// partition's name that is not attached (left by an interrupted drop) is attached again: its
// claims are still valid.
func (s *Store) EnsurePartitions(ctx context.Context, now time.Time) (created int, err error) {
	if s.bucket == 0 {
		return 0, errNotPartitioned("EnsurePartitions")
	}
	parts, err := s.listPartitions(ctx, s.pool)
	if err != nil {
		return 0, err
	}
	have := make(map[int64]bool, len(parts))
	for _, p := range parts {
		if p.ours {
			have[p.start.Unix()] = true
		}
	}
	var missing []time.Time
	first, last := s.partitionWindow(now)
	for b := first; !b.After(last); b = b.Add(s.bucket) {
		if !have[b.Unix()] {
			missing = append(missing, b)
		}
	}
	for len(missing) > 0 {
		chunk := missing[:min(len(missing), partitionsPerTx)]
		missing = missing[len(chunk):]
		n, err := s.attachPartitions(ctx, chunk)
		created += n
		if err != nil {
			return created, err
		}
	}
	return created, nil
}

// attachPartitions creates, in one transaction, the partitions of the buckets starting at
// starts that no other maintainer created meanwhile, and reports how many it created.
func (s *Store) attachPartitions(ctx context.Context, starts []time.Time) (int, error) {
	parent := s.qualified(s.cfg.Prefix + "claims")
	made := 0
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		made = 0
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, s.lockTimeoutSetting()); err != nil {
			return fmt.Errorf("idempg: create claims partitions: set lock_timeout: %w", err)
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, s.partitionLock); err != nil {
			return fmt.Errorf("idempg: create claims partitions: lock partition maintenance: %w", err)
		}
		parts, err := s.listPartitions(ctx, tx)
		if err != nil {
			return err
		}
		attached := make(map[int64]bool, len(parts))
		for _, p := range parts {
			if p.ours {
				attached[p.start.Unix()] = true
			}
		}
		for _, start := range starts {
			if attached[start.Unix()] {
				continue
			}
			name := s.qualified(s.partitionName(start))
			// LIKE copies the NOT NULL and CHECK constraints ATTACH requires; ATTACH builds the
			// primary key index on the (empty) table.
			if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+name+
				` (LIKE `+parent+` INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`); err != nil {
				return fmt.Errorf("idempg: create claims partition %s: %w", s.partitionName(start), err)
			}
			if _, err := tx.Exec(ctx, `ALTER TABLE `+parent+` ATTACH PARTITION `+name+` FOR VALUES FROM ('`+
				start.UTC().Format(time.RFC3339)+`') TO ('`+start.Add(s.bucket).UTC().Format(time.RFC3339)+`')`); err != nil {
				return fmt.Errorf("idempg: attach claims partition %s: %w", s.partitionName(start), err)
			}
			made++
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return made, nil
}

// DropExpiredPartitions drops every partition whose upper bound is at or before
// now - Partition.Retention, oldest first, and returns their names. Each is detached
// concurrently, then dropped, so running claims are not blocked (see the top of this file);
// a detach interrupted earlier is finished first, and a detached table left by an earlier
// failure is dropped. Events of a dropped bucket are older than every consumer's Retention (as
// Partition.Retention must be at least that), so the consumer refuses them as too_old.
func (s *Store) DropExpiredPartitions(ctx context.Context, now time.Time) (dropped []string, err error) {
	if s.bucket == 0 {
		return nil, errNotPartitioned("DropExpiredPartitions")
	}
	dropped, _, err = s.dropPartitions(ctx, now.Add(-s.cfg.Partition.Retention), false)
	return dropped, err
}

// dropPartitions drops the partitions whose upper bound is at or before horizon and, when count
// is set, counts the claims they held.
func (s *Store) dropPartitions(ctx context.Context, horizon time.Time, count bool) (dropped []string, rows int64, err error) {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("idempg: drop expired claims partitions: %w", err)
	}
	locked := false
	defer func() {
		// The connection goes back to the pool as it came: unlocked, default lock_timeout.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		var cleanupErr error
		if locked {
			_, cleanupErr = pc.Exec(cctx, `SELECT pg_advisory_unlock($1)`, s.partitionLock)
		}
		if _, err := pc.Exec(cctx, `RESET lock_timeout`); err != nil || cleanupErr != nil {
			_ = pc.Conn().Close(cctx) // the pool discards a closed connection
		}
		pc.Release()
	}()
	// Not SET LOCAL: a concurrent detach runs outside any transaction block.
	if _, err := pc.Exec(ctx, `SELECT set_config('lock_timeout', $1, false)`, s.lockTimeoutSetting()); err != nil {
		return nil, 0, fmt.Errorf("idempg: drop expired claims partitions: set lock_timeout: %w", err)
	}
	if _, err := pc.Exec(ctx, `SELECT pg_advisory_lock($1)`, s.partitionLock); err != nil {
		return nil, 0, fmt.Errorf("idempg: drop expired claims partitions: lock partition maintenance: %w", err)
	}
	locked = true
	parts, err := s.listPartitions(ctx, pc)
	if err != nil {
		return nil, 0, err
	}
	parent := s.qualified(s.cfg.Prefix + "claims")
	for _, p := range parts {
		if (p.attached && !p.ours) || p.start.Add(s.bucket).After(horizon) {
			continue
		}
		name := s.qualified(p.name)
		step := ""
		switch {
		case p.ours && p.pending:
			step = `ALTER TABLE ` + parent + ` DETACH PARTITION ` + name + ` FINALIZE`
		case p.ours:
			step = `ALTER TABLE ` + parent + ` DETACH PARTITION ` + name + ` CONCURRENTLY`
		}
		if step != "" {
			if _, err := pc.Exec(ctx, step); err != nil {
				return dropped, rows, fmt.Errorf("idempg: detach expired claims partition %s: %w", p.name, err)
			}
		}
		var n int64
		if count {
			if err := pc.QueryRow(ctx, `SELECT count(*) FROM `+name).Scan(&n); err != nil {
				return dropped, rows, fmt.Errorf("idempg: count the claims of detached partition %s: %w", p.name, err)
			}
		}
		if _, err := pc.Exec(ctx, `DROP TABLE IF EXISTS `+name); err != nil {
			return dropped, rows, fmt.Errorf("idempg: drop detached claims partition %s: %w", p.name, err)
		}
		dropped = append(dropped, p.name)
		rows += n
	}
	return dropped, rows, nil
}

// deletePartitionedClaims is DeleteExpiredClaims on a partitioned store. The horizon is the
// earlier of p.Before and now - Partition.Retention, so neither a consumer with a shorter
// retention nor a caller's clock drops claims another consumer still needs; p.Consumer cannot
// narrow it, since a partition holds every consumer's claims. Reporting more than p.Limit is
// deliberate: a drop holds no lock that a smaller batch would shorten.
func (s *Store) deletePartitionedClaims(ctx context.Context, p idemstore.DeleteExpiredClaimsParams) (int, error) {
	now := time.Now()
	horizon := now.Add(-s.cfg.Partition.Retention)
	if p.Before.Before(horizon) {
		horizon = p.Before
	}
	_, rows, dropErr := s.dropPartitions(ctx, horizon, true)
	if dropErr != nil {
		return int(rows), dropErr
	}
	if _, err := s.EnsurePartitions(ctx, now); err != nil {
		return int(rows), err
	}
	return int(rows), nil
}

// errPartitionedTable explains a plain store's claim that failed on a partitioned claims table.
var errPartitionedTable = errors.New("the claims table has no key on (tenant, consumer, event_id) alone: " +
	"it was created partitioned, so configure Config.Partition as it was created (Migrate checks this)")

// isPartitionedTable reports a plain store's claim that failed because the claims table is
// partitioned: no unique key matches ON CONFLICT (tenant, consumer, event_id) (SQLSTATE 42P10),
// no partition takes a row without a bucket (23514), or the bucket column is NULL (23502).
func isPartitionedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P10" || isMissingPartition(err) ||
		pgErr.Code == "23502" && pgErr.ColumnName == "bucket")
}

// isMissingPartition reports a row that no partition accepts: SQLSTATE 23514 without a
// constraint name (every CHECK constraint of the claims table has one).
func isMissingPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && pgErr.ConstraintName == ""
}

// missingPartition wraps a claim error that found no partition for bucket in ErrPartitionMissing,
// says why, and starts creating the current window's partitions in the background.
func (s *Store) missingPartition(err error, what string, bucket time.Time) error {
	first, last := s.partitionWindow(time.Now())
	var why string
	switch {
	case bucket.IsZero():
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Detail != "" {
			why = pgErr.Detail + " "
		}
		why += fmt.Sprintf("(a bucket further ahead than Partition.Ahead (%v) is retried until EnsurePartitions reaches it); "+
			"creating the current partitions in the background", s.cfg.Partition.Ahead)
	case bucket.Before(first):
		why = fmt.Sprintf("the claim's time is past the retention horizon (Partition.Retention %v), whose partitions "+
			"are dropped: is the consumer's clock (ConsumerConfig.Now) behind?", s.cfg.Partition.Retention)
	case bucket.After(last):
		why = fmt.Sprintf("the claim's time is further ahead than Partition.Ahead (%v): is the consumer's clock "+
			"(ConsumerConfig.Now) ahead? The claim is retried until EnsurePartitions reaches it", s.cfg.Partition.Ahead)
	default:
		why = "the partitions were not created in time (run EnsurePartitions at least once per Partition.Ahead); " +
			"creating them in the background; retry"
	}
	if last := s.onDemand.lastError(); last != nil {
		why += "; the last background creation failed: " + last.Error()
	}
	s.ensureOnDemand()
	if bucket.IsZero() {
		return fmt.Errorf("idempg: %s: %w: %s: %w", what, ErrPartitionMissing, why, err)
	}
	return fmt.Errorf("idempg: %s: %w: bucket %s (partition %s): %s: %w",
		what, ErrPartitionMissing, bucket.UTC().Format(time.RFC3339), s.partitionName(bucket), why, err)
}

// onDemand runs the background partition creations that claims without a partition start: at
// most one at a time and one per onDemandInterval, stopped by Store.Close.
type onDemand struct {
	mu      sync.Mutex
	running bool
	closed  bool
	last    time.Time
	lastErr error
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func newOnDemand() *onDemand {
	ctx, cancel := context.WithCancel(context.Background())
	return &onDemand{ctx: ctx, cancel: cancel}
}

func (o *onDemand) lastError() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lastErr
}

// ensureOnDemand starts EnsurePartitions in the background unless one runs, one ran within
// onDemandInterval, or the store is closed. It creates only the current window, never the
// bucket of the claim that failed.
func (s *Store) ensureOnDemand() {
	o := s.onDemand
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed || o.running || s.pool == nil || (!o.last.IsZero() && time.Since(o.last) < onDemandInterval) {
		return
	}
	o.running, o.last = true, time.Now()
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		ctx, cancel := context.WithTimeout(o.ctx, onDemandTimeout)
		defer cancel()
		_, err := s.EnsurePartitions(ctx, time.Now())
		o.mu.Lock()
		o.running, o.lastErr = false, err
		o.mu.Unlock()
	}()
}

// close stops a running background creation and waits for it.
func (o *onDemand) close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	o.cancel()
	o.wg.Wait()
}
