package idemsqlite_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/idemstore"
)

// TestMigrateQueueIDRanges checks that migration 053 keeps every job queued before it: jobs of
// two queues published the way versions before 053 did (ids from AUTOINCREMENT, interleaved), one
// of them leased and one delayed by a nak, are all fetched after the migration, each queue in
// its old order with its attempts, lease and availability, and acked; jobs published after
// the migration come after them; and the lease held across the migration cannot be acked by its
// old id.
func TestMigrateQueueIDRanges(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	store := idemsqlite.New(db)
	require.NoError(t, store.MigrateTo(ctx, 52))

	start := time.Now()
	at := start.Add(-time.Minute).UnixMicro()
	insert := func(queue, event string) int64 {
		res, err := db.ExecContext(ctx, `INSERT INTO idem_queue (queue, event_id, tenant, type, payload, headers,
			occurred_at, enqueued_at, available_at) VALUES (?, ?, 't1', 'order.paid', x'7b7d', '{"k":"v"}', ?, ?, ?)`,
			queue, event, at, at, at)
		require.NoError(t, err)
		id, err := res.LastInsertId()
		require.NoError(t, err)
		return id
	}
	var oldIDs []int64
	for i := range 5 {
		oldIDs = append(oldIDs, insert("a", "a-"+string(rune('0'+i))), insert("b", "b-"+string(rune('0'+i))))
	}
	// a-1 is leased for a minute by a process of the old version (token 1, first attempt);
	// b-2 was nakked and is available in 10 minutes.
	leaseUntil := start.Add(time.Minute)
	_, err = db.ExecContext(ctx, `UPDATE idem_queue SET lease_until = ?, token = 1, attempts = 1,
		first_fetched_at = ? WHERE event_id = 'a-1'`, leaseUntil.UnixMicro(), at)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `UPDATE idem_queue SET available_at = ?, token = 1, attempts = 1,
		last_error = 'boom' WHERE event_id = 'b-2'`, start.Add(10*time.Minute).UnixMicro())
	require.NoError(t, err)

	require.NoError(t, store.Migrate(ctx))
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM idem_queue`).Scan(&n))
	require.Equal(t, 10, n, "every job survives the migration")
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE name = 'idem_queue_next'`).Scan(&n))
	require.Zero(t, n, "the table keeps no index")
	// A process of an older version, publishing without an id, is refused: its job would take
	// an id past the end of another queue's range.
	_, err = db.ExecContext(ctx, `INSERT INTO idem_queue (queue, event_id, enqueued_at, available_at) VALUES ('a', 'old', 1, 1)`)
	require.ErrorContains(t, err, "older than the database")

	// Published after the migration: after the migrated jobs of its queue.
	require.NoError(t, store.QueuePublish(ctx, "a", idem.Message{EventID: "a-new", Payload: []byte(`{}`)}))
	require.NoError(t, store.QueuePublish(ctx, "c", idem.Message{EventID: "c-new", Payload: []byte(`{}`)}))

	fetch := func(queue string, now time.Time) []idemstore.QueueJob {
		jobs, err := store.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: queue, Max: 100, Lease: time.Minute, Now: now})
		require.NoError(t, err)
		return jobs
	}
	a := fetch("a", time.Now())
	require.Equal(t, []string{"a-0", "a-2", "a-3", "a-4", "a-new"}, eventIDs(a), "the leased job waits for its lease")
	require.Equal(t, "t1", a[0].Message.Tenant)
	require.Equal(t, "order.paid", a[0].Message.Type)
	require.Equal(t, map[string]string{"k": "v"}, a[0].Message.Headers)
	require.Equal(t, at, a[0].Message.PublishedAt.UnixMicro())
	for _, j := range a {
		require.Equal(t, 1, j.Message.Attempt)
		require.NoError(t, store.QueueAck(ctx, j.ID, j.Token))
	}
	b := fetch("b", start)
	require.Equal(t, []string{"b-0", "b-1", "b-3", "b-4"}, eventIDs(b), "the nakked job waits for its time")
	for _, j := range b {
		require.NoError(t, store.QueueAck(ctx, j.ID, j.Token))
	}
	c := fetch("c", time.Now())
	require.Equal(t, []string{"c-new"}, eventIDs(c))
	require.NoError(t, store.QueueAck(ctx, c[0].ID, c[0].Token))

	// The lease held across the migration: its old id no longer names the job.
	oldLeased := oldIDs[2]
	require.ErrorIs(t, store.QueueAck(ctx, oldLeased, 1), idem.ErrLeaseLost)
	late := fetch("a", leaseUntil.Add(time.Second))
	require.Equal(t, []string{"a-1"}, eventIDs(late), "fetched again when its lease has ended")
	require.Equal(t, 2, late[0].Message.Attempt)
	require.Equal(t, at, late[0].FirstFetchedAt.UnixMicro(), "the retry budget still counts from its first fetch")
	require.NoError(t, store.QueueAck(ctx, late[0].ID, late[0].Token))
	later := fetch("b", start.Add(11*time.Minute))
	require.Equal(t, []string{"b-2"}, eventIDs(later))
	require.Equal(t, 2, later[0].Message.Attempt)
	require.NoError(t, store.QueueAck(ctx, later[0].ID, later[0].Token))

	for _, q := range []string{"a", "b", "c"} {
		st, err := store.QueueStats(ctx, q)
		require.NoError(t, err)
		require.Zero(t, st.Backlog, q)
	}
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM idem_queue`).Scan(&n))
	require.Zero(t, n)
	// The ids of each queue are in its range and only grow.
	var ranges int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM idem_queue_ranges`).Scan(&ranges))
	require.Equal(t, 3, ranges)
	require.Greater(t, a[4].ID, a[3].ID)
	require.Greater(t, late[0].ID, a[0].ID)
	require.Less(t, late[0].ID, a[2].ID, "a-1 kept its place between a-0 and a-2")
}
