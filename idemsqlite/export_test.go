package idemsqlite

import (
	"context"
	"database/sql"
	"time"
)

// QueueQueries returns the store's queue-table statements by name, for the tests that check
// their plans.
func (s *Store) QueueQueries() map[string]string {
	return map[string]string{
		"fetch":   s.q.queueFetch,
		"peek":    s.q.queuePeek,
		"ack":     s.q.queueAck,
		"ackMany": s.q.queueAckMany,
		"held":    s.q.queueHeld,
		"nak":     s.q.queueNak,
		"extend":  s.q.queueExtend,
		"release": s.q.queueRelease,
		"stats":   s.q.queueStats,
		"range":   s.q.queueRange,
		"purge":   s.q.subDeleteJobs,
	}
}

// MigrateTo applies the embedded migrations up to version, for the tests that check what a
// later migration does to a database of an earlier version.
func (s *Store) MigrateTo(ctx context.Context, version int) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	if err := s.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, s.sub(migrationsTable))
		return err
	}); err != nil {
		return err
	}
	for _, m := range ms {
		if m.Version > version {
			break
		}
		if err := s.applyMigration(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// AckedPending returns how many acked queue jobs wait for their delete.
func (s *Store) AckedPending() int {
	s.acks.mu.Lock()
	defer s.acks.mu.Unlock()
	return len(s.acks.jobs)
}

// DropAckedPending forgets the acked jobs not deleted yet, as a process that stops before
// deleting them does.
func (s *Store) DropAckedPending() { s.acks.take() }

// SetAckDelay sets how long an acked job waits for its delete when no write comes.
func (s *Store) SetAckDelay(d time.Duration) {
	s.acks.mu.Lock()
	s.acks.delay = d
	s.acks.mu.Unlock()
}

// OwnPoolUse is ownPoolUse, for the test of a store read that counts itself just before an
// InTx transaction begins and waits just after.
func (s *Store) OwnPoolUse() (done func()) {
	s.ownPoolUse()
	return s.ownPoolDone
}
