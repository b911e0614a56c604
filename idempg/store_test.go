package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemstore"
)

func TestConfig(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 42)
	for _, tc := range []struct {
		name    string
		cfg     idempg.Config
		wantErr string // substring naming the field and value; "" means valid
		want    idempg.Config
	}{
		{name: "defaults", cfg: idempg.Config{},
			want: idempg.Config{Schema: "public", Prefix: "idem_", OutboxPartitions: idemstore.OutboxPartitionsDefault}},
		{name: "custom", cfg: idempg.Config{Schema: "Billing_2", Prefix: "x", OutboxPartitions: 4},
			want: idempg.Config{Schema: "Billing_2", Prefix: "x", OutboxPartitions: 4}},
		{name: "longest identifier", cfg: idempg.Config{Schema: long[:41], Prefix: long[:41]},
			want: idempg.Config{Schema: long[:41], Prefix: long[:41], OutboxPartitions: idemstore.OutboxPartitionsDefault}},
		{name: "schema with quote", cfg: idempg.Config{Schema: `a"b`}, wantErr: `Config.Schema "a\"b"`},
		{name: "schema with dot", cfg: idempg.Config{Schema: "a.b"}, wantErr: `Config.Schema "a.b"`},
		{name: "schema starting with digit", cfg: idempg.Config{Schema: "1a"}, wantErr: `Config.Schema "1a"`},
		{name: "schema too long", cfg: idempg.Config{Schema: long}, wantErr: `Config.Schema "` + long + `"`},
		{name: "prefix with space", cfg: idempg.Config{Prefix: "idem "}, wantErr: `Config.Prefix "idem "`},
		{name: "prefix with semicolon", cfg: idempg.Config{Prefix: "x;drop"}, wantErr: `Config.Prefix "x;drop"`},
		{name: "negative partitions", cfg: idempg.Config{OutboxPartitions: -1}, wantErr: "Config.OutboxPartitions is -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := idempg.NewWithConfig(nil, tc.cfg)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				require.Nil(t, s)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, s.Config())
			require.Equal(t, tc.want, tc.cfg.WithDefaults())
			require.NoError(t, s.Close())
		})
	}
	require.Equal(t, "postgres", idempg.New(nil).Dialect())
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testPool(t)

	t.Run("IdempotentAndConcurrent", func(t *testing.T) {
		t.Parallel()
		// Not newStore: the schema must not exist before the concurrent migrators start.
		schema := randomSchema(t)
		store, err := idempg.NewWithConfig(pool, idempg.Config{Schema: schema, Prefix: "m_"})
		require.NoError(t, err)
		t.Cleanup(func() {
			_, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
			require.NoError(t, err)
		})
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

		rows, err := pool.Query(ctx, `SELECT version, name FROM `+table(store, "migrations")+` ORDER BY version`)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			var (
				v int
				n string
			)
			err := r.Scan(&v, &n)
			return fmt.Sprintf("%d %s", v, n), err
		})
		require.NoError(t, err)
		require.Equal(t, []string{"1 001_claims.up.sql", "2 002_dead_letters.up.sql", "3 003_queue.up.sql", "4 004_outbox.up.sql", "50 050_outbox_held_rows.up.sql", "51 051_queue_fetch_order.up.sql", "52 052_queue_first_fetched.up.sql", "60 060_queue_subscriptions.up.sql", "70 070_http_keys.up.sql", "80 080_queue_fillfactor.up.sql", "81 081_outbox_pending_order.up.sql", "90 090_dead_letter_owner.up.sql", "91 091_replay_topic.up.sql"}, got)

		for _, name := range []string{"claims", "dead_letters", "audit", "queue", "outbox", "leases", "http_keys"} {
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+table(store, name)).Scan(&n), name)
		}
	})

	t.Run("MigrationSQL", func(t *testing.T) {
		t.Parallel()
		schema := randomSchema(t)
		store, err := idempg.NewWithConfig(pool, idempg.Config{Schema: schema, Prefix: "plain_"})
		require.NoError(t, err)
		sql := store.MigrationSQL()
		for _, want := range []string{
			`CREATE SCHEMA IF NOT EXISTS "` + schema + `"`,
			"-- Migration 001: 001_claims.up.sql", "-- Migration 002: 002_dead_letters.up.sql",
			"-- Migration 003: 003_queue.up.sql", "-- Migration 004: 004_outbox.up.sql",
			"-- Migration 050: 050_outbox_held_rows.up.sql", "-- Migration 051: 051_queue_fetch_order.up.sql",
			"-- Migration 052: 052_queue_first_fetched.up.sql", "-- Migration 060: 060_queue_subscriptions.up.sql",
			"-- Migration 070: 070_http_keys.up.sql", "-- Migration 080: 080_queue_fillfactor.up.sql", "-- Migration 081: 081_outbox_pending_order.up.sql",
			"-- Migration 090: 090_dead_letter_owner.up.sql", "-- Migration 091: 091_replay_topic.up.sql",
		} {
			require.Contains(t, sql, want)
		}
		for _, name := range []string{"claims", "dead_letters", "audit", "queue", "outbox", "leases", "http_keys"} {
			require.Contains(t, sql, "CREATE TABLE IF NOT EXISTS "+table(store, name))
		}
		require.NotContains(t, sql, "{{", "every placeholder substituted")

		// The plain SQL is what a team's own migration tool runs: it must work, twice.
		t.Cleanup(func() {
			_, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
			require.NoError(t, err)
		})
		for range 2 {
			_, err = pool.Exec(ctx, sql)
			require.NoError(t, err)
		}
		require.NoError(t, store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: idem.Key{EventID: "e"}})
			return err
		}))
	})
}

func TestInTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, idempg.Config{})
	key := func(id string) idem.Key { return idem.Key{Tenant: "t", Consumer: "c@v1", EventID: id} }
	claim := func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: key(id)})
		return err
	}

	boom := errors.New("boom")
	for _, tc := range []struct {
		name      string
		fn        func(ctx context.Context, tx pgx.Tx) error
		wantErr   error
		wantPanic bool
		committed bool
	}{
		{name: "commit", fn: func(ctx context.Context, tx pgx.Tx) error { return claim(ctx, tx, "commit") }, committed: true},
		{name: "error", fn: func(ctx context.Context, tx pgx.Tx) error {
			if err := claim(ctx, tx, "error"); err != nil {
				return err
			}
			return boom
		}, wantErr: boom},
		{name: "panic", fn: func(ctx context.Context, tx pgx.Tx) error {
			if err := claim(ctx, tx, "panic"); err != nil {
				return err
			}
			panic("handler bug")
		}, wantPanic: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			run := func() error { return store.InTx(ctx, tc.fn) }
			if tc.wantPanic {
				require.PanicsWithValue(t, "handler bug", func() { _ = run() })
			} else {
				err := run()
				if tc.wantErr != nil {
					require.ErrorIs(t, err, tc.wantErr)
					require.Equal(t, tc.wantErr, err, "fn's error comes back as is")
				} else {
					require.NoError(t, err)
				}
			}
			var n int
			require.NoError(t, store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+table(store, "claims")+
				` WHERE event_id = $1`, tc.name).Scan(&n))
			require.Equal(t, tc.committed, n == 1)
		})
	}
}

func TestClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, idempg.Config{})
	fpA, fpB := idem.Fingerprint{1, 2, 3}, idem.Fingerprint{9, 9, 9}
	first := time.Date(2026, 2, 1, 10, 0, 0, 123456000, time.UTC)
	key := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-1"}

	claim := func(p idemstore.ClaimParams) idemstore.ClaimResult {
		t.Helper()
		var res idemstore.ClaimResult
		require.NoError(t, store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			var err error
			res, err = store.ClaimTx(ctx, tx, p)
			return err
		}))
		return res
	}

	// Steps run in order against one key: each sees what the previous committed.
	for _, tc := range []struct {
		name string
		p    idemstore.ClaimParams
		want idemstore.ClaimResult
	}{
		{"new", idemstore.ClaimParams{Key: key, Fingerprint: fpA, Now: first},
			idemstore.ClaimResult{Status: idemstore.ClaimNew}},
		{"duplicate", idemstore.ClaimParams{Key: key, Fingerprint: fpA, Now: first.Add(time.Hour)},
			idemstore.ClaimResult{Status: idemstore.ClaimDuplicate, Existing: fpA, ClaimedAt: first}},
		{"conflict", idemstore.ClaimParams{Key: key, Fingerprint: fpB, Now: first.Add(time.Hour)},
			idemstore.ClaimResult{Status: idemstore.ClaimConflict, Existing: fpA, ClaimedAt: first}},
		{"other consumer", idemstore.ClaimParams{Key: idem.Key{Tenant: "acme", Consumer: "ledger@v2", EventID: "evt-1"}, Fingerprint: fpB, Now: first},
			idemstore.ClaimResult{Status: idemstore.ClaimNew}},
		{"other tenant", idemstore.ClaimParams{Key: idem.Key{Tenant: "globex", Consumer: "ledger@v1", EventID: "evt-1"}, Fingerprint: fpB, Now: first},
			idemstore.ClaimResult{Status: idemstore.ClaimNew}},
		{"zero fingerprint", idemstore.ClaimParams{Key: idem.Key{EventID: "evt-zero"}},
			idemstore.ClaimResult{Status: idemstore.ClaimNew}},
	} {
		got := claim(tc.p)
		require.Equal(t, tc.want.Status, got.Status, tc.name)
		require.Equal(t, tc.want.Existing, got.Existing, tc.name)
		require.True(t, tc.want.ClaimedAt.Equal(got.ClaimedAt), "%s: claimed at %v, want %v", tc.name, got.ClaimedAt, tc.want.ClaimedAt)
	}

	t.Run("SameTransactionTwice", func(t *testing.T) {
		t.Parallel()
		k := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-twice"}
		require.NoError(t, store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			res, err := store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: k, Fingerprint: fpA})
			require.NoError(t, err)
			require.Equal(t, idemstore.ClaimNew, res.Status)
			res, err = store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: k, Fingerprint: fpA})
			require.NoError(t, err)
			require.Equal(t, idemstore.ClaimDuplicate, res.Status)
			return nil
		}))
	})

	t.Run("EmptyEventID", func(t *testing.T) {
		t.Parallel()
		err := store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: idem.Key{Tenant: "acme", Consumer: "c"}})
			return err
		})
		require.ErrorContains(t, err, "event id is empty")
	})
}

