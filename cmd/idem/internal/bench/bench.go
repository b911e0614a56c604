// Package bench measures idem against its ceilings on PostgreSQL, side by side in one process
// against one database: the same business effect with no idem (baseline), the claim and effect
// SQL alone (ceiling), idem's per-event path, its batched path, and whole pipelines through the
// queue table and JetStream. The ratios between cases are the result; absolute numbers depend on
// the machine. `idem bench` and `go test -bench` both run it.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempg"
)

// Options configures a run.
type Options struct {
	// PostgresURL is the database to measure (required).
	PostgresURL string
	// NATSURL enables the JetStream pipeline case when set.
	NATSURL string
	// SQSURL enables the SQS pipeline case when set: an sqs://HOST:PORT?region=REGION broker URL.
	SQSURL string
	// Events is how many events each case processes at each concurrency (default 2000).
	Events int
	// Concurrency lists the worker counts (default 1, 4, 8, 16).
	Concurrency []int
	// BatchSizes lists the batched path's batch sizes (default 10, 100, 500).
	BatchSizes []int
	// Cases restricts the run to these case names (default all but large_inbox).
	Cases []string
	// LargeInboxClaims is how many claims the large_inbox case preloads (default 10,000,000).
	LargeInboxClaims int
	// OfferedRate is the outbox_e2e case's fixed offered rate in events/s (default 500), held for
	// OfferedSeconds (default 10).
	OfferedRate    int
	OfferedSeconds float64
	// Wallets spreads balance updates so that row locks do not serialise workers (default 1000).
	Wallets int
	// Logf reports progress (default discards).
	Logf func(format string, args ...any)
}

// WithDefaults fills zero fields.
func (o Options) WithDefaults() Options {
	if o.Events == 0 {
		o.Events = 2000
	}
	if len(o.Concurrency) == 0 {
		o.Concurrency = []int{1, 4, 8, 16}
	}
	if len(o.BatchSizes) == 0 {
		o.BatchSizes = []int{10, 100, 500}
	}
	if len(o.Cases) == 0 {
		o.Cases = []string{"baseline", "ceiling", "per_event", "batched", "pipeline_queue", "pipeline_jetstream", "pipeline_sqs", "outbox_e2e", "memory"}
	}
	if o.LargeInboxClaims == 0 {
		o.LargeInboxClaims = 10_000_000
	}
	if o.OfferedRate == 0 {
		o.OfferedRate = 500
	}
	if o.OfferedSeconds == 0 {
		o.OfferedSeconds = 10
	}
	if o.Wallets == 0 {
		o.Wallets = 1000
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return o
}

// Validate names the first bad option.
func (o Options) Validate() error {
	if o.PostgresURL == "" {
		return errors.New("bench: the PostgreSQL URL is empty (--store postgres://…)")
	}
	if o.Events < 1 {
		return fmt.Errorf("bench: --events %d: want at least 1", o.Events)
	}
	for _, c := range o.Concurrency {
		if c < 1 || c > 256 {
			return fmt.Errorf("bench: --concurrency %d: want 1..256", c)
		}
	}
	for _, b := range o.BatchSizes {
		if b < 1 || b > 10000 {
			return fmt.Errorf("bench: batch size %d: want 1..10000", b)
		}
	}
	known := map[string]bool{"baseline": true, "ceiling": true, "per_event": true, "batched": true, "pipeline_queue": true, "pipeline_jetstream": true, "pipeline_sqs": true, "outbox_e2e": true, "memory": true, "large_inbox": true}
	for _, c := range o.Cases {
		if !known[c] {
			return fmt.Errorf("bench: unknown case %q (known: baseline, ceiling, per_event, batched, large_inbox, pipeline_queue, pipeline_jetstream, pipeline_sqs, outbox_e2e, memory)", c)
		}
	}
	return nil
}

// Result is one measured case.
type Result struct {
	Case        string  `json:"case"`
	Store       string  `json:"store"`
	Inbox       string  `json:"inbox,omitempty"` // "plain" or "partitioned"
	Claims      int     `json:"existing_claims,omitempty"`
	Concurrency int     `json:"concurrency"`
	Batch       int     `json:"batch,omitempty"`
	Events      int     `json:"events"`
	Seconds     float64 `json:"seconds"`
	EventsPerS  float64 `json:"events_per_s"`
	P50MS       float64 `json:"p50_ms,omitempty"`
	P99MS       float64 `json:"p99_ms,omitempty"`
	AllocsPerEv float64 `json:"allocs_per_event,omitempty"`
	BytesPerEv  float64 `json:"bytes_per_event,omitempty"`
	HeapMiB     float64 `json:"steady_heap_mib,omitempty"`
	Goroutines  int     `json:"goroutines,omitempty"`
}

// Ratio is one target the issue sets, evaluated on a run's results.
type Ratio struct {
	Name   string  `json:"ratio"`
	Value  float64 `json:"value"`
	Target float64 `json:"target"`
	// Min means the value must be at least Target (else at most).
	Min bool `json:"min"`
	OK  bool `json:"ok"`
}

// env is one benchmark database: a fresh schema with idem's tables and the business tables.
type env struct {
	pool   *pgxpool.Pool
	schema string
	store  *idempg.Store
	opts   Options
	seq    atomic.Int64
	// pace, when set, makes pipeline offer one event per pace instead of publishing in bulk.
	pace time.Duration
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func newEnv(ctx context.Context, opts Options) (*env, error) {
	return newEnvWith(ctx, opts, idempg.PartitionConfig{})
}

// newEnvWith is newEnv with the inbox partitioned as part says (plain when part.Bucket is 0).
func newEnvWith(ctx context.Context, opts Options, part idempg.PartitionConfig) (*env, error) {
	cfg, err := pgxpool.ParseConfig(opts.PostgresURL)
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w", idem.RedactURL(opts.PostgresURL), err)
	}
	maxC := int32(4)
	for _, c := range opts.Concurrency {
		maxC = max(maxC, int32(c)+4)
	}
	cfg.MaxConns = maxC
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: connect: %w", err)
	}
	e := &env{pool: pool, schema: "idembench_" + randHex(4), opts: opts}
	if e.store, err = idempg.NewWithConfig(pool, idempg.Config{Schema: e.schema, Partition: part}); err != nil {
		pool.Close()
		return nil, err
	}
	if err := e.store.Migrate(ctx); err != nil {
		e.close()
		return nil, fmt.Errorf("bench: migrate: %w", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+e.schema+`.wallets (id int PRIMARY KEY, balance bigint NOT NULL);
		CREATE TABLE `+e.schema+`.ledger (id bigserial PRIMARY KEY, event_id text NOT NULL, wallet int NOT NULL, amount bigint NOT NULL);
		INSERT INTO `+e.schema+`.wallets SELECT g, 0 FROM generate_series(0, `+fmt.Sprint(opts.Wallets-1)+`) g`); err != nil {
		e.close()
		return nil, fmt.Errorf("bench: business tables: %w", err)
	}
	return e, nil
}

func (e *env) close() {
	_ = e.store.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = e.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+e.schema+" CASCADE")
	e.pool.Close()
}

