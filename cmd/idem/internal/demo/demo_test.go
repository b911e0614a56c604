package demo

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/cmd/idem/internal/payments"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/internal/testenv"
)

// The end-to-end runs (TestSQLiteChaos, TestPostgresNATSChaos, TestPostgresQueue) are not
// parallel: each keeps the CPU busy (SQLite is pure Go, and slow under -race), and together on a
// small machine they would stretch past their drain timeout.

// chaosEvents is small enough for -race (SQLite is pure Go) and big enough for every
// misbehaviour to occur several times.
const chaosEvents = 400

// chaos is a small run with every misbehaviour frequent enough to occur several times.
func chaos(store, broker string) Options {
	return Options{
		Store:      store,
		Broker:     broker,
		Events:     chaosEvents,
		Seed:       7,
		Duplicates: 0.12,
		Transient:  0.12,
		Poison:     0.08,
		LostAcks:   0.04,
		// A safety net: the runs take a few seconds, ten or so under -race on a busy machine.
		Timeout: 40 * time.Second,
	}
}

// requireChaosOK checks that the verdict is OK and that each misbehaviour really happened.
func requireChaosOK(t *testing.T, v Verdict) {
	t.Helper()
	var table bytes.Buffer
	require.NoError(t, v.WriteTable(&table))
	t.Logf("verdict:\n%s", table.String())
	require.True(t, v.OK, "problems: %v", v.Problems)
	require.Empty(t, v.Problems)
	require.Equal(t, chaosEvents, v.Events)
	require.Zero(t, v.DoubleApplied)
	require.Zero(t, v.Lost)
	require.True(t, v.BalancesOK)
	require.True(t, v.PoisonOK)
	require.GreaterOrEqual(t, v.PoisonInjected, 20)
	require.GreaterOrEqual(t, v.TransientInjected, 20)
	require.GreaterOrEqual(t, v.LostAcksInjected, 5)
	require.GreaterOrEqual(t, v.DuplicatesInjected, 20)
	require.GreaterOrEqual(t, v.Retries, v.TransientInjected)
	require.Equal(t, v.PoisonInjected, v.DeadLettered["invalid_payload"]+v.DeadLettered["key_reuse"])
	require.GreaterOrEqual(t, v.DeadLettered["key_reuse"], 3, "key reuse occurs")
	require.Equal(t, v.Events-v.PoisonInjected, v.Processed, "each valid event processed once")
	// Every lost ack comes back as a duplicate, and so do the copies of valid events the broker
	// let through (copies of poison are dead-lettered again, into the same dead letter).
	require.GreaterOrEqual(t, v.DuplicatesIgnored, v.LostAcksInjected+(v.DuplicatesInjected-v.DuplicatesDroppedByBroker)/2)
	require.Equal(t, v.Deliveries, v.Processed+v.DuplicatesIgnored+v.Retries+v.DeadLetteredDeliveries+v.OtherDeliveries,
		"the deliveries add up to their outcomes")
	require.Contains(t, table.String(), fmt.Sprintf("deliveries          %d = %d processed", v.Deliveries, v.Processed))
	require.Contains(t, strings.Join(v.Notes, "\n"), fmt.Sprintf("duplicates ignored %d: from", v.DuplicatesIgnored))
	require.Greater(t, v.P50MS, 0.0)
	require.GreaterOrEqual(t, v.P99MS, v.P50MS)
	require.True(t, strings.HasSuffix(table.String(), "verdict: ok\n"), table.String())
}

// sqlChecks are the independent checks, written without the package's queries.
type sqlChecks struct {
	ledgerMax    int // most ledger rows of one event
	badBalances  int
	poison       int
	poisonWithDL int // poison orders with exactly one dead letter of the right reason
}

