package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/storetest"
)

func msgs(ids ...string) []idem.Message {
	out := make([]idem.Message, len(ids))
	for i, id := range ids {
		out[i] = idem.Message{EventID: id, Tenant: "acme", Type: "t", Payload: []byte(`{"n":` + fmt.Sprint(i) + `}`)}
	}
	return out
}

func eventIDs(jobs []idem.QueueJob) []string {
	out := make([]string, len(jobs))
	for i, j := range jobs {
		out[i] = j.Message.EventID
	}
	return out
}

func TestQueueFetch(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	occurred := now().Add(-time.Minute)
	in := idem.Message{EventID: "e1", Tenant: "acme", Type: "payment.captured", Payload: []byte(`{"a":1}`),
		Headers: map[string]string{"trace": "x"}, OccurredAt: occurred}
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", in))
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("e2", "e3", "e4")...))
	require.NoError(t, b.store.QueuePublish(b.ctx, "other", msgs("x1")...))

	t0 := time.Now()
	jobs, err := b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "q", Max: 2, Lease: time.Minute, Now: t0})
	require.NoError(t, err)
	require.Equal(t, []string{"e1", "e2"}, eventIDs(jobs), "lowest ids first, at most Max")
	got := jobs[0].Message
	require.Equal(t, 1, got.Attempt)
	require.EqualValues(t, 1, jobs[0].Token)
	require.Equal(t, in.Payload, got.Payload)
	require.Equal(t, in.Headers, got.Headers)
	require.Equal(t, in.Tenant, got.Tenant)
	require.Equal(t, in.Type, got.Type)
	require.True(t, occurred.Equal(got.OccurredAt))
	require.WithinDuration(t, t0, got.PublishedAt, 5*time.Second, "PublishedAt is the enqueue time")

	jobs2, err := b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "q", Max: 10, Lease: time.Minute, Now: t0})
	require.NoError(t, err)
	require.Equal(t, []string{"e3", "e4"}, eventIDs(jobs2), "leased jobs are not fetched twice")

	none, err := b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "q", Max: 10, Lease: time.Minute, Now: t0})
	require.NoError(t, err)
	require.Empty(t, none)

	// After the lease runs out the jobs come back with a new token and attempt.
	again, err := b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Minute, Now: t0.Add(2 * time.Minute)})
	require.NoError(t, err)
	require.Equal(t, []string{"e1"}, eventIDs(again))
	require.Equal(t, jobs[0].ID, again[0].ID)
	require.EqualValues(t, 2, again[0].Token)
	require.Equal(t, 2, again[0].Message.Attempt)

	// The old holder is fenced off.
	err = b.store.QueueAck(b.ctx, jobs[0].ID, jobs[0].Token)
	require.ErrorIs(t, err, idem.ErrLeaseLost)
	require.ErrorContains(t, err, fmt.Sprintf("job %d", jobs[0].ID))
	require.NoError(t, b.store.QueueAck(b.ctx, again[0].ID, again[0].Token))

	st, err := b.store.QueueStats(b.ctx, "q")
	require.NoError(t, err)
	require.EqualValues(t, 3, st.Backlog)
	require.WithinDuration(t, t0, st.Oldest, 5*time.Second)
	st, err = b.store.QueueStats(b.ctx, "empty")
	require.NoError(t, err)
	require.Equal(t, idem.QueueStats{}, st)
}

