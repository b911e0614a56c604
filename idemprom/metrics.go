package idemprom

import (
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem"
)

// NamespaceDefault prefixes every metric name unless Config.Namespace says otherwise.
const NamespaceDefault = "idem"

// BucketsDefault returns the default handling-time buckets in seconds: 0.5ms doubling up to
// about 16s, which brackets a database transaction from a cached claim to a slow handler.
func BucketsDefault() []float64 { return prometheus.ExponentialBuckets(0.0005, 2, 16) }

// RecoveryBucketsDefault returns the default time-to-recovery buckets in seconds, from a minute
// to a week: dead letters are replayed by people, so recovery is measured in minutes to days.
func RecoveryBucketsDefault() []float64 {
	const minute, hour, day = 60, 3600, 86400
	return []float64{
		minute, 5 * minute, 15 * minute, 30 * minute,
		hour, 2 * hour, 4 * hour, 8 * hour, 12 * hour,
		day, 2 * day, 4 * day, 7 * day,
	}
}

// LagBucketsDefault returns the default outbox publish-lag buckets in seconds: 1ms growing by
// four up to about 70 minutes, covering an immediate relay wake-up as well as a stuck backlog.
func LagBucketsDefault() []float64 { return prometheus.ExponentialBuckets(0.001, 4, 12) }

// Config configures Metrics. Zero fields take the documented defaults (see WithDefaults).
type Config struct {
	// Namespace prefixes every metric name (default NamespaceDefault, giving "idem_…").
	Namespace string
	// Buckets are the upper bounds, in seconds, of idem_handling_seconds (default
	// BucketsDefault()).
	Buckets []float64
	// RecoveryBuckets are the upper bounds, in seconds, of idem_recovery_seconds (default
	// RecoveryBucketsDefault()).
	RecoveryBuckets []float64
	// LagBuckets are the upper bounds, in seconds, of idem_outbox_publish_lag_seconds (default
	// LagBucketsDefault()).
	LagBuckets []float64
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Namespace == "" {
		c.Namespace = NamespaceDefault
	}
	if len(c.Buckets) == 0 {
		c.Buckets = BucketsDefault()
	}
	if len(c.RecoveryBuckets) == 0 {
		c.RecoveryBuckets = RecoveryBucketsDefault()
	}
	if len(c.LagBuckets) == 0 {
		c.LagBuckets = LagBucketsDefault()
	}
	return c
}

// validate reports the first invalid field of a defaulted Config, naming it.
func (c Config) validate() error {
	if err := validNamespace(c.Namespace); err != nil {
		return fmt.Errorf("idemprom: Config.Namespace: %w", err)
	}
	for _, f := range []struct {
		name    string
		buckets []float64
	}{{"Buckets", c.Buckets}, {"RecoveryBuckets", c.RecoveryBuckets}, {"LagBuckets", c.LagBuckets}} {
		if err := validBuckets(f.buckets); err != nil {
			return fmt.Errorf("idemprom: Config.%s: %w", f.name, err)
		}
	}
	return nil
}

// validNamespace accepts what Prometheus accepts as the start of a classic metric name.
func validNamespace(ns string) error {
	for i, r := range ns {
		switch {
		case r == '_', r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return fmt.Errorf("%q is not a valid metric name prefix (want [a-zA-Z_][a-zA-Z0-9_]*)", ns)
		}
	}
	return nil
}

// validBuckets rejects bucket bounds that prometheus would panic on with a less helpful message.
func validBuckets(b []float64) error {
	for i, v := range b {
		if math.IsNaN(v) {
			return fmt.Errorf("bucket %d is NaN", i)
		}
		if i > 0 && v <= b[i-1] {
			return fmt.Errorf("buckets must be strictly increasing, got %v after %v", v, b[i-1])
		}
	}
	return nil
}

