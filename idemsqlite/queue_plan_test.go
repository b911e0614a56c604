package idemsqlite_test

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqlite"
)

// loadQueue inserts n available jobs into queue in one transaction, oldest first.
func loadQueue(tb testing.TB, b *testBundle, queue string, n int) {
	tb.Helper()
	at := time.Now().Add(-time.Minute).UnixMicro()
	err := b.store.InTx(b.ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `WITH RECURSIVE seq(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < ?)
			INSERT INTO `+b.store.Config().Prefix+`queue (queue, event_id, payload, enqueued_at, available_at)
			SELECT ?, 'evt-' || i, x'7b7d', ?, ? FROM seq`, n, queue, at, at)
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
// through an index, so that its cost does not grow with the backlog: the fetch walks the
// queue_next index in id order (no sort of the waiting jobs), and ack, nak, extend and release
// find their job by primary key. The count of QueueStats is the one statement that reads the
// whole queue; it is not on the consumer's path.
func TestQueuePlans(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	loadQueue(t, b, "plan", 200_000)
	loadQueue(t, b, "other", 1_000)
	now := time.Now().UnixMicro()
	qs := b.store.QueueQueries()

	tests := []struct {
		name      string
		args      []any
		want      []string // substrings the plan must contain
		forbidden []string // substrings it must not contain
	}{
		{"fetch", []any{now + 1e6, "plan", now, 10},
			[]string{"USING COVERING INDEX idem_queue_next (queue=?)", "USING INTEGER PRIMARY KEY"},
			[]string{"TEMP B-TREE", "SCAN idem_queue"}},
		{"ack", []any{1, 1}, []string{"USING INTEGER PRIMARY KEY"}, []string{"SCAN"}},
		{"nak", []any{now, "", 1, 1}, []string{"USING INTEGER PRIMARY KEY"}, []string{"SCAN"}},
		{"extend", []any{now, 1, 1, now}, []string{"USING INTEGER PRIMARY KEY"}, []string{"SCAN"}},
		{"release", []any{1, 1}, []string{"USING INTEGER PRIMARY KEY"}, []string{"SCAN"}},
		{"stats", []any{"plan"}, []string{"USING INDEX idem_queue_next (queue=?)"}, []string{"TEMP B-TREE"}},
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
	jobs, err := b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "plan", Max: 3, Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, []string{"evt-1", "evt-2", "evt-3"}, eventIDs(jobs))
	jobs, err = b.store.QueueFetch(b.ctx, idem.QueueFetchParams{Queue: "plan", Max: 2, Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, []string{"evt-4", "evt-5"}, eventIDs(jobs), "leased jobs are skipped")
}

// BenchmarkQueueFetch fetches (and releases, untimed) 10 jobs from a queue of 1,000 and of
// 200,000 jobs: with the queue_next index the two should cost about the same.
func BenchmarkQueueFetch(b *testing.B) {
	for _, n := range []int{1_000, 200_000} {
		tb := setup(b, idemsqlite.Config{})
		loadQueue(b, tb, "bench", n)
		b.Run("jobs="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				jobs, err := tb.store.QueueFetch(tb.ctx, idem.QueueFetchParams{Queue: "bench", Max: 10, Lease: time.Minute})
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
