package idemmysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/testenv"
)

// claimIn runs one ClaimTx in a transaction of its own.
func claimIn(t *testing.T, b *testBundle, k idem.Key, f idem.Fingerprint, at time.Time) (idemstore.ClaimResult, error) {
	t.Helper()
	var res idemstore.ClaimResult
	err := b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		res, err = b.store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: k, Fingerprint: f, Now: at})
		return err
	})
	return res, err
}

func TestClaim(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmysql.Config{})
	key := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-1"}
	first := now().Add(-time.Hour)

	claim := func(k idem.Key, f idem.Fingerprint, at time.Time) idemstore.ClaimResult {
		t.Helper()
		res, err := claimIn(t, b, k, f, at)
		require.NoError(t, err)
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
		// Binary columns: no collation folds case, trailing spaces or accents into one key.
		{"other case", idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "EVT-1"}, fp(1), idemstore.ClaimResult{Status: idemstore.ClaimNew}},
		{"trailing space", idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-1 "}, fp(1), idemstore.ClaimResult{Status: idemstore.ClaimNew}},
		{"accent", idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "évt-1"}, fp(1), idemstore.ClaimResult{Status: idemstore.ClaimNew}},
		{"tenant case", idem.Key{Tenant: "ACME", Consumer: "ledger@v1", EventID: "evt-1"}, fp(1), idemstore.ClaimResult{Status: idemstore.ClaimNew}},
		{"invalid UTF-8 id", idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-\xff"}, fp(1), idemstore.ClaimResult{Status: idemstore.ClaimNew}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, claim(tt.key, tt.fp, now()))
			if tt.want.Status == idemstore.ClaimNew {
				require.Equal(t, idemstore.ClaimDuplicate, claim(tt.key, tt.fp, now()).Status, "stored byte for byte")
			}
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
		tx, err := b.db.BeginTx(b.ctx, nil)
		require.NoError(t, err)
		k := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-own-tx"}
		res, err := b.store.ClaimTx(b.ctx, tx, idemstore.ClaimParams{Key: k, Fingerprint: fp(1), Now: first})
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimNew, res.Status)
		require.NoError(t, tx.Commit())
		require.Equal(t, idemstore.ClaimResult{Status: idemstore.ClaimDuplicate, Existing: fp(1), ClaimedAt: first}, claim(k, fp(1), time.Time{}))
	})
}

