package idempg

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// QueuePublish inserts msgs into queue in a transaction of its own and notifies waiting
// workers when it commits.
func (s *Store) QueuePublish(ctx context.Context, queue string, msgs ...idem.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	return s.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		return s.QueuePublishTx(ctx, tx, queue, msgs...)
	})
}

// QueuePublishTx inserts msgs into queue inside tx, in one statement (the messages as arrays),
// sent in one round trip together with a pg_notify on the {prefix}queue channel that PostgreSQL
// delivers when tx commits (and drops if it rolls back). Every message needs an EventID. When
// queue is a topic with subscriptions (QueueSubscribe), each message becomes one job per
// subscription, in the same statement. Jobs get ids in the order of msgs.
func (s *Store) QueuePublishTx(ctx context.Context, tx pgx.Tx, queue string, msgs ...idem.Message) error {
	if queue == "" {
		return errors.New("idempg: publish to queue: queue name is empty")
	}
	if len(msgs) == 0 {
		return nil
	}
	now := time.Now().UTC()
	var (
		ids      = make([]string, len(msgs))
		tenants  = make([]string, len(msgs))
		types    = make([]string, len(msgs))
		payloads = make([][]byte, len(msgs))
		headers  = make([]string, len(msgs))
		occurred = make([]pgtype.Timestamptz, len(msgs))
	)
	for i, m := range msgs {
		if m.EventID == "" {
			return fmt.Errorf("idempg: publish to queue %q: message %d (type %q) has an empty event id", queue, i, m.Type)
		}
		h, err := encodeHeaders(m.Headers)
		if err != nil {
			return fmt.Errorf("idempg: publish event %s to queue %s: %w", m.EventID, queue, err)
		}
		ids[i], tenants[i], types[i], payloads[i], headers[i], occurred[i] = m.EventID, m.Tenant, m.Type, m.Payload, string(h), nullTime(m.OccurredAt)
	}
	var b pgx.Batch
	b.Queue(s.q.queueInsert, queue, ids, tenants, types, payloads, headers, occurred, now)
	b.Queue(s.q.queueNotify, s.q.queueChannel, queue)
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("idempg: publish %d messages (first event %s) to queue %s: %w", len(msgs), msgs[0].EventID, queue, err)
	}
	return nil
}

// QueueFetch leases up to p.Max available jobs of p.Queue (available_at <= now, lease never
// taken or expired), oldest id first, until now+p.Lease. It increments each job's fencing token
// and attempt count, and records now as the job's first fetch unless one is recorded, in the same
// statement; FOR UPDATE SKIP LOCKED lets concurrent workers take
// different jobs without waiting on each other.
func (s *Store) QueueFetch(ctx context.Context, p idemstore.QueueFetchParams) ([]idemstore.QueueJob, error) {
	switch {
	case p.Queue == "":
		return nil, errors.New("idempg: fetch from queue: queue name is empty")
	case p.Max <= 0:
		return nil, fmt.Errorf("idempg: fetch from queue %s: Max is %d, want more than 0", p.Queue, p.Max)
	case p.Lease <= 0:
		return nil, fmt.Errorf("idempg: fetch from queue %s: Lease is %s, want more than 0", p.Queue, p.Lease)
	}
	// The connection first, then the clock (LeaseStart): a wait for one in a busy pool must not
	// come off the leases.
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("idempg: fetch from queue %s: %w", p.Queue, err)
	}
	defer conn.Release()
	now := p.LeaseStart()
	rows, err := conn.Query(ctx, s.q.queueFetch, p.Queue, now, now.Add(p.Lease), p.Max)
	if err != nil {
		return nil, fmt.Errorf("idempg: fetch from queue %s: %w", p.Queue, err)
	}
	jobs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (idemstore.QueueJob, error) {
		var (
			j        idemstore.QueueJob
			headers  []byte
			occurred pgtype.Timestamptz
			first    pgtype.Timestamptz
		)
		m := &j.Message
		if err := r.Scan(&j.ID, &j.Token, &m.Attempt, &m.EventID, &m.Tenant, &m.Type, &m.Payload,
			&headers, &occurred, &m.PublishedAt, &first); err != nil {
			return j, err
		}
		var err error
		if m.Headers, err = decodeHeaders(headers); err != nil {
			return j, fmt.Errorf("job %d (event %s): %w", j.ID, m.EventID, err)
		}
		m.OccurredAt = timeOf(occurred)
		m.PublishedAt = m.PublishedAt.UTC()
		j.FirstFetchedAt = timeOf(first)
		return j, nil
	})
	if err != nil {
		return nil, fmt.Errorf("idempg: fetch from queue %s: %w", p.Queue, err)
	}
	// RETURNING does not keep the subquery's order.
	slices.SortFunc(jobs, func(a, b idemstore.QueueJob) int { return cmp.Compare(a.ID, b.ID) })
	return jobs, nil
}

