package idempg

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// The Store implements these interfaces; the compiler checks it here.
var (
	_ idemstore.Store[pgx.Tx]        = (*Store)(nil)
	_ idemstore.QueueTxStore[pgx.Tx] = (*Store)(nil)
	_ idemstore.OutboxStore[pgx.Tx]  = (*Store)(nil)
	_ idemstore.Migrator             = (*Store)(nil)
)

const (
	// claimAttempts bounds how often ClaimTx retries when the claim it conflicted with vanished
	// (garbage-collected) before it could read it.
	claimAttempts = 3
	// rollbackTimeout bounds the rollback after a failed or cancelled transaction.
	rollbackTimeout = 5 * time.Second
)

// Store is idem's PostgreSQL store: it implements idemstore.Store, idemstore.QueueTxStore,
// idemstore.OutboxStore and idemstore.Migrator over pgx.Tx. It is safe for concurrent use.
//
// Once something waits (QueueWait, OutboxWait), the Store takes one connection out of the pool
// for LISTEN and keeps it until Close, so it may use one connection more than the pool's
// MaxConns.
type Store struct {
	pool       *pgxpool.Pool
	cfg        Config
	q          queries
	migrations []migration
	// migrateLock is the pg_advisory_xact_lock key that serialises migrators of this schema and
	// prefix.
	migrateLock int64
	// listen is the shared LISTEN connection behind QueueWait and OutboxWait.
	listen *listener

	// bucket is Config.Partition.Bucket: 0 for the plain claims table.
	bucket time.Duration
	// partitionLock is the advisory lock key that serialises partition maintenance.
	partitionLock int64
	// onDemand creates missing partitions in the background after a claim found none.
	onDemand *onDemand
	// plainChecked records that DeleteExpiredClaims found a plain claims table, as configured.
	plainChecked atomic.Bool
	// acks holds, per transaction InTx began (pgx.Tx), the queue acks to delete with its
	// COMMIT (*txAcks).
	acks sync.Map
}

// New returns a Store on pool with the default Config (schema "public", prefix "idem_").
func New(pool *pgxpool.Pool) *Store {
	s, err := NewWithConfig(pool, Config{})
	if err != nil {
		// The default Config is valid and the embedded migrations parse; this cannot happen.
		panic(err)
	}
	return s
}

// NewWithConfig returns a Store on pool with cfg (zero fields take their defaults), or an error
// naming the invalid field. The pool stays the caller's: Close does not close it.
func NewWithConfig(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	migs, err := loadMigrations(cfg.Schema, cfg.Prefix, cfg.Partition.Bucket)
	if err != nil {
		return nil, err
	}
	if cfg.Partition.Bucket != 0 && pool != nil {
		if level := pool.Config().ConnConfig.RuntimeParams["default_transaction_isolation"]; level != "" &&
			!strings.EqualFold(strings.TrimSpace(level), "read committed") {
			return nil, fmt.Errorf("idempg: Config.Partition is set, but the pool's RuntimeParams set default_transaction_isolation to %q: %w",
				level, isolationError(level))
		}
	}
	q := buildQueries(cfg.Schema, cfg.Prefix, cfg.Partition.Bucket != 0)
	return &Store{
		pool:          pool,
		cfg:           cfg,
		q:             q,
		migrations:    migs,
		migrateLock:   advisoryKey("idem migrate " + cfg.Schema + "." + cfg.Prefix),
		listen:        newListener(pool, q),
		bucket:        cfg.Partition.Bucket,
		partitionLock: advisoryKey("idem partitions " + cfg.Schema + "." + cfg.Prefix),
		onDemand:      newOnDemand(),
	}, nil
}

// Pool returns the pool the store works on.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Config returns the store's configuration with defaults applied.
func (s *Store) Config() Config { return s.cfg }

// Close stops the shared LISTEN connection behind QueueWait and OutboxWait, if it was started,
// and wakes their waiters, and stops a background partition creation (ErrPartitionMissing). It
// does not close the pool, which belongs to the caller. Close the Store before the pool; waits
// after Close poll.
func (s *Store) Close() error {
	s.listen.close()
	s.onDemand.close()
	return nil
}

// Dialect returns "postgres".
func (s *Store) Dialect() string { return "postgres" }

