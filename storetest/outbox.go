package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// OutboxConfig is what the outbox checks ask of a store they open.
type OutboxConfig struct {
	// Partitions is the outbox partition count; 0 is the store's default.
	Partitions int
	// PollInterval is how often OutboxWait polls when nothing wakes it; 0 is the default.
	PollInterval time.Duration
}

// OutboxBundle is one isolated store for the outbox checks, plus the few hooks only the
// store's SQL can do.
type OutboxBundle[TTx any] struct {
	// Store is migrated and private to the test; it must be an idemstore.OutboxStore[TTx].
	Store idemstore.Store[TTx]
	// InsertOrder, inside tx, inserts a business row with primary key id (a second insert of a
	// committed id fails). Optional: the enqueue-in-a-transaction check is skipped without it.
	InsertOrder func(ctx context.Context, tx TTx, id string) error
	// OutboxRows counts the rows of the outbox table, published or not. Optional: the
	// delete-published check is skipped without it.
	OutboxRows func(ctx context.Context) (int, error)
}

// OutboxFactory builds a fresh OutboxBundle with cfg for one test; cleanup goes through
// tb.Cleanup.
type OutboxFactory[TTx any] func(tb testing.TB, cfg OutboxConfig) OutboxBundle[TTx]

// ExerciseOutbox checks a transactional outbox: events enqueued in a transaction commit and roll
// back with the business write; fetches return a partition's rows in enqueue order, per key;
// published and dead rows leave the fetch, failed ones stay with their attempt; published rows
// are deleted in batches; OutboxWait wakes on a commit, on its poll and on its context. A store
// that is no idemstore.OutboxStore is skipped.
func ExerciseOutbox[TTx any](t *testing.T, factory OutboxFactory[TTx]) {
	t.Helper()
	t.Run("EnqueueTx", func(t *testing.T) { checkOutboxEnqueueTx(t, factory) })
	t.Run("FetchPartitions", func(t *testing.T) { checkOutboxFetchPartitions(t, factory) })
	t.Run("Mark", func(t *testing.T) { checkOutboxMark(t, factory) })
	t.Run("DeletePublished", func(t *testing.T) { checkOutboxDeletePublished(t, factory) })
	t.Run("Wait", func(t *testing.T) { checkOutboxWait(t, factory) })
}

// openedOutbox is an opened OutboxBundle with its store as an outbox.
type openedOutbox[TTx any] struct {
	OutboxBundle[TTx]
	ctx   context.Context
	store outboxTxStore[TTx]
}

// outboxTxStore is a store with an outbox.
type outboxTxStore[TTx any] interface {
	idemstore.Store[TTx]
	idemstore.OutboxStore[TTx]
}

// openOutbox opens a bundle with cfg, skipping the test when its store has no outbox.
func openOutbox[TTx any](t *testing.T, f OutboxFactory[TTx], cfg OutboxConfig) *openedOutbox[TTx] {
	t.Helper()
	b := f(t, cfg)
	s, ok := b.Store.(outboxTxStore[TTx])
	if !ok {
		t.Skip("the store has no outbox (not an idemstore.OutboxStore)")
	}
	return &openedOutbox[TTx]{OutboxBundle: b, ctx: context.Background(), store: s}
}

// enqueue commits msgs to the outbox in one transaction.
func (b *openedOutbox[TTx]) enqueue(t *testing.T, msgs ...idem.Outgoing) {
	t.Helper()
	enqueueOutgoing(t, b.store, b.store, msgs...)
}