func runSQLChecks(t *testing.T, q func(query string, args ...any) int, ph func(int) string, runID, orders, ledger, wallets, dls string) sqlChecks {
	t.Helper()
	var c sqlChecks
	c.ledgerMax = q(`SELECT COALESCE(max(n), 0) FROM (SELECT count(*) AS n FROM `+ledger+` WHERE run_id = `+ph(1)+` GROUP BY event_id) AS x`, runID)
	c.badBalances = q(`SELECT count(*) FROM `+wallets+` w WHERE w.run_id = `+ph(1)+` AND w.balance_cents <>
		(SELECT COALESCE(sum(amount_cents), 0) FROM `+orders+` o WHERE o.run_id = w.run_id AND o.wallet_id = w.id AND o.valid)`, runID)
	c.poison = q(`SELECT count(*) FROM `+orders+` WHERE run_id = `+ph(1)+` AND NOT valid`, runID)
	c.poisonWithDL = q(`SELECT count(*) FROM `+orders+` o WHERE o.run_id = `+ph(1)+` AND NOT o.valid AND 1 =
		(SELECT count(*) FROM `+dls+` d WHERE d.event_id = o.event_id AND d.consumer = 'ledger@v1' AND d.reason =
			CASE o.poison WHEN 'key_reuse' THEN 'key_reuse' ELSE 'invalid_payload' END)`, runID)
	// Every valid order has exactly one ledger row with its amount.
	require.Zero(t, q(`SELECT count(*) FROM `+orders+` o WHERE o.run_id = `+ph(1)+` AND o.valid AND 1 <>
		(SELECT count(*) FROM `+ledger+` l WHERE l.run_id = o.run_id AND l.event_id = o.event_id AND l.amount_cents = o.amount_cents)`, runID))
	return c
}

func TestSQLiteChaos(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.db")
	v, err := Run(context.Background(), chaos("sqlite://"+path, "sql"))
	require.NoError(t, err)
	requireChaosOK(t, v)
	require.Equal(t, "sqlite://"+path, v.Store)
	require.Equal(t, "sql", v.Broker)

	db, err := idemsqlite.Open(path)
	require.NoError(t, err)
	defer db.Close()
	q := func(query string, args ...any) int {
		var n int
		require.NoError(t, db.QueryRow(query, args...).Scan(&n), query)
		return n
	}
	c := runSQLChecks(t, q, func(int) string { return "?" }, v.RunID, "demo_orders", "demo_ledger", "demo_wallets", "idem_dead_letters")
	require.Equal(t, 1, c.ledgerMax, "no event has more than one ledger row")
	require.Zero(t, c.badBalances)
	require.Equal(t, v.PoisonInjected, c.poison)
	require.Equal(t, c.poison, c.poisonWithDL)
	require.Zero(t, q(`SELECT count(*) FROM idem_queue WHERE queue = ?`, "demo.payments."+v.RunID), "queue drained")

	// A second run on the same file never mixes with the first.
	v2, err := Run(context.Background(), Options{Store: "sqlite://" + path, Events: 50, Seed: 3, Poison: 0.2, Timeout: 20 * time.Second})
	require.NoError(t, err)
	require.True(t, v2.OK, "problems: %v", v2.Problems)
	require.NotEqual(t, v.RunID, v2.RunID)
	require.Equal(t, 50, v2.Events)
	require.Equal(t, chaosEvents, q(`SELECT count(*) FROM demo_orders WHERE run_id = ?`, v.RunID))
}

func TestCheckDetectsDoubleApplication(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "demo.db")
	v, err := Run(ctx, Options{Store: "sqlite://" + path, Events: 40, Timeout: 20 * time.Second})
	require.NoError(t, err)
	require.True(t, v.OK, "problems: %v", v.Problems)

	st, err := connect.OpenStore(ctx, "sqlite://"+path, connect.Options{MustExist: true})
	require.NoError(t, err)
	defer st.Close()
	db := newDatabase(st)
	exec := func(q string, args ...any) error { _, err := db.Exec(ctx, q, args...); return err }
	again, err := check(ctx, db, v.RunID, "")
	require.NoError(t, err)
	require.True(t, again.OK, "the check is repeatable: %v", again.Problems)

	// Apply one event a second time by hand, as a broken consumer would.
	// (The run has no misbehaviour, so every order is valid.)
	require.NoError(t, exec(`INSERT INTO {ledger} (run_id, event_id, wallet_id, amount_cents)
		SELECT run_id, event_id, wallet_id, amount_cents FROM {ledger} WHERE run_id = ? AND event_id = ?`,
		v.RunID, payments.EventID(v.RunID, 0)))
	bad, err := check(ctx, db, v.RunID, "")
	require.NoError(t, err)
	require.False(t, bad.OK)
	require.Equal(t, 1, bad.DoubleApplied)
	require.Contains(t, strings.Join(bad.Problems, "\n"), "applied more than once")

	// And a lost event (another one): its ledger row gone, no dead letter.
	require.NoError(t, exec(`DELETE FROM {ledger} WHERE run_id = ? AND event_id = ?`, v.RunID, payments.EventID(v.RunID, 5)))
	bad, err = check(ctx, db, v.RunID, "")
	require.NoError(t, err)
	require.Equal(t, 1, bad.Lost)
	require.Contains(t, strings.Join(bad.Problems, "\n"), "1 valid events were lost")

	var out bytes.Buffer
	require.NoError(t, bad.WriteTable(&out))
	require.Contains(t, out.String(), "verdict: FAILED\n")
	require.Contains(t, out.String(), "  - 1 events were applied more than once")
}

func TestValidateNamesTheFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mod  func(*Options)
		want string
	}{
		{func(o *Options) { o.Duplicates = 1.5 }, "--duplicates 1.5: want a rate between 0 and 1"},
		{func(o *Options) { o.Transient = -0.1 }, "--transient -0.1: want a rate between 0 and 1"},
		{func(o *Options) { o.Poison = 2 }, "--poison 2: want a rate between 0 and 1"},
		{func(o *Options) { o.LostAcks = 1.01 }, "--lost-acks 1.01: want a rate between 0 and 1"},
		{func(o *Options) { o.Events = -3 }, "--events -3: want between 1 and 1000000"},
		{func(o *Options) { o.Concurrency = -1 }, "--concurrency -1: want between 1 and 1024"},
		{func(o *Options) { o.Timeout = -time.Second }, "--timeout -1s: want a positive duration"},
		{func(o *Options) { o.Store = "mysql://x" }, "--store: "},
		{func(o *Options) { o.Broker = "kafka://x:1" }, "--broker: "},
		{func(o *Options) { o.HTTP, o.Broker = true, "nats://127.0.0.1:4222" }, "--http replaces the broker"},
		{func(o *Options) { o.HTTP, o.Batch = true, 25 }, "--http delivers one event per request"},
		{func(o *Options) { o.Broker, o.FanOut = "nats://127.0.0.1:4222", true }, "--fanout: needs --broker sql"},
		{func(o *Options) { o.HTTP, o.FanOut = true, true }, "--fanout needs the queue table's subscriptions"},
	} {
		o := Options{}.WithDefaults()
		tc.mod(&o)
		err := o.Validate()
		require.ErrorContains(t, err, tc.want)
		_, err = Run(context.Background(), o)
		require.ErrorContains(t, err, tc.want, "Run validates")
	}
	require.NoError(t, Options{}.WithDefaults().Validate())
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	o := Options{}.WithDefaults()
	require.Equal(t, StoreDefault, o.Store)
	require.Equal(t, "sql", o.Broker)
	require.Equal(t, 10000, o.Events)
	require.Equal(t, 8, o.Concurrency)
	require.EqualValues(t, 1, o.Seed)
	require.Equal(t, []float64{0.05, 0.05, 0.01, 0.02}, []float64{o.Duplicates, o.Transient, o.Poison, o.LostAcks})
	require.Equal(t, 2*time.Minute, o.Timeout)
	require.NotNil(t, o.Logger)

	// A rate set explicitly, even to zero, is kept.
	o = Options{LostAcks: 0.5}.WithDefaults()
	require.Equal(t, []float64{0, 0, 0, 0.5}, []float64{o.Duplicates, o.Transient, o.Poison, o.LostAcks})
}

// natsStream returns a fresh stream name and subject root on the test's JetStream, deleted at
// cleanup.
func natsStream(t *testing.T, url string) (stream, root string) {
	t.Helper()
	stream = strings.ToUpper(testdb.Name("IDEM_DEMO_T"))
	root = strings.ToLower(stream)
	t.Cleanup(func() {
		nc, err := nats.Connect(url)
		if err != nil {
			return
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, stream)
	})
	return stream, root
}

