package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemqueue"
)

// Names of the queue-table drain cases (see QueueDrainCases).
const (
	// CaseQueueNoop drains pre-inserted events through a handler that does nothing.
	CaseQueueNoop = "idem_queue_noop"
	// CaseQueueEffect drains pre-inserted events through the ledger effect of every other
	// case (a ledger row and a balance update).
	CaseQueueEffect = "idem_queue_effect"
	// SetSuffix names the set-based mode of a drain case: "idem_queue_effect" + SetSuffix.
	SetSuffix = "_set"
)

// QueueDrainCases returns idem's queue-table drain cases, the idem side of a comparison with
// another job queue (cmd/idem/riverbench): Options.Events events are published to the queue
// table first, in a fresh schema, then one consumer with the run's worker count drains them,
// and the drain is timed, from the consumer's start until the last event committed. Each case
// measures every mode: per event (batch 0), batched and set-based (batch each of
// Options.BatchSizes, the set-based results named with SetSuffix). After the drain it checks
// that every event was applied exactly once, and fails the run if not.
func QueueDrainCases() []Case {
	return []Case{
		{Name: CaseQueueNoop, Run: func(ctx context.Context, opts Options, workers int) ([]Result, error) {
			return queueDrain(ctx, opts, CaseQueueNoop, workers, false)
		}},
		{Name: CaseQueueEffect, Run: func(ctx context.Context, opts Options, workers int) ([]Result, error) {
			return queueDrain(ctx, opts, CaseQueueEffect, workers, true)
		}},
	}
}

// queueDrain measures every mode of one drain case, each in a fresh schema.
func queueDrain(ctx context.Context, opts Options, name string, workers int, effect bool) ([]Result, error) {
	type mode struct {
		batch int
		set   bool
	}
	modes := []mode{{0, false}}
	for _, b := range opts.BatchSizes {
		modes = append(modes, mode{b, false}, mode{b, true})
	}
	var out []Result
	for _, m := range modes {
		e, err := newEnv(ctx, opts)
		if err != nil {
			return out, err
		}
		r, err := e.drain(ctx, name, workers, m.batch, m.set, effect)
		e.close()
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// drain publishes the run's events to a queue of their own, then times one consumer over the
// queue table draining them, and checks the books.
func (e *env) drain(ctx context.Context, name string, workers, batch int, set, effect bool) (Result, error) {
	n := e.opts.Events
	queue := "drain_" + randHex(4)
	msgs := e.messages(n)
	for i := 0; i < n; i += 1000 {
		if err := e.store.QueuePublish(ctx, queue, msgs[i:min(i+1000, n)]...); err != nil {
			return Result{}, fmt.Errorf("%s: publish: %w", name, err)
		}
	}
	src, err := idemqueue.NewSource(e.store, idemqueue.SourceConfig{Queue: queue})
	if err != nil {
		return Result{}, err
	}
	// Close waits for a fetch ahead still under way and gives back the jobs it holds, so none
	// runs into the next case or the schema's drop.
	defer func() { _ = src.Close() }()
	lat := &latencies{published: map[string]time.Time{}, done: make(chan struct{}), want: int64(n)}
	cfg := idem.ConsumerConfig[pgx.Tx]{
		Name:    "drain@v1",
		Workers: workers,
		Handler: func(context.Context, pgx.Tx, idem.Message) error { return nil },
		Observe: idem.ObserveConfig{
			Observer: lat,
			Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		},
	}
	if effect {
		cfg.Handler = func(ctx context.Context, tx pgx.Tx, msg idem.Message) error {
			return e.credit(ctx, tx, msg.EventID, walletOf(msg, e.opts.Wallets))
		}
	}
	if set {
		cfg.SetHandler = func(context.Context, pgx.Tx, []idem.Message) error { return nil }
		if effect {
			cfg.SetHandler = e.creditSet
		}
		name += SetSuffix
	}
	if batch > 1 || set {
		cfg.Batch = idem.BatchConfig{Enabled: true, Size: max(batch, 1)}
	}
	c, err := idem.NewConsumer(e.store, cfg)
	if err != nil {
		return Result{}, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	runErr := make(chan error, 1)
	start := time.Now()
	go func() { runErr <- c.Run(runCtx, src) }()
	select {
	case <-lat.done:
	case err := <-runErr:
		return Result{}, fmt.Errorf("%s: consumer stopped: %v", name, err)
	case <-time.After(10 * time.Minute):
		return Result{}, fmt.Errorf("%s: %d of %d events processed after 10 minutes", name, lat.processed.Load(), n)
	}
	d := time.Since(start)
	stop()
	<-runErr
	if err := e.checkDrain(ctx, queue, "drain@v1", n, effect); err != nil {
		return Result{}, fmt.Errorf("%s: %w", name, err)
	}
	return result(name, workers, batch, n, d), nil
}

// checkDrain checks that each of the n events was applied exactly once: n claims, an empty
// queue, and with the effect n distinct ledger rows and balances that sum to n.
func (e *env) checkDrain(ctx context.Context, queue, consumer string, n int, effect bool) error {
	var claims int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.schema+`.idem_claims WHERE consumer = $1`, consumer).Scan(&claims); err != nil {
		return fmt.Errorf("count claims: %w", err)
	}
	st, err := e.store.QueueStats(ctx, queue)
	if err != nil {
		return err
	}
	if claims != n || st.Backlog != 0 {
		return fmt.Errorf("%d claims for %d events, %d jobs left in the queue", claims, n, st.Backlog)
	}
	if !effect {
		return nil
	}
	var rows, distinct int
	var sum int64
	if err := e.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id), (SELECT coalesce(sum(balance), 0) FROM `+e.schema+`.wallets)
		FROM `+e.schema+`.ledger`).Scan(&rows, &distinct, &sum); err != nil {
		return fmt.Errorf("count ledger rows: %w", err)
	}
	if rows != n || distinct != n || sum != int64(n) {
		return fmt.Errorf("ledger: %d rows, %d distinct events, balances sum to %d, for %d events", rows, distinct, sum, n)
	}
	return nil
}
