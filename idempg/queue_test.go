package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/storetest"
)

// msg returns a queue message with every field the queue table keeps.
func msg(id string) idem.Message {
	return idem.Message{
		EventID:    id,
		Tenant:     "acme",
		Type:       "payment.captured",
		Payload:    []byte(`{"id":"` + id + `"}`),
		Headers:    map[string]string{"Trace": "t-" + id},
		OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC),
	}
}

func eventIDs(jobs []idemstore.QueueJob) []string {
	out := make([]string, len(jobs))
	for i, j := range jobs {
		out[i] = j.Message.EventID
	}
	return out
}

func TestQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, idempg.Config{})
	lease := 30 * time.Second
	fetch := func(t *testing.T, queue string, max int, now time.Time) []idemstore.QueueJob {
		t.Helper()
		jobs, err := store.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: queue, Max: max, Lease: lease, Now: now})
		require.NoError(t, err)
		return jobs
	}

	t.Run("FetchAckFencing", func(t *testing.T) {
		t.Parallel()
		q := "fencing"
		require.NoError(t, store.QueuePublish(ctx, q, msg("e1"), msg("e2"), msg("e3")))
		now := time.Now().UTC()

		first := fetch(t, q, 2, now)
		require.Equal(t, []string{"e1", "e2"}, eventIDs(first))
		require.Less(t, first[0].ID, first[1].ID)
		for _, j := range first {
			require.EqualValues(t, 1, j.Token)
			require.Equal(t, 1, j.Message.Attempt)
			want := msg(j.Message.EventID)
			require.Equal(t, want.Tenant, j.Message.Tenant)
			require.Equal(t, want.Type, j.Message.Type)
			require.Equal(t, want.Payload, j.Message.Payload)
			require.Equal(t, want.Headers, j.Message.Headers)
			require.True(t, want.OccurredAt.Equal(j.Message.OccurredAt))
			require.WithinDuration(t, now, j.Message.PublishedAt, time.Minute)
		}
		require.Equal(t, []string{"e3"}, eventIDs(fetch(t, q, 10, now)), "leased jobs are not fetched twice")
		require.Empty(t, fetch(t, q, 10, now))

		require.ErrorIs(t, store.QueueAck(ctx, first[0].ID, first[0].Token+1), idem.ErrLeaseLost)
		require.NoError(t, store.QueueAck(ctx, first[0].ID, first[0].Token))
		err := store.QueueAck(ctx, first[0].ID, first[0].Token)
		require.ErrorIs(t, err, idem.ErrLeaseLost, "acked twice")
		require.ErrorContains(t, err, fmt.Sprint(first[0].ID))

		// The leases expire: the jobs go to a new worker with a new token, and the old worker's
		// token is worthless.
		again := fetch(t, q, 10, now.Add(lease))
		require.Equal(t, []string{"e2", "e3"}, eventIDs(again))
		require.EqualValues(t, 2, again[0].Token)
		require.Equal(t, 2, again[0].Message.Attempt)
		stale := first[1]
		require.ErrorIs(t, store.QueueAck(ctx, stale.ID, stale.Token), idem.ErrLeaseLost)
		require.ErrorIs(t, store.QueueNak(ctx, idemstore.QueueNakParams{ID: stale.ID, Token: stale.Token}), idem.ErrLeaseLost)
		require.ErrorIs(t, store.QueueExtend(ctx, stale.ID, stale.Token, time.Hour), idem.ErrLeaseLost)

		st, err := store.QueueStats(ctx, q)
		require.NoError(t, err)
		require.EqualValues(t, 2, st.Backlog)
		require.WithinDuration(t, now, st.Oldest, time.Minute)
	})

	t.Run("NakDelay", func(t *testing.T) {
		t.Parallel()
		q := "nak"
		require.NoError(t, store.QueuePublish(ctx, q, msg("e1")))
		now := time.Now().UTC()
		jobs := fetch(t, q, 1, now)
		require.Len(t, jobs, 1)
		require.NoError(t, store.QueueNak(ctx, idemstore.QueueNakParams{ID: jobs[0].ID, Token: jobs[0].Token,
			Delay: time.Hour, Error: "downstream timeout", Now: now}))
		require.ErrorIs(t, store.QueueNak(ctx, idemstore.QueueNakParams{ID: jobs[0].ID, Token: jobs[0].Token, Now: now}),
			idem.ErrLeaseLost, "a nak releases the lease")
		require.ErrorIs(t, store.QueueAck(ctx, jobs[0].ID, jobs[0].Token), idem.ErrLeaseLost, "nor ack after a nak")

		require.Empty(t, fetch(t, q, 1, now), "not before the delay")
		require.Empty(t, fetch(t, q, 1, now.Add(59*time.Minute)), "not before the delay")
		again := fetch(t, q, 1, now.Add(time.Hour))
		require.Len(t, again, 1)
		require.Equal(t, 2, again[0].Message.Attempt)
		require.EqualValues(t, 2, again[0].Token)

		var lastErr string
		require.NoError(t, store.Pool().QueryRow(ctx, `SELECT last_error FROM `+table(store, "queue")+` WHERE id = $1`,
			jobs[0].ID).Scan(&lastErr))
		require.Equal(t, "downstream timeout", lastErr)
	})

	t.Run("Extend", func(t *testing.T) {
		t.Parallel()
		q := "extend"
		require.NoError(t, store.QueuePublish(ctx, q, msg("e1"), msg("e2")))
		now := time.Now().UTC()
		jobs := fetch(t, q, 1, now)
		require.Len(t, jobs, 1)
		require.NoError(t, store.QueueExtend(ctx, jobs[0].ID, jobs[0].Token, time.Hour))
		require.ErrorIs(t, store.QueueExtend(ctx, jobs[0].ID, jobs[0].Token+1, time.Hour), idem.ErrLeaseLost)
		require.Equal(t, []string{"e2"}, eventIDs(fetch(t, q, 10, now.Add(lease))), "the extended job stays leased")
		require.NoError(t, store.QueueAck(ctx, jobs[0].ID, jobs[0].Token))

		// A lease that already expired is not revived: someone may be taking it.
		require.NoError(t, store.QueuePublish(ctx, q, msg("e3")))
		old, err := store.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: q, Max: 1, Lease: time.Millisecond, Now: time.Now()})
		require.NoError(t, err)
		require.Equal(t, []string{"e3"}, eventIDs(old))
		time.Sleep(10 * time.Millisecond)
		require.ErrorIs(t, store.QueueExtend(ctx, old[0].ID, old[0].Token, time.Hour), idem.ErrLeaseLost)
	})

	t.Run("AckTxAndPublishTxFollowTheTransaction", func(t *testing.T) {
		t.Parallel()
		q := "tx"
		rollback := errors.New("roll back")
		require.ErrorIs(t, store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if err := store.QueuePublishTx(ctx, tx, q, msg("gone")); err != nil {
				return err
			}
			return rollback
		}), rollback)
		require.NoError(t, store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			return store.QueuePublishTx(ctx, tx, q, msg("e1"))
		}))
		jobs := fetch(t, q, 10, time.Now())
		require.Equal(t, []string{"e1"}, eventIDs(jobs))
		j := jobs[0]

		require.ErrorIs(t, store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			return store.QueueAckTx(ctx, tx, j.ID, j.Token+1)
		}), idem.ErrLeaseLost)
		require.ErrorIs(t, store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if err := store.QueueAckTx(ctx, tx, j.ID, j.Token); err != nil {
				return err
			}
			return rollback
		}), rollback)
		st, err := store.QueueStats(ctx, q)
		require.NoError(t, err)
		require.EqualValues(t, 1, st.Backlog, "a rolled-back ack acks nothing")
		require.NoError(t, store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			return store.QueueAckTx(ctx, tx, j.ID, j.Token)
		}))
		st, err = store.QueueStats(ctx, q)
		require.NoError(t, err)
		require.Equal(t, idemstore.QueueStats{}, st)
	})

	t.Run("ConcurrentFetchTakesEachJobOnce", func(t *testing.T) {
		t.Parallel()
		q := "concurrent"
		const n = 60
		msgs := make([]idem.Message, n)
		for i := range msgs {
			msgs[i] = msg(fmt.Sprintf("e%02d", i))
		}
		require.NoError(t, store.QueuePublish(ctx, q, msgs...))
		now := time.Now().UTC()
		var (
			mu   sync.Mutex
			seen = make(map[int64]int)
			wg   sync.WaitGroup
		)
		errs := make(chan error, 4)
		for range 4 {
			wg.Go(func() {
				for {
					jobs, err := store.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: q, Max: 3, Lease: lease, Now: now})
					if err != nil {
						errs <- err
						return
					}
					if len(jobs) == 0 {
						return
					}
					mu.Lock()
					for _, j := range jobs {
						seen[j.ID]++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Len(t, seen, n)
		for id, c := range seen {
			require.Equal(t, 1, c, "job %d fetched %d times", id, c)
		}
	})

	t.Run("QueuesAreSeparate", func(t *testing.T) {
		t.Parallel()
		require.NoError(t, store.QueuePublish(ctx, "sep-a", msg("a1")))
		require.NoError(t, store.QueuePublish(ctx, "sep-b", msg("b1")))
		require.Equal(t, []string{"a1"}, eventIDs(fetch(t, "sep-a", 10, time.Now())))
		require.Equal(t, []string{"b1"}, eventIDs(fetch(t, "sep-b", 10, time.Now())))
	})

	t.Run("InvalidInput", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name string
			err  error
			want string
		}{
			{"publish without event id", store.QueuePublish(ctx, "bad", idem.Message{Type: "x"}), "empty event id"},
			{"publish to no queue", store.QueuePublish(ctx, "", msg("e")), "queue name is empty"},
			{"fetch zero", func() error {
				_, err := store.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: "bad", Lease: lease})
				return err
			}(), "Max is 0"},
			{"fetch without lease", func() error {
				_, err := store.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: "bad", Max: 1})
				return err
			}(), "Lease is 0s"},
		} {
			require.ErrorContains(t, tc.err, tc.want, tc.name)
		}
		st, err := store.QueueStats(ctx, "bad")
		require.NoError(t, err)
		require.Zero(t, st.Backlog, "a failed publish inserts nothing")
	})
}

func TestQueueWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, idempg.Config{})
	// A second Store on the same tables, as another process would have: its publishes reach
	// the first Store's waiters through PostgreSQL, not through memory.
	other, err := idempg.NewWithConfig(store.Pool(), store.Config())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, other.Close()) })
	// Let the listener connect; its first connection wakes every waiter once.
	require.NoError(t, store.QueueWait(ctx, "warm-up", 200*time.Millisecond))

	t.Run("WakesOnPublish", func(t *testing.T) {
		q := "wake"
		done := make(chan time.Duration, 1)
		go func() {
			start := time.Now()
			err := store.QueueWait(ctx, q, time.Minute)
			if err != nil {
				t.Errorf("QueueWait: %v", err)
			}
			done <- time.Since(start)
		}()
		// The waiter may not be registered yet when the first publish notifies; keep publishing
		// until it wakes.
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case took := <-done:
				require.Less(t, took, 10*time.Second, "woken by the notification, not by max")
				return
			case <-tick.C:
				require.Less(t, i, 100, "QueueWait never woke")
				require.NoError(t, other.QueuePublish(ctx, q, msg(fmt.Sprintf("e%d", i))))
			}
		}
	})

	t.Run("OtherQueueDoesNotWake", func(t *testing.T) {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
					if err := other.QueuePublish(ctx, "noisy", msg(fmt.Sprintf("n%d", i))); err != nil {
						t.Errorf("publish: %v", err)
						return
					}
				}
			}
		})
		start := time.Now()
		require.NoError(t, store.QueueWait(ctx, "quiet", 700*time.Millisecond))
		close(stop)
		wg.Wait()
		require.GreaterOrEqual(t, time.Since(start), 700*time.Millisecond)
	})

	t.Run("ContextEnds", func(t *testing.T) {
		t.Parallel()
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, store.QueueWait(cctx, "idle", time.Minute), context.DeadlineExceeded)
		require.ErrorIs(t, store.OutboxWait(cctx, time.Minute), context.DeadlineExceeded, "already ended")
	})

	t.Run("MaxElapses", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		require.NoError(t, store.QueueWait(ctx, "idle", 100*time.Millisecond))
		require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond)
	})
}