// pgSchema returns the PostgreSQL URL with idem_schema set to a fresh schema, and a pool to
// check it, dropping the schema at cleanup.
func pgSchema(t *testing.T) (storeURL, schema string, pool *pgxpool.Pool) {
	t.Helper()
	base := testenv.Postgres(t)
	schema = testdb.Name("idemdemo_")
	u, err := url.Parse(base)
	require.NoError(t, err)
	q := u.Query()
	q.Set("idem_schema", schema)
	u.RawQuery = q.Encode()
	pool, err = pgxpool.New(context.Background(), base)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		pool.Close()
	})
	return u.String(), schema, pool
}

func TestPostgresNATSChaos(t *testing.T) {
	natsURL := testenv.NATS(t)
	storeURL, schema, pool := pgSchema(t)
	o := chaos(storeURL, natsURL)
	o.natsStream, o.natsRoot = natsStream(t, natsURL)
	v, err := Run(context.Background(), o)
	require.NoError(t, err)
	requireChaosOK(t, v)
	require.NotContains(t, v.Broker, "@")
	require.Zero(t, v.DuplicatesDroppedByBroker, "copies go out under another Nats-Msg-Id and reach the consumer")
	require.Positive(t, v.DuplicatesIgnored, "the copies reached the consumer and were ignored there")

	q := func(query string, args ...any) int {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(), query, args...).Scan(&n), query)
		return n
	}
	tbl := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	c := runSQLChecks(t, q, func(i int) string { return fmt.Sprintf("$%d", i) }, v.RunID,
		tbl("demo_orders"), tbl("demo_ledger"), tbl("demo_wallets"), tbl("idem_dead_letters"))
	require.Equal(t, 1, c.ledgerMax)
	require.Zero(t, c.badBalances)
	require.Equal(t, v.PoisonInjected, c.poison)
	require.Equal(t, c.poison, c.poisonWithDL)
}

func TestPostgresQueue(t *testing.T) {
	storeURL, _, _ := pgSchema(t)
	v, err := Run(context.Background(), chaos(storeURL, "sql"))
	require.NoError(t, err)
	requireChaosOK(t, v)
	require.Zero(t, v.DuplicatesDroppedByBroker)
}

func TestMySQLNATSChaos(t *testing.T) {
	natsURL := testenv.NATS(t)
	db, storeURL := testdb.MySQLDatabase(t)
	o := chaos(storeURL, natsURL)
	o.natsStream, o.natsRoot = natsStream(t, natsURL)
	v, err := Run(context.Background(), o)
	require.NoError(t, err)
	requireChaosOK(t, v)
	require.Positive(t, v.DuplicatesIgnored, "the copies reached the consumer and were ignored there")

	q := func(query string, args ...any) int {
		var n int
		require.NoError(t, db.QueryRow(query, args...).Scan(&n), query)
		return n
	}
	c := runSQLChecks(t, q, func(int) string { return "?" }, v.RunID, "demo_orders", "demo_ledger", "demo_wallets", "idem_dead_letters")
	require.Equal(t, 1, c.ledgerMax, "no event has more than one ledger row")
	require.Zero(t, c.badBalances)
	require.Equal(t, v.PoisonInjected, c.poison)
	require.Equal(t, c.poison, c.poisonWithDL)
}

