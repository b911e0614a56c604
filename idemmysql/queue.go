package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// QueuePublish inserts msgs into queue in a transaction of its own (READ COMMITTED, run again
// after a deadlock), available at once, and wakes this process's QueueWait callers after commit.
func (s *Store) QueuePublish(ctx context.Context, queue string, msgs ...idem.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	return s.ownTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		return s.QueuePublishTx(ctx, tx, queue, msgs...)
	})
}

// QueuePublishTx inserts msgs into queue inside tx, so they commit or roll back with the
// caller's business write. When queue is a topic with subscriptions (QueueSubscribe), each
// message becomes one job per subscription, in the same transaction (see publishTargets). Waiters in this process are woken after commit when tx came from
// InTx, and at once otherwise.
func (s *Store) QueuePublishTx(ctx context.Context, tx *sql.Tx, queue string, msgs ...idem.Message) error {
	if queue == "" {
		return fmt.Errorf("idemmysql: publish %d messages: queue name is empty", len(msgs))
	}
	if len(queue) > 256 {
		return fmt.Errorf("idemmysql: publish %d messages: queue name has %d bytes, more than 256", len(msgs), len(queue))
	}
	if len(msgs) == 0 {
		return nil
	}
	now := time.Now().UnixMicro()
	targets, err := s.publishTargets(ctx, tx, queue)
	if err != nil {
		return fmt.Errorf("idemmysql: publish %d messages to queue %q: %w", len(msgs), queue, err)
	}
	for i, m := range msgs {
		if m.EventID == "" {
			return fmt.Errorf("idemmysql: publish to queue %q: message %d has an empty event id", queue, i)
		}
		headers, err := encodeHeaders(m.Headers)
		if err != nil {
			return fmt.Errorf("idemmysql: publish event %s to queue %q: %w", m.EventID, queue, err)
		}
		for _, q := range targets {
			if _, err := tx.ExecContext(ctx, s.q.queueInsert, []byte(q), []byte(m.EventID), []byte(m.Tenant), []byte(m.Type),
				nonNil(m.Payload), headers, nullMicros(m.OccurredAt), now, now); err != nil {
				return fmt.Errorf("idemmysql: publish event %s to queue %q: %w", m.EventID, q, err)
			}
		}
	}
	s.wakeAfter(tx, wakeQueue)
	return nil
}

// QueueFetch leases up to p.Max jobs of p.Queue that are available (available_at <= p.Now) and
// not leased (lease_until NULL or past), lowest id first, in one READ COMMITTED transaction (no
// gap locks, so publishers never wait for a fetch): SELECT … FOR UPDATE SKIP LOCKED picks and
// locks the rows (concurrent fetchers skip them instead of
// waiting), an UPDATE sets lease_until = p.Now+p.Lease, increments token and attempts and records
// p.Now as the first fetch unless one is recorded, and a SELECT reads them back.
func (s *Store) QueueFetch(ctx context.Context, p idemstore.QueueFetchParams) ([]idemstore.QueueJob, error) {
	if p.Max <= 0 {
		return nil, nil
	}
	if p.Lease <= 0 {
		return nil, fmt.Errorf("idemmysql: fetch from queue %q: Lease is %s, want more than 0", p.Queue, p.Lease)
	}
	var jobs []idemstore.QueueJob
	err := s.ownTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		jobs = jobs[:0]
		at := p.LeaseStart()
		rows, err := tx.QueryContext(ctx, s.q.queueLock, []byte(p.Queue), at.UnixMicro(), at.UnixMicro(), p.Max)
		if err != nil {
			return err
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				_ = rows.Close()
				return err
			}
			ids = append(ids, id)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		// The leases run from when the rows are locked (LeaseStart): the locking read waits for
		// a free connection and for table locks (a migration's, a LOCK TABLES), and that wait
		// must not come off the leases.
		now := p.LeaseStart()
		in := inList(len(ids))
		if _, err := tx.ExecContext(ctx, s.q.queueLease+in, int64Args([]any{now.Add(p.Lease).UnixMicro(), now.UnixMicro()}, ids)...); err != nil {
			return err
		}
		rows, err = tx.QueryContext(ctx, s.q.queueRead+in+" ORDER BY id", int64Args(nil, ids)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				j        idemstore.QueueJob
				headers  string
				occurred sql.NullInt64
				enqueued int64
				first    sql.NullInt64
				m        = &j.Message
			)
			if err := rows.Scan(&j.ID, &j.Token, &m.Attempt, &m.EventID, &m.Tenant, &m.Type, &m.Payload,
				&headers, &occurred, &enqueued, &first); err != nil {
				return err
			}
			if m.Headers, err = decodeHeaders(headers); err != nil {
				return fmt.Errorf("job %d (event %s): %w", j.ID, m.EventID, err)
			}
			m.OccurredAt = fromNullMicros(occurred)
			m.PublishedAt = fromMicros(enqueued)
			j.FirstFetchedAt = fromNullMicros(first)
			jobs = append(jobs, j)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("idemmysql: fetch from queue %q: %w", p.Queue, err)
	}
	return jobs, nil
}

// QueueAck deletes job id if token is still its lease token, else it returns an error wrapping
// idem.ErrLeaseLost.
func (s *Store) QueueAck(ctx context.Context, id, token int64) error {
	return s.ack(ctx, s.db, id, token)
}

