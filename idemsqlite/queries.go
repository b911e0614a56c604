package idemsqlite

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// queries holds every SQL statement with the table prefix filled in, built once by New so that
// no call formats SQL (lists of ids go in as one JSON array read with json_each).
type queries struct {
	claimInsert         string
	claimSelect         string
	claimDeleteAll      string
	claimDeleteConsumer string

	dlInsert       string
	dlGet          string
	dlList         string // followed by a WHERE clause built from the filter
	dlSetStatus    string
	auditInsert    string
	dlRecover      string
	auditList      string
	dlStatsPending string

	// queueRange takes the next ids of a queue's range; queueRangeNew gives a queue its range.
	queueRange    string
	queueRangeNew string
	// queueInsert, queueInsert8 and queueInsert32 insert 1, 8 and 32 jobs (queueInsertRows).
	queueInsert   string
	queueInsert8  string
	queueInsert32 string
	queueFetch    string
	// queuePeek reads whether a fetch would find a job, without the write lock.
	queuePeek string
	queueAck  string
	// queueAckMany deletes many acked jobs, each under its token, given as a JSON array of
	// [id, token] pairs (deleteAcked).
	queueAckMany string
	// queueHeld reads whether a job still carries a lease token (QueueAckTx's check).
	queueHeld   string
	queueNak    string
	queueExtend string
	// queueExtendHeld extends a lease without the expiry check, for applyExtensions.
	queueExtendHeld string
	queueRelease    string
	queueStats      string

	subInsert     string
	subDelete     string
	subDeleteJobs string
	subList       string

	outboxInsert        string
	outboxFetch         string
	outboxMarkPublished string
	outboxMarkFailed    string
	outboxDelete        string
	outboxStats         string

	leaseAcquire string
	leaseRelease string
	leaseList    string
}

// dlColumns are the dead-letter columns in the order scanDeadLetter reads them.
const dlColumns = `id, consumer, tenant, event_id, type, payload, headers, published_at, occurred_at,
	fingerprint, reason, error, attempts, first_failed_at, last_failed_at, status, source, recovered_at,
	owner, topic`

// queueRangeWidth is the number of ids of each queue (migration 053): a queue's jobs have ids in
// (base, base+queueRangeWidth), base a multiple of it, so that they are one run of the table's
// B-tree, in id order. 2^44 ids last 11 years at 50,000 jobs a second; 2^19-1 queues fit.
const (
	queueRangeWidth       = int64(1) << 44
	queueRangeWidthSQL    = "17592186044416"      // queueRangeWidth
	queueRangeLastBaseSQL = "9223354444668731392" // 2^63 - queueRangeWidth: the last base that fits
)

// inQueueRange is the condition that id is in the range of the queue named by the parameter
// param, which SQLite turns into a search of the table's own B-tree between the two bounds.
func inQueueRange(param string) string {
	base := "(SELECT base FROM {p}queue_ranges WHERE queue = " + param + ")"
	return "id > " + base + " AND id < " + base + " + " + queueRangeWidthSQL
}

// queueInsertRows is the INSERT of n jobs, ten parameters each (id, queue, event_id, tenant,
// type, payload, headers, occurred_at, enqueued_at, available_at). Bound parameters take every
// text and payload byte for byte, and one statement of many rows costs one round through
// database/sql instead of one per job. The parameters are plain ?s: the driver looks up each
// parameter's name, which for numbered ones (?NNN) is a scan of all names.
func queueInsertRows(n int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO {p}queue (id, queue, event_id, tenant, type, payload, headers, occurred_at,
			enqueued_at, available_at) VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
	}
	return b.String()
}

// queueInsertParams is the number of parameters of each job in queueInsertRows.
const queueInsertParams = 10

// queueReturning are the queue columns in the order QueueFetch reads them.
const queueReturning = `id, token, attempts, event_id, tenant, type, payload, headers, occurred_at, enqueued_at,
	first_fetched_at`

// outboxColumns are the outbox columns in the order scanOutbox reads them.
const outboxColumns = `id, "partition", event_id, tenant, topic, ordering_key, type, payload, headers,
	occurred_at, created_at, attempts, last_error, next_attempt_at, first_attempt_at, dead,
	coalesce(dead_letter_id, 0)`

