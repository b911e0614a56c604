package idemprom

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	consumer = "ledger@v1"
	owner    = "payments"
	queue    = "orders"
)

// ev returns an event of the test consumer and queue.
func ev(o idem.Outcome, class idem.Class, reason idem.Reason) idem.Observation {
	return idem.Observation{Consumer: consumer, Owner: owner, Queue: queue, EventID: "evt-1", Tenant: "acme", Attempt: 1,
		Outcome: o, Class: class, Reason: reason, Duration: 3 * time.Millisecond}
}

// series names one counter or gauge series for ToFloat64.
type series struct {
	name string
	get  func(m *Metrics) prometheus.Collector
	want float64
}

func messages(o idem.Outcome, want float64) series {
	return series{"messages_total{" + string(o) + "}", func(m *Metrics) prometheus.Collector {
		return m.messages.WithLabelValues(consumer, owner, queue, string(o))
	}, want}
}

func errorsOf(c idem.Class, want float64) series {
	return series{"errors_total{" + c.String() + "}", func(m *Metrics) prometheus.Collector {
		return m.errors.WithLabelValues(consumer, owner, queue, c.String())
	}, want}
}

func deadLetters(r string, want float64) series {
	return series{"dead_letters_total{" + r + "}", func(m *Metrics) prometheus.Collector {
		return m.deadLetters.WithLabelValues(consumer, owner, queue, r)
	}, want}
}

func retries(want float64) series {
	return series{"retries_total", func(m *Metrics) prometheus.Collector { return m.retries.WithLabelValues(consumer, owner, queue) }, want}
}

func duplicates(want float64) series {
	return series{"duplicates_ignored_total", func(m *Metrics) prometheus.Collector { return m.duplicates.WithLabelValues(consumer, owner, queue) }, want}
}

func keyReuse(want float64) series {
	return series{"key_reuse_total", func(m *Metrics) prometheus.Collector { return m.keyReuse.WithLabelValues(consumer, owner, queue) }, want}
}

func ignored(reason string, want float64) series {
	return series{"ignored_total{" + reason + "}", func(m *Metrics) prometheus.Collector {
		return m.ignored.WithLabelValues(consumer, owner, queue, reason)
	}, want}
}

func dlWriteFailures(want float64) series {
	return series{"dead_letter_write_failures_total", func(m *Metrics) prometheus.Collector {
		return m.dlFailures.WithLabelValues(consumer, owner, queue)
	}, want}
}

func TestObserve(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		events []idem.Observation
		want   []series
	}{
		{
			name:   "processed counts no error",
			events: []idem.Observation{ev(idem.OutcomeProcessed, idem.ClassUnknown, "")},
			want: []series{messages(idem.OutcomeProcessed, 1), errorsOf(idem.ClassUnknown, 0),
				errorsOf(idem.ClassTransient, 0), retries(0), duplicates(0), keyReuse(0)},
		},
		{
			name:   "duplicate is ignored, not an error",
			events: []idem.Observation{ev(idem.OutcomeDuplicate, idem.ClassUnknown, ""), ev(idem.OutcomeDuplicate, idem.ClassUnknown, "")},
			want:   []series{messages(idem.OutcomeDuplicate, 2), duplicates(2), errorsOf(idem.ClassUnknown, 0)},
		},
		{
			name:   "retried counts a retry and its class",
			events: []idem.Observation{ev(idem.OutcomeRetried, idem.ClassTransient, "")},
			want:   []series{messages(idem.OutcomeRetried, 1), retries(1), errorsOf(idem.ClassTransient, 1), errorsOf(idem.ClassPermanent, 0)},
		},
		{
			name:   "dead letter for key reuse",
			events: []idem.Observation{ev(idem.OutcomeDeadLettered, idem.ClassPermanent, idem.ReasonKeyReuse)},
			want: []series{messages(idem.OutcomeDeadLettered, 1), deadLetters("key_reuse", 1), keyReuse(1),
				errorsOf(idem.ClassPermanent, 1), retries(0)},
		},
		{
			name:   "dead letter for exhausted retries is not key reuse",
			events: []idem.Observation{ev(idem.OutcomeDeadLettered, idem.ClassTransient, idem.ReasonRetriesExhausted)},
			want:   []series{deadLetters("retries_exhausted", 1), deadLetters("key_reuse", 0), keyReuse(0), errorsOf(idem.ClassTransient, 1)},
		},
		{
			name:   "unknown reason stays bounded",
			events: []idem.Observation{ev(idem.OutcomeDeadLettered, idem.ClassPermanent, "made up by a bug")},
			want:   []series{deadLetters("unknown", 1)},
		},
		{
			name:   "raw key reuse outcome",
			events: []idem.Observation{ev(idem.OutcomeKeyReuse, idem.ClassPermanent, idem.ReasonKeyReuse)},
			want:   []series{messages(idem.OutcomeKeyReuse, 1), keyReuse(1), errorsOf(idem.ClassPermanent, 1), deadLetters("key_reuse", 0)},
		},
		{
			name: "failed dead-letter writes count apart, not as deliveries",
			events: []idem.Observation{ev(idem.OutcomeDeadLetterFailed, idem.ClassTransient, idem.ReasonPermanentError),
				ev(idem.OutcomeDeadLetterFailed, idem.ClassTransient, idem.ReasonPermanentError)},
			want: []series{dlWriteFailures(2), messages(idem.OutcomeDeadLetterFailed, 0), errorsOf(idem.ClassTransient, 0),
				deadLetters("permanent_error", 0)},
		},
		{
			name: "ignored counts by the handler's reason, not as an error",
			events: []idem.Observation{ev(idem.OutcomeIgnored, idem.ClassUnknown, "order_deleted"),
				ev(idem.OutcomeIgnored, idem.ClassUnknown, "order_deleted"), ev(idem.OutcomeIgnored, idem.ClassUnknown, "account_closed")},
			want: []series{messages(idem.OutcomeIgnored, 3), ignored("order_deleted", 2), ignored("account_closed", 1),
				errorsOf(idem.ClassUnknown, 0), duplicates(0), deadLetters("unknown", 0)},
		},
		{
			name:   "abandoned and failed are errors",
			events: []idem.Observation{ev(idem.OutcomeAbandoned, idem.ClassTransient, ""), ev(idem.OutcomeFailed, idem.ClassUnknown, "")},
			want: []series{messages(idem.OutcomeAbandoned, 1), messages(idem.OutcomeFailed, 1),
				errorsOf(idem.ClassTransient, 1), errorsOf(idem.ClassUnknown, 1)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := New(Config{})
			for _, e := range tt.events {
				m.Observe(e)
			}
			for _, s := range tt.want {
				require.InDelta(t, s.want, testutil.ToFloat64(s.get(m)), 0, s.name)
			}
		})
	}
}