// InTx runs fn in a new transaction, at the database's default isolation (normally READ
// COMMITTED, which ClaimTx expects), and commits it when fn returns nil, unless fn ended the
// transaction itself (an error wrapping idem.ErrTxEnded). An error from fn rolls
// back and is returned as is; a panic rolls back and keeps panicking. The rollback runs even
// when ctx has ended, so the connection goes back to the pool clean.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("idempg: begin transaction: %w", err)
	}
	// Released last, after the commit or the rollback: the pool keeps a connection only when
	// no transaction is left open on it.
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("idempg: begin transaction: %w", err)
	}
	done := false
	acks, forget := s.deferAcks(tx)
	defer forget()
	defer func() {
		if !done {
			// fn failed or panicked (a panic goes on after this deferred call), or the acks'
			// check failed before the commit ran.
			rollback(ctx, tx)
		}
	}()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	if s.TxEnded(tx) {
		// A statement of fn ended the transaction (ROLLBACK, COMMIT): a COMMIT now would
		// succeed with a warning and report work as committed that was not, or not with it.
		return fmt.Errorf("idempg: commit: %w", idem.ErrTxEnded)
	}
	if ids, tokens := acks.take(); len(ids) > 0 {
		return s.commitAcks(ctx, tx, ids, tokens, &done)
	}
	done = true // Commit ends the transaction whatever it returns.
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("idempg: commit: %w", err)
	}
	return nil
}

// rollback rolls tx back on a context that survives ctx's end but not forever.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(rctx)
}

// fingerprintBytes passes a Fingerprint to pgx as a bytea and scans one back, without an
// intermediate slice (pgtype.BytesValuer and pgtype.BytesScanner).
type fingerprintBytes struct {
	fp idem.Fingerprint
}

// BytesValue implements pgtype.BytesValuer.
func (f *fingerprintBytes) BytesValue() ([]byte, error) { return f.fp[:], nil }

// ScanBytes implements pgtype.BytesScanner.
func (f *fingerprintBytes) ScanBytes(v []byte) error {
	if len(v) != len(f.fp) {
		return fmt.Errorf("stored fingerprint has %d bytes, want %d", len(v), len(f.fp))
	}
	copy(f.fp[:], v)
	return nil
}

var (
	_ pgtype.BytesValuer  = (*fingerprintBytes)(nil)
	_ pgtype.BytesScanner = (*fingerprintBytes)(nil)
)

// claimCall holds one ClaimTx's arguments and scan targets in a single allocation. pgx gets
// pointers to pgtype values, which go into interfaces without allocating and encode and scan
// without pgx's reflection wrappers; plain strings and a time.Time would cost an allocation
// each.
type claimCall struct {
	tenant, consumer, eventID pgtype.Text
	fp                        fingerprintBytes
	now, bucket               pgtype.Timestamptz
	// args is (tenant, consumer, event_id, fingerprint, now) for the plain table and
	// (tenant, consumer, event_id, bucket, fingerprint, now) for the partitioned one, so the
	// key is always a prefix of it.
	args []any
	key  []any
	buf  [6]any

	inserted  bool
	stored    fingerprintBytes
	createdAt pgtype.Timestamptz
	dest      [3]any
}

// newClaimCall prepares the claim of p at now, in bucket when the table is partitioned.
func newClaimCall(p idemstore.ClaimParams, now time.Time, partitioned bool, bucket time.Time) *claimCall {
	c := &claimCall{
		tenant:   pgtype.Text{String: p.Key.Tenant, Valid: true},
		consumer: pgtype.Text{String: p.Key.Consumer, Valid: true},
		eventID:  pgtype.Text{String: p.Key.EventID, Valid: true},
		fp:       fingerprintBytes{fp: p.Fingerprint},
		now:      pgtype.Timestamptz{Time: now, Valid: true},
	}
	if !partitioned {
		c.buf = [6]any{&c.tenant, &c.consumer, &c.eventID, &c.fp, &c.now}
		c.args, c.key = c.buf[:5], c.buf[:3]
	} else {
		c.bucket = pgtype.Timestamptz{Time: bucket, Valid: true}
		c.buf = [6]any{&c.tenant, &c.consumer, &c.eventID, &c.bucket, &c.fp, &c.now}
		c.args, c.key = c.buf[:6], c.buf[:4]
	}
	c.dest = [3]any{&c.inserted, &c.stored, &c.createdAt}
	return c
}

