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
		Cases:            []string{"baseline", "ceiling", "per_event", "batched", "pipeline_queue", "pipeline_jetstream", "outbox_e2e", "memory", "large_inbox"},
		LargeInboxClaims: 20000, OfferedRate: 100, OfferedSeconds: 2,
		Logf: t.Logf,
	})
	require.NoError(t, err)
	cases := map[string]bool{}
	for _, r := range rs {
		cases[r.Case] = true
		require.Positive(t, r.EventsPerS, "%+v", r)
	}
	for _, c := range []string{"baseline", "ceiling", "per_event", "batched", "pipeline_queue", "pipeline_jetstream", "outbox_e2e", "memory_batched", "large_inbox"} {
		require.True(t, cases[c], "case %s ran", c)
	}
	names := map[string]bool{}
	for _, r := range Ratios(rs) {
		names[r.Name] = true
	}
	require.True(t, names["per_event / ceiling (8 workers)"])
	require.True(t, names["batched(100) / per_event (8 workers)"])
	require.True(t, names["per_event / baseline (8 workers)"])
	require.True(t, names["large_inbox / empty inbox per_event (plain)"])
	require.True(t, names["large_inbox / empty inbox per_event (partitioned)"])
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
