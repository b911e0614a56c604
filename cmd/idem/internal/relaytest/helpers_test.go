package relaytest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/retry"
)

func TestMain(m *testing.M) {
	testenv.MainWith(m, func() error { return goleak.Find() })
}

// outboxState is one outbox row as the tests look at it.
type outboxState struct {
	Attempts  int
	Dead      bool
	Published bool
	LastError string
}

// counts summarises the outbox.
type counts struct{ Pending, Published, Dead int }

// kit is one migrated store under test plus what the tests need around it: a business table
// to write in the producer's transaction, and SQL views of the outbox.
type kit struct {
	name  string
	store idemstore.OutboxRelayStore
	dlq   idemstore.DeadLetterStore
	// order inserts a business row and enqueues msgs in one transaction; with fail set, the
	// transaction returns an error after both writes and rolls back.
	order func(ctx context.Context, id string, fail bool, msgs ...idem.Outgoing) error
	// orders counts committed business rows.
	orders func(ctx context.Context) int
	// counts summarises the outbox.
	counts func(ctx context.Context) counts
	// row returns the state of the outbox row of eventID.
	row func(ctx context.Context, eventID string) outboxState
	// another returns a second store over the same tables, as another process would have.
	another func(tb testing.TB) idemstore.OutboxRelayStore
}

// enqueue commits msgs in one transaction of their own.
func (k kit) enqueue(tb testing.TB, msgs ...idem.Outgoing) {
	tb.Helper()
	require.NoError(tb, k.order(context.Background(), randomHex(tb, 8), false, msgs...))
}

// kits are the stores the relay is tested on; PostgreSQL skips without IDEM_POSTGRES_URL, MySQL
// without IDEM_MYSQL_URL.
var kits = []struct {
	name string
	new  func(tb testing.TB, cfg storeCfg) kit
}{
	{"sqlite", newSQLite},
	{"postgres", newPostgres},
	{"mysql", newMySQL},
}

// storeCfg is what a test may ask of its store.
type storeCfg struct {
	partitions int
	maxConns   int32
}

var errRollback = errors.New("business rule failed: roll back")

// newSQLite builds a kit on a fresh SQLite file in tb.TempDir().
func newSQLite(tb testing.TB, cfg storeCfg) kit {
	tb.Helper()
	ctx := context.Background()
	db, err := idemsqlite.Open(filepath.Join(tb.TempDir(), "idem.db"))
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, db.Close()) })
	store, err := idemsqlite.NewWithConfig(db, idemsqlite.Config{OutboxPartitions: cfg.partitions})
	require.NoError(tb, err)
	require.NoError(tb, store.Migrate(ctx))
	_, err = db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY)`)
	require.NoError(tb, err)
	return kit{
		name:  "sqlite",
		store: store,
		dlq:   store,
		order: func(ctx context.Context, id string, fail bool, msgs ...idem.Outgoing) error {
			return store.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (?)`, id); err != nil {
					return err
				}
				if err := store.EnqueueTx(ctx, tx, msgs...); err != nil {
					return err
				}
				if fail {
					return errRollback
				}
				return nil
			})
		},
		orders: func(ctx context.Context) int {
			var n int
			require.NoError(tb, db.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&n))
			return n
		},
		counts: func(ctx context.Context) counts {
			var c counts
			require.NoError(tb, db.QueryRowContext(ctx, `SELECT
				coalesce(sum(published_at IS NULL AND NOT dead), 0),
				coalesce(sum(published_at IS NOT NULL), 0),
				coalesce(sum(dead), 0) FROM idem_outbox`).Scan(&c.Pending, &c.Published, &c.Dead))
			return c
		},
		row: func(ctx context.Context, eventID string) outboxState {
			var s outboxState
			require.NoError(tb, db.QueryRowContext(ctx, `SELECT attempts, dead, published_at IS NOT NULL, last_error
				FROM idem_outbox WHERE event_id = ?`, eventID).Scan(&s.Attempts, &s.Dead, &s.Published, &s.LastError))
			return s
		},
		another: func(tb testing.TB) idemstore.OutboxRelayStore {
			s, err := idemsqlite.NewWithConfig(db, store.Config())
			require.NoError(tb, err)
			return s
		},
	}
}

