package idempg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// OutboxPartitions is the fixed number of partitions outbox rows are hashed into
// (Config.OutboxPartitions).
func (s *Store) OutboxPartitions() int { return s.cfg.OutboxPartitions }

// EnqueueTx inserts outgoing events inside the caller's transaction, so they commit or roll
// back with its business write, in one round trip together with a pg_notify on the
// {prefix}outbox channel that PostgreSQL delivers at commit and wakes the relays. Every event
// is validated first (idem.Outgoing.Validate); its partition is idemstore.OutboxPartition of its
// ordering key, and a zero OccurredAt is the enqueue time.
func (s *Store) EnqueueTx(ctx context.Context, tx pgx.Tx, msgs ...idem.Outgoing) error {
	if len(msgs) == 0 {
		return nil
	}
	for _, o := range msgs {
		if err := o.Validate(); err != nil {
			return fmt.Errorf("idempg: enqueue: %w", err)
		}
	}
	now := time.Now().UTC()
	var b pgx.Batch
	for _, o := range msgs {
		headers, err := encodeHeaders(o.Headers)
		if err != nil {
			return fmt.Errorf("idempg: enqueue event %s: %w", o.EventID, err)
		}
		occurred := o.OccurredAt
		if occurred.IsZero() {
			occurred = now
		}
		b.Queue(s.q.outboxInsert, idemstore.OutboxPartition(o, s.cfg.OutboxPartitions), o.EventID, o.Tenant,
			o.Topic, o.Key, o.Type, o.Payload, headers, occurred, now)
	}
	b.Queue(s.q.outboxNotify, s.q.outboxChannel)
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("idempg: enqueue %d events (first %s): %w", len(msgs), msgs[0].EventID, err)
	}
	return nil
}

// OutboxFetch returns up to p.Limit (100 when it is 0) unpublished rows of p.Partitions in
// enqueue order, due or not: the relay holds back a key behind a row that is not yet due, and
// behind a dead row with a dead letter until that is replayed or discarded.
// It takes no locks; partition leases keep relays apart.
func (s *Store) OutboxFetch(ctx context.Context, p idemstore.OutboxFetchParams) ([]idemstore.OutboxRow, error) {
	if len(p.Partitions) == 0 {
		return nil, nil
	}
	limit := p.Limit
	if limit <= 0 {
		limit = listLimitDefault
	}
	rows, err := s.pool.Query(ctx, s.q.outboxFetch, p.Partitions, limit)
	if err != nil {
		return nil, fmt.Errorf("idempg: fetch outbox partitions %v: %w", p.Partitions, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (idemstore.OutboxRow, error) {
		var (
			row      idemstore.OutboxRow
			headers  []byte
			occurred pgtype.Timestamptz
			first    pgtype.Timestamptz
		)
		o := &row.Outgoing
		if err := r.Scan(&row.ID, &row.Partition, &o.EventID, &o.Tenant, &o.Topic, &o.Key, &o.Type,
			&o.Payload, &headers, &occurred, &row.CreatedAt, &row.Attempts, &row.LastError,
			&row.NextAttemptAt, &first, &row.Dead, &row.DeadLetterID); err != nil {
			return row, err
		}
		var err error
		if o.Headers, err = decodeHeaders(headers); err != nil {
			return row, fmt.Errorf("outbox row %d (event %s): %w", row.ID, o.EventID, err)
		}
		o.OccurredAt = timeOf(occurred)
		row.CreatedAt = row.CreatedAt.UTC()
		row.NextAttemptAt = row.NextAttemptAt.UTC()
		row.FirstAttemptAt = timeOf(first)
		return row, nil
	})
	if err != nil {
		return nil, fmt.Errorf("idempg: fetch outbox partitions %v: %w", p.Partitions, err)
	}
	return out, nil
}

// OutboxMarkPublished sets published_at to at (now when zero) on the rows.
func (s *Store) OutboxMarkPublished(ctx context.Context, ids []int64, at time.Time) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := s.pool.Exec(ctx, s.q.outboxMarkPublished, ids, orNow(at)); err != nil {
		return fmt.Errorf("idempg: mark outbox rows %v published: %w", ids, err)
	}
	return nil
}

