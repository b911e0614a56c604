package idem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
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
	ClassifyError(err error) Class

	DeadLetterStore
}

// ClaimParams is the input of Store.ClaimTx.
type ClaimParams struct {
	Key         Key
	Fingerprint Fingerprint
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
	Existing Fingerprint
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
	InsertDeadLetter(ctx context.Context, dl DeadLetter) (DeadLetter, error)

	// GetDeadLetter returns one dead letter, or an error wrapping ErrNotFound naming the id.
	GetDeadLetter(ctx context.Context, id int64) (DeadLetter, error)

	// ListDeadLetters returns dead letters matching f, oldest first.
	ListDeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error)

	// SetDeadLetterStatus moves dead letters from pending to replayed or discarded and writes one
	// audit row per dead letter, in one transaction. Ids that are not pending are skipped and not
	// returned; it returns the ids it changed.
	SetDeadLetterStatus(ctx context.Context, p SetDeadLetterStatusParams) ([]int64, error)

	// RecordRecovery notes that a replayed event was processed: it sets recovered_at on the
	// replayed dead letters of that key, and on deadLetterID (the replay's Idem-Replay-Of) when
	// it belongs to key and is still pending — the replayer marks a dead letter replayed only
	// after publishing it, so a fast consumer can get there first. It returns the time from
	// each one's first failure to now, one entry per dead letter it marked (empty when none).
	RecordRecovery(ctx context.Context, key Key, deadLetterID int64, now time.Time) ([]time.Duration, error)

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
	Reason Reason
	Status DeadLetterStatus
	// OlderThan keeps dead letters whose last failure is before it.
	OlderThan time.Time
	// Limit bounds the result; 0 means 100.
	Limit int
}

// SetDeadLetterStatusParams is the input of DeadLetterStore.SetDeadLetterStatus.
type SetDeadLetterStatusParams struct {
	IDs    []int64
	Status DeadLetterStatus // DeadLetterReplayed or DeadLetterDiscarded
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
	ByReason map[Reason]int64
}

// QueueStore is the queue table: the embedded broker that lives in the application's own
// database. Rows are leased with a fencing token: every fetch increments the token, and ack,
// nak and extend with an old token fail with ErrLeaseLost, so a worker that lost its lease can
// neither ack over nor commit over the worker that took it.
type QueueStore interface {
	// QueuePublish inserts messages into queue in a transaction of its own.
	QueuePublish(ctx context.Context, queue string, msgs ...Message) error
	// QueueFetch leases up to p.Max available jobs (available_at <= now, lease expired or never
	// taken), ordered by id, using FOR UPDATE SKIP LOCKED where the database has it.
	QueueFetch(ctx context.Context, p QueueFetchParams) ([]QueueJob, error)
	// QueueAck deletes a job if its lease token still matches.
	QueueAck(ctx context.Context, id, token int64) error
	// QueueNak releases a job for another attempt at now+delay, recording the error.
	QueueNak(ctx context.Context, p QueueNakParams) error
	// QueueExtend pushes the job's lease_until to now+lease if its token still matches.
	QueueExtend(ctx context.Context, id, token int64, lease time.Duration) error
	// QueueWait blocks until a job may be available in queue (LISTEN/NOTIFY on PostgreSQL), max
	// elapses or ctx ends. Spurious wake-ups are allowed.
	QueueWait(ctx context.Context, queue string, max time.Duration) error
	// QueueStats reports the backlog (jobs not yet acked) and the oldest job's enqueue time.
	QueueStats(ctx context.Context, queue string) (QueueStats, error)
}

// QueueTxStore is a QueueStore whose writes can join the caller's transaction, so a producer
// enqueues in the same transaction as its business write and a consumer acks in the same
// transaction as its claim.
type QueueTxStore[TTx any] interface {
	QueueStore
	// QueuePublishTx inserts messages into queue inside tx.
	QueuePublishTx(ctx context.Context, tx TTx, queue string, msgs ...Message) error
	// QueueAckTx deletes the job inside tx if its token still matches, else ErrLeaseLost; the
	// row stays locked until tx ends, so a lost lease rolls back the handler's effect.
	QueueAckTx(ctx context.Context, tx TTx, id, token int64) error
}

