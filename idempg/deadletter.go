package idempg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// listLimitDefault bounds ListDeadLetters, ListAudit and OutboxFetch when the caller gives no
// limit.
const listLimitDefault = 100

// InsertDeadLetter records a failed delivery as a pending dead letter and returns the row as
// stored. Dead-lettering the same delivery (consumer, tenant, event id, fingerprint) again
// while it is pending updates that row's attempts, error, reason and last failure time in the
// same statement (INSERT … ON CONFLICT … DO UPDATE), keeping its first failure time. A zero
// FirstFailed is now, a zero LastFailed is FirstFailed.
func (s *Store) InsertDeadLetter(ctx context.Context, dl idem.DeadLetter) (idem.DeadLetter, error) {
	// An empty event id is allowed: a message that arrived without one is exactly what the
	// dead-letter queue must keep. Its fingerprint (of the raw content) keeps it apart from other
	// such messages.
	if dl.Consumer == "" {
		return idem.DeadLetter{}, fmt.Errorf("idempg: insert dead letter: consumer is empty")
	}
	if dl.Reason == "" {
		return idem.DeadLetter{}, fmt.Errorf("idempg: insert dead letter: reason is empty")
	}
	if err := idem.ValidateOwner(dl.Owner); err != nil {
		return idem.DeadLetter{}, fmt.Errorf("idempg: insert dead letter: %w", err)
	}
	first := orNow(dl.FirstFailed)
	last := dl.LastFailed
	if last.IsZero() {
		last = first
	}
	headers, err := encodeHeaders(dl.Message.Headers)
	if err != nil {
		return idem.DeadLetter{}, fmt.Errorf("idempg: insert dead letter: %w", err)
	}
	m := dl.Message
	row := s.pool.QueryRow(ctx, s.q.dlInsert,
		dl.Consumer, m.Tenant, m.EventID, m.Type, m.Payload, headers,
		nullTime(m.PublishedAt), nullTime(m.OccurredAt), dl.Fingerprint[:], string(dl.Reason), dl.Error,
		dl.Attempts, first, last, dl.Source, dl.Owner, dl.Topic)
	got, err := scanDeadLetter(row)
	if err != nil {
		return idem.DeadLetter{}, fmt.Errorf("idempg: insert dead letter: %w", err)
	}
	return got, nil
}

// GetDeadLetter returns one dead letter, or an error wrapping idem.ErrNotFound naming the id.
func (s *Store) GetDeadLetter(ctx context.Context, id int64) (idem.DeadLetter, error) {
	dl, err := scanDeadLetter(s.pool.QueryRow(ctx, s.q.dlGet, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.DeadLetter{}, fmt.Errorf("idempg: dead letter %d: %w", id, idem.ErrNotFound)
	}
	if err != nil {
		return idem.DeadLetter{}, fmt.Errorf("idempg: get dead letter %d: %w", id, err)
	}
	return dl, nil
}

// ListDeadLetters returns the dead letters matching every non-zero field of f, ordered by id
// (oldest first), at most f.Limit of them (listLimitDefault, 100, when it is 0).
func (s *Store) ListDeadLetters(ctx context.Context, f idemstore.DeadLetterFilter) ([]idem.DeadLetter, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = listLimitDefault
	}
	var (
		b    strings.Builder
		args []any
	)
	b.WriteString(s.q.dlList)
	cond := func(expr string, arg any) {
		if len(args) == 0 {
			b.WriteString(" WHERE ")
		} else {
			b.WriteString(" AND ")
		}
		args = append(args, arg)
		b.WriteString(strings.ReplaceAll(expr, "?", "$"+strconv.Itoa(len(args))))
	}
	if len(f.IDs) > 0 {
		cond("id = ANY (?)", f.IDs)
	}
	if f.Consumer != "" {
		cond("consumer = ?", f.Consumer)
	}
	if f.Tenant != "" {
		cond("tenant = ?", f.Tenant)
	}
	if f.Owner != "" {
		cond("owner = ?", f.Owner)
	}
	if f.Reason != "" {
		cond("reason = ?", string(f.Reason))
	}
	if f.Status != "" {
		cond("status = ?", string(f.Status))
	}
	if !f.OlderThan.IsZero() {
		cond("last_failed_at < ?", f.OlderThan)
	}
	args = append(args, limit)
	b.WriteString(" ORDER BY id LIMIT $" + strconv.Itoa(len(args)))

	rows, err := s.pool.Query(ctx, b.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("idempg: list dead letters: %w", err)
	}
	defer rows.Close()
	var out []idem.DeadLetter
	for rows.Next() {
		dl, err := scanDeadLetter(rows)
		if err != nil {
			return nil, fmt.Errorf("idempg: list dead letters: %w", err)
		}
		out = append(out, dl)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idempg: list dead letters: %w", err)
	}
	return out, nil
}

