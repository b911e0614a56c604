package idemsqlite_test

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/idemstore"
)

// TestQueueExtendDuringTx: while a transaction holds the one connection (a handler that runs
// past its lease), QueueExtend does not wait for it; the transaction applies the extension before
// it commits, so after the commit the job is still leased, by the same token, although its first
// lease ran out while the handler held the lock.
func TestQueueExtendDuringTx(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("held", "other")...))
	lease := 200 * time.Millisecond
	jobs, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 2, Lease: lease})
	require.NoError(t, err)
	require.Len(t, jobs, 2)
	held, other := jobs[0], jobs[1]

	extended := make(chan error, 1)
	err = b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		// The extension of another job of this process, asked for while the transaction holds
		// the connection: it must return without the connection (the transaction would wait
		// for it forever otherwise).
		go func() { extended <- b.store.QueueExtend(b.ctx, other.ID, other.Token, time.Minute) }()
		select {
		case err := <-extended:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Error("QueueExtend waited for the open transaction")
		}
		time.Sleep(2 * lease) // past the first lease, under the write lock
		return b.store.QueueAckTx(ctx, tx, held.ID, held.Token)
	})
	require.NoError(t, err, "the handler's ack is fenced by its token, which nobody could take")

	// The extension was applied at commit: the other job is not fetchable although its first
	// lease has passed, and its token still settles it.
	again, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 2, Lease: lease})
	require.NoError(t, err)
	require.Empty(t, again)
	require.NoError(t, b.store.QueueAck(b.ctx, other.ID, other.Token))

	// Without an open transaction, an extension of a lease that has run out is refused.
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("late")...))
	late, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Millisecond})
	require.NoError(t, err)
	require.Len(t, late, 1)
	time.Sleep(5 * time.Millisecond)
	require.ErrorIs(t, b.store.QueueExtend(b.ctx, late[0].ID, late[0].Token, time.Minute), idem.ErrLeaseLost)
}

// recordingObserver keeps the consumer's events.
type recordingObserver struct {
	mu     sync.Mutex
	events []idem.Observation
}

func (o *recordingObserver) Observe(ev idem.Observation) {
	o.mu.Lock()
	o.events = append(o.events, ev)
	o.mu.Unlock()
}

func (o *recordingObserver) Paused(string) {}

func (o *recordingObserver) outcomes() []idem.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]idem.Outcome, len(o.events))
	for i, ev := range o.events {
		out[i] = ev.Outcome
	}
	return out
}

// TestHandlerPastLease: a consumer on the queue table with two jobs; the handler of the first
// holds its transaction, and so the one connection, for several lease times. The consumer
// extends the leases every third of the lease while it runs: no extension may block the handler,
// report a lease lost or let the job go to another fetch. Both events are processed once,
// without a retry, a redelivery or a warning. (TestQueueExtendDuringTx checks the store's side:
// the extension recorded during the transaction and applied at its commit.)
func TestHandlerPastLease(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	_, err := b.db.ExecContext(b.ctx, `CREATE TABLE applied (event_id TEXT NOT NULL)`)
	require.NoError(t, err)
	require.NoError(t, b.store.QueuePublish(b.ctx, "slow", msgs("e1", "e2")...))

	lease := 150 * time.Millisecond
	obs := &recordingObserver{}
	var logs syncBuffer
	done := make(chan struct{})
	var once sync.Once
	c, err := idem.NewConsumer(b.store, idem.ConsumerConfig[*sql.Tx]{
		Name: "slow@v1",
		Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO applied (event_id) VALUES (?)`, msg.EventID); err != nil {
				return err
			}
			if msg.EventID != "e1" {
				return nil
			}
			select {
			case <-time.After(4 * lease): // three or four extensions fall due meanwhile
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			once.Do(func() { close(done) })
			return nil
		},
		Workers: 2,
		Observe: idem.ObserveConfig{
			Observer: obs,
			Logger:   slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
		},
	})
	require.NoError(t, err)
	src, err := idemqueue.NewSource[*sql.Tx](b.store, idemqueue.SourceConfig{Queue: "slow", Lease: lease, MaxWait: 20 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx, src) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never finished")
	}
	// Give a wrongly lost lease the time to show: a redelivery after the lease.
	require.Eventually(t, func() bool {
		st, err := b.store.QueueStats(b.ctx, "slow")
		return err == nil && st.Backlog == 0
	}, 10*time.Second, 10*time.Millisecond, "the job is acked")
	time.Sleep(3 * lease)
	cancel()
	require.NoError(t, <-ran)

	require.Equal(t, []idem.Outcome{idem.OutcomeProcessed, idem.OutcomeProcessed}, obs.outcomes())
	var n int
	require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT count(*) FROM applied`).Scan(&n))
	require.Equal(t, 2, n)
	require.Empty(t, logs.String(), "no lease lost, nothing to warn about")
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestQueueExtendDuringTxAfterTakeover: an extension asked for while a transaction holds the
// connection cannot read the table, but a job this process fetched again under a newer token
// (its first lease ran out and another worker took it over) is still refused with
// idem.ErrLeaseLost, as transporttest's FencedSettle requires; the new owner's extension is
// recorded as before, and a stale ack does not erase what refuses the stale extension.
func TestQueueExtendDuringTxAfterTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("taken")...))
	lease := 50 * time.Millisecond
	first, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: lease})
	require.NoError(t, err)
	require.Len(t, first, 1)
	time.Sleep(2 * lease)
	second, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, second, 1)
	stale, owner := first[0], second[0]
	require.Equal(t, stale.ID, owner.ID)
	require.ErrorIs(t, b.store.QueueAck(b.ctx, stale.ID, stale.Token), idem.ErrLeaseLost)

	err = b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		results := make(chan error, 2)
		go func() {
			results <- b.store.QueueExtend(b.ctx, stale.ID, stale.Token, time.Minute)
			results <- b.store.QueueExtend(b.ctx, owner.ID, owner.Token, time.Minute)
		}()
		for i, want := range []error{idem.ErrLeaseLost, nil} {
			select {
			case err := <-results:
				if want == nil {
					require.NoError(t, err, "the owner's extension is recorded")
				} else {
					require.ErrorIs(t, err, want, "the stale extension %d", i)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("QueueExtend waited for the open transaction")
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, b.store.QueueAck(b.ctx, owner.ID, owner.Token), "the owner still settles it")
}