// Metrics turns the events of idem's consumers and relays into Prometheus metrics. It implements
// idem.Observer (set it as the consumer's ConsumerConfig.Observe.Observer) and prometheus.Collector (register it
// on your own registry); one Metrics may serve every consumer and relay of a process.
type Metrics struct {
	messages        *prometheus.CounterVec
	errors          *prometheus.CounterVec
	retries         *prometheus.CounterVec
	duplicates      *prometheus.CounterVec
	keyReuse        *prometheus.CounterVec
	deadLetters     *prometheus.CounterVec
	dlFailures      *prometheus.CounterVec
	ignored         *prometheus.CounterVec
	handling        *prometheus.HistogramVec
	recovery        *prometheus.HistogramVec
	paused          *prometheus.GaugeVec
	pauses          *prometheus.CounterVec
	published       *prometheus.CounterVec
	publishFailures *prometheus.CounterVec
	publishLag      *prometheus.HistogramVec

	all []prometheus.Collector
	// owners maps a consumer's name to its owner (idem.Observation.Owner, or ConsumerOwner), for
	// Paused and Resumed, which name only the consumer.
	owners sync.Map
	// seen holds the consumer/owner/queue triples whose counters were created at zero, so that rate()
	// and increase() see the first retry or dead letter instead of a series appearing at 1.
	seen sync.Map
}

var (
	_ idem.Observer        = (*Metrics)(nil)
	_ idem.OwnerObserver   = (*Metrics)(nil)
	_ prometheus.Collector = (*Metrics)(nil)
)

// New returns Metrics for cfg. It panics when cfg is invalid (a bad namespace or unsorted
// buckets), like the prometheus constructors it builds on: that is a programming error.
func New(cfg Config) *Metrics {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		panic(err)
	}
	ns := cfg.Namespace
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: name, Help: help, Buckets: buckets}, labels)
	}
	m := &Metrics{
		messages: counter("messages_total",
			"Deliveries settled by a consumer, by outcome.", "consumer", "owner", "queue", "outcome"),
		errors: counter("errors_total",
			"Deliveries that did not end processed or duplicate, by error class.", "consumer", "owner", "queue", "class"),
		retries: counter("retries_total",
			"Deliveries handed back to the broker for another attempt.", "consumer", "owner", "queue"),
		duplicates: counter("duplicates_ignored_total",
			"Redeliveries recognised by their claim and acknowledged without applying anything.", "consumer", "owner", "queue"),
		keyReuse: counter("key_reuse_total",
			"Deliveries whose event id was already claimed with different content.", "consumer", "owner", "queue"),
		deadLetters: counter("dead_letters_total",
			"Deliveries recorded in the dead-letter queue, by reason.", "consumer", "owner", "queue", "reason"),
		dlFailures: counter("dead_letter_write_failures_total",
			"Failed attempts to write a dead letter; the delivery is kept and the write retried, and the consumer pauses after failures in a row. Alert on any increase.", "consumer", "owner", "queue"),
		ignored: counter("ignored_total",
			"Deliveries a handler ignored (idem.Ignore: the target is gone for good), acknowledged without effect, by the handler's reason.", "consumer", "owner", "queue", "reason"),
		handling: histogram("handling_seconds",
			"Time from the start of handling to the delivery's verdict, by outcome.", cfg.Buckets, "consumer", "owner", "queue", "outcome"),
		recovery: histogram("recovery_seconds",
			"Time from a dead letter's first failure to the processing of its replay.", cfg.RecoveryBuckets, "consumer", "owner"),
		paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "consumer_paused",
			Help: "1 when the consumer paused itself (a handler bug, or dead letters that cannot be written), else 0."}, []string{"consumer", "owner"}),
		pauses: counter("consumer_pauses_total",
			"Times a consumer paused itself (a handler bug, or dead letters that cannot be written).", "consumer", "owner"),
		published: counter("outbox_published_total",
			"Outbox events published and marked published by a relay.", "topic"),
		publishFailures: counter("outbox_publish_failures_total",
			"Failed outbox publishes, by error class and whether the event was dead-lettered.", "topic", "class", "dead"),
		publishLag: histogram("outbox_publish_lag_seconds",
			"Per published batch, how long its oldest event waited in the outbox.", cfg.LagBuckets, "topic"),
	}
	m.all = []prometheus.Collector{
		m.messages, m.errors, m.retries, m.duplicates, m.keyReuse, m.deadLetters, m.dlFailures, m.ignored, m.handling,
		m.recovery, m.paused, m.pauses, m.published, m.publishFailures, m.publishLag,
	}
	return m
}