// newMySQL builds a kit on a fresh MySQL or MariaDB database.
func newMySQL(tb testing.TB, cfg storeCfg) kit {
	tb.Helper()
	ctx := context.Background()
	db := testdb.MySQLDB(tb)
	if cfg.maxConns > 8 {
		db.SetMaxOpenConns(int(cfg.maxConns))
	}
	var stores []*idemmysql.Store
	var mu sync.Mutex
	newStore := func(tb testing.TB) *idemmysql.Store {
		s, err := idemmysql.NewWithConfig(db, idemmysql.Config{OutboxPartitions: cfg.partitions})
		require.NoError(tb, err)
		mu.Lock()
		stores = append(stores, s)
		mu.Unlock()
		return s
	}
	tb.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range stores {
			require.NoError(tb, s.Close())
		}
	})
	store := newStore(tb)
	require.NoError(tb, store.Migrate(ctx))
	_, err := db.ExecContext(ctx, `CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY) ENGINE=InnoDB`)
	require.NoError(tb, err)
	return kit{
		name:  "mysql",
		store: store,
		dlq:   store,
		order: func(ctx context.Context, id string, fail bool, msgs ...idem.Outgoing) error {
			return store.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (?)`, id); err != nil {
					return err
				}
				if err := store.EnqueueTx(ctx, tx, msgs...); err != nil {
					return err
				}
				if fail {
					return errRollback
				}
				return nil
			})
		},
		orders: func(ctx context.Context) int {
			var n int
			require.NoError(tb, db.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&n))
			return n
		},
		counts: func(ctx context.Context) counts {
			var c counts
			require.NoError(tb, db.QueryRowContext(ctx, `SELECT
				coalesce(sum(published_at IS NULL AND NOT dead), 0),
				coalesce(sum(published_at IS NOT NULL), 0),
				coalesce(sum(dead), 0) FROM idem_outbox`).Scan(&c.Pending, &c.Published, &c.Dead))
			return c
		},
		row: func(ctx context.Context, eventID string) outboxState {
			var s outboxState
			require.NoError(tb, db.QueryRowContext(ctx, `SELECT attempts, dead, published_at IS NOT NULL, last_error
				FROM idem_outbox WHERE event_id = ?`, eventID).Scan(&s.Attempts, &s.Dead, &s.Published, &s.LastError))
			return s
		},
		another: func(tb testing.TB) idemstore.OutboxRelayStore { return newStore(tb) },
	}
}

// pgEnv is a migrated PostgreSQL store in a schema of its own, and its pool.
type pgEnv struct {
	pool   *pgxpool.Pool
	store  *idempg.Store
	schema string // quoted
	// anotherFn returns another store on the same schema, closed with the others.
	anotherFn func(tb testing.TB) *idempg.Store
}

// newPG creates a pool, a fresh schema idemtest_<hex> and a migrated store in it; everything is
// dropped and closed when tb ends.
func newPG(tb testing.TB, cfg storeCfg) pgEnv {
	tb.Helper()
	url := testenv.Postgres(tb)
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(url)
	require.NoError(tb, err)
	pcfg.MaxConns = max(cfg.maxConns, 6)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(tb, err)
	schema := "idemtest_" + randomHex(tb, 8)
	var stores []*idempg.Store
	var mu sync.Mutex
	newStore := func(tb testing.TB) *idempg.Store {
		s, err := idempg.NewWithConfig(pool, idempg.Config{Schema: schema, OutboxPartitions: cfg.partitions})
		require.NoError(tb, err)
		mu.Lock()
		stores = append(stores, s)
		mu.Unlock()
		return s
	}
	tb.Cleanup(func() {
		mu.Lock()
		for _, s := range stores {
			require.NoError(tb, s.Close())
		}
		mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
		require.NoError(tb, err)
		pool.Close()
	})
	store := newStore(tb)
	require.NoError(tb, store.Migrate(ctx))
	env := pgEnv{pool: pool, store: store, schema: `"` + schema + `"`}
	env.anotherFn = newStore
	return env
}

// newPostgres builds a kit on a fresh PostgreSQL schema.
func newPostgres(tb testing.TB, cfg storeCfg) kit {
	tb.Helper()
	env := newPG(tb, cfg)
	ctx := context.Background()
	pool, store, schema := env.pool, env.store, env.schema
	outbox := schema + `."idem_outbox"`
	_, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.orders (id text PRIMARY KEY)`)
	require.NoError(tb, err)
	return kit{
		name:  "postgres",
		store: store,
		dlq:   store,
		order: func(ctx context.Context, id string, fail bool, msgs ...idem.Outgoing) error {
			return store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.orders (id) VALUES ($1)`, id); err != nil {
					return err
				}
				if err := store.EnqueueTx(ctx, tx, msgs...); err != nil {
					return err
				}
				if fail {
					return errRollback
				}
				return nil
			})
		},
		orders: func(ctx context.Context) int {
			var n int
			require.NoError(tb, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.orders`).Scan(&n))
			return n
		},
		counts: func(ctx context.Context) counts {
			var c counts
			require.NoError(tb, pool.QueryRow(ctx, `SELECT
				count(*) FILTER (WHERE published_at IS NULL AND NOT dead),
				count(*) FILTER (WHERE published_at IS NOT NULL),
				count(*) FILTER (WHERE dead) FROM `+outbox).Scan(&c.Pending, &c.Published, &c.Dead))
			return c
		},
		row: func(ctx context.Context, eventID string) outboxState {
			var s outboxState
			require.NoError(tb, pool.QueryRow(ctx, `SELECT attempts, dead, published_at IS NOT NULL, last_error
				FROM `+outbox+` WHERE event_id = $1`, eventID).Scan(&s.Attempts, &s.Dead, &s.Published, &s.LastError))
			return s
		},
		another: func(tb testing.TB) idemstore.OutboxRelayStore { return env.anotherFn(tb) },
	}
}

