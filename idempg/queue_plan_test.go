package idempg_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemstore"
)

// loadQueue inserts n available jobs into queue in one statement, oldest first, and refreshes
// the table's statistics as autovacuum would.
func loadQueue(tb testing.TB, s *idempg.Store, queue string, n int) {
	tb.Helper()
	ctx := context.Background()
	at := time.Now().Add(-time.Minute).UTC()
	_, err := s.Pool().Exec(ctx, `INSERT INTO `+table(s, "queue")+` (queue, event_id, payload, enqueued_at, available_at)
		SELECT $1, 'evt-' || i, '{}'::bytea, $2, $2 FROM generate_series(1, $3) AS i`, queue, at, n)
	require.NoError(tb, err)
	_, err = s.Pool().Exec(ctx, `ANALYZE `+table(s, "queue"))
	require.NoError(tb, err)
}

// queryPlan returns PostgreSQL's EXPLAIN of query with args, one line per plan line.
func queryPlan(tb testing.TB, s *idempg.Store, query string, args ...any) string {
	tb.Helper()
	rows, err := s.Pool().Query(context.Background(), "EXPLAIN "+query, args...)
	require.NoError(tb, err)
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var line string
		require.NoError(tb, rows.Scan(&line))
		lines = append(lines, line)
	}
	require.NoError(tb, rows.Err())
	return strings.Join(lines, "\n")
}

// TestQueuePlans checks at 200,000 queued jobs that every queue-table statement reaches its rows
// through an index, so that its cost does not grow with the backlog: the fetch walks the
// queue_next index in id order under its LIMIT (no Sort of the waiting jobs), and ack, nak and
// extend find their job by primary key. The count of QueueStats is the one statement that reads
// the whole queue; it is not on the consumer's path.
func TestQueuePlans(t *testing.T) {
	t.Parallel()
	s := newStore(t, idempg.Config{})
	loadQueue(t, s, "plan", 200_000)
	loadQueue(t, s, "other", 1_000)
	now := time.Now().UTC()
	qs := s.QueueQueries()
	pkey := s.Config().Prefix + "queue_pkey"

	tests := []struct {
		name      string
		args      []any
		want      []string // substrings the plan must contain
		forbidden []string // substrings it must not contain
	}{
		// The big queue is most of the table: walking the primary key in id order is as good.
		{"fetch", []any{"plan", now, now.Add(time.Minute), 10},
			[]string{"Index Scan using ", "Limit", "LockRows"},
			[]string{"Sort", "Seq Scan", "Bitmap"}},
		// The small queue sits behind 200,000 other jobs: only queue_next reaches it directly.
		{"fetch", []any{"other", now, now.Add(time.Minute), 10},
			[]string{"Index Scan using " + s.Config().Prefix + "queue_next", "Limit", "LockRows"},
			[]string{"Sort", "Seq Scan", "Bitmap"}},
		{"ack", []any{1, 1}, []string{"Index Scan using " + pkey}, []string{"Seq Scan"}},
		{"ackCommit1", []any{1, 1}, []string{"Index Scan using " + pkey}, []string{"Seq Scan"}},
		{"ackCommit", []any{[]int64{1, 2}, []int64{1, 1}}, []string{"Index Scan using " + pkey}, []string{"Seq Scan"}},
		{"nak", []any{1, 1, now, ""}, []string{"Index Scan using " + pkey}, []string{"Seq Scan"}},
		{"extend", []any{1, 1, now, now}, []string{"Index Scan using " + pkey}, []string{"Seq Scan"}},
		{"stats", []any{"plan"}, []string{"Aggregate"}, []string{"Sort"}},
	}
	checked := make(map[string]bool)
	for _, tt := range tests {
		checked[tt.name] = true
		t.Run(tt.name+"/"+fmt.Sprint(tt.args[0]), func(t *testing.T) {
			query, ok := qs[tt.name]
			require.True(t, ok)
			plan := queryPlan(t, s, query, tt.args...)
			for _, w := range tt.want {
				require.Contains(t, plan, w, plan)
			}
			for _, f := range tt.forbidden {
				require.NotContains(t, plan, f, plan)
			}
		})
	}

	require.Len(t, checked, len(qs), "every queue statement has a plan check")

	// The plan is the one used: a fetch still takes the lowest ids first, skipping leased jobs.
	ctx := context.Background()
	jobs, err := s.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: "plan", Max: 3, Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, []string{"evt-1", "evt-2", "evt-3"}, eventIDs(jobs))
	jobs, err = s.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: "plan", Max: 2, Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, []string{"evt-4", "evt-5"}, eventIDs(jobs))
}

// BenchmarkQueueFetch fetches (and releases, untimed) 10 jobs from a queue of 1,000 and of
// 200,000 jobs: with the queue_next index the two should cost about the same.
func BenchmarkQueueFetch(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{1_000, 200_000} {
		s := newStore(b, idempg.Config{})
		loadQueue(b, s, "bench", n)
		b.Run("jobs="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				jobs, err := s.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: "bench", Max: 10, Lease: time.Minute})
				if err != nil || len(jobs) != 10 {
					b.Fatalf("fetch: %d jobs, %v", len(jobs), err)
				}
				b.StopTimer()
				for _, j := range jobs {
					if err := s.QueueRelease(ctx, j.ID, j.Token); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
			}
		})
	}
}

// TestOutboxFetchPlan checks at 200,000 pending outbox rows that the relay's fetch of every
// partition walks the outbox_pending_id index in id order under its LIMIT, instead of reading
// and sorting every pending row of the partitions for each batch.
func TestOutboxFetchPlan(t *testing.T) {
	t.Parallel()
	s := newStore(t, idempg.Config{})
	ctx := context.Background()
	_, err := s.Pool().Exec(ctx, `INSERT INTO `+table(s, "outbox")+` (partition, event_id, topic, ordering_key, payload, created_at, next_attempt_at)
		SELECT i % 16, 'evt-' || i, 'payments', 'evt-' || i, '{}'::bytea, now(), now() FROM generate_series(1, 200000) AS i`)
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, `ANALYZE `+table(s, "outbox"))
	require.NoError(t, err)
	parts := make([]int32, s.OutboxPartitions())
	for i := range parts {
		parts[i] = int32(i)
	}
	plan := queryPlan(t, s, s.OutboxFetchQuery(), parts, 100)
	require.Contains(t, plan, "Index Scan using "+s.Config().Prefix+"outbox_pending_id", plan)

	rows, err := s.OutboxFetch(ctx, idemstore.OutboxFetchParams{Partitions: []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, Limit: 3})
	require.NoError(t, err)
	require.Len(t, rows, 3)
	require.Equal(t, []string{"evt-1", "evt-2", "evt-3"}, []string{rows[0].Outgoing.EventID, rows[1].Outgoing.EventID, rows[2].Outgoing.EventID})
}
