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
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/storetest"
)

const day = 24 * time.Hour

// partitionedFactory builds the conformance bundle over a store partitioned by p.
func partitionedFactory(p idempg.PartitionConfig) storetest.Factory[pgx.Tx] {
	return func(tb testing.TB) storetest.Bundle[pgx.Tx] {
		tb.Helper()
		return bundle(tb, newStore(tb, idempg.Config{Partition: p}))
	}
}

// TestConformancePartitioned runs the partitioned inbox's suite with both bucket widths.
func TestConformancePartitioned(t *testing.T) {
	t.Parallel()
	t.Run("Day", func(t *testing.T) {
		t.Parallel()
		storetest.ExercisePartitioned(t, partitionedFactory(idempg.PartitionConfig{Bucket: day, Retention: 7 * day}))
	})
	t.Run("Hour", func(t *testing.T) {
		t.Parallel()
		storetest.ExercisePartitioned(t, partitionedFactory(idempg.PartitionConfig{Bucket: time.Hour, Retention: 50 * time.Hour, Ahead: 2 * time.Hour}))
	})
}

// attached lists the names of the partitions attached to the store's claims table, in order.
func attached(t *testing.T, store *idempg.Store) []string {
	t.Helper()
	rows, err := store.Pool().Query(context.Background(), `SELECT c.relname FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1) ORDER BY 1`, table(store, "claims"))
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// partitionNames lists the names of the partitions from first to last bucket start.
func partitionNames(prefix string, bucket time.Duration, first, last time.Time) []string {
	layout := "20060102"
	if bucket == time.Hour {
		layout = "2006010215"
	}
	var names []string
	for b := first; !b.After(last); b = b.Add(bucket) {
		names = append(names, prefix+"claims_p"+b.Format(layout))
	}
	return names
}

// tableExists reports whether a table of the store's schema exists.
func tableExists(t *testing.T, store *idempg.Store, name string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, store.Pool().QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`,
		`"`+store.Config().Schema+`"."`+name+`"`).Scan(&ok))
	return ok
}

// claimIn claims key at the claim time at (zero: the store's now) in a transaction of its own;
// a partitioned store places the claim in at's bucket.
func claimIn(t *testing.T, store *idempg.Store, key idem.Key, fp idem.Fingerprint, at time.Time) (idemstore.ClaimResult, error) {
	t.Helper()
	var res idemstore.ClaimResult
	err := store.InTx(context.Background(), func(ctx context.Context, tx pgx.Tx) error {
		var err error
		res, err = store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: key, Fingerprint: fp, Now: at})
		return err
	})
	return res, err
}

func TestPartitionConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		p       idempg.PartitionConfig
		wantErr string
		want    idempg.PartitionConfig
	}{
		{name: "plain", p: idempg.PartitionConfig{}, want: idempg.PartitionConfig{}},
		{name: "day defaults", p: idempg.PartitionConfig{Bucket: day, Retention: 7 * day},
			want: idempg.PartitionConfig{Bucket: day, Retention: 7 * day, Ahead: idempg.PartitionAheadDayDefault, LockTimeout: idempg.PartitionLockTimeoutDefault}},
		{name: "hour defaults", p: idempg.PartitionConfig{Bucket: time.Hour, Retention: 3 * day},
			want: idempg.PartitionConfig{Bucket: time.Hour, Retention: 3 * day, Ahead: idempg.PartitionAheadHourDefault, LockTimeout: idempg.PartitionLockTimeoutDefault}},
		{name: "custom", p: idempg.PartitionConfig{Bucket: day, Retention: 30 * day, Ahead: 2 * day, LockTimeout: time.Second},
			want: idempg.PartitionConfig{Bucket: day, Retention: 30 * day, Ahead: 2 * day, LockTimeout: time.Second}},
		{name: "other bucket", p: idempg.PartitionConfig{Bucket: 30 * time.Minute, Retention: day},
			wantErr: "Config.Partition.Bucket is 30m0s, want 0 (the plain claims table), 1h or 24h"},
		{name: "week bucket", p: idempg.PartitionConfig{Bucket: 7 * day, Retention: 30 * day}, wantErr: "Config.Partition.Bucket is 168h0m0s"},
		{name: "no retention", p: idempg.PartitionConfig{Bucket: day}, wantErr: "Config.Partition.Retention is 0s"},
		{name: "ahead below bucket", p: idempg.PartitionConfig{Bucket: day, Retention: 7 * day, Ahead: time.Hour},
			wantErr: "Config.Partition.Ahead is 1h0m0s, want at least Partition.Bucket (24h0m0s)"},
		{name: "negative lock timeout", p: idempg.PartitionConfig{Bucket: day, Retention: 7 * day, LockTimeout: -time.Second},
			wantErr: "Config.Partition.LockTimeout is -1s"},
		{name: "settings without bucket", p: idempg.PartitionConfig{Retention: 7 * day},
			wantErr: "Config.Partition has Ahead 0s, Retention 168h0m0s, LockTimeout 0s but Bucket 0"},
		{name: "too many partitions", p: idempg.PartitionConfig{Bucket: time.Hour, Retention: 365 * day},
			wantErr: "Config.Partition.Retention (8760h0m0s) + Ahead (48h0m0s) in 1h0m0s buckets is 8810 partitions, want at most 5000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := idempg.NewWithConfig(nil, idempg.Config{Partition: tc.p})
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				require.Nil(t, s)
				return
			}
			require.NoError(t, err)
			defer s.Close()
			require.Equal(t, tc.want, s.Config().Partition)
			require.Equal(t, tc.want.Bucket, s.ClaimBucket())
			var _ idemstore.BucketedStore = s
		})
	}
}

func TestPartitionMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testPool(t)
	dropSchema := func(t *testing.T, schema string) {
		t.Cleanup(func() {
			_, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
			require.NoError(t, err)
		})
	}

	t.Run("CreatesPartitionsAroundNow", func(t *testing.T) {
		t.Parallel()
		for _, p := range []idempg.PartitionConfig{
			{Bucket: day, Retention: 3 * day, Ahead: 2 * day},
			{Bucket: time.Hour, Retention: 5 * time.Hour, Ahead: 3 * time.Hour},
		} {
			before := time.Now().UTC()
			store := newStore(t, idempg.Config{Prefix: "pm_", Partition: p})
			after := time.Now().UTC()
			if before.Truncate(p.Bucket) != after.Truncate(p.Bucket) {
				t.Skip("a bucket boundary passed during Migrate")
			}
			want := partitionNames("pm_", p.Bucket, before.Add(-p.Retention).Truncate(p.Bucket), before.Add(p.Ahead).Truncate(p.Bucket))
			require.Len(t, want, int((p.Retention+p.Ahead)/p.Bucket)+1)
			require.Equal(t, want, attached(t, store), "bucket %v", p.Bucket)

			n, err := store.EnsurePartitions(ctx, before)
			require.NoError(t, err)
			require.Zero(t, n, "idempotent")
			require.NoError(t, store.Migrate(ctx), "a second run is a no-op")

			rows, err := pool.Query(ctx, `SELECT name FROM `+table(store, "migrations")+` ORDER BY version`)
			require.NoError(t, err)
			names, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			require.Equal(t, []string{"001_claims.up.sql", "002_dead_letters.up.sql", "003_queue.up.sql", "004_outbox.up.sql", "050_outbox_held_rows.up.sql", "051_queue_fetch_order.up.sql", "052_queue_first_fetched.up.sql", "060_queue_subscriptions.up.sql", "070_http_keys.up.sql", "080_queue_fillfactor.up.sql", "081_outbox_pending_order.up.sql", "090_dead_letter_owner.up.sql", "091_replay_topic.up.sql"}, names,
				"the layout changes what a version creates, not which versions exist")
		}
	})

	t.Run("ConcurrentMigrators", func(t *testing.T) {
		t.Parallel()
		schema := randomSchema(t)
		dropSchema(t, schema)
		before := time.Now().UTC()
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		var store *idempg.Store
		for i := range 4 {
			s, err := idempg.NewWithConfig(pool, idempg.Config{Schema: schema, Partition: idempg.PartitionConfig{Bucket: time.Hour, Retention: 12 * time.Hour}})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, s.Close()) })
			if i == 0 {
				store = s
			}
			wg.Go(func() { errs <- s.Migrate(ctx) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		if time.Now().UTC().Truncate(time.Hour) != before.Truncate(time.Hour) {
			t.Skip("a bucket boundary passed during Migrate")
		}
		require.GreaterOrEqual(t, len(attached(t, store)), 12+48)
		// The window the migrators saw: an earlier instant may reach back into a bucket
		// that retention had already left behind when they ran (it did at 14:00 in CI).
		n, err := store.EnsurePartitions(ctx, before)
		require.NoError(t, err)
		require.Zero(t, n)
	})

	t.Run("MigrationSQL", func(t *testing.T) {
		t.Parallel()
		schema := randomSchema(t)
		store, err := idempg.NewWithConfig(pool, idempg.Config{Schema: schema, Prefix: "part_",
			Partition: idempg.PartitionConfig{Bucket: day, Retention: 2 * day, Ahead: day}})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, store.Close()) })
		sql := store.MigrationSQL()
		for _, want := range []string{
			"-- Migration 001: 001_claims.up.sql (partitioned by day)",
			"bucket      timestamptz NOT NULL",
			"PRIMARY KEY (tenant, consumer, event_id, bucket)",
			`CONSTRAINT "part_claims_bucket_day"`,
			"PARTITION BY RANGE (bucket);",
			"Store.EnsurePartitions",
			"-- Migration 004: 004_outbox.up.sql",
		} {
			require.Contains(t, sql, want)
		}
		require.NotContains(t, sql, "{{")
		require.NotContains(t, sql, "claims_created_at", "retention is by partition: no index on created_at")

		// A team's own migration tool runs the SQL (twice), the application the partitions.
		dropSchema(t, schema)
		for range 2 {
			_, err = pool.Exec(ctx, sql)
			require.NoError(t, err)
		}
		n, err := store.EnsurePartitions(ctx, time.Now())
		require.NoError(t, err)
		require.Equal(t, 4, n)
		res, err := claimIn(t, store, idem.Key{EventID: "e"}, idem.Fingerprint{1}, time.Now())
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimNew, res.Status)
	})

	t.Run("RefusesAnotherLayout", func(t *testing.T) {
		t.Parallel()
		plainSchema, dailySchema := randomSchema(t), randomSchema(t)
		dropSchema(t, plainSchema)
		dropSchema(t, dailySchema)
		open := func(schema string, p idempg.PartitionConfig) *idempg.Store {
			s, err := idempg.NewWithConfig(pool, idempg.Config{Schema: schema, Partition: p})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, s.Close()) })
			return s
		}
		daily := idempg.PartitionConfig{Bucket: day, Retention: 2 * day, Ahead: day}
		hourly := idempg.PartitionConfig{Bucket: time.Hour, Retention: 2 * time.Hour, Ahead: time.Hour}
		require.NoError(t, open(plainSchema, idempg.PartitionConfig{}).Migrate(ctx))
		require.NoError(t, open(dailySchema, daily).Migrate(ctx))

		claims := func(schema string) string { return `"` + schema + `"."idem_claims"` }
		for _, tc := range []struct {
			name    string
			schema  string
			p       idempg.PartitionConfig
			wantErr string
		}{
			{"partitioned config on a plain table", plainSchema, daily,
				"claims table " + claims(plainSchema) + " is a plain table, but Config.Partition.Bucket is 24h0m0s"},
			{"plain config on a partitioned table", dailySchema, idempg.PartitionConfig{},
				"claims table " + claims(dailySchema) + " is partitioned (by day (24h buckets)), but Config.Partition.Bucket is 0"},
			{"another bucket width", dailySchema, hourly,
				"claims table " + claims(dailySchema) + " is partitioned by day (24h buckets), but Config.Partition.Bucket is 1h0m0s"},
		} {
			s := open(tc.schema, tc.p)
			require.ErrorContains(t, s.Migrate(ctx), tc.wantErr, tc.name)
		}
		require.Len(t, attached(t, open(dailySchema, daily)), 4, "nothing was mixed in")

		// A plain store refuses to garbage-collect a partitioned table by ctid, and its claims
		// there fail with an explanation, transiently (a configuration to fix, not bad events).
		misconfigured := open(dailySchema, idempg.PartitionConfig{})
		_, err := misconfigured.DeleteExpiredClaims(ctx, idemstore.DeleteExpiredClaimsParams{Before: time.Now(), Limit: 10})
		require.ErrorContains(t, err, "is partitioned")
		_, err = claimIn(t, misconfigured, idem.Key{EventID: "e"}, idem.Fingerprint{1}, time.Time{})
		require.ErrorContains(t, err, "it was created partitioned, so configure Config.Partition")
		require.Equal(t, idem.ClassTransient, misconfigured.ClassifyError(err))
		err = misconfigured.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := misconfigured.ClaimBatchTx(ctx, tx, []idemstore.ClaimParams{{Key: idem.Key{EventID: "e"}}})
			return err
		})
		require.ErrorContains(t, err, "it was created partitioned, so configure Config.Partition")
		require.Equal(t, idem.ClassTransient, misconfigured.ClassifyError(err))

		plain := open(plainSchema, idempg.PartitionConfig{})
		_, err = plain.EnsurePartitions(ctx, time.Now())
		require.ErrorContains(t, err, "EnsurePartitions: the claims table is not partitioned")
		_, err = plain.DropExpiredPartitions(ctx, time.Now())
		require.ErrorContains(t, err, "DropExpiredPartitions: the claims table is not partitioned")
		require.Zero(t, plain.ClaimBucket())
	})
}

func TestPartitionClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := idempg.PartitionConfig{Bucket: day, Retention: 3 * day, Ahead: 2 * day}
	fpA, fpB := idem.Fingerprint{1, 2, 3}, idem.Fingerprint{9, 9, 9}
	today := time.Now().UTC().Truncate(day)

	t.Run("KeyIsTheKeyAlone", func(t *testing.T) {
		t.Parallel()
		store := newStore(t, idempg.Config{Partition: p})
		key := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-1"}
		yesterday := today.Add(-day)
		for _, tc := range []struct {
			name string
			fp   idem.Fingerprint
			at   time.Time // the claim's time
			want idemstore.ClaimStatus
		}{
			{"new, yesterday", fpA, yesterday.Add(5 * time.Hour), idemstore.ClaimNew},
			{"duplicate, later yesterday", fpA, yesterday.Add(17 * time.Hour), idemstore.ClaimDuplicate},
			{"conflict", fpB, yesterday, idemstore.ClaimConflict},
			{"duplicate, claimed today", fpA, today.Add(time.Hour), idemstore.ClaimDuplicate},
			{"conflict, claimed today", fpB, today.Add(time.Hour), idemstore.ClaimConflict},
			{"another key today", fpB, today.Add(time.Hour), idemstore.ClaimNew},
		} {
			k := key
			if tc.name == "another key today" {
				k.EventID = "evt-2"
			}
			res, err := claimIn(t, store, k, tc.fp, tc.at)
			require.NoError(t, err, tc.name)
			require.Equal(t, tc.want, res.Status, tc.name)
			if tc.want == idemstore.ClaimDuplicate || tc.want == idemstore.ClaimConflict {
				require.Equal(t, fpA, res.Existing, tc.name)
				require.True(t, res.ClaimedAt.Equal(yesterday.Add(5*time.Hour)), "%s: claimed at %v", tc.name, res.ClaimedAt)
			}
		}
		// The batched claim finds it too, wherever its own claim would go.
		err := store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			rs, err := store.ClaimBatchTx(ctx, tx, []idemstore.ClaimParams{
				{Key: key, Fingerprint: fpA, Now: today.Add(2 * time.Hour)},
				{Key: idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-3"}, Fingerprint: fpA, Now: today.Add(2 * time.Hour)},
				{Key: idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-2"}, Fingerprint: fpA, Now: yesterday},
			})
			require.NoError(t, err)
			require.Equal(t, []idemstore.ClaimStatus{idemstore.ClaimDuplicate, idemstore.ClaimNew, idemstore.ClaimConflict},
				[]idemstore.ClaimStatus{rs[0].Status, rs[1].Status, rs[2].Status})
			return nil
		})
		require.NoError(t, err)
		rows, err := store.Pool().Query(ctx, `SELECT event_id, bucket FROM `+table(store, "claims")+` ORDER BY event_id`)
		require.NoError(t, err)
		type row struct {
			EventID string
			Bucket  time.Time
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
		require.NoError(t, err)
		require.Len(t, got, 3, "one claim per key")
		for i, want := range []row{{"evt-1", yesterday}, {"evt-2", today}, {"evt-3", today}} {
			require.Equal(t, want.EventID, got[i].EventID)
			require.True(t, want.Bucket.Equal(got[i].Bucket), "%s: in the bucket of its claim time, stored as its start: %v", want.EventID, got[i].Bucket)
		}
	})

	t.Run("BucketOfTheEventIsIgnored", func(t *testing.T) {
		t.Parallel()
		store := newStore(t, idempg.Config{Partition: p})
		far := today.Add(30 * day)
		for _, b := range []time.Time{{}, far, today.Add(-30 * day)} {
			err := store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				res, err := store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: idem.Key{EventID: "evt-" + b.Format("20060102")}, Fingerprint: fpA, Bucket: b})
				require.NoError(t, err, "bucket %v", b)
				require.Equal(t, idemstore.ClaimNew, res.Status)
				_, err = store.ClaimBatchTx(ctx, tx, []idemstore.ClaimParams{{Key: idem.Key{EventID: "batch-" + b.Format("20060102")}, Fingerprint: fpA, Bucket: b}})
				return err
			})
			require.NoError(t, err, "bucket %v", b)
		}
	})

	t.Run("ClaimTimeWithoutPartitionIsTransient", func(t *testing.T) {
		t.Parallel()
		store := newStore(t, idempg.Config{Partition: p})
		far := today.Add(30 * day)
		_, err := claimIn(t, store, idem.Key{EventID: "evt-future"}, fpA, far.Add(time.Hour))
		require.ErrorIs(t, err, idempg.ErrPartitionMissing)
		require.ErrorContains(t, err, "bucket "+far.Format(time.RFC3339)+" (partition idem_claims_p"+far.Format("20060102")+")")
		require.ErrorContains(t, err, "further ahead than Partition.Ahead (48h0m0s)")
		require.Equal(t, idem.ClassTransient, store.ClassifyError(err))
		require.Equal(t, idem.ClassTransient, store.ClassifyError(fmt.Errorf("idem: claim: %w", err)))

		err = store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := store.ClaimBatchTx(ctx, tx, []idemstore.ClaimParams{
				{Key: idem.Key{EventID: "ok"}, Now: today},
				{Key: idem.Key{EventID: "evt-future"}, Now: far},
			})
			return err
		})
		require.ErrorIs(t, err, idempg.ErrPartitionMissing)
		require.ErrorContains(t, err, "claim batch of 2")
		require.Equal(t, idem.ClassTransient, store.ClassifyError(err))

		// A consumer whose clock is far ahead is retried; nothing is applied, and no partition
		// is made for it.
		c, err := idem.NewConsumer(store, idem.ConsumerConfig[pgx.Tx]{Name: "ledger@v1",
			Now: func() time.Time { return far.Add(time.Hour) },
			Claims: idem.ClaimConfig{
				Retention:        store.ClaimRetention(),
				RedeliveryWindow: time.Hour,
			},
			Handler: func(context.Context, pgx.Tx, idem.Message) error { return errors.New("must not run") }})
		require.NoError(t, err)
		r := c.Process(ctx, idem.Message{EventID: "evt-future", Payload: []byte(`{}`), OccurredAt: far})
		err = r.Err
		require.ErrorIs(t, err, idempg.ErrPartitionMissing)
		require.Equal(t, idem.ClassTransient, r.Class)
		time.Sleep(100 * time.Millisecond) // let a background creation (of the current window) run
		require.False(t, tableExists(t, store, "idem_claims_p"+far.Format("20060102")))

		// An event stamped far ahead is claimed now, in the current partition.
		c, err = idem.NewConsumer(store, idem.ConsumerConfig[pgx.Tx]{Name: "ledger@v1",
			Claims: idem.ClaimConfig{
				Retention:        store.ClaimRetention(),
				RedeliveryWindow: time.Hour,
			},
			Handler: func(context.Context, pgx.Tx, idem.Message) error { return nil }})
		require.NoError(t, err)
		r = c.Process(ctx, idem.Message{EventID: "evt-future", Payload: []byte(`{}`), OccurredAt: far})
		err = r.Err
		require.NoError(t, err)
		require.Equal(t, idem.OutcomeProcessed, r.Outcome)
	})

	t.Run("IsolationAboveReadCommittedIsRefused", func(t *testing.T) {
		t.Parallel()
		store := newStore(t, idempg.Config{Partition: p})
		for _, level := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
			tx, err := store.Pool().BeginTx(ctx, pgx.TxOptions{IsoLevel: level})
			require.NoError(t, err)
			_, err = store.ClaimTx(ctx, tx, idemstore.ClaimParams{Key: idem.Key{EventID: "evt-iso"}, Fingerprint: fpA})
			require.ErrorContains(t, err, "the partitioned inbox needs READ COMMITTED transactions, and this one is "+strings.ToUpper(string(level)))
			require.Equal(t, idem.ClassTransient, store.ClassifyError(err))
			require.NoError(t, tx.Rollback(ctx))
			tx, err = store.Pool().BeginTx(ctx, pgx.TxOptions{IsoLevel: level})
			require.NoError(t, err)
			_, err = store.ClaimBatchTx(ctx, tx, []idemstore.ClaimParams{{Key: idem.Key{EventID: "evt-iso"}, Fingerprint: fpA}})
			require.ErrorContains(t, err, "the partitioned inbox needs READ COMMITTED transactions")
			require.NoError(t, tx.Rollback(ctx))
		}

		// A pool whose connections default to a higher level is refused up front.
		cfg := store.Pool().Config()
		cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
		_, err := idempg.NewWithConfig(mustPool(t, cfg), idempg.Config{Schema: store.Config().Schema, Partition: p})
		require.ErrorContains(t, err, `default_transaction_isolation to "serializable"`)
		require.ErrorContains(t, err, "needs READ COMMITTED")

		// A default set where the config cannot show it (a startup option, a role's or the
		// database's setting) is refused by Migrate.
		cfg = store.Pool().Config()
		cfg.ConnConfig.RuntimeParams["options"] = "-c default_transaction_isolation=repeatable\\ read"
		hidden, err := idempg.NewWithConfig(mustPool(t, cfg), idempg.Config{Schema: store.Config().Schema, Partition: p})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, hidden.Close()) })
		err = hidden.Migrate(ctx)
		require.ErrorContains(t, err, `the database's default_transaction_isolation is "repeatable read"`)
		require.ErrorContains(t, err, "needs READ COMMITTED")
	})

	t.Run("MissingPartitionIsCreatedOnDemand", func(t *testing.T) {
		t.Parallel()
		store := newStore(t, idempg.Config{Partition: p})
		tomorrow := today.Add(day)
		name := "idem_claims_p" + tomorrow.Format("20060102")
		_, err := store.Pool().Exec(ctx, `ALTER TABLE `+table(store, "claims")+` DETACH PARTITION `+table(store, name[len("idem_"):]))
		require.NoError(t, err)
		_, err = store.Pool().Exec(ctx, `DROP TABLE `+table(store, name[len("idem_"):]))
		require.NoError(t, err)

		_, err = claimIn(t, store, idem.Key{EventID: "evt-tomorrow"}, fpA, tomorrow.Add(time.Hour))
		require.ErrorIs(t, err, idempg.ErrPartitionMissing)
		require.ErrorContains(t, err, "the partitions were not created in time")
		require.Equal(t, idem.ClassTransient, store.ClassifyError(err))
		for deadline := time.Now().Add(10 * time.Second); !tableExists(t, store, name); time.Sleep(10 * time.Millisecond) {
			require.False(t, time.Now().After(deadline), "the partition was not created in the background")
		}
		// The consumer retries a transient error with backoff; so does this test, within the
		// same deadline (once, under the race detector, the first retry right after the table
		// appeared still met the missing partition).
		var res idemstore.ClaimResult
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			res, err = claimIn(t, store, idem.Key{EventID: "evt-tomorrow"}, fpA, tomorrow.Add(time.Hour))
			if err == nil || !errors.Is(err, idempg.ErrPartitionMissing) || time.Now().After(deadline) {
				break
			}
		}
		require.NoError(t, err, "a retry finds the partition")
		require.Equal(t, idemstore.ClaimNew, res.Status)
	})
}

func TestPartitionBatchRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, idempg.Config{Partition: idempg.PartitionConfig{Bucket: time.Hour, Retention: 6 * time.Hour, Ahead: 2 * time.Hour}})
	now := time.Now().UTC()
	earlier := now.Add(-2 * time.Hour)
	key := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-1"}
	fp := idem.Fingerprint{7}

	// A committed claim of the key, made two buckets ago.
	res, err := claimIn(t, store, key, fp, earlier)
	require.NoError(t, err)
	require.Equal(t, idemstore.ClaimNew, res.Status)

	count := func() (n int) {
		require.NoError(t, store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+table(store, "claims")+` WHERE event_id = $1`, key.EventID).Scan(&n))
		return n
	}
	other := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-2"}
	require.NoError(t, store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		rs, err := store.ClaimBatchTx(ctx, tx, []idemstore.ClaimParams{
			{Key: key, Fingerprint: fp, Now: now},
			{Key: other, Fingerprint: fp, Now: now},
		})
		require.NoError(t, err)
		require.Equal(t, idemstore.ClaimDuplicate, rs[0].Status, "the earlier bucket's claim is the key's")
		require.Equal(t, idemstore.ClaimNew, rs[1].Status)
		// The handler of evt-2 failed: its claim goes. evt-1's committed claim is not this
		// transaction's to release.
		require.NoError(t, store.ReleaseClaimTx(ctx, tx, other))
		require.ErrorContains(t, store.ReleaseClaimTx(ctx, tx, other), "this transaction made no such claim")
		require.ErrorContains(t, store.ReleaseClaimTx(ctx, tx, key), "this transaction made no such claim")
		return nil
	}))
	require.Equal(t, 1, count(), "the committed claim stays")
	var bucket time.Time
	require.NoError(t, store.Pool().QueryRow(ctx, `SELECT bucket FROM `+table(store, "claims")+` WHERE event_id = $1`, key.EventID).Scan(&bucket))
	require.True(t, bucket.Equal(earlier.Truncate(time.Hour)))
}

func TestDropExpiredPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := idempg.PartitionConfig{Bucket: day, Retention: 3 * day, Ahead: 2 * day}

	// fill claims n events of the bucket starting at start.
	fill := func(t *testing.T, store *idempg.Store, start time.Time, n int) {
		t.Helper()
		_, err := store.Pool().Exec(ctx, `INSERT INTO `+table(store, "claims")+`
			SELECT 'acme', 'ledger@v1', 'evt-' || g, $1, '\x`+strings.Repeat("00", 32)+`'::bytea, now()
			FROM generate_series(1, $2) g`, start, n)
		require.NoError(t, err)
	}

	t.Run("DropsWholeExpiredPartitions", func(t *testing.T) {
		t.Parallel()
		store := newStore(t, idempg.Config{Partition: p})
		now := time.Now().UTC()
		today := now.Truncate(day)
		require.Equal(t, partitionNames("idem_", day, today.Add(-3*day), today.Add(2*day)), attached(t, store))
		fill(t, store, today.Add(-3*day), 100)
		fill(t, store, today.Add(-2*day), 100)

		dropped, err := store.DropExpiredPartitions(ctx, now)
		require.NoError(t, err)
		require.Empty(t, dropped, "the oldest partition still holds claims younger than the retention")

		// Two days later the horizon is yesterday: the partitions that end before it go.
		later := now.Add(2 * day)
		dropped, err = store.DropExpiredPartitions(ctx, later)
		require.NoError(t, err)
		require.Equal(t, partitionNames("idem_", day, today.Add(-3*day), today.Add(-2*day)), dropped)
		require.Equal(t, partitionNames("idem_", day, today.Add(-day), today.Add(2*day)), attached(t, store))
		for _, name := range dropped {
			require.False(t, tableExists(t, store, name), name)
		}
		var left int
		require.NoError(t, store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+table(store, "claims")).Scan(&left))
		require.Zero(t, left)

		n, err := store.EnsurePartitions(ctx, later)
		require.NoError(t, err)
		require.Equal(t, 2, n, "two more days ahead, none of the dropped ones again")
		require.Equal(t, partitionNames("idem_", day, today.Add(-day), today.Add(4*day)), attached(t, store))
		dropped, err = store.DropExpiredPartitions(ctx, later)
		require.NoError(t, err)
		require.Empty(t, dropped)
	})

	t.Run("FinishesAnInterruptedDetach", func(t *testing.T) {
		t.Parallel()
		q := p
		q.LockTimeout = 200 * time.Millisecond
		store := newStore(t, idempg.Config{Partition: q})
		now := time.Now().UTC()
		oldest := partitionNames("idem_", day, now.Add(-3*day).Truncate(day), now.Add(-3*day).Truncate(day))[0]
		fill(t, store, now.Add(-3*day).Truncate(day), 10)

		// A long transaction that has read the claims table holds the detach up.
		tx, err := store.Pool().Begin(ctx)
		require.NoError(t, err)
		var n int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM `+table(store, "claims")).Scan(&n))
		start := time.Now()
		dropped, err := store.DropExpiredPartitions(ctx, now.Add(day))
		require.Less(t, time.Since(start), 5*time.Second, "lock_timeout bounds the wait")
		require.ErrorContains(t, err, "detach expired claims partition "+oldest)
		require.Equal(t, idem.ClassTransient, idem.Classify(err), "lock_timeout is worth retrying")
		require.Empty(t, dropped)
		var pending bool
		require.NoError(t, store.Pool().QueryRow(ctx, `SELECT inhdetachpending FROM pg_inherits
			WHERE inhrelid = to_regclass($1)`, `"`+store.Config().Schema+`"."`+oldest+`"`).Scan(&pending))
		require.True(t, pending, "the interrupted detach is pending")
		require.NoError(t, tx.Rollback(ctx))

		// A later run finishes the detach. FINALIZE waits for every older snapshot of the
		// database, not only the claims table's users, so on a busy one it may time out again.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			dropped, err = store.DropExpiredPartitions(ctx, now.Add(day))
			if err == nil || time.Now().After(deadline) {
				break
			}
		}
		require.NoError(t, err)
		require.Equal(t, []string{oldest}, dropped)
		require.False(t, tableExists(t, store, oldest))

		// The connection went back to the pool with the default lock_timeout.
		for range 10 {
			var timeout string
			require.NoError(t, store.Pool().QueryRow(ctx, `SHOW lock_timeout`).Scan(&timeout))
			require.Equal(t, "0", timeout)
		}
	})

	t.Run("DropsALeftoverDetachedTable", func(t *testing.T) {
		t.Parallel()
		store := newStore(t, idempg.Config{Prefix: "lo_", Partition: p})
		now := time.Now().UTC()
		oldest := "lo_claims_p" + now.Add(-3*day).Truncate(day).Format("20060102")
		_, err := store.Pool().Exec(ctx, `ALTER TABLE `+table(store, "claims")+` DETACH PARTITION "`+store.Config().Schema+`"."`+oldest+`"`)
		require.NoError(t, err)
		// A table of another's naming is left alone.
		_, err = store.Pool().Exec(ctx, `CREATE TABLE "`+store.Config().Schema+`"."lo_claims_pnotours" (x int)`)
		require.NoError(t, err)

		dropped, err := store.DropExpiredPartitions(ctx, now.Add(day))
		require.NoError(t, err)
		require.Equal(t, []string{oldest}, dropped)
		require.False(t, tableExists(t, store, oldest))
		require.True(t, tableExists(t, store, "lo_claims_pnotours"))
	})

	t.Run("DeleteExpiredClaimsDropsPartitions", func(t *testing.T) {
		t.Parallel()
		store := newStore(t, idempg.Config{Partition: idempg.PartitionConfig{Bucket: day, Retention: day, Ahead: day}})
		now := time.Now().UTC()
		today := now.Truncate(day)
		// Partitions from an earlier run: five days back.
		_, err := store.EnsurePartitions(ctx, now.Add(-4*day))
		require.NoError(t, err)
		fill(t, store, today.Add(-5*day), 30)
		fill(t, store, today.Add(-3*day), 20)
		fill(t, store, today.Add(-day), 7) // within the retention

		n, err := store.DeleteExpiredClaims(ctx, idemstore.DeleteExpiredClaimsParams{Before: now.Add(-30 * day), Limit: 10})
		require.NoError(t, err)
		require.Zero(t, n, "a caller's earlier horizon keeps everything after it")

		total, err := idem.CollectGarbage(ctx, store, "ledger@v1", now, 10)
		require.NoError(t, err)
		require.Equal(t, 50, total, "the claims of the dropped partitions, whatever the batch size")
		require.Equal(t, partitionNames("idem_", day, today.Add(-day), today.Add(day)), attached(t, store),
			"the store's retention bounds the caller's later horizon; partitions ahead are ensured")

		_, err = store.DeleteExpiredClaims(ctx, idemstore.DeleteExpiredClaimsParams{Before: now})
		require.ErrorContains(t, err, "Limit is 0")
	})
}

// mustPool opens a pool with cfg (lazily: it connects on first use), closed when the test ends.
func mustPool(t *testing.T, cfg *pgxpool.Config) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestPartitionRetentionWithClaimTimeBuckets: a claim lives in the bucket of its own creation
// time, so dropping the partitions whose end is Retention in the past keeps every claim younger
// than Retention, whatever its event's time, and the key stays claimed until then.
func TestPartitionRetentionWithClaimTimeBuckets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, p := range []idempg.PartitionConfig{
		{Bucket: day, Retention: 3 * day, Ahead: day},
		{Bucket: time.Hour, Retention: 10 * time.Hour, Ahead: 2 * time.Hour},
	} {
		t.Run(p.Bucket.String(), func(t *testing.T) {
			t.Parallel()
			store := newStore(t, idempg.Config{Partition: p})
			now := time.Now().UTC()
			// Partitions back to twice the retention, as an earlier run left them.
			_, err := store.EnsurePartitions(ctx, now.Add(-p.Retention))
			require.NoError(t, err)
			ages := map[string]time.Duration{}
			for i := time.Duration(0); i <= 2*p.Retention-p.Bucket; i += p.Bucket / 4 {
				id := fmt.Sprintf("evt-%d", i/time.Minute)
				ages[id] = i
				// The event's time is far from the claim's: it must not matter.
				res, err := claimIn(t, store, idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: id}, idem.Fingerprint{1}, now.Add(-i))
				require.NoError(t, err, id)
				require.Equal(t, idemstore.ClaimNew, res.Status, id)
			}
			dropped, err := store.DropExpiredPartitions(ctx, now)
			require.NoError(t, err)
			require.NotEmpty(t, dropped)
			kept, collected := 0, 0
			for id, age := range ages {
				res, err := claimIn(t, store, idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: id}, idem.Fingerprint{2}, now)
				require.NoError(t, err, id)
				switch {
				case age < p.Retention:
					require.Equal(t, idemstore.ClaimConflict, res.Status, "%s, claimed %v ago, is younger than the retention: still claimed", id, age)
					kept++
				case res.Status == idemstore.ClaimNew:
					collected++
				}
			}
			require.Positive(t, kept)
			require.Positive(t, collected, "claims older than the retention and its bucket were collected")
		})
	}
}