// randomHex returns n random bytes in hex.
func randomHex(tb testing.TB, n int) string {
	tb.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(tb, err)
	return hex.EncodeToString(b)
}

// ev builds an outgoing event.
func ev(id, key, topic string) idem.Outgoing {
	return idem.Outgoing{EventID: id, Tenant: "acme", Topic: topic, Key: key, Type: "order.paid",
		Payload: []byte(`{"id":"` + id + `"}`)}
}

// published is one message a recording sink received.
type published struct {
	relay string
	topic string
	msg   idem.Message
	// call numbers the Publish call the message came in.
	call  int
	start time.Time
	end   time.Time
}

// recSink records everything published through it, in order. fail, when set, is asked before
// each message is recorded; an error stops the call there (the messages before it count as
// published, as with a real broker).
type recSink struct {
	mu    sync.Mutex
	got   []published
	calls int
	fail  func(topic string, m idem.Message) error
	// after, when set, runs after a successful Publish call and may turn it into an error.
	after func(relay string) error
	// delay is how long each Publish call takes, like a broker's round trip.
	delay time.Duration
	// pipelined makes a failure not stop the call: the sink goes on storing the later
	// messages of the call and reports the failures at the end, as a broker client that sends
	// a batch before the first confirmation comes back does.
	pipelined bool
}

// as returns a sink that records under the given relay id.
func (s *recSink) as(relay string) idem.Sink { return relaySink{s: s, relay: relay} }

// Publish records as relay "".
func (s *recSink) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	return s.publish(ctx, "", topic, msgs)
}

// Close does nothing.
func (s *recSink) Close() error { return nil }

func (s *recSink) publish(ctx context.Context, relay, topic string, msgs []idem.Message) error {
	start := time.Now()
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.delay > 0 {
		time.Sleep(s.delay)
	}
	s.mu.Lock()
	s.calls++
	call := s.calls
	fail := s.fail
	after := s.after
	var errs []error
	for _, m := range msgs {
		if fail != nil {
			if err := fail(topic, m); err != nil {
				if s.pipelined {
					errs = append(errs, err)
					continue
				}
				s.mu.Unlock()
				return err
			}
		}
		s.got = append(s.got, published{relay: relay, topic: topic, msg: m, call: call, start: start, end: time.Now()})
	}
	s.mu.Unlock()
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if after != nil {
		return after(relay)
	}
	return nil
}

// setFail replaces the failure function.
func (s *recSink) setFail(f func(topic string, m idem.Message) error) {
	s.mu.Lock()
	s.fail = f
	s.mu.Unlock()
}

