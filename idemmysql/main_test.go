package idemmysql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/storetest"
)

func TestMain(m *testing.M) {
	testenv.Main(m)
}

// testMaxConns bounds each test's pool: the server's max_connections is shared by every
// parallel test (and other packages' tests).
const testMaxConns = 8

// testBundle is one private, migrated store and its database.
type testBundle struct {
	ctx   context.Context
	db    *sql.DB
	store *idemmysql.Store
	name  string // the test's database
}

// openDB creates a database of its own for tb (idem_test_<random>), opens a pool on it and drops
// it when the test ends. The DSN comes from IDEM_MYSQL_URL; its database is replaced.
func openDB(tb testing.TB) (*sql.DB, string) {
	tb.Helper()
	dsn := testenv.URL(tb, testenv.MySQLVar)
	cfg, err := mysql.ParseDSN(dsn)
	require.NoError(tb, err, "%s", testenv.MySQLVar)
	var r [6]byte
	_, err = rand.Read(r[:])
	require.NoError(tb, err)
	name := "idem_test_" + hex.EncodeToString(r[:])

	cfg.DBName = ""
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(tb, err)
	defer admin.Close()
	ctx := context.Background()
	_, err = admin.ExecContext(ctx, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
	require.NoError(tb, err)

	cfg.DBName = name
	db, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(tb, err)
	db.SetMaxOpenConns(testMaxConns)
	db.SetMaxIdleConns(testMaxConns)
	tb.Cleanup(func() {
		require.NoError(tb, db.Close())
		cfg.DBName = ""
		admin, err := sql.Open("mysql", cfg.FormatDSN())
		require.NoError(tb, err)
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err = admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`")
		require.NoError(tb, err)
	})
	return db, name
}

// setup opens a fresh database and migrates a store with cfg into it.
func setup(tb testing.TB, cfg idemmysql.Config) *testBundle {
	tb.Helper()
	db, name := openDB(tb)
	store, err := idemmysql.NewWithConfig(db, cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, store.Close()) })
	ctx := context.Background()
	require.NoError(tb, store.Migrate(ctx))
	return &testBundle{ctx: ctx, db: db, store: store, name: name}
}

// factoryFor builds the conformance bundle for stores with cfg: a migrated store plus a ledger
// without a unique key and a wallet balance, which only idem can keep from being applied twice.
func factoryFor(cfg idemmysql.Config) storetest.Factory[*sql.Tx] {
	return func(tb testing.TB) storetest.Bundle[*sql.Tx] {
		tb.Helper()
		b := setup(tb, cfg)
		for _, ddl := range []string{
			`CREATE TABLE wallets (id VARCHAR(64) PRIMARY KEY, balance BIGINT NOT NULL) ENGINE=InnoDB`,
			`CREATE TABLE ledger (
				id       BIGINT AUTO_INCREMENT PRIMARY KEY,
				event_id VARCHAR(1024) NOT NULL,
				wallet   VARCHAR(64) NOT NULL,
				amount   BIGINT      NOT NULL
			) ENGINE=InnoDB`,
		} {
			_, err := b.db.ExecContext(b.ctx, ddl)
			require.NoError(tb, err)
		}
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
			// A handler that ends the transaction, as a deadlock does on MySQL.
			KillTx: func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, "ROLLBACK")
				return err
			},
			ClaimRows: func(ctx context.Context, key idem.Key) (int64, error) {
				var n int64
				err := db.QueryRowContext(ctx, `SELECT count(*) FROM idem_claims
					WHERE tenant = ? AND consumer = ? AND event_id = ?`, key.Tenant, key.Consumer, key.EventID).Scan(&n)
				return n, err
			},
		}
	}
}

// isolations are the levels the conformance suite runs at, each set per transaction by the
// store: REPEATABLE READ (InnoDB's default), READ COMMITTED and SERIALIZABLE.
var isolations = []struct {
	name  string
	level sql.IsolationLevel
}{
	{"RepeatableRead", sql.LevelRepeatableRead},
	{"ReadCommitted", sql.LevelReadCommitted},
	{"Serializable", sql.LevelSerializable},
}

func TestConformance(t *testing.T) {
	t.Parallel()
	for _, iso := range isolations {
		t.Run(iso.name, func(t *testing.T) {
			t.Parallel()
			storetest.Exercise(t, factoryFor(idemmysql.Config{Isolation: iso.level}))
		})
	}
}

func TestConformanceBatch(t *testing.T) {
	t.Parallel()
	for _, iso := range isolations {
		t.Run(iso.name, func(t *testing.T) {
			t.Parallel()
			storetest.ExerciseBatch(t, factoryFor(idemmysql.Config{Isolation: iso.level}))
		})
	}
	// MySQL 8 has no @@in_transaction: the batch path then relies on TxEnded's savepoint probe.
	t.Run("SavepointProbe", func(t *testing.T) {
		t.Parallel()
		storetest.ExerciseBatch(t, func(tb testing.TB) storetest.Bundle[*sql.Tx] {
			b := factoryFor(idemmysql.Config{})(tb)
			idemmysql.UseTxProbe(b.Store.(*idemmysql.Store))
			return b
		})
	})
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
