package idemotel

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemstore"
)

// StoreTimeoutDefault bounds the store queries of one collection unless
// StoreGaugesConfig.Timeout says otherwise (idemprom's StoreTimeoutDefault).
const StoreTimeoutDefault = 5 * time.Second

// StoreGaugesConfig configures Telemetry.ObserveStores; it mirrors
// idemprom.StoreCollectorConfig. Nil stores are skipped.
type StoreGaugesConfig struct {
	// DeadLetters, when set, yields idem_dead_letters_pending{reason} and
	// idem_dead_letters_oldest_age_seconds.
	DeadLetters idemstore.DeadLetterStore
	// Queue, when set, yields idem_queue_backlog{queue} and idem_queue_oldest_age_seconds{queue}
	// for each of Queues (the store cannot list them; naming them keeps the attribute bounded).
	Queue  idemstore.QueueStore
	Queues []string
	// Outbox, when set, yields idem_outbox_backlog, idem_outbox_oldest_age_seconds and
	// idem_relay_members.
	Outbox idemstore.OutboxRelayStore
	// Timeout bounds the store queries of one collection (default StoreTimeoutDefault); they run
	// concurrently, each within it.
	Timeout time.Duration
	// Now is the clock ages are measured against (default time.Now).
	Now func() time.Time
}

// storeFigures is what one collection read from the stores.
type storeFigures struct {
	dl       *idemstore.DeadLetterStats
	queues   map[string]idemstore.QueueStats
	outbox   *idemstore.QueueStats
	members  *int
	success  map[[2]string]bool // (figure, queue) → whether its query succeeded
	mu       sync.Mutex
	failures []error
}

func (f *storeFigures) done(figure, queue string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.success[[2]string{figure, queue}] = err == nil
	if err != nil {
		f.failures = append(f.failures, err)
	}
}

// ObserveStores registers observable gauges that read backlog figures from the stores at each
// collection, under idemprom's names: pending dead letters by reason, queue-table backlog per
// queue, outbox backlog and live relays, the age of the oldest item of each (0 when empty), and
// idem_store_scrape_success{figure,queue}, 0 for a figure whose query failed (that figure is then
// left out of the collection while the others are reported, and its error goes to
// otel.Handle). Call it once per set of stores; Unregister the returned registration to stop.
func (t *Telemetry) ObserveStores(cfg StoreGaugesConfig) (metric.Registration, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = StoreTimeoutDefault
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	var queues []string
	for _, q := range cfg.Queues {
		if !slices.Contains(queues, q) {
			queues = append(queues, q)
		}
	}
	ns := t.cfg.Namespace + "_"
	m := t.meter
	var errs []error
	intGauge := func(name, help string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(ns+name, metric.WithDescription(help))
		errs = append(errs, err)
		return g
	}
	ageGauge := func(name, help string) metric.Float64ObservableGauge {
		g, err := m.Float64ObservableGauge(ns+name, metric.WithDescription(help), metric.WithUnit("s"))
		errs = append(errs, err)
		return g
	}
	dlPending := intGauge("dead_letters_pending", "Dead letters waiting for replay or discard, by reason; sum them for the total.")
	dlOldest := ageGauge("dead_letters_oldest_age_seconds", "Age of the first failure of the oldest pending dead letter, 0 when there is none.")
	queueBacklog := intGauge("queue_backlog", "Jobs in the queue table not yet acknowledged.")
	queueOldest := ageGauge("queue_oldest_age_seconds", "Age of the oldest job not yet acknowledged, 0 when the queue is empty.")
	outboxBacklog := intGauge("outbox_backlog", "Outbox events not yet published.")
	outboxOldest := ageGauge("outbox_oldest_age_seconds", "Age of the oldest unpublished outbox event, 0 when the outbox is empty.")
	relayMembers := intGauge("relay_members", "Outbox relays holding a live membership lease; 0 with a backlog means nothing publishes it.")
	success := intGauge("store_scrape_success", "1 when the store query behind a figure succeeded on this collection, 0 when it failed.")
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("idemotel: create store gauges: %w", err)
	}

	callback := func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
		now := cfg.Now()
		f := t.readStores(ctx, cfg, queues, now)
		if st := f.dl; st != nil {
			for _, r := range idem.Reasons() {
				o.ObserveInt64(dlPending, st.ByReason[r], metric.WithAttributes(attribute.String(labelReason, string(r))))
			}
			for r, n := range st.ByReason {
				if !slices.Contains(idem.Reasons(), r) {
					o.ObserveInt64(dlPending, n, metric.WithAttributes(attribute.String(labelReason, string(r))))
				}
			}
			o.ObserveFloat64(dlOldest, age(now, st.OldestPending, st.Pending))
		}
		for q, st := range f.queues {
			qa := metric.WithAttributes(attribute.String(labelQueue, q))
			o.ObserveInt64(queueBacklog, st.Backlog, qa)
			o.ObserveFloat64(queueOldest, age(now, st.Oldest, st.Backlog), qa)
		}
		if st := f.outbox; st != nil {
			o.ObserveInt64(outboxBacklog, st.Backlog)
			o.ObserveFloat64(outboxOldest, age(now, st.Oldest, st.Backlog))
		}
		if f.members != nil {
			o.ObserveInt64(relayMembers, int64(*f.members))
		}
		for k, ok := range f.success {
			v := int64(0)
			if ok {
				v = 1
			}
			o.ObserveInt64(success, v, metric.WithAttributes(attribute.String("figure", k[0]), attribute.String(labelQueue, k[1])))
		}
		// A failed figure is left out and reported by idem_store_scrape_success; its error goes
		// to OpenTelemetry's error handler, not back to the reader: a reader that gets an error
		// from a callback drops the whole collection, every other figure with it.
		if err := errors.Join(f.failures...); err != nil {
			otel.Handle(err)
		}
		return nil
	}
	return m.RegisterCallback(callback, dlPending, dlOldest, queueBacklog, queueOldest, outboxBacklog, outboxOldest, relayMembers, success)
}

