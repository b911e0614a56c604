package idemsqlite

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
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
// message becomes one job per subscription, in the same transaction (see publishTargets).
// Waiters in this process are woken after commit when tx came from InTx, and at once otherwise.
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
	ids := make([]int64, len(targets))
	for i, q := range targets {
		if ids[i], err = s.takeQueueIDs(ctx, tx, q, len(msgs)); err != nil {
			return fmt.Errorf("idemsqlite: publish %d messages to queue %q: %w", len(msgs), q, err)
		}
	}
	headers := make([]string, len(msgs))
	for i, m := range msgs {
		if m.EventID == "" {
			return fmt.Errorf("idemsqlite: publish to queue %q: message %d has an empty event id", queue, i)
		}
		if headers[i], err = encodeHeaders(m.Headers); err != nil {
			return fmt.Errorf("idemsqlite: publish event %s to queue %q: %w", m.EventID, queue, err)
		}
	}
	for t, q := range targets {
		if err := s.insertJobs(ctx, tx, q, ids[t], now, msgs, headers); err != nil {
			return fmt.Errorf("idemsqlite: publish %d messages to queue %q: %w", len(msgs), q, err)
		}
	}
	s.wakeAfter(tx, wakeQueue)
	return nil
}

// insertJobs inserts msgs into queue inside tx, with ids from first on and headers encoded, in
// as few statements as the prepared inserts of 32, 8 and 1 jobs allow.
func (s *Store) insertJobs(ctx context.Context, tx *sql.Tx, queue string, first, now int64, msgs []idem.Message, headers []string) error {
	args := make([]any, 0, min(len(msgs), 32)*queueInsertParams)
	for done := 0; done < len(msgs); {
		n, pick, query := 1, func(h *hotStmts) *sql.Stmt { return h.queueInsert }, s.q.queueInsert
		switch left := len(msgs) - done; {
		case left >= 32:
			n, pick, query = 32, func(h *hotStmts) *sql.Stmt { return h.queueInsert32 }, s.q.queueInsert32
		case left >= 8:
			n, pick, query = 8, func(h *hotStmts) *sql.Stmt { return h.queueInsert8 }, s.q.queueInsert8
		}
		args = args[:0]
		for i, m := range msgs[done : done+n] {
			args = append(args, first+int64(done+i), queue, m.EventID, m.Tenant, m.Type, m.Payload, headers[done+i],
				nullMicros(m.OccurredAt), now, now)
		}
		if _, err := s.txStmt(ctx, tx, pick, query).ExecContext(ctx, args...); err != nil {
			if n == 1 {
				return fmt.Errorf("event %s: %w", msgs[done].EventID, err)
			}
			return err
		}
		done += n
	}
	return nil
}

// takeQueueIDs takes the next n ids of queue's range inside tx and returns the first; the queue
// gets its range on its first publish (migration 053). Ids only grow: a deleted job's id is never
// given again, so a stale (id, token) cannot match a newer job.
func (s *Store) takeQueueIDs(ctx context.Context, tx *sql.Tx, queue string, n int) (int64, error) {
	take := s.txStmt(ctx, tx, func(h *hotStmts) *sql.Stmt { return h.queueRange }, s.q.queueRange)
	for try := 0; ; try++ {
		var base, last int64
		err := take.QueryRowContext(ctx, queue, n).Scan(&base, &last)
		if err == nil {
			if last-base >= queueRangeWidth {
				return 0, fmt.Errorf("all %d ids of the queue are used", queueRangeWidth-1)
			}
			return last - int64(n) + 1, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return 0, fmt.Errorf("take ids: %w", err)
		}
		if try > 0 {
			return 0, errors.New("take ids: no id range left for a new queue")
		}
		if _, err := tx.ExecContext(ctx, s.q.queueRangeNew, queue); err != nil {
			return 0, fmt.Errorf("give the queue its id range: %w", err)
		}
	}
}