func TestQueueFencing(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("e1")...))
	t0 := time.Now()
	first, err := b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Second, Now: t0})
	require.NoError(t, err)
	require.Len(t, first, 1)
	// The lease has expired; another worker takes the job (a clock an hour on, so that the new
	// lease outlives the test).
	second, err := b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Hour, Now: t0.Add(time.Hour)})
	require.NoError(t, err)
	require.Len(t, second, 1)
	stale, cur := first[0], second[0]

	tests := []struct {
		name string
		op   func(id, token int64) error
	}{
		{"ack", func(id, token int64) error { return b.store.QueueAck(b.ctx, id, token) }},
		{"ackTx", func(id, token int64) error {
			return b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
				return b.store.QueueAckTx(ctx, tx, id, token)
			})
		}},
		{"nak", func(id, token int64) error {
			return b.store.QueueNak(b.ctx, idem.QueueNakParams{ID: id, Token: token, Error: "x", Now: t0})
		}},
		{"extend", func(id, token int64) error { return b.store.QueueExtend(b.ctx, id, token, time.Minute) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.op(stale.ID, stale.Token)
			require.ErrorIs(t, err, idem.ErrLeaseLost)
			require.ErrorContains(t, err, fmt.Sprintf("job %d", stale.ID))
			err = tt.op(stale.ID+1000, cur.Token)
			require.ErrorIs(t, err, idem.ErrLeaseLost, "unknown id")
		})
	}
	// The current holder still owns the job.
	require.NoError(t, b.store.QueueExtend(b.ctx, cur.ID, cur.Token, time.Hour))
	require.NoError(t, b.store.QueueAck(b.ctx, cur.ID, cur.Token))
	err = b.store.QueueAck(b.ctx, cur.ID, cur.Token)
	require.ErrorIs(t, err, idem.ErrLeaseLost, "acked twice")
}

func TestQueueExtendExpired(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("e1", "e2")...))
	jobs, err := b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "q", Max: 2, Lease: time.Microsecond, Now: time.Now()})
	require.NoError(t, err)
	require.Len(t, jobs, 2)
	time.Sleep(2 * time.Millisecond)

	// Its lease is over: another worker may fetch it at any moment, so it cannot be extended.
	require.ErrorIs(t, b.store.QueueExtend(b.ctx, jobs[0].ID, jobs[0].Token, time.Hour), idem.ErrLeaseLost)

	// A live lease can: fetched with a real clock, extended by an hour, it is not fetched 2 minutes on.
	t0 := time.Now()
	live, err := b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Minute, Now: t0})
	require.NoError(t, err)
	require.Len(t, live, 1)
	require.NoError(t, b.store.QueueExtend(b.ctx, live[0].ID, live[0].Token, time.Hour))
	later, err := b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "q", Max: 2, Lease: time.Minute, Now: t0.Add(2 * time.Minute)})
	require.NoError(t, err)
	require.Equal(t, []string{"e2"}, eventIDs(later))
	require.ErrorContains(t, b.store.QueueExtend(b.ctx, live[0].ID, live[0].Token, 0), "lease is 0s")
}

