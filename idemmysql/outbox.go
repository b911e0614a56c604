package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// outboxFetchLimitDefault bounds OutboxFetch when the caller gives no limit.
const outboxFetchLimitDefault = 100

// EnqueueTx inserts outgoing events inside the caller's transaction, so they commit or roll back
// with its business write. Each is validated (event id and topic required) and hashed into one of
// OutboxPartitions partitions by its ordering key; created_at and next_attempt_at are now, and
// occurred_at is o.OccurredAt or now. Relays in this process are woken after commit when tx came
// from InTx, and at once otherwise.
func (s *Store) EnqueueTx(ctx context.Context, tx *sql.Tx, msgs ...idem.Outgoing) error {
	if len(msgs) == 0 {
		return nil
	}
	now := time.Now()
	nowUS := now.UnixMicro()
	for _, o := range msgs {
		if err := o.Validate(); err != nil {
			return err
		}
		headers, err := encodeHeaders(o.Headers)
		if err != nil {
			return fmt.Errorf("idemmysql: enqueue event %s: %w", o.EventID, err)
		}
		occurred := o.OccurredAt
		if occurred.IsZero() {
			occurred = now
		}
		part := idemstore.OutboxPartition(o, s.cfg.OutboxPartitions)
		if _, err := tx.ExecContext(ctx, s.q.outboxInsert, part, []byte(o.EventID), []byte(o.Tenant), []byte(o.Topic),
			[]byte(o.Key), []byte(o.Type), nonNil(o.Payload), headers, occurred.UnixMicro(), nowUS, nowUS); err != nil {
			return fmt.Errorf("idemmysql: enqueue event %s to topic %q: %w", o.EventID, o.Topic, err)
		}
	}
	s.wakeAfter(tx, wakeOutbox)
	return nil
}

// OutboxPartitions returns the number of partitions outbox rows are hashed into.
func (s *Store) OutboxPartitions() int { return s.cfg.OutboxPartitions }

// OutboxFetch returns up to p.Limit (100 when 0) unpublished rows of p.Partitions in enqueue
// order, due or not: the relay holds a key back behind a row that is not yet due, and behind a
// dead row with a dead letter until that is replayed or discarded.
func (s *Store) OutboxFetch(ctx context.Context, p idemstore.OutboxFetchParams) ([]idemstore.OutboxRow, error) {
	if len(p.Partitions) == 0 {
		return nil, nil
	}
	limit := p.Limit
	if limit <= 0 {
		limit = outboxFetchLimitDefault
	}
	args := make([]any, 0, len(p.Partitions)+1)
	for _, part := range p.Partitions {
		args = append(args, part)
	}
	args = append(args, limit)
	rows, err := s.db.QueryContext(ctx, s.q.outboxFetch+inList(len(p.Partitions))+outboxFetchTail, args...)
	if err != nil {
		return nil, fmt.Errorf("idemmysql: fetch outbox partitions %v: %w", p.Partitions, err)
	}
	defer rows.Close()
	var out []idemstore.OutboxRow
	for rows.Next() {
		var (
			r                 idemstore.OutboxRow
			o                 = &r.Outgoing
			headers           string
			occurred, first   sql.NullInt64
			created, nextTime int64
		)
		if err := rows.Scan(&r.ID, &r.Partition, &o.EventID, &o.Tenant, &o.Topic, &o.Key, &o.Type, &o.Payload,
			&headers, &occurred, &created, &r.Attempts, &r.LastError, &nextTime, &first, &r.Dead, &r.DeadLetterID); err != nil {
			return nil, fmt.Errorf("idemmysql: fetch outbox partitions %v: %w", p.Partitions, err)
		}
		if o.Headers, err = decodeHeaders(headers); err != nil {
			return nil, fmt.Errorf("idemmysql: outbox row %d (event %s): %w", r.ID, o.EventID, err)
		}
		o.OccurredAt = fromNullMicros(occurred)
		r.CreatedAt = fromMicros(created)
		r.NextAttemptAt = fromMicros(nextTime)
		r.FirstAttemptAt = fromNullMicros(first)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idemmysql: fetch outbox partitions %v: %w", p.Partitions, err)
	}
	return out, nil
}

// OutboxMarkPublished sets published_at = at on the rows ids.
func (s *Store) OutboxMarkPublished(ctx context.Context, ids []int64, at time.Time) error {
	if len(ids) == 0 {
		return nil
	}
	if at.IsZero() {
		at = time.Now()
	}
	if _, err := s.db.ExecContext(ctx, s.q.outboxMarkPublished+inList(len(ids)), int64Args([]any{at.UnixMicro()}, ids)...); err != nil {
		return fmt.Errorf("idemmysql: mark outbox rows %v published: %w", ids, err)
	}
	return nil
}

