package idemmysql

import (
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// queries holds the fixed SQL statements with the table prefix filled in, built once by New so
// that no call formats them. Statements with a list of ids take their placeholders from inList.
type queries struct {
	claimInsert         string
	claimSelect         string
	claimDeleteAll      string
	claimDeleteConsumer string
	claimRelease        string

	dlInsert      string
	dlGet         string
	dlList        string // followed by a WHERE clause built from the filter
	dlLockPending string // followed by an id list
	dlSetStatus   string // followed by an id list
	auditInsert   string
	dlLockRecover string
	dlRecover     string // followed by an id list
	auditList     string
	dlStats       string

	queueInsert string
	queueLock   string
	queueLease  string // followed by an id list
	queueRead   string // followed by an id list
	queueAck    string
	queueNak    string
	queueExtend string
	queueStats  string

	subInsert     string
	subDelete     string
	subDeleteJobs string
	subList       string

	outboxInsert        string
	outboxFetch         string // partition list, then outboxFetchTail
	outboxMarkPublished string // followed by an id list
	outboxMarkFailed    string
	outboxDelete        string
	outboxStats         string

	leaseUpsert  string
	leaseRead    string
	leaseRelease string
	leaseList    string
}

// dlColumns are the dead-letter columns in the order scanDeadLetter reads them.
const dlColumns = `id, consumer, tenant, event_id, type, payload, headers, published_at, occurred_at,
	fingerprint, reason, error, attempts, first_failed_at, last_failed_at, status, source, recovered_at,
	owner, COALESCE(topic, '')`

// queueColumns are the queue columns in the order QueueFetch reads them.
const queueColumns = `id, token, attempts, event_id, tenant, type, payload, headers, occurred_at, enqueued_at,
	first_fetched_at`

// outboxColumns are the outbox columns in the order OutboxFetch reads them.
const outboxColumns = `id, partition_id, event_id, tenant, topic, ordering_key, type, payload, headers,
	occurred_at, created_at, attempts, last_error, next_attempt_at, first_attempt_at, dead,
	coalesce(dead_letter_id, 0)`

// outboxFetchTail ends OutboxFetch after its partition list.
const outboxFetchTail = ` AND published_at IS NULL AND (NOT dead OR dead_letter_id IS NOT NULL)
	ORDER BY id LIMIT ?`

func buildQueries(prefix string) queries {
	p := func(s string) string { return strings.ReplaceAll(s, "{p}", prefix) }
	return queries{
		claimInsert: p(`INSERT INTO {p}claims (tenant, consumer, event_id, fingerprint, created_at)
			VALUES (?, ?, ?, ?, ?)`),
		claimSelect: p(`SELECT fingerprint, created_at FROM {p}claims
			WHERE tenant = ? AND consumer = ? AND event_id = ? LOCK IN SHARE MODE`),
		claimDeleteAll: p(`DELETE FROM {p}claims WHERE created_at < ? ORDER BY created_at LIMIT ?`),
		claimDeleteConsumer: p(`DELETE FROM {p}claims WHERE created_at < ? AND consumer = ?
			ORDER BY created_at LIMIT ?`),
		claimRelease: p(`DELETE FROM {p}claims WHERE tenant = ? AND consumer = ? AND event_id = ?`),

		// On a duplicate of the pending row, LAST_INSERT_ID(id) makes the driver report that
		// row's id, which the store then reads back.
		dlInsert: p(`INSERT INTO {p}dead_letters (consumer, tenant, event_id, type, payload, headers,
				published_at, occurred_at, fingerprint, key_hash, reason, error, attempts,
				first_failed_at, last_failed_at, status, source, owner, topic)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)
			ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id), attempts = ?, error = ?, last_failed_at = ?, reason = ?, owner = ?`),
		dlGet:         p(`SELECT ` + dlColumns + ` FROM {p}dead_letters WHERE id = ?`),
		dlList:        p(`SELECT ` + dlColumns + ` FROM {p}dead_letters`),
		dlLockPending: p(`SELECT id, event_id FROM {p}dead_letters WHERE status = 'pending' AND id IN `),
		dlSetStatus:   p(`UPDATE {p}dead_letters SET status = ? WHERE status = 'pending' AND id IN `),
		auditInsert: p(`INSERT INTO {p}audit (at, actor, action, dead_letter_id, event_id, reason, destination)
			VALUES (?, ?, ?, ?, ?, ?, ?)`),
		dlLockRecover: p(`SELECT id, first_failed_at FROM {p}dead_letters
			WHERE key_hash = ? AND consumer = ? AND tenant = ? AND event_id = ?
				AND recovered_at IS NULL AND (status = 'replayed' OR (id = ? AND status = 'pending'))
			ORDER BY id FOR UPDATE`),
		dlRecover: p(`UPDATE {p}dead_letters SET recovered_at = ? WHERE id IN `),
		auditList: p(`SELECT id, at, actor, action, dead_letter_id, event_id, reason, COALESCE(destination, '') FROM {p}audit
			ORDER BY id DESC LIMIT ?`),
		dlStats: p(`SELECT reason, count(*), min(first_failed_at) FROM {p}dead_letters
			WHERE status = 'pending' GROUP BY reason`),

		queueInsert: p(`INSERT INTO {p}queue (queue, event_id, tenant, type, payload, headers, occurred_at,
			enqueued_at, available_at, last_error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, '')`),
		queueLock: p(`SELECT id FROM {p}queue
			WHERE queue = ? AND available_at <= ? AND (lease_until IS NULL OR lease_until <= ?)
			ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED`),
		// first_fetched_at keeps the first fetch's time: the retry budget counts from it.
		queueLease: p(`UPDATE {p}queue SET lease_until = ?, token = token + 1, attempts = attempts + 1,
				first_fetched_at = COALESCE(first_fetched_at, ?)
			WHERE id IN `),
		queueRead: p(`SELECT ` + queueColumns + ` FROM {p}queue WHERE id IN `),
		// A nak clears lease_until, so the token of a nak'ed job no longer acks or naks it.
		queueAck: p(`DELETE FROM {p}queue WHERE id = ? AND token = ? AND lease_until IS NOT NULL`),
		queueNak: p(`UPDATE {p}queue SET available_at = ?, lease_until = NULL, last_error = ?
			WHERE id = ? AND token = ? AND lease_until IS NOT NULL`),
		queueExtend: p(`UPDATE {p}queue SET lease_until = ?
			WHERE id = ? AND token = ? AND lease_until > ?`),
		queueStats: p(`SELECT count(*), min(enqueued_at) FROM {p}queue WHERE queue = ?`),

		subInsert:     p(`INSERT IGNORE INTO {p}queue_subscriptions (topic, name, created_at) VALUES (?, ?, ?)`),
		subDelete:     p(`DELETE FROM {p}queue_subscriptions WHERE topic = ? AND name = ?`),
		subDeleteJobs: p(`DELETE FROM {p}queue WHERE queue = ? LIMIT ?`),
		subList:       p(`SELECT name FROM {p}queue_subscriptions WHERE topic = ? ORDER BY name`),

		outboxInsert: p(`INSERT INTO {p}outbox (partition_id, event_id, tenant, topic, ordering_key, type,
			payload, headers, occurred_at, created_at, next_attempt_at, last_error)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '')`),
		outboxFetch:         p(`SELECT ` + outboxColumns + ` FROM {p}outbox WHERE partition_id IN `),
		outboxMarkPublished: p(`UPDATE {p}outbox SET published_at = ? WHERE id IN `),
		outboxMarkFailed: p(`UPDATE {p}outbox SET attempts = ?, last_error = ?, next_attempt_at = ?, dead = ?,
			first_attempt_at = ?, dead_letter_id = nullif(?, 0) WHERE id = ?`),
		outboxDelete: p(`DELETE FROM {p}outbox WHERE published_at IS NOT NULL AND published_at < ?
			ORDER BY published_at LIMIT ?`),
		outboxStats: p(`SELECT count(*), min(created_at) FROM {p}outbox
			WHERE published_at IS NULL AND NOT dead`),

		// MySQL runs the assignments left to right, each seeing the ones before it (MariaDB too,
		// unless sql_mode has SIMULTANEOUS_ASSIGNMENT): token reads the old owner and lease, and
		// owner changes, and lease_until moves, only if the lease is free, expired or already the
		// caller's. The last condition holds under either rule: after a takeover owner is the
		// caller, and without one lease_until has not changed yet.
		leaseUpsert: p(`INSERT INTO {p}leases (name, owner, token, lease_until) VALUES (?, ?, 1, ?)
			ON DUPLICATE KEY UPDATE
				token = IF(owner = ?, token, IF(lease_until <= ?, token + 1, token)),
				owner = IF(owner = ? OR lease_until <= ?, ?, owner),
				lease_until = IF(owner = ? OR lease_until <= ?, ?, lease_until)`),
		leaseRead: p(`SELECT owner, token FROM {p}leases WHERE name = ?`),
		// A released lease keeps its row and token (so the next owner's token is larger) but loses
		// its owner, so that even its old owner gets a new token when it comes back.
		leaseRelease: p(`UPDATE {p}leases SET owner = '', lease_until = ? WHERE name = ? AND owner = ?`),
		leaseList: p(`SELECT name, owner, token, lease_until FROM {p}leases
			WHERE LEFT(name, LENGTH(?)) = ? AND lease_until > ? AND owner <> ''
			ORDER BY name`),
	}
}

// inList returns "(?, ?, …)" with n placeholders (n > 0).
func inList(n int) string {
	var b strings.Builder
	b.Grow(2 + 3*n)
	b.WriteByte('(')
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('?')
	}
	b.WriteByte(')')
	return b.String()
}