// QueueAck deletes job id if its lease token is still token; otherwise the lease was lost (the
// job was fetched again, nak'ed, or is gone) and the error wraps idem.ErrLeaseLost.
func (s *Store) QueueAck(ctx context.Context, id, token int64) error {
	return s.ack(ctx, s.pool, id, token)
}

// QueueAckTx deletes job id inside tx if its token still matches, else returns an error
// wrapping idem.ErrLeaseLost. The deleted row stays locked until tx ends, so a worker that
// fetches the job meanwhile (its lease having expired) waits; if tx commits the job is gone,
// and if tx rolls back nothing was acked.
//
// In a transaction of InTx (the consumer's) the delete is deferred to the commit: one statement
// deletes every job the transaction acked and goes to the server with the COMMIT, in one round
// trip, so a delivery's ack costs no round trip of its own. A lost lease then fails that
// statement, the server skips the COMMIT, and InTx rolls back and returns an error wrapping
// idem.ErrLeaseLost, as if this call had failed.
func (s *Store) QueueAckTx(ctx context.Context, tx pgx.Tx, id, token int64) error {
	if s.deferredAck(tx, id, token) {
		return nil
	}
	return s.ack(ctx, tx, id, token)
}

// execer is what pgxpool.Pool and pgx.Tx share for statements without rows.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func (s *Store) ack(ctx context.Context, db execer, id, token int64) error {
	tag, err := db.Exec(ctx, s.q.queueAck, id, token)
	if err != nil {
		return fmt.Errorf("idempg: ack queue job %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return errAckLost(id, token)
	}
	return nil
}

// errAckLost is the error of an ack of job id whose token no longer holds it.
func errAckLost(id, token int64) error {
	return fmt.Errorf("idempg: ack queue job %d with token %d: %w", id, token, idem.ErrLeaseLost)
}

// QueueNak releases job p.ID for another attempt at now+p.Delay, recording p.Error, if its
// token is still p.Token and it was not nak'ed already; otherwise the error wraps
// idem.ErrLeaseLost. Releasing ends the lease: the token no longer acks or naks the job.
func (s *Store) QueueNak(ctx context.Context, p idemstore.QueueNakParams) error {
	delay := max(p.Delay, 0)
	tag, err := s.pool.Exec(ctx, s.q.queueNak, p.ID, p.Token, orNow(p.Now).Add(delay), p.Error)
	if err != nil {
		return fmt.Errorf("idempg: nak queue job %d: %w", p.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("idempg: nak queue job %d with token %d: %w", p.ID, p.Token, idem.ErrLeaseLost)
	}
	return nil
}

// QueueExtend pushes job id's lease to now+lease if its token still matches and its lease has
// not expired yet; otherwise the error wraps idem.ErrLeaseLost (an expired lease may be taken
// by another worker at any moment, so it is not revived).
func (s *Store) QueueExtend(ctx context.Context, id, token int64, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("idempg: extend queue job %d: lease is %s, want more than 0", id, lease)
	}
	now := time.Now().UTC()
	tag, err := s.pool.Exec(ctx, s.q.queueExtend, id, token, now.Add(lease), now)
	if err != nil {
		return fmt.Errorf("idempg: extend queue job %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("idempg: extend queue job %d with token %d: %w", id, token, idem.ErrLeaseLost)
	}
	return nil
}

// QueueWait blocks until something is published to queue (a notification on the {prefix}queue
// channel, delivered to one LISTEN connection the Store shares among all waiters), max elapses
// (1 s when max <= 0) or ctx ends; it returns ctx.Err() only in the last case. When the
// listening connection is unavailable it just sleeps max, and the caller polls. Wake-ups may be
// spurious, and jobs that become available by time (a nak's delay) notify nobody: callers
// fetch after every return.
func (s *Store) QueueWait(ctx context.Context, queue string, max time.Duration) error {
	return s.listen.wait(ctx, waitKey{queue: queue}, max)
}

// QueueStats reports queue's backlog (jobs not yet acked, leased or not) and the enqueue time
// of its oldest job (zero when empty).
func (s *Store) QueueStats(ctx context.Context, queue string) (idemstore.QueueStats, error) {
	var (
		st     idemstore.QueueStats
		oldest pgtype.Timestamptz
	)
	if err := s.pool.QueryRow(ctx, s.q.queueStats, queue).Scan(&st.Backlog, &oldest); err != nil {
		return idemstore.QueueStats{}, fmt.Errorf("idempg: stats of queue %s: %w", queue, err)
	}
	st.Oldest = timeOf(oldest)
	return st, nil
}
