package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/idemstore"
)

func TestOpen(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})

	pragmas := []struct {
		name string
		want string
	}{
		{"journal_mode", "wal"},
		{"busy_timeout", "5000"},
		{"foreign_keys", "1"},
		{"synchronous", "1"}, // NORMAL
	}
	for _, p := range pragmas {
		t.Run(p.name, func(t *testing.T) {
			var got string
			require.NoError(t, b.db.QueryRowContext(b.ctx, "PRAGMA "+p.name).Scan(&got))
			require.Equal(t, p.want, strings.ToLower(got))
		})
	}
	require.Equal(t, 1, b.db.Stats().MaxOpenConnections)
}

func TestOpenMemory(t *testing.T) {
	t.Parallel()
	db, err := idemsqlite.Open(":memory:")
	require.NoError(t, err)
	defer db.Close()
	store := idemsqlite.New(db)
	require.NoError(t, store.Migrate(context.Background()))
	require.NoError(t, store.QueuePublish(context.Background(), "q", idem.Message{EventID: "e1"}))
	st, err := store.QueueStats(context.Background(), "q")
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Backlog, "the one connection keeps the in-memory database alive")
}

func TestOpenEscapesPath(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "odd?dir#x%20y")
	require.NoError(t, os.Mkdir(dir, 0o755))
	path := filepath.Join(dir, "a?b.db")
	db, err := idemsqlite.Open(path)
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`CREATE TABLE t (x INTEGER)`)
	require.NoError(t, err)
	_, err = os.Stat(path)
	require.NoError(t, err, "the database file is at the exact path given")
}

// TestOpenBeginsImmediate shows that a transaction takes the write lock at BEGIN, and that
// ClassifyError calls the resulting SQLITE_BUSY transient.
func TestOpenBeginsImmediate(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})

	// A second pool on the same file that gives up on a lock at once.
	other, err := sql.Open("sqlite", "file:"+b.path+"?_pragma=busy_timeout(0)")
	require.NoError(t, err)
	defer other.Close()

	tx, err := b.db.BeginTx(b.ctx, nil) // BEGIN IMMEDIATE: holds the write lock, no statement run yet
	require.NoError(t, err)
	defer tx.Rollback()

	_, err = other.ExecContext(b.ctx, `INSERT INTO idem_leases (name, owner, token, lease_until) VALUES ('x', 'y', 1, 0)`)
	require.Error(t, err)
	require.Equal(t, idem.ClassTransient, b.store.ClassifyError(err), "error: %v", err)
	require.Equal(t, idem.ClassTransient, b.store.ClassifyError(fmt.Errorf("wrapped: %w", err)))

	// Readers are not blocked in WAL mode.
	var n int
	require.NoError(t, other.QueryRowContext(b.ctx, `SELECT count(*) FROM idem_leases`).Scan(&n))
}

