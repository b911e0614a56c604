package idemprom

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemstore"
)

// StoreTimeoutDefault bounds the store queries of one scrape unless
// StoreCollectorConfig.Timeout says otherwise; it stays under Prometheus's default 10s scrape
// timeout so a slow database shows up as failed figures rather than a failed scrape.
const StoreTimeoutDefault = 5 * time.Second

// StoreCollectorConfig configures NewStoreCollector. Nil stores are skipped, so one collector
// can cover any subset of dead letters, queue table and outbox.
type StoreCollectorConfig struct {
	// Namespace prefixes every metric name (default NamespaceDefault).
	Namespace string
	// DeadLetters, when set, yields idem_dead_letters_pending{reason} and
	// idem_dead_letters_oldest_age_seconds.
	DeadLetters idemstore.DeadLetterStore
	// Queue, when set, yields idem_queue_backlog{queue} and idem_queue_oldest_age_seconds{queue}
	// for each of Queues.
	Queue idemstore.QueueStore
	// Queues names the queue-table queues to report; the store cannot list them, and naming them
	// keeps the queue label bounded. Duplicates are ignored.
	Queues []string
	// Outbox, when set, yields idem_outbox_backlog, idem_outbox_oldest_age_seconds and
	// idem_relay_members (relays holding a live membership lease), so an alert can see a
	// backlog that no relay is there to publish.
	Outbox idemstore.OutboxRelayStore
	// Timeout bounds the store queries of one scrape (default StoreTimeoutDefault); the queries
	// run concurrently, each within it.
	Timeout time.Duration
	// Now is the clock ages are measured against (default time.Now).
	Now func() time.Time
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c StoreCollectorConfig) WithDefaults() StoreCollectorConfig {
	if c.Namespace == "" {
		c.Namespace = NamespaceDefault
	}
	if c.Timeout <= 0 {
		c.Timeout = StoreTimeoutDefault
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// storeCollector queries the stores on every scrape; it keeps no state between scrapes.
type storeCollector struct {
	cfg    StoreCollectorConfig
	queues []string

	dlPending, dlOldest         *prometheus.Desc
	queueBacklog, queueOldest   *prometheus.Desc
	outboxBacklog, outboxOldest *prometheus.Desc
	relayMembers                *prometheus.Desc
	success                     *prometheus.Desc
}

// NewStoreCollector returns a collector that reads backlog figures from the stores on each
// scrape: pending dead letters by reason, queue-table backlog per queue, outbox backlog, and the
// age of the oldest item of each (0 when empty). A store error turns that figure into an invalid
// metric, which fails the registry's Gather for it while the other figures are still collected;
// serve with promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError} to keep them in the
// scrape, and alert on idem_store_scrape_success, which is 0 for a figure whose query failed.
// It panics when cfg.Namespace is invalid.
func NewStoreCollector(cfg StoreCollectorConfig) prometheus.Collector {
	cfg = cfg.WithDefaults()
	if err := validNamespace(cfg.Namespace); err != nil {
		panic(fmt.Errorf("idemprom: StoreCollectorConfig.Namespace: %w", err))
	}
	var queues []string
	for _, q := range cfg.Queues {
		if !slices.Contains(queues, q) {
			queues = append(queues, q)
		}
	}
	name := func(n string) string { return prometheus.BuildFQName(cfg.Namespace, "", n) }
	return &storeCollector{
		cfg:    cfg,
		queues: queues,
		dlPending: prometheus.NewDesc(name("dead_letters_pending"),
			"Dead letters waiting for replay or discard, by reason; sum them for the total.", []string{"reason"}, nil),
		dlOldest: prometheus.NewDesc(name("dead_letters_oldest_age_seconds"),
			"Age of the first failure of the oldest pending dead letter, 0 when there is none.", nil, nil),
		queueBacklog: prometheus.NewDesc(name("queue_backlog"),
			"Jobs in the queue table not yet acknowledged.", []string{"queue"}, nil),
		queueOldest: prometheus.NewDesc(name("queue_oldest_age_seconds"),
			"Age of the oldest job not yet acknowledged, 0 when the queue is empty.", []string{"queue"}, nil),
		outboxBacklog: prometheus.NewDesc(name("outbox_backlog"),
			"Outbox events not yet published.", nil, nil),
		outboxOldest: prometheus.NewDesc(name("outbox_oldest_age_seconds"),
			"Age of the oldest unpublished outbox event, 0 when the outbox is empty.", nil, nil),
		relayMembers: prometheus.NewDesc(name("relay_members"),
			"Outbox relays holding a live membership lease; 0 with a backlog means nothing publishes it.", nil, nil),
		success: prometheus.NewDesc(name("store_scrape_success"),
			"1 when the store query behind a figure succeeded on this scrape, 0 when it failed.",
			[]string{"figure", "queue"}, nil),
	}
}

// Describe sends the descriptors of the figures the configured stores provide.
func (s *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	if s.cfg.DeadLetters != nil {
		ch <- s.dlPending
		ch <- s.dlOldest
	}
	if s.cfg.Queue != nil && len(s.queues) > 0 {
		ch <- s.queueBacklog
		ch <- s.queueOldest
	}
	if s.cfg.Outbox != nil {
		ch <- s.outboxBacklog
		ch <- s.outboxOldest
		ch <- s.relayMembers
	}
	ch <- s.success
}

// Collect queries every configured store concurrently, within one Timeout, and sends the
// figures; a failed query sends invalid metrics for its figures and leaves the others intact.
func (s *storeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	now := s.cfg.Now()
	var wg sync.WaitGroup
	if s.cfg.DeadLetters != nil {
		wg.Go(func() { s.collectDeadLetters(ctx, now, ch) })
	}
	if s.cfg.Queue != nil {
		for _, q := range s.queues {
			wg.Go(func() { s.collectQueue(ctx, now, q, ch) })
		}
	}
	if s.cfg.Outbox != nil {
		wg.Go(func() { s.collectOutbox(ctx, now, ch) })
		wg.Go(func() { s.collectRelays(ctx, now, ch) })
	}
	wg.Wait()
}

// collectDeadLetters sends the pending count of every known reason (0 when none, so alerts see
// a series before the first dead letter) plus any other reason the store reports.
func (s *storeCollector) collectDeadLetters(ctx context.Context, now time.Time, ch chan<- prometheus.Metric) {
	st, err := s.cfg.DeadLetters.DeadLetterStats(ctx)
	if err != nil {
		err = fmt.Errorf("idemprom: dead-letter stats: %w", err)
		ch <- prometheus.NewInvalidMetric(s.dlPending, err)
		ch <- prometheus.NewInvalidMetric(s.dlOldest, err)
		s.sendSuccess(ch, false, "dead_letters", "")
		return
	}
	for _, r := range idem.Reasons() {
		ch <- prometheus.MustNewConstMetric(s.dlPending, prometheus.GaugeValue, float64(st.ByReason[r]), string(r))
	}
	for r, n := range st.ByReason {
		if !slices.Contains(idem.Reasons(), r) {
			ch <- prometheus.MustNewConstMetric(s.dlPending, prometheus.GaugeValue, float64(n), string(r))
		}
	}
	ch <- prometheus.MustNewConstMetric(s.dlOldest, prometheus.GaugeValue, age(now, st.OldestPending, st.Pending))
	s.sendSuccess(ch, true, "dead_letters", "")
}

// collectQueue sends the backlog and oldest age of one queue.
func (s *storeCollector) collectQueue(ctx context.Context, now time.Time, queue string, ch chan<- prometheus.Metric) {
	st, err := s.cfg.Queue.QueueStats(ctx, queue)
	if err != nil {
		err = fmt.Errorf("idemprom: queue %q stats: %w", queue, err)
		ch <- prometheus.NewInvalidMetric(s.queueBacklog, err)
		ch <- prometheus.NewInvalidMetric(s.queueOldest, err)
		s.sendSuccess(ch, false, "queue", queue)
		return
	}
	ch <- prometheus.MustNewConstMetric(s.queueBacklog, prometheus.GaugeValue, float64(st.Backlog), queue)
	ch <- prometheus.MustNewConstMetric(s.queueOldest, prometheus.GaugeValue, age(now, st.Oldest, st.Backlog), queue)
	s.sendSuccess(ch, true, "queue", queue)
}

// collectOutbox sends the outbox backlog and oldest age.
func (s *storeCollector) collectOutbox(ctx context.Context, now time.Time, ch chan<- prometheus.Metric) {
	st, err := s.cfg.Outbox.OutboxStats(ctx)
	if err != nil {
		err = fmt.Errorf("idemprom: outbox stats: %w", err)
		ch <- prometheus.NewInvalidMetric(s.outboxBacklog, err)
		ch <- prometheus.NewInvalidMetric(s.outboxOldest, err)
		s.sendSuccess(ch, false, "outbox", "")
		return
	}
	ch <- prometheus.MustNewConstMetric(s.outboxBacklog, prometheus.GaugeValue, float64(st.Backlog))
	ch <- prometheus.MustNewConstMetric(s.outboxOldest, prometheus.GaugeValue, age(now, st.Oldest, st.Backlog))
	s.sendSuccess(ch, true, "outbox", "")
}

// collectRelays sends how many relays hold a live membership lease.
func (s *storeCollector) collectRelays(ctx context.Context, now time.Time, ch chan<- prometheus.Metric) {
	leases, err := s.cfg.Outbox.LeaseList(ctx, idemrelay.MemberLeasePrefix, now)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(s.relayMembers, fmt.Errorf("idemprom: relay leases: %w", err))
		s.sendSuccess(ch, false, "relays", "")
		return
	}
	ch <- prometheus.MustNewConstMetric(s.relayMembers, prometheus.GaugeValue, float64(len(leases)))
	s.sendSuccess(ch, true, "relays", "")
}

// sendSuccess sends idem_store_scrape_success for one figure.
func (s *storeCollector) sendSuccess(ch chan<- prometheus.Metric, ok bool, figure, queue string) {
	v := 0.0
	if ok {
		v = 1
	}
	ch <- prometheus.MustNewConstMetric(s.success, prometheus.GaugeValue, v, figure, queue)
}

// age is now minus oldest in seconds: 0 when nothing is waiting, and never negative when the
// oldest item was written after the scrape's clock reading.
func age(now, oldest time.Time, count int64) float64 {
	if count <= 0 || oldest.IsZero() {
		return 0
	}
	return seconds(now.Sub(oldest))
}
