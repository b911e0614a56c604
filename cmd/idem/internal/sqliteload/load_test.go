package sqliteload

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemsqlite"
)

// The environment of a role process.
const (
	envRole   = "IDEM_SQLITELOAD_ROLE"   // producer, relay or consumer
	envDB     = "IDEM_SQLITELOAD_DB"     // the SQLite file
	envStart  = "IDEM_SQLITELOAD_START"  // unix nanoseconds when work starts
	envEnd    = "IDEM_SQLITELOAD_END"    // unix nanoseconds when work stops
	envResult = "IDEM_SQLITELOAD_RESULT" // where the role writes its result (JSON)
)

// The load.
const (
	loadDuration  = 20 * time.Second
	startDelay    = 1500 * time.Millisecond // for the processes to start and migrate
	backlog       = 8000                    // jobs queued before the start
	produceEvery  = 10 * time.Millisecond   // the producer offers 100 orders/s
	handlerHold   = 2 * time.Millisecond    // time each handler spends inside its transaction
	consumerName  = "orders@v1"
	topic         = "orders"
	progressFloor = 2 * time.Second // every role makes progress in every window this long
)

func TestMain(m *testing.M) {
	if role := os.Getenv(envRole); role != "" {
		if err := runRole(role); err != nil {
			fmt.Fprintf(os.Stderr, "sqliteload %s: %v\n", role, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// result is what a role process reports.
type result struct {
	Role string
	// PerSecond counts the role's units of progress (orders committed, rows published, events
	// processed) in each second since the start.
	PerSecond []int
	// Errors are the errors the role's caller saw (the producer's InTx) or that were logged at
	// warning level or above (relay and consumer), at most maxErrors of them.
	Errors []string
	// ErrorCount counts all of them; Busy counts those that were SQLITE_BUSY.
	ErrorCount, Busy int
}

const maxErrors = 10

// recorder collects a role's progress and errors; safe for concurrent use.
type recorder struct {
	start time.Time
	mu    sync.Mutex
	res   result
}

func (r *recorder) progress(n int) {
	sec := int(time.Since(r.start) / time.Second)
	if sec < 0 || sec >= int(loadDuration/time.Second) {
		return
	}
	r.mu.Lock()
	r.res.PerSecond[sec] += n
	r.mu.Unlock()
}

func (r *recorder) fail(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.res.ErrorCount++
	if strings.Contains(msg, "SQLITE_BUSY") || strings.Contains(msg, "database is locked") {
		r.res.Busy++
	}
	if len(r.res.Errors) < maxErrors {
		r.res.Errors = append(r.res.Errors, msg)
	}
}

// logHandler turns every record at warning level or above into a recorder failure.
type logHandler struct {
	rec   *recorder
	attrs []slog.Attr
}

func (h *logHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *logHandler) Handle(_ context.Context, r slog.Record) error {
	var b bytes.Buffer
	th := slog.NewTextHandler(&b, nil).WithAttrs(h.attrs)
	if err := th.Handle(context.Background(), r); err != nil {
		return err
	}
	h.rec.fail(strings.TrimSpace(b.String()))
	return nil
}

func (h *logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &logHandler{rec: h.rec, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h *logHandler) WithGroup(string) slog.Handler { return h }

// runRole is the body of a role process: open the database as a service would (Open, New,
// Migrate), wait for the common start, work until the common end, write the result.
func runRole(role string) error {
	start, err := unixNanos(envStart)
	if err != nil {
		return err
	}
	end, err := unixNanos(envEnd)
	if err != nil {
		return err
	}
	db, err := idemsqlite.Open(os.Getenv(envDB))
	if err != nil {
		return err
	}
	defer db.Close()
	store := idemsqlite.New(db)
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	if err := store.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	rec := &recorder{start: start, res: result{Role: role, PerSecond: make([]int, int(loadDuration/time.Second))}}
	logger := slog.New(&logHandler{rec: rec})
	time.Sleep(time.Until(start))

	switch role {
	case "producer":
		produce(ctx, store, rec)
	case "relay":
		err = relay(ctx, store, rec, logger)
	case "consumer":
		err = consume(ctx, store, rec, logger)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		return err
	}
	b, err := json.Marshal(rec.res)
	if err != nil {
		return err
	}
	return os.WriteFile(os.Getenv(envResult), b, 0o600)
}

func unixNanos(env string) (time.Time, error) {
	n, err := strconv.ParseInt(os.Getenv(env), 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", env, err)
	}
	return time.Unix(0, n), nil
}

// produce offers one order every produceEvery: the order row and its outbox row in one
// transaction. A tick missed while a transaction waits is dropped, not caught up.
func produce(ctx context.Context, store *idemsqlite.Store, rec *recorder) {
	t := time.NewTicker(produceEvery)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		id := "o" + strconv.Itoa(n)
		err := store.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (?)`, id); err != nil {
				return err
			}
			return store.EnqueueTx(ctx, tx, idem.Outgoing{EventID: "order-" + id, Topic: topic, Key: id,
				Type: "order.placed", Payload: []byte(`{}`)})
		})
		switch {
		case err == nil:
			rec.progress(1)
		case ctx.Err() != nil:
			return // the end of the run, not a failure
		default:
			rec.fail(err.Error())
		}
	}
}

// relayObserver counts published rows as progress.
type relayObserver struct{ rec *recorder }

func (o relayObserver) Published(_ string, n int, _ time.Duration) { o.rec.progress(n) }
func (o relayObserver) PublishFailed(string, idem.Class, bool)     {}

// relay runs an idemrelay over the queue-table sink, as `idem relay --broker sql` does.
func relay(ctx context.Context, store *idemsqlite.Store, rec *recorder, logger *slog.Logger) error {
	r, err := idemrelay.New(store, store, idemqueue.NewSink(store), idemrelay.Config{
		ID: "load-relay", PollInterval: 50 * time.Millisecond, Logger: logger, Observer: relayObserver{rec},
	})
	if err != nil {
		return err
	}
	if err := r.Run(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		rec.fail("relay run: " + err.Error())
	}
	return nil
}

// consumerObserver counts processed events as progress.
type consumerObserver struct{ rec *recorder }

func (o consumerObserver) Observe(ev idem.Event) {
	if ev.Outcome == idem.OutcomeProcessed {
		o.rec.progress(1)
	}
}

func (o consumerObserver) Paused(consumer string) { o.rec.fail("consumer " + consumer + " paused") }

// consume runs a consumer over the queue table whose handler records the event in an
// append-only table (no unique key: only idem keeps it single) and then spends handlerHold in
// its transaction.
func consume(ctx context.Context, store *idemsqlite.Store, rec *recorder, logger *slog.Logger) error {
	c, err := idem.NewConsumer(store, idem.ConsumerConfig[*sql.Tx]{
		Name: consumerName,
		Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO applied (event_id) VALUES (?)`, msg.EventID); err != nil {
				return err
			}
			time.Sleep(handlerHold)
			return nil
		},
		Workers:         4,
		ShutdownTimeout: 2 * time.Second,
		Logger:          logger,
		Observer:        consumerObserver{rec},
	})
	if err != nil {
		return err
	}
	src, err := idemqueue.NewSource[*sql.Tx](store, idemqueue.SourceConfig{Queue: topic, MaxWait: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	if err := c.Run(ctx, src); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		rec.fail("consumer run: " + err.Error())
	}
	return nil
}

// TestThreeProcesses runs producer, relay and consumer as three processes of this test binary
// on one SQLite file with a backlog of queued jobs, for loadDuration. Each must make progress in
// every progressFloor window and see no SQLITE_BUSY; afterwards the database must show no event
// applied twice and none lost (each order's event is still in the outbox, in the queue or
// applied; each queued job of the backlog in the queue or applied).
func TestThreeProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("a 20 s load test; not in -short")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "load.db")
	seed(t, path)

	start := time.Now().Add(startDelay)
	end := start.Add(loadDuration)
	roles := []string{"producer", "relay", "consumer"}
	var (
		wg      sync.WaitGroup
		failed  atomic.Bool
		outputs = make([]bytes.Buffer, len(roles))
	)
	for i, role := range roles {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(),
			envRole+"="+role, envDB+"="+path,
			envStart+"="+strconv.FormatInt(start.UnixNano(), 10),
			envEnd+"="+strconv.FormatInt(end.UnixNano(), 10),
			envResult+"="+filepath.Join(dir, role+".json"))
		cmd.Stdout = io.Discard
		cmd.Stderr = &outputs[i]
		require.NoError(t, cmd.Start())
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cmd.Wait(); err != nil {
				failed.Store(true)
			}
		}()
	}
	wg.Wait()
	for i, role := range roles {
		require.False(t, failed.Load(), "a role process failed; %s said: %s", role, outputs[i].String())
	}

	for _, role := range roles {
		b, err := os.ReadFile(filepath.Join(dir, role+".json"))
		require.NoError(t, err)
		var res result
		require.NoError(t, json.Unmarshal(b, &res))
		total, low := 0, -1
		for _, n := range res.PerSecond {
			total += n
			if low < 0 || n < low {
				low = n
			}
		}
		t.Logf("%-8s %6d in %s: %.0f/s, slowest second %d; per second %v; %d errors",
			role, total, loadDuration, float64(total)/loadDuration.Seconds(), low, res.PerSecond, res.ErrorCount)
		require.Zero(t, res.Busy, "%s saw SQLITE_BUSY: %q", role, res.Errors)
		require.Zero(t, res.ErrorCount, "%s saw errors: %q", role, res.Errors)
		w := int(progressFloor / time.Second)
		for s := 0; s+w <= len(res.PerSecond); s++ {
			sum := 0
			for _, n := range res.PerSecond[s : s+w] {
				sum += n
			}
			require.Positive(t, sum, "%s made no progress in seconds %d to %d: %v", role, s, s+w, res.PerSecond)
		}
	}
	check(t, path)
}

