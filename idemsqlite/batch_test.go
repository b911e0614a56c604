package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/storetest"
)

// TestSavepointBatchAfterWholeTransactionRollback: a handler statement that makes SQLite roll
// back the whole transaction (a trigger's RAISE(ROLLBACK), an ON CONFLICT ROLLBACK clause)
// takes the batch's savepoints with it. The batch must not carry on in autocommit mode, where
// later events' effects would commit without their claims; it is aborted, the culprit fails,
// and the rest is applied once in a transaction of its own.
func TestSavepointBatchAfterWholeTransactionRollback(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// kill is the statement the culprit's handler runs.
		kill string
	}{
		{"RaiseRollback", `INSERT INTO doom (x) VALUES (1)`},
		{"OnConflictRollback", `INSERT OR ROLLBACK INTO taken (id) VALUES (1)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := factory(t)
			store := b.Store.(*idemsqlite.Store)
			db := store.DB()
			ctx := context.Background()
			_, err := db.ExecContext(ctx, `CREATE TABLE taken (id INTEGER PRIMARY KEY); INSERT INTO taken VALUES (1);`)
			require.NoError(t, err)
			require.NoError(t, b.CreateWallet(ctx, "w1"))

			// The store itself: the savepoint cannot be rolled back to, and says why.
			err = store.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				err := store.SavepointTx(ctx, tx, func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, tc.kill)
					return err
				})
				require.ErrorIs(t, err, idem.ErrTxEnded)
				return err
			})
			require.ErrorIs(t, err, idem.ErrTxEnded)

			c, err := idem.NewConsumer(store, idem.ConsumerConfig[*sql.Tx]{
				Name:  "ledger@v1",
				Batch: idem.BatchConfig{Enabled: true, Savepoints: true},
				Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
					if err := storetest.CreditHandler(b)(ctx, tx, msg); err != nil {
						return err
					}
					if msg.EventID == "kill" {
						_, err := tx.ExecContext(ctx, tc.kill)
						return err
					}
					return nil
				},
			})
			require.NoError(t, err)
			ids := []string{"a", "kill", "b", "c"}
			msgs := make([]idem.Message, len(ids))
			for i, id := range ids {
				msgs[i] = storetest.PaymentMessage("acme", id, storetest.Payment{Wallet: "w1", Amount: 1})
			}
			rs := c.ProcessBatch(ctx, msgs)
			want := []idem.Outcome{idem.OutcomeProcessed, idem.OutcomeFailed, idem.OutcomeProcessed, idem.OutcomeProcessed}
			for i, r := range rs {
				require.Equal(t, want[i], r.Outcome, "%s: %v", ids[i], r.Err)
			}
			require.ErrorIs(t, rs[1].Err, idem.ErrTxEnded)
			var sqlErr interface{ Code() int }
			require.True(t, errors.As(rs[1].Err, &sqlErr), "the statement's own error is kept: %v", rs[1].Err)
			for i, id := range ids {
				n, err := b.LedgerRows(ctx, id)
				require.NoError(t, err)
				claims, err := b.ClaimRows(ctx, idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: id})
				require.NoError(t, err)
				require.Equal(t, claims, n, "%s: an effect exists exactly when its claim does", id)
				require.EqualValues(t, map[bool]int64{true: 1, false: 0}[want[i] == idem.OutcomeProcessed], n, id)
			}
			bal, err := b.Balance(ctx, "w1")
			require.NoError(t, err)
			require.EqualValues(t, 3, bal)
		})
	}
}
