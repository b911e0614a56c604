package idemsqlite

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// listLimitDefault bounds ListDeadLetters and ListAudit when the caller gives no limit.
const listLimitDefault = 100

// InsertDeadLetter records a failed delivery as a pending dead letter. While one is pending for
// the same consumer, tenant, event id and fingerprint, it updates that row (attempts, error,
// reason, last failure; the first failure time stays) instead of adding one. It returns the row
// as stored. Zero failure times default to each other, or to now.
func (s *Store) InsertDeadLetter(ctx context.Context, dl idem.DeadLetter) (idem.DeadLetter, error) {
	m := dl.Message
	// An empty event id is allowed: a message that arrived without one is exactly what the
	// dead-letter queue must keep. Its fingerprint (of the raw content) keeps it apart from other
	// such messages.
	if dl.Consumer == "" {
		return idem.DeadLetter{}, fmt.Errorf("idemsqlite: insert dead letter: Consumer is empty")
	}
	if dl.Reason == "" {
		return idem.DeadLetter{}, fmt.Errorf("idemsqlite: insert dead letter: Reason is empty")
	}
	if err := idem.ValidateOwner(dl.Owner); err != nil {
		return idem.DeadLetter{}, fmt.Errorf("idemsqlite: insert dead letter: %w", err)
	}
	first, last := dl.FirstFailed, dl.LastFailed
	switch {
	case first.IsZero() && last.IsZero():
		first = time.Now()
		last = first
	case first.IsZero():
		first = last
	case last.IsZero():
		last = first
	}
	headers, err := encodeHeaders(m.Headers)
	if err != nil {
		return idem.DeadLetter{}, fmt.Errorf("idemsqlite: insert dead letter: %w", err)
	}
	fp := dl.Fingerprint // the zero fingerprint is stored as 32 zero bytes so uniqueness holds
	var out idem.DeadLetter
	err = s.write(ctx, func(ctx context.Context, c *sql.Conn) error {
		var err error
		out, err = scanDeadLetter(c.QueryRowContext(ctx, s.q.dlInsert,
			dl.Consumer, m.Tenant, m.EventID, m.Type, m.Payload, headers,
			nullMicros(m.PublishedAt), nullMicros(m.OccurredAt), fp[:], string(dl.Reason), dl.Error,
			dl.Attempts, first.UnixMicro(), last.UnixMicro(), dl.Source, dl.Owner, dl.Topic))
		return err
	})
	if err != nil {
		return idem.DeadLetter{}, fmt.Errorf("idemsqlite: insert dead letter: %w", err)
	}
	return out, nil
}

// GetDeadLetter returns dead letter id, or an error wrapping idem.ErrNotFound naming it.
func (s *Store) GetDeadLetter(ctx context.Context, id int64) (idem.DeadLetter, error) {
	s.ownPoolUse()
	defer s.ownPoolDone()
	dl, err := scanDeadLetter(s.db.QueryRowContext(ctx, s.q.dlGet, id))
	if errors.Is(err, sql.ErrNoRows) {
		return idem.DeadLetter{}, fmt.Errorf("idemsqlite: dead letter %d: %w", id, idem.ErrNotFound)
	}
	if err != nil {
		return idem.DeadLetter{}, fmt.Errorf("idemsqlite: get dead letter %d: %w", id, err)
	}
	return dl, nil
}