func checkOutboxEnqueueTx[TTx any](t *testing.T, f OutboxFactory[TTx]) {
	t.Parallel()
	b := openOutbox(t, f, OutboxConfig{Partitions: 4})
	if b.InsertOrder == nil {
		t.Skip("no InsertOrder hook: the store's business write is not available to the check")
	}
	require.Equal(t, 4, b.store.OutboxPartitions())
	var err error

	// The event rolls back with the business write…
	errBusiness := errors.New("business write failed")
	err = b.store.InTx(b.ctx, func(ctx context.Context, tx TTx) error {
		err := b.InsertOrder(ctx, tx, "o1")
		require.NoError(t, err)
		require.NoError(t, b.store.EnqueueTx(ctx, tx, outgoingEvent("rolled-back", "o1")))
		return errBusiness
	})
	require.ErrorIs(t, err, errBusiness)

	// …and commits with it.
	occurred := utcNow().Add(-time.Hour)
	in := outgoingEvent("committed", "o1")
	in.Headers = map[string]string{"Idempotency-Key": "committed"}
	in.OccurredAt = occurred
	before := utcNow()
	require.NoError(t, b.store.InTx(b.ctx, func(ctx context.Context, tx TTx) error {
		if err := b.InsertOrder(ctx, tx, "o1"); err != nil {
			return err
		}
		return b.store.EnqueueTx(ctx, tx, in, outgoingEvent("no-occurred", ""))
	}))

	rows, err := b.store.OutboxFetch(b.ctx, idemstore.OutboxFetchParams{Partitions: allOutboxPartitions(b.store), Limit: 10})
	require.NoError(t, err)
	require.Equal(t, []string{"committed", "no-occurred"}, outboxEventIDs(rows))
	r := rows[0]
	require.Equal(t, in, r.Outgoing)
	require.Equal(t, idemstore.OutboxPartition(in, 4), r.Partition)
	require.False(t, r.CreatedAt.Before(before))
	require.Equal(t, r.CreatedAt, r.NextAttemptAt, "due at once")
	require.Zero(t, r.Attempts)
	require.Empty(t, r.LastError)
	require.Equal(t, rows[1].CreatedAt, rows[1].Outgoing.OccurredAt, "occurred_at defaults to the enqueue time")

	st, err := b.store.OutboxStats(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Backlog)
	require.Equal(t, r.CreatedAt, st.Oldest)

	// Invalid events fail the caller's transaction, naming the event.
	err = b.store.InTx(b.ctx, func(ctx context.Context, tx TTx) error {
		return b.store.EnqueueTx(ctx, tx, idem.Outgoing{EventID: "no-topic"})
	})
	require.ErrorContains(t, err, "no-topic")
}

func checkOutboxFetchPartitions[TTx any](t *testing.T, f OutboxFactory[TTx]) {
	t.Parallel()
	b := openOutbox(t, f, OutboxConfig{Partitions: 8})
	// Three ordering keys, four events each, interleaved.
	keys := []string{"k-a", "k-b", "k-c"}
	var all []idem.Outgoing
	for i := range 4 {
		for _, k := range keys {
			all = append(all, outgoingEvent(fmt.Sprintf("%s-%d", k, i), k))
		}
	}
	b.enqueue(t, all...)

	for _, k := range keys {
		t.Run(k, func(t *testing.T) {
			part := idemstore.OutboxPartition(outgoingEvent("", k), 8)
			rows, err := b.store.OutboxFetch(b.ctx, idemstore.OutboxFetchParams{Partitions: []int{part}, Limit: 100})
			require.NoError(t, err)
			var ofKey []string
			for i, r := range rows {
				require.Equal(t, part, r.Partition)
				if i > 0 {
					require.Greater(t, r.ID, rows[i-1].ID, "enqueue order")
				}
				if r.Outgoing.Key == k {
					ofKey = append(ofKey, r.Outgoing.EventID)
				}
			}
			require.Equal(t, []string{k + "-0", k + "-1", k + "-2", k + "-3"}, ofKey)
		})
	}

	rows, err := b.store.OutboxFetch(b.ctx, idemstore.OutboxFetchParams{Partitions: allOutboxPartitions(b.store), Limit: 5})
	require.NoError(t, err)
	require.Len(t, rows, 5)
	require.Equal(t, outboxEventIDs(rows), []string{"k-a-0", "k-b-0", "k-c-0", "k-a-1", "k-b-1"})

	none, err := b.store.OutboxFetch(b.ctx, idemstore.OutboxFetchParams{})
	require.NoError(t, err)
	require.Empty(t, none)
}

