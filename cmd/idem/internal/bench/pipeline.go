package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemredact"
)

// latencies is an idem.Observer that records, for each processed event, the time from its
// publish to the consumer's commit, and counts processed events.
type latencies struct {
	mu        sync.Mutex
	published map[string]time.Time
	lat       []time.Duration
	processed atomic.Int64
	done      chan struct{}
	want      int64
}

func (l *latencies) publishedAt(id string, t time.Time) {
	l.mu.Lock()
	l.published[id] = t
	l.mu.Unlock()
}

func (l *latencies) Observe(ev idem.Observation) {
	if ev.Outcome != idem.OutcomeProcessed {
		return
	}
	now := time.Now()
	l.mu.Lock()
	if t, ok := l.published[ev.EventID]; ok {
		l.lat = append(l.lat, now.Sub(t))
	}
	l.mu.Unlock()
	if l.processed.Add(1) == l.want {
		close(l.done)
	}
}

func (l *latencies) Paused(string) {}

// pipeline publishes n events through sink (in chunks, as a producer would) while a consumer
// with workers runs over src, and measures throughput, latency and the steady-state heap.
func (e *env) pipeline(ctx context.Context, name string, workers, batch int, src idem.Source, publish func(ctx context.Context, msgs []idem.Message) error, events ...int) (Result, error) {
	n := e.opts.Events
	if len(events) > 0 {
		n = events[0]
	}
	lat := &latencies{published: make(map[string]time.Time, n), done: make(chan struct{}), want: int64(n)}
	cfg := idem.ConsumerConfig[pgx.Tx]{
		Name:    "pipeline@v1",
		Workers: workers,
		Handler: func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
			return e.credit(ctx, tx, msg.EventID, walletOf(msg, e.opts.Wallets))
		},
		Observe: idem.ObserveConfig{
			Observer: lat,
			Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		},
	}
	if batch > 1 {
		cfg.Batch = idem.BatchConfig{Enabled: true, Size: batch}
	}
	c, err := idem.NewConsumer(e.store, cfg)
	if err != nil {
		return Result{}, err
	}
	return e.drive(ctx, name, workers, batch, n, lat, c, src, publish)
}

// runnable is a consumer over any store's transactions, as drive runs it.
type runnable interface {
	Run(ctx context.Context, src idem.Source) error
}

// drive runs c over src while publishing n events through publish, and measures what pipeline
// reports; c must report to lat.
func (e *env) drive(ctx context.Context, name string, workers, batch, n int, lat *latencies, c runnable, src idem.Source, publish func(ctx context.Context, msgs []idem.Message) error) (Result, error) {
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(runCtx, src) }()

	var heapSum, heapN uint64
	sampleDone := make(chan struct{})
	go func() {
		defer close(sampleDone)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
				runtime.ReadMemStats(&ms)
				heapSum += ms.HeapInuse
				heapN++
			}
		}
	}()

	msgs := e.messages(n)
	start := time.Now()
	nextAt := start
	for i := 0; i < n; i += 200 {
		part := msgs[i:min(i+200, n)]
		now := time.Now()
		for _, m := range part {
			lat.publishedAt(m.EventID, now)
		}
		if e.pace > 0 {
			// A fixed offered rate: each event's clock starts when its producer transaction
			// begins.
			for _, m := range part {
				if d := time.Until(nextAt); d > 0 {
					time.Sleep(d)
				}
				nextAt = nextAt.Add(e.pace)
				lat.publishedAt(m.EventID, time.Now())
				if err := publish(ctx, []idem.Message{m}); err != nil {
					return Result{}, fmt.Errorf("%s: publish: %w", name, err)
				}
			}
			continue
		}
		if err := publish(ctx, part); err != nil {
			return Result{}, fmt.Errorf("%s: publish: %w", name, err)
		}
	}
	select {
	case <-lat.done:
	case err := <-runErr:
		return Result{}, fmt.Errorf("%s: consumer stopped: %v", name, err)
	case <-time.After(5 * time.Minute):
		return Result{}, fmt.Errorf("%s: %d of %d events processed after 5 minutes", name, lat.processed.Load(), n)
	}
	d := time.Since(start)
	goroutines := runtime.NumGoroutine()
	stop()
	<-runErr
	<-sampleDone
	r := result(name, workers, batch, n, d)
	lat.mu.Lock()
	r.P50MS, r.P99MS = percentiles(lat.lat)
	lat.mu.Unlock()
	if heapN > 0 {
		r.HeapMiB = float64(heapSum/heapN) / (1 << 20)
	}
	r.Goroutines = goroutines
	return r, nil
}