// QueueSubscriptionStore is a QueueStore with subscriptions: fan-out on the queue table. A
// publish to a topic that has subscriptions inserts one job per subscription, in the queue
// SubscriptionQueue(topic, name), in the same transaction, so each subscription receives every
// event with its own leases, retries and dead letters, and a relay still publishes once. A topic
// without subscriptions keeps one job per message in the queue named like the topic, shared by
// competing consumers. A subscription receives only what is published after it is committed.
type QueueSubscriptionStore interface {
	// QueueSubscribe registers subscription name on topic; registering it again does nothing.
	QueueSubscribe(ctx context.Context, topic, name string) error
	// QueueUnsubscribe removes subscription name of topic and deletes its jobs, in bounded
	// batches; it reports how many jobs it deleted. Removing an unknown subscription does nothing.
	QueueUnsubscribe(ctx context.Context, topic, name string) (int, error)
	// QueueSubscriptions lists the subscriptions of topic, by name.
	QueueSubscriptions(ctx context.Context, topic string) ([]string, error)
}

// SubscriptionSeparator joins a topic and a subscription name into the subscription's queue. Neither
// may contain it, so that the queue of one subscription is never the topic or the subscription
// queue of another.
const SubscriptionSeparator = "#"

// SubscriptionQueue returns the queue that holds subscription name's jobs of topic:
// topic + "#" + name. Publishing to that queue directly reaches this subscription alone (a
// dead letter's replay does). It fails when topic or name is empty or contains the separator.
func SubscriptionQueue(topic, name string) (string, error) {
	switch {
	case topic == "":
		return "", errors.New("idem: subscription: topic is empty")
	case name == "":
		return "", fmt.Errorf("idem: subscription of topic %q: name is empty", topic)
	case strings.Contains(topic, SubscriptionSeparator):
		return "", fmt.Errorf("idem: subscription %q of topic %q: a topic with subscriptions may not contain %q", name, topic, SubscriptionSeparator)
	case strings.Contains(name, SubscriptionSeparator):
		return "", fmt.Errorf("idem: subscription %q of topic %q: the name may not contain %q", name, topic, SubscriptionSeparator)
	}
	return topic + SubscriptionSeparator + name, nil
}

// QueueFetchParams is the input of QueueStore.QueueFetch.
type QueueFetchParams struct {
	Queue string
	Max   int
	Lease time.Duration
	Now   time.Time
}

// QueueJob is one leased queue row.
type QueueJob struct {
	ID      int64
	Token   int64
	Message Message // Attempt is the number of fetches including this one
	// FirstFetchedAt is when the job was first fetched (zero when the store does not record
	// it): the consumer's retry budget counts from it (idemqueue's Delivery is a FirstAttempter).
	FirstFetchedAt time.Time
}

// QueueNakParams is the input of QueueStore.QueueNak.
type QueueNakParams struct {
	ID, Token int64
	Delay     time.Duration
	Error     string
	Now       time.Time
}

// QueueStats describes the backlog of one queue.
type QueueStats struct {
	Backlog int64
	Oldest  time.Time
}

// OutboxStore is the transactional outbox: producers enqueue inside their own transaction and
// a relay publishes. Rows are spread over a fixed number of partitions by a hash of their
// ordering key, so that relays can own partitions and keep per-key order.
type OutboxStore[TTx any] interface {
	// EnqueueTx inserts outgoing events inside the caller's transaction: they commit or roll back
	// with the business write.
	EnqueueTx(ctx context.Context, tx TTx, msgs ...Outgoing) error
	OutboxRelayStore
}

