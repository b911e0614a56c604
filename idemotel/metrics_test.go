package idemotel_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
)

// collect returns every data point of reader as "name{k=v,…}" → value (sums and gauges) or
// sample count (histograms).
func collectFloat(t *testing.T, reader *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	return collect(t, reader)
}

func collect(t *testing.T, reader *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]float64{}
	key := func(name string, set attribute.Set) string {
		s := name + "{"
		for i, kv := range set.ToSlice() {
			if i > 0 {
				s += ","
			}
			s += string(kv.Key) + "=" + kv.Value.String()
		}
		return s + "}"
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)] = float64(p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)] = float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)] = float64(p.Count)
				}
			default:
				t.Fatalf("metric %s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

func TestMetricsMatchIdemprom(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tel, err := idemotel.New(idemotel.Config{MeterProvider: mp})
	require.NoError(t, err)

	base := idem.Observation{Consumer: "ledger@v1", Owner: "payments", Queue: "payments", Tenant: "acme", EventID: "evt-1", Attempt: 1, Duration: 3 * time.Millisecond}
	events := []func(idem.Observation) idem.Observation{
		func(e idem.Observation) idem.Observation {
			e.Outcome = idem.OutcomeProcessed
			e.Recovered = []time.Duration{time.Hour}
			return e
		},
		func(e idem.Observation) idem.Observation { e.Outcome = idem.OutcomeDuplicate; return e },
		func(e idem.Observation) idem.Observation {
			e.Outcome, e.Reason = idem.OutcomeIgnored, "order_deleted"
			return e
		},
		func(e idem.Observation) idem.Observation {
			e.Outcome, e.Class, e.Delay = idem.OutcomeRetried, idem.ClassTransient, time.Second
			return e
		},
		func(e idem.Observation) idem.Observation {
			e.Outcome, e.Class, e.Reason = idem.OutcomeDeadLettered, idem.ClassPermanent, idem.ReasonKeyReuse
			return e
		},
		func(e idem.Observation) idem.Observation {
			e.Outcome, e.Class, e.Reason = idem.OutcomeDeadLetterFailed, idem.ClassTransient, idem.ReasonPermanentError
			return e
		},
	}
	for _, f := range events {
		tel.Observe(f(base))
	}
	tel.Paused("ledger@v1")
	tel.Published("payments", 3, 2*time.Second)
	tel.PublishFailed("payments", idem.ClassTransient, false)

	got := collect(t, reader)
	for name, want := range map[string]float64{
		series("idem_messages_total", "consumer=ledger@v1", "owner=payments", "queue=payments", "outcome=processed"):     1,
		series("idem_messages_total", "consumer=ledger@v1", "owner=payments", "queue=payments", "outcome=duplicate"):     1,
		series("idem_messages_total", "consumer=ledger@v1", "owner=payments", "queue=payments", "outcome=retried"):       1,
		series("idem_messages_total", "consumer=ledger@v1", "owner=payments", "queue=payments", "outcome=dead_lettered"): 1,
		series("idem_messages_total", "consumer=ledger@v1", "owner=payments", "queue=payments", "outcome=abandoned"):     0,
		series("idem_errors_total", "class=transient", "consumer=ledger@v1", "owner=payments", "queue=payments"):         1,
		series("idem_errors_total", "class=permanent", "consumer=ledger@v1", "owner=payments", "queue=payments"):         1,
		series("idem_retries_total", "consumer=ledger@v1", "owner=payments", "queue=payments"):                           1,
		series("idem_ignored_total", "consumer=ledger@v1", "owner=payments", "queue=payments", "reason=order_deleted"):   1,
		series("idem_messages_total", "consumer=ledger@v1", "owner=payments", "queue=payments", "outcome=ignored"):       1,
		series("idem_duplicates_ignored_total", "consumer=ledger@v1", "owner=payments", "queue=payments"):                1,
		series("idem_key_reuse_total", "consumer=ledger@v1", "owner=payments", "queue=payments"):                         1,
		series("idem_dead_letters_total", "consumer=ledger@v1", "owner=payments", "queue=payments", "reason=key_reuse"):  1,
		series("idem_dead_letters_total", "consumer=ledger@v1", "owner=payments", "queue=payments", "reason=too_old"):    0,
		series("idem_dead_letter_write_failures_total", "consumer=ledger@v1", "owner=payments", "queue=payments"):        1,
		series("idem_handling_seconds", "consumer=ledger@v1", "owner=payments", "queue=payments", "outcome=processed"):   1,
		series("idem_recovery_seconds", "consumer=ledger@v1", "owner=payments"):                                          1,
		series("idem_consumer_paused", "consumer=ledger@v1", "owner=payments"):                                           1,
		series("idem_consumer_pauses_total", "consumer=ledger@v1", "owner=payments"):                                     1,
		series("idem_outbox_published_total", "topic=payments"):                                                          3,
		series("idem_outbox_publish_lag_seconds", "topic=payments"):                                                      1,
		series("idem_outbox_publish_failures_total", "class=transient", "dead=false", "topic=payments"):                  1,
	} {
		v, ok := got[name]
		require.True(t, ok, "no series %s in %v", name, got)
		require.Equal(t, want, v, name)
	}
	for name := range got {
		require.NotContains(t, name, "evt-1", "an event id became a metric attribute")
		require.NotContains(t, name, "acme", "a tenant became a metric attribute")
	}

	tel.Resumed("ledger@v1")
	require.Equal(t, 0.0, collect(t, reader)[series("idem_consumer_paused", "consumer=ledger@v1", "owner=payments")])
}

// series names a data point as collect does: its attributes sorted by key.
func series(name string, kvs ...string) string {
	slices.Sort(kvs)
	return name + "{" + strings.Join(kvs, ",") + "}"
}