// OutboxMarkFailed records a failed publish of row p.ID: its attempts, last error, next and
// first attempt times, and whether it is dead (with its dead letter). A row that does not exist is an error wrapping
// idem.ErrNotFound.
func (s *Store) OutboxMarkFailed(ctx context.Context, p idemstore.OutboxFailParams) error {
	var first pgtype.Timestamptz
	if !p.FirstAttemptAt.IsZero() {
		first = pgtype.Timestamptz{Time: p.FirstAttemptAt, Valid: true}
	}
	tag, err := s.pool.Exec(ctx, s.q.outboxMarkFailed, p.ID, p.Attempts, p.LastError, orNow(p.NextAttemptAt), p.Dead,
		first, p.DeadLetterID)
	if err != nil {
		return fmt.Errorf("idempg: mark outbox row %d failed: %w", p.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("idempg: mark outbox row %d failed: %w", p.ID, idem.ErrNotFound)
	}
	return nil
}

// OutboxDeletePublished deletes up to limit rows published before before, in one statement,
// and reports how many it deleted; callers loop while the count equals the limit.
func (s *Store) OutboxDeletePublished(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("idempg: delete published outbox rows: limit is %d, want more than 0", limit)
	}
	tag, err := s.pool.Exec(ctx, s.q.outboxDeletePublished, before, limit)
	if err != nil {
		return 0, fmt.Errorf("idempg: delete outbox rows published before %s: %w", before.UTC().Format(time.RFC3339), err)
	}
	return int(tag.RowsAffected()), nil
}

// OutboxStats reports the rows the relays still have to publish (unpublished and not dead) and
// the creation time of the oldest (zero when none).
func (s *Store) OutboxStats(ctx context.Context) (idemstore.QueueStats, error) {
	var (
		st     idemstore.QueueStats
		oldest pgtype.Timestamptz
	)
	if err := s.pool.QueryRow(ctx, s.q.outboxStats).Scan(&st.Backlog, &oldest); err != nil {
		return idemstore.QueueStats{}, fmt.Errorf("idempg: outbox stats: %w", err)
	}
	st.Oldest = timeOf(oldest)
	return st, nil
}

// OutboxWait blocks until something is enqueued (a notification on the {prefix}outbox channel,
// see QueueWait), max elapses (1 s when max <= 0) or ctx ends; it returns ctx.Err() only in the
// last case.
func (s *Store) OutboxWait(ctx context.Context, max time.Duration) error {
	return s.listen.wait(ctx, waitKey{outbox: true}, max)
}

// LeaseAcquire takes or renews the lease p.Name for p.Owner until now+p.TTL, in one upsert. It
// succeeds (ok) when the lease is free, expired, or already p.Owner's; the token increases
// whenever the lease changes owner and stays when the owner renews.
func (s *Store) LeaseAcquire(ctx context.Context, p idemstore.LeaseParams) (int64, bool, error) {
	switch {
	case p.Name == "":
		return 0, false, errors.New("idempg: acquire lease: name is empty")
	case p.Owner == "":
		return 0, false, fmt.Errorf("idempg: acquire lease %s: owner is empty", p.Name)
	case p.TTL <= 0:
		return 0, false, fmt.Errorf("idempg: acquire lease %s: TTL is %s, want more than 0", p.Name, p.TTL)
	}
	now := orNow(p.Now)
	var token int64
	err := s.pool.QueryRow(ctx, s.q.leaseAcquire, p.Name, p.Owner, now.Add(p.TTL), now).Scan(&token)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil // held by someone else
	}
	if err != nil {
		return 0, false, fmt.Errorf("idempg: acquire lease %s for %s: %w", p.Name, p.Owner, err)
	}
	return token, true, nil
}

// LeaseRelease gives lease name up if owner holds it, by expiring it; the row stays so that the
// next owner's token is still higher.
func (s *Store) LeaseRelease(ctx context.Context, name, owner string) error {
	if _, err := s.pool.Exec(ctx, s.q.leaseRelease, name, owner); err != nil {
		return fmt.Errorf("idempg: release lease %s of %s: %w", name, owner, err)
	}
	return nil
}

// LeaseList returns the leases unexpired at now whose names start with prefix, by name.
func (s *Store) LeaseList(ctx context.Context, prefix string, now time.Time) ([]idemstore.Lease, error) {
	rows, err := s.pool.Query(ctx, s.q.leaseList, prefix, orNow(now))
	if err != nil {
		return nil, fmt.Errorf("idempg: list leases %q: %w", prefix, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (idemstore.Lease, error) {
		var l idemstore.Lease
		err := r.Scan(&l.Name, &l.Owner, &l.Token, &l.LeaseUntil)
		l.LeaseUntil = l.LeaseUntil.UTC()
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("idempg: list leases %q: %w", prefix, err)
	}
	return out, nil
}