// int64Args appends ids to args.
func int64Args(args []any, ids []int64) []any {
	for _, id := range ids {
		args = append(args, id)
	}
	return args
}

// keyHash is the SHA-256 of a dead letter's (consumer, tenant, event id), each prefixed with its
// length so that no two keys share an encoding.
func keyHash(consumer, tenant, eventID string) []byte {
	h := sha256.New()
	var n [8]byte
	for _, s := range []string{consumer, tenant, eventID} {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	return h.Sum(nil)
}

// text makes s storable in a utf8mb4 column: invalid UTF-8 (an error text may quote raw input)
// would fail the insert, and a dead letter that cannot be written is worse than a replaced byte.
func text(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// fromMicros converts stored unix microseconds to a UTC time.
func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

// fromNullMicros converts a nullable timestamp column; NULL is the zero time.
func fromNullMicros(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return fromMicros(v.Int64)
}

// nullMicros stores the zero time as NULL and anything else as unix microseconds.
func nullMicros(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
}

// encodeHeaders stores headers as a JSON object ("{}" when there are none).
func encodeHeaders(h map[string]string) (string, error) {
	if len(h) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// decodeHeaders reads a stored JSON object back; an empty object is nil.
func decodeHeaders(s string) (map[string]string, error) {
	if s == "" || s == "{}" {
		return nil, nil
	}
	var h map[string]string
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return nil, fmt.Errorf("headers %q: %w", s, err)
	}
	if len(h) == 0 {
		return nil, nil
	}
	return h, nil
}