func TestClassifyError(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})

	// SQLITE_LOCKED: dropping a table while a statement of the same connection reads it.
	lockedErr := func() error {
		var err error
		require.NoError(t, b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `CREATE TABLE victim (x INTEGER); INSERT INTO victim VALUES (1), (2)`)
			require.NoError(t, err)
			return nil
		}))
		tx, err := b.db.BeginTx(b.ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback()
		rows, err := tx.QueryContext(b.ctx, `SELECT x FROM victim`)
		require.NoError(t, err)
		defer rows.Close()
		require.True(t, rows.Next())
		_, err = tx.ExecContext(b.ctx, `DROP TABLE victim`)
		return err
	}()

	constraintErr := b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO idem_migrations (version, name, applied_at) VALUES (1, 'dup', 0)`)
		return err
	})

	tests := []struct {
		name string
		err  error
		want idem.Class
	}{
		{"nil", nil, idem.ClassUnknown},
		{"plain", errors.New("boom"), idem.ClassUnknown},
		{"locked", lockedErr, idem.ClassTransient},
		{"locked wrapped", fmt.Errorf("handler: %w", lockedErr), idem.ClassTransient},
		{"constraint", constraintErr, idem.ClassUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.err != nil && tt.name != "plain" {
				require.Error(t, tt.err)
			}
			require.Equal(t, tt.want, b.store.ClassifyError(tt.err), "error: %v", tt.err)
		})
	}
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})

	countVersions := func(db *sql.DB, prefix string) int {
		var n int
		require.NoError(t, db.QueryRowContext(b.ctx, `SELECT count(*) FROM `+prefix+`migrations`).Scan(&n))
		return n
	}
	applied := countVersions(b.db, "idem_")
	require.GreaterOrEqual(t, applied, 4)
	for range 2 {
		require.NoError(t, b.store.Migrate(b.ctx), "Migrate is idempotent")
	}
	require.Equal(t, applied, countVersions(b.db, "idem_"))

	tables := []string{"migrations", "claims", "dead_letters", "audit", "queue", "outbox", "leases"}
	for _, table := range tables {
		var n int
		require.NoError(t, b.db.QueryRowContext(b.ctx,
			`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, "idem_"+table).Scan(&n))
		require.Equal(t, 1, n, "table idem_%s", table)
	}

	t.Run("MigrationSQL", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "plain.db")
		db, err := idemsqlite.Open(path)
		require.NoError(t, err)
		defer db.Close()
		store, err := idemsqlite.NewWithConfig(db, idemsqlite.Config{Prefix: "app_idem_"})
		require.NoError(t, err)

		script := store.MigrationSQL()
		require.NotContains(t, script, "{{prefix}}")
		for _, table := range tables {
			require.Contains(t, script, "CREATE TABLE IF NOT EXISTS app_idem_"+table+" ")
		}
		// A team's own tool runs the script; Migrate then finds everything applied.
		_, err = db.ExecContext(b.ctx, script)
		require.NoError(t, err)
		require.Equal(t, applied, countVersions(db, "app_idem_"))
		require.NoError(t, store.Migrate(b.ctx))
		require.Equal(t, applied, countVersions(db, "app_idem_"))
	})

	t.Run("PrefixesCoexist", func(t *testing.T) {
		t.Parallel()
		other, err := idemsqlite.NewWithConfig(b.db, idemsqlite.Config{Prefix: "other_"})
		require.NoError(t, err)
		require.NoError(t, other.Migrate(b.ctx))
		require.Equal(t, applied, countVersions(b.db, "other_"))
	})
}

func TestConfig(t *testing.T) {
	t.Parallel()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "cfg.db"))
	require.NoError(t, err)
	defer db.Close()

	tests := []struct {
		name    string
		cfg     idemsqlite.Config
		wantErr string // substring; empty means valid
	}{
		{"zero", idemsqlite.Config{}, ""},
		{"underscore", idemsqlite.Config{Prefix: "_"}, ""},
		{"max length", idemsqlite.Config{Prefix: "a" + strings.Repeat("b", 40)}, ""},
		{"too long", idemsqlite.Config{Prefix: "a" + strings.Repeat("b", 41)}, `Config.Prefix "abbb`},
		{"leading digit", idemsqlite.Config{Prefix: "1x_"}, `Config.Prefix "1x_"`},
		{"injection", idemsqlite.Config{Prefix: "x; DROP TABLE t; --"}, `Config.Prefix "x; DROP TABLE t; --"`},
		{"dash", idemsqlite.Config{Prefix: "my-app"}, `Config.Prefix "my-app"`},
		{"negative partitions", idemsqlite.Config{OutboxPartitions: -1}, "Config.OutboxPartitions is -1"},
		{"negative poll", idemsqlite.Config{PollInterval: -time.Second}, "Config.PollInterval is -1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := idemsqlite.NewWithConfig(db, tt.cfg)
			if tt.wantErr == "" {
				require.NoError(t, err)
				require.NotNil(t, s)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}

	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		cfg := idemsqlite.New(db).Config()
		require.Equal(t, idemsqlite.PrefixDefault, cfg.Prefix)
		require.Equal(t, idemstore.OutboxPartitionsDefault, cfg.OutboxPartitions)
		require.Equal(t, idemsqlite.PollIntervalDefault, cfg.PollInterval)
		require.Equal(t, "sqlite", idemsqlite.New(db).Dialect())
		require.Same(t, db, idemsqlite.New(db).DB())
	})

	t.Run("nil db", func(t *testing.T) {
		t.Parallel()
		_, err := idemsqlite.NewWithConfig(nil, idemsqlite.Config{})
		require.ErrorContains(t, err, "db is nil")
	})
}

