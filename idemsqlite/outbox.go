package idemsqlite

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
			return fmt.Errorf("idemsqlite: enqueue event %s: %w", o.EventID, err)
		}
		occurred := o.OccurredAt
		if occurred.IsZero() {
			occurred = now
		}
		part := idemstore.OutboxPartition(o, s.cfg.OutboxPartitions)
		if _, err := tx.ExecContext(ctx, s.q.outboxInsert, part, o.EventID, o.Tenant, o.Topic, o.Key, o.Type,
			o.Payload, headers, occurred.UnixMicro(), nowUS, nowUS); err != nil {
			return fmt.Errorf("idemsqlite: enqueue event %s to topic %q: %w", o.EventID, o.Topic, err)
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
	s.ownPoolUse()
	defer s.ownPoolDone()
	rows, err := s.db.QueryContext(ctx, s.q.outboxFetch, intList(p.Partitions), limit)
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: fetch outbox partitions %v: %w", p.Partitions, err)
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
			return nil, fmt.Errorf("idemsqlite: fetch outbox partitions %v: %w", p.Partitions, err)
		}
		if o.Headers, err = decodeHeaders(headers); err != nil {
			return nil, fmt.Errorf("idemsqlite: outbox row %d (event %s): %w", r.ID, o.EventID, err)
		}
		o.OccurredAt = fromNullMicros(occurred)
		r.CreatedAt = fromMicros(created)
		r.NextAttemptAt = fromMicros(nextTime)
		r.FirstAttemptAt = fromNullMicros(first)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idemsqlite: fetch outbox partitions %v: %w", p.Partitions, err)
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
	if _, err := s.execWrite(ctx, s.q.outboxMarkPublished, at.UnixMicro(), int64List(ids)); err != nil {
		return fmt.Errorf("idemsqlite: mark outbox rows %v published: %w", ids, err)
	}
	return nil
}

// OutboxMarkFailed records a failed publish of row p.ID: attempts, last error, next and first
// attempt times, and whether it is dead (holding its key while it has a dead letter). An unknown id is an error wrapping
// idem.ErrNotFound.
func (s *Store) OutboxMarkFailed(ctx context.Context, p idemstore.OutboxFailParams) error {
	var first sql.NullInt64
	if !p.FirstAttemptAt.IsZero() {
		first = sql.NullInt64{Int64: p.FirstAttemptAt.UnixMicro(), Valid: true}
	}
	res, err := s.execWrite(ctx, s.q.outboxMarkFailed, p.Attempts, p.LastError, p.NextAttemptAt.UnixMicro(), p.Dead,
		first, p.DeadLetterID, p.ID)
	if err != nil {
		return fmt.Errorf("idemsqlite: mark outbox row %d failed: %w", p.ID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("idemsqlite: mark outbox row %d failed: rows affected: %w", p.ID, err)
	}
	if n == 0 {
		return fmt.Errorf("idemsqlite: mark outbox row %d failed: %w", p.ID, idem.ErrNotFound)
	}
	return nil
}

// OutboxDeletePublished deletes up to limit rows published before before, in one short
// transaction, and reports how many it deleted; callers loop while it equals limit.
func (s *Store) OutboxDeletePublished(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("idemsqlite: delete published outbox rows: limit is %d, want more than 0", limit)
	}
	res, err := s.execWrite(ctx, s.q.outboxDelete, before.UnixMicro(), limit)
	if err != nil {
		return 0, fmt.Errorf("idemsqlite: delete outbox rows published before %s: %w", before.UTC().Format(time.RFC3339), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("idemsqlite: delete published outbox rows: rows affected: %w", err)
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
	s.ownPoolUse()
	defer s.ownPoolDone()
	if err := s.db.QueryRowContext(ctx, s.q.outboxStats).Scan(&st.Backlog, &oldest); err != nil {
		return st, fmt.Errorf("idemsqlite: outbox stats: %w", err)
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
// or already p.Owner's (a renewal), in one upsert. The token grows by one each time the lease
// changes owner and stays the same on renewal; ok is false when someone else holds it.
func (s *Store) LeaseAcquire(ctx context.Context, p idemstore.LeaseParams) (int64, bool, error) {
	if p.Name == "" || p.Owner == "" {
		return 0, false, fmt.Errorf("idemsqlite: acquire lease %q for %q: name and owner are required", p.Name, p.Owner)
	}
	if p.TTL <= 0 {
		return 0, false, fmt.Errorf("idemsqlite: acquire lease %q for %q: TTL is %s, want more than 0", p.Name, p.Owner, p.TTL)
	}
	now := p.Now
	if now.IsZero() {
		now = time.Now()
	}
	var token int64
	err := s.write(ctx, func(ctx context.Context, c *sql.Conn) error {
		return c.QueryRowContext(ctx, s.q.leaseAcquire, p.Name, p.Owner, now.Add(p.TTL).UnixMicro(), now.UnixMicro()).Scan(&token)
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("idemsqlite: acquire lease %q for %q: %w", p.Name, p.Owner, err)
	}
	return token, true, nil
}

// LeaseRelease gives up the named lease if owner holds it; otherwise it does nothing. The row
// and its token stay, so whoever takes the lease next gets a larger token.
func (s *Store) LeaseRelease(ctx context.Context, name, owner string) error {
	if _, err := s.execWrite(ctx, s.q.leaseRelease, int64(math.MinInt64), name, owner); err != nil {
		return fmt.Errorf("idemsqlite: release lease %q of %q: %w", name, owner, err)
	}
	return nil
}

// LeaseList returns the leases whose names start with prefix and that are held at now, by name.
func (s *Store) LeaseList(ctx context.Context, prefix string, now time.Time) ([]idemstore.Lease, error) {
	if now.IsZero() {
		now = time.Now()
	}
	s.ownPoolUse()
	defer s.ownPoolDone()
	rows, err := s.db.QueryContext(ctx, s.q.leaseList, prefix, now.UnixMicro())
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: list leases %q*: %w", prefix, err)
	}
	defer rows.Close()
	var out []idemstore.Lease
	for rows.Next() {
		var (
			l     idemstore.Lease
			until int64
		)
		if err := rows.Scan(&l.Name, &l.Owner, &l.Token, &until); err != nil {
			return nil, fmt.Errorf("idemsqlite: list leases %q*: %w", prefix, err)
		}
		l.LeaseUntil = fromMicros(until)
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idemsqlite: list leases %q*: %w", prefix, err)
	}
	return out, nil
}
