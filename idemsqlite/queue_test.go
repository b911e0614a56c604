package idemsqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/storetest"
)

func msgs(ids ...string) []idem.Message {
	out := make([]idem.Message, len(ids))
	for i, id := range ids {
		out[i] = idem.Message{EventID: id, Tenant: "acme", Type: "t", Payload: []byte(`{"n":` + fmt.Sprint(i) + `}`)}
	}
	return out
}

func eventIDs(jobs []idemstore.QueueJob) []string {
	out := make([]string, len(jobs))
	for i, j := range jobs {
		out[i] = j.Message.EventID
	}
	return out
}

// queueFactory opens a store with the queue checks' config, reading a job's last error and
// beginning the caller's own transactions with SQL.
func queueFactory(tb testing.TB, cfg storetest.QueueConfig) storetest.QueueBundle[*sql.Tx] {
	tb.Helper()
	b := setup(tb, idemsqlite.Config{PollInterval: cfg.PollInterval})
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
		// A transaction holding the write lock (BEGIN IMMEDIATE) and the pool's one
		// connection: what a slow handler's transaction does.
		Stall: func(ctx context.Context) (func() error, error) {
			tx, err := b.db.BeginTx(ctx, nil)
			if err != nil {
				return nil, err
			}
			return tx.Rollback, nil
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
	storetest.ExerciseQueueFirstFetch(t, factory)
}
