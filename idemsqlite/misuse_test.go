package idemsqlite_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqlite"
)

// TestDBUsedInsideTx: a handler that uses the *sql.DB instead of its tx waits for the pool's
// only connection, which its own transaction holds. The store notices and ends the wait with
// an error that names the cause, instead of hanging until the context's deadline.
func TestDBUsedInsideTx(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	_, err := b.db.ExecContext(b.ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY)`)
	require.NoError(t, err)

	tests := []struct {
		name string
		run  func(ctx context.Context) error
	}{
		{"InTx", func(ctx context.Context) error {
			return b.store.InTx(ctx, func(ctx context.Context, _ *sql.Tx) error {
				_, err := b.db.ExecContext(ctx, `INSERT INTO orders (id) VALUES ('o1')`) // the mistake
				return err
			})
		}},
		{"Process", func(ctx context.Context) error {
			c, err := idem.NewConsumer(b.store, idem.ConsumerConfig[*sql.Tx]{
				Name: "orders@v1",
				Handler: func(ctx context.Context, _ *sql.Tx, _ idem.Message) error {
					_, err := b.db.ExecContext(ctx, `INSERT INTO orders (id) VALUES ('o2')`) // the mistake
					return err
				},
			})
			if err != nil {
				return err
			}
			_, err = c.Process(ctx, idem.Message{EventID: "e1", Payload: []byte(`{}`)})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Not parallel: both share the one connection.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			start := time.Now()
			err := tt.run(ctx)
			require.ErrorIs(t, err, idemsqlite.ErrDBUsedInTx)
			require.ErrorContains(t, err, "instead of the *sql.Tx")
			require.Less(t, time.Since(start), 15*time.Second, "fails fast, long before the deadline")
		})
	}

	// The store is usable afterwards, and a correct transaction is not disturbed by a reader
	// that waits behind it for a moment.
	require.NoError(t, b.store.InTx(context.Background(), func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES ('o3')`)
		return err
	}))
	var n int
	require.NoError(t, b.db.QueryRowContext(context.Background(), `SELECT count(*) FROM orders`).Scan(&n))
	require.Equal(t, 1, n)
}
