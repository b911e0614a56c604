package idemmysql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/storetest"
)

// queueFactory opens a store with the queue checks' config, reading a job's last error and
// beginning the caller's own transactions with SQL.
func queueFactory(tb testing.TB, cfg storetest.QueueConfig) storetest.QueueBundle[*sql.Tx] {
	tb.Helper()
	b := setup(tb, idemmysql.Config{PollInterval: cfg.PollInterval})
	return storetest.QueueBundle[*sql.Tx]{
		Store: b.store,
		LastError: func(ctx context.Context, id int64) (string, error) {
			var lastErr string
			err := b.db.QueryRowContext(ctx, `SELECT last_error FROM idem_queue WHERE id = ?`, id).Scan(&lastErr)
			return lastErr, err
		},
		BeginTx: func(ctx context.Context) (*sql.Tx, func() error, error) {
			tx, err := b.db.BeginTx(ctx, nil)
			if err != nil {
				return nil, nil, err
			}
			return tx, tx.Commit, nil
		},
		// A table lock of another session: the fetch's locking read waits for it.
		Stall: func(ctx context.Context) (func() error, error) {
			conn, err := b.db.Conn(ctx)
			if err != nil {
				return nil, err
			}
			if _, err := conn.ExecContext(ctx, `LOCK TABLES idem_queue WRITE`); err != nil {
				return nil, errors.Join(err, conn.Close())
			}
			return func() error {
				_, err := conn.ExecContext(ctx, `UNLOCK TABLES`)
				return errors.Join(err, conn.Close())
			}, nil
		},
		RawIdentities: true,
	}
}

// TestQueue runs the queue's conformance checks (storetest.ExerciseQueue).
func TestQueue(t *testing.T) {
	t.Parallel()
	storetest.ExerciseQueue(t, queueFactory)
}

// TestQueueFirstFetch runs the first-fetch conformance check: the time the retry budget counts
// from survives naks, lost leases and releases of a later attempt.
func TestQueueFirstFetch(t *testing.T) {
	t.Parallel()
	storetest.ExerciseQueueFirstFetch(t, factoryFor(idemmysql.Config{}))
}