func TestMySQLQueue(t *testing.T) {
	db, storeURL := testdb.MySQLDatabase(t)
	v, err := Run(context.Background(), chaos(storeURL, "sql"))
	require.NoError(t, err)
	requireChaosOK(t, v)
	var left int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM idem_queue WHERE queue = ?`, "demo.payments."+v.RunID).Scan(&left))
	require.Zero(t, left, "queue drained")
}

func TestSetupErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, err := Run(ctx, Options{Store: "postgres://demo:s3cret@127.0.0.1:1/x?connect_timeout=2", Events: 10})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")

	path := filepath.Join(t.TempDir(), "demo.db")
	v, err := Run(ctx, Options{Store: "sqlite://" + path, Broker: "nats://demo:s3cret@127.0.0.1:1", Events: 10})
	// A broker URL's user info is token-bearing: the error names the broker
	// with its user info masked.
	require.ErrorContains(t, err, "broker nats://[REDACTED]@127.0.0.1:1")
	require.NotContains(t, err.Error(), "s3cret")
	require.NotContains(t, err.Error(), "demo:")
	require.NotContains(t, v.Broker, "s3cret")
}

func TestTimeoutFailsTheVerdict(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "demo.db")
	// Every event loses its ack, so the run cannot drain before the lease brings them back.
	v, err := Run(context.Background(), Options{Store: "sqlite://" + path, Events: 20, LostAcks: 1, Timeout: 500 * time.Millisecond})
	require.NoError(t, err)
	require.False(t, v.OK)
	require.Contains(t, v.Problems[0], "did not drain within 500ms")
}

func TestInterruptedRunFailsTheVerdict(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "demo.db")
	ctx, cancel := context.WithCancel(context.Background())
	var calls int
	o := Options{Store: "sqlite://" + path, Events: 5000, LostAcks: 0.5, Progress: func(done, total int) {
		calls++
		require.Equal(t, 5000, total)
		if done > 0 {
			cancel()
		}
	}}
	v, err := Run(ctx, o)
	require.NoError(t, err, "an interrupted run still has a verdict")
	require.False(t, v.OK)
	require.Contains(t, v.Problems[0], "interrupted before the run drained")
	require.Zero(t, v.DoubleApplied, "what was applied, was applied once")
	require.Positive(t, calls)
}

// TestDefaultTiming runs the default scenario (10000 events) and prints its verdict; it is
// slow, so it runs only with IDEM_DEMO_FULL=1. With IDEM_POSTGRES_URL and IDEM_NATS_URL set it
// runs on PostgreSQL + NATS too.
func TestDefaultTiming(t *testing.T) {
	if os.Getenv("IDEM_DEMO_FULL") != "1" {
		t.Skip("set IDEM_DEMO_FULL=1 to run the full default scenario")
	}
	run := func(t *testing.T, o Options) {
		start := time.Now()
		v, err := Run(context.Background(), o)
		require.NoError(t, err)
		var table bytes.Buffer
		require.NoError(t, v.WriteTable(&table))
		t.Logf("wall time %v\n%s", time.Since(start).Round(time.Millisecond), table.String())
		require.True(t, v.OK, "problems: %v", v.Problems)
		require.Equal(t, EventsDefault, v.Events)
	}
	t.Run("SQLite", func(t *testing.T) {
		o := Options{Store: "sqlite://" + filepath.Join(t.TempDir(), "idem-demo.db")}.WithDefaults()
		run(t, o)
	})
	t.Run("PostgresNATS", func(t *testing.T) {
		natsURL := testenv.NATS(t)
		storeURL, _, _ := pgSchema(t)
		o := Options{Store: storeURL, Broker: natsURL}.WithDefaults()
		o.natsStream, o.natsRoot = natsStream(t, natsURL)
		run(t, o)
	})
}

// TestSQLiteChaosBatched runs the same misbehaving scenario with the consumer in batched mode:
// every check of the verdict must hold as in per-event mode.
func TestSQLiteChaosBatched(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.db")
	o := chaos("sqlite://"+path, "sql")
	o.Batch = 25
	v, err := Run(context.Background(), o)
	require.NoError(t, err)
	requireChaosOK(t, v)
}

// TestPostgresNATSChaosBatched is TestPostgresNATSChaos in batched mode.
func TestPostgresNATSChaosBatched(t *testing.T) {
	natsURL := testenv.NATS(t)
	storeURL, _, _ := pgSchema(t)
	o := chaos(storeURL, natsURL)
	o.natsStream, o.natsRoot = natsStream(t, natsURL)
	o.Batch = 25
	v, err := Run(context.Background(), o)
	require.NoError(t, err)
	requireChaosOK(t, v)
}

// TestSQLiteHTTPChaos drives the payments through the webhook ingress (--http): the relay signs
// and POSTs each event, retries 503s and cut connections, and stops on the ingress's 422 for a
// poison event, which the ingress dead-lettered once. The verdict holds as with a broker.
func TestSQLiteHTTPChaos(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.db")
	o := chaos("sqlite://"+path, "sql")
	o.HTTP = true
	v, err := Run(context.Background(), o)
	require.NoError(t, err)
	requireChaosOK(t, v)
	require.Equal(t, "http (webhook ingress)", v.Broker)
	require.Empty(t, v.DeadLettered["unauthenticated"], "every push verified")
}

// TestPostgresHTTPChaos is TestSQLiteHTTPChaos on PostgreSQL.
func TestPostgresHTTPChaos(t *testing.T) {
	storeURL, _, _ := pgSchema(t)
	o := chaos(storeURL, "sql")
	o.HTTP = true
	v, err := Run(context.Background(), o)
	require.NoError(t, err)
	requireChaosOK(t, v)
}

// TestMySQLHTTPChaos is TestSQLiteHTTPChaos on MySQL.
func TestMySQLHTTPChaos(t *testing.T) {
	_, storeURL := testdb.MySQLDatabase(t)
	o := chaos(storeURL, "sql")
	o.HTTP = true
	v, err := Run(context.Background(), o)
	require.NoError(t, err)
	requireChaosOK(t, v)
}

// requireFanOutOK checks the e-mail consumer's half of a --fanout chaos run: it received every
// event through its own subscription, with the same injected duplicates, poison and lost acks,
// and applied each valid event once.
func requireFanOutOK(t *testing.T, v Verdict) {
	t.Helper()
	requireChaosOK(t, v)
	f := v.FanOut
	require.NotNil(t, f)
	require.Equal(t, emailConsumerName, f.Consumer)
	require.Zero(t, f.DoubleSent)
	require.Zero(t, f.Missing)
	require.Zero(t, f.Wrong)
	require.True(t, f.PoisonOK)
	require.Empty(t, f.Problems)
	require.Equal(t, v.Events-v.PoisonInjected, f.Processed, "each valid event processed once by the e-mail consumer too")
	require.Equal(t, v.PoisonInjected, f.DeadLettered["invalid_payload"]+f.DeadLettered["key_reuse"])
	require.GreaterOrEqual(t, f.CrashesInjected, 5)
	require.GreaterOrEqual(t, f.DuplicatesIgnored, f.CrashesInjected, "every lost ack came back as a duplicate")
}

// TestSQLiteFanOut runs the chaos scenario with a ledger and an e-mail consumer of one topic,
// each on a queue-table subscription of its own, and checks both verdicts and the tables by
// hand: one ledger row and one e-mail row per valid event, and the subscriptions drained.
func TestSQLiteFanOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.db")
	o := chaos("sqlite://"+path, "sql")
	o.FanOut = true
	v, err := Run(context.Background(), o)
	require.NoError(t, err)
	requireFanOutOK(t, v)

	db, err := idemsqlite.Open(path)
	require.NoError(t, err)
	defer db.Close()
	q := func(query string, args ...any) int {
		var n int
		require.NoError(t, db.QueryRow(query, args...).Scan(&n), query)
		return n
	}
	for _, table := range []string{"demo_ledger", "demo_emails"} {
		require.Zero(t, q(`SELECT count(*) FROM demo_orders o WHERE o.run_id = ? AND o.valid AND 1 <>
			(SELECT count(*) FROM `+table+` x WHERE x.run_id = o.run_id AND x.event_id = o.event_id AND x.amount_cents = o.amount_cents)`, v.RunID), table)
		require.Zero(t, q(`SELECT count(*) FROM `+table+` x WHERE x.run_id = ? AND NOT EXISTS
			(SELECT 1 FROM demo_orders o WHERE o.run_id = x.run_id AND o.event_id = x.event_id AND o.valid)`, v.RunID), table)
	}
	queue := "demo.payments." + v.RunID
	require.Zero(t, q(`SELECT count(*) FROM idem_queue WHERE queue IN (?, ?, ?)`, queue, queue+"#ledger", queue+"#email"), "every subscription drained")
	require.Equal(t, 2, q(`SELECT count(*) FROM idem_queue_subscriptions WHERE topic = ?`, queue))
}

func TestPostgresFanOut(t *testing.T) {
	storeURL, _, _ := pgSchema(t)
	o := chaos(storeURL, "sql")
	o.FanOut = true
	v, err := Run(context.Background(), o)
	require.NoError(t, err)
	requireFanOutOK(t, v)
}

func TestMySQLFanOutBatched(t *testing.T) {
	_, storeURL := testdb.MySQLDatabase(t)
	o := chaos(storeURL, "sql")
	o.FanOut, o.Batch = true, 10
	v, err := Run(context.Background(), o)
	require.NoError(t, err)
	requireFanOutOK(t, v)
}