// credit is the business effect every case applies: an append-only ledger row and a balance
// update, not idempotent by themselves.
func (e *env) credit(ctx context.Context, tx pgx.Tx, eventID string, wallet int) error {
	if _, err := tx.Exec(ctx, `INSERT INTO `+e.schema+`.ledger (event_id, wallet, amount) VALUES ($1, $2, 1)`, eventID, wallet); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, `UPDATE `+e.schema+`.wallets SET balance = balance + 1 WHERE id = $1`, wallet)
	if err != nil {
		return err
	}
	return idem.ExpectRows(tag.RowsAffected(), 1)
}

// messages makes n fresh events with distinct ids.
func (e *env) messages(n int) []idem.Message {
	now := time.Now().UTC()
	msgs := make([]idem.Message, n)
	for i := range msgs {
		id := e.seq.Add(1)
		msgs[i] = idem.Message{
			EventID: fmt.Sprintf("evt-%d", id), Tenant: "bench", Type: "payment.captured",
			Payload:    []byte(fmt.Sprintf(`{"wallet":%d,"amount":1,"order":"o-%d"}`, id%int64(e.opts.Wallets), id)),
			OccurredAt: now, Attempt: 1,
		}
	}
	return msgs
}

func walletOf(msg idem.Message, wallets int) int {
	// Payload is {"wallet":N,…}: cheap to parse without a decoder.
	s := string(msg.Payload)
	i := strings.Index(s, `"wallet":`)
	n := 0
	for j := i + 9; j < len(s) && s[j] >= '0' && s[j] <= '9'; j++ {
		n = n*10 + int(s[j]-'0')
	}
	return n % wallets
}

func (e *env) consumer(name string, batch int) (*idem.Consumer[pgx.Tx], error) {
	cfg := idem.ConsumerConfig[pgx.Tx]{
		Name: name,
		Handler: func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
			return e.credit(ctx, tx, msg.EventID, walletOf(msg, e.opts.Wallets))
		},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if batch > 1 {
		cfg.Batch = idem.BatchConfig{Enabled: true, Size: batch}
	}
	return idem.NewConsumer(e.store, cfg)
}

