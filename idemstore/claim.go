package idemstore

import (
	"context"
	"time"

	"github.com/idemkit/idem/idemtype"
)

// Store is the seam between idem and a database. TTx is the transaction type the store's
// driver uses (pgx.Tx for idempg, *sql.Tx for idemsqlite) and the one a handler receives, so
// the handler writes its business change in the very transaction that holds the claim.
// Packages idempg and idemsqlite implement it; package storetest checks an implementation.
type Store[TTx any] interface {
	// Dialect names the database ("postgres", "sqlite") for logs and metrics.
	Dialect() string

	// InTx runs fn in a new transaction and commits it when fn returns nil; any error or panic
	// rolls it back.
	InTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error

	// ClaimTx claims a key inside tx with INSERT … ON CONFLICT DO NOTHING RETURNING. Concurrent
	// claims of one key serialise on the unique key: exactly one sees ClaimNew, the others wait
	// for it to commit or roll back and then see ClaimDuplicate or ClaimConflict (or ClaimNew
	// after a rollback).
	ClaimTx(ctx context.Context, tx TTx, p ClaimParams) (ClaimResult, error)

	// DeleteExpiredClaims deletes up to p.Limit claims created before p.Before and reports how
	// many it deleted; callers loop while the count equals the limit.
	DeleteExpiredClaims(ctx context.Context, p DeleteExpiredClaimsParams) (int, error)

	// ClassifyError recognises the driver's own transient errors (SQLite BUSY/LOCKED); it returns
	// ClassUnknown for anything else.
	ClassifyError(err error) idemtype.Class

	DeadLetterStore
}

// ClaimParams is the input of Store.ClaimTx.
type ClaimParams struct {
	Key         idemtype.Key
	Fingerprint idemtype.Fingerprint
	// Now is the claim's creation time; retention is measured from it.
	Now time.Time
	// Bucket is the start of the event's time bucket (its occurrence time truncated to the
	// store's ClaimBucket) for a partitioned inbox; zero for a plain one. It is informational:
	// a store must never make it part of the key or choose a partition by it, since a re-send
	// of the event may carry another occurrence time (idempg places a claim by Now).
	Bucket time.Time
}

// BucketedStore is a Store whose inbox is partitioned by time and drops whole partitions after
// ClaimRetention. The key stays (tenant, consumer, event_id) alone. The consumer then requires
// each event's occurrence time (Message.OccurredAt, which the outbox always sets) and
// dead-letters as too_old an event older than its Retention.
type BucketedStore interface {
	// ClaimBucket is the bucket width (an hour or a day); 0 means the inbox is not partitioned.
	ClaimBucket() time.Duration
	// ClaimRetention is how long the store keeps partitions; a consumer's Retention may not
	// exceed it.
	ClaimRetention() time.Duration
}

// ClaimStatus is what a claim attempt found.
type ClaimStatus int

const (
	// ClaimNew means the key was free and is now claimed by this transaction.
	ClaimNew ClaimStatus = iota + 1
	// ClaimDuplicate means the key was already claimed with the same fingerprint.
	ClaimDuplicate
	// ClaimConflict means the key was already claimed with another fingerprint (key reuse).
	ClaimConflict
)

func (s ClaimStatus) String() string {
	switch s {
	case ClaimNew:
		return "new"
	case ClaimDuplicate:
		return "duplicate"
	case ClaimConflict:
		return "conflict"
	}
	return "invalid"
}

// ClaimResult is the output of Store.ClaimTx.
type ClaimResult struct {
	Status ClaimStatus
	// Existing is the stored fingerprint when Status is ClaimDuplicate or ClaimConflict.
	Existing idemtype.Fingerprint
	// ClaimedAt is when the existing claim was made (zero for ClaimNew).
	ClaimedAt time.Time
}

// DeleteExpiredClaimsParams is the input of Store.DeleteExpiredClaims.
type DeleteExpiredClaimsParams struct {
	// Consumer restricts deletion to one consumer; empty means all consumers.
	Consumer string
	// Before: claims created strictly before it are deleted.
	Before time.Time
	// Limit bounds one batch (must be > 0).
	Limit int
}