// Describe sends the descriptors of every metric, for registration.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.all {
		c.Describe(ch)
	}
}

// Collect sends the current value of every series, on scrape.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.all {
		c.Collect(ch)
	}
}

// outcomes lists every idem.Outcome, so that each consumer/queue starts with all of them at zero.
func outcomes() []idem.Outcome {
	return []idem.Outcome{idem.OutcomeProcessed, idem.OutcomeDuplicate, idem.OutcomeKeyReuse,
		idem.OutcomeFailed, idem.OutcomeRetried, idem.OutcomeDeadLettered, idem.OutcomeAbandoned,
		idem.OutcomeIgnored}
}

// classes lists every idem.Class, for the same reason as outcomes.
func classes() []idem.Class {
	return []idem.Class{idem.ClassUnknown, idem.ClassTransient, idem.ClassPermanent}
}

// init creates the counters of a consumer/owner/queue triple at zero the first time it is seen.
// WithLabelValues never resets an existing series, so a Paused that came first stays 1.
func (m *Metrics) init(consumer, owner, queue string) {
	m.owners.Store(consumer, owner)
	key := consumer + "\xff" + owner + "\xff" + queue
	if _, ok := m.seen.Load(key); ok {
		return
	}
	if _, loaded := m.seen.LoadOrStore(key, struct{}{}); loaded {
		return
	}
	for _, o := range outcomes() {
		m.messages.WithLabelValues(consumer, owner, queue, string(o))
	}
	for _, c := range classes() {
		m.errors.WithLabelValues(consumer, owner, queue, c.String())
	}
	for _, r := range idem.Reasons() {
		m.deadLetters.WithLabelValues(consumer, owner, queue, string(r))
	}
	m.retries.WithLabelValues(consumer, owner, queue)
	m.duplicates.WithLabelValues(consumer, owner, queue)
	m.keyReuse.WithLabelValues(consumer, owner, queue)
	m.dlFailures.WithLabelValues(consumer, owner, queue)
	m.paused.WithLabelValues(consumer, owner)
	m.pauses.WithLabelValues(consumer, owner)
}