// TestWaitPollsWithoutListener checks the polling fallback: a Store whose pool cannot connect
// still waits max and returns nil, and Close stops its reconnecting listener.
func TestWaitPollsWithoutListener(t *testing.T) {
	t.Parallel()
	testPool(t) // only runs where the other tests run
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := idempg.New(pool)
	t.Cleanup(func() { require.NoError(t, store.Close()) })
	ctx := context.Background()
	for _, wait := range []func() error{
		func() error { return store.QueueWait(ctx, "q", 300*time.Millisecond) },
		func() error { return store.OutboxWait(ctx, 300*time.Millisecond) },
	} {
		start := time.Now()
		require.NoError(t, wait())
		require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	}
	require.NoError(t, store.Close())
	start := time.Now()
	require.NoError(t, store.QueueWait(ctx, "q", 100*time.Millisecond), "after Close a wait polls")
	require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond)
}

// TestListenerReconnects kills the listening connection's backend and checks that waiters are
// still woken by publishes once the listener has reconnected.
func TestListenerReconnects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A prefix of its own, so this store's LISTEN is the only one on its channel names.
	store := newStore(t, idempg.Config{Prefix: "reconnect_"})
	pool := store.Pool()
	listenerPID := func() int32 {
		var pid int32
		err := pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN "reconnect_outbox"'`).Scan(&pid)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0
		}
		require.NoError(t, err)
		return pid
	}
	require.NoError(t, store.QueueWait(ctx, "q", 200*time.Millisecond)) // start the listener
	var first int32
	require.Eventually(t, func() bool { first = listenerPID(); return first != 0 }, 10*time.Second, 20*time.Millisecond)

	var killed bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, first).Scan(&killed))
	require.True(t, killed)
	require.Eventually(t, func() bool {
		pid := listenerPID()
		return pid != 0 && pid != first
	}, 15*time.Second, 50*time.Millisecond, "the listener did not reconnect")

	done := make(chan error, 1)
	go func() { done <- store.QueueWait(ctx, "q", time.Minute) }()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case err := <-done:
			require.NoError(t, err)
			return
		case <-tick.C:
			require.Less(t, i, 100, "QueueWait never woke after the reconnect")
			require.NoError(t, store.QueuePublish(ctx, "q", msg(fmt.Sprintf("e%d", i))))
		}
	}
}

