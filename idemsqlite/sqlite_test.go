package idemsqlite_test

import (
	"context"
	"database/sql"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/storetest"
)

func TestMain(m *testing.M) {
	testenv.Main(m)
}

// testBundle is one private, migrated store and its database.
type testBundle struct {
	ctx   context.Context
	db    *sql.DB
	store *idemsqlite.Store
	path  string
}

// setup opens a fresh database in tb.TempDir() and migrates a store with cfg into it.
func setup(tb testing.TB, cfg idemsqlite.Config) *testBundle {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "idem.db")
	db, err := idemsqlite.Open(path)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, db.Close()) })
	store, err := idemsqlite.NewWithConfig(db, cfg)
	require.NoError(tb, err)
	ctx := context.Background()
	require.NoError(tb, store.Migrate(ctx))
	return &testBundle{ctx: ctx, db: db, store: store, path: path}
}

// factory builds the conformance bundle: a migrated store plus a ledger without a unique key and
// a wallet balance, which only idem can keep from being applied twice.
func factory(tb testing.TB) storetest.Bundle[*sql.Tx] {
	tb.Helper()
	b := setup(tb, idemsqlite.Config{})
	_, err := b.db.ExecContext(b.ctx, `
		CREATE TABLE wallets (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
		CREATE TABLE ledger (
			id       INTEGER PRIMARY KEY AUTOINCREMENT,
			event_id TEXT    NOT NULL,
			wallet   TEXT    NOT NULL,
			amount   INTEGER NOT NULL
		);
		CREATE TABLE doom (x INTEGER);
		CREATE TRIGGER doom_rollback BEFORE INSERT ON doom
			BEGIN SELECT RAISE(ROLLBACK, 'the handler ended the transaction'); END;`)
	require.NoError(tb, err)
	db := b.db
	return storetest.Bundle[*sql.Tx]{
		Store: b.store,
		CreateWallet: func(ctx context.Context, wallet string) error {
			_, err := db.ExecContext(ctx, `INSERT INTO wallets (id, balance) VALUES (?, 0)`, wallet)
			return err
		},
		Credit: func(ctx context.Context, tx *sql.Tx, eventID, wallet string, amount int64) (int64, error) {
			if _, err := tx.ExecContext(ctx, `INSERT INTO ledger (event_id, wallet, amount) VALUES (?, ?, ?)`,
				eventID, wallet, amount); err != nil {
				return 0, err
			}
			res, err := tx.ExecContext(ctx, `UPDATE wallets SET balance = balance + ? WHERE id = ?`, amount, wallet)
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		},
		LedgerRows: func(ctx context.Context, eventID string) (int64, error) {
			var n int64
			err := db.QueryRowContext(ctx, `SELECT count(*) FROM ledger WHERE event_id = ?`, eventID).Scan(&n)
			return n, err
		},
		Balance: func(ctx context.Context, wallet string) (int64, error) {
			var n int64
			err := db.QueryRowContext(ctx, `SELECT balance FROM wallets WHERE id = ?`, wallet).Scan(&n)
			return n, err
		},
		ClaimRows: func(ctx context.Context, key idem.Key) (int64, error) {
			var n int64
			err := db.QueryRowContext(ctx, `SELECT count(*) FROM idem_claims
				WHERE tenant = ? AND consumer = ? AND event_id = ?`, key.Tenant, key.Consumer, key.EventID).Scan(&n)
			return n, err
		},
		// A trigger refuses the event's claims with RAISE(ABORT): the statement fails, the
		// transaction stays, as with a constraint SQLite enforces.
		RejectClaims: func(ctx context.Context, eventID string) error {
			lit := "'" + strings.ReplaceAll(eventID, "'", "''") + "'"
			_, err := db.ExecContext(ctx, `CREATE TRIGGER "reject_`+hex.EncodeToString([]byte(eventID))+`"
				BEFORE INSERT ON idem_claims WHEN NEW.event_id = `+lit+`
				BEGIN SELECT RAISE(ABORT, 'claim refused by the test schema'); END`)
			return err
		},
		// A trigger's RAISE(ROLLBACK) rolls back the whole transaction, savepoints and all.
		KillTx: func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO doom (x) VALUES (1)`)
			return err
		},
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Exercise(t, factory)
}

// now returns the current time at the precision the store keeps (microseconds, UTC), so stored
// and expected times compare equal.
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// fp returns a fingerprint filled with b.
func fp(b byte) idem.Fingerprint {
	var f idem.Fingerprint
	for i := range f {
		f[i] = b
	}
	return f
}

// TestConformanceBatch runs the batched path's suite against SQLite.
func TestConformanceBatch(t *testing.T) {
	t.Parallel()
	storetest.ExerciseBatch(t, factory)
}
