package idempg_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/storetest"
)

// testPoolMaxConns keeps the package's connection count modest: every test shares one pool.
const testPoolMaxConns = 10

// sharedPool is the package's one pool, created by TestMain when IDEM_POSTGRES_URL is set.
var sharedPool *pgxpool.Pool

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	if url := os.Getenv(testenv.PostgresVar); url != "" {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			fmt.Fprintf(os.Stderr, "idempg tests: %s: %v\n", testenv.PostgresVar, err)
			return 1
		}
		cfg.MaxConns = testPoolMaxConns
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			fmt.Fprintf(os.Stderr, "idempg tests: connect: %v\n", err)
			return 1
		}
		sharedPool = pool
	}
	code := m.Run()
	if s := testenv.SkipSummary(); s != "" {
		fmt.Println(s)
	}
	if sharedPool != nil {
		sharedPool.Close()
	}
	if code == 0 {
		// Every Store a test made was closed, so no listener may be left running.
		if err := testenv.FindLeaks(2 * time.Second); err != nil {
			fmt.Fprintf(os.Stderr, "idempg tests: leaked goroutines: %v\n", err)
			return 1
		}
	}
	return code
}

// testPool returns the shared pool, or skips (fails with IDEM_REQUIRE_SERVICES=1) without
// PostgreSQL.
func testPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	testenv.Postgres(tb)
	require.NotNil(tb, sharedPool, "TestMain did not create the pool")
	return sharedPool
}

// randomSchema returns a fresh schema name for one test.
func randomSchema(tb testing.TB) string {
	tb.Helper()
	var b [8]byte
	_, err := rand.Read(b[:])
	require.NoError(tb, err)
	return "idemtest_" + hex.EncodeToString(b[:])
}

// newStore returns a migrated Store in a schema of its own (cfg.Schema is replaced), closed
// and dropped when the test ends.
func newStore(tb testing.TB, cfg idempg.Config) *idempg.Store {
	tb.Helper()
	pool := testPool(tb)
	cfg.Schema = randomSchema(tb)
	store, err := idempg.NewWithConfig(pool, cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() {
		require.NoError(tb, store.Close())
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+cfg.Schema+`" CASCADE`)
		require.NoError(tb, err)
	})
	require.NoError(tb, store.Migrate(context.Background()))
	return store
}

// table returns the quoted name of one of the store's tables.
func table(s *idempg.Store, name string) string {
	c := s.Config()
	return `"` + c.Schema + `"."` + c.Prefix + name + `"`
}

// factory builds the conformance suite's Bundle: a migrated store in a fresh schema plus a
// wallet table and an append-only ledger without a unique key, so only idem keeps a credit
// single.
func factory(tb testing.TB) storetest.Bundle[pgx.Tx] {
	tb.Helper()
	return bundle(tb, newStore(tb, idempg.Config{}))
}

// bundle adds the suite's business tables to a migrated store in a schema of its own.
func bundle(tb testing.TB, store *idempg.Store) storetest.Bundle[pgx.Tx] {
	tb.Helper()
	pool := store.Pool()
	schema := `"` + store.Config().Schema + `"`
	_, err := pool.Exec(context.Background(), `
		CREATE TABLE `+schema+`.wallets (id text PRIMARY KEY, balance bigint NOT NULL);
		CREATE TABLE `+schema+`.ledger (id bigserial PRIMARY KEY, event_id text NOT NULL,
			wallet text NOT NULL, amount bigint NOT NULL);`)
	require.NoError(tb, err)

	var (
		createWallet = `INSERT INTO ` + schema + `.wallets (id, balance) VALUES ($1, 0)`
		insertLedger = `INSERT INTO ` + schema + `.ledger (event_id, wallet, amount) VALUES ($1, $2, $3)`
		credit       = `UPDATE ` + schema + `.wallets SET balance = balance + $2 WHERE id = $1`
		ledgerRows   = `SELECT count(*) FROM ` + schema + `.ledger WHERE event_id = $1`
		balance      = `SELECT balance FROM ` + schema + `.wallets WHERE id = $1`
		claimRows    = `SELECT count(*) FROM ` + table(store, "claims") +
			` WHERE tenant = $1 AND consumer = $2 AND event_id = $3`
	)
	return storetest.Bundle[pgx.Tx]{
		Store: store,
		CreateWallet: func(ctx context.Context, wallet string) error {
			_, err := pool.Exec(ctx, createWallet, wallet)
			return err
		},
		Credit: func(ctx context.Context, tx pgx.Tx, eventID, wallet string, amount int64) (int64, error) {
			if _, err := tx.Exec(ctx, insertLedger, eventID, wallet, amount); err != nil {
				return 0, err
			}
			tag, err := tx.Exec(ctx, credit, wallet, amount)
			if err != nil {
				return 0, err
			}
			return tag.RowsAffected(), nil
		},
		LedgerRows: func(ctx context.Context, eventID string) (int64, error) {
			var n int64
			err := pool.QueryRow(ctx, ledgerRows, eventID).Scan(&n)
			return n, err
		},
		Balance: func(ctx context.Context, wallet string) (int64, error) {
			var n int64
			err := pool.QueryRow(ctx, balance, wallet).Scan(&n)
			return n, err
		},
		ClaimRows: func(ctx context.Context, key idem.Key) (int64, error) {
			var n int64
			err := pool.QueryRow(ctx, claimRows, key.Tenant, key.Consumer, key.EventID).Scan(&n)
			return n, err
		},
		// A CHECK constraint refuses the event's claims, as PostgreSQL refuses a row it cannot
		// store (on a partitioned table it reaches every partition).
		RejectClaims: func(ctx context.Context, eventID string) error {
			_, err := pool.Exec(ctx, `ALTER TABLE `+table(store, "claims")+` ADD CONSTRAINT reject_`+
				hex.EncodeToString([]byte(eventID))+` CHECK (event_id <> `+quoteLiteral(eventID)+`)`)
			return err
		},
		// A ROLLBACK run on the transaction ends it, even from inside a savepoint; it succeeds.
		KillTx: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "ROLLBACK")
			return err
		},
	}
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// TestConformance runs the shared store suite against PostgreSQL.
func TestConformance(t *testing.T) {
	storetest.Exercise(t, factory)
}

// TestConformanceBatch runs the batched path's suite against PostgreSQL, plain and partitioned.
func TestConformanceBatch(t *testing.T) {
	t.Parallel()
	t.Run("Plain", func(t *testing.T) { t.Parallel(); storetest.ExerciseBatch(t, factory) })
	t.Run("PartitionedDay", func(t *testing.T) {
		t.Parallel()
		storetest.ExerciseBatch(t, partitionedFactory(idempg.PartitionConfig{Bucket: day, Retention: 7 * day}))
	})
}