func TestClaim(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	key := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-1"}
	first := now().Add(-time.Hour)

	claim := func(k idem.Key, f idem.Fingerprint, at time.Time) idemstore.ClaimResult {
		t.Helper()
		var res idemstore.ClaimResult
		require.NoError(t, b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
			var err error
			res, err = b.store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: k, Fingerprint: f, Now: at})
			return err
		}))
		return res
	}
	require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimNew}, claim(key, fp(1), first))

	tests := []struct {
		name string
		key  idem.Key
		fp   idem.Fingerprint
		want idemstore.ClaimResult
	}{
		{"duplicate", key, fp(1), idemstore.ClaimResult{Status: idemstore.ClaimDuplicate, Existing: fp(1), ClaimedAt: first}},
		{"conflict", key, fp(2), idemstore.ClaimResult{Status: idemstore.ClaimConflict, Existing: fp(1), ClaimedAt: first}},
		{"other consumer", idem.Key{Tenant: "acme", Consumer: "ledger@v2", EventID: "evt-1"}, fp(1), idemstore.ClaimResult{Status: idemstore.ClaimNew}},
		{"other tenant", idem.Key{Tenant: "globex", Consumer: "ledger@v1", EventID: "evt-1"}, fp(1), idemstore.ClaimResult{Status: idemstore.ClaimNew}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, claim(tt.key, tt.fp, now()))
		})
	}

	t.Run("rollback releases the key", func(t *testing.T) {
		k := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-rolled-back"}
		errHandler := errors.New("handler failed")
		err := b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
			res, err := b.store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: k, Fingerprint: fp(3), Now: now()})
			require.NoError(t, err)
			require.Equal(t, idemstore.ClaimNew, res.Status)
			return errHandler
		})
		require.ErrorIs(t, err, errHandler)
		require.Equal(t, idemstore.ClaimNew, claim(k, fp(3), now()).Status)
	})

	t.Run("plain SQL after Close", func(t *testing.T) {
		require.NoError(t, b.store.Close())
		require.Equal(t, idemstore.ClaimDuplicate, claim(key, fp(1), now()).Status)
		require.Equal(t, idemstore.ClaimConflict, claim(key, fp(9), now()).Status)
		require.Equal(t, idemstore.ClaimNew, claim(idem.Key{EventID: "after-close"}, fp(1), now()).Status)
		require.NoError(t, b.store.Close(), "Close twice")
	})

	t.Run("caller's own transaction", func(t *testing.T) {
		fresh := setup(t, idemsqlite.Config{})
		require.NoError(t, fresh.store.InTx(fresh.ctx, func(context.Context, *sql.Tx) error { return nil })) // prepares
		tx, err := fresh.db.BeginTx(fresh.ctx, nil)
		require.NoError(t, err)
		res, err := fresh.store.ClaimTx(fresh.ctx, tx, idemstore.ClaimParams{Key: key, Fingerprint: fp(1), Now: first})
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimNew, res.Status)
		require.NoError(t, tx.Commit())
		require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimDuplicate, Existing: fp(1), ClaimedAt: first},
			func() idemstore.ClaimResult {
				var r idemstore.ClaimResult
				require.NoError(t, fresh.store.InTx(fresh.ctx, func(ctx context.Context, tx *sql.Tx) error {
					var err error
					r, err = fresh.store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: key, Fingerprint: fp(1)})
					return err
				}))
				return r
			}())
	})

	t.Run("empty event id", func(t *testing.T) {
		err := b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
			_, err := b.store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: idem.Key{Consumer: "c"}, Fingerprint: fp(1)})
			return err
		})
		require.ErrorContains(t, err, "event id is empty")
	})
}

