package idemrelay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredact"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/retry"
)

// Relay publishes the transactional outbox through a sink. Several relays may run against one
// database: they divide its partitions by leases, so each row, and each ordering key, has one
// publisher at a time. A Relay is safe for concurrent use, but Run and RunOnce do not overlap.
type Relay struct {
	store      idemstore.OutboxRelayStore
	dlq        idemstore.DeadLetterStore
	sink       idem.Sink
	cfg        Config
	redactor   *idemredact.Redactor
	partitions int

	// leaseMu serialises the lease steps (maintain, releases); mu guards owned, which rounds
	// read while the lease goroutine updates it.
	leaseMu sync.Mutex
	mu      sync.Mutex
	owned   map[int]*partitionLease

	// busy makes Run and RunOnce exclusive; the fields below belong to whichever holds it (and
	// nextMaintain to leaseMu).
	busy         atomic.Bool
	nextMaintain time.Time
	lastGC       time.Time
	fetchLimit   int
	// deadChecks is when each dead row seen last round may next have its dead letter read.
	deadChecks map[int64]time.Time

	// wake tells an idle Run that new partitions were acquired.
	wake chan struct{}

	// idLock holds the machine-local slot behind a default stable ID for the relay's life
	// (an *os.File: dropping it would let the garbage collector close it and free the ID).
	idLock io.Closer
}

// Store is what a relay needs of a store: its outbox, and its dead-letter queue for the rows that
// cannot be published. Every idem store (idempg, idemsqlite, idemmysql) is one.
type Store interface {
	idemstore.OutboxRelayStore
	idemstore.DeadLetterStore
}

// New validates cfg (after WithDefaults) and returns a relay that publishes store's outbox
// through sink and writes the dead letters of rows that cannot be published to the same store.
func New(store Store, sink idem.Sink, cfg Config) (*Relay, error) {
	var errs []error
	if store == nil {
		errs = append(errs, errors.New("store is nil"))
	}
	if sink == nil {
		errs = append(errs, errors.New("sink is nil"))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("idemrelay: New: %w", errors.Join(errs...))
	}
	var idLock io.Closer
	if cfg.ID == "" {
		if id, lock, ok := stableID(slotDir(), hostname()); ok {
			cfg.ID, idLock = id, lock
		}
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		if idLock != nil {
			idLock.Close()
		}
		return nil, err
	}
	n := store.OutboxPartitions()
	if n < 1 {
		return nil, fmt.Errorf("idemrelay: New: store has %d outbox partitions, want at least 1", n)
	}
	return &Relay{
		store:      store,
		dlq:        store,
		sink:       sink,
		cfg:        cfg,
		redactor:   idemredact.New(cfg.Redact),
		partitions: n,
		owned:      make(map[int]*partitionLease),
		fetchLimit: cfg.BatchSize,
		wake:       make(chan struct{}, 1),
		idLock:     idLock,
	}, nil
}

// ID returns the relay's identity, as written in its leases.
func (r *Relay) ID() string { return r.cfg.ID }

// Config returns the relay's configuration with defaults applied.
func (r *Relay) Config() Config { return r.cfg }

// Run publishes until ctx ends, then releases its leases (so that other relays take over at
// once) and returns nil. It keeps its leases renewed every LeaseTTL/3 in the background, waits
// for new rows with the store's OutboxWait when idle (LISTEN/NOTIFY on PostgreSQL, polling on
// SQLite), deletes published rows older than Retention every GCInterval, and logs and retries
// store errors with a capped backoff instead of returning.
//
// A row is published at least once: a crash between the sink's confirmation and the mark
// publishes it again after restart or takeover, with the same event id. That is by design —
// consumers deduplicate by (tenant, consumer, event id), JetStream drops the copy by
// Nats-Msg-Id, and an HTTP destination by Idempotency-Key.
func (r *Relay) Run(ctx context.Context) error {
	if !r.busy.CompareAndSwap(false, true) {
		return fmt.Errorf("idemrelay: relay %s: Run or RunOnce is already running", r.cfg.ID)
	}
	defer r.busy.Store(false)
	log := r.cfg.Logger.With(slog.String("relay", r.cfg.ID))
	log.LogAttrs(ctx, slog.LevelInfo, "idemrelay: relay started",
		slog.Int("partitions", r.partitions), slog.String("lease_ttl", r.cfg.LeaseTTL.String()))

	if _, err := r.maintain(ctx); err != nil && ctx.Err() == nil {
		log.LogAttrs(ctx, slog.LevelWarn, "idemrelay: lease step failed", slog.String("error", r.redactor.Text(err.Error())))
	}
	leaseCtx, stopLeases := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.maintainLoop(leaseCtx, log)
	}()

	backoff := retry.Policy{Base: 50 * time.Millisecond, Cap: 5 * time.Second}
	failures := 0
	for ctx.Err() == nil {
		if err := r.releaseDraining(ctx); err != nil && ctx.Err() == nil {
			log.LogAttrs(ctx, slog.LevelWarn, "idemrelay: release failed", slog.String("error", r.redactor.Text(err.Error())))
		}
		if _, err := r.collectIfDue(ctx); err != nil && ctx.Err() == nil {
			log.LogAttrs(ctx, slog.LevelWarn, "idemrelay: garbage collection failed", slog.String("error", r.redactor.Text(err.Error())))
		}
		res, err := r.round(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			failures++
			delay := backoff.Backoff(min(failures, 20), r.cfg.Rand)
			log.LogAttrs(ctx, slog.LevelWarn, "idemrelay: round failed",
				slog.String("error_type", classify(err).String()),
				slog.String("error", r.redactor.Text(err.Error())), slog.String("retry_in", delay.String()))
			sleep(ctx, delay)
			continue
		}
		failures = 0
		if res.more {
			continue
		}
		wait := r.cfg.PollInterval
		if !res.nextDue.IsZero() {
			wait = min(wait, max(res.nextDue.Sub(r.cfg.Now()), time.Millisecond))
		}
		r.idle(ctx, wait)
	}

	stopLeases()
	wg.Wait()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	if err := r.releaseAll(rctx); err != nil {
		log.LogAttrs(rctx, slog.LevelWarn, "idemrelay: release on exit failed", slog.String("error", r.redactor.Text(err.Error())))
	}
	cancel()
	log.LogAttrs(context.WithoutCancel(ctx), slog.LevelInfo, "idemrelay: relay stopped")
	return nil
}

