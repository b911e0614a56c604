package inspect_test

import (
	"context"
	"database/sql"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/cmd/idem/internal/inspect"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.MainWith(m, func() error { return goleak.Find() })
}

// stores opens a fresh, migrated store of each kind (PostgreSQL and MySQL skip without their
// variables).
var stores = []struct {
	name string
	dsn  func(t *testing.T) string
}{
	{"sqlite", func(t *testing.T) string { return "sqlite://" + filepath.Join(t.TempDir(), "idem.db") }},
	{"postgres", func(t *testing.T) string {
		u, err := url.Parse(testenv.Postgres(t))
		require.NoError(t, err)
		schema := testdb.Name("inspect_")
		q := u.Query()
		q.Set("idem_schema", schema)
		u.RawQuery = q.Encode()
		pool := testdb.Pool(t)
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
		return u.String()
	}},
	{"mysql", func(t *testing.T) string { _, dsn := testdb.MySQLDatabase(t); return dsn }},
}

// claim claims one event of consumer at at.
func claim(t *testing.T, st *connect.Stores, consumer, eventID string, at time.Time) {
	t.Helper()
	ctx := context.Background()
	p := idemstore.ClaimParams{Key: idem.Key{Tenant: "acme", Consumer: consumer, EventID: eventID}, Now: at}
	var err error
	switch {
	case st.SQLite != nil:
		err = st.SQLite.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error { _, err := st.SQLite.ClaimTx(ctx, tx, p); return err })
	case st.MySQL != nil:
		err = st.MySQL.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error { _, err := st.MySQL.ClaimTx(ctx, tx, p); return err })
	case st.Postgres != nil:
		err = st.Postgres.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error { _, err := st.Postgres.ClaimTx(ctx, tx, p); return err })
	}
	require.NoError(t, err)
}

// open opens and migrates the store dsn names, closed at cleanup.
func open(t *testing.T, dsn string) *connect.Stores {
	t.Helper()
	ctx := context.Background()
	st, err := connect.OpenStore(ctx, dsn, connect.Options{MaxConns: 2})
	require.NoError(t, err)
	t.Cleanup(st.Close)
	require.NoError(t, st.Migrator.Migrate(ctx))
	return st
}