// DeadLetterStore keeps dead letters and the audit trail of what operators did with them.
type DeadLetterStore interface {
	// InsertDeadLetter records a failed delivery. Writing a dead letter again for the same
	// delivery (same consumer, tenant, event id and fingerprint) while one is pending updates
	// the pending row (attempts, error, last failure time) instead of adding another. It returns
	// the row as stored.
	InsertDeadLetter(ctx context.Context, dl idemtype.DeadLetter) (idemtype.DeadLetter, error)

	// GetDeadLetter returns one dead letter, or an error wrapping ErrNotFound naming the id.
	GetDeadLetter(ctx context.Context, id int64) (idemtype.DeadLetter, error)

	// ListDeadLetters returns dead letters matching f, oldest first.
	ListDeadLetters(ctx context.Context, f DeadLetterFilter) ([]idemtype.DeadLetter, error)

	// SetDeadLetterStatus moves dead letters from pending to replayed or discarded and writes one
	// audit row per dead letter, in one transaction. Ids that are not pending are skipped and not
	// returned; it returns the ids it changed.
	SetDeadLetterStatus(ctx context.Context, p SetDeadLetterStatusParams) ([]int64, error)

	// RecordRecovery notes that a replayed event was processed: it sets recovered_at on the
	// replayed dead letters of that key, and on deadLetterID (the replay's Idem-Replay-Of) when
	// it belongs to key and is still pending — the replayer marks a dead letter replayed only
	// after publishing it, so a fast consumer can get there first. It returns the time from
	// each one's first failure to now, one entry per dead letter it marked (empty when none).
	RecordRecovery(ctx context.Context, key idemtype.Key, deadLetterID int64, now time.Time) ([]time.Duration, error)

	// ListAudit returns audit rows, newest first, at most limit (0 means 100).
	ListAudit(ctx context.Context, limit int) ([]AuditEntry, error)

	// DeadLetterStats summarises pending dead letters.
	DeadLetterStats(ctx context.Context) (DeadLetterStats, error)
}

// DeadLetterFilter selects dead letters; zero fields match everything.
type DeadLetterFilter struct {
	IDs      []int64
	Consumer string
	Tenant   string
	// Owner keeps the dead letters of consumers with this owner (ConsumerConfig.Owner).
	Owner  string
	Reason idemtype.Reason
	Status idemtype.DeadLetterStatus
	// OlderThan keeps dead letters whose last failure is before it.
	OlderThan time.Time
	// Limit bounds the result; 0 means 100.
	Limit int
}

// SetDeadLetterStatusParams is the input of DeadLetterStore.SetDeadLetterStatus.
type SetDeadLetterStatusParams struct {
	IDs    []int64
	Status idemtype.DeadLetterStatus // DeadLetterReplayed or DeadLetterDiscarded
	Actor  string
	Reason string
	// Destination is where a replay republished the dead letters (the topic or queue), recorded
	// in the audit; empty for a discard.
	Destination string
	Now         time.Time
}

// AuditEntry is one operator action on the dead-letter queue.
type AuditEntry struct {
	ID           int64
	At           time.Time
	Actor        string
	Action       string // "replay" or "discard"
	DeadLetterID int64
	EventID      string
	Reason       string
	// Destination is where a replay went (the topic or queue); empty for other actions.
	Destination string
}

// DeadLetterStats summarises the pending dead letters.
type DeadLetterStats struct {
	Pending int64
	// OldestPending is the first failure time of the oldest pending dead letter (zero if none).
	OldestPending time.Time
	// ByReason counts pending dead letters per reason.
	ByReason map[idemtype.Reason]int64
}

// BatchStore is a Store that can process many events in one transaction: one multi-row
// INSERT … ON CONFLICT DO NOTHING RETURNING claims them all, and each new event's handler runs
// in its own savepoint so that one failing event rolls back alone. One commit per batch instead
// of one per event is how a consumer gets past the database's commit rate without giving up
// exactly-once.
type BatchStore[TTx any] interface {
	Store[TTx]
	// ClaimBatchTx claims every key inside tx and returns one result per param, in order. The
	// keys must be distinct.
	ClaimBatchTx(ctx context.Context, tx TTx, ps []ClaimParams) ([]ClaimResult, error)
	// SavepointTx runs fn inside a savepoint of tx: an error from fn (or a panic) rolls back to
	// the savepoint and is returned, leaving the rest of tx intact.
	SavepointTx(ctx context.Context, tx TTx, fn func(ctx context.Context, tx TTx) error) error
	// ReleaseClaimTx deletes a claim made earlier in tx, for an event whose handler failed.
	ReleaseClaimTx(ctx context.Context, tx TTx, key idemtype.Key) error
}

// TxEndChecker is implemented by a BatchStore that can tell cheaply (without a network round
// trip) whether a batch's tx has ended behind idem's back (idempg: the connection reports no
// open transaction; idemsqlite: a marker savepoint is gone). The batch path asks it after every
// handler, so a handler that ended the transaction and returned nil aborts the batch before the
// next handler runs outside it.
type TxEndChecker[TTx any] interface {
	// TxEnded reports whether tx is no longer open on its connection.
	TxEnded(tx TTx) bool
}

// IgnoreStore is a Store that records ignored events in its audit trail. The three stores
// implement it; with a store that does not, an ignored event keeps its claim and is logged
// and observed, but leaves no audit row.
type IgnoreStore[TTx any] interface {
	// RecordIgnoreTx writes the audit row of an ignored event inside tx, the transaction that
	// holds the event's claim, so both commit together.
	RecordIgnoreTx(ctx context.Context, tx TTx, p RecordIgnoreParams) error
}

// RecordIgnoreParams is the input of IgnoreStore.RecordIgnoreTx.
type RecordIgnoreParams struct {
	Key    idemtype.Key
	Reason string
	Now    time.Time
}

// ClaimGarbageCollector is the part of a Store that deletes expired claims.
type ClaimGarbageCollector interface {
	DeleteExpiredClaims(ctx context.Context, p DeleteExpiredClaimsParams) (int, error)
}
