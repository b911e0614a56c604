package idemmysql_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
)

// TestOutboxHeldRows: the outbox keeps a row's first attempt time (the relay's budget counts from
// it), and a dead row with a dead letter stays in the fetch, holding its key, until it is marked
// published; a dead row without one (written before migration 050) is out of the way as before.
func TestOutboxHeldRows(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmysql.Config{OutboxPartitions: 1})
	enqueue(t, b, outgoing("e1", "k"), outgoing("e2", "k"), outgoing("e3", "j"))
	fetch := func() []idem.OutboxRow {
		rows, err := b.store.OutboxFetch(b.ctx, idem.OutboxFetchParams{Partitions: []int{0}})
		require.NoError(t, err)
		return rows
	}
	rows := fetch()
	require.Len(t, rows, 3)
	require.True(t, rows[0].FirstAttemptAt.IsZero(), "never tried")

	first := now().Add(-time.Hour)
	require.NoError(t, b.store.OutboxMarkFailed(b.ctx, idem.OutboxFailParams{
		ID: rows[0].ID, Attempts: 1, LastError: "down", NextAttemptAt: now(), FirstAttemptAt: first}))
	got := fetch()[0]
	require.Equal(t, first, got.FirstAttemptAt)
	require.False(t, got.Dead)

	require.NoError(t, b.store.OutboxMarkFailed(b.ctx, idem.OutboxFailParams{
		ID: rows[0].ID, Attempts: 2, LastError: "gave up", NextAttemptAt: now(), FirstAttemptAt: first, Dead: true, DeadLetterID: 42}))
	require.NoError(t, b.store.OutboxMarkFailed(b.ctx, idem.OutboxFailParams{
		ID: rows[2].ID, Attempts: 1, LastError: "no dead letter", NextAttemptAt: now(), Dead: true}))
	held := fetch()
	require.Equal(t, []string{"e1", "e2"}, rowEventIDs(held), "the dead row with a dead letter stays; the one without is gone")
	require.True(t, held[0].Dead)
	require.EqualValues(t, 42, held[0].DeadLetterID)
	require.Equal(t, first, held[0].FirstAttemptAt)

	require.NoError(t, b.store.OutboxMarkPublished(b.ctx, []int64{held[0].ID}, now()))
	require.Equal(t, []string{"e2"}, rowEventIDs(fetch()), "released")
}

// TestQueueRelease: a job given back by a Receive that ended is available at once and its
// attempt is not counted; a stale token cannot release it.
func TestQueueRelease(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmysql.Config{})
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
