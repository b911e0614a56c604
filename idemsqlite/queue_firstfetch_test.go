package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/retry"
)

// TestQueueRetryBudgetAcrossRestart: a process fetched a job and died before a verdict; a new
// consumer (nothing in memory) gets the job after the retry budget's elapsed time has passed
// since that first fetch. The queue table's first-fetch time reaches the runtime through the
// delivery, so the new consumer's first failure already exhausts the budget: one call, dead
// lettered, not retried as if the job were new.
func TestQueueRetryBudgetAcrossRestart(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	require.NoError(t, b.store.QueuePublish(b.ctx, "budget", msgs("e1")...))

	// The process that died: it leased the job and never settled it.
	jobs, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "budget", Max: 1, Lease: 50 * time.Millisecond})
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	budget := retry.Policy{MaxAttempts: 10, MaxElapsed: time.Second, Base: 20 * time.Millisecond, Cap: 100 * time.Millisecond}
	time.Sleep(budget.MaxElapsed + 200*time.Millisecond)

	obs := &recordingObserver{}
	var calls atomic.Int64
	c, err := idem.NewConsumer(b.store, idem.ConsumerConfig[*sql.Tx]{
		Name: "budget@v1",
		Handler: func(context.Context, *sql.Tx, idem.Message) error {
			calls.Add(1)
			return idem.Transient(errors.New("upstream 503"))
		},
		Failure: idem.FailureConfig{
			Retry: budget,
		},
		Observe: idem.ObserveConfig{
			Observer: obs,
		},
	})
	require.NoError(t, err)
	src, err := idemqueue.NewSource[*sql.Tx](b.store, idemqueue.SourceConfig{Queue: "budget", Lease: time.Minute, MaxWait: 20 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx, src) }()
	require.Eventually(t, func() bool { return len(obs.outcomes()) > 0 }, 20*time.Second, 10*time.Millisecond, "no verdict")
	// A wrong retry would come within the backoff cap.
	time.Sleep(3 * budget.Cap)
	cancel()
	require.NoError(t, <-ran)

	require.Equal(t, []idem.Outcome{idem.OutcomeDeadLettered}, obs.outcomes(), "the budget counted from the first fetch")
	require.EqualValues(t, 1, calls.Load())
}