// parallel splits msgs over workers, each taking chunks of size chunk, and times the whole.
func parallel(ctx context.Context, msgs []idem.Message, workers, chunk int, fn func(ctx context.Context, part []idem.Message) error) (time.Duration, error) {
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(int64(chunk))) - chunk
				if i >= len(msgs) {
					return
				}
				if err := fn(ctx, msgs[i:min(i+chunk, len(msgs))]); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start), firstErr
}

func result(name string, conc, batch, n int, d time.Duration) Result {
	return Result{Case: name, Store: "postgres", Concurrency: conc, Batch: batch, Events: n, Seconds: d.Seconds(), EventsPerS: float64(n) / d.Seconds()}
}

// Run measures the chosen cases and returns one result per case and setting.
func Run(ctx context.Context, opts Options) ([]Result, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	e, err := newEnv(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer e.close()
	want := func(c string) bool { return slices.Contains(opts.Cases, c) }
	var out []Result
	add := func(r Result, err error) error {
		if err != nil {
			return err
		}
		opts.Logf("%-18s c=%-3d batch=%-4d %9.0f events/s", r.Case, r.Concurrency, r.Batch, r.EventsPerS)
		out = append(out, r)
		return nil
	}
	for _, conc := range opts.Concurrency {
		if want("baseline") {
			if err := add(e.baseline(ctx, conc)); err != nil {
				return out, err
			}
		}
		if want("ceiling") {
			if err := add(e.ceiling(ctx, conc)); err != nil {
				return out, err
			}
		}
		if want("per_event") {
			if err := add(e.perEvent(ctx, conc, "per_event")); err != nil {
				return out, err
			}
		}
		if want("batched") {
			for _, b := range opts.BatchSizes {
				if err := add(e.batched(ctx, conc, b, "batched")); err != nil {
					return out, err
				}
			}
		}
	}
	if want("memory") {
		if err := add(e.memory(ctx)); err != nil {
			return out, err
		}
	}
	if want("pipeline_queue") {
		for _, batch := range []int{0, 100} {
			if err := add(e.pipelineQueue(ctx, 8, batch)); err != nil {
				return out, err
			}
		}
	}
	if want("pipeline_jetstream") && opts.NATSURL != "" {
		for _, batch := range []int{0, 100} {
			if err := add(e.pipelineJetStream(ctx, 8, batch)); err != nil {
				return out, err
			}
		}
	}
	if want("pipeline_sqs") && opts.SQSURL != "" {
		for _, batch := range []int{0, 100} {
			if err := add(e.pipelineSQS(ctx, 8, batch)); err != nil {
				return out, err
			}
		}
	}
	if want("outbox_e2e") && opts.NATSURL != "" {
		if err := add(e.outboxE2E(ctx, opts.OfferedRate, opts.OfferedSeconds)); err != nil {
			return out, err
		}
	}
	if want("large_inbox") {
		rs, err := e.largeInbox(ctx)
		for _, r := range rs {
			_ = add(r, nil)
		}
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

func (e *env) baseline(ctx context.Context, conc int) (Result, error) {
	msgs := e.messages(e.opts.Events)
	d, err := parallel(ctx, msgs, conc, 1, func(ctx context.Context, part []idem.Message) error {
		return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			return e.credit(ctx, tx, part[0].EventID, walletOf(part[0], e.opts.Wallets))
		})
	})
	return result("baseline", conc, 0, len(msgs), d), err
}

func (e *env) ceiling(ctx context.Context, conc int) (Result, error) {
	msgs := e.messages(e.opts.Events)
	claim := `INSERT INTO ` + e.schema + `.idem_claims (tenant, consumer, event_id, fingerprint, created_at)
		VALUES ($1, 'ceiling@v1', $2, $3, now()) ON CONFLICT DO NOTHING RETURNING true`
	fp := make([]byte, 32)
	d, err := parallel(ctx, msgs, conc, 1, func(ctx context.Context, part []idem.Message) error {
		return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			var ok bool
			if err := tx.QueryRow(ctx, claim, part[0].Tenant, part[0].EventID, fp).Scan(&ok); err != nil {
				return err
			}
			return e.credit(ctx, tx, part[0].EventID, walletOf(part[0], e.opts.Wallets))
		})
	})
	return result("ceiling", conc, 0, len(msgs), d), err
}