// TestDeadLetters: pending counts per consumer, the sources of pending ones, and recovery
// times, on every store.
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	for _, k := range stores {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			st := open(t, k.dsn(t))
			base := time.Now().UTC().Truncate(time.Second).Add(-time.Hour)
			ins := func(consumer, eventID, source string, failed time.Time) idem.DeadLetter {
				dl, err := st.DeadLetters.InsertDeadLetter(ctx, idem.DeadLetter{Consumer: consumer,
					Message: idem.Message{EventID: eventID, Tenant: "acme", Payload: []byte(`{}`)},
					Reason:  idem.ReasonPermanentError, Attempts: 1, FirstFailed: failed, LastFailed: failed,
					Status: idem.DeadLetterPending, Source: source})
				require.NoError(t, err)
				return dl
			}
			ins("ledger@v1", "a", "queue:payments", base.Add(10*time.Minute))
			ins("ledger@v1", "b", "queue:payments", base)
			ins("mailer@v2", "c", "outbox:mail", base.Add(20*time.Minute))
			done := ins("ledger@v1", "d", "queue:refunds", base.Add(5*time.Minute))
			_, err := st.DeadLetters.SetDeadLetterStatus(ctx, idemstore.SetDeadLetterStatusParams{IDs: []int64{done.ID},
				Status: idem.DeadLetterReplayed, Actor: "tester", Now: base.Add(30 * time.Minute)})
			require.NoError(t, err)
			_, err = st.DeadLetters.RecordRecovery(ctx, idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "d"}, done.ID, base.Add(45*time.Minute))
			require.NoError(t, err)

			pending, err := inspect.PendingDeadLetters(ctx, st)
			require.NoError(t, err)
			require.Len(t, pending, 2)
			require.Equal(t, "ledger@v1", pending[0].Consumer)
			require.EqualValues(t, 2, pending[0].Count)
			require.WithinDuration(t, base, pending[0].Oldest, time.Millisecond)
			require.Equal(t, "mailer@v2", pending[1].Consumer)
			require.EqualValues(t, 1, pending[1].Count)

			sources, err := inspect.PendingSources(ctx, st)
			require.NoError(t, err)
			require.Equal(t, []string{"outbox:mail", "queue:payments"}, sources)

			rec, err := inspect.RecoveryTimes(ctx, st, 10)
			require.NoError(t, err)
			require.Equal(t, []time.Duration{40 * time.Minute}, rec)

			// Two events ignored by ledger@v1's handler, one by mailer@v2's.
			for _, k := range []idem.Key{{Tenant: "acme", Consumer: "ledger@v1", EventID: "x"},
				{Tenant: "acme", Consumer: "ledger@v1", EventID: "y"}, {Tenant: "acme", Consumer: "mailer@v2", EventID: "z"}} {
				p := idemstore.RecordIgnoreParams{Key: k, Reason: "order deleted", Now: base}
				switch {
				case st.SQLite != nil:
					err = st.SQLite.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return st.SQLite.RecordIgnoreTx(ctx, tx, p) })
				case st.MySQL != nil:
					err = st.MySQL.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return st.MySQL.RecordIgnoreTx(ctx, tx, p) })
				case st.Postgres != nil:
					err = st.Postgres.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return st.Postgres.RecordIgnoreTx(ctx, tx, p) })
				}
				require.NoError(t, err)
			}
			ignored, err := inspect.IgnoredCounts(ctx, st)
			require.NoError(t, err)
			require.Equal(t, map[string]int64{"ledger@v1": 2, "mailer@v2": 1}, ignored, "the replay's audit row is not an ignore")
		})
	}
}

// TestClaims: counts per consumer and per minute, with the bucket edges where the clock puts
// them, on every store.
func TestClaims(t *testing.T) {
	t.Parallel()
	for _, k := range stores {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			st := open(t, k.dsn(t))

			base := time.Now().UTC().Truncate(time.Minute).Add(-10 * time.Minute)
			claim(t, st, "ledger@v1", "a", base.Add(-time.Second)) // the minute before: outside
			claim(t, st, "ledger@v1", "b", base)                   // first instant of the first bucket
			claim(t, st, "ledger@v1", "c", base.Add(59*time.Second))
			claim(t, st, "ledger@v1", "d", base.Add(time.Minute))
			claim(t, st, "mailer@v2", "e", base.Add(3*time.Minute+time.Second))

			counts, err := inspect.ClaimCounts(ctx, st)
			require.NoError(t, err)
			require.Len(t, counts, 2)
			require.Equal(t, "ledger@v1", counts[0].Consumer)
			require.EqualValues(t, 4, counts[0].Count)
			require.WithinDuration(t, base.Add(time.Minute), counts[0].Last, time.Millisecond)
			require.Equal(t, "mailer@v2", counts[1].Consumer)
			require.EqualValues(t, 1, counts[1].Count)

			rate, err := inspect.ClaimRate(ctx, st, base, time.Minute)
			require.NoError(t, err)
			got := map[string]map[time.Duration]int64{}
			for _, p := range rate {
				if got[p.Consumer] == nil {
					got[p.Consumer] = map[time.Duration]int64{}
				}
				got[p.Consumer][p.Start.Sub(base)] = p.Count
			}
			require.Equal(t, map[string]map[time.Duration]int64{
				"ledger@v1": {0: 2, time.Minute: 1},
				"mailer@v2": {3 * time.Minute: 1},
			}, got)
			_, err = inspect.ClaimRate(ctx, st, base, time.Millisecond)
			require.Error(t, err)

			parts, err := inspect.OutboxPartitions(ctx, st)
			require.NoError(t, err)
			require.Empty(t, parts)
		})
	}
}
