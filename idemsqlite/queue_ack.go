package idemsqlite

import (
	"context"
	"database/sql"
	"strconv"
	"sync"
	"time"
)

// ackDelayDefault bounds how long a job acked by a committed transaction waits for a write of the
// store to delete it (see QueueAckTx).
const ackDelayDefault = 50 * time.Millisecond

// ackFailuresToDrop is how many failed deletes in a row make an ackQueue drop what it holds:
// the jobs then come back when their leases end and their claims settle them as duplicates.
const ackFailuresToDrop = 20

// ackedJob is a queue job whose ack committed: its id and the lease token that acked it.
type ackedJob struct{ id, token int64 }

// ackQueue holds the jobs acked by committed transactions and not yet deleted. A fetch takes
// them into its own transaction; a timer deletes them after delay when no fetch comes.
type ackQueue struct {
	mu       sync.Mutex
	delay    time.Duration // ackDelayDefault when zero
	jobs     []ackedJob
	timer    *time.Timer
	failures int
}

// add holds jobs for deletion and arms the timer.
func (q *ackQueue) add(s *Store, jobs []ackedJob) {
	if len(jobs) == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.jobs = append(q.jobs, jobs...)
	if q.timer == nil {
		d := q.delay
		if d <= 0 {
			d = ackDelayDefault
		}
		q.timer = time.AfterFunc(d, func() { q.flush(context.Background(), s) })
	}
}

// take returns the jobs held and forgets them; the caller deletes them or gives them back.
func (q *ackQueue) take() []ackedJob {
	q.mu.Lock()
	defer q.mu.Unlock()
	jobs := q.jobs
	q.jobs = nil
	if q.timer != nil {
		q.timer.Stop()
		q.timer = nil
	}
	return jobs
}

// settled records whether a delete of held jobs committed; it reports whether jobs whose
// delete failed should be held again.
func (q *ackQueue) settled(ok bool) (retry bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ok {
		q.failures = 0
		return false
	}
	q.failures++
	if q.failures >= ackFailuresToDrop {
		q.failures = 0
		return false
	}
	return true
}

// flush deletes the jobs held, in a write transaction of its own.
func (q *ackQueue) flush(ctx context.Context, s *Store) {
	jobs := q.take()
	if len(jobs) == 0 {
		return
	}
	err := s.writeTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return s.deleteAcked(ctx, tx, jobs) })
	if q.settled(err == nil) && !s.closed.Load() {
		q.add(s, jobs)
	}
}

// deleteAcked deletes jobs inside tx, each only under the token that acked it: a job whose
// lease ran out and that another worker took since is that worker's to settle. Several jobs go
// in one statement, so that a fetch carrying a batch's acks pays one round through database/sql,
// not one per job.
func (s *Store) deleteAcked(ctx context.Context, tx *sql.Tx, jobs []ackedJob) error {
	switch len(jobs) {
	case 0:
		return nil
	case 1:
		_, err := s.txStmt(ctx, tx, func(h *hotStmts) *sql.Stmt { return h.queueAck }, s.q.queueAck).
			ExecContext(ctx, jobs[0].id, jobs[0].token)
		return err
	}
	b := make([]byte, 0, 2+len(jobs)*24)
	b = append(b, '[')
	for i, j := range jobs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = strconv.AppendInt(b, j.id, 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, j.token, 10)
		b = append(b, ']')
	}
	b = append(b, ']')
	_, err := s.txStmt(ctx, tx, func(h *hotStmts) *sql.Stmt { return h.queueAckMany }, s.q.queueAckMany).
		ExecContext(ctx, string(b))
	return err
}
