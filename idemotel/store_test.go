package idemotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/idemstore"
)

// fakeStores answers the stats queries with fixed figures; a queue named "broken" fails. Their
// other methods are not used (the nil embedded interfaces would panic).
type fakeStores struct {
	idemstore.DeadLetterStore
	idemstore.QueueStore
	idemstore.OutboxRelayStore
	now time.Time
}

func (f *fakeStores) DeadLetterStats(context.Context) (idemstore.DeadLetterStats, error) {
	return idemstore.DeadLetterStats{Pending: 3, OldestPending: f.now.Add(-time.Minute),
		ByReason: map[idem.Reason]int64{idem.ReasonKeyReuse: 2, "from_a_newer_version": 1}}, nil
}

func (f *fakeStores) QueueStats(_ context.Context, queue string) (idemstore.QueueStats, error) {
	if queue == "broken" {
		return idemstore.QueueStats{}, errors.New("no such table")
	}
	return idemstore.QueueStats{Backlog: 5, Oldest: f.now.Add(-10 * time.Second)}, nil
}

func (f *fakeStores) OutboxStats(context.Context) (idemstore.QueueStats, error) {
	return idemstore.QueueStats{}, nil
}

func (f *fakeStores) LeaseList(context.Context, string, time.Time) ([]idemstore.Lease, error) {
	return []idemstore.Lease{{Name: "relay/member/a"}, {Name: "relay/member/b"}}, nil
}

func TestObserveStores(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tel, err := idemotel.New(idemotel.Config{MeterProvider: mp})
	require.NoError(t, err)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	stores := &fakeStores{now: now}
	reg, err := tel.ObserveStores(idemotel.StoreGaugesConfig{DeadLetters: stores, Queue: stores, Queues: []string{"payments", "broken", "payments"},
		Outbox: stores, Now: func() time.Time { return now }})
	require.NoError(t, err)

	got := collectFloat(t, reader)
	for name, want := range map[string]float64{
		series("idem_dead_letters_pending", "reason=key_reuse"):               2,
		series("idem_dead_letters_pending", "reason=too_old"):                 0,
		series("idem_dead_letters_pending", "reason=from_a_newer_version"):    1,
		series("idem_dead_letters_oldest_age_seconds"):                        60,
		series("idem_queue_backlog", "queue=payments"):                        5,
		series("idem_queue_oldest_age_seconds", "queue=payments"):             10,
		series("idem_outbox_backlog"):                                         0,
		series("idem_outbox_oldest_age_seconds"):                              0,
		series("idem_relay_members"):                                          2,
		series("idem_store_scrape_success", "figure=queue", "queue=payments"): 1,
		series("idem_store_scrape_success", "figure=queue", "queue=broken"):   0,
		series("idem_store_scrape_success", "figure=dead_letters", "queue="):  1,
	} {
		v, ok := got[name]
		require.True(t, ok, "no series %s in %v", name, got)
		require.Equal(t, want, v, name)
	}
	_, ok := got[series("idem_queue_backlog", "queue=broken")]
	require.False(t, ok, "a failed figure was reported")

	require.NoError(t, reg.Unregister())
	require.NotContains(t, collectFloat(t, reader), series("idem_relay_members"))
}