// all returns a copy of what was recorded.
func (s *recSink) all() []published {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]published(nil), s.got...)
}

// ids returns the event ids recorded, in order.
func (s *recSink) ids() []string {
	var out []string
	for _, p := range s.all() {
		out = append(out, p.msg.EventID)
	}
	return out
}

type relaySink struct {
	s     *recSink
	relay string
}

func (r relaySink) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	return r.s.publish(ctx, r.relay, topic, msgs)
}

func (r relaySink) Close() error { return nil }

// clock is a movable clock for the relay's Now.
type clock struct{ off atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *clock) Advance(d time.Duration) { c.off.Add(int64(d)) }

// fastRetry keeps retries in tests short.
var fastRetry = retry.Policy{MaxAttempts: 5, MaxElapsed: time.Minute, Base: 10 * time.Millisecond, Cap: 40 * time.Millisecond}

// logger discards relay logs unless IDEMRELAY_TEST_LOG is set.
func logger() *slog.Logger {
	if os.Getenv("IDEMRELAY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newRelay builds a relay with test-friendly defaults; mod adjusts the config.
// crashStore is a relay's store in a process that can die: once crashed, releasing a lease does
// nothing, as when the process was killed before it could give its partitions back.
type crashStore struct {
	idemstore.OutboxRelayStore
	crashed atomic.Bool
}

// crash marks the process dead: from now on its leases are only given up by expiry.
func (c *crashStore) crash() { c.crashed.Store(true) }

// LeaseRelease releases the lease unless the process has crashed.
func (c *crashStore) LeaseRelease(ctx context.Context, name, owner string) error {
	if c.crashed.Load() {
		return nil
	}
	return c.OutboxRelayStore.LeaseRelease(ctx, name, owner)
}

func newRelay(tb testing.TB, store idemstore.OutboxRelayStore, dlq idemstore.DeadLetterStore, sink idem.Sink, mod func(*idemrelay.Config)) *idemrelay.Relay {
	tb.Helper()
	cfg := idemrelay.Config{
		ID:           "relay-" + randomHex(tb, 4),
		PollInterval: 20 * time.Millisecond,
		LeaseTTL:     time.Second,
		Retry:        fastRetry,
		Logger:       logger(),
	}
	if mod != nil {
		mod(&cfg)
	}
	r, err := idemrelay.New(relayStore{store, dlq}, sink, cfg)
	require.NoError(tb, err)
	return r
}

// running is a relay whose Run goroutine the test controls.
type running struct {
	r      *idemrelay.Relay
	cancel context.CancelFunc
	done   chan error
}

// start runs r until stop (or the end of the test).
func start(tb testing.TB, r *idemrelay.Relay) *running {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rr := &running{r: r, cancel: cancel, done: make(chan error, 1)}
	go func() { rr.done <- r.Run(ctx) }()
	tb.Cleanup(func() { rr.stop(tb) })
	return rr
}

// stop cancels the relay and waits for Run to return (at most 10 s).
func (rr *running) stop(tb testing.TB) {
	tb.Helper()
	rr.cancel()
	select {
	case err, ok := <-rr.done:
		if ok {
			require.NoError(tb, err)
			close(rr.done)
		}
	case <-time.After(10 * time.Second):
		tb.Fatalf("relay %s did not stop within 10s", rr.r.ID())
	}
}

// eventually polls cond every 10 ms until it holds or timeout passes.
func eventually(tb testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v: %s", timeout, fmt.Sprintf(format, args...))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ctxT returns a context that ends after d or with the test.
func ctxT(tb testing.TB, d time.Duration) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

// drain calls RunOnce until it publishes nothing more (at most 100 rounds).
func drain(tb testing.TB, ctx context.Context, r *idemrelay.Relay) int {
	tb.Helper()
	total := 0
	for range 100 {
		n, err := r.RunOnce(ctx)
		require.NoError(tb, err)
		if n == 0 {
			return total
		}
		total += n
	}
	tb.Fatalf("relay still publishing after 100 rounds")
	return total
}

// relayStore joins a kit's outbox and dead-letter store (which a test may wrap apart) into the
// one store idemrelay.New takes.
type relayStore struct {
	idemstore.OutboxRelayStore
	idemstore.DeadLetterStore
}
