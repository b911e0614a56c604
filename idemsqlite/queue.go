package idemsqlite

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/idemkit/idem"
)

// QueuePublish inserts msgs into queue in a transaction of its own, available at once, and
// wakes this process's QueueWait callers after commit.
func (s *Store) QueuePublish(ctx context.Context, queue string, msgs ...idem.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	return s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		return s.QueuePublishTx(ctx, tx, queue, msgs...)
	})
}

// QueuePublishTx inserts msgs into queue inside tx, so they commit or roll back with the
// caller's business write. When queue is a topic with subscriptions (QueueSubscribe), each
// message becomes one job per subscription, in the same transaction (see publishTargets). Waiters in this process are woken after commit when tx came from
// InTx, and at once otherwise.
func (s *Store) QueuePublishTx(ctx context.Context, tx *sql.Tx, queue string, msgs ...idem.Message) error {
	if queue == "" {
		return fmt.Errorf("idemsqlite: publish %d messages: queue name is empty", len(msgs))
	}
	if len(msgs) == 0 {
		return nil
	}
	now := time.Now().UnixMicro()
	targets, err := s.publishTargets(ctx, tx, queue)
	if err != nil {
		return fmt.Errorf("idemsqlite: publish %d messages to queue %q: %w", len(msgs), queue, err)
	}
	for i, m := range msgs {
		if m.EventID == "" {
			return fmt.Errorf("idemsqlite: publish to queue %q: message %d has an empty event id", queue, i)
		}
		headers, err := encodeHeaders(m.Headers)
		if err != nil {
			return fmt.Errorf("idemsqlite: publish event %s to queue %q: %w", m.EventID, queue, err)
		}
		for _, q := range targets {
			if _, err := tx.ExecContext(ctx, s.q.queueInsert, q, m.EventID, m.Tenant, m.Type, m.Payload,
				headers, nullMicros(m.OccurredAt), now, now); err != nil {
				return fmt.Errorf("idemsqlite: publish event %s to queue %q: %w", m.EventID, q, err)
			}
		}
	}
	s.wakeAfter(tx, wakeQueue)
	return nil
}

// QueueFetch leases up to p.Max jobs of p.Queue that are available (available_at <= p.Now) and
// not leased (lease_until NULL or past), lowest id first, in one UPDATE … RETURNING: each gets
// lease_until = p.Now+p.Lease, its token and attempts incremented, and p.Now as its first fetch
// unless one is recorded. SQLite's single writer
// makes the statement atomic, so no other fetch can lease the same job.
func (s *Store) QueueFetch(ctx context.Context, p idem.QueueFetchParams) ([]idem.QueueJob, error) {
	if p.Max <= 0 {
		return nil, nil
	}
	if p.Lease <= 0 {
		return nil, fmt.Errorf("idemsqlite: fetch from queue %q: Lease is %s, want more than 0", p.Queue, p.Lease)
	}
	now := p.Now
	if now.IsZero() {
		now = time.Now()
	}
	var jobs []idem.QueueJob
	scan := func(rows *sql.Rows) error {
		var (
			j        idem.QueueJob
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
		var err error
		if m.Headers, err = decodeHeaders(headers); err != nil {
			return fmt.Errorf("job %d (event %s): %w", j.ID, m.EventID, err)
		}
		m.OccurredAt = fromNullMicros(occurred)
		m.PublishedAt = fromMicros(enqueued)
		j.FirstFetchedAt = fromNullMicros(first)
		jobs = append(jobs, j)
		return nil
	}
	err := s.queryWrite(ctx, func() { jobs = nil }, scan, s.q.queueFetch,
		now.Add(p.Lease).UnixMicro(), p.Queue, now.UnixMicro(), p.Max)
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: fetch from queue %q: %w", p.Queue, err)
	}
	// RETURNING does not promise an order.
	slices.SortFunc(jobs, func(a, b idem.QueueJob) int { return cmp.Compare(a.ID, b.ID) })
	return jobs, nil
}

// QueueAck deletes job id if token is still its lease token, else it returns an error wrapping
// idem.ErrLeaseLost.
func (s *Store) QueueAck(ctx context.Context, id, token int64) error {
	res, err := s.execWrite(ctx, s.q.queueAck, id, token)
	if err != nil {
		return fmt.Errorf("idemsqlite: ack queue job %d: %w", id, err)
	}
	return leaseCheck(res, "ack", id, token)
}

// QueueAckTx deletes job id inside tx if token is still its lease token, else it returns an error
// wrapping idem.ErrLeaseLost. The caller's transaction holds SQLite's write lock until it ends,
// so no other worker can fetch the job in between, and a lost lease rolls the handler back.
func (s *Store) QueueAckTx(ctx context.Context, tx *sql.Tx, id, token int64) error {
	res, err := tx.ExecContext(ctx, s.q.queueAck, id, token)
	if err != nil {
		return fmt.Errorf("idemsqlite: ack queue job %d: %w", id, err)
	}
	return leaseCheck(res, "ack", id, token)
}