// ClaimTx claims p.Key inside tx in one round trip: INSERT … ON CONFLICT DO NOTHING RETURNING,
// with the existing claim read by the same statement. Concurrent claims of one key serialise
// on the primary key. When the claim that won committed while this statement waited for it,
// the statement's snapshot cannot see it, and a second statement (READ COMMITTED: a new
// snapshot) reads it. If that finds nothing, the claim was garbage-collected in between and the
// insert is tried again.
//
// On a partitioned store the key is still (tenant, consumer, event_id) alone: see
// claimPartitioned. p.Bucket is ignored.
//
// Under REPEATABLE READ or SERIALIZABLE, PostgreSQL reports that race as a serialization
// failure (SQLSTATE 40001), which idem.Classify treats as transient.
func (s *Store) ClaimTx(ctx context.Context, tx pgx.Tx, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	if p.Key.EventID == "" {
		return idemstore.ClaimResult{}, fmt.Errorf("idempg: claim %s: event id is empty", p.Key)
	}
	now := p.Now
	if now.IsZero() {
		now = time.Now().UTC()
	}
	if s.bucket != 0 {
		return s.claimPartitioned(ctx, tx, p, now)
	}
	c := newClaimCall(p, now, false, time.Time{})
	for range claimAttempts {
		err := tx.QueryRow(ctx, s.q.claim, c.args...).Scan(c.dest[:]...)
		if err == nil {
			if c.inserted {
				return idemstore.ClaimResult{Status: idemstore.ClaimNew}, nil
			}
			return claimFound(p, c.stored.fp, c.createdAt), nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			if isPartitionedTable(err) {
				err = fmt.Errorf("%w: %w", errPartitionedTable, err)
			}
			return idemstore.ClaimResult{}, fmt.Errorf("idempg: claim: %w", err)
		}
		err = tx.QueryRow(ctx, s.q.claimSelect, c.key...).Scan(c.dest[1:]...)
		if err == nil {
			return claimFound(p, c.stored.fp, c.createdAt), nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return idemstore.ClaimResult{}, fmt.Errorf("idempg: read claim: %w", err)
		}
		// The claim we waited for is gone again: deleted by garbage collection. Claim anew.
	}
	return idemstore.ClaimResult{}, fmt.Errorf("idempg: claim: the existing claim vanished %d times in a row",
		claimAttempts)
}

// claimPartitioned is ClaimTx on a partitioned inbox. The key is (tenant, consumer, event_id)
// alone, and a new claim goes to the partition of its own creation time (now), never of the
// event's time, which a re-send can change. The primary key includes the bucket, so it cannot
// serialise claims of one key made in different buckets; a transaction-scoped advisory lock on
// a hash of the key does. One pipelined round trip sends two statements: the lock, and then
// (after it is granted, with a fresh READ COMMITTED snapshot) a lookup of the key in every live
// partition with an insert when none has it. The lock statement also reads the transaction's
// isolation level: above READ COMMITTED the lookup would use a snapshot from before the lock
// and could miss a claim committed meanwhile, so such a claim is refused (errIsolation).
func (s *Store) claimPartitioned(ctx context.Context, tx pgx.Tx, p idemstore.ClaimParams, now time.Time) (idemstore.ClaimResult, error) {
	bucket := now.UTC().Truncate(s.bucket)
	c := newClaimCall(p, now, true, bucket)
	var isolation string
	b := &pgx.Batch{}
	b.Queue(s.q.claimLock, s.keyLock(p.Key)).QueryRow(func(row pgx.Row) error { return row.Scan(&isolation) })
	b.Queue(s.q.claim, c.args...).QueryRow(func(row pgx.Row) error { return row.Scan(c.dest[:]...) })
	err := tx.SendBatch(ctx, b).Close()
	if isolation != "" && isolation != "read committed" {
		return idemstore.ClaimResult{}, fmt.Errorf("idempg: claim: %w", isolationError(isolation))
	}
	for attempt := 1; ; attempt++ {
		if err == nil {
			if c.inserted {
				return idemstore.ClaimResult{Status: idemstore.ClaimNew}, nil
			}
			return claimFound(p, c.stored.fp, c.createdAt), nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			if isMissingPartition(err) {
				return idemstore.ClaimResult{}, s.missingPartition(err, "claim", bucket)
			}
			return idemstore.ClaimResult{}, fmt.Errorf("idempg: claim: %w", err)
		}
		if attempt == claimAttempts {
			return idemstore.ClaimResult{}, fmt.Errorf("idempg: claim: the existing claim vanished %d times in a row",
				claimAttempts)
		}
		// The insert met a claim of the key in its bucket that the lookup did not see: one
		// made without the lock (an older version of idem), or one garbage collection removed
		// meanwhile. The lock is held; look again with a fresh snapshot.
		err = tx.QueryRow(ctx, s.q.claim, c.args...).Scan(c.dest[:]...)
	}
}

// keyLock is the advisory lock key of a claim key: a 64-bit FNV-1a hash of the store's schema
// and prefix and the key's parts. A collision only makes two keys wait for each other.
func (s *Store) keyLock(k idem.Key) int64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for _, part := range [...]string{s.cfg.Schema, s.cfg.Prefix, k.Tenant, k.Consumer, k.EventID} {
		for i := 0; i < len(part); i++ {
			h ^= uint64(part[i])
			h *= prime
		}
		h ^= 0xff // a separator no UTF-8 text contains
		h *= prime
	}
	return int64(h)
}