// OutboxMarkFailed records a failed publish of row p.ID: attempts, last error, next and first
// attempt times, and whether it is dead (holding its key while it has a dead letter). An unknown
// id is an error wrapping idem.ErrNotFound.
func (s *Store) OutboxMarkFailed(ctx context.Context, p idemstore.OutboxFailParams) error {
	var first sql.NullInt64
	if !p.FirstAttemptAt.IsZero() {
		first = sql.NullInt64{Int64: p.FirstAttemptAt.UnixMicro(), Valid: true}
	}
	err := s.ownTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		// An UPDATE that changes nothing reports 0 rows, so existence is read under the row lock.
		var one int
		if err := tx.QueryRowContext(ctx, s.sub(`SELECT 1 FROM {{prefix}}outbox WHERE id = ? FOR UPDATE`), p.ID).Scan(&one); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return idem.ErrNotFound
			}
			return err
		}
		_, err := tx.ExecContext(ctx, s.q.outboxMarkFailed, p.Attempts, text(p.LastError), p.NextAttemptAt.UnixMicro(), p.Dead,
			first, p.DeadLetterID, p.ID)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemmysql: mark outbox row %d failed: %w", p.ID, err)
	}
	return nil
}

// OutboxDeletePublished deletes up to limit rows published before before, oldest first, in one
// autocommitted statement, and reports how many it deleted; callers loop while it equals limit.
func (s *Store) OutboxDeletePublished(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("idemmysql: delete published outbox rows: limit is %d, want more than 0", limit)
	}
	res, err := s.db.ExecContext(ctx, s.q.outboxDelete, before.UnixMicro(), limit)
	if err != nil {
		return 0, fmt.Errorf("idemmysql: delete outbox rows published before %s: %w", before.UTC().Format(time.RFC3339), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("idemmysql: delete published outbox rows: rows affected: %w", err)
	}
	return int(n), nil
}

// OutboxStats reports the rows waiting to be published (dead rows excluded: they wait for an
// operator, not for the relay) and the creation time of the oldest.
func (s *Store) OutboxStats(ctx context.Context) (idemstore.QueueStats, error) {
	var (
		st     idemstore.QueueStats
		oldest sql.NullInt64
	)
	if err := s.db.QueryRowContext(ctx, s.q.outboxStats).Scan(&st.Backlog, &oldest); err != nil {
		return st, fmt.Errorf("idemmysql: outbox stats: %w", err)
	}
	st.Oldest = fromNullMicros(oldest)
	return st, nil
}

// OutboxWait returns nil when something is enqueued through this Store, after
// min(PollInterval, max) (PollInterval when max <= 0), or ctx.Err() when ctx ends.
func (s *Store) OutboxWait(ctx context.Context, max time.Duration) error {
	return s.waitFor(ctx, &s.outboxWake, max)
}

// LeaseAcquire takes the named lease for p.Owner until p.Now+p.TTL when it is free, expired
// or already p.Owner's (a renewal), in one upsert, and reads the row back in the same
// transaction. The token grows by one each time the lease changes owner and stays the same on
// renewal; ok is false when someone else holds it.
func (s *Store) LeaseAcquire(ctx context.Context, p idemstore.LeaseParams) (int64, bool, error) {
	if p.Name == "" || p.Owner == "" {
		return 0, false, fmt.Errorf("idemmysql: acquire lease %q for %q: name and owner are required", p.Name, p.Owner)
	}
	if p.TTL <= 0 {
		return 0, false, fmt.Errorf("idemmysql: acquire lease %q for %q: TTL is %s, want more than 0", p.Name, p.Owner, p.TTL)
	}
	now := p.Now
	if now.IsZero() {
		now = time.Now()
	}
	until, nowUS := now.Add(p.TTL).UnixMicro(), now.UnixMicro()
	var (
		owner string
		token int64
	)
	// Concurrent first acquisitions of one lease may deadlock (two upserts of a row that does
	// not exist yet); ownTx runs the transaction again.
	err := s.ownTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, s.q.leaseUpsert, p.Name, p.Owner, until,
			p.Owner, nowUS, p.Owner, nowUS, p.Owner, p.Owner, nowUS, until); err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, s.q.leaseRead, p.Name).Scan(&owner, &token)
	})
	if err != nil {
		return 0, false, fmt.Errorf("idemmysql: acquire lease %q for %q: %w", p.Name, p.Owner, err)
	}
	if owner != p.Owner {
		return 0, false, nil
	}
	return token, true, nil
}

// LeaseRelease gives up the named lease if owner holds it; otherwise it does nothing. The row
// and its token stay, so whoever takes the lease next gets a larger token.
func (s *Store) LeaseRelease(ctx context.Context, name, owner string) error {
	if _, err := s.db.ExecContext(ctx, s.q.leaseRelease, int64(math.MinInt64), name, owner); err != nil {
		return fmt.Errorf("idemmysql: release lease %q of %q: %w", name, owner, err)
	}
	return nil
}

// LeaseList returns the leases whose names start with prefix and that are held at now, by name.
func (s *Store) LeaseList(ctx context.Context, prefix string, now time.Time) ([]idemstore.Lease, error) {
	if now.IsZero() {
		now = time.Now()
	}
	rows, err := s.db.QueryContext(ctx, s.q.leaseList, []byte(prefix), []byte(prefix), now.UnixMicro())
	if err != nil {
		return nil, fmt.Errorf("idemmysql: list leases %q*: %w", prefix, err)
	}
	defer rows.Close()
	var out []idemstore.Lease
	for rows.Next() {
		var (
			l     idemstore.Lease
			until int64
		)
		if err := rows.Scan(&l.Name, &l.Owner, &l.Token, &until); err != nil {
			return nil, fmt.Errorf("idemmysql: list leases %q*: %w", prefix, err)
		}
		l.LeaseUntil = fromMicros(until)
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idemmysql: list leases %q*: %w", prefix, err)
	}
	return out, nil
}