// TestClaimIdentityBounds: the key columns hold the largest identities idem allows (a 1024-byte
// event id with 256-byte tenant and consumer), and anything longer is refused as invalid input
// before it reaches the database, never truncated into another key.
func TestClaimIdentityBounds(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmysql.Config{})
	long := func(n int, c string) string { return strings.Repeat(c, n) }
	max := idem.Key{Tenant: long(idemmysql.MaxTenantBytes, "t"), Consumer: long(idemmysql.MaxConsumerBytes, "c"),
		EventID: long(idemmysql.MaxEventIDBytes, "e")}
	res, err := claimIn(t, b, max, fp(1), now())
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimNew, res.Status)
	res, err = claimIn(t, b, max, fp(1), now())
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimDuplicate, res.Status)

	// Two ids that differ only in their last byte, at the bound: two keys.
	other := max
	other.EventID = long(idemmysql.MaxEventIDBytes-1, "e") + "f"
	res, err = claimIn(t, b, other, fp(1), now())
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimNew, res.Status)

	// Multi-byte characters count in bytes: 256 × "é" is 512 bytes.
	for _, tc := range []struct {
		name string
		key  idem.Key
	}{
		{"event id", idem.Key{Tenant: "acme", Consumer: "c@v1", EventID: long(idemmysql.MaxEventIDBytes+1, "e")}},
		{"tenant", idem.Key{Tenant: long(idemmysql.MaxTenantBytes+1, "t"), Consumer: "c@v1", EventID: "e"}},
		{"tenant multi-byte", idem.Key{Tenant: long(idemmysql.MaxTenantBytes/2+1, "é"), Consumer: "c@v1", EventID: "e"}},
		{"consumer", idem.Key{Tenant: "acme", Consumer: long(idemmysql.MaxConsumerBytes+1, "c"), EventID: "e"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := claimIn(t, b, tc.key, fp(1), now())
			require.ErrorIs(t, err, idem.ErrInvalidPayload)
			require.Equal(t, idem.ClassPermanent, idem.Classify(err))
		})
	}
	var n int
	require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT count(*) FROM idem_claims`).Scan(&n))
	require.Equal(t, 2, n, "nothing over the bound was stored")

	// The batch path checks the same bounds.
	err = b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := b.store.ClaimBatchTx(ctx, tx, []idemstore.ClaimParams{{Key: idem.Key{EventID: long(idemmysql.MaxEventIDBytes+1, "e")}}})
		return err
	})
	require.ErrorIs(t, err, idem.ErrInvalidPayload)
}

// TestClaimWaitsForConcurrentClaimer: a claim of a key another transaction has claimed but not
// committed waits for it, then sees its outcome, at every supported isolation level, even when
// its own snapshot was taken before the first claim committed.
func TestClaimWaitsForConcurrentClaimer(t *testing.T) {
	t.Parallel()
	fpA, fpB := idem.Fingerprint{0xa}, idem.Fingerprint{0xb}
	for _, iso := range isolations {
		for _, tc := range []struct {
			name       string
			secondFP   idem.Fingerprint
			firstEnds  error // nil commits, an error rolls back
			wantStatus idemstore.ClaimStatus
		}{
			{"commit then duplicate", fpA, nil, idemstore.ClaimDuplicate},
			{"commit then conflict", fpB, nil, idemstore.ClaimConflict},
			{"rollback then new", fpA, errors.New("first handler failed"), idemstore.ClaimNew},
		} {
			t.Run(iso.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, idemmysql.Config{Isolation: iso.level}) // its own, so the lock wait seen is this one's
				ctx := b.ctx
				key := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-1"}
				firstClaimed := make(chan struct{})
				release := make(chan struct{})
				firstDone := make(chan error, 1)
				go func() {
					firstDone <- b.store.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
						res, err := b.store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: key, Fingerprint: fpA})
						if err != nil {
							return err
						}
						if res.Status != idemstore.ClaimNew {
							return fmt.Errorf("first claim: %s", res.Status)
						}
						close(firstClaimed)
						<-release
						return tc.firstEnds
					})
				}()
				<-firstClaimed

				secondDone := make(chan idemstore.ClaimResult, 1)
				secondErr := make(chan error, 1)
				go func() {
					secondErr <- b.store.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
						// A consistent read first: under REPEATABLE READ it fixes the snapshot
						// before the first claim commits, so only a locking read can see it.
						// (Under SERIALIZABLE every plain read is a locking read, which would
						// itself wait for the first claim.)
						if iso.level != sql.LevelSerializable {
							var n int
							if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM idem_claims`).Scan(&n); err != nil {
								return err
							}
						}
						res, err := b.store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: key, Fingerprint: tc.secondFP})
						secondDone <- res
						return err
					})
				}()
				waitForLockWait(t, b)
				close(release)
				require.ErrorIs(t, <-firstDone, tc.firstEnds)
				require.NoError(t, <-secondErr)
				res := <-secondDone
				require.Equal(t, tc.wantStatus, res.Status)
				if tc.wantStatus != idemstore.ClaimNew {
					require.Equal(t, fpA, res.Existing)
					require.False(t, res.ClaimedAt.IsZero())
				}
			})
		}
	}
}

// waitForLockWait waits until the second claimer is inside its INSERT on the test's database:
// the first claimer is idle inside its transaction, so a claim INSERT still running is one
// that waits for the first's lock. (The processlist shows it at once; InnoDB's own view of lock
// waits, information_schema.INNODB_TRX, is a cache refreshed lazily.)
func waitForLockWait(t *testing.T, b *testBundle) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := b.db.QueryRowContext(b.ctx, `SELECT count(*) FROM information_schema.PROCESSLIST
			WHERE DB = ? AND INFO LIKE 'INSERT INTO idem_claims%'`, b.name).Scan(&n)
		require.NoError(t, err)
		return n > 0
	}, 10*time.Second, 10*time.Millisecond, "the second claimer never waited for the first")
	time.Sleep(50 * time.Millisecond) // still in it: not a statement that was about to finish anyway
}