func buildQueries(prefix string) queries {
	p := func(s string) string { return strings.ReplaceAll(s, "{p}", prefix) }
	return queries{
		claimInsert: p(`INSERT INTO {p}claims (tenant, consumer, event_id, fingerprint, created_at)
			VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING created_at`),
		claimSelect: p(`SELECT fingerprint, created_at FROM {p}claims
			WHERE tenant = ? AND consumer = ? AND event_id = ?`),
		claimDeleteAll: p(`DELETE FROM {p}claims WHERE rowid IN
			(SELECT rowid FROM {p}claims WHERE created_at < ? LIMIT ?)`),
		claimDeleteConsumer: p(`DELETE FROM {p}claims WHERE rowid IN
			(SELECT rowid FROM {p}claims WHERE created_at < ? AND consumer = ? LIMIT ?)`),

		dlInsert: p(`INSERT INTO {p}dead_letters (consumer, tenant, event_id, type, payload, headers,
				published_at, occurred_at, fingerprint, reason, error, attempts, first_failed_at,
				last_failed_at, status, source, owner, topic)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)
			ON CONFLICT (consumer, tenant, event_id, fingerprint) WHERE status = 'pending' DO UPDATE SET
				attempts = excluded.attempts,
				error = excluded.error,
				last_failed_at = excluded.last_failed_at,
				reason = excluded.reason,
				owner = excluded.owner
			RETURNING ` + dlColumns),
		dlGet:  p(`SELECT ` + dlColumns + ` FROM {p}dead_letters WHERE id = ?`),
		dlList: p(`SELECT ` + dlColumns + ` FROM {p}dead_letters`),
		dlSetStatus: p(`UPDATE {p}dead_letters SET status = ?
			WHERE id IN (SELECT value FROM json_each(?)) AND status = 'pending'
			RETURNING id, event_id`),
		auditInsert: p(`INSERT INTO {p}audit (at, actor, action, dead_letter_id, event_id, reason, destination)
			VALUES (?, ?, ?, ?, ?, ?, ?)`),
		dlRecover: p(`UPDATE {p}dead_letters SET recovered_at = ?
			WHERE consumer = ? AND tenant = ? AND event_id = ? AND recovered_at IS NULL
			AND (status = 'replayed' OR (id = ? AND status = 'pending'))
			RETURNING first_failed_at`),
		auditList: p(`SELECT id, at, actor, action, dead_letter_id, event_id, reason, destination FROM {p}audit
			ORDER BY id DESC LIMIT ?`),
		dlStatsPending: p(`SELECT reason, count(*), min(first_failed_at) FROM {p}dead_letters
			WHERE status = 'pending' GROUP BY reason`),

		queueRange: p(`UPDATE {p}queue_ranges SET last_id = last_id + ?2 WHERE queue = ?1
			RETURNING base, last_id`),
		// New ranges follow the highest one; none is given past the last that fits in an int64.
		queueRangeNew: p(`INSERT INTO {p}queue_ranges (queue, base, last_id)
			SELECT ?1, m + ` + queueRangeWidthSQL + `, m + ` + queueRangeWidthSQL + `
			FROM (SELECT coalesce(max(base), 0) AS m FROM {p}queue_ranges)
			WHERE m < ` + queueRangeLastBaseSQL + ` ON CONFLICT (queue) DO NOTHING`),
		queueInsert:   p(queueInsertRows(1)),
		queueInsert8:  p(queueInsertRows(8)),
		queueInsert32: p(queueInsertRows(32)),
		// first_fetched_at keeps the first fetch's time: the retry budget counts from it.
		queueFetch: p(`UPDATE {p}queue SET lease_until = ?1, token = token + 1, attempts = attempts + 1,
				first_fetched_at = coalesce(first_fetched_at, ?3)
			WHERE id IN (SELECT id FROM {p}queue
				WHERE ` + inQueueRange("?2") + ` AND queue = ?2
					AND available_at <= ?3 AND (lease_until IS NULL OR lease_until <= ?3)
				ORDER BY id LIMIT ?4)
			RETURNING ` + queueReturning),
		queuePeek: p(`SELECT 1 FROM {p}queue
			WHERE ` + inQueueRange("?1") + ` AND queue = ?1
				AND available_at <= ?2 AND (lease_until IS NULL OR lease_until <= ?2) LIMIT 1`),
		queueAck: p(`DELETE FROM {p}queue WHERE id = ? AND token = ?`),
		queueAckMany: p(`DELETE FROM {p}queue WHERE (id, token) IN
			(SELECT value ->> 0, value ->> 1 FROM jsonb_each(?1))`),
		queueHeld: p(`SELECT 1 FROM {p}queue WHERE id = ? AND token = ?`),
		queueNak: p(`UPDATE {p}queue SET available_at = ?, lease_until = NULL, last_error = ?
			WHERE id = ? AND token = ?`),
		queueExtend: p(`UPDATE {p}queue SET lease_until = ?1
			WHERE id = ?2 AND token = ?3 AND lease_until > ?4`),
		queueExtendHeld: p(`UPDATE {p}queue SET lease_until = max(lease_until, ?1)
			WHERE id = ?2 AND token = ?3 AND lease_until IS NOT NULL`),
		// A job whose attempts go back to 0 never really ran: its retry budget has not started.
		queueRelease: p(`UPDATE {p}queue SET lease_until = NULL,
				first_fetched_at = CASE WHEN attempts <= 1 THEN NULL ELSE first_fetched_at END,
				attempts = max(attempts - 1, 0)
			WHERE id = ? AND token = ? AND lease_until IS NOT NULL`),
		queueStats: p(`SELECT count(*), min(enqueued_at) FROM {p}queue WHERE ` + inQueueRange("?1") + ` AND queue = ?1`),

		subInsert: p(`INSERT INTO {p}queue_subscriptions (topic, name, created_at) VALUES (?, ?, ?)
			ON CONFLICT (topic, name) DO NOTHING`),
		subDelete: p(`DELETE FROM {p}queue_subscriptions WHERE topic = ? AND name = ?`),
		subDeleteJobs: p(`DELETE FROM {p}queue WHERE id IN (SELECT id FROM {p}queue
			WHERE ` + inQueueRange("?1") + ` AND queue = ?1 LIMIT ?2)`),
		subList: p(`SELECT name FROM {p}queue_subscriptions WHERE topic = ? ORDER BY name`),

		outboxInsert: p(`INSERT INTO {p}outbox ("partition", event_id, tenant, topic, ordering_key, type,
			payload, headers, occurred_at, created_at, next_attempt_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
		outboxFetch: p(`SELECT ` + outboxColumns + ` FROM {p}outbox
			WHERE "partition" IN (SELECT value FROM json_each(?1)) AND published_at IS NULL
				AND (NOT dead OR dead_letter_id IS NOT NULL)
			ORDER BY id LIMIT ?2`),
		outboxMarkPublished: p(`UPDATE {p}outbox SET published_at = ?
			WHERE id IN (SELECT value FROM json_each(?))`),
		outboxMarkFailed: p(`UPDATE {p}outbox SET attempts = ?, last_error = ?, next_attempt_at = ?, dead = ?,
			first_attempt_at = ?, dead_letter_id = nullif(?, 0) WHERE id = ?`),
		outboxDelete: p(`DELETE FROM {p}outbox WHERE rowid IN
			(SELECT rowid FROM {p}outbox WHERE published_at IS NOT NULL AND published_at < ? LIMIT ?)`),
		outboxStats: p(`SELECT count(*), min(created_at) FROM {p}outbox
			WHERE published_at IS NULL AND NOT dead`),

		// The SET expressions all read the old row, so the CASE sees the previous owner.
		leaseAcquire: p(`INSERT INTO {p}leases (name, owner, token, lease_until) VALUES (?1, ?2, 1, ?3)
			ON CONFLICT (name) DO UPDATE SET
				token = CASE WHEN {p}leases.owner = excluded.owner THEN {p}leases.token ELSE {p}leases.token + 1 END,
				owner = excluded.owner,
				lease_until = excluded.lease_until
			WHERE {p}leases.owner = excluded.owner OR {p}leases.lease_until <= ?4
			RETURNING token`),
		// A released lease keeps its row and token (so the next owner's token is larger) but loses
		// its owner, so that even its old owner gets a new token when it comes back.
		leaseRelease: p(`UPDATE {p}leases SET owner = '', lease_until = ?
			WHERE name = ? AND owner = ?`),
		leaseList: p(`SELECT name, owner, token, lease_until FROM {p}leases
			WHERE substr(name, 1, length(?1)) = ?1 AND lease_until > ?2 AND owner <> ''
			ORDER BY name`),
	}
}

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

// int64List formats ids as a JSON array for json_each.
func int64List(ids []int64) string {
	b := make([]byte, 0, 2+len(ids)*8)
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return string(append(b, ']'))
}

// intList formats ints as a JSON array for json_each.
func intList(xs []int) string {
	b := make([]byte, 0, 2+len(xs)*3)
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	return string(append(b, ']'))
}
