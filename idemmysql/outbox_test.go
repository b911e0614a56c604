package idemmysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
)

func outgoing(eventID, key string) idem.Outgoing {
	return idem.Outgoing{EventID: eventID, Tenant: "acme", Topic: "payments", Key: key, Type: "payment.captured",
		Payload: []byte(`{"id":"` + eventID + `"}`)}
}

func enqueue(t *testing.T, b *testBundle, msgs ...idem.Outgoing) {
	t.Helper()
	require.NoError(t, b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		return b.store.EnqueueTx(ctx, tx, msgs...)
	}))
}

func rowEventIDs(rows []idem.OutboxRow) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.Outgoing.EventID
	}
	return out
}

func allPartitions(s *idemmysql.Store) []int {
	ps := make([]int, s.OutboxPartitions())
	for i := range ps {
		ps[i] = i
	}
	return ps
}

func TestOutboxEnqueueTx(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmysql.Config{OutboxPartitions: 4})
	require.Equal(t, 4, b.store.OutboxPartitions())
	_, err := b.db.ExecContext(b.ctx, `CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY) ENGINE=InnoDB`)
	require.NoError(t, err)

	// The event rolls back with the business write…
	errBusiness := errors.New("business write failed")
	err = b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES ('o1')`)
		require.NoError(t, err)
		require.NoError(t, b.store.EnqueueTx(ctx, tx, outgoing("rolled-back", "o1")))
		return errBusiness
	})
	require.ErrorIs(t, err, errBusiness)

	// …and commits with it.
	occurred := now().Add(-time.Hour)
	in := outgoing("committed", "o1")
	in.Headers = map[string]string{"Idempotency-Key": "committed"}
	in.OccurredAt = occurred
	before := now()
	require.NoError(t, b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES ('o1')`); err != nil {
			return err
		}
		return b.store.EnqueueTx(ctx, tx, in, outgoing("no-occurred", ""))
	}))

	rows, err := b.store.OutboxFetch(b.ctx, idem.OutboxFetchParams{Partitions: allPartitions(b.store), Limit: 10})
	require.NoError(t, err)
	require.Equal(t, []string{"committed", "no-occurred"}, rowEventIDs(rows))
	r := rows[0]
	require.Equal(t, in, r.Outgoing)
	require.Equal(t, idem.OutboxPartition(in, 4), r.Partition)
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
	err = b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		return b.store.EnqueueTx(ctx, tx, idem.Outgoing{EventID: "no-topic"})
	})
	require.ErrorContains(t, err, "no-topic")
}

func TestOutboxFetchPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmysql.Config{OutboxPartitions: 8})
	// Three ordering keys, four events each, interleaved.
	keys := []string{"k-a", "k-b", "k-c"}
	var all []idem.Outgoing
	for i := range 4 {
		for _, k := range keys {
			all = append(all, outgoing(fmt.Sprintf("%s-%d", k, i), k))
		}
	}
	enqueue(t, b, all...)

	for _, k := range keys {
		t.Run(k, func(t *testing.T) {
			part := idem.OutboxPartition(outgoing("", k), 8)
			rows, err := b.store.OutboxFetch(b.ctx, idem.OutboxFetchParams{Partitions: []int{part}, Limit: 100})
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

	rows, err := b.store.OutboxFetch(b.ctx, idem.OutboxFetchParams{Partitions: allPartitions(b.store), Limit: 5})
	require.NoError(t, err)
	require.Len(t, rows, 5)
	require.Equal(t, rowEventIDs(rows), []string{"k-a-0", "k-b-0", "k-c-0", "k-a-1", "k-b-1"})

	none, err := b.store.OutboxFetch(b.ctx, idem.OutboxFetchParams{})
	require.NoError(t, err)
	require.Empty(t, none)
}

func TestOutboxMark(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmysql.Config{OutboxPartitions: 1})
	enqueue(t, b, outgoing("e1", ""), outgoing("e2", ""), outgoing("e3", ""), outgoing("e4", ""))
	fetch := func() []idem.OutboxRow {
		t.Helper()
		rows, err := b.store.OutboxFetch(b.ctx, idem.OutboxFetchParams{Partitions: []int{0}})
		require.NoError(t, err)
		return rows
	}
	rows := fetch()
	require.Len(t, rows, 4)

	require.NoError(t, b.store.OutboxMarkPublished(b.ctx, []int64{rows[0].ID, rows[2].ID}, now()))
	require.Equal(t, []string{"e2", "e4"}, rowEventIDs(fetch()))

	next := now().Add(time.Minute)
	require.NoError(t, b.store.OutboxMarkFailed(b.ctx, idem.OutboxFailParams{
		ID: rows[1].ID, Attempts: 1, LastError: "broker down", NextAttemptAt: next}))
	got := fetch()
	require.Equal(t, []string{"e2", "e4"}, rowEventIDs(got), "a failed row stays, not yet due")
	require.Equal(t, 1, got[0].Attempts)
	require.Equal(t, "broker down", got[0].LastError)
	require.Equal(t, next, got[0].NextAttemptAt)

	require.NoError(t, b.store.OutboxMarkFailed(b.ctx, idem.OutboxFailParams{
		ID: rows[1].ID, Attempts: 5, LastError: "gave up", NextAttemptAt: next, Dead: true}))
	require.Equal(t, []string{"e4"}, rowEventIDs(fetch()), "a dead row is out of the relay's way")
	st, err := b.store.OutboxStats(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Backlog)

	err = b.store.OutboxMarkFailed(b.ctx, idem.OutboxFailParams{ID: 9999})
	require.ErrorIs(t, err, idem.ErrNotFound)
	require.ErrorContains(t, err, "9999")
}

func TestOutboxDeletePublished(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmysql.Config{OutboxPartitions: 1})
	for i := range 6 {
		enqueue(t, b, outgoing(fmt.Sprint("e", i), ""))
	}
	rows, err := b.store.OutboxFetch(b.ctx, idem.OutboxFetchParams{Partitions: []int{0}})
	require.NoError(t, err)
	require.Len(t, rows, 6)
	t0 := now()
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
	var left int
	require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT count(*) FROM idem_outbox`).Scan(&left))
	require.Equal(t, 2, left, "the unpublished row and the one published at t0 stay")

	_, err = b.store.OutboxDeletePublished(b.ctx, t0, 0)
	require.ErrorContains(t, err, "limit is 0")
}

func TestOutboxWait(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmysql.Config{PollInterval: time.Hour})

	t.Run("poll", func(t *testing.T) {
		fast := setup(t, idemmysql.Config{PollInterval: 10 * time.Millisecond})
		start := time.Now()
		require.NoError(t, fast.store.OutboxWait(fast.ctx, time.Hour))
		require.Less(t, time.Since(start), 5*time.Second)
	})

	t.Run("enqueue wakes after commit", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { done <- b.store.OutboxWait(b.ctx, time.Hour) }()
		time.Sleep(20 * time.Millisecond)
		require.NoError(t, b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
			require.NoError(t, b.store.EnqueueTx(ctx, tx, outgoing("e1", "")))
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

func TestLeases(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmysql.Config{})
	t0 := now()
	acquire := func(name, owner string, at time.Time) (int64, bool) {
		t.Helper()
		tok, ok, err := b.store.LeaseAcquire(b.ctx, idem.LeaseParams{Name: name, Owner: owner, TTL: time.Minute, Now: at})
		require.NoError(t, err)
		return tok, ok
	}
	steps := []struct {
		name      string
		owner     string
		at        time.Time
		wantToken int64
		wantOK    bool
	}{
		{"free lease", "a", t0, 1, true},
		{"held by another", "b", t0.Add(30 * time.Second), 0, false},
		{"renewed by owner keeps token", "a", t0.Add(30 * time.Second), 1, true},
		{"renewal extended it", "b", t0.Add(70 * time.Second), 0, false},
		{"stolen after expiry", "b", t0.Add(91 * time.Second), 2, true},
		{"old owner is out", "a", t0.Add(100 * time.Second), 0, false},
		{"old owner back after expiry", "a", t0.Add(10 * time.Minute), 3, true},
	}
	for _, s := range steps {
		tok, ok := acquire("relay/p0", s.owner, s.at)
		require.Equal(t, s.wantOK, ok, s.name)
		require.Equal(t, s.wantToken, tok, s.name)
	}

	t1 := t0.Add(10 * time.Minute)
	// Release only works for the owner, and the next owner's token is larger.
	require.NoError(t, b.store.LeaseRelease(b.ctx, "relay/p0", "b"))
	_, ok := acquire("relay/p0", "b", t1)
	require.False(t, ok, "a release by a non-owner does nothing")
	require.NoError(t, b.store.LeaseRelease(b.ctx, "relay/p0", "a"))
	tok, ok := acquire("relay/p0", "b", t1)
	require.True(t, ok)
	require.EqualValues(t, 4, tok)

	// LeaseList: unexpired, by prefix ("_" is no wildcard), by name.
	_, ok = acquire("relay/p1", "c", t1)
	require.True(t, ok)
	_, ok = acquire("relay/p2", "c", t1.Add(-2*time.Minute)) // expired at t1
	require.True(t, ok)
	_, ok = acquire("relayXp3", "c", t1)
	require.True(t, ok)
	_, ok = acquire("members/c", "c", t1)
	require.True(t, ok)

	list, err := b.store.LeaseList(b.ctx, "relay/", t1)
	require.NoError(t, err)
	require.Equal(t, []idem.Lease{
		{Name: "relay/p0", Owner: "b", Token: 4, LeaseUntil: t1.Add(time.Minute)},
		{Name: "relay/p1", Owner: "c", Token: 1, LeaseUntil: t1.Add(time.Minute)},
	}, list)
	list, err = b.store.LeaseList(b.ctx, "relay_", t1)
	require.NoError(t, err)
	require.Empty(t, list)
	list, err = b.store.LeaseList(b.ctx, "", t1)
	require.NoError(t, err)
	require.Len(t, list, 4)

	_, _, err = b.store.LeaseAcquire(b.ctx, idem.LeaseParams{Name: "x", Owner: "", TTL: time.Second})
	require.ErrorContains(t, err, "owner")
	_, _, err = b.store.LeaseAcquire(b.ctx, idem.LeaseParams{Name: "x", Owner: "a"})
	require.ErrorContains(t, err, "TTL")
}