// QueueFetch leases up to p.Max jobs of p.Queue that are available (available_at <= p.Now) and
// not leased (lease_until NULL or past), lowest id first, in one UPDATE … RETURNING: each gets
// lease_until = p.Now+p.Lease, its token and attempts incremented, and p.Now as its first fetch
// unless one is recorded. SQLite's single writer makes the statement atomic, so no other fetch
// can lease the same job.
//
// A fetch first reads, without the write lock, whether the queue has a job to take, and takes
// the lock only when it has; after a fetch that found all it asked for (a backlog) the next one
// skips that read. Fetching ahead, so that workers freeing one at a time do not each pay a
// write, is the queue Source's (idemqueue.SourceConfig.Prefetch), for every store.
func (s *Store) QueueFetch(ctx context.Context, p idemstore.QueueFetchParams) ([]idemstore.QueueJob, error) {
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
	if _, backlog := s.backlog.Load(p.Queue); !backlog && !s.queueMayHaveJobs(ctx, p.Queue, now) {
		return nil, nil
	}
	jobs, err := s.fetchJobs(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: fetch from queue %q: %w", p.Queue, err)
	}
	if len(jobs) == p.Max {
		s.backlog.Store(p.Queue, struct{}{})
	} else {
		s.backlog.Delete(p.Queue)
	}
	return jobs, nil
}

// queueMayHaveJobs reads, without the write lock (a plain WAL read), whether queue has a job
// a fetch at now would take, so that an idle consumer's polls do not take the lock from the
// file's writers. An error reports true: the fetch then finds out.
func (s *Store) queueMayHaveJobs(ctx context.Context, queue string, now time.Time) bool {
	s.prepareStmts(ctx)
	st := s.stmts.Load()
	if st == nil {
		return true
	}
	var one int
	s.ownPoolUse()
	defer s.ownPoolDone()
	err := st.queuePeek.QueryRowContext(ctx, queue, now.UnixMicro()).Scan(&one)
	return !errors.Is(err, sql.ErrNoRows)
}

// fetchJobs leases up to p.Max jobs of p.Queue in one write transaction, through the prepared
// statement; the jobs come back ordered by id. The leases run from when the write lock was
// taken (p.LeaseStart): the wait for it lasts as long as another transaction of the file, a
// slow handler's seconds included.
func (s *Store) fetchJobs(ctx context.Context, p idemstore.QueueFetchParams) ([]idemstore.QueueJob, error) {
	s.prepareStmts(ctx)
	var (
		jobs       []idemstore.QueueJob
		leaseStart time.Time
	)
	acked := s.acks.take()
	err := s.writeTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		jobs = jobs[:0]
		// The jobs acked since the last write go first, in the same commit.
		if err := s.deleteAcked(ctx, tx, acked); err != nil {
			return err
		}
		now := p.LeaseStart()
		leaseStart = now
		rows, err := s.txStmt(ctx, tx, func(h *hotStmts) *sql.Stmt { return h.queueFetch }, s.q.queueFetch).
			QueryContext(ctx, now.Add(p.Lease).UnixMicro(), p.Queue, now.UnixMicro(), p.Max)
		if err != nil {
			return err
		}
		for rows.Next() {
			j, err := scanQueueJob(rows)
			if err != nil {
				return errors.Join(err, rows.Close())
			}
			jobs = append(jobs, j)
		}
		return errors.Join(rows.Err(), rows.Close())
	})
	if err != nil {
		s.acks.add(s, acked)
		return nil, err
	}
	// RETURNING does not promise an order.
	slices.SortFunc(jobs, func(a, b idemstore.QueueJob) int { return cmp.Compare(a.ID, b.ID) })
	s.extMu.Lock()
	if len(s.fetched)+len(jobs) > fetchedMax {
		clear(s.fetched)
	}
	var until int64
	if p.Now.IsZero() {
		until = leaseStart.Add(p.Lease).UnixMicro()
	}
	for _, j := range jobs {
		s.fetched[j.ID] = fetchedLease{token: j.Token, until: until}
	}
	s.extMu.Unlock()
	return jobs, nil
}