// TestObserveInitialisesSeries checks that a consumer/queue starts with its counters at zero,
// so that increase() sees the first dead letter of each reason.
func TestObserveInitialisesSeries(t *testing.T) {
	t.Parallel()
	m := New(Config{})
	m.Observe(ev(idem.OutcomeProcessed, idem.ClassUnknown, ""))
	tests := []struct {
		metric string
		want   int
	}{
		{"idem_messages_total", 8},
		{"idem_errors_total", 3},
		{"idem_dead_letters_total", len(idem.Reasons())},
		{"idem_retries_total", 1},
		{"idem_duplicates_ignored_total", 1},
		{"idem_key_reuse_total", 1},
		{"idem_dead_letter_write_failures_total", 1},
		{"idem_consumer_paused", 1},
		{"idem_consumer_pauses_total", 1},
		{"idem_handling_seconds", 1},
		{"idem_recovery_seconds", 0},
	}
	for _, tt := range tests {
		t.Run(tt.metric, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, testutil.CollectAndCount(m, tt.metric))
		})
	}
}

func TestHistograms(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		feed   func(m *Metrics)
		metric string
		want   string
	}{
		{
			name: "handling time by outcome",
			feed: func(m *Metrics) {
				e := ev(idem.OutcomeProcessed, idem.ClassUnknown, "")
				e.Duration = 1500 * time.Millisecond
				m.Observe(e)
			},
			metric: "idem_handling_seconds",
			want: `
# HELP idem_handling_seconds Time from the start of handling to the delivery's verdict, by outcome.
# TYPE idem_handling_seconds histogram
idem_handling_seconds_bucket{consumer="ledger@v1",outcome="processed",owner="payments",queue="orders",le="1"} 0
idem_handling_seconds_bucket{consumer="ledger@v1",outcome="processed",owner="payments",queue="orders",le="2"} 1
idem_handling_seconds_bucket{consumer="ledger@v1",outcome="processed",owner="payments",queue="orders",le="+Inf"} 1
idem_handling_seconds_sum{consumer="ledger@v1",outcome="processed",owner="payments",queue="orders"} 1.5
idem_handling_seconds_count{consumer="ledger@v1",outcome="processed",owner="payments",queue="orders"} 1
`,
		},
		{
			name: "one recovery per replayed dead letter",
			feed: func(m *Metrics) {
				e := ev(idem.OutcomeProcessed, idem.ClassUnknown, "")
				e.Recovered = []time.Duration{30 * time.Second, 2 * time.Hour}
				m.Observe(e)
			},
			metric: "idem_recovery_seconds",
			want: `
# HELP idem_recovery_seconds Time from a dead letter's first failure to the processing of its replay.
# TYPE idem_recovery_seconds histogram
idem_recovery_seconds_bucket{consumer="ledger@v1",owner="payments",le="60"} 1
idem_recovery_seconds_bucket{consumer="ledger@v1",owner="payments",le="3600"} 1
idem_recovery_seconds_bucket{consumer="ledger@v1",owner="payments",le="7200"} 2
idem_recovery_seconds_bucket{consumer="ledger@v1",owner="payments",le="+Inf"} 2
idem_recovery_seconds_sum{consumer="ledger@v1",owner="payments"} 7230
idem_recovery_seconds_count{consumer="ledger@v1",owner="payments"} 2
`,
		},
		{
			name: "one lag per published batch, negative lag clamped",
			feed: func(m *Metrics) {
				m.Published("orders.created", 10, 3*time.Second)
				m.Published("orders.created", 2, -time.Second)
				m.Published("orders.created", 0, time.Hour) // nothing published: ignored
			},
			metric: "idem_outbox_publish_lag_seconds",
			want: `
# HELP idem_outbox_publish_lag_seconds Per published batch, how long its oldest event waited in the outbox.
# TYPE idem_outbox_publish_lag_seconds histogram
idem_outbox_publish_lag_seconds_bucket{topic="orders.created",le="1"} 1
idem_outbox_publish_lag_seconds_bucket{topic="orders.created",le="4"} 2
idem_outbox_publish_lag_seconds_bucket{topic="orders.created",le="+Inf"} 2
idem_outbox_publish_lag_seconds_sum{topic="orders.created"} 3
idem_outbox_publish_lag_seconds_count{topic="orders.created"} 2
`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := New(Config{Buckets: []float64{1, 2}, RecoveryBuckets: []float64{60, 3600, 7200}, LagBuckets: []float64{1, 4}})
			tt.feed(m)
			require.NoError(t, testutil.CollectAndCompare(m, strings.NewReader(tt.want), tt.metric))
		})
	}
}