func TestInTx(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	_, err := b.db.ExecContext(b.ctx, `CREATE TABLE t (x INTEGER)`)
	require.NoError(t, err)
	count := func() int {
		var n int
		require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT count(*) FROM t`).Scan(&n))
		return n
	}
	insert := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO t VALUES (1)`)
		return err
	}

	require.NoError(t, b.store.InTx(b.ctx, insert))
	require.Equal(t, 1, count())

	errFn := errors.New("fn failed")
	err = b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		require.NoError(t, insert(ctx, tx))
		return errFn
	})
	require.Same(t, errFn, err, "fn's error comes back as is")
	require.Equal(t, 1, count())

	require.PanicsWithValue(t, "boom", func() {
		_ = b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
			require.NoError(t, insert(ctx, tx))
			panic("boom")
		})
	})
	require.Equal(t, 1, count(), "a panic rolls back, and the one connection is free again")

	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	require.ErrorIs(t, b.store.InTx(ctx, insert), context.Canceled)

	// Cancelled while fn runs: the transaction rolls back at once, so another process on the file
	// can write while fn still runs, and fn's nil after that commits nothing.
	other, err := idemsqlite.Open(b.path)
	require.NoError(t, err)
	defer other.Close()
	ctx, cancel = context.WithCancel(b.ctx)
	err = b.store.InTx(ctx, func(fctx context.Context, tx *sql.Tx) error {
		require.NoError(t, insert(fctx, tx))
		cancel()
		_, err := other.ExecContext(b.ctx, `INSERT INTO t VALUES (2)`) // waits for the write lock (busy_timeout)
		require.NoError(t, err, "the cancelled transaction holds the write lock no more")
		return nil
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 2, count(), "the other process's row, not fn's")
}

