package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testenv"
)

// TestSmoke runs every case small, as CI's smoke version of `idem bench`: the numbers mean
// nothing at this size, but every case must run and every ratio must be computable.
func TestSmoke(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rs, err := Run(ctx, Options{
		PostgresURL: testenv.Postgres(t), NATSURL: testenv.NATS(t),
		Events: 200, Concurrency: []int{1, 8}, BatchSizes: []int{10, 100},
		Cases: []string{"baseline", "ceiling", "per_event", "batched", "set_batch", "set_ceiling", "pipeline_queue", "pipeline_jetstream", "outbox_e2e", "memory", "large_inbox",
			"sqlite_ceiling", "sqlite_per_event", "sqlite_batched", "sqlite_set_batch", "sqlite_pipeline"},
		LargeInboxClaims: 20000, OfferedRate: 100, OfferedSeconds: 2,
		Logf: t.Logf,
	})
	require.NoError(t, err)
	cases := map[string]bool{}
	for _, r := range rs {
		cases[r.Case] = true
		require.Positive(t, r.EventsPerS, "%+v", r)
	}
	for _, c := range []string{"baseline", "ceiling", "per_event", "batched", "set_batch", "set_ceiling", "pipeline_queue", "pipeline_jetstream", "outbox_e2e", "memory_batched", "large_inbox",
		"sqlite_ceiling", "sqlite_per_event", "sqlite_batched", "sqlite_set_batch", "sqlite_pipeline"} {
		require.True(t, cases[c], "case %s ran", c)
	}
	ratios := RatioMap(Ratios(rs))
	for _, k := range []string{"per_event/ceiling", "batched/per_event", "set_batch/per_event", "set_batch/set_ceiling", "per_event/baseline",
		"pipeline_queue/per_event", "pipeline_queue_batched/batched", "pipeline_jetstream/per_event", "pipeline_jetstream_batched/batched",
		"large_inbox/empty_inbox_plain", "large_inbox/empty_inbox_partitioned",
		"sqlite_per_event/sqlite_ceiling", "sqlite_batched/sqlite_per_event", "sqlite_set_batch/sqlite_per_event",
		"sqlite_pipeline/sqlite_ceiling", "sqlite_pipeline_batched/sqlite_batched"} {
		require.Positive(t, ratios[k], "ratio %s", k)
	}
	for _, r := range rs {
		if r.Case == "set_batch" {
			require.Positive(t, r.AllocsPerEv, "set_batch reports its allocations")
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{}, "PostgreSQL URL is empty"},
		{Options{PostgresURL: "postgres://x", Concurrency: []int{0}}, "--concurrency 0"},
		{Options{PostgresURL: "postgres://x", Cases: []string{"nope"}}, `unknown case "nope"`},
		{Options{PostgresURL: "postgres://x", BatchSizes: []int{-1}}, "batch size -1"},
	} {
		err := tc.o.WithDefaults().Validate()
		require.ErrorContains(t, err, tc.want)
	}
}

// TestRatiosOnlyFromCasesThatRan: a ratio is computed only when both of its cases ran, and the
// ratios object holds throughput ratios only.
func TestRatiosOnlyFromCasesThatRan(t *testing.T) {
	t.Parallel()
	rs := []Result{
		{Case: "per_event", Concurrency: 8, EventsPerS: 2000},
		{Case: "set_batch", Concurrency: 8, Batch: 100, EventsPerS: 30000, AllocsPerEv: 12},
		{Case: "set_batch", Concurrency: 4, Batch: 100, EventsPerS: 99999},
		{Case: "pipeline_queue", Concurrency: 8, EventsPerS: 1000},
		{Case: "pipeline_sqs", Concurrency: 8, EventsPerS: 500},
		{Case: "pipeline_sqs", Concurrency: 8, Batch: 100, EventsPerS: 5000}, // batched(100) did not run
	}
	m := RatioMap(Ratios(rs))
	require.Equal(t, map[string]float64{"set_batch/per_event": 15, "pipeline_queue/per_event": 0.5, "pipeline_sqs/per_event": 0.25}, m)
	var allocs []Ratio
	for _, r := range Ratios(rs) {
		if r.Key == "" {
			allocs = append(allocs, r)
		}
	}
	require.Len(t, allocs, 1)
	require.True(t, allocs[0].OK)
	require.EqualValues(t, 12, allocs[0].Value)
}

// TestSmokeSQS runs the SQS pipeline case small, against IDEM_SQS_URL or a moto_server the test
// starts: every variant runs and moves every event.
func TestSmokeSQS(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rs, err := Run(ctx, Options{
		PostgresURL: testenv.Postgres(t), SQSURL: "sqs://" + strings.TrimPrefix(testenv.SQS(t), "http://"),
		Events: 100, Cases: []string{"pipeline_sqs"}, Logf: t.Logf,
	})
	require.NoError(t, err)
	require.Len(t, rs, 2, "per event and batched(100)")
	for _, r := range rs {
		require.Equal(t, "pipeline_sqs", r.Case)
		require.Positive(t, r.EventsPerS, "%+v", r)
	}
}

// TestSmokeBrokers runs each broker pipeline case small beside per_event, against the service
// its variable names or the in-process one the case starts: every variant runs and moves every event, and its ratio is computed.
func TestSmokeBrokers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts func(t *testing.T) Options
	}{
		{"pipeline_redis", func(t *testing.T) Options { return Options{RedisURL: testenv.URL(t, testenv.RedisVar)} }},
		{"pipeline_amqp", func(t *testing.T) Options { return Options{AMQPURL: testenv.AMQP(t)} }},
		{"pipeline_kafka", func(*testing.T) Options { return Options{} }},
		{"pipeline_pubsub", func(*testing.T) Options { return Options{} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			o := tc.opts(t)
			o.PostgresURL, o.Events, o.Concurrency, o.Cases, o.Logf = testenv.Postgres(t), 100, []int{8}, []string{"per_event", tc.name}, t.Logf
			rs, err := Run(ctx, o)
			require.NoError(t, err)
			var n int
			for _, r := range rs {
				require.Positive(t, r.EventsPerS, "%+v", r)
				if r.Case == tc.name {
					require.Equal(t, 100, r.Events)
					n++
				}
			}
			require.Equal(t, 2, n, "per event and batched(100)")
			require.Positive(t, RatioMap(Ratios(rs))[tc.name+"/per_event"])
		})
	}
}

// TestSmokeRelay keeps the relay cases running: both drain their backlog, and the ratio the
// issue holds the relay to is computed.
func TestSmokeRelay(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rs, err := Run(ctx, Options{
		PostgresURL: testenv.Postgres(t), NATSURL: testenv.NATS(t),
		Events: 300, Concurrency: []int{8}, Cases: []string{"relay", "relay_ceiling"}, Logf: t.Logf,
	})
	require.NoError(t, err)
	require.Len(t, rs, 2)
	for _, r := range rs {
		require.Equal(t, 300, r.Events, "%+v", r)
		require.Positive(t, r.EventsPerS, "%+v", r)
	}
	require.Positive(t, RatioMap(Ratios(rs))["relay/relay_ceiling"])
}