// Observe records one settled delivery; the consumer calls it (idem.Observer). A failed
// dead-letter write (idem.OutcomeDeadLetterFailed) only counts in
// idem_dead_letter_write_failures_total. Every outcome
// other than processed, duplicate and ignored counts as an error of ev.Class; an ignored
// delivery counts in idem_ignored_total by its reason. Only ev.Consumer,
// ev.Owner, ev.Queue, ev.Outcome, ev.Class and ev.Reason become labels: ev.EventID and
// ev.Tenant are ignored on purpose (see the package documentation on cardinality).
func (m *Metrics) Observe(ev idem.Observation) {
	c, o, q := ev.Consumer, ev.Owner, ev.Queue
	m.init(c, o, q)
	if ev.Outcome == idem.OutcomeDeadLetterFailed {
		// Not a verdict on the delivery: one failed write, counted on its own.
		m.dlFailures.WithLabelValues(c, o, q).Inc()
		return
	}
	m.messages.WithLabelValues(c, o, q, string(ev.Outcome)).Inc()
	m.handling.WithLabelValues(c, o, q, string(ev.Outcome)).Observe(seconds(ev.Duration))
	if ev.Outcome != idem.OutcomeProcessed && ev.Outcome != idem.OutcomeDuplicate && ev.Outcome != idem.OutcomeIgnored {
		m.errors.WithLabelValues(c, o, q, ev.Class.String()).Inc()
	}
	switch ev.Outcome {
	case idem.OutcomeRetried:
		m.retries.WithLabelValues(c, o, q).Inc()
	case idem.OutcomeDuplicate:
		m.duplicates.WithLabelValues(c, o, q).Inc()
	case idem.OutcomeIgnored:
		// idem.Ignore bounds the reason; its cardinality is the handler's to keep small.
		m.ignored.WithLabelValues(c, o, q, string(ev.Reason)).Inc()
	case idem.OutcomeKeyReuse:
		// Today the consumer dead-letters key reuse (reason key_reuse); this covers an observer
		// fed the raw outcome.
		m.keyReuse.WithLabelValues(c, o, q).Inc()
	case idem.OutcomeDeadLettered:
		reason := reasonLabel(ev.Reason)
		m.deadLetters.WithLabelValues(c, o, q, reason).Inc()
		if reason == string(idem.ReasonKeyReuse) {
			m.keyReuse.WithLabelValues(c, o, q).Inc()
		}
	}
	if len(ev.Recovered) > 0 {
		h := m.recovery.WithLabelValues(c, o)
		for _, d := range ev.Recovered {
			h.Observe(seconds(d))
		}
	}
}

// reasonLabel keeps the reason label within idem's closed set: an unknown reason becomes
// "unknown" instead of a new series.
func reasonLabel(r idem.Reason) string {
	if r.Valid() {
		return string(r)
	}
	return "unknown"
}

// Paused records that consumer paused itself (idem.Observer): its
// idem_consumer_paused gauge goes to 1 and idem_consumer_pauses_total counts the pause.
func (m *Metrics) Paused(consumer string) {
	owner := m.owner(consumer)
	m.paused.WithLabelValues(consumer, owner).Set(1)
	m.pauses.WithLabelValues(consumer, owner).Inc()
}

// ConsumerOwner records consumer's owner (idem.OwnerObserver; Run calls it when it starts), so
// that a pause before any settled delivery carries the owner label, and creates the consumer's
// paused gauge at 0.
func (m *Metrics) ConsumerOwner(consumer, owner string) {
	m.owners.Store(consumer, owner)
	m.paused.WithLabelValues(consumer, owner)
	m.pauses.WithLabelValues(consumer, owner)
}

// owner is the owner last seen for consumer ("" when none was).
func (m *Metrics) owner(consumer string) string {
	if o, ok := m.owners.Load(consumer); ok {
		return o.(string)
	}
	return ""
}

// Resumed sets consumer's idem_consumer_paused gauge back to 0. idem does not call it: the
// application does when it runs a paused consumer again, so an alert on the gauge clears.
func (m *Metrics) Resumed(consumer string) {
	m.paused.WithLabelValues(consumer, m.owner(consumer)).Set(0)
}

// Published records that the relay published n events of topic. lag is how long the oldest of
// them waited in the outbox (now minus its creation time): the lag histogram gets one
// observation per batch, its worst case, so a large batch does not drown a slow one.
func (m *Metrics) Published(topic string, n int, lag time.Duration) {
	if n <= 0 {
		return
	}
	m.published.WithLabelValues(topic).Add(float64(n))
	m.publishLag.WithLabelValues(topic).Observe(seconds(lag))
}

// PublishFailed records one failed publish of an event of topic: class is how the error was
// classified and dead reports that the event was dead-lettered rather than rescheduled.
func (m *Metrics) PublishFailed(topic string, class idem.Class, dead bool) {
	m.publishFailures.WithLabelValues(topic, class.String(), strconv.FormatBool(dead)).Inc()
}

// seconds converts d for a histogram, clamping the negative values clock skew can produce.
func seconds(d time.Duration) float64 {
	if d < 0 {
		return 0
	}
	return d.Seconds()
}
