package idem_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestMemStoreClaimWaitsLikeAUniqueIndex holds the root tests' store to what storetest's
// ConcurrentDeliveriesApplyOnce asks of every real store: concurrent deliveries of one event
// apply it once. A claim of a key another open transaction holds waits for it: a duplicate once
// that transaction commits, a claim of its own when it rolls back. Without the wait both claims
// succeeded and the runtime's tests ran a handler twice for one event.
func TestMemStoreClaimWaitsLikeAUniqueIndex(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// failures is how many handlers fail transiently (the first, holding its claim open),
		// which rolls their claims back.
		failures int64
	}{
		{name: "commit"},
		{name: "rollback", failures: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var runs atomic.Int64
			release := make(chan struct{})
			store := newMemStore()
			c := memConsumer(t, store, func(cfg *idem.ConsumerConfig[*memTx]) {
				cfg.Handler = func(ctx context.Context, _ *memTx, _ idem.Message) error {
					if runs.Add(1) == 1 {
						<-release // hold the claim open while the others arrive
						if tc.failures > 0 {
							return idem.Transient(errors.New("provider unavailable"))
						}
					}
					return nil
				}
			})
			msg := idem.Message{EventID: "evt-race", Payload: []byte(`{}`)}
			const n = 16
			outcomes := make(chan idem.Outcome, n)
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() { outcomes <- c.Process(context.Background(), msg).Outcome })
			}
			// Every delivery has reached its claim while the first holds its own open.
			require.Eventually(t, func() bool { return runs.Load() >= 1 && store.claimCallCount() == n }, 10*time.Second, time.Millisecond)
			close(release)
			wg.Wait()
			close(outcomes)
			got := map[idem.Outcome]int64{}
			for o := range outcomes {
				got[o]++
			}
			require.EqualValues(t, 1, got[idem.OutcomeProcessed], "outcomes %v", got)
			require.Equal(t, n-1-tc.failures, got[idem.OutcomeDuplicate], "outcomes %v", got)
			require.Equal(t, tc.failures, got[idem.OutcomeFailed], "outcomes %v", got)
			require.Equal(t, 1+tc.failures, runs.Load(), "handler runs")
		})
	}
}
