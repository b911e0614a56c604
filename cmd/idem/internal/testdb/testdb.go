// Package testdb builds isolated, migrated stores for tests: a fresh schema per test on
// PostgreSQL, a fresh database per test on MySQL and a fresh file per test on SQLite, each with the suite's business tables
// (wallets and an append-only ledger without a unique key), dropped when the test ends.
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"path/filepath"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/storetest"
)

// Name returns a random identifier with prefix, safe as a schema, stream or queue name.
func Name(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Pool opens a small pgx pool on IDEM_POSTGRES_URL (or skips), closed at cleanup.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	url := testenv.Postgres(tb)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatalf("testdb: parse %s: %v", testenv.PostgresVar, err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("testdb: connect to PostgreSQL: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// Postgres returns a migrated store in a fresh schema, plus the conformance bundle over it.
func Postgres(tb testing.TB) (*idempg.Store, storetest.Bundle[pgx.Tx]) {
	tb.Helper()
	return PostgresPartitioned(tb, idempg.PartitionConfig{})
}

// PostgresPartitioned is Postgres with the claims table partitioned as p says (plain when
// p.Bucket is 0).
func PostgresPartitioned(tb testing.TB, p idempg.PartitionConfig) (*idempg.Store, storetest.Bundle[pgx.Tx]) {
	tb.Helper()
	ctx := context.Background()
	pool := Pool(tb)
	schema := Name("idemtest_")
	store, err := idempg.NewWithConfig(pool, idempg.Config{Schema: schema, Partition: p})
	if err != nil {
		tb.Fatalf("testdb: %v", err)
	}
	tb.Cleanup(func() {
		store.Close()
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	})
	if err := store.Migrate(ctx); err != nil {
		tb.Fatalf("testdb: migrate schema %s: %v", schema, err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.wallets (id text PRIMARY KEY, balance bigint NOT NULL);
		CREATE TABLE `+schema+`.ledger (id bigserial PRIMARY KEY, event_id text NOT NULL, wallet text NOT NULL, amount bigint NOT NULL)`); err != nil {
		tb.Fatalf("testdb: business tables: %v", err)
	}
	return store, storetest.Bundle[pgx.Tx]{
		Store: store,
		CreateWallet: func(ctx context.Context, wallet string) error {
			_, err := pool.Exec(ctx, `INSERT INTO `+schema+`.wallets (id, balance) VALUES ($1, 0)`, wallet)
			return err
		},
		Credit: func(ctx context.Context, tx pgx.Tx, eventID, wallet string, amount int64) (int64, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.ledger (event_id, wallet, amount) VALUES ($1, $2, $3)`, eventID, wallet, amount); err != nil {
				return 0, err
			}
			tag, err := tx.Exec(ctx, `UPDATE `+schema+`.wallets SET balance = balance + $2 WHERE id = $1`, wallet, amount)
			return tag.RowsAffected(), err
		},
		LedgerRows: func(ctx context.Context, eventID string) (n int64, err error) {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.ledger WHERE event_id = $1`, eventID).Scan(&n)
			return n, err
		},
		Balance: func(ctx context.Context, wallet string) (n int64, err error) {
			err = pool.QueryRow(ctx, `SELECT balance FROM `+schema+`.wallets WHERE id = $1`, wallet).Scan(&n)
			return n, err
		},
		ClaimRows: func(ctx context.Context, k idem.Key) (n int64, err error) {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.idem_claims WHERE tenant = $1 AND consumer = $2 AND event_id = $3`,
				k.Tenant, k.Consumer, k.EventID).Scan(&n)
			return n, err
		},
	}
}

// SQLite returns a migrated store in a fresh database file, plus the conformance bundle.
func SQLite(tb testing.TB) (*idemsqlite.Store, storetest.Bundle[*sql.Tx]) {
	tb.Helper()
	ctx := context.Background()
	db, err := idemsqlite.Open(filepath.Join(tb.TempDir(), "idem.db"))
	if err != nil {
		tb.Fatalf("testdb: open SQLite: %v", err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	store := idemsqlite.New(db)
	tb.Cleanup(func() { store.Close() })
	if err := store.Migrate(ctx); err != nil {
		tb.Fatalf("testdb: migrate SQLite: %v", err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE wallets (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
		CREATE TABLE ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL, wallet TEXT NOT NULL, amount INTEGER NOT NULL)`); err != nil {
		tb.Fatalf("testdb: business tables: %v", err)
	}
	return store, storetest.Bundle[*sql.Tx]{
		Store: store,
		CreateWallet: func(ctx context.Context, wallet string) error {
			_, err := db.ExecContext(ctx, `INSERT INTO wallets (id, balance) VALUES (?, 0)`, wallet)
			return err
		},
		Credit: func(ctx context.Context, tx *sql.Tx, eventID, wallet string, amount int64) (int64, error) {
			if _, err := tx.ExecContext(ctx, `INSERT INTO ledger (event_id, wallet, amount) VALUES (?, ?, ?)`, eventID, wallet, amount); err != nil {
				return 0, err
			}
			res, err := tx.ExecContext(ctx, `UPDATE wallets SET balance = balance + ? WHERE id = ?`, amount, wallet)
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		},
		LedgerRows: func(ctx context.Context, eventID string) (n int64, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM ledger WHERE event_id = ?`, eventID).Scan(&n)
			return n, err
		},
		Balance: func(ctx context.Context, wallet string) (n int64, err error) {
			err = db.QueryRowContext(ctx, `SELECT balance FROM wallets WHERE id = ?`, wallet).Scan(&n)
			return n, err
		},
		ClaimRows: func(ctx context.Context, k idem.Key) (n int64, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM idem_claims WHERE tenant = ? AND consumer = ? AND event_id = ?`,
				k.Tenant, k.Consumer, k.EventID).Scan(&n)
			return n, err
		},
	}
}

// MySQLDB creates a fresh database idem_test_<hex> on IDEM_MYSQL_URL (or skips) and returns a
// small pool on it; the database is dropped and the pool closed at cleanup.
func MySQLDB(tb testing.TB) *sql.DB {
	tb.Helper()
	db, _ := MySQLDatabase(tb)
	return db
}

// MySQLDatabase is MySQLDB that also returns the store URL of the database, as the idem command
// takes it (mysql://USER:PASSWORD@HOST:PORT/DB).
func MySQLDatabase(tb testing.TB) (*sql.DB, string) {
	tb.Helper()
	cfg, err := mysql.ParseDSN(testenv.URL(tb, testenv.MySQLVar))
	if err != nil {
		tb.Fatalf("testdb: parse %s: %v", testenv.MySQLVar, err)
	}
	name := Name("idem_test_")
	cfg.DBName = ""
	admin := cfg.FormatDSN()
	exec := func(stmt string) error {
		db, err := sql.Open("mysql", admin)
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.ExecContext(context.Background(), stmt)
		return err
	}
	if err := exec("CREATE DATABASE `" + name + "` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		tb.Fatalf("testdb: create MySQL database %s: %v", name, err)
	}
	cfg.DBName = name
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		tb.Fatalf("testdb: open MySQL: %v", err)
	}
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	tb.Cleanup(func() {
		_ = db.Close()
		if err := exec("DROP DATABASE IF EXISTS `" + name + "`"); err != nil {
			tb.Errorf("testdb: drop MySQL database %s: %v", name, err)
		}
	})
	u := url.URL{Scheme: "mysql", Host: cfg.Addr, Path: "/" + name}
	switch {
	case cfg.Passwd != "":
		u.User = url.UserPassword(cfg.User, cfg.Passwd)
	case cfg.User != "":
		u.User = url.User(cfg.User)
	}
	return db, u.String()
}

// MySQL returns a migrated store in a fresh MySQL or MariaDB database, plus the conformance
// bundle.
func MySQL(tb testing.TB) (*idemmysql.Store, storetest.Bundle[*sql.Tx]) {
	tb.Helper()
	ctx := context.Background()
	db := MySQLDB(tb)
	store := idemmysql.New(db)
	tb.Cleanup(func() { store.Close() })
	if err := store.Migrate(ctx); err != nil {
		tb.Fatalf("testdb: migrate MySQL: %v", err)
	}
	for _, ddl := range []string{
		`CREATE TABLE wallets (id VARCHAR(64) PRIMARY KEY, balance BIGINT NOT NULL) ENGINE=InnoDB`,
		`CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, event_id VARCHAR(255) NOT NULL,
			wallet VARCHAR(64) NOT NULL, amount BIGINT NOT NULL) ENGINE=InnoDB`,
	} {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			tb.Fatalf("testdb: business tables: %v", err)
		}
	}
	return store, storetest.Bundle[*sql.Tx]{
		Store: store,
		CreateWallet: func(ctx context.Context, wallet string) error {
			_, err := db.ExecContext(ctx, `INSERT INTO wallets (id, balance) VALUES (?, 0)`, wallet)
			return err
		},
		Credit: func(ctx context.Context, tx *sql.Tx, eventID, wallet string, amount int64) (int64, error) {
			if _, err := tx.ExecContext(ctx, `INSERT INTO ledger (event_id, wallet, amount) VALUES (?, ?, ?)`, eventID, wallet, amount); err != nil {
				return 0, err
			}
			res, err := tx.ExecContext(ctx, `UPDATE wallets SET balance = balance + ? WHERE id = ?`, amount, wallet)
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		},
		LedgerRows: func(ctx context.Context, eventID string) (n int64, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM ledger WHERE event_id = ?`, eventID).Scan(&n)
			return n, err
		},
		Balance: func(ctx context.Context, wallet string) (n int64, err error) {
			err = db.QueryRowContext(ctx, `SELECT balance FROM wallets WHERE id = ?`, wallet).Scan(&n)
			return n, err
		},
		ClaimRows: func(ctx context.Context, k idem.Key) (n int64, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM idem_claims WHERE tenant = ? AND consumer = ? AND event_id = ?`,
				k.Tenant, k.Consumer, k.EventID).Scan(&n)
			return n, err
		},
	}
}