// ListDeadLetters returns the dead letters matching every set field of f, by id (oldest
// first), at most f.Limit (100 when it is 0).
func (s *Store) ListDeadLetters(ctx context.Context, f idemstore.DeadLetterFilter) ([]idem.DeadLetter, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = listLimitDefault
	}
	var (
		where []string
		args  []any
	)
	if len(f.IDs) > 0 {
		where = append(where, "id IN (SELECT value FROM json_each(?))")
		args = append(args, int64List(f.IDs))
	}
	if f.Consumer != "" {
		where = append(where, "consumer = ?")
		args = append(args, f.Consumer)
	}
	if f.Tenant != "" {
		where = append(where, "tenant = ?")
		args = append(args, f.Tenant)
	}
	if f.Owner != "" {
		where = append(where, "owner = ?")
		args = append(args, f.Owner)
	}
	if f.Reason != "" {
		where = append(where, "reason = ?")
		args = append(args, string(f.Reason))
	}
	if f.Status != "" {
		where = append(where, "status = ?")
		args = append(args, string(f.Status))
	}
	if !f.OlderThan.IsZero() {
		where = append(where, "last_failed_at < ?")
		args = append(args, f.OlderThan.UnixMicro())
	}
	var q strings.Builder
	q.WriteString(s.q.dlList)
	if len(where) > 0 {
		q.WriteString(" WHERE ")
		q.WriteString(strings.Join(where, " AND "))
	}
	q.WriteString(" ORDER BY id LIMIT ?")
	args = append(args, limit)

	s.ownPoolUse()
	defer s.ownPoolDone()
	rows, err := s.db.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: list dead letters: %w", err)
	}
	defer rows.Close()
	var out []idem.DeadLetter
	for rows.Next() {
		dl, err := scanDeadLetter(rows)
		if err != nil {
			return nil, fmt.Errorf("idemsqlite: list dead letters: %w", err)
		}
		out = append(out, dl)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idemsqlite: list dead letters: %w", err)
	}
	return out, nil
}

// SetDeadLetterStatus moves the pending dead letters among p.IDs to p.Status (replayed or
// discarded) and writes one audit row for each, all in one transaction. Ids that are not pending
// (unknown, already replayed or discarded) are skipped; it returns the changed ids in order.
func (s *Store) SetDeadLetterStatus(ctx context.Context, p idemstore.SetDeadLetterStatusParams) ([]int64, error) {
	action, ok := p.Status.AuditAction()
	if !ok {
		return nil, fmt.Errorf("idemsqlite: set dead letter status: Status %q is not %q or %q",
			p.Status, idem.DeadLetterReplayed, idem.DeadLetterDiscarded)
	}
	if len(p.IDs) == 0 {
		return nil, nil
	}
	now := p.Now
	if now.IsZero() {
		now = time.Now()
	}
	type changed struct {
		id      int64
		eventID string
	}
	var done []changed
	err := s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, s.q.dlSetStatus, string(p.Status), int64List(p.IDs))
		if err != nil {
			return err
		}
		for rows.Next() {
			var c changed
			if err := rows.Scan(&c.id, &c.eventID); err != nil {
				rows.Close()
				return err
			}
			done = append(done, c)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		slices.SortFunc(done, func(a, b changed) int { return cmp.Compare(a.id, b.id) })
		for _, c := range done {
			if _, err := tx.ExecContext(ctx, s.q.auditInsert,
				now.UnixMicro(), p.Actor, action, c.id, c.eventID, p.Reason, p.Destination); err != nil {
				return fmt.Errorf("audit of dead letter %d (event %s): %w", c.id, c.eventID, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: %s dead letters %v: %w", action, p.IDs, err)
	}
	ids := make([]int64, len(done))
	for i, c := range done {
		ids[i] = c.id
	}
	return ids, nil
}

// RecordRecovery notes that a replay of key was processed: every replayed dead letter of that
// key not yet marked recovered, and deadLetterID when it is key's and still pending (the replay
// outran the replayer's mark), gets recovered_at = now; the time from its first failure to now
// is returned, one per dead letter (none when nothing was replayed).
func (s *Store) RecordRecovery(ctx context.Context, key idem.Key, deadLetterID int64, now time.Time) ([]time.Duration, error) {
	if now.IsZero() {
		now = time.Now()
	}
	var out []time.Duration
	err := s.queryWrite(ctx, func() { out = nil }, func(rows *sql.Rows) error {
		var first int64
		if err := rows.Scan(&first); err != nil {
			return err
		}
		out = append(out, now.Sub(fromMicros(first)))
		return nil
	}, s.q.dlRecover, now.UnixMicro(), key.Consumer, key.Tenant, key.EventID, deadLetterID)
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: record recovery: %w", err)
	}
	return out, nil
}

// ListAudit returns the newest audit rows first, at most limit (100 when it is 0).
func (s *Store) ListAudit(ctx context.Context, limit int) ([]idemstore.AuditEntry, error) {
	if limit <= 0 {
		limit = listLimitDefault
	}
	s.ownPoolUse()
	defer s.ownPoolDone()
	rows, err := s.db.QueryContext(ctx, s.q.auditList, limit)
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: list audit: %w", err)
	}
	defer rows.Close()
	var out []idemstore.AuditEntry
	for rows.Next() {
		var (
			a  idemstore.AuditEntry
			at int64
		)
		if err := rows.Scan(&a.ID, &at, &a.Actor, &a.Action, &a.DeadLetterID, &a.EventID, &a.Reason, &a.Destination); err != nil {
			return nil, fmt.Errorf("idemsqlite: list audit: %w", err)
		}
		a.At = fromMicros(at)
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idemsqlite: list audit: %w", err)
	}
	return out, nil
}

