package idemmysql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemmysql"
)

// TestTxEnded checks that TxEnded tells an open transaction from one a statement ended behind
// the client's back, both by @@in_transaction (MariaDB) and by the savepoint probe it falls back
// to where the server has no such variable (MySQL 8). A TxEnded that always said "ended" would
// make every batch fail after its first handler; one that always said "open" would commit a
// batch whose claims a handler's COMMIT or ROLLBACK had already settled.
func TestTxEnded(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmysql.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := b.db.ExecContext(ctx, `CREATE TABLE t (id INT PRIMARY KEY) ENGINE=InnoDB`)
	require.NoError(t, err)

	tests := []struct {
		name  string
		stmt  string // what the "handler" runs after its insert; "" ends nothing
		ended bool
	}{
		{"open", "", false},
		{"commit", "COMMIT", true},
		{"rollback", "ROLLBACK", true},
	}
	for _, probe := range []bool{false, true} {
		s, err := idemmysql.NewWithConfig(b.db, idemmysql.Config{})
		require.NoError(t, err)
		mode := "in_transaction"
		if probe {
			idemmysql.UseTxProbe(s)
			mode = "savepoint"
		}
		for i, tc := range tests {
			tx, err := b.db.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = tx.ExecContext(ctx, `INSERT INTO t (id) VALUES (?)`, i+len(tests)*boolInt(probe))
			require.NoError(t, err)
			if tc.stmt != "" {
				_, err = tx.ExecContext(ctx, tc.stmt)
				require.NoError(t, err)
			}
			require.Equal(t, tc.ended, s.TxEnded(tx), "%s/%s", mode, tc.name)
			if !tc.ended {
				// The probe leaves the transaction as it was: it still rolls back whole.
				require.False(t, s.TxEnded(tx), "%s/%s: asked twice", mode, tc.name)
			}
			_ = tx.Rollback()
		}
		require.NoError(t, s.Close())
	}
	var n int
	require.NoError(t, b.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM t`).Scan(&n))
	require.Equal(t, 2, n, "only the handlers' own COMMITs kept their rows (one per mode)")

	// The refusal that switches TxEnded to the probe is the server's answer to an unknown
	// variable, as MySQL 8 gives for @@in_transaction.
	var v sql.NullString
	err = b.db.QueryRowContext(ctx, `SELECT @@idem_no_such_variable`).Scan(&v)
	require.Error(t, err)
	require.True(t, idemmysql.IsUnknownVariable(err), "%v", err)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