func TestDeleteExpiredClaims(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	cutoff := now()
	// Per consumer: 5 old claims and 2 recent ones.
	for _, consumer := range []string{"a@v1", "b@v1"} {
		for i := range 7 {
			at := cutoff.Add(-time.Duration(i+1) * time.Hour)
			if i >= 5 {
				at = cutoff.Add(time.Duration(i) * time.Minute)
			}
			require.NoError(t, b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
				_, err := b.store.ClaimTx(ctx, tx, idemstore.ClaimParams{
					Key: idem.Key{Consumer: consumer, EventID: fmt.Sprint("e", i)}, Fingerprint: fp(1), Now: at})
				return err
			}))
		}
	}
	remaining := func() int {
		var n int
		require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT count(*) FROM idem_claims`).Scan(&n))
		return n
	}

	// One consumer, in batches of 2: 2, 2, 1.
	var got []int
	for {
		n, err := b.store.DeleteExpiredClaims(b.ctx, idemstore.DeleteExpiredClaimsParams{Consumer: "a@v1", Before: cutoff, Limit: 2})
		require.NoError(t, err)
		got = append(got, n)
		if n < 2 {
			break
		}
	}
	require.Equal(t, []int{2, 2, 1}, got)
	require.Equal(t, 9, remaining())

	// Every consumer, through the root package's loop.
	n, err := idem.CollectGarbage(b.ctx, b.store, "", cutoff, 3)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	require.Equal(t, 4, remaining(), "recent claims stay")

	_, err = b.store.DeleteExpiredClaims(b.ctx, idemstore.DeleteExpiredClaimsParams{Before: cutoff})
	require.ErrorContains(t, err, "Limit is 0")
}

// TestMigrateUpToDateTakesNoWriteLock: another connection holds the write lock for as long as
// Migrate runs; on an up-to-date database Migrate must not need it, so it returns nil instead of
// SQLITE_BUSY after the busy timeout.
func TestMigrateUpToDateTakesNoWriteLock(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "locked.db")
	cfg := idemsqlite.OpenConfig{BusyTimeout: 200 * time.Millisecond}
	db, err := idemsqlite.OpenWithConfig(path, cfg)
	require.NoError(t, err)
	defer db.Close()
	store := idemsqlite.New(db)
	ctx := context.Background()
	require.NoError(t, store.Migrate(ctx))

	other, err := idemsqlite.OpenWithConfig(path, cfg)
	require.NoError(t, err)
	defer other.Close()
	holder, err := other.BeginTx(ctx, nil) // BEGIN IMMEDIATE: the write lock
	require.NoError(t, err)
	defer holder.Rollback() //nolint:errcheck // the lock is what matters
	_, err = holder.ExecContext(ctx, `INSERT INTO idem_leases (name, owner, token, lease_until) VALUES ('x', 'y', 1, 0)`)
	require.NoError(t, err)

	// Sanity: a write from the first connection does wait for the lock and fails.
	_, err = db.ExecContext(ctx, `DELETE FROM idem_leases`)
	require.Error(t, err, "the other connection must hold the write lock")
	require.Equal(t, idem.ClassTransient, store.ClassifyError(err))

	require.NoError(t, store.Migrate(ctx), "an up-to-date Migrate needs no write lock")

	// A store with a migration to apply does need the lock, and waits for it.
	fresh, err := idemsqlite.NewWithConfig(db, idemsqlite.Config{Prefix: "fresh_"})
	require.NoError(t, err)
	err = fresh.Migrate(ctx)
	require.Error(t, err)
	require.Equal(t, idem.ClassTransient, store.ClassifyError(err), "%v", err)
	require.NoError(t, holder.Rollback())
	require.NoError(t, fresh.Migrate(ctx), "once the lock is free the pending migrations apply")
}

func TestOpenConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     idemsqlite.OpenConfig
		want    time.Duration // the connection's busy_timeout
		wantErr string
	}{
		{"default", idemsqlite.OpenConfig{}, idemsqlite.BusyTimeoutDefault, ""},
		{"set", idemsqlite.OpenConfig{BusyTimeout: 1500 * time.Millisecond}, 1500 * time.Millisecond, ""},
		{"negative", idemsqlite.OpenConfig{BusyTimeout: -time.Second}, 0, "OpenConfig.BusyTimeout is -1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db, err := idemsqlite.OpenWithConfig(filepath.Join(t.TempDir(), "o.db"), tt.cfg)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			defer db.Close()
			var ms int64
			require.NoError(t, db.QueryRow(`PRAGMA busy_timeout`).Scan(&ms))
			require.Equal(t, tt.want, time.Duration(ms)*time.Millisecond)
		})
	}
}

// TestWriteWaitsForLock: the store's writes wait for another connection's write lock by
// retrying (SQLite's own busy wait is off while they try), for as long as the connection's busy
// timeout, and leave the connection's busy timeout as it was.
func TestWriteWaitsForLock(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		busy    time.Duration // the store's connection
		hold    time.Duration // how long the other connection holds the lock
		wantErr bool
	}{
		{"lock freed in time", 2 * time.Second, 300 * time.Millisecond, false},
		{"lock held too long", 100 * time.Millisecond, time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "w.db")
			db, err := idemsqlite.OpenWithConfig(path, idemsqlite.OpenConfig{BusyTimeout: tt.busy})
			require.NoError(t, err)
			defer db.Close()
			store := idemsqlite.New(db)
			require.NoError(t, store.Migrate(ctx))
			other, err := idemsqlite.Open(path)
			require.NoError(t, err)
			defer other.Close()

			holder, err := other.BeginTx(ctx, nil)
			require.NoError(t, err)
			released := make(chan struct{})
			go func() {
				defer close(released)
				time.Sleep(tt.hold)
				_ = holder.Rollback()
			}()
			txErr := store.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO idem_leases (name, owner, token, lease_until) VALUES ('a', 'b', 1, 0)`)
				return err
			})
			pubErr := store.QueuePublish(ctx, "q", idem.Message{EventID: "e1"})
			<-released
			if tt.wantErr {
				require.Error(t, txErr)
				require.Equal(t, idem.ClassTransient, store.ClassifyError(txErr), "%v", txErr)
			} else {
				require.NoError(t, txErr)
				require.NoError(t, pubErr)
			}
			var ms int64
			require.NoError(t, db.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&ms))
			require.Equal(t, tt.busy.Milliseconds(), ms, "the connection's busy timeout is restored")
		})
	}
}