// TestClaimWaitsForConcurrentClaimer holds a claim open in one transaction while another
// claims the same key: the second waits on the primary key, and what it then reports depends
// on how the first ends. The commit cases take ClaimTx's second statement, since the winner
// committed after the waiting statement's snapshot.
func TestClaimWaitsForConcurrentClaimer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fpA, fpB := idem.Fingerprint{0xa}, idem.Fingerprint{0xb}
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
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := newStore(t, idempg.Config{}) // its own, so the lock wait seen is this one's
			key := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-1"}
			firstClaimed := make(chan struct{})
			release := make(chan struct{})
			firstDone := make(chan error, 1)
			go func() {
				firstDone <- store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
					res, err := store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: key, Fingerprint: fpA})
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
				secondErr <- store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
					res, err := store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: key, Fingerprint: tc.secondFP})
					secondDone <- res
					return err
				})
			}()
			waitForLockWait(t, store)
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

// waitForLockWait waits until a backend waits on a lock in a statement on the store's claims
// table (each test has its own schema, so it is this test's claimer).
func waitForLockWait(t *testing.T, store *idempg.Store) {
	t.Helper()
	ctx := context.Background()
	claims := table(store, "claims")
	require.Eventually(t, func() bool {
		var n int
		err := store.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, claims).Scan(&n)
		require.NoError(t, err)
		return n > 0
	}, 10*time.Second, 10*time.Millisecond, "the second claimer never waited for the first")
}

func TestDeleteExpiredClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, idempg.Config{})
	now := time.Date(2026, 1, 10, 0, 0, 0, 0, time.UTC)
	// ledger@v1 has 5 claims 10 days old and 2 one day old; notifier@v1 has 3 ten days old.
	for _, c := range []struct {
		consumer string
		n        int
		age      time.Duration
	}{{"ledger@v1", 5, 240 * time.Hour}, {"ledger@v1", 2, 24 * time.Hour}, {"notifier@v1", 3, 240 * time.Hour}} {
		for i := range c.n {
			require.NoError(t, store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				_, err := store.ClaimTx(ctx, tx, idemstore.ClaimParams{
					Key: idem.Key{Tenant: "acme", Consumer: c.consumer, EventID: fmt.Sprintf("evt-%s-%d", c.age, i)},
					Now: now.Add(-c.age),
				})
				return err
			}))
		}
	}
	before := now.Add(-48 * time.Hour)
	for _, step := range []struct {
		consumer string
		limit    int
		want     int
	}{
		{"ledger@v1", 2, 2},
		{"ledger@v1", 2, 2},
		{"ledger@v1", 2, 1}, // the last expired one; the recent two stay
		{"ledger@v1", 2, 0},
		{"", 10, 3}, // every consumer
		{"", 10, 0},
	} {
		n, err := store.DeleteExpiredClaims(ctx, idemstore.DeleteExpiredClaimsParams{Consumer: step.consumer, Before: before, Limit: step.limit})
		require.NoError(t, err)
		require.Equal(t, step.want, n, "consumer %q limit %d", step.consumer, step.limit)
	}
	var left int
	require.NoError(t, store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+table(store, "claims")).Scan(&left))
	require.Equal(t, 2, left)

	total, err := idem.CollectGarbage(ctx, store, "", now, 1)
	require.NoError(t, err)
	require.Equal(t, 2, total)

	_, err = store.DeleteExpiredClaims(ctx, idemstore.DeleteExpiredClaimsParams{Before: now})
	require.ErrorContains(t, err, "Limit is 0")
}

func TestClassifyError(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Nothing listens on port 1: a real pgconn.ConnectError.
	_, connectErr := pgx.Connect(ctx, "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	require.Error(t, connectErr)
	var ce *pgconn.ConnectError
	require.ErrorAs(t, connectErr, &ce)

	store := idempg.New(nil)
	for _, tc := range []struct {
		name string
		err  error
		want idem.Class
	}{
		{"connect error", connectErr, idem.ClassTransient},
		{"wrapped connect error", fmt.Errorf("claim event e: %w", connectErr), idem.ClassTransient},
		{"closed connection", fmt.Errorf("ack: %w", pgconn.ErrConnClosed), idem.ClassTransient},
		{"constraint violation", &pgconn.PgError{Code: "23505"}, idem.ClassUnknown},
		{"plain error", errors.New("boom"), idem.ClassUnknown},
		{"nil", nil, idem.ClassUnknown},
	} {
		require.Equal(t, tc.want, store.ClassifyError(tc.err), tc.name)
	}
}
