package idempg_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempg"
)

// TestOutboxHeldRows: the outbox keeps a row's first attempt time (the relay's budget counts from
// it), and a dead row with a dead letter stays in the fetch, holding its key, until it is marked
// published; a dead row without one (written before migration 050) is out of the way as before.
func TestOutboxHeldRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, idempg.Config{OutboxPartitions: 1})
	enqueue(t, store, outgoing("e1", "k"), outgoing("e2", "k"), outgoing("e3", "j"))
	fetch := func() []idem.OutboxRow {
		rows, err := store.OutboxFetch(ctx, idem.OutboxFetchParams{Partitions: []int{0}, Limit: 10})
		require.NoError(t, err)
		return rows
	}
	ids := func(rows []idem.OutboxRow) []string {
		var out []string
		for _, r := range rows {
			out = append(out, r.Outgoing.EventID)
		}
		return out
	}
	rows := fetch()
	require.Len(t, rows, 3)
	require.True(t, rows[0].FirstAttemptAt.IsZero(), "never tried")

	first := time.Now().UTC().Add(-time.Hour).Truncate(time.Microsecond)
	require.NoError(t, store.OutboxMarkFailed(ctx, idem.OutboxFailParams{
		ID: rows[0].ID, Attempts: 1, LastError: "down", NextAttemptAt: time.Now(), FirstAttemptAt: first}))
	got := fetch()[0]
	require.True(t, first.Equal(got.FirstAttemptAt), "first attempt %v, want %v", got.FirstAttemptAt, first)
	require.False(t, got.Dead)

	require.NoError(t, store.OutboxMarkFailed(ctx, idem.OutboxFailParams{
		ID: rows[0].ID, Attempts: 2, LastError: "gave up", NextAttemptAt: time.Now(), FirstAttemptAt: first, Dead: true, DeadLetterID: 42}))
	require.NoError(t, store.OutboxMarkFailed(ctx, idem.OutboxFailParams{
		ID: rows[2].ID, Attempts: 1, LastError: "no dead letter", NextAttemptAt: time.Now(), Dead: true}))
	held := fetch()
	require.Equal(t, []string{"e1", "e2"}, ids(held), "the dead row with a dead letter stays; the one without is gone")
	require.True(t, held[0].Dead)
	require.EqualValues(t, 42, held[0].DeadLetterID)

	limited, err := store.OutboxFetch(ctx, idem.OutboxFetchParams{Partitions: []int{0}, Limit: 1})
	require.NoError(t, err)
	require.Equal(t, []string{"e1"}, ids(limited), "dead and live rows merge in id order under the limit")

	require.NoError(t, store.OutboxMarkPublished(ctx, []int64{held[0].ID}, time.Now()))
	require.Equal(t, []string{"e2"}, ids(fetch()), "released")
}

// TestQueueRelease: a job given back by a Receive that ended is available at once and its
// attempt is not counted; a stale token cannot release it.
func TestQueueRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, idempg.Config{})
	require.NoError(t, store.QueuePublish(ctx, "q", idem.Message{EventID: "e1", Payload: []byte("p")}))
	fetch := func() []idem.QueueJob {
		jobs, err := store.QueueFetch(ctx, idem.QueueFetchParams{Queue: "q", Max: 10, Lease: time.Hour, Now: time.Now()})
		require.NoError(t, err)
		return jobs
	}
	jobs := fetch()
	require.Len(t, jobs, 1)
	require.Equal(t, 1, jobs[0].Message.Attempt)
	require.NoError(t, store.QueueRelease(ctx, jobs[0].ID, jobs[0].Token))
	require.ErrorIs(t, store.QueueRelease(ctx, jobs[0].ID, jobs[0].Token), idem.ErrLeaseLost, "already released")
	again := fetch()
	require.Len(t, again, 1, "available at once, not after the lease")
	require.Equal(t, 1, again[0].Message.Attempt, "the given-back fetch spent no attempt")
	require.ErrorIs(t, store.QueueRelease(ctx, jobs[0].ID, jobs[0].Token), idem.ErrLeaseLost, "stale token")
}
