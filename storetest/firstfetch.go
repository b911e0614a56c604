package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// queueReleaser is a queue store that gives a leased job back as if it had never been fetched
// (idemqueue uses it when a Receive ends before returning what it fetched).
type queueReleaser interface {
	QueueRelease(ctx context.Context, id, token int64) error
}

// ExerciseQueueFirstFetch checks that a queue store records when each job was first fetched
// (idemstore.QueueJob.FirstFetchedAt), which the consumer's retry budget counts from across process
// restarts: set by the first fetch, unchanged by a nak, a lost lease and later fetches, and
// cleared by a release that takes back the job's only attempt (QueueRelease, when the store has
// it). Call it for stores that record the time; a store that is no idemstore.QueueStore is skipped.
func ExerciseQueueFirstFetch[TTx any](t *testing.T, factory Factory[TTx]) {
	t.Helper()
	ctx := context.Background()
	// The times the checks fetch at: a second ahead of the publish, so the jobs are available,
	// and whole microseconds, the stores' precision.
	base := func() time.Time { return time.Now().Add(time.Second).Truncate(time.Microsecond).UTC() }
	const lease = time.Minute

	open := func(t *testing.T) idemstore.QueueStore {
		t.Helper()
		qs, ok := factory(t).Store.(idemstore.QueueStore)
		if !ok {
			t.Skip("the store has no queue table (not an idemstore.QueueStore)")
		}
		return qs
	}
	publish := func(t *testing.T, qs idemstore.QueueStore, queue, eventID string) {
		t.Helper()
		require.NoError(t, qs.QueuePublish(ctx, queue, idem.Message{EventID: eventID, Type: "t", Payload: []byte("{}")}))
	}
	// fetch fetches the one job of queue at now and checks its attempt count and first fetch.
	fetch := func(t *testing.T, qs idemstore.QueueStore, queue string, now time.Time, attempt int, first time.Time, why string) idemstore.QueueJob {
		t.Helper()
		jobs, err := qs.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: queue, Max: 10, Lease: lease, Now: now})
		require.NoError(t, err)
		require.Len(t, jobs, 1, "%s: one job available", why)
		j := jobs[0]
		require.Equal(t, attempt, j.Message.Attempt, "%s: attempt", why)
		require.False(t, j.FirstFetchedAt.IsZero(), "%s: the store records the first fetch", why)
		require.True(t, j.FirstFetchedAt.Equal(first), "%s: FirstFetchedAt is %s, want %s", why, j.FirstFetchedAt, first)
		return j
	}
	nak := func(t *testing.T, qs idemstore.QueueStore, j idemstore.QueueJob, now time.Time) {
		t.Helper()
		require.NoError(t, qs.QueueNak(ctx, idemstore.QueueNakParams{ID: j.ID, Token: j.Token, Now: now, Error: "boom"}))
	}

	t.Run("SetOnceAcrossNakAndLostLease", func(t *testing.T) {
		t.Parallel()
		qs := open(t)
		publish(t, qs, "first-fetch", "evt-1")
		t0 := base()
		j := fetch(t, qs, "first-fetch", t0, 1, t0, "first fetch")
		nak(t, qs, j, t0.Add(time.Second))
		fetch(t, qs, "first-fetch", t0.Add(2*time.Second), 2, t0, "fetch after a nak")
		// The lease of the second attempt runs out without a settle (its worker died): the next
		// fetch still counts from the first.
		j = fetch(t, qs, "first-fetch", t0.Add(2*time.Second+lease+time.Second), 3, t0, "fetch after a lost lease")
		require.NoError(t, qs.QueueAck(ctx, j.ID, j.Token))
	})

	t.Run("ReleaseOfTheOnlyAttemptClears", func(t *testing.T) {
		t.Parallel()
		qs := open(t)
		rel, ok := qs.(queueReleaser)
		if !ok {
			t.Skip("the store has no QueueRelease")
		}
		publish(t, qs, "first-fetch-release", "evt-2")
		t0 := base()
		j := fetch(t, qs, "first-fetch-release", t0, 1, t0, "first fetch")
		require.NoError(t, rel.QueueRelease(ctx, j.ID, j.Token))
		// The job never ran: its budget starts with the next fetch.
		t1 := t0.Add(5 * time.Second)
		j = fetch(t, qs, "first-fetch-release", t1, 1, t1, "fetch after releasing the only attempt")
		nak(t, qs, j, t1)
		j = fetch(t, qs, "first-fetch-release", t1.Add(time.Second), 2, t1, "second attempt")
		// Releasing the second attempt leaves the first one counted, and its time with it.
		require.NoError(t, rel.QueueRelease(ctx, j.ID, j.Token))
		fetch(t, qs, "first-fetch-release", t1.Add(2*time.Second), 2, t1, "fetch after releasing a later attempt")
	})
}
