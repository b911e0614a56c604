package idemmysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/storetest"
)

// TestConnectionKilledMidTransaction: the server kills the handler's connection after the
// claim and the effect were written but before commit (a failover, an operator's KILL, a
// network cut). Nothing is committed, the error is transient, and the redelivery applies the
// event once.
func TestConnectionKilledMidTransaction(t *testing.T) {
	t.Parallel()
	for _, iso := range isolations {
		t.Run(iso.name, func(t *testing.T) {
			t.Parallel()
			bundle := factoryFor(idemmysql.Config{Isolation: iso.level})(t)
			ctx := context.Background()
			require.NoError(t, bundle.CreateWallet(ctx, "w1"))
			store := bundle.Store.(*idemmysql.Store)
			var kill atomic.Bool
			kill.Store(true)
			credit := storetest.CreditHandler(bundle)
			c, err := idem.NewConsumer[*sql.Tx](store, idem.ConsumerConfig[*sql.Tx]{
				Name: "ledger@v1",
				Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
					if err := credit(ctx, tx, msg); err != nil {
						return err
					}
					if kill.Load() {
						var id int64
						if err := tx.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&id); err != nil {
							return err
						}
						if _, err := store.DB().ExecContext(ctx, fmt.Sprintf(`KILL CONNECTION %d`, id)); err != nil {
							return err
						}
					}
					return nil
				},
			})
			require.NoError(t, err)
			msg := storetest.PaymentMessage("acme", "evt-cut", storetest.Payment{Wallet: "w1", Amount: 5})

			r := c.Process(ctx, msg)
			err = r.Err
			require.Error(t, err)
			require.Equal(t, idem.OutcomeFailed, r.Outcome)
			require.Equal(t, idem.ClassTransient, r.Class, "%v", err)
			t.Logf("the cut: %v", err)
			for name, n := range map[string]func() (int64, error){
				"claims": func() (int64, error) { return bundle.ClaimRows(ctx, r.Key) },
				"ledger": func() (int64, error) { return bundle.LedgerRows(ctx, "evt-cut") },
			} {
				got, err := n()
				require.NoError(t, err)
				require.Zero(t, got, "%s after the cut", name)
			}

			kill.Store(false)
			msg.Attempt = 2
			r = c.Process(ctx, msg)
			err = r.Err
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeProcessed, r.Outcome)
			r = c.Process(ctx, msg)
			err = r.Err
			require.NoError(t, err)
			require.Equal(t, idem.OutcomeDuplicate, r.Outcome)
			n, err := bundle.LedgerRows(ctx, "evt-cut")
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			bal, err := bundle.Balance(ctx, "w1")
			require.NoError(t, err)
			require.EqualValues(t, 5, bal)
		})
	}
}
