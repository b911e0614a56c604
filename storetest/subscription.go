package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// ExerciseQueueSubscriptions checks fan-out on the queue table (idemstore.QueueSubscriptionStore):
// each subscription gets its own job of every later message, fetchers of one subscription share
// its jobs, and a publish to the topic wakes a wait on a subscription's queue. ExerciseQueue
// runs it; a store whose other queue checks run elsewhere can run it alone. A store without
// subscriptions is skipped.
func ExerciseQueueSubscriptions[TTx any](t *testing.T, factory QueueFactory[TTx]) {
	t.Helper()
	t.Run("Subscriptions", func(t *testing.T) { checkQueueSubscriptions(t, factory) })
	t.Run("SubscriptionWait", func(t *testing.T) { checkQueueSubscriptionWait(t, factory) })
}

// subscriptionStore is a queue store with subscriptions.
type subscriptionStore[TTx any] interface {
	queueTxStore[TTx]
	idemstore.QueueSubscriptionStore
}

// openSubscriptions opens a queue bundle, skipping the test when its store has no subscriptions.
func openSubscriptions[TTx any](t *testing.T, f QueueFactory[TTx], cfg QueueConfig) (*openedQueue[TTx], subscriptionStore[TTx]) {
	t.Helper()
	b := openQueue(t, f, cfg)
	s, ok := b.store.(subscriptionStore[TTx])
	if !ok {
		t.Skip("the store has no queue subscriptions (not an idemstore.QueueSubscriptionStore)")
	}
	return b, s
}

// fetchAll leases every available job of queue (up to 100) and returns their event ids.
func fetchAll[TTx any](t *testing.T, b *openedQueue[TTx], queue string) ([]idemstore.QueueJob, []string) {
	t.Helper()
	jobs, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: queue, Max: 100, Lease: time.Minute, Now: time.Now()})
	require.NoError(t, err)
	return jobs, jobEventIDs(jobs)
}

// subQueue is idemstore.SubscriptionQueue for names the test knows to be valid.
func subQueue(t *testing.T, topic, name string) string {
	t.Helper()
	q, err := idemstore.SubscriptionQueue(topic, name)
	require.NoError(t, err)
	return q
}

// checkQueueSubscriptions: fan-out. Each subscription of a topic gets its own job of every
// message published after it registered, in the same publish (committed or rolled back with
// it), settled apart from the other subscriptions' jobs; fetchers of one subscription share its
// jobs; a topic without subscriptions keeps one job per message; unsubscribing stops the copies
// and deletes what was left; a subscription's own queue reaches it alone (a replay).
func checkQueueSubscriptions[TTx any](t *testing.T, f QueueFactory[TTx]) {
	t.Parallel()
	b, s := openSubscriptions(t, f, QueueConfig{})
	ctx := b.ctx
	ledger, email := subQueue(t, "t", "ledger"), subQueue(t, "t", "email")

	// Before any subscription: one job in the topic's own queue, as always.
	require.NoError(t, b.store.QueuePublish(ctx, "t", queueMessages("before")...))

	require.NoError(t, s.QueueSubscribe(ctx, "t", "ledger"))
	require.NoError(t, s.QueueSubscribe(ctx, "t", "email"))
	require.NoError(t, s.QueueSubscribe(ctx, "t", "ledger"), "subscribing again does nothing")
	require.NoError(t, s.QueueSubscribe(ctx, "other", "ledger"))
	names, err := s.QueueSubscriptions(ctx, "t")
	require.NoError(t, err)
	require.Equal(t, []string{"email", "ledger"}, names)

	require.NoError(t, b.store.QueuePublish(ctx, "t", queueMessages("e1", "e2")...))
	require.NoError(t, b.store.InTx(ctx, func(ctx context.Context, tx TTx) error {
		return b.store.QueuePublishTx(ctx, tx, "t", queueMessages("e3")...)
	}))
	errRollback := errors.New("roll back")
	require.ErrorIs(t, b.store.InTx(ctx, func(ctx context.Context, tx TTx) error {
		require.NoError(t, b.store.QueuePublishTx(ctx, tx, "t", queueMessages("rolled-back")...))
		return errRollback
	}), errRollback)

	ledgerJobs, got := fetchAll(t, b, ledger)
	require.Equal(t, []string{"e1", "e2", "e3"}, got, "the ledger subscription gets every message published after it, once")
	require.Equal(t, 1, ledgerJobs[0].Message.Attempt)
	emailJobs, got := fetchAll(t, b, email)
	require.Equal(t, []string{"e1", "e2", "e3"}, got, "so does the e-mail subscription")
	_, got = fetchAll(t, b, "t")
	require.Equal(t, []string{"before"}, got, "the topic's own queue keeps what was published before the first subscription, and gets nothing after")
	_, got = fetchAll(t, b, subQueue(t, "other", "ledger"))
	require.Empty(t, got, "a subscription of another topic gets nothing")

	// Each subscription settles its own jobs: a nak of one and an ack of the other.
	require.NoError(t, b.store.QueueAck(ctx, ledgerJobs[0].ID, ledgerJobs[0].Token))
	require.NoError(t, b.store.QueueNak(ctx, idemstore.QueueNakParams{ID: emailJobs[0].ID, Token: emailJobs[0].Token, Now: time.Now()}))
	again, got := fetchAll(t, b, email)
	require.Equal(t, []string{"e1"}, got, "the nak'ed e-mail job comes back, its ledger twin's ack does not touch it")
	require.Equal(t, 2, again[0].Message.Attempt, "attempts are counted per subscription")
	_, got = fetchAll(t, b, ledger)
	require.Empty(t, got)

	// Fetchers of one subscription compete: they share its jobs, none twice.
	require.NoError(t, b.store.QueuePublish(ctx, "t", queueMessages("c1", "c2", "c3", "c4", "c5")...))
	first, err := b.store.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: ledger, Max: 2, Lease: time.Minute, Now: time.Now()})
	require.NoError(t, err)
	_, rest := fetchAll(t, b, ledger)
	require.Equal(t, []string{"c1", "c2"}, jobEventIDs(first))
	require.Equal(t, []string{"c3", "c4", "c5"}, rest)
	_, got = fetchAll(t, b, email)
	require.Equal(t, []string{"c1", "c2", "c3", "c4", "c5"}, got)

	// A subscription registered later gets only what is published after it.
	require.NoError(t, s.QueueSubscribe(ctx, "t", "audit"))
	audit := subQueue(t, "t", "audit")
	require.NoError(t, b.store.QueuePublish(ctx, "t", queueMessages("late")...))
	_, got = fetchAll(t, b, audit)
	require.Equal(t, []string{"late"}, got, "a new subscription starts with the next message")

	// A subscription's own queue reaches it alone (how a dead letter is replayed).
	require.NoError(t, b.store.QueuePublish(ctx, ledger, queueMessages("replayed")...))
	_, got = fetchAll(t, b, ledger)
	require.Equal(t, []string{"late", "replayed"}, got)
	for _, q := range []string{email, audit, "t"} {
		st, err := b.store.QueueStats(ctx, q)
		require.NoError(t, err)
		_, got = fetchAll(t, b, q)
		require.NotContains(t, got, "replayed", "queue %s", q)
		require.Positive(t, st.Backlog, "queue %s keeps its own backlog", q)
	}

	// Unsubscribing stops the copies and deletes what the subscription had left.
	st, err := b.store.QueueStats(ctx, email)
	require.NoError(t, err)
	n, err := s.QueueUnsubscribe(ctx, "t", "email")
	require.NoError(t, err)
	require.EqualValues(t, st.Backlog, n, "every job of the subscription is deleted")
	n, err = s.QueueUnsubscribe(ctx, "t", "email")
	require.NoError(t, err)
	require.Zero(t, n, "unsubscribing again does nothing")
	names, err = s.QueueSubscriptions(ctx, "t")
	require.NoError(t, err)
	require.Equal(t, []string{"audit", "ledger"}, names)
	require.NoError(t, b.store.QueuePublish(ctx, "t", queueMessages("after-unsubscribe")...))
	st, err = b.store.QueueStats(ctx, email)
	require.NoError(t, err)
	require.Zero(t, st.Backlog, "an unsubscribed subscription gets nothing more")
	_, got = fetchAll(t, b, ledger)
	require.Equal(t, []string{"after-unsubscribe"}, got)

	// Names that would make one subscription's queue another's are refused.
	for _, c := range []struct{ topic, name string }{{"t", "a#b"}, {"x#y", "a"}, {"t", ""}, {"", "a"}} {
		require.Error(t, s.QueueSubscribe(ctx, c.topic, c.name), "topic %q, name %q", c.topic, c.name)
	}
	names, err = s.QueueSubscriptions(ctx, "x#y")
	require.NoError(t, err)
	require.Empty(t, names)
}