// QueueAckTx deletes job id inside tx if token is still its lease token, else it returns an error
// wrapping idem.ErrLeaseLost. The deleted row stays locked until tx ends, so no other worker can
// fetch the job in between, and a lost lease rolls the handler back.
func (s *Store) QueueAckTx(ctx context.Context, tx *sql.Tx, id, token int64) error {
	return s.ack(ctx, tx, id, token)
}

// execer is a *sql.DB or *sql.Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func (s *Store) ack(ctx context.Context, db execer, id, token int64) error {
	res, err := db.ExecContext(ctx, s.q.queueAck, id, token)
	if err != nil {
		return fmt.Errorf("idemmysql: ack queue job %d: %w", id, err)
	}
	return leaseCheck(res, "ack", id, token)
}

// QueueNak releases job p.ID for another attempt at p.Now+p.Delay, recording p.Error, if p.Token
// is still its lease token; else it returns an error wrapping idem.ErrLeaseLost.
func (s *Store) QueueNak(ctx context.Context, p idemstore.QueueNakParams) error {
	now := p.Now
	if now.IsZero() {
		now = time.Now()
	}
	delay := max(p.Delay, 0)
	res, err := s.db.ExecContext(ctx, s.q.queueNak, now.Add(delay).UnixMicro(), text(p.Error), p.ID, p.Token)
	if err != nil {
		return fmt.Errorf("idemmysql: nak queue job %d: %w", p.ID, err)
	}
	if err := leaseCheck(res, "nak", p.ID, p.Token); err != nil {
		return err
	}
	if delay == 0 {
		s.queueWake.signal() // available again at once
	}
	return nil
}

// QueueExtend pushes job id's lease to now+lease if token is still its lease token and the lease
// has not expired yet; else it returns an error wrapping idem.ErrLeaseLost (an expired lease may
// already be fetched by another worker, so it cannot be extended).
func (s *Store) QueueExtend(ctx context.Context, id, token int64, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("idemmysql: extend lease of queue job %d: lease is %s, want more than 0", id, lease)
	}
	now := time.Now()
	res, err := s.db.ExecContext(ctx, s.q.queueExtend, now.Add(lease).UnixMicro(), id, token, now.UnixMicro())
	if err != nil {
		return fmt.Errorf("idemmysql: extend lease of queue job %d: %w", id, err)
	}
	return leaseCheck(res, "extend lease of", id, token)
}

// QueueRelease gives back job id that a fetch leased but nobody received (the receive's context
// ended as the fetch committed): it ends the lease and takes back the attempt the fetch counted,
// so the job is available at once, as if never fetched. A job whose attempts go back to 0 also
// loses its first-fetch time: it never really ran, so its retry budget has not started
// (first_fetched_at is assigned before attempts: MySQL assigns left to right, each seeing the
// previous ones). It is fenced by token like QueueNak; a
// lease no longer held is an error wrapping idem.ErrLeaseLost.
func (s *Store) QueueRelease(ctx context.Context, id, token int64) error {
	res, err := s.db.ExecContext(ctx, s.sub(`UPDATE {{prefix}}queue
		SET lease_until = NULL,
			first_fetched_at = CASE WHEN attempts <= 1 THEN NULL ELSE first_fetched_at END,
			attempts = GREATEST(attempts - 1, 0)
		WHERE id = ? AND token = ? AND lease_until IS NOT NULL`), id, token)
	if err != nil {
		return fmt.Errorf("idemmysql: release queue job %d: %w", id, err)
	}
	if err := leaseCheck(res, "release", id, token); err != nil {
		return err
	}
	s.queueWake.signal() // available again at once
	return nil
}

// leaseCheck turns "no row matched id and token" into idem.ErrLeaseLost. Every statement it
// checks changes the row it matches (a new lease_until, or a delete), so 0 rows affected means
// no row matched.
func leaseCheck(res sql.Result, op string, id, token int64) error {
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("idemmysql: %s queue job %d: rows affected: %w", op, id, err)
	}
	if n == 0 {
		return fmt.Errorf("idemmysql: %s queue job %d with token %d: %w", op, id, token, idem.ErrLeaseLost)
	}
	return nil
}

// QueueWait returns nil when something is published to the queue table through this Store (any
// queue: a spurious wake-up only costs a poll), after min(PollInterval, max) (PollInterval when
// max <= 0), or ctx.Err() when ctx ends. Publishes from other processes are found by the poll
// that follows.
func (s *Store) QueueWait(ctx context.Context, queue string, max time.Duration) error {
	return s.waitFor(ctx, &s.queueWake, max)
}

// QueueStats reports how many jobs of queue are not yet acked and when the oldest was enqueued.
func (s *Store) QueueStats(ctx context.Context, queue string) (idemstore.QueueStats, error) {
	var (
		st     idemstore.QueueStats
		oldest sql.NullInt64
	)
	if err := s.db.QueryRowContext(ctx, s.q.queueStats, []byte(queue)).Scan(&st.Backlog, &oldest); err != nil {
		return st, fmt.Errorf("idemmysql: stats of queue %q: %w", queue, err)
	}
	st.Oldest = fromNullMicros(oldest)
	return st, nil
}
