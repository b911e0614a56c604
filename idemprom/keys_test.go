package idemprom

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemkey"
)

func TestKeyMetrics(t *testing.T) {
	t.Parallel()
	k := NewKeyMetrics(Config{})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(k))
	ctx := context.Background()
	route := "POST /orders/{id}/pay"
	for _, o := range []idemkey.Observation{
		{Outcome: idemkey.OutcomeProcessed, Status: 201, Route: route, Duration: 4 * time.Millisecond},
		{Outcome: idemkey.OutcomeReplayed, Status: 201, Route: route, Duration: time.Millisecond},
		{Outcome: idemkey.OutcomeReplayed, Status: 201, Route: route, Duration: time.Millisecond},
		{Outcome: idemkey.OutcomeRolledBack, Route: route, Duration: 2 * time.Millisecond},
		{Outcome: idemkey.OutcomeRefused, Status: 400},
	} {
		k.Observe(ctx, o)
	}
	require.Equal(t, 1.0, testutil.ToFloat64(k.requests.WithLabelValues(route, "processed", "201")))
	require.Equal(t, 2.0, testutil.ToFloat64(k.requests.WithLabelValues(route, "replayed", "201")))
	require.Equal(t, 1.0, testutil.ToFloat64(k.requests.WithLabelValues(route, "rolled_back", "aborted")))
	require.Equal(t, 1.0, testutil.ToFloat64(k.requests.WithLabelValues("", "refused", "400")))
	n, err := testutil.GatherAndCount(reg, "idem_http_key_request_seconds")
	require.NoError(t, err)
	require.Equal(t, 4, n, "one histogram per route and outcome")
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP idem_http_key_requests_total Requests that needed an Idempotency-Key, by route, outcome and status. A rising share of replayed or in_flight means clients retry faster than requests complete.
# TYPE idem_http_key_requests_total counter
idem_http_key_requests_total{outcome="processed",route="POST /orders/{id}/pay",status="201"} 1
idem_http_key_requests_total{outcome="refused",route="",status="400"} 1
idem_http_key_requests_total{outcome="replayed",route="POST /orders/{id}/pay",status="201"} 2
idem_http_key_requests_total{outcome="rolled_back",route="POST /orders/{id}/pay",status="aborted"} 1
`), "idem_http_key_requests_total"))
}