// readStores queries every configured store concurrently.
func (t *Telemetry) readStores(ctx context.Context, cfg StoreGaugesConfig, queues []string, now time.Time) *storeFigures {
	f := &storeFigures{queues: map[string]idemstore.QueueStats{}, success: map[[2]string]bool{}}
	var wg sync.WaitGroup
	if cfg.DeadLetters != nil {
		wg.Go(func() {
			st, err := cfg.DeadLetters.DeadLetterStats(ctx)
			if err == nil {
				f.mu.Lock()
				f.dl = &st
				f.mu.Unlock()
			} else {
				err = fmt.Errorf("idemotel: dead-letter stats: %w", err)
			}
			f.done("dead_letters", "", err)
		})
	}
	if cfg.Queue != nil {
		for _, q := range queues {
			wg.Go(func() {
				st, err := cfg.Queue.QueueStats(ctx, q)
				if err == nil {
					f.mu.Lock()
					f.queues[q] = st
					f.mu.Unlock()
				} else {
					err = fmt.Errorf("idemotel: queue %q stats: %w", q, err)
				}
				f.done("queue", q, err)
			})
		}
	}
	if cfg.Outbox != nil {
		wg.Go(func() {
			st, err := cfg.Outbox.OutboxStats(ctx)
			if err == nil {
				f.mu.Lock()
				f.outbox = &st
				f.mu.Unlock()
			} else {
				err = fmt.Errorf("idemotel: outbox stats: %w", err)
			}
			f.done("outbox", "", err)
		})
		wg.Go(func() {
			leases, err := cfg.Outbox.LeaseList(ctx, idemrelay.MemberLeasePrefix, now)
			if err == nil {
				n := len(leases)
				f.mu.Lock()
				f.members = &n
				f.mu.Unlock()
			} else {
				err = fmt.Errorf("idemotel: relay leases: %w", err)
			}
			f.done("relays", "", err)
		})
	}
	wg.Wait()
	return f
}

// age is now minus oldest in seconds: 0 when nothing is waiting, never negative.
func age(now, oldest time.Time, count int64) float64 {
	if count <= 0 || oldest.IsZero() {
		return 0
	}
	return seconds(now.Sub(oldest))
}
