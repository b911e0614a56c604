package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/storetest"
)

const testPartitions = 4

func allPartitions() []int {
	p := make([]int, testPartitions)
	for i := range p {
		p[i] = i
	}
	return p
}

func outgoing(id, key string) idem.Outgoing {
	return idem.Outgoing{
		EventID: id, Tenant: "acme", Topic: "payments.captured", Key: key, Type: "payment.captured",
		Payload: []byte(`{"id":"` + id + `"}`), Headers: map[string]string{"Idempotency-Key": id},
	}
}

func enqueue(t *testing.T, store *idempg.Store, msgs ...idem.Outgoing) {
	t.Helper()
	require.NoError(t, store.InTx(context.Background(), func(ctx context.Context, tx pgx.Tx) error {
		return store.EnqueueTx(ctx, tx, msgs...)
	}))
}

func fetchAll(t *testing.T, store *idempg.Store) []idemstore.OutboxRow {
	t.Helper()
	rows, err := store.OutboxFetch(context.Background(), idemstore.OutboxFetchParams{Partitions: allPartitions(), Limit: 1000})
	require.NoError(t, err)
	return rows
}

func TestOutbox(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := idempg.Config{OutboxPartitions: testPartitions}

	t.Run("EnqueueFollowsTheCallersTransaction", func(t *testing.T) {
		t.Parallel()
		store := newStore(t, cfg)
		require.Equal(t, testPartitions, store.OutboxPartitions())
		rollback := errors.New("business write failed")
		require.ErrorIs(t, store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if err := store.EnqueueTx(ctx, tx, outgoing("gone", "k")); err != nil {
				return err
			}
			return rollback
		}), rollback)
		require.Empty(t, fetchAll(t, store), "rolled back with the business write")

		bad := outgoing("evt-bad", "k")
		bad.Topic = ""
		err := store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			return store.EnqueueTx(ctx, tx, outgoing("evt-ok", "k"), bad)
		})
		require.ErrorContains(t, err, "evt-bad")
		require.Empty(t, fetchAll(t, store), "an invalid event enqueues nothing")

		before := time.Now().UTC()
		occurred := time.Date(2025, 12, 31, 23, 59, 59, 0, time.UTC)
		withTime := outgoing("evt-2", "k")
		withTime.OccurredAt = occurred
		enqueue(t, store, outgoing("evt-1", "k"), withTime)
		rows := fetchAll(t, store)
		require.Len(t, rows, 2)
		for i, r := range rows {
			want := []idem.Outgoing{outgoing("evt-1", "k"), withTime}[i]
			require.Equal(t, idemstore.OutboxPartition(want, testPartitions), r.Partition)
			require.Equal(t, want.EventID, r.Outgoing.EventID)
			require.Equal(t, want.Tenant, r.Outgoing.Tenant)
			require.Equal(t, want.Topic, r.Outgoing.Topic)
			require.Equal(t, want.Key, r.Outgoing.Key)
			require.Equal(t, want.Type, r.Outgoing.Type)
			require.Equal(t, want.Payload, r.Outgoing.Payload)
			require.Equal(t, want.Headers, r.Outgoing.Headers)
			require.WithinDuration(t, before, r.CreatedAt, time.Minute)
			require.True(t, r.NextAttemptAt.Equal(r.CreatedAt), "due at once")
			require.Zero(t, r.Attempts)
		}
		require.True(t, rows[0].Outgoing.OccurredAt.Equal(rows[0].CreatedAt), "zero OccurredAt is the enqueue time")
		require.True(t, rows[1].Outgoing.OccurredAt.Equal(occurred))
	})

	t.Run("FetchPerPartitionInOrder", func(t *testing.T) {
		t.Parallel()
		store := newStore(t, cfg)
		var msgs []idem.Outgoing
		for i := range 24 {
			msgs = append(msgs, outgoing(fmt.Sprintf("evt-%02d", i), fmt.Sprintf("key-%d", i%6)))
		}
		enqueue(t, store, msgs[:10]...)
		enqueue(t, store, msgs[10:]...)

		total := 0
		for p := range testPartitions {
			rows, err := store.OutboxFetch(ctx, idemstore.OutboxFetchParams{Partitions: []int{p}, Limit: 100})
			require.NoError(t, err)
			total += len(rows)
			lastByKey := map[string]string{}
			for i, r := range rows {
				require.Equal(t, p, r.Partition)
				require.Equal(t, idemstore.OutboxPartition(r.Outgoing, testPartitions), p)
				if i > 0 {
					require.Less(t, rows[i-1].ID, r.ID, "enqueue order")
				}
				require.Less(t, lastByKey[r.Outgoing.Key], r.Outgoing.EventID, "per-key order")
				lastByKey[r.Outgoing.Key] = r.Outgoing.EventID
			}
		}
		require.Equal(t, len(msgs), total, "every row in exactly one partition")

		rows, err := store.OutboxFetch(ctx, idemstore.OutboxFetchParams{Partitions: allPartitions(), Limit: 3})
		require.NoError(t, err)
		require.Len(t, rows, 3)
		require.Equal(t, []string{"evt-00", "evt-01", "evt-02"},
			[]string{rows[0].Outgoing.EventID, rows[1].Outgoing.EventID, rows[2].Outgoing.EventID})
		rows, err = store.OutboxFetch(ctx, idemstore.OutboxFetchParams{})
		require.NoError(t, err)
		require.Empty(t, rows, "no partitions, no rows")
	})

	t.Run("MarkPublishedAndFailed", func(t *testing.T) {
		t.Parallel()
		store := newStore(t, cfg)
		enqueue(t, store, outgoing("evt-1", "a"), outgoing("evt-2", "b"), outgoing("evt-3", "c"), outgoing("evt-4", "d"))
		rows := fetchAll(t, store)
		require.Len(t, rows, 4)
		st, err := store.OutboxStats(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 4, st.Backlog)
		require.True(t, st.Oldest.Equal(rows[0].CreatedAt))

		require.NoError(t, store.OutboxMarkPublished(ctx, []int64{rows[0].ID}, time.Now()))
		next := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
		require.NoError(t, store.OutboxMarkFailed(ctx, idemstore.OutboxFailParams{ID: rows[1].ID, Attempts: 3,
			LastError: "503 from broker", NextAttemptAt: next}))
		require.NoError(t, store.OutboxMarkFailed(ctx, idemstore.OutboxFailParams{ID: rows[2].ID, Attempts: 10,
			LastError: "rejected", NextAttemptAt: next, Dead: true}))
		err = store.OutboxMarkFailed(ctx, idemstore.OutboxFailParams{ID: 1 << 40, Attempts: 1})
		require.ErrorIs(t, err, idem.ErrNotFound)
		require.ErrorContains(t, err, fmt.Sprint(int64(1<<40)))

		left := fetchAll(t, store)
		require.Len(t, left, 2, "published and dead rows are out of the relay's way")
		require.Equal(t, "evt-2", left[0].Outgoing.EventID)
		require.Equal(t, 3, left[0].Attempts)
		require.Equal(t, "503 from broker", left[0].LastError)
		require.True(t, left[0].NextAttemptAt.Equal(next))
		require.Equal(t, "evt-4", left[1].Outgoing.EventID)

		st, err = store.OutboxStats(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 2, st.Backlog)
		require.True(t, st.Oldest.Equal(rows[1].CreatedAt))
	})

	t.Run("DeletePublishedInBatches", func(t *testing.T) {
		t.Parallel()
		store := newStore(t, cfg)
		var msgs []idem.Outgoing
		for i := range 7 {
			msgs = append(msgs, outgoing(fmt.Sprintf("evt-%d", i), ""))
		}
		enqueue(t, store, msgs...)
		rows := fetchAll(t, store)
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		var old, recent []int64
		for i, r := range rows {
			if i < 5 {
				old = append(old, r.ID)
			} else {
				recent = append(recent, r.ID)
			}
		}
		require.NoError(t, store.OutboxMarkPublished(ctx, old, t0))
		require.NoError(t, store.OutboxMarkPublished(ctx, recent[:1], t0.Add(2*time.Hour)))
		// recent[1] stays unpublished.
		for _, want := range []int{2, 2, 1, 0} {
			n, err := store.OutboxDeletePublished(ctx, t0.Add(time.Hour), 2)
			require.NoError(t, err)
			require.Equal(t, want, n)
		}
		var n int
		require.NoError(t, store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+table(store, "outbox")).Scan(&n))
		require.Equal(t, 2, n, "recently published and unpublished rows stay")
		_, err := store.OutboxDeletePublished(ctx, t0, 0)
		require.ErrorContains(t, err, "limit is 0")
	})
}

func TestOutboxWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, idempg.Config{})
	require.NoError(t, store.OutboxWait(ctx, 200*time.Millisecond)) // let the listener connect

	done := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		if err := store.OutboxWait(ctx, time.Minute); err != nil {
			t.Errorf("OutboxWait: %v", err)
		}
		done <- time.Since(start)
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case took := <-done:
			require.Less(t, took, 10*time.Second, "woken by the notification, not by max")
			return
		case <-tick.C:
			require.Less(t, i, 100, "OutboxWait never woke")
			enqueue(t, store, outgoing(fmt.Sprintf("evt-%d", i), ""))
		}
	}
}

func TestLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, idempg.Config{})
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	ttl := 10 * time.Second
	name := "relay/partition/0"

	// Steps in order on one lease.
	for _, step := range []struct {
		what      string
		owner     string
		at        time.Duration
		wantOK    bool
		wantToken int64
	}{
		{"free lease", "a", 0, true, 1},
		{"held by a", "b", 5 * time.Second, false, 0},
		{"a renews and keeps its token", "a", 5 * time.Second, true, 1},
		{"renewed until 15s", "b", 14 * time.Second, false, 0},
		{"expired: b takes it", "b", 15 * time.Second, true, 2},
		{"now b's", "a", 16 * time.Second, false, 0},
		{"b renews", "b", 20 * time.Second, true, 2},
		{"a takes it back after expiry", "a", 31 * time.Second, true, 3},
	} {
		token, ok, err := store.LeaseAcquire(ctx, idemstore.LeaseParams{Name: name, Owner: step.owner, TTL: ttl, Now: t0.Add(step.at)})
		require.NoError(t, err, step.what)
		require.Equal(t, step.wantOK, ok, step.what)
		require.Equal(t, step.wantToken, token, step.what)
	}

	at := t0.Add(32 * time.Second)
	_, ok, err := store.LeaseAcquire(ctx, idemstore.LeaseParams{Name: "relay/member/x", Owner: "x", TTL: time.Minute, Now: at})
	require.NoError(t, err)
	require.True(t, ok)
	_, ok, err = store.LeaseAcquire(ctx, idemstore.LeaseParams{Name: "other", Owner: "x", TTL: time.Minute, Now: at})
	require.NoError(t, err)
	require.True(t, ok)

	leases, err := store.LeaseList(ctx, "relay/", at)
	require.NoError(t, err)
	require.Equal(t, []idemstore.Lease{
		{Name: "relay/member/x", Owner: "x", Token: 1, LeaseUntil: at.Add(time.Minute)},
		{Name: name, Owner: "a", Token: 3, LeaseUntil: t0.Add(41 * time.Second)},
	}, leases)
	leases, err = store.LeaseList(ctx, "relay/", t0.Add(41*time.Second))
	require.NoError(t, err)
	require.Len(t, leases, 1, "expired leases are not listed")
	leases, err = store.LeaseList(ctx, "relay_", at)
	require.NoError(t, err)
	require.Empty(t, leases, "the prefix is not a LIKE pattern")

	// Release: only the owner can, and the next owner's token is still higher.
	require.NoError(t, store.LeaseRelease(ctx, name, "b"))
	_, ok, err = store.LeaseAcquire(ctx, idemstore.LeaseParams{Name: name, Owner: "c", TTL: ttl, Now: at})
	require.NoError(t, err)
	require.False(t, ok, "b's release did not free a's lease")
	require.NoError(t, store.LeaseRelease(ctx, name, "a"))
	token, ok, err := store.LeaseAcquire(ctx, idemstore.LeaseParams{Name: name, Owner: "c", TTL: ttl, Now: at})
	require.NoError(t, err)
	require.True(t, ok)
	require.EqualValues(t, 4, token)

	_, _, err = store.LeaseAcquire(ctx, idemstore.LeaseParams{Name: name, Owner: "c"})
	require.ErrorContains(t, err, "TTL is 0s")

	t.Run("ConcurrentAcquireHasOneWinner", func(t *testing.T) {
		t.Parallel()
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			wins []string
		)
		errs := make(chan error, 6)
		for i := range 6 {
			wg.Go(func() {
				owner := fmt.Sprintf("owner-%d", i)
				_, ok, err := store.LeaseAcquire(ctx, idemstore.LeaseParams{Name: "contested", Owner: owner, TTL: time.Minute, Now: t0})
				if err != nil {
					errs <- err
					return
				}
				if ok {
					mu.Lock()
					wins = append(wins, owner)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Len(t, wins, 1, "winners: %v", wins)
	})
}

// TestLeaseConformance runs the lease checks every store passes (storetest.ExerciseLeases)
// besides the PostgreSQL ones above.
func TestLeaseConformance(t *testing.T) {
	t.Parallel()
	storetest.ExerciseLeases(t, factory)
}