func TestMigrate(t *testing.T) {
	t.Parallel()

	t.Run("IdempotentAndConcurrent", func(t *testing.T) {
		t.Parallel()
		db, _ := openDB(t)
		ctx := context.Background()
		store, err := idemmysql.NewWithConfig(db, idemmysql.Config{Prefix: "m_"})
		require.NoError(t, err)
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Go(func() { errs <- store.Migrate(ctx) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.NoError(t, store.Migrate(ctx), "a second run is a no-op")

		rows, err := db.QueryContext(ctx, `SELECT version, name FROM m_migrations ORDER BY version`)
		require.NoError(t, err)
		var got []string
		for rows.Next() {
			var (
				v int
				n string
			)
			require.NoError(t, rows.Scan(&v, &n))
			got = append(got, fmt.Sprintf("%d %s", v, n))
		}
		require.NoError(t, rows.Err())
		require.Equal(t, []string{"1 claims", "2 dead_letters", "3 queue", "4 outbox", "5 queue_first_fetched", "60 queue_subscriptions", "70 http_keys", "90 dead_letter_owner", "91 replay_topic"}, got)
		for _, name := range []string{"claims", "dead_letters", "audit", "queue", "outbox", "leases", "http_keys"} {
			var n int
			require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM m_`+name).Scan(&n), name)
		}

		// A migration interrupted after its DDL (MySQL cannot roll DDL back) is finished by the
		// next run: its statements are idempotent.
		// Versions 5, 90 and 91 add columns, which MySQL cannot do IF NOT EXISTS: they check first.
		_, err = db.ExecContext(ctx, `DELETE FROM m_migrations WHERE version IN (4, 5, 70, 90, 91)`)
		require.NoError(t, err)
		require.NoError(t, store.Migrate(ctx))
		var n int
		require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM m_migrations`).Scan(&n))
		require.Equal(t, 9, n)
	})

	t.Run("MigrationSQL", func(t *testing.T) {
		t.Parallel()
		db, _ := openDB(t)
		ctx := context.Background()
		store, err := idemmysql.NewWithConfig(db, idemmysql.Config{Prefix: "plain_"})
		require.NoError(t, err)
		script := store.MigrationSQL()
		for _, name := range []string{"claims", "dead_letters", "audit", "queue", "outbox", "leases", "migrations"} {
			require.Contains(t, script, "CREATE TABLE IF NOT EXISTS plain_"+name+" (")
		}
		require.NotContains(t, script, "{{", "every placeholder substituted")

		// The plain SQL is what a team's own migration tool runs (here statement by statement,
		// as the mysql client does, in one session): it must work twice, and leave Migrate
		// nothing to do.
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		for range 2 {
			for _, stmt := range strings.Split(script, ";\n") {
				if strings.TrimSpace(stripComments(stmt)) == "" {
					continue
				}
				_, err := conn.ExecContext(ctx, stmt)
				require.NoError(t, err, "%s", stmt)
			}
		}
		require.NoError(t, conn.Close())
		require.NoError(t, store.Migrate(ctx))
		var n int
		require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM plain_migrations`).Scan(&n))
		require.Equal(t, 9, n)
		res, err := claimIn(t, &testBundle{ctx: ctx, db: db, store: store}, idem.Key{EventID: "e"}, fp(1), now())
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimNew, res.Status)
	})

	t.Run("NoDatabase", func(t *testing.T) {
		t.Parallel()
		cfg, err := mysql.ParseDSN(testenv.URL(t, testenv.MySQLVar))
		require.NoError(t, err)
		cfg.DBName = ""
		nodb, err := sql.Open("mysql", cfg.FormatDSN())
		require.NoError(t, err)
		defer nodb.Close()
		err = idemmysql.New(nodb).Migrate(context.Background())
		require.ErrorContains(t, err, "no current database")
	})
}

// stripComments drops "--" comment lines.
func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func TestConfig(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/none") // never connected
	require.NoError(t, err)
	defer db.Close()
	tests := []struct {
		name string
		cfg  idemmysql.Config
		want string // error substring; "" means valid
	}{
		{"defaults", idemmysql.Config{}, ""},
		{"prefix", idemmysql.Config{Prefix: "app_idem_"}, ""},
		{"prefix with dash", idemmysql.Config{Prefix: "idem-"}, "Config.Prefix"},
		{"prefix with quote", idemmysql.Config{Prefix: "x`; DROP TABLE t; --"}, "Config.Prefix"},
		{"prefix too long", idemmysql.Config{Prefix: strings.Repeat("p", 25)}, "Config.Prefix"},
		{"prefix starts with digit", idemmysql.Config{Prefix: "1x"}, "Config.Prefix"},
		{"negative partitions", idemmysql.Config{OutboxPartitions: -1}, "Config.OutboxPartitions"},
		{"negative poll", idemmysql.Config{PollInterval: -time.Second}, "Config.PollInterval"},
		{"read committed", idemmysql.Config{Isolation: sql.LevelReadCommitted}, ""},
		{"serializable", idemmysql.Config{Isolation: sql.LevelSerializable}, ""},
		{"read uncommitted", idemmysql.Config{Isolation: sql.LevelReadUncommitted}, "Config.Isolation"},
		{"snapshot", idemmysql.Config{Isolation: sql.LevelSnapshot}, "Config.Isolation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := idemmysql.NewWithConfig(db, tt.cfg)
			if tt.want == "" {
				require.NoError(t, err)
				require.NotEmpty(t, s.Config().Prefix)
				require.Positive(t, s.Config().OutboxPartitions)
				require.Positive(t, s.Config().PollInterval)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}
	_, err = idemmysql.NewWithConfig(nil, idemmysql.Config{})
	require.ErrorContains(t, err, "db is nil")
	require.Equal(t, "mysql", idemmysql.New(db).Dialect())
}

func TestInTx(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmysql.Config{})
	_, err := b.db.ExecContext(b.ctx, `CREATE TABLE t (x INT) ENGINE=InnoDB`)
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
	require.Equal(t, 1, count(), "a panic rolls back")

	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	require.ErrorIs(t, b.store.InTx(ctx, insert), context.Canceled)

	// The level shows in behaviour: a row another transaction changes and commits meanwhile is
	// seen changed at READ COMMITTED and unchanged at REPEATABLE READ. (InnoDB's own view,
	// information_schema.INNODB_TRX, is a cache that may still show a connection's previous
	// transaction.)
	t.Run("isolation", func(t *testing.T) {
		for _, tc := range []struct {
			level      sql.IsolationLevel
			seesChange bool
		}{
			{sql.LevelReadCommitted, true},
			{sql.LevelRepeatableRead, false},
			{sql.LevelDefault, false}, // the server's default: REPEATABLE READ on a stock server
		} {
			s, err := idemmysql.NewWithConfig(b.db, idemmysql.Config{Isolation: tc.level})
			require.NoError(t, err)
			_, err = b.db.ExecContext(b.ctx, `UPDATE t SET x = 1`)
			require.NoError(t, err)
			var before, after int
			require.NoError(t, s.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
				if err := tx.QueryRowContext(ctx, `SELECT max(x) FROM t`).Scan(&before); err != nil {
					return err
				}
				if _, err := b.db.ExecContext(ctx, `UPDATE t SET x = 2`); err != nil {
					return err
				}
				return tx.QueryRowContext(ctx, `SELECT max(x) FROM t`).Scan(&after)
			}))
			require.Equal(t, 1, before)
			require.Equal(t, tc.seesChange, after == 2, "%s: read %d after a committed change to 2", tc.level, after)
		}
	})
}

func TestDeleteExpiredClaims(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmysql.Config{})
	cutoff := now()
	// Per consumer: 5 old claims and 2 recent ones.
	for _, consumer := range []string{"a@v1", "b@v1"} {
		for i := range 7 {
			at := cutoff.Add(-time.Duration(i+1) * time.Hour)
			if i >= 5 {
				at = cutoff.Add(time.Duration(i) * time.Minute)
			}
			_, err := claimIn(t, b, idem.Key{Consumer: consumer, EventID: fmt.Sprint("e", i)}, fp(1), at)
			require.NoError(t, err)
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