// forgetOnSuccess drops job id from the leases this Store handed out once an ack or a give-back
// (nak, release) under token succeeded (err nil), and returns err. Only the holder of the newest
// token forgets it, so a stale settle never erases what refuses a stale extension; a rolled-back
// ack only loses that early answer.
func (s *Store) forgetOnSuccess(err error, id, token int64) error {
	if err == nil {
		s.extMu.Lock()
		if s.fetched[id].token == token {
			delete(s.fetched, id)
		}
		s.extMu.Unlock()
	}
	return err
}

// ackReadMargin is how much of a lease must be left for QueueAckTx to trust this Store's record
// of it instead of reading the job's token: a margin for the clocks of the processes on the file
// (each reads its own wall clock to decide a lease is over).
const ackReadMargin = time.Second

// holdsLease reports whether job id is still leased under token by this Store's own record: a
// fetch of this Store gave that token, nothing of this Store settled it since, and by this
// process's clock the lease has more than ackReadMargin left. The caller holds the write lock,
// so any other fetch of the job committed before now; it could only take the job at or after
// the lease's end, which by the same clock has not come. False means "read the table".
func (s *Store) holdsLease(id, token int64) bool {
	s.extMu.Lock()
	l, ok := s.fetched[id]
	s.extMu.Unlock()
	return ok && l.token == token && l.until != 0 && time.Now().Add(ackReadMargin).UnixMicro() < l.until
}

// scanQueueJob reads one row of queueReturning.
func scanQueueJob(rows *sql.Rows) (idemstore.QueueJob, error) {
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
		return j, err
	}
	var err error
	if m.Headers, err = decodeHeaders(headers); err != nil {
		return j, fmt.Errorf("job %d (event %s): %w", j.ID, m.EventID, err)
	}
	m.OccurredAt = fromNullMicros(occurred)
	m.PublishedAt = fromMicros(enqueued)
	j.FirstFetchedAt = fromNullMicros(first)
	return j, nil
}

// QueueAck deletes job id if token is still its lease token, else it returns an error wrapping
// idem.ErrLeaseLost.
func (s *Store) QueueAck(ctx context.Context, id, token int64) error {
	res, err := s.execWrite(ctx, s.q.queueAck, id, token)
	if err != nil {
		return fmt.Errorf("idemsqlite: ack queue job %d: %w", id, err)
	}
	return s.forgetOnSuccess(leaseCheck(res, "ack", id, token), id, token)
}

// QueueAckTx acks job id inside tx if token is still its lease token, else it returns an error
// wrapping idem.ErrLeaseLost. The caller's transaction holds SQLite's write lock until it ends,
// so no other worker can fetch the job in between, and a lost lease rolls the handler back.
//
// In a transaction of this Store's InTx that acks one job, the check reads the job's token, or,
// when this Store's own fetch gave the token and its lease has more than ackReadMargin left by
// this process's clock, trusts that record (holdsLease): under the write lock, no other fetch can
// have taken the job before its lease ends. A fetch that another process gave a time of its own
// (QueueFetchParams.Now) past this lease, or a wall clock set back, is then not seen here; the
// job's claim still makes that delivery a duplicate. The job is deleted just after the commit, by the store's next queue fetch or within ackDelayDefault: each
// B-tree page a commit changes is one more WAL frame, and the delete was one more page in every
// handler's commit. A job whose transaction committed keeps its lease until then, so no worker
// takes it; if the process stops first, the job comes back when its lease ends and its claim
// makes it a duplicate. A transaction that acks several jobs (a batch), or one the caller began
// itself, deletes them inside it.
func (s *Store) QueueAckTx(ctx context.Context, tx *sql.Tx, id, token int64) error {
	st, ours := s.txStateOf(tx)
	if ours && !st.ackInTx && len(st.acks) == 0 {
		// The transaction's first ack: check the token (from this Store's record of the lease
		// when it can, see holdsLease, else with a read), delete after the commit.
		if !s.holdsLease(id, token) {
			if err := s.readHeld(ctx, tx, id, token); err != nil {
				return err
			}
		}
		s.updateTxState(tx, func(st *txState) { st.acks = append(st.acks, ackedJob{id: id, token: token}) })
		return s.forgetOnSuccess(nil, id, token)
	}
	// Not InTx's, or it acks several jobs (a batch): their deletes share the queue's pages, so
	// they go in the transaction itself, the first one's too.
	res, err := s.txStmt(ctx, tx, func(h *hotStmts) *sql.Stmt { return h.queueAck }, s.q.queueAck).ExecContext(ctx, id, token)
	if err != nil {
		return fmt.Errorf("idemsqlite: ack queue job %d: %w", id, err)
	}
	if err := leaseCheck(res, "ack", id, token); err != nil {
		return err
	}
	if ours && !st.ackInTx {
		if err := s.deleteAcked(ctx, tx, st.acks); err != nil {
			return fmt.Errorf("idemsqlite: ack queue job %d: %w", id, err)
		}
		s.updateTxState(tx, func(st *txState) { st.acks, st.ackInTx = nil, true })
	}
	return s.forgetOnSuccess(nil, id, token)
}

