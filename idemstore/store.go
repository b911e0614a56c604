// Package idemstore is the seam between idem and a database, as riverdriver is River's: the
// claims and dead letters the consumer writes (Store, BatchStore, DeadLetterStore and their
// parameters), the queue table (QueueStore), the transactional outbox and its relay
// (OutboxStore, OutboxRelayStore), named leases (LeaseStore) and migrations (Migrator). Stores
// (idempg, idemsqlite, idemmysql) implement it and package storetest checks them; application
// code passes a store to idem.NewConsumer and rarely names these interfaces. The values that
// cross the seam (Message, Key, DeadLetter…) are in package idemtype, so that idem can import
// this package.
package idemstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/idemkit/idem/idemtype"
)

// QueueStore is the queue table: the embedded broker that lives in the application's own
// database. Rows are leased with a fencing token: every fetch increments the token, and ack,
// nak and extend with an old token fail with idemtype.ErrLeaseLost, so a worker that lost its lease can
// neither ack over nor commit over the worker that took it.
type QueueStore interface {
	// QueuePublish inserts messages into queue in a transaction of its own.
	QueuePublish(ctx context.Context, queue string, msgs ...idemtype.Message) error
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
	QueuePublishTx(ctx context.Context, tx TTx, queue string, msgs ...idemtype.Message) error
	// QueueAckTx deletes the job inside tx if its token still matches, else idemtype.ErrLeaseLost; the
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
	// Now is the time the fetch leases from. Leave it zero in production: the store then reads
	// its clock once it can take the leases (LeaseStart). A caller's time, read before the
	// store waited for SQLite's write lock or a free connection, would hand out leases seconds
	// shorter than asked for, or already over, so that another worker takes the job while the
	// first starts on it. Tests with a clock of their own set it.
	Now time.Time
}

// LeaseStart returns the time a fetch leases from: p.Now, or when it is zero the clock read
// now. A store calls it once it holds what its fetch waits for (a lock, a connection).
func (p QueueFetchParams) LeaseStart() time.Time {
	if p.Now.IsZero() {
		return time.Now()
	}
	return p.Now
}

// QueueJob is one leased queue row.
type QueueJob struct {
	ID      int64
	Token   int64
	Message idemtype.Message // Attempt is the number of fetches including this one
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
	EnqueueTx(ctx context.Context, tx TTx, msgs ...idemtype.Outgoing) error
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
	Outgoing      idemtype.Outgoing
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

// OutboxPartitionsDefault is the default number of outbox partitions relays divide among
// themselves. It is fixed per database: changing it re-hashes ordering keys.
const OutboxPartitionsDefault = 16

// OutboxPartition returns the partition of an outgoing event: FNV-1a of its ordering key (its
// event id when the key is empty) modulo n. Events with the same key always share a partition,
// which one relay owns at a time, and that keeps them in order.
func OutboxPartition(o idemtype.Outgoing, n int) int {
	if n <= 1 {
		return 0
	}
	k := o.Key
	if k == "" {
		k = o.EventID
	}
	h := fnv.New32a()
	h.Write([]byte(k))
	return int(h.Sum32() % uint32(n))
}
