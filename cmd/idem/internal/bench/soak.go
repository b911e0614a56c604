package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/idemredact"
	"github.com/idemkit/idem/idemrelay"
)

// SoakOptions configures a soak: the payments path (producer transaction with outbox row,
// relay to JetStream, consumer with 8 workers) at a steady offered rate for a long time.
type SoakOptions struct {
	PostgresURL, NATSURL string
	// Rate is the offered rate in events/s (default 200).
	Rate int
	// Duration is how long events are offered (default 10 minutes).
	Duration time.Duration
	// Sample is how often memory and goroutines are sampled (default 10 s).
	Sample time.Duration
	// Logf reports progress (default discards).
	Logf func(format string, args ...any)
}

// SoakSample is one reading of the process during a soak.
type SoakSample struct {
	At         float64 `json:"at_s"`
	Processed  int64   `json:"processed"`
	HeapMiB    float64 `json:"heap_mib"`
	Goroutines int     `json:"goroutines"`
}

// SoakReport is what a soak measured. BooksBalance is computed from the database: every event
// has exactly one ledger row and the balances add up to the number of events.
type SoakReport struct {
	Events       int          `json:"events"`
	Seconds      float64      `json:"seconds"`
	EventsPerS   float64      `json:"events_per_s"`
	HandlingP99  float64      `json:"handling_p99_ms"`
	LatencyP50   float64      `json:"latency_p50_ms"`
	LatencyP99   float64      `json:"latency_p99_ms"`
	Samples      []SoakSample `json:"samples"`
	DoubleApply  int64        `json:"double_applied"`
	Lost         int64        `json:"lost"`
	BooksBalance bool         `json:"books_balance"`
}

type soakObserver struct {
	mu       sync.Mutex
	handling []time.Duration
	latency  []time.Duration
	started  map[string]time.Time
	count    int64
}

func (o *soakObserver) Observe(ev idem.Observation) {
	if ev.Outcome != idem.OutcomeProcessed {
		return
	}
	now := time.Now()
	o.mu.Lock()
	o.handling = append(o.handling, ev.Duration)
	if t, ok := o.started[ev.EventID]; ok {
		o.latency = append(o.latency, now.Sub(t))
		delete(o.started, ev.EventID)
	}
	o.count++
	o.mu.Unlock()
}

func (o *soakObserver) Paused(string) {}

// Soak runs the soak and reports. It stops early when ctx ends.
func Soak(ctx context.Context, so SoakOptions) (SoakReport, error) {
	if so.Rate == 0 {
		so.Rate = 200
	}
	if so.Duration == 0 {
		so.Duration = 10 * time.Minute
	}
	if so.Sample == 0 {
		so.Sample = 10 * time.Second
	}
	if so.Logf == nil {
		so.Logf = func(string, ...any) {}
	}
	if so.NATSURL == "" {
		return SoakReport{}, errors.New("soak: the NATS URL is empty")
	}
	opts := Options{PostgresURL: so.PostgresURL, NATSURL: so.NATSURL, Concurrency: []int{8}}.WithDefaults()
	e, err := newEnv(ctx, opts)
	if err != nil {
		return SoakReport{}, err
	}
	defer e.close()
	nc, err := nats.Connect(so.NATSURL)
	if err != nil {
		return SoakReport{}, fmt.Errorf("soak: connect to %s: %w", idemredact.URL(so.NATSURL), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return SoakReport{}, err
	}
	id := randHex(4)
	stream, subject := "IDEMSOAK_"+strings.ToUpper(id), "idemsoak."+id
	if _, err := idemnats.EnsureStream(ctx, js, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}, Storage: jetstream.FileStorage, MaxAge: 24 * time.Hour}); err != nil {
		return SoakReport{}, err
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), stream) }()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	relay, err := idemrelay.New(e.store, idemnats.NewSink(js), idemrelay.Config{Logger: quiet, Topic: func(idem.Outgoing) string { return subject }})
	if err != nil {
		return SoakReport{}, err
	}
	src, err := idemnats.NewSource(ctx, js, idemnats.SourceConfig{Stream: stream, Durable: "soak", MaxWait: time.Second})
	if err != nil {
		return SoakReport{}, err
	}
	defer func() { _ = src.Close() }()
	obs := &soakObserver{started: map[string]time.Time{}}
	c, err := idem.NewConsumer(e.store, idem.ConsumerConfig[pgx.Tx]{
		Name: "soak@v1", Workers: 8,
		Handler: func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
			return e.credit(ctx, tx, msg.EventID, walletOf(msg, e.opts.Wallets))
		},
		Observe: idem.ObserveConfig{
			Observer: obs,
			Logger:   quiet,
		},
	})
	if err != nil {
		return SoakReport{}, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = relay.Run(runCtx) }()
	go func() { defer wg.Done(); _ = c.Run(runCtx, src) }()

	var rep SoakReport
	sample := func(start time.Time) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		obs.mu.Lock()
		n := obs.count
		obs.mu.Unlock()
		s := SoakSample{At: time.Since(start).Seconds(), Processed: n, HeapMiB: float64(ms.HeapInuse) / (1 << 20), Goroutines: runtime.NumGoroutine()}
		rep.Samples = append(rep.Samples, s)
		so.Logf("soak: %6.0fs processed %d heap %.1f MiB goroutines %d", s.At, s.Processed, s.HeapMiB, s.Goroutines)
	}
	start := time.Now()
	sample(start)
	pace := time.Second / time.Duration(so.Rate)
	next, lastSample := start, start
	for time.Since(start) < so.Duration && ctx.Err() == nil {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		next = next.Add(pace)
		m := e.messages(1)[0]
		obs.mu.Lock()
		obs.started[m.EventID] = time.Now()
		obs.mu.Unlock()
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			return e.store.EnqueueTx(ctx, tx, idem.Outgoing{EventID: m.EventID, Tenant: m.Tenant, Topic: "payments", Key: m.EventID, Type: m.Type, Payload: m.Payload, OccurredAt: time.Now()})
		})
		if err != nil {
			return rep, fmt.Errorf("soak: produce event %s: %w", m.EventID, err)
		}
		rep.Events++
		if time.Since(lastSample) >= so.Sample {
			lastSample = time.Now()
			sample(start)
		}
	}
	// Drain, then read the books.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		obs.mu.Lock()
		n := obs.count
		obs.mu.Unlock()
		if n >= int64(rep.Events) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	rep.Seconds = time.Since(start).Seconds()
	sample(start)
	stop()
	wg.Wait()
	obs.mu.Lock()
	_, rep.HandlingP99 = percentiles(obs.handling)
	rep.LatencyP50, rep.LatencyP99 = percentiles(obs.latency)
	rep.EventsPerS = float64(obs.count) / rep.Seconds
	obs.mu.Unlock()
	var ledger, distinct, balance int64
	if err := e.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM `+e.schema+`.ledger`).Scan(&ledger, &distinct); err != nil {
		return rep, err
	}
	if err := e.pool.QueryRow(ctx, `SELECT coalesce(sum(balance), 0) FROM `+e.schema+`.wallets`).Scan(&balance); err != nil {
		return rep, err
	}
	rep.DoubleApply = ledger - distinct
	rep.Lost = int64(rep.Events) - distinct
	rep.BooksBalance = rep.DoubleApply == 0 && rep.Lost == 0 && balance == int64(rep.Events)
	return rep, nil
}