func (e *env) pipelineQueue(ctx context.Context, workers, batch int) (Result, error) {
	queue := "bench_" + randHex(4)
	src, err := idemqueue.NewSource(e.store, idemqueue.SourceConfig{Queue: queue})
	if err != nil {
		return Result{}, err
	}
	// Close waits for a fetch ahead still under way and gives back the jobs it holds, so none
	// runs into the next case or the schema's drop.
	defer func() { _ = src.Close() }()
	return e.pipeline(ctx, "pipeline_queue", workers, batch, src, func(ctx context.Context, msgs []idem.Message) error {
		return e.store.QueuePublish(ctx, queue, msgs...)
	})
}

func (e *env) pipelineJetStream(ctx context.Context, workers, batch int) (Result, error) {
	nc, err := nats.Connect(e.opts.NATSURL)
	if err != nil {
		return Result{}, fmt.Errorf("pipeline_jetstream: connect to %s: %w", idemredact.URL(e.opts.NATSURL), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return Result{}, err
	}
	id := randHex(4)
	stream, subject := "IDEMBENCH_"+strings.ToUpper(id), "idembench."+id
	if _, err := idemnats.EnsureStream(ctx, js, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}, Storage: jetstream.FileStorage, MaxAge: time.Hour}); err != nil { // bounded: Run refuses an unbounded redelivery window
		return Result{}, err
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), stream) }()
	// Fetch ahead and acks without a confirmation round trip: both opt-in (see
	// idemnats.SourceConfig), both keep the ack after the commit.
	src, err := idemnats.NewSource(ctx, js, idemnats.SourceConfig{Stream: stream, Durable: "bench", MaxWait: time.Second, Prefetch: 16, AsyncAck: true})
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = src.Close() }()
	sink := idemnats.NewSink(js)
	return e.pipeline(ctx, "pipeline_jetstream", workers, batch, src, func(ctx context.Context, msgs []idem.Message) error {
		return sink.Publish(ctx, subject, msgs...)
	})
}

// largeInbox measures the per-event and batched paths on an empty inbox, then again after
// preloading LargeInboxClaims claims, in the same schema — for the plain table and for an inbox
// partitioned by day (claims spread over the last week).
func (e *env) largeInbox(ctx context.Context) ([]Result, error) {
	out, err := e.largeInboxOf(ctx, "plain")
	if err != nil {
		return out, err
	}
	day := 24 * time.Hour
	pe, err := newEnvWith(ctx, e.opts, idempg.PartitionConfig{Bucket: day, Retention: 8 * day})
	if err != nil {
		return out, err
	}
	defer pe.close()
	more, err := pe.largeInboxOf(ctx, "partitioned")
	return append(out, more...), err
}

func (e *env) largeInboxOf(ctx context.Context, inbox string) ([]Result, error) {
	var out []Result
	measure := func(claims int) error {
		r, err := e.perEvent(ctx, 8, "large_inbox")
		if err != nil {
			return err
		}
		r.Inbox, r.Claims = inbox, claims
		out = append(out, r)
		r, err = e.batched(ctx, 8, 100, "large_inbox")
		if err != nil {
			return err
		}
		r.Inbox, r.Claims = inbox, claims
		out = append(out, r)
		return nil
	}
	if err := measure(0); err != nil {
		return out, err
	}
	n := e.opts.LargeInboxClaims
	e.opts.Logf("large_inbox: preloading %d claims into the %s inbox…", n, inbox)
	insert := `INSERT INTO ` + e.schema + `.idem_claims (tenant, consumer, event_id, fingerprint, created_at)
			SELECT 'bench', 'ledger@v1', 'pre-' || g, decode(md5(g::text) || md5(g::text), 'hex'), now()
			FROM generate_series($1::bigint, $2::bigint) g`
	if inbox == "partitioned" {
		insert = `INSERT INTO ` + e.schema + `.idem_claims (tenant, consumer, event_id, bucket, fingerprint, created_at)
			SELECT 'bench', 'ledger@v1', 'pre-' || g, date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - (g % 7) * interval '1 day',
				decode(md5(g::text) || md5(g::text), 'hex'), now()
			FROM generate_series($1::bigint, $2::bigint) g`
	}
	for done := 0; done < n; done += 1_000_000 {
		step := min(1_000_000, n-done)
		if _, err := e.pool.Exec(ctx, insert, done, done+step-1); err != nil {
			return out, fmt.Errorf("large_inbox: preload %s: %w", inbox, err)
		}
	}
	if _, err := e.pool.Exec(ctx, `VACUUM ANALYZE `+e.schema+`.idem_claims`); err != nil {
		return out, err
	}
	return out, measure(n)
}