func TestQueueNak(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("e1")...))
	t0 := time.Now()
	fetch := func(at time.Time) []idem.QueueJob {
		t.Helper()
		jobs, err := b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Hour, Now: at})
		require.NoError(t, err)
		return jobs
	}
	jobs := fetch(t0)
	require.Len(t, jobs, 1)
	require.NoError(t, b.store.QueueNak(b.ctx, idem.QueueNakParams{
		ID: jobs[0].ID, Token: jobs[0].Token, Delay: 30 * time.Second, Error: "downstream 503", Now: t0}))

	require.Empty(t, fetch(t0.Add(29*time.Second)), "not before the delay, although the lease is cleared")
	again := fetch(t0.Add(30 * time.Second))
	require.Len(t, again, 1)
	require.Equal(t, 2, again[0].Message.Attempt)
	var lastErr string
	require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT last_error FROM idem_queue WHERE id = ?`, again[0].ID).Scan(&lastErr))
	require.Equal(t, "downstream 503", lastErr)

	// A nak without delay makes the job available at once.
	require.NoError(t, b.store.QueueNak(b.ctx, idem.QueueNakParams{ID: again[0].ID, Token: again[0].Token, Now: t0.Add(30 * time.Second)}))
	require.Len(t, fetch(t0.Add(30*time.Second)), 1)
}

func TestQueuePublishTx(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	errRollback := errors.New("business write failed")
	err := b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		require.NoError(t, b.store.QueuePublishTx(ctx, tx, "q", msgs("rolled-back")...))
		return errRollback
	})
	require.ErrorIs(t, err, errRollback)
	require.NoError(t, b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		return b.store.QueuePublishTx(ctx, tx, "q", msgs("committed")...)
	}))
	jobs, err := b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "q", Max: 10, Lease: time.Minute, Now: time.Now()})
	require.NoError(t, err)
	require.Equal(t, []string{"committed"}, eventIDs(jobs))

	require.ErrorContains(t, b.store.QueuePublish(b.ctx, "q", idem.Message{}), "empty event id")
	require.ErrorContains(t, b.store.QueuePublish(b.ctx, "", msgs("e")...), "queue name is empty")
}

func TestQueueAckTx(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("e1")...))
	jobs, err := b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Minute, Now: time.Now()})
	require.NoError(t, err)
	j := jobs[0]

	// The ack rolls back with the handler.
	errHandler := errors.New("handler failed")
	err = b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		require.NoError(t, b.store.QueueAckTx(ctx, tx, j.ID, j.Token))
		return errHandler
	})
	require.ErrorIs(t, err, errHandler)
	st, err := b.store.QueueStats(b.ctx, "q")
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Backlog)

	require.NoError(t, b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		return b.store.QueueAckTx(ctx, tx, j.ID, j.Token)
	}))
	st, err = b.store.QueueStats(b.ctx, "q")
	require.NoError(t, err)
	require.EqualValues(t, 0, st.Backlog)
}

// TestQueueIDsNotReused guards the fencing token: a new job never gets the id of an acked one,
// so an old (id, token) pair cannot match it.
func TestQueueIDsNotReused(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("e1")...))
	jobs, err := b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Minute, Now: time.Now()})
	require.NoError(t, err)
	require.NoError(t, b.store.QueueAck(b.ctx, jobs[0].ID, jobs[0].Token))
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("e2")...))
	next, err := b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Minute, Now: time.Now()})
	require.NoError(t, err)
	require.Greater(t, next[0].ID, jobs[0].ID)
	require.ErrorIs(t, b.store.QueueAck(b.ctx, jobs[0].ID, jobs[0].Token), idem.ErrLeaseLost)
}

func TestQueueWait(t *testing.T) {
	t.Parallel()
	// A poll interval far longer than the test: only a wake-up can end a wait early.
	b := setup(t, idemsqlite.Config{PollInterval: time.Hour})

	wait := func(max time.Duration) <-chan error {
		done := make(chan error, 1)
		go func() { done <- b.store.QueueWait(b.ctx, "q", max) }()
		time.Sleep(20 * time.Millisecond) // let it start waiting
		return done
	}

	t.Run("max", func(t *testing.T) {
		start := time.Now()
		require.NoError(t, b.store.QueueWait(b.ctx, "q", 30*time.Millisecond))
		require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
	})

	t.Run("context", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(b.ctx, 20*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, b.store.QueueWait(ctx, "q", time.Hour), context.DeadlineExceeded)
	})

	t.Run("publish wakes", func(t *testing.T) {
		done := wait(time.Hour)
		require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("e1")...))
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("QueueWait was not woken by QueuePublish")
		}
	})

	t.Run("publish in InTx wakes after commit", func(t *testing.T) {
		done := wait(time.Hour)
		require.NoError(t, b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
			require.NoError(t, b.store.QueuePublishTx(ctx, tx, "q", msgs("e2")...))
			select {
			case <-done:
				t.Error("QueueWait woke before commit")
			case <-time.After(50 * time.Millisecond):
			}
			return nil
		}))
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("QueueWait was not woken after commit")
		}
	})

	t.Run("rolled back publish does not wake", func(t *testing.T) {
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- b.store.QueueWait(b.ctx, "q", 300*time.Millisecond) }()
		time.Sleep(20 * time.Millisecond)
		_ = b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
			require.NoError(t, b.store.QueuePublishTx(ctx, tx, "q", msgs("e3")...))
			return errors.New("roll back")
		})
		require.NoError(t, <-done)
		require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	})

	t.Run("publish in caller's own tx wakes", func(t *testing.T) {
		done := wait(time.Hour)
		tx, err := b.db.BeginTx(b.ctx, nil)
		require.NoError(t, err)
		require.NoError(t, b.store.QueuePublishTx(b.ctx, tx, "q", msgs("e4")...))
		require.NoError(t, tx.Commit())
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("QueueWait was not woken")
		}
	})
}

// TestQueueFirstFetch runs the first-fetch conformance check: the time the retry budget counts
// from survives naks, lost leases and releases of a later attempt.
func TestQueueFirstFetch(t *testing.T) {
	t.Parallel()
	storetest.ExerciseQueueFirstFetch(t, factory)
}
