package idemsqlite_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/storetest"
)

// TestOutboxHeldRows runs the conformance check of first attempt times and dead rows holding
// their key (storetest.ExerciseOutboxHeldRows).
func TestOutboxHeldRows(t *testing.T) {
	t.Parallel()
	storetest.ExerciseOutboxHeldRows(t, factory)
}

// TestQueueRelease: a job given back by a Receive that ended is available at once and its
// attempt is not counted; a stale token cannot release it.
func TestQueueRelease(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", idem.Message{EventID: "e1", Payload: []byte("p")}))
	fetch := func() []idem.QueueJob {
		jobs, err := b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "q", Max: 10, Lease: time.Hour, Now: time.Now()})
		require.NoError(t, err)
		return jobs
	}
	jobs := fetch()
	require.Len(t, jobs, 1)
	require.Equal(t, 1, jobs[0].Message.Attempt)
	require.NoError(t, b.store.QueueRelease(b.ctx, jobs[0].ID, jobs[0].Token))
	require.ErrorIs(t, b.store.QueueRelease(b.ctx, jobs[0].ID, jobs[0].Token), idem.ErrLeaseLost, "already released")
	again := fetch()
	require.Len(t, again, 1, "available at once, not after the lease")
	require.Equal(t, 1, again[0].Message.Attempt, "the given-back fetch spent no attempt")
	require.ErrorIs(t, b.store.QueueRelease(b.ctx, jobs[0].ID, jobs[0].Token), idem.ErrLeaseLost, "stale token")
}
