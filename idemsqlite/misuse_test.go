package idemsqlite_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/idemstore"
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
			err = c.Process(ctx, idem.Message{EventID: "e1", Payload: []byte(`{}`)}).Err
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

// TestSlowTxWithStoreReadsWaiting: a transaction longer than the watchdog's two ticks, while
// the store's own reads wait behind it (another worker's fetch peek, QueueStats from a metrics
// collector), is not taken for a handler that uses the *sql.DB: it commits. Before, every SQLite
// queue consumer whose handler spent more than ~4 s in its transaction was cancelled with
// ErrDBUsedInTx by its own idle workers' peeks, and dead-lettered as retries_exhausted.
func TestSlowTxWithStoreReadsWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("a")...))
	_, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Minute})
	require.NoError(t, err)

	inTx := make(chan struct{})
	readers := make(chan error, 2)
	go func() {
		<-inTx
		_, err := b.store.QueueStats(context.Background(), "q")
		readers <- err
	}()
	go func() {
		<-inTx
		_, err := b.store.QueueFetch(context.Background(), idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Minute})
		readers <- err
	}()
	err = slowTx(b.store, inTx)
	require.NoError(t, err, "the store's own waiting reads are not the handler's")
	for range 2 {
		require.NoError(t, <-readers)
	}
}

// TestOwnReadBegunJustBeforeTheTx: a store read that counted itself as the store's own just
// before a transaction began, and waited for the pool just after, is still the store's own.
// The watchdog counted only own reads begun after the transaction's start, took this one for a
// handler using the *sql.DB, and cancelled a slow handler with ErrDBUsedInTx; it was seen as a
// SlowHandlerKeepsLease flake of the set-based SQLite queue consumer, whose idle workers peek.
func TestOwnReadBegunJustBeforeTheTx(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	done := b.store.OwnPoolUse() // counted before the transaction begins…
	inTx := make(chan struct{})
	read := make(chan error, 1)
	go func() {
		defer done()
		<-inTx // …and waits for the pool after it began
		var one int
		read <- b.db.QueryRowContext(context.Background(), `SELECT 1`).Scan(&one)
	}()
	err := slowTx(b.store, inTx)
	require.NoError(t, err, "the store's own read is not the handler's")
	require.NoError(t, <-read)
}

// slowTx runs a transaction longer than two ticks of the pool watchdog, closing started once it
// is open; it returns the cause if the watchdog cancels it.
func slowTx(store *idemsqlite.Store, started chan struct{}) error {
	return store.InTx(context.Background(), func(ctx context.Context, _ *sql.Tx) error {
		close(started)
		select {
		case <-time.After(5 * time.Second):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
}