// OutboxRelayStore is the part of the outbox the relay uses; it needs no transaction type.
type OutboxRelayStore interface {
	// OutboxPartitions is the fixed number of partitions rows are hashed into.
	OutboxPartitions() int
	// OutboxFetch returns up to p.Limit unpublished rows of the given partitions in enqueue
	// order (by id), due or not: the relay holds back a key behind a row not yet due. Dead rows
	// that carry a DeadLetterID are returned too, until they are marked published: they hold
	// their key back until an operator replays or discards their dead letter.
	OutboxFetch(ctx context.Context, p OutboxFetchParams) ([]OutboxRow, error)
	// OutboxMarkPublished sets published_at on the rows.
	OutboxMarkPublished(ctx context.Context, ids []int64, at time.Time) error
	// OutboxMarkFailed records a failed publish: attempts, last error, next attempt time, and
	// whether the row is dead (moved out of the relay's way after its budget).
	OutboxMarkFailed(ctx context.Context, p OutboxFailParams) error
	// OutboxDeletePublished deletes up to limit rows published before before; returns the count.
	OutboxDeletePublished(ctx context.Context, before time.Time, limit int) (int, error)
	// OutboxStats reports unpublished rows and the oldest one's creation time.
	OutboxStats(ctx context.Context) (QueueStats, error)
	// OutboxWait blocks until something may have been enqueued, max elapses or ctx ends.
	OutboxWait(ctx context.Context, max time.Duration) error

	LeaseStore
}

// OutboxFetchParams is the input of OutboxRelayStore.OutboxFetch.
type OutboxFetchParams struct {
	Partitions []int
	Limit      int
}

// OutboxRow is one stored outgoing event.
type OutboxRow struct {
	ID            int64
	Partition     int
	Outgoing      Outgoing
	CreatedAt     time.Time
	Attempts      int
	LastError     string
	NextAttemptAt time.Time
	// FirstAttemptAt is when the relay first tried to publish the row (zero until a failed
	// attempt recorded it); the retry budget counts from it, not from CreatedAt.
	FirstAttemptAt time.Time
	// Dead marks a row the relay gave up on; DeadLetterID is its dead letter, whose replay or
	// discard releases the row's key.
	Dead         bool
	DeadLetterID int64
}

// OutboxFailParams is the input of OutboxRelayStore.OutboxMarkFailed.
type OutboxFailParams struct {
	ID            int64
	Attempts      int
	LastError     string
	NextAttemptAt time.Time
	// FirstAttemptAt is stored as the row's first attempt time (the relay passes the one it
	// read, or the current attempt's time on the first failure).
	FirstAttemptAt time.Time
	Dead           bool
	// DeadLetterID links a dead row to its dead letter (0: none).
	DeadLetterID int64
}

// LeaseStore keeps named leases (relay partitions, relay membership) in the database so that
// processes share work without two owning the same thing at once.
type LeaseStore interface {
	// LeaseAcquire takes or renews the named lease for owner until now+ttl. It succeeds when
	// the lease is free, expired, or already owned by owner; the returned token increases every
	// time the lease changes owner.
	LeaseAcquire(ctx context.Context, p LeaseParams) (token int64, ok bool, err error)
	// LeaseRelease gives the lease up if owner holds it.
	LeaseRelease(ctx context.Context, name, owner string) error
	// LeaseList returns the unexpired leases whose names start with prefix.
	LeaseList(ctx context.Context, prefix string, now time.Time) ([]Lease, error)
}

// LeaseParams is the input of LeaseStore.LeaseAcquire.
type LeaseParams struct {
	Name  string
	Owner string
	TTL   time.Duration
	Now   time.Time
}

// Lease is one held lease.
type Lease struct {
	Name       string
	Owner      string
	Token      int64
	LeaseUntil time.Time
}

// Migrator applies a store's embedded, versioned migrations and shows them as plain SQL for
// teams that run their own migration tool.
type Migrator interface {
	// Migrate applies every migration not yet applied, in order, recording each in a version
	// table; running it again is a no-op.
	Migrate(ctx context.Context) error
	// MigrationSQL returns the SQL of all migrations, for the configured schema and prefix.
	MigrationSQL() string
}