func (e *env) perEvent(ctx context.Context, conc int, name string) (Result, error) {
	c, err := e.consumer("ledger@v1", 0)
	if err != nil {
		return Result{}, err
	}
	msgs := e.messages(e.opts.Events)
	d, err := parallel(ctx, msgs, conc, 1, func(ctx context.Context, part []idem.Message) error {
		r, err := c.Process(ctx, part[0])
		if err == nil && r.Outcome != idem.OutcomeProcessed {
			err = fmt.Errorf("event %s: outcome %s", part[0].EventID, r.Outcome)
		}
		return err
	})
	return result(name, conc, 0, len(msgs), d), err
}

func (e *env) batched(ctx context.Context, conc, batch int, name string) (Result, error) {
	c, err := e.consumer("ledger@v1", batch)
	if err != nil {
		return Result{}, err
	}
	n := max(e.opts.Events, conc*batch*2)
	msgs := e.messages(n)
	d, err := parallel(ctx, msgs, conc, batch, func(ctx context.Context, part []idem.Message) error {
		for _, r := range c.ProcessBatch(ctx, part) {
			if r.Outcome != idem.OutcomeProcessed {
				return fmt.Errorf("batched: outcome %s: %v", r.Outcome, r.Err)
			}
		}
		return nil
	})
	return result(name, conc, batch, len(msgs), d), err
}

// memory measures allocations per processed event on the per-event and batched paths.
func (e *env) memory(ctx context.Context) (Result, error) {
	c, err := e.consumer("ledger@v1", 100)
	if err != nil {
		return Result{}, err
	}
	msgs := e.messages(max(e.opts.Events, 1000))
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	for i := 0; i < len(msgs); i += 100 {
		for _, r := range c.ProcessBatch(ctx, msgs[i:min(i+100, len(msgs))]) {
			if r.Outcome != idem.OutcomeProcessed {
				return Result{}, fmt.Errorf("memory: outcome %s: %v", r.Outcome, r.Err)
			}
		}
	}
	d := time.Since(start)
	runtime.ReadMemStats(&after)
	r := result("memory_batched", 1, 100, len(msgs), d)
	r.AllocsPerEv = float64(after.Mallocs-before.Mallocs) / float64(len(msgs))
	r.BytesPerEv = float64(after.TotalAlloc-before.TotalAlloc) / float64(len(msgs))
	return r, nil
}

// percentiles returns p50 and p99 of ds in milliseconds.
func percentiles(ds []time.Duration) (p50, p99 float64) {
	if len(ds) == 0 {
		return 0, 0
	}
	slices.Sort(ds)
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(ds)))) - 1
		return float64(ds[max(i, 0)].Microseconds()) / 1000
	}
	return at(0.50), at(0.99)
}

// Ratios evaluates the targets on results of one run.
func Ratios(rs []Result) []Ratio {
	find := func(name string, conc, batch int) (Result, bool) {
		for _, r := range rs {
			if r.Case == name && r.Concurrency == conc && r.Batch == batch {
				return r, true
			}
		}
		return Result{}, false
	}
	var out []Ratio
	ratio := func(name string, a, b Result, okA, okB bool, target float64, isMin bool) {
		if !okA || !okB || b.EventsPerS == 0 {
			return
		}
		v := a.EventsPerS / b.EventsPerS
		out = append(out, Ratio{Name: name, Value: v, Target: target, Min: isMin, OK: (isMin && v >= target) || (!isMin && v <= target)})
	}
	pe, ok1 := find("per_event", 8, 0)
	ce, ok2 := find("ceiling", 8, 0)
	ratio("per_event / ceiling (8 workers)", pe, ce, ok1, ok2, 0.85, true)
	ba, ok3 := find("batched", 8, 100)
	ratio("batched(100) / per_event (8 workers)", ba, pe, ok3, ok1, 10, true)
	bl, ok4 := find("baseline", 8, 0)
	ratio("per_event / baseline (8 workers)", pe, bl, ok1, ok4, 0.8, true)
	for _, inbox := range []string{"plain", "partitioned"} {
		var large, empty Result
		var okL, okE bool
		for _, r := range rs {
			if r.Case == "large_inbox" && r.Inbox == inbox && r.Batch == 0 {
				if r.Claims > 0 {
					large, okL = r, true
				} else {
					empty, okE = r, true
				}
			}
		}
		ratio("large_inbox / empty inbox per_event ("+inbox+")", large, empty, okL, okE, 0.85, true)
	}
	for _, r := range rs {
		if r.AllocsPerEv > 0 && r.Batch > 0 {
			out = append(out, Ratio{Name: "allocations per event (batched)", Value: r.AllocsPerEv, Target: 40, Min: false, OK: r.AllocsPerEv <= 40})
		}
	}
	return out
}