func TestPaused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		feed       func(m *Metrics)
		wantPaused float64
		wantPauses float64
	}{
		// Run tells the owner (idem.OwnerObserver) before anything can pause.
		{"pause", func(m *Metrics) { m.ConsumerOwner(consumer, owner); m.Paused(consumer) }, 1, 1},
		{"owner told at start, nothing paused", func(m *Metrics) { m.ConsumerOwner(consumer, owner) }, 0, 0},
		{"pause survives the event that follows it", func(m *Metrics) {
			m.ConsumerOwner(consumer, owner)
			m.Paused(consumer)
			m.Observe(ev(idem.OutcomeAbandoned, idem.ClassPermanent, ""))
		}, 1, 1},
		{"resume clears the gauge, not the count", func(m *Metrics) {
			m.Observe(ev(idem.OutcomeProcessed, idem.ClassUnknown, "")) // the owner, learnt from an event
			m.Paused(consumer)
			m.Resumed(consumer)
			m.Paused(consumer)
			m.Resumed(consumer)
		}, 0, 2},
		{"events alone start unpaused", func(m *Metrics) { m.Observe(ev(idem.OutcomeProcessed, idem.ClassUnknown, "")) }, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := New(Config{})
			tt.feed(m)
			require.InDelta(t, tt.wantPaused, testutil.ToFloat64(m.paused.WithLabelValues(consumer, owner)), 0)
			require.InDelta(t, tt.wantPauses, testutil.ToFloat64(m.pauses.WithLabelValues(consumer, owner)), 0)
		})
	}
}

func TestRelayHooks(t *testing.T) {
	t.Parallel()
	m := New(Config{})
	m.Published("orders.created", 3, time.Second)
	m.Published("orders.created", 4, time.Second)
	m.PublishFailed("orders.created", idem.ClassTransient, false)
	m.PublishFailed("orders.created", idem.ClassTransient, false)
	m.PublishFailed("orders.created", idem.ClassPermanent, true)
	want := `
# HELP idem_outbox_published_total Outbox events published and marked published by a relay.
# TYPE idem_outbox_published_total counter
idem_outbox_published_total{topic="orders.created"} 7
# HELP idem_outbox_publish_failures_total Failed outbox publishes, by error class and whether the event was dead-lettered.
# TYPE idem_outbox_publish_failures_total counter
idem_outbox_publish_failures_total{class="permanent",dead="true",topic="orders.created"} 1
idem_outbox_publish_failures_total{class="transient",dead="false",topic="orders.created"} 2
`
	require.NoError(t, testutil.CollectAndCompare(m, strings.NewReader(want),
		"idem_outbox_published_total", "idem_outbox_publish_failures_total"))
}