// DeadLetterStats counts the pending dead letters, in total and per reason, and finds the first
// failure of the oldest.
func (s *Store) DeadLetterStats(ctx context.Context) (idemstore.DeadLetterStats, error) {
	st := idemstore.DeadLetterStats{ByReason: map[idem.Reason]int64{}}
	s.ownPoolUse()
	defer s.ownPoolDone()
	rows, err := s.db.QueryContext(ctx, s.q.dlStatsPending)
	if err != nil {
		return st, fmt.Errorf("idemsqlite: dead letter stats: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			reason string
			n      int64
			oldest int64
		)
		if err := rows.Scan(&reason, &n, &oldest); err != nil {
			return st, fmt.Errorf("idemsqlite: dead letter stats: %w", err)
		}
		st.ByReason[idem.Reason(reason)] = n
		st.Pending += n
		if t := fromMicros(oldest); st.OldestPending.IsZero() || t.Before(st.OldestPending) {
			st.OldestPending = t
		}
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("idemsqlite: dead letter stats: %w", err)
	}
	return st, nil
}

// scanner is a *sql.Row or *sql.Rows.
type scanner interface {
	Scan(dest ...any) error
}

// scanDeadLetter reads the dlColumns of one row.
func scanDeadLetter(r scanner) (idem.DeadLetter, error) {
	var (
		dl                    idem.DeadLetter
		headers, reason, stat string
		fp                    []byte
		published, occurred   sql.NullInt64
		recovered             sql.NullInt64
		first, last           int64
	)
	err := r.Scan(&dl.ID, &dl.Consumer, &dl.Message.Tenant, &dl.Message.EventID, &dl.Message.Type,
		&dl.Message.Payload, &headers, &published, &occurred, &fp, &reason, &dl.Error, &dl.Attempts,
		&first, &last, &stat, &dl.Source, &recovered, &dl.Owner, &dl.Topic)
	if err != nil {
		return idem.DeadLetter{}, err
	}
	if dl.Message.Headers, err = decodeHeaders(headers); err != nil {
		return idem.DeadLetter{}, fmt.Errorf("dead letter %d (event %s): %w", dl.ID, dl.Message.EventID, err)
	}
	if len(fp) > 0 {
		if dl.Fingerprint, err = idem.FingerprintFromBytes(fp); err != nil {
			return idem.DeadLetter{}, fmt.Errorf("dead letter %d (event %s): %w", dl.ID, dl.Message.EventID, err)
		}
	}
	dl.Message.PublishedAt = fromNullMicros(published)
	dl.Message.OccurredAt = fromNullMicros(occurred)
	dl.Reason = idem.Reason(reason)
	dl.Status = idem.DeadLetterStatus(stat)
	dl.FirstFailed = fromMicros(first)
	dl.LastFailed = fromMicros(last)
	dl.RecoveredAt = fromNullMicros(recovered)
	return dl, nil
}

var _ idemstore.IgnoreStore[*sql.Tx] = (*Store)(nil)

// RecordIgnoreTx writes the audit row of an event its handler ignored (idem.Ignore) inside tx,
// the transaction that holds its claim: action "ignore", the consumer as actor, no dead letter.
func (s *Store) RecordIgnoreTx(ctx context.Context, tx *sql.Tx, p idemstore.RecordIgnoreParams) error {
	now := p.Now
	if now.IsZero() {
		now = time.Now()
	}
	if _, err := tx.ExecContext(ctx, s.q.auditInsert, now.UnixMicro(), p.Key.Consumer, idem.AuditActionIgnore, 0, p.Key.EventID, p.Reason, ""); err != nil {
		return fmt.Errorf("idemsqlite: record ignore of %s: %w", p.Key, err)
	}
	return nil
}