// seed creates the schema, the business tables and the backlog.
func seed(t *testing.T, path string) {
	t.Helper()
	ctx := context.Background()
	db, err := idemsqlite.Open(path)
	require.NoError(t, err)
	defer db.Close()
	store := idemsqlite.New(db)
	require.NoError(t, store.Migrate(ctx))
	_, err = db.ExecContext(ctx, `
		CREATE TABLE orders (id TEXT PRIMARY KEY);
		CREATE TABLE applied (id INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL);
		CREATE TABLE seeded (event_id TEXT PRIMARY KEY);`)
	require.NoError(t, err)
	msgs := make([]idem.Message, backlog)
	for i := range msgs {
		msgs[i] = idem.Message{EventID: "seed-" + strconv.Itoa(i), Type: "order.placed", Payload: []byte(`{}`)}
	}
	require.NoError(t, store.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		for _, m := range msgs {
			if _, err := tx.ExecContext(ctx, `INSERT INTO seeded (event_id) VALUES (?)`, m.EventID); err != nil {
				return err
			}
		}
		return store.QueuePublishTx(ctx, tx, topic, msgs...)
	}))
}

// check reads the database after the run: nothing applied twice, nothing lost.
func check(t *testing.T, path string) {
	t.Helper()
	ctx := context.Background()
	db, err := idemsqlite.Open(path)
	require.NoError(t, err)
	defer db.Close()
	// Indexes for the checks below (each probes the queue and the applied table by event id).
	_, err = db.ExecContext(ctx, `CREATE INDEX load_queue_event ON idem_queue (event_id);
		CREATE INDEX load_applied_event ON applied (event_id)`)
	require.NoError(t, err)
	count := func(query string) int {
		var n int
		require.NoError(t, db.QueryRowContext(ctx, query).Scan(&n), query)
		return n
	}
	require.Equal(t, "ok", func() string {
		var s string
		require.NoError(t, db.QueryRowContext(ctx, `PRAGMA integrity_check`).Scan(&s))
		return s
	}())
	require.Zero(t, count(`SELECT count(*) FROM (SELECT event_id FROM applied GROUP BY event_id HAVING count(*) > 1)`),
		"events applied twice")
	require.Equal(t, count(`SELECT count(DISTINCT event_id) FROM applied`),
		count(`SELECT count(*) FROM idem_claims WHERE consumer = '`+consumerName+`'`),
		"every applied event has its claim, and no claim lacks its effect")
	require.Equal(t, count(`SELECT count(*) FROM orders`),
		count(`SELECT count(*) FROM idem_outbox WHERE topic = '`+topic+`'`), "every order has its outbox row")
	lostOrders := count(`SELECT count(*) FROM idem_outbox o WHERE o.published_at IS NOT NULL
		AND NOT EXISTS (SELECT 1 FROM idem_queue q WHERE q.event_id = o.event_id)
		AND NOT EXISTS (SELECT 1 FROM applied a WHERE a.event_id = o.event_id)`)
	require.Zero(t, lostOrders, "published order events neither queued nor applied")
	lostSeeds := count(`SELECT count(*) FROM seeded s
		WHERE NOT EXISTS (SELECT 1 FROM idem_queue q WHERE q.event_id = s.event_id)
		AND NOT EXISTS (SELECT 1 FROM applied a WHERE a.event_id = s.event_id)`)
	require.Zero(t, lostSeeds, "backlog jobs neither queued nor applied")
	t.Logf("after the run: %d orders, %d published, %d applied (%d of the backlog), %d jobs queued",
		count(`SELECT count(*) FROM orders`),
		count(`SELECT count(*) FROM idem_outbox WHERE published_at IS NOT NULL`),
		count(`SELECT count(*) FROM applied`),
		count(`SELECT count(*) FROM applied WHERE event_id LIKE 'seed-%'`),
		count(`SELECT count(*) FROM idem_queue`))
}