// errIsolation is wrapped by a partitioned claim in a transaction above READ COMMITTED.
var errIsolation = errors.New("the partitioned inbox needs READ COMMITTED transactions")

// isolationError explains errIsolation with the level found.
func isolationError(level string) error {
	return fmt.Errorf("%w, and this one is %s: a claim looks for its key in every partition after taking the "+
		"key's lock, which needs a snapshot taken after the lock; set default_transaction_isolation to "+
		"'read committed' for idem's connections (pool RuntimeParams, ALTER ROLE or ALTER DATABASE)", errIsolation, strings.ToUpper(level))
}

// claimFound reports an existing claim as a duplicate or, with another fingerprint, a conflict.
func claimFound(p idemstore.ClaimParams, existing idem.Fingerprint, at pgtype.Timestamptz) idemstore.ClaimResult {
	res := idemstore.ClaimResult{Status: idemstore.ClaimDuplicate, Existing: existing, ClaimedAt: timeOf(at)}
	if existing != p.Fingerprint {
		res.Status = idemstore.ClaimConflict
	}
	return res
}

// DeleteExpiredClaims deletes up to p.Limit claims created before p.Before (of p.Consumer, or of
// every consumer when it is empty) in one statement, and reports how many it deleted.
//
// On a partitioned store retention is by partition and store-wide. It drops the partitions
// expired both by p.Before and by Config.Partition.Retention, for every consumer (a partition
// holds them all), and reports how many claims they held, which may exceed p.Limit; the next
// call finds none left, which ends idem.CollectGarbage's loop. It then creates the partitions
// ahead (EnsurePartitions), so a deployment's periodic garbage collection keeps the inbox ready.
//
// A plain store refuses (once it has checked) a claims table that is partitioned: its batched
// delete addresses rows by ctid, which is unique per partition only.
func (s *Store) DeleteExpiredClaims(ctx context.Context, p idemstore.DeleteExpiredClaimsParams) (int, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("idempg: delete expired claims: Limit is %d, want more than 0", p.Limit)
	}
	if s.bucket != 0 {
		return s.deletePartitionedClaims(ctx, p)
	}
	if !s.plainChecked.Load() {
		if err := s.checkLayout(ctx); err != nil {
			return 0, fmt.Errorf("idempg: delete expired claims: %w", err)
		}
		s.plainChecked.Store(true)
	}
	var (
		tag pgconn.CommandTag
		err error
	)
	if p.Consumer == "" {
		tag, err = s.pool.Exec(ctx, s.q.claimDeleteAll, p.Before, p.Limit)
	} else {
		tag, err = s.pool.Exec(ctx, s.q.claimDeleteConsumer, p.Before, p.Consumer, p.Limit)
	}
	if err != nil {
		return 0, fmt.Errorf("idempg: delete claims of consumer %q before %s: %w",
			p.Consumer, p.Before.UTC().Format(time.RFC3339), err)
	}
	return int(tag.RowsAffected()), nil
}

// ClassifyError reports pgx's own connection failures as transient: a failed connect, an error
// pgx guarantees happened before anything reached the server, a timeout inside pgconn, and a
// connection that was already closed. A claim without a partition (ErrPartitionMissing) is
// transient too, although its SQLSTATE (23514) is a permanent class: the partition is created
// ahead of time or on demand, and the retry finds it. So is a plain store's claim on a
// partitioned claims table, and a partitioned claim in a transaction above READ COMMITTED: a
// configuration to fix, better retried meanwhile than every event dead-lettered. Other SQLSTATEs are left to idem.Classify; anything else is idem.ClassUnknown.
func (s *Store) ClassifyError(err error) idem.Class {
	if err == nil {
		return idem.ClassUnknown
	}
	var ce *pgconn.ConnectError
	switch {
	case errors.Is(err, ErrPartitionMissing), errors.Is(err, errPartitionedTable), errors.Is(err, errIsolation),
		errors.As(err, &ce),
		pgconn.SafeToRetry(err),
		pgconn.Timeout(err),
		errors.Is(err, pgconn.ErrConnClosed):
		return idem.ClassTransient
	}
	return idem.ClassUnknown
}

// orNow returns t, or the current time in UTC when t is zero.
func orNow(t time.Time) time.Time {
	if t.IsZero() {
		return time.Now().UTC()
	}
	return t
}

// nullTime stores a zero time as NULL.
func nullTime(t time.Time) pgtype.Timestamptz {
	return pgtype.Timestamptz{Time: t, Valid: !t.IsZero()}
}

// timeOf reads a nullable timestamp back, NULL as the zero time.
func timeOf(t pgtype.Timestamptz) time.Time {
	if !t.Valid || t.InfinityModifier != pgtype.Finite {
		return time.Time{}
	}
	return t.Time.UTC()
}
