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
	"github.com/idemkit/idem/idemstore"
)

// rowExists reports whether queue job id is still in the table.
func rowExists(t *testing.T, b *testBundle, id int64) bool {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRowContext(b.ctx, `SELECT count(*) FROM idem_queue WHERE id = ?`, id).Scan(&n))
	return n == 1
}

// ackInTx acks job inside a transaction of the store's InTx, which commits unless fail.
func ackInTx(b *testBundle, store *idemsqlite.Store, job idemstore.QueueJob, fail bool) error {
	errRollback := errors.New("rollback")
	err := store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		if err := store.QueueAckTx(ctx, tx, job.ID, job.Token); err != nil {
			return err
		}
		if fail {
			return errRollback
		}
		return nil
	})
	if errors.Is(err, errRollback) {
		return nil
	}
	return err
}

// TestQueueAckTxAfterCommit checks the ack of a job inside a transaction of InTx: the lease is
// checked inside the transaction, the job is deleted after the commit (by the next fetch, by
// QueueStats, or by itself within moments), never after a rollback, and only under the token
// that acked it; a job whose delete never came (the process stopped) comes back when its lease
// ends, for its claim to settle as a duplicate.
func TestQueueAckTxAfterCommit(t *testing.T) {
	t.Parallel()
	fetch := func(t *testing.T, store *idemsqlite.Store, queue string, n int, lease time.Duration, now time.Time) []idemstore.QueueJob {
		t.Helper()
		jobs, err := store.QueueFetch(context.Background(), idemstore.QueueFetchParams{Queue: queue, Max: n, Lease: lease, Now: now})
		require.NoError(t, err)
		return jobs
	}

	t.Run("DeletedAfterCommitNotAfterRollback", func(t *testing.T) {
		t.Parallel()
		b := setup(t, idemsqlite.Config{})
		require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("a", "b", "c")...))
		jobs := fetch(t, b.store, "q", 3, time.Minute, time.Time{})
		require.Len(t, jobs, 3)

		require.NoError(t, ackInTx(b, b.store, jobs[0], false))
		st, err := b.store.QueueStats(b.ctx, "q")
		require.NoError(t, err)
		require.EqualValues(t, 2, st.Backlog, "a committed ack is not backlog")
		require.False(t, rowExists(t, b, jobs[0].ID))
		require.Zero(t, b.store.AckedPending())

		require.NoError(t, ackInTx(b, b.store, jobs[1], true))
		require.Zero(t, b.store.AckedPending(), "a rolled-back ack deletes nothing")
		require.True(t, rowExists(t, b, jobs[1].ID))

		require.NoError(t, ackInTx(b, b.store, jobs[2], false))
		require.Eventually(t, func() bool { return !rowExists(t, b, jobs[2].ID) }, 10*time.Second, 10*time.Millisecond,
			"with no other write, the delete comes by itself")
		require.True(t, rowExists(t, b, jobs[1].ID), "the rolled-back job keeps its lease")
		require.Empty(t, fetch(t, b.store, "q", 3, time.Minute, time.Time{}), "b is still leased, a and c are gone")
	})

	t.Run("NextFetchDeletesInItsCommit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, idemsqlite.Config{})
		require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("a", "b")...))
		jobs := fetch(t, b.store, "q", 1, time.Minute, time.Time{})
		require.NoError(t, ackInTx(b, b.store, jobs[0], false))
		next := fetch(t, b.store, "q", 1, time.Minute, time.Time{})
		require.Equal(t, []string{"b"}, eventIDs(next))
		require.Zero(t, b.store.AckedPending(), "the fetch took the pending delete into its transaction")
		require.False(t, rowExists(t, b, jobs[0].ID))
	})

	t.Run("SeveralAcksDeleteInTheTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t, idemsqlite.Config{})
		b.store.SetAckDelay(time.Hour)
		require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("a", "b", "c")...))
		jobs := fetch(t, b.store, "q", 3, time.Minute, time.Time{})
		require.NoError(t, b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
			for _, j := range jobs {
				if err := b.store.QueueAckTx(ctx, tx, j.ID, j.Token); err != nil {
					return err
				}
			}
			return nil
		}))
		require.Zero(t, b.store.AckedPending(), "a batch's deletes share the queue's pages: they commit with it")
		for _, j := range jobs {
			require.False(t, rowExists(t, b, j.ID))
		}
	})

	t.Run("LostLeaseRefusedInsideTheTransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t, idemsqlite.Config{})
		other, err := idemsqlite.NewWithConfig(b.db, idemsqlite.Config{}) // another process on the file
		require.NoError(t, err)
		require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("a")...))
		// A lease of one second is within ackReadMargin from the start: the ack reads the token.
		mine := fetch(t, b.store, "q", 1, time.Second, time.Time{})
		require.Len(t, mine, 1)
		theirs := fetch(t, other, "q", 1, time.Minute, time.Now().Add(2*time.Second)) // after the lease
		require.Len(t, theirs, 1)
		require.ErrorIs(t, ackInTx(b, b.store, mine[0], false), idem.ErrLeaseLost)
		require.Zero(t, b.store.AckedPending())
		require.NoError(t, ackInTx(b, other, theirs[0], false))
		st, err := other.QueueStats(b.ctx, "q")
		require.NoError(t, err)
		require.Zero(t, st.Backlog)
	})

	// An ack inside the lease trusts this Store's record of it instead of reading the token
	// (holdsLease). Whatever ends or hands over the lease must end that trust: the lease running
	// out, a nak or a release of this Store, another fetch of this Store; each time another
	// worker takes the job, and the late ack must be refused inside its transaction.
	for _, tt := range []struct {
		name  string
		lease time.Duration
		// handOver ends mine's hold; then other takes the job with a fetch at time.Now().
		handOver func(t *testing.T, b *testBundle, mine idemstore.QueueJob)
		// takeWithMine takes the job again through the same Store (a future clock), not other.
		takeWithMine bool
	}{
		{name: "LeaseRanOut", lease: 1500 * time.Millisecond, handOver: func(t *testing.T, b *testBundle, mine idemstore.QueueJob) {
			time.Sleep(1600 * time.Millisecond)
		}},
		{name: "Naked", lease: time.Minute, handOver: func(t *testing.T, b *testBundle, mine idemstore.QueueJob) {
			require.NoError(t, b.store.QueueNak(b.ctx, idemstore.QueueNakParams{ID: mine.ID, Token: mine.Token}))
		}},
		{name: "Released", lease: time.Minute, handOver: func(t *testing.T, b *testBundle, mine idemstore.QueueJob) {
			require.NoError(t, b.store.QueueRelease(b.ctx, mine.ID, mine.Token))
		}},
		{name: "FetchedAgainHere", lease: time.Minute, takeWithMine: true},
	} {
		t.Run("LostLeaseRefusedAfter"+tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemsqlite.Config{})
			other, err := idemsqlite.NewWithConfig(b.db, idemsqlite.Config{})
			require.NoError(t, err)
			require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("a")...))
			mine := fetch(t, b.store, "q", 1, tt.lease, time.Time{})
			require.Len(t, mine, 1)
			var theirs []idemstore.QueueJob
			if tt.takeWithMine {
				theirs = fetch(t, b.store, "q", 1, time.Minute, time.Now().Add(2*tt.lease))
			} else {
				tt.handOver(t, b, mine[0])
				theirs = fetch(t, other, "q", 1, time.Minute, time.Time{})
			}
			require.Len(t, theirs, 1, "another worker takes the job")
			require.ErrorIs(t, ackInTx(b, b.store, mine[0], false), idem.ErrLeaseLost)
			require.Zero(t, b.store.AckedPending())
			require.True(t, rowExists(t, b, mine[0].ID), "the new holder's job stays")
		})
	}

	// One late delete goes through the one-row statement, several through the many-row one
	// (deleteAcked): both must leave the job another worker took alone and delete the rest.
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("DeleteOnlyUnderTheAckingToken/%d", n), func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemsqlite.Config{})
			b.store.SetAckDelay(time.Hour)
			other, err := idemsqlite.NewWithConfig(b.db, idemsqlite.Config{})
			require.NoError(t, err)
			require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("a", "b", "c")[:n]...))
			mine := fetch(t, b.store, "q", n, time.Second, time.Time{})
			require.Len(t, mine, n)
			for _, j := range mine { // a transaction each: every delete waits for a later write
				require.NoError(t, ackInTx(b, b.store, j, false))
			}
			require.Equal(t, n, b.store.AckedPending())
			require.Empty(t, fetch(t, other, "q", 1, time.Minute, time.Time{}), "acked, not deleted yet: still leased")
			// The delete is late (the file was busy past the lease): another worker took the job.
			again := fetch(t, other, "q", 1, time.Minute, time.Now().Add(2*time.Second))
			require.Len(t, again, 1)
			require.Equal(t, mine[0].ID, again[0].ID)
			st, err := b.store.QueueStats(b.ctx, "q") // runs the late delete
			require.NoError(t, err)
			require.EqualValues(t, 1, st.Backlog, "a late delete under the old token leaves the new holder's job alone")
			require.Zero(t, b.store.AckedPending())
			require.True(t, rowExists(t, b, mine[0].ID))
			for _, j := range mine[1:] {
				require.False(t, rowExists(t, b, j.ID), "a job acked under its current token is deleted")
			}
			require.NoError(t, ackInTx(b, other, again[0], false))
		})
	}

	t.Run("StoppedBeforeTheDeleteComesBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t, idemsqlite.Config{})
		b.store.SetAckDelay(time.Hour) // no delete before the "stop" below
		other, err := idemsqlite.NewWithConfig(b.db, idemsqlite.Config{})
		require.NoError(t, err)
		require.NoError(t, b.store.QueuePublish(b.ctx, "q", msgs("a")...))
		mine := fetch(t, b.store, "q", 1, time.Second, time.Time{})
		require.NoError(t, ackInTx(b, b.store, mine[0], false))
		b.store.DropAckedPending() // the process stops after the commit, before the delete
		require.True(t, rowExists(t, b, mine[0].ID))
		again := fetch(t, other, "q", 1, time.Minute, time.Now().Add(2*time.Second))
		require.Len(t, again, 1, "the job comes back when its lease ends")
		require.Equal(t, 2, again[0].Message.Attempt)
	})
}