// SetDeadLetterStatus moves pending dead letters to p.Status (replayed or discarded) and writes
// one audit row per changed dead letter, in one statement and so one transaction. Ids that are
// not pending (or do not exist) are skipped; it returns the changed ids in ascending order.
func (s *Store) SetDeadLetterStatus(ctx context.Context, p idemstore.SetDeadLetterStatusParams) ([]int64, error) {
	action, ok := p.Status.AuditAction()
	if !ok {
		return nil, fmt.Errorf("idempg: set status of dead letters %v: status %q, want %q or %q",
			p.IDs, p.Status, idem.DeadLetterReplayed, idem.DeadLetterDiscarded)
	}
	if len(p.IDs) == 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, s.q.dlSetStatus, p.IDs, string(p.Status), orNow(p.Now), p.Actor, action, p.Reason, p.Destination)
	if err != nil {
		return nil, fmt.Errorf("idempg: %s dead letters %v: %w", action, p.IDs, err)
	}
	changed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("idempg: %s dead letters %v: %w", action, p.IDs, err)
	}
	if len(changed) == 0 {
		return nil, nil
	}
	slices.Sort(changed)
	return changed, nil
}

// RecordRecovery sets recovered_at on the replayed, not yet recovered dead letters of key, and on
// deadLetterID when it is key's and still pending (the replay outran the replayer's mark), and
// returns the time from each one's first failure to now.
func (s *Store) RecordRecovery(ctx context.Context, key idem.Key, deadLetterID int64, now time.Time) ([]time.Duration, error) {
	now = orNow(now)
	rows, err := s.pool.Query(ctx, s.q.dlRecover, key.Tenant, key.Consumer, key.EventID, now, deadLetterID)
	if err != nil {
		return nil, fmt.Errorf("idempg: record recovery: %w", err)
	}
	firsts, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		return nil, fmt.Errorf("idempg: record recovery: %w", err)
	}
	out := make([]time.Duration, len(firsts))
	for i, f := range firsts {
		out[i] = now.Sub(f)
	}
	return out, nil
}