// feedAll exercises every metric of m once per outcome, with the given event ids and tenants.
func feedAll(m *Metrics, ids, tenants []string) {
	for i := range ids {
		for _, o := range outcomes() {
			e := ev(o, idem.ClassTransient, idem.ReasonRetriesExhausted)
			e.EventID, e.Tenant = ids[i], tenants[i]
			e.Recovered = []time.Duration{time.Minute}
			m.Observe(e)
		}
	}
	m.Paused(consumer)
	m.Published("orders.created", 1, time.Second)
	m.PublishFailed("orders.created", idem.ClassPermanent, true)
}

func TestRegistryLintAndNamespace(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		cfg    Config
		prefix string
	}{
		{"default namespace", Config{}, "idem_"},
		{"custom namespace", Config{Namespace: "payments_idem"}, "payments_idem_"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			m := New(tt.cfg)
			require.NoError(t, reg.Register(m))
			feedAll(m, []string{"e1"}, []string{"t1"})

			problems, err := testutil.GatherAndLint(reg)
			require.NoError(t, err)
			require.Empty(t, problems)

			mfs, err := reg.Gather()
			require.NoError(t, err)
			require.Len(t, mfs, 15, "every metric has a series")
			for _, mf := range mfs {
				require.True(t, strings.HasPrefix(mf.GetName(), tt.prefix), mf.GetName())
				require.NotEmpty(t, mf.GetHelp(), mf.GetName())
			}
		})
	}
}

// TestCardinality feeds many events with distinct ids and tenants and checks that the number of
// series does not grow with them and that no label carries an id or a tenant.
func TestCardinality(t *testing.T) {
	t.Parallel()
	count := func(n int) (int, []string) {
		reg := prometheus.NewRegistry()
		m := New(Config{})
		reg.MustRegister(m)
		ids, tenants := make([]string, n), make([]string, n)
		for i := range n {
			ids[i], tenants[i] = fmt.Sprintf("evt-%05d", i), fmt.Sprintf("tenant-%05d", i)
		}
		feedAll(m, ids, tenants)
		mfs, err := reg.Gather()
		require.NoError(t, err)
		var total int
		var values []string
		for _, mf := range mfs {
			total += len(mf.GetMetric())
			for _, s := range mf.GetMetric() {
				for _, l := range s.GetLabel() {
					values = append(values, l.GetName()+"="+l.GetValue())
				}
			}
		}
		return total, values
	}
	one, _ := count(1)
	many, values := count(500)
	require.Equal(t, one, many, "series must not grow with event ids or tenants")
	for _, v := range values {
		require.NotContains(t, v, "evt-")
		require.NotContains(t, v, "tenant")
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		cfg   Config
		field string
	}{
		{"namespace with a dash", Config{Namespace: "my-app"}, "Config.Namespace"},
		{"namespace starting with a digit", Config{Namespace: "1idem"}, "Config.Namespace"},
		{"unsorted buckets", Config{Buckets: []float64{1, 0.5}}, "Config.Buckets"},
		{"repeated recovery bucket", Config{RecoveryBuckets: []float64{60, 60}}, "Config.RecoveryBuckets"},
		{"lag bucket NaN", Config{LagBuckets: []float64{math.NaN()}}, "Config.LagBuckets"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			defer func() {
				r := recover()
				require.NotNil(t, r)
				require.ErrorContains(t, r.(error), tt.field)
			}()
			New(tt.cfg)
		})
	}
}

// TestNoDefaultRegisterer checks that building and feeding the collectors leaves the global registry
// alone: registering is the application's call.
func TestNoDefaultRegisterer(t *testing.T) {
	t.Parallel()
	m := New(Config{Namespace: "idem_global_check"})
	feedAll(m, []string{"e1"}, []string{"t1"})
	_ = testutil.CollectAndCount(NewStoreCollector(StoreCollectorConfig{DeadLetters: &fakeDeadLetters{}}))
	mfs, err := prometheus.DefaultGatherer.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		require.False(t, strings.HasPrefix(mf.GetName(), "idem_"), mf.GetName())
	}
}

func TestObserveConcurrently(t *testing.T) {
	t.Parallel()
	m := New(Config{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	const workers, each = 8, 200
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				m.Observe(ev(idem.OutcomeProcessed, idem.ClassUnknown, ""))
				if i%50 == 0 {
					m.Paused(fmt.Sprintf("c%d", w))
					_, _ = reg.Gather()
				}
			}
		})
	}
	wg.Wait()
	require.InDelta(t, workers*each, testutil.ToFloat64(m.messages.WithLabelValues(consumer, owner, queue, "processed")), 0)
}
