package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// ExerciseQueueRelease checks QueueRelease, which gives back a job a Receive fetched but did not
// return: the job is available at once and its attempt is not counted, and a released or stale
// token cannot release it again (idem.ErrLeaseLost). A store without a queue or without
// QueueRelease is skipped.
func ExerciseQueueRelease[TTx any](t *testing.T, factory Factory[TTx]) {
	t.Helper()
	ctx := context.Background()
	qs, ok := factory(t).Store.(idemstore.QueueStore)
	if !ok {
		t.Skip("the store has no queue table (not an idemstore.QueueStore)")
	}
	rel, ok := qs.(queueReleaser)
	if !ok {
		t.Skip("the store has no QueueRelease")
	}
	require.NoError(t, qs.QueuePublish(ctx, "q", idem.Message{EventID: "e1", Payload: []byte("p")}))
	fetch := func() []idemstore.QueueJob {
		jobs, err := qs.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: "q", Max: 10, Lease: time.Hour, Now: time.Now()})
		require.NoError(t, err)
		return jobs
	}
	jobs := fetch()
	require.Len(t, jobs, 1)
	require.Equal(t, 1, jobs[0].Message.Attempt)
	require.NoError(t, rel.QueueRelease(ctx, jobs[0].ID, jobs[0].Token))
	require.ErrorIs(t, rel.QueueRelease(ctx, jobs[0].ID, jobs[0].Token), idem.ErrLeaseLost, "already released")
	again := fetch()
	require.Len(t, again, 1, "available at once, not after the lease")
	require.Equal(t, 1, again[0].Message.Attempt, "the given-back fetch spent no attempt")
	require.ErrorIs(t, rel.QueueRelease(ctx, jobs[0].ID, jobs[0].Token), idem.ErrLeaseLost, "stale token")
}