// readHeld reads whether job id still carries token, inside tx (one of InTx's); else it returns
// an error wrapping idem.ErrLeaseLost.
func (s *Store) readHeld(ctx context.Context, tx *sql.Tx, id, token int64) error {
	ctx, err := s.ownStmtCtx(ctx, tx)
	if err != nil {
		return fmt.Errorf("idemsqlite: ack queue job %d: %w", id, err)
	}
	var one int
	err = s.txStmt(ctx, tx, func(h *hotStmts) *sql.Stmt { return h.queueHeld }, s.q.queueHeld).QueryRowContext(ctx, id, token).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("idemsqlite: ack queue job %d with token %d: %w", id, token, idem.ErrLeaseLost)
	}
	if err != nil {
		return fmt.Errorf("idemsqlite: ack queue job %d: %w", id, err)
	}
	return nil
}

// QueueNak releases job p.ID for another attempt at p.Now+p.Delay, recording p.Error, if p.Token
// is still its lease token; else it returns an error wrapping idem.ErrLeaseLost.
func (s *Store) QueueNak(ctx context.Context, p idemstore.QueueNakParams) error {
	now := p.Now
	if now.IsZero() {
		now = time.Now()
	}
	delay := max(p.Delay, 0)
	res, err := s.execWrite(ctx, s.q.queueNak, now.Add(delay).UnixMicro(), p.Error, p.ID, p.Token)
	if err != nil {
		return fmt.Errorf("idemsqlite: nak queue job %d: %w", p.ID, err)
	}
	if err := s.forgetOnSuccess(leaseCheck(res, "nak", p.ID, p.Token), p.ID, p.Token); err != nil {
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
		// The table cannot be read now; what this process knows decides: a job it fetched
		// again since, under a newer token, was taken over (transporttest's FencedSettle).
		s.extMu.Lock()
		defer s.extMu.Unlock()
		if newer, ok := s.fetched[id]; ok && newer.token > token {
			return fmt.Errorf("idemsqlite: extend lease of queue job %d with token %d: fetched again with token %d: %w", id, token, newer.token, idem.ErrLeaseLost)
		}
		s.pendingExt[id] = pendingExtension{token: token, lease: lease}
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
func (s *Store) QueueStats(ctx context.Context, queue string) (idemstore.QueueStats, error) {
	var (
		st     idemstore.QueueStats
		oldest sql.NullInt64
	)
	if !s.gate.inTx.Load() {
		// What this process acked is not backlog. Skipped while an InTx transaction holds the
		// gate: when that is the caller's own (a handler asking for stats), the delete would
		// wait for it; the count may then include jobs acked moments ago.
		s.acks.flush(ctx, s)
	}
	s.ownPoolUse()
	defer s.ownPoolDone()
	if err := s.db.QueryRowContext(ctx, s.q.queueStats, queue).Scan(&st.Backlog, &oldest); err != nil {
		return st, fmt.Errorf("idemsqlite: stats of queue %q: %w", queue, err)
	}
	st.Oldest = fromNullMicros(oldest)
	return st, nil
}