// TestQueueFirstFetch runs the first-fetch conformance check: the time the retry budget counts
// from survives naks, lost leases and releases of a later attempt.
func TestQueueFirstFetch(t *testing.T) {
	t.Parallel()
	storetest.ExerciseQueueFirstFetch(t, factory)
}

// queueFactory opens a store for the queue conformance checks, reading a job's last error and
// beginning the caller's own transactions on the pool. PostgreSQL's QueueWait is woken by
// notifications, so the checks' poll interval has no setting here.
func queueFactory(tb testing.TB, _ storetest.QueueConfig) storetest.QueueBundle[pgx.Tx] {
	tb.Helper()
	store := newStore(tb, idempg.Config{})
	return storetest.QueueBundle[pgx.Tx]{
		Store: store,
		LastError: func(ctx context.Context, id int64) (string, error) {
			var lastErr string
			err := store.Pool().QueryRow(ctx, `SELECT last_error FROM `+table(store, "queue")+` WHERE id = $1`, id).Scan(&lastErr)
			return lastErr, err
		},
		BeginTx: func(ctx context.Context) (pgx.Tx, func() error, error) {
			tx, err := store.Pool().Begin(ctx)
			if err != nil {
				return nil, nil, err
			}
			return tx, func() error { return tx.Commit(ctx) }, nil
		},
		SpuriousWakes: true,
	}
}

// TestQueueConformance runs the queue's conformance checks (storetest.ExerciseQueue), as every
// store does; QueueWait's spurious wake-ups are declared (SpuriousWakes).
func TestQueueConformance(t *testing.T) {
	t.Parallel()
	storetest.ExerciseQueue(t, queueFactory)
}

// TestQueueSubscriptions runs the fan-out conformance checks.
func TestQueueSubscriptions(t *testing.T) {
	t.Parallel()
	storetest.ExerciseQueueSubscriptions(t, queueFactory)
}