func checkOutboxMark[TTx any](t *testing.T, f OutboxFactory[TTx]) {
	t.Parallel()
	b := openOutbox(t, f, OutboxConfig{Partitions: 1})
	b.enqueue(t, outgoingEvent("e1", ""), outgoingEvent("e2", ""), outgoingEvent("e3", ""), outgoingEvent("e4", ""))
	fetch := func() []idemstore.OutboxRow {
		t.Helper()
		rows, err := b.store.OutboxFetch(b.ctx, idemstore.OutboxFetchParams{Partitions: []int{0}})
		require.NoError(t, err)
		return rows
	}
	rows := fetch()
	require.Len(t, rows, 4)

	require.NoError(t, b.store.OutboxMarkPublished(b.ctx, []int64{rows[0].ID, rows[2].ID}, utcNow()))
	require.Equal(t, []string{"e2", "e4"}, outboxEventIDs(fetch()))

	next := utcNow().Add(time.Minute)
	require.NoError(t, b.store.OutboxMarkFailed(b.ctx, idemstore.OutboxFailParams{
		ID: rows[1].ID, Attempts: 1, LastError: "broker down", NextAttemptAt: next}))
	got := fetch()
	require.Equal(t, []string{"e2", "e4"}, outboxEventIDs(got), "a failed row stays, not yet due")
	require.Equal(t, 1, got[0].Attempts)
	require.Equal(t, "broker down", got[0].LastError)
	require.Equal(t, next, got[0].NextAttemptAt)

	require.NoError(t, b.store.OutboxMarkFailed(b.ctx, idemstore.OutboxFailParams{
		ID: rows[1].ID, Attempts: 5, LastError: "gave up", NextAttemptAt: next, Dead: true}))
	require.Equal(t, []string{"e4"}, outboxEventIDs(fetch()), "a dead row is out of the relay's way")
	st, err := b.store.OutboxStats(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Backlog)

	err = b.store.OutboxMarkFailed(b.ctx, idemstore.OutboxFailParams{ID: 9999})
	require.ErrorIs(t, err, idem.ErrNotFound)
	require.ErrorContains(t, err, "9999")
}

func checkOutboxDeletePublished[TTx any](t *testing.T, f OutboxFactory[TTx]) {
	t.Parallel()
	b := openOutbox(t, f, OutboxConfig{Partitions: 1})
	if b.OutboxRows == nil {
		t.Skip("no OutboxRows hook: the check cannot count the outbox table's rows")
	}
	for i := range 6 {
		b.enqueue(t, outgoingEvent(fmt.Sprint("e", i), ""))
	}
	rows, err := b.store.OutboxFetch(b.ctx, idemstore.OutboxFetchParams{Partitions: []int{0}})
	require.NoError(t, err)
	require.Len(t, rows, 6)
	t0 := utcNow()
	var old []int64
	for _, r := range rows[:5] {
		old = append(old, r.ID)
	}
	require.NoError(t, b.store.OutboxMarkPublished(b.ctx, old[:4], t0.Add(-time.Hour)))
	require.NoError(t, b.store.OutboxMarkPublished(b.ctx, old[4:], t0)) // published, but not before t0

	var got []int
	for {
		n, err := b.store.OutboxDeletePublished(b.ctx, t0, 3)
		require.NoError(t, err)
		got = append(got, n)
		if n < 3 {
			break
		}
	}
	require.Equal(t, []int{3, 1}, got)
	left, err := b.OutboxRows(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 2, left, "the unpublished row and the one published at t0 stay")

	_, err = b.store.OutboxDeletePublished(b.ctx, t0, 0)
	require.ErrorContains(t, err, "limit is 0")
}

func checkOutboxWait[TTx any](t *testing.T, f OutboxFactory[TTx]) {
	t.Parallel()
	b := openOutbox(t, f, OutboxConfig{PollInterval: time.Hour})

	t.Run("poll", func(t *testing.T) {
		fast := openOutbox(t, f, OutboxConfig{PollInterval: 10 * time.Millisecond})
		start := time.Now()
		require.NoError(t, fast.store.OutboxWait(fast.ctx, time.Hour))
		require.Less(t, time.Since(start), 5*time.Second)
	})

	t.Run("enqueue wakes after commit", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { done <- b.store.OutboxWait(b.ctx, time.Hour) }()
		time.Sleep(20 * time.Millisecond)
		require.NoError(t, b.store.InTx(b.ctx, func(ctx context.Context, tx TTx) error {
			require.NoError(t, b.store.EnqueueTx(ctx, tx, outgoingEvent("e1", "")))
			select {
			case <-done:
				t.Error("OutboxWait woke before commit")
			case <-time.After(50 * time.Millisecond):
			}
			return nil
		}))
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("OutboxWait was not woken after commit")
		}
	})

	t.Run("context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(b.ctx)
		cancel()
		require.ErrorIs(t, b.store.OutboxWait(ctx, time.Hour), context.Canceled)
	})
}