// ListAudit returns audit rows, newest first, at most limit (listLimitDefault, 100, when it is
// 0 or less).
func (s *Store) ListAudit(ctx context.Context, limit int) ([]idemstore.AuditEntry, error) {
	if limit <= 0 {
		limit = listLimitDefault
	}
	rows, err := s.pool.Query(ctx, s.q.auditList, limit)
	if err != nil {
		return nil, fmt.Errorf("idempg: list audit: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (idemstore.AuditEntry, error) {
		var a idemstore.AuditEntry
		err := r.Scan(&a.ID, &a.At, &a.Actor, &a.Action, &a.DeadLetterID, &a.EventID, &a.Reason, &a.Destination)
		a.At = a.At.UTC()
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("idempg: list audit: %w", err)
	}
	return out, nil
}

// DeadLetterStats counts pending dead letters, in total and per reason, and finds the first
// failure time of the oldest.
func (s *Store) DeadLetterStats(ctx context.Context) (idemstore.DeadLetterStats, error) {
	st := idemstore.DeadLetterStats{ByReason: make(map[idem.Reason]int64)}
	rows, err := s.pool.Query(ctx, s.q.dlStats)
	if err != nil {
		return idemstore.DeadLetterStats{}, fmt.Errorf("idempg: dead-letter stats: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			reason string
			n      int64
			oldest time.Time
		)
		if err := rows.Scan(&reason, &n, &oldest); err != nil {
			return idemstore.DeadLetterStats{}, fmt.Errorf("idempg: dead-letter stats: %w", err)
		}
		st.ByReason[idem.Reason(reason)] = n
		st.Pending += n
		if st.OldestPending.IsZero() || oldest.Before(st.OldestPending) {
			st.OldestPending = oldest.UTC()
		}
	}
	if err := rows.Err(); err != nil {
		return idemstore.DeadLetterStats{}, fmt.Errorf("idempg: dead-letter stats: %w", err)
	}
	return st, nil
}

// scanDeadLetter reads one row of dlColumns.
func scanDeadLetter(row pgx.Row) (idem.DeadLetter, error) {
	var (
		dl                             idem.DeadLetter
		headers                        []byte
		published, occurred, recovered pgtype.Timestamptz
		fp                             []byte
		reason, status                 string
	)
	err := row.Scan(&dl.ID, &dl.Consumer, &dl.Message.Tenant, &dl.Message.EventID, &dl.Message.Type,
		&dl.Message.Payload, &headers, &published, &occurred, &fp, &reason, &dl.Error, &dl.Attempts,
		&dl.FirstFailed, &dl.LastFailed, &status, &dl.Source, &recovered, &dl.Owner, &dl.Topic)
	if err != nil {
		return idem.DeadLetter{}, err
	}
	if dl.Message.Headers, err = decodeHeaders(headers); err != nil {
		return idem.DeadLetter{}, fmt.Errorf("dead letter %d: %w", dl.ID, err)
	}
	if dl.Fingerprint, err = idem.FingerprintFromBytes(fp); err != nil {
		return idem.DeadLetter{}, fmt.Errorf("dead letter %d: %w", dl.ID, err)
	}
	dl.Reason = idem.Reason(reason)
	dl.Status = idem.DeadLetterStatus(status)
	dl.Message.PublishedAt = timeOf(published)
	dl.Message.OccurredAt = timeOf(occurred)
	dl.RecoveredAt = timeOf(recovered)
	dl.FirstFailed = dl.FirstFailed.UTC()
	dl.LastFailed = dl.LastFailed.UTC()
	return dl, nil
}

// encodeHeaders renders headers as the JSON object stored in a jsonb column ({} when empty).
func encodeHeaders(h map[string]string) ([]byte, error) {
	if len(h) == 0 {
		return []byte("{}"), nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode headers: %w", err)
	}
	return b, nil
}

// decodeHeaders reads a stored headers object back; an empty object is a nil map.
func decodeHeaders(b []byte) (map[string]string, error) {
	switch string(b) {
	case "", "{}", "null":
		return nil, nil
	}
	var h map[string]string
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("decode headers: %w", err)
	}
	return h, nil
}

var _ idemstore.IgnoreStore[pgx.Tx] = (*Store)(nil)

// RecordIgnoreTx writes the audit row of an event its handler ignored (idem.Ignore) inside tx,
// the transaction that holds its claim: action "ignore", the consumer as actor, no dead letter.
func (s *Store) RecordIgnoreTx(ctx context.Context, tx pgx.Tx, p idemstore.RecordIgnoreParams) error {
	if _, err := tx.Exec(ctx, s.q.auditInsert, orNow(p.Now), p.Key.Consumer, idem.AuditActionIgnore, p.Key.EventID, p.Reason); err != nil {
		return fmt.Errorf("idempg: record ignore of %s: %w", p.Key, err)
	}
	return nil
}
