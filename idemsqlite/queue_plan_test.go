package idemsqlite_test

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemsqlite"
	"github.com/idemkit/idem/idemstore"
)

// loadQueue inserts n available jobs into queue in one transaction, oldest first, taking their
// ids from the queue's range (migration 053) like a publish.
func loadQueue(tb testing.TB, b *testBundle, queue string, n int) {
	tb.Helper()
	at := time.Now().Add(-time.Minute).UnixMicro()
	p := b.store.Config().Prefix
	err := b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+p+`queue_ranges (queue, base, last_id)
			SELECT ?, m + (1 << 44), m + (1 << 44) FROM (SELECT coalesce(max(base), 0) AS m FROM `+p+`queue_ranges)
			WHERE true ON CONFLICT (queue) DO NOTHING`, queue); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < ?)
			INSERT INTO `+p+`queue (id, queue, event_id, payload, enqueued_at, available_at)
			SELECT r.last_id + i, r.queue, 'evt-' || i, x'7b7d', ?, ? FROM seq, `+p+`queue_ranges r WHERE r.queue = ?`,
			n, at, at, queue); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `UPDATE `+p+`queue_ranges SET last_id = last_id + ? WHERE queue = ?`, n, queue)
		return err
	})
	require.NoError(tb, err)
}

// queryPlan returns SQLite's EXPLAIN QUERY PLAN of query, one detail per line.
func queryPlan(tb testing.TB, b *testBundle, query string, args ...any) string {
	tb.Helper()
	rows, err := b.db.QueryContext(b.ctx, "EXPLAIN QUERY PLAN "+query, args...)
	require.NoError(tb, err)
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		require.NoError(tb, rows.Scan(&id, &parent, &notused, &detail))
		lines = append(lines, detail)
	}
	require.NoError(tb, rows.Err())
	return strings.Join(lines, "\n")
}

// TestQueuePlans checks at 200,000 queued jobs that every queue-table statement reaches its rows
// through a search of a B-tree, so that its cost does not grow with the backlog: the fetch, the
// peek, the count of QueueStats and an unsubscribe's delete walk the queue's id range of the
// table itself in id order (migration 053: no index, no sort of the waiting jobs), ack, nak,
// held (an ack's check), extend and release find their job by primary key, and a publish takes its ids by the
// queue's key in queue_ranges. The count of QueueStats is the one statement that reads the
// whole queue; it is not on the consumer's path.
func TestQueuePlans(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	loadQueue(t, b, "plan", 200_000)
	loadQueue(t, b, "other", 1_000)
	now := time.Now().UnixMicro()
	qs := b.store.QueueQueries()

	const inRange = "SEARCH idem_queue USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)"
	const rangeKey = "SEARCH idem_queue_ranges USING PRIMARY KEY (queue=?)"
	tests := []struct {
		name      string
		args      []any
		want      []string // substrings the plan must contain
		forbidden []string // substrings it must not contain
	}{
		{"fetch", []any{now + 1e6, "plan", now, 10},
			[]string{inRange, rangeKey, "USING INTEGER PRIMARY KEY (rowid=?)"},
			[]string{"TEMP B-TREE", "SCAN"}},
		{"peek", []any{"plan", now}, []string{inRange, rangeKey}, []string{"TEMP B-TREE", "SCAN"}},
		{"ack", []any{1, 1}, []string{"USING INTEGER PRIMARY KEY"}, []string{"SCAN"}},
		{"ackMany", []any{"[[1,1],[2,2]]"}, []string{"USING INTEGER PRIMARY KEY (rowid=?)"}, []string{"SCAN idem_queue"}},
		{"held", []any{1, 1}, []string{"USING INTEGER PRIMARY KEY"}, []string{"SCAN"}},
		{"nak", []any{now, "", 1, 1}, []string{"USING INTEGER PRIMARY KEY"}, []string{"SCAN"}},
		{"extend", []any{now, 1, 1, now}, []string{"USING INTEGER PRIMARY KEY"}, []string{"SCAN"}},
		{"release", []any{1, 1}, []string{"USING INTEGER PRIMARY KEY"}, []string{"SCAN"}},
		{"stats", []any{"plan"}, []string{inRange, rangeKey}, []string{"TEMP B-TREE", "SCAN"}},
		{"range", []any{"plan", 1}, []string{rangeKey}, []string{"SCAN"}},
		{"purge", []any{"plan", 100}, []string{inRange, rangeKey}, []string{"TEMP B-TREE", "SCAN"}},
	}
	require.Len(t, qs, len(tests), "every queue statement has a plan check")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			query, ok := qs[tt.name]
			require.True(t, ok)
			plan := queryPlan(t, b, query, tt.args...)
			for _, w := range tt.want {
				require.Contains(t, plan, w)
			}
			for _, f := range tt.forbidden {
				require.NotContains(t, plan, f)
			}
		})
	}

	// The plan is the one used: a fetch still takes the lowest ids first.
	jobs, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "plan", Max: 3, Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, []string{"evt-1", "evt-2", "evt-3"}, eventIDs(jobs))
	jobs, err = b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "plan", Max: 2, Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, []string{"evt-4", "evt-5"}, eventIDs(jobs), "leased jobs are skipped")
}

// BenchmarkQueueFetch fetches (and releases, untimed) 10 jobs from a queue of 1,000 and of
// 200,000 jobs: walking the queue's id range (migration 053) the two should cost about the same.
func BenchmarkQueueFetch(b *testing.B) {
	for _, n := range []int{1_000, 200_000} {
		tb := setup(b, idemsqlite.Config{})
		loadQueue(b, tb, "bench", n)
		b.Run("jobs="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				jobs, err := tb.store.QueueFetch(tb.ctx, idemstore.QueueFetchParams{Queue: "bench", Max: 10, Lease: time.Minute})
				if err != nil || len(jobs) != 10 {
					b.Fatalf("fetch: %d jobs, %v", len(jobs), err)
				}
				b.StopTimer()
				for _, j := range jobs {
					if err := tb.store.QueueRelease(tb.ctx, j.ID, j.Token); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
			}
		})
	}
}
