package idemmysql_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/storetest"
)

// outboxFactory opens a store with the outbox checks' config, an orders table for their business
// write, and a count of the outbox table's rows.
func outboxFactory(tb testing.TB, cfg storetest.OutboxConfig) storetest.OutboxBundle[*sql.Tx] {
	tb.Helper()
	b := setup(tb, idemmysql.Config{OutboxPartitions: cfg.Partitions, PollInterval: cfg.PollInterval})
	_, err := b.db.ExecContext(b.ctx, `CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY) ENGINE=InnoDB`)
	require.NoError(tb, err)
	return storetest.OutboxBundle[*sql.Tx]{
		Store: b.store,
		InsertOrder: func(ctx context.Context, tx *sql.Tx, id string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES (?)`, id)
			return err
		},
		OutboxRows: func(ctx context.Context) (int, error) {
			var n int
			err := b.db.QueryRowContext(ctx, `SELECT count(*) FROM idem_outbox`).Scan(&n)
			return n, err
		},
	}
}

// TestOutbox runs the outbox's conformance checks (storetest.ExerciseOutbox).
func TestOutbox(t *testing.T) {
	t.Parallel()
	storetest.ExerciseOutbox(t, outboxFactory)
}

// TestLeases runs the lease store's conformance checks (storetest.ExerciseLeases).
func TestLeases(t *testing.T) {
	t.Parallel()
	storetest.ExerciseLeases(t, factoryFor(idemmysql.Config{}))
}