// checkQueueSubscriptionWait: a publish to a topic wakes a QueueWait on a subscription's queue.
func checkQueueSubscriptionWait[TTx any](t *testing.T, f QueueFactory[TTx]) {
	t.Parallel()
	// A poll interval far longer than the test: only a wake-up can end a wait early.
	b, s := openSubscriptions(t, f, QueueConfig{PollInterval: time.Hour})
	require.NoError(t, s.QueueSubscribe(b.ctx, "t", "ledger"))
	done := make(chan error, 1)
	go func() { done <- b.store.QueueWait(b.ctx, subQueue(t, "t", "ledger"), time.Hour) }()
	time.Sleep(20 * time.Millisecond) // let it start waiting
	require.NoError(t, b.store.QueuePublish(b.ctx, "t", queueMessages("e1")...))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("QueueWait on the subscription's queue was not woken by a publish to its topic")
	}
	_, got := fetchAll(t, b, subQueue(t, "t", "ledger"))
	require.True(t, slices.Equal([]string{"e1"}, got), "got %v", got)
}

// BenchmarkQueuePublish measures QueuePublish of batches of 10 messages to a topic with 0, 1 and
// 4 subscriptions (each subscription is one more job per message), reporting messages per second.
func BenchmarkQueuePublish[TTx any](b *testing.B, factory QueueFactory[TTx]) {
	const batch = 10
	for _, subs := range []int{0, 1, 4} {
		b.Run(fmt.Sprintf("subscriptions=%d", subs), func(b *testing.B) {
			bundle := factory(b, QueueConfig{})
			store, ok := bundle.Store.(subscriptionStore[TTx])
			if !ok {
				b.Skip("the store has no queue subscriptions")
			}
			ctx := context.Background()
			for i := range subs {
				require.NoError(b, store.QueueSubscribe(ctx, "bench", fmt.Sprintf("s%d", i)))
			}
			msgs := make([]idem.Message, batch)
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				for j := range msgs {
					msgs[j] = idem.Message{EventID: fmt.Sprintf("e%d-%d", i, j), Tenant: "acme", Type: "t", Payload: []byte(`{"amount":1}`)}
				}
				if err := store.QueuePublish(ctx, "bench", msgs...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batch)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}