// QueueNak releases job p.ID for another attempt at p.Now+p.Delay, recording p.Error, if p.Token
// is still its lease token; else it returns an error wrapping idem.ErrLeaseLost.
func (s *Store) QueueNak(ctx context.Context, p idem.QueueNakParams) error {
	now := p.Now
	if now.IsZero() {
		now = time.Now()
	}
	delay := max(p.Delay, 0)
	res, err := s.execWrite(ctx, s.q.queueNak, now.Add(delay).UnixMicro(), p.Error, p.ID, p.Token)
	if err != nil {
		return fmt.Errorf("idemsqlite: nak queue job %d: %w", p.ID, err)
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
//
// While an InTx transaction of this Store is open — typically the handler of this very job, which
// holds the one connection — QueueExtend does not wait for it: that transaction holds SQLite's
// write lock, so no other process can fetch the job until it ends. QueueExtend then records the
// extension and returns nil, and the open transaction applies it (and every other recorded one)
// just before it commits, still under the lock, fenced by the token. The job's own ack, inside
// the handler's transaction, is fenced by the token as well, so a lease that did run out before
// that transaction began is found lost there and the handler's effect rolls back.
func (s *Store) QueueExtend(ctx context.Context, id, token int64, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("idemsqlite: extend lease of queue job %d: lease is %s, want more than 0", id, lease)
	}
	acquired, err := s.gate.acquireUnlessTx(ctx)
	if err != nil {
		return fmt.Errorf("idemsqlite: extend lease of queue job %d: %w", id, err)
	}
	if !acquired {
		s.extMu.Lock()
		s.pendingExt[id] = pendingExtension{token: token, lease: lease}
		s.extMu.Unlock()
		return nil
	}
	s.extMu.Lock()
	delete(s.pendingExt, id) // superseded
	s.extMu.Unlock()
	var res sql.Result
	now := time.Now()
	err = s.heldWrite(ctx, func(ctx context.Context, c *sql.Conn) error {
		var err error
		res, err = c.ExecContext(ctx, s.q.queueExtend, now.Add(lease).UnixMicro(), id, token, now.UnixMicro())
		return err
	})
	if err != nil {
		return fmt.Errorf("idemsqlite: extend lease of queue job %d: %w", id, err)
	}
	return leaseCheck(res, "extend lease of", id, token)
}

// pendingExtension is a lease extension recorded while an InTx transaction held the connection.
type pendingExtension struct {
	token int64
	lease time.Duration
}

// applyExtensions applies the recorded lease extensions inside tx, just before it commits: the
// process has held the write lock since they were recorded, so a job whose token still matches
// was fetched by nobody else, even if its lease_until has passed meanwhile. Errors are left to
// the next transaction (the extensions stay recorded): they must not fail the caller's work.
func (s *Store) applyExtensions(ctx context.Context, tx *sql.Tx) {
	s.extMu.Lock()
	if len(s.pendingExt) == 0 {
		s.extMu.Unlock()
		return
	}
	todo := maps.Clone(s.pendingExt)
	s.extMu.Unlock()
	now := time.Now()
	for id, e := range todo {
		if _, err := tx.ExecContext(ctx, s.q.queueExtendHeld, now.Add(e.lease).UnixMicro(), id, e.token); err != nil {
			delete(todo, id)
		}
	}
	s.extMu.Lock()
	for id, e := range todo {
		if s.pendingExt[id] == e {
			delete(s.pendingExt, id)
		}
	}
	s.extMu.Unlock()
}

// leaseCheck turns "no row matched id and token" into idem.ErrLeaseLost.
func leaseCheck(res sql.Result, op string, id, token int64) error {
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("idemsqlite: %s queue job %d: rows affected: %w", op, id, err)
	}
	if n == 0 {
		return fmt.Errorf("idemsqlite: %s queue job %d with token %d: %w", op, id, token, idem.ErrLeaseLost)
	}
	return nil
}

// QueueWait returns nil when something is published to the queue table through this Store (any
// queue: a spurious wake-up only costs a poll), after min(PollInterval, max) (PollInterval when
// max <= 0), or ctx.Err() when ctx ends. Publishes from other processes, and one made between
// the caller's last fetch and this call, are found by the poll that follows.
func (s *Store) QueueWait(ctx context.Context, queue string, max time.Duration) error {
	return s.waitFor(ctx, &s.queueWake, max)
}

// QueueStats reports how many jobs of queue are not yet acked and when the oldest was enqueued.
func (s *Store) QueueStats(ctx context.Context, queue string) (idem.QueueStats, error) {
	var (
		st     idem.QueueStats
		oldest sql.NullInt64
	)
	if err := s.db.QueryRowContext(ctx, s.q.queueStats, queue).Scan(&st.Backlog, &oldest); err != nil {
		return st, fmt.Errorf("idemsqlite: stats of queue %q: %w", queue, err)
	}
	st.Oldest = fromNullMicros(oldest)
	return st, nil
}