// maintainLoop runs the lease step every LeaseTTL/3 until ctx ends, and wakes the publishing
// loop when it acquired partitions.
func (r *Relay) maintainLoop(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(r.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		acquired, err := r.maintain(ctx)
		if err != nil && ctx.Err() == nil {
			// The leases lapse if this goes on; rounds stop using them before they do.
			log.LogAttrs(ctx, slog.LevelWarn, "idemrelay: lease step failed", slog.String("error", r.redactor.Text(err.Error())))
		}
		if acquired {
			select {
			case r.wake <- struct{}{}:
			default:
			}
		}
	}
}

// idle waits up to d for new rows (OutboxWait) or new partitions (wake). A store whose wait
// fails is polled instead.
func (r *Relay) idle(ctx context.Context, d time.Duration) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-r.wake:
			cancel()
		case <-done:
		}
	}()
	start := time.Now()
	if err := r.store.OutboxWait(wctx, d); err != nil && wctx.Err() == nil {
		sleep(wctx, d-time.Since(start))
	}
}

// RunOnce does one round without the background machinery of Run, for tests and the CLI: it
// takes or renews this relay's fair share of partitions when due, deletes expired published
// rows when due, then fetches one batch of the partitions held and publishes what may be
// published. It reports how many rows it published. The leases stay held until they expire or
// Release is called.
func (r *Relay) RunOnce(ctx context.Context) (published int, err error) {
	if !r.busy.CompareAndSwap(false, true) {
		return 0, fmt.Errorf("idemrelay: relay %s: Run or RunOnce is already running", r.cfg.ID)
	}
	defer r.busy.Store(false)
	r.leaseMu.Lock()
	due := !r.cfg.Now().Before(r.nextMaintain)
	r.leaseMu.Unlock()
	if due {
		if _, err := r.maintain(ctx); err != nil {
			return 0, err
		}
	}
	if _, err := r.collectIfDue(ctx); err != nil {
		return 0, err
	}
	res, err := r.round(ctx)
	if rerr := r.releaseDraining(ctx); rerr != nil && err == nil {
		err = rerr
	}
	return res.published, err
}

// Release gives up every lease this relay holds, for a process that used RunOnce and is about
// to exit. Run releases by itself.
func (r *Relay) Release(ctx context.Context) error {
	if !r.busy.CompareAndSwap(false, true) {
		return fmt.Errorf("idemrelay: relay %s: cannot release while Run or RunOnce is running", r.cfg.ID)
	}
	defer r.busy.Store(false)
	return r.releaseAll(ctx)
}

// collectIfDue runs CollectGarbage when GCInterval has passed since the last run (or never ran).
func (r *Relay) collectIfDue(ctx context.Context) (int, error) {
	now := r.cfg.Now()
	if !r.lastGC.IsZero() && now.Sub(r.lastGC) < r.cfg.GCInterval {
		return 0, nil
	}
	r.lastGC = now
	return r.CollectGarbage(ctx)
}

// CollectGarbage deletes rows published more than Retention ago, in batches of GCBatch, until
// none is left or ctx ends, and reports how many it deleted. Every relay may run it; the
// batches keep concurrent runs short and harmless.
func (r *Relay) CollectGarbage(ctx context.Context) (int, error) {
	before := r.cfg.Now().Add(-r.cfg.Retention)
	total := 0
	for {
		n, err := r.store.OutboxDeletePublished(ctx, before, r.cfg.GCBatch)
		total += n
		if err != nil {
			return total, fmt.Errorf("idemrelay: delete outbox rows published before %s: %w", before.UTC().Format(time.RFC3339), err)
		}
		if n < r.cfg.GCBatch {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