// TestQueueAckTxDeferred: inside InTx the acks of a transaction are deleted together, in the
// round trip of its commit: all of them when every lease still holds; none, and InTx fails with
// idem.ErrLeaseLost naming the job, when one lease was lost, or when a job was acked twice; none
// when the transaction rolls back or had failed before. Whenever the acks fail, nothing else of
// the transaction commits either (the server skips the COMMIT sent with them), and the
// connection goes back to the pool usable. In a savepoint (SavepointTx) an ack is made at once,
// so it rolls back with it.
func TestQueueAckTxDeferred(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, idempg.Config{})
	errHandler := errors.New("handler failed")
	tests := []struct {
		name     string
		stale    bool // the second job's token is one its lease no longer has
		twice    bool // the first job is acked a second time
		abort    bool // a statement fails first and the function ignores it
		fail     bool // the transaction's function fails after acking
		wantErr  error
		wantMsg  string
		wantLeft int
	}{
		{name: "all acked"},
		{name: "a lost lease fails them all", stale: true, wantErr: idem.ErrLeaseLost, wantLeft: 3},
		{name: "acked twice", twice: true, wantErr: idem.ErrLeaseLost, wantMsg: "acked twice", wantLeft: 3},
		{name: "rolled back", fail: true, wantErr: errHandler, wantLeft: 3},
		{name: "failed before", abort: true, wantMsg: "aborted", wantLeft: 3},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store := newStore(t, idempg.Config{}) // its own pool: the connection below is this test's alone
			q := fmt.Sprintf("deferred-%d", i)
			effect := q + "-effect"
			var conn *pgconn.PgConn
			require.NoError(t, store.QueuePublish(ctx, q, msg("e1"), msg("e2"), msg("e3")))
			jobs, err := store.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: q, Max: 3, Lease: time.Minute})
			require.NoError(t, err)
			require.Len(t, jobs, 3)
			if tt.stale {
				jobs[1].Token--
			}
			err = store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				conn = tx.Conn().PgConn()
				if tt.abort {
					_, err := tx.Exec(ctx, `SELECT 1/0`)
					require.Error(t, err)
				} else if err := store.QueuePublishTx(ctx, tx, effect, msg("effect")); err != nil {
					return err
				}
				for _, j := range jobs {
					require.NoError(t, store.QueueAckTx(ctx, tx, j.ID, j.Token))
				}
				if tt.twice {
					require.NoError(t, store.QueueAckTx(ctx, tx, jobs[0].ID, jobs[0].Token))
				}
				if tt.fail {
					return errHandler
				}
				return nil
			})
			// The transaction ended on its connection, committed or rolled back: one left open
			// (a failed ack whose rollback was skipped) would be aborted ('E') and the pool would
			// drop the connection.
			require.Equal(t, byte('I'), conn.TxStatus(), "the connection is out of any transaction")
			require.False(t, conn.IsClosed(), "the connection goes back to the pool")
			switch {
			case tt.wantErr != nil:
				require.ErrorIs(t, err, tt.wantErr)
			case tt.wantMsg != "":
				require.Error(t, err)
			default:
				require.NoError(t, err)
			}
			if tt.wantMsg != "" {
				require.ErrorContains(t, err, tt.wantMsg)
			}
			if tt.stale {
				require.ErrorContains(t, err, fmt.Sprint(jobs[1].ID))
			}
			st, err := store.QueueStats(ctx, q)
			require.NoError(t, err)
			require.EqualValues(t, tt.wantLeft, st.Backlog)
			st, err = store.QueueStats(ctx, effect)
			require.NoError(t, err)
			wantEffect := 0
			if tt.wantErr == nil && tt.wantMsg == "" {
				wantEffect = 1
			}
			require.EqualValues(t, wantEffect, st.Backlog, "the transaction's other writes commit with its acks, or not at all")
			// The connection went back to the pool out of any transaction: a connection left
			// inside one would fail the next BEGIN on it.
			require.NoError(t, store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				return store.QueuePublishTx(ctx, tx, effect+"-after", msg("after"))
			}))
		})
	}

	t.Run("savepoint acks at once", func(t *testing.T) {
		t.Parallel()
		q := "deferred-savepoint"
		require.NoError(t, store.QueuePublish(ctx, q, msg("e1")))
		jobs, err := store.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: q, Max: 1, Lease: time.Minute})
		require.NoError(t, err)
		stale := jobs[0].Token - 1
		require.NoError(t, store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			err := store.SavepointTx(ctx, tx, func(ctx context.Context, sp pgx.Tx) error {
				return store.QueueAckTx(ctx, sp, jobs[0].ID, stale)
			})
			require.ErrorIs(t, err, idem.ErrLeaseLost, "a savepoint's ack fails at once")
			return nil
		}))
		st, err := store.QueueStats(ctx, q)
		require.NoError(t, err)
		require.EqualValues(t, 1, st.Backlog)
	})
}
