package idemprom

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// The fakes embed the store interfaces so they satisfy them; only the stats methods are
// implemented, and any other call panics on the nil embedded value.

// fakeDeadLetters answers DeadLetterStats with stats or err; block makes it wait for ctx.
type fakeDeadLetters struct {
	idemstore.DeadLetterStore
	stats idemstore.DeadLetterStats
	err   error
	block bool
}

func (f *fakeDeadLetters) DeadLetterStats(ctx context.Context) (idemstore.DeadLetterStats, error) {
	if f.block {
		<-ctx.Done()
		return idemstore.DeadLetterStats{}, ctx.Err()
	}
	return f.stats, f.err
}

// fakeQueue answers QueueStats per queue from stats and errs.
type fakeQueue struct {
	idemstore.QueueStore
	stats map[string]idemstore.QueueStats
	errs  map[string]error
}

func (f *fakeQueue) QueueStats(_ context.Context, queue string) (idemstore.QueueStats, error) {
	return f.stats[queue], f.errs[queue]
}

// fakeOutbox answers OutboxStats with stats or err.
type fakeOutbox struct {
	idemstore.OutboxRelayStore
	stats  idemstore.QueueStats
	err    error
	leases []idemstore.Lease
}

func (f *fakeOutbox) OutboxStats(context.Context) (idemstore.QueueStats, error) {
	return f.stats, f.err
}

// LeaseList returns the fake's leases whose names start with prefix.
func (f *fakeOutbox) LeaseList(_ context.Context, prefix string, _ time.Time) ([]idemstore.Lease, error) {
	var out []idemstore.Lease
	for _, l := range f.leases {
		if strings.HasPrefix(l.Name, prefix) {
			out = append(out, l)
		}
	}
	return out, nil
}

var errDown = errors.New("database is down")

func TestStoreCollector(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	healthyDL := func() *fakeDeadLetters {
		return &fakeDeadLetters{stats: idemstore.DeadLetterStats{
			Pending:       3,
			OldestPending: now.Add(-90 * time.Minute),
			ByReason:      map[idem.Reason]int64{idem.ReasonKeyReuse: 1, idem.ReasonRetriesExhausted: 2},
		}}
	}
	healthyQueue := func() *fakeQueue {
		return &fakeQueue{stats: map[string]idemstore.QueueStats{
			"orders":   {Backlog: 5, Oldest: now.Add(-30 * time.Second)},
			"payments": {}, // empty: age 0
		}}
	}
	healthyOutbox := func() *fakeOutbox {
		return &fakeOutbox{stats: idemstore.QueueStats{Backlog: 2, Oldest: now.Add(-2 * time.Second)},
			leases: []idemstore.Lease{{Name: "relay/member/a"}, {Name: "relay/partition/0"}}}
	}
	const (
		dlHealthy = `
# HELP idem_dead_letters_pending Dead letters waiting for replay or discard, by reason; sum them for the total.
# TYPE idem_dead_letters_pending gauge
idem_dead_letters_pending{reason="handler_panic"} 0
idem_dead_letters_pending{reason="invalid_payload"} 0
idem_dead_letters_pending{reason="key_reuse"} 1
idem_dead_letters_pending{reason="permanent_error"} 0
idem_dead_letters_pending{reason="retries_exhausted"} 2
idem_dead_letters_pending{reason="too_old"} 0
idem_dead_letters_pending{reason="unauthenticated"} 0
# HELP idem_dead_letters_oldest_age_seconds Age of the first failure of the oldest pending dead letter, 0 when there is none.
# TYPE idem_dead_letters_oldest_age_seconds gauge
idem_dead_letters_oldest_age_seconds 5400
`
		queueHealthy = `
# HELP idem_queue_backlog Jobs in the queue table not yet acknowledged.
# TYPE idem_queue_backlog gauge
idem_queue_backlog{queue="orders"} 5
idem_queue_backlog{queue="payments"} 0
# HELP idem_queue_oldest_age_seconds Age of the oldest job not yet acknowledged, 0 when the queue is empty.
# TYPE idem_queue_oldest_age_seconds gauge
idem_queue_oldest_age_seconds{queue="orders"} 30
idem_queue_oldest_age_seconds{queue="payments"} 0
`
		outboxHealthy = `
# HELP idem_outbox_backlog Outbox events not yet published.
# TYPE idem_outbox_backlog gauge
idem_outbox_backlog 2
# HELP idem_outbox_oldest_age_seconds Age of the oldest unpublished outbox event, 0 when the outbox is empty.
# TYPE idem_outbox_oldest_age_seconds gauge
idem_outbox_oldest_age_seconds 2
# HELP idem_relay_members Outbox relays holding a live membership lease; 0 with a backlog means nothing publishes it.
# TYPE idem_relay_members gauge
idem_relay_members 1
`
		successHelp = `
# HELP idem_store_scrape_success 1 when the store query behind a figure succeeded on this scrape, 0 when it failed.
# TYPE idem_store_scrape_success gauge
`
	)
	tests := []struct {
		name string
		cfg  StoreCollectorConfig
		// want is the exposition of every healthy figure; names limits the comparison to them.
		want  string
		names []string
		// wantErr is matched with errors.Is against Gather's error; nil means no error.
		wantErr error
		// wantErrText must appear in Gather's error.
		wantErrText string
	}{
		{
			name: "all healthy",
			cfg: StoreCollectorConfig{DeadLetters: healthyDL(), Queue: healthyQueue(),
				Queues: []string{"orders", "payments", "orders"}, Outbox: healthyOutbox()},
			want: dlHealthy + queueHealthy + outboxHealthy + successHelp + `
idem_store_scrape_success{figure="dead_letters",queue=""} 1
idem_store_scrape_success{figure="outbox",queue=""} 1
idem_store_scrape_success{figure="queue",queue="orders"} 1
idem_store_scrape_success{figure="queue",queue="payments"} 1
idem_store_scrape_success{figure="relays",queue=""} 1
`,
		},
		{
			name: "empty stores report zero age",
			cfg: StoreCollectorConfig{DeadLetters: &fakeDeadLetters{}, Outbox: &fakeOutbox{},
				// A stale Oldest with no backlog still reads as empty.
				Queue: &fakeQueue{stats: map[string]idemstore.QueueStats{"orders": {Oldest: now.Add(-time.Hour)}}}, Queues: []string{"orders"}},
			names: []string{"idem_dead_letters_oldest_age_seconds", "idem_queue_backlog", "idem_queue_oldest_age_seconds", "idem_outbox_oldest_age_seconds"},
			want: `
# HELP idem_dead_letters_oldest_age_seconds Age of the first failure of the oldest pending dead letter, 0 when there is none.
# TYPE idem_dead_letters_oldest_age_seconds gauge
idem_dead_letters_oldest_age_seconds 0
# HELP idem_queue_backlog Jobs in the queue table not yet acknowledged.
# TYPE idem_queue_backlog gauge
idem_queue_backlog{queue="orders"} 0
# HELP idem_queue_oldest_age_seconds Age of the oldest job not yet acknowledged, 0 when the queue is empty.
# TYPE idem_queue_oldest_age_seconds gauge
idem_queue_oldest_age_seconds{queue="orders"} 0
# HELP idem_outbox_oldest_age_seconds Age of the oldest unpublished outbox event, 0 when the outbox is empty.
# TYPE idem_outbox_oldest_age_seconds gauge
idem_outbox_oldest_age_seconds 0
`,
		},
		{
			name: "dead-letter error keeps queue and outbox",
			cfg: StoreCollectorConfig{DeadLetters: &fakeDeadLetters{err: errDown}, Queue: healthyQueue(),
				Queues: []string{"orders", "payments"}, Outbox: healthyOutbox()},
			want: queueHealthy + outboxHealthy + successHelp + `
idem_store_scrape_success{figure="dead_letters",queue=""} 0
idem_store_scrape_success{figure="outbox",queue=""} 1
idem_store_scrape_success{figure="queue",queue="orders"} 1
idem_store_scrape_success{figure="queue",queue="payments"} 1
idem_store_scrape_success{figure="relays",queue=""} 1
`,
			wantErr:     errDown,
			wantErrText: "idemprom: dead-letter stats",
		},
		{
			name: "one queue failing keeps the other",
			cfg: StoreCollectorConfig{Queue: &fakeQueue{
				stats: map[string]idemstore.QueueStats{"orders": {Backlog: 5, Oldest: now.Add(-30 * time.Second)}},
				errs:  map[string]error{"payments": errDown},
			}, Queues: []string{"orders", "payments"}},
			want: `
# HELP idem_queue_backlog Jobs in the queue table not yet acknowledged.
# TYPE idem_queue_backlog gauge
idem_queue_backlog{queue="orders"} 5
# HELP idem_queue_oldest_age_seconds Age of the oldest job not yet acknowledged, 0 when the queue is empty.
# TYPE idem_queue_oldest_age_seconds gauge
idem_queue_oldest_age_seconds{queue="orders"} 30
` + successHelp + `
idem_store_scrape_success{figure="queue",queue="orders"} 1
idem_store_scrape_success{figure="queue",queue="payments"} 0
`,
			wantErr:     errDown,
			wantErrText: `idemprom: queue "payments" stats`,
		},
		{
			name: "outbox error",
			cfg:  StoreCollectorConfig{DeadLetters: healthyDL(), Outbox: &fakeOutbox{err: errDown}},
			want: dlHealthy + `
# HELP idem_relay_members Outbox relays holding a live membership lease; 0 with a backlog means nothing publishes it.
# TYPE idem_relay_members gauge
idem_relay_members 0
` + successHelp + `
idem_store_scrape_success{figure="dead_letters",queue=""} 1
idem_store_scrape_success{figure="outbox",queue=""} 0
idem_store_scrape_success{figure="relays",queue=""} 1
`,
			wantErr:     errDown,
			wantErrText: "idemprom: outbox stats",
		},
		{
			name: "slow store times out alone",
			cfg: StoreCollectorConfig{DeadLetters: &fakeDeadLetters{block: true}, Outbox: healthyOutbox(),
				Timeout: 20 * time.Millisecond},
			want: outboxHealthy + successHelp + `
idem_store_scrape_success{figure="dead_letters",queue=""} 0
idem_store_scrape_success{figure="outbox",queue=""} 1
idem_store_scrape_success{figure="relays",queue=""} 1
`,
			wantErr: context.DeadlineExceeded,
		},
		{
			name: "nil stores are skipped",
			cfg:  StoreCollectorConfig{Queues: []string{"orders"}},
			want: "",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.cfg.Now = func() time.Time { return now }
			reg := prometheus.NewRegistry()
			require.NoError(t, reg.Register(NewStoreCollector(tt.cfg)))

			_, err := reg.Gather()
			if tt.wantErr == nil {
				require.NoError(t, err)
				problems, err := testutil.GatherAndLint(reg)
				require.NoError(t, err)
				require.Empty(t, problems)
			} else {
				// prometheus.MultiError does not unwrap: check each error it holds.
				var me prometheus.MultiError
				require.ErrorAs(t, err, &me)
				require.Len(t, me, 2, "both figures of the failed query are invalid")
				for _, e := range me {
					require.ErrorIs(t, e, tt.wantErr)
					require.ErrorContains(t, e, tt.wantErrText)
				}
			}
			// GatherAndCompare fails on Gather's error, so compare what a ContinueOnError
			// handler would serve: the families Gather returned despite the error.
			require.NoError(t, testutil.GatherAndCompare(continueOnError(reg), strings.NewReader(tt.want), tt.names...))
		})
	}
}

// continueOnError gathers like promhttp with ContinueOnError: it drops the error and keeps the
// families that were collected.
func continueOnError(g prometheus.Gatherer) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, _ := g.Gather()
		return mfs, nil
	})
}

func TestStoreCollectorRejectsInvalidNamespace(t *testing.T) {
	t.Parallel()
	require.PanicsWithError(t,
		`idemprom: StoreCollectorConfig.Namespace: "a.b" is not a valid metric name prefix (want [a-zA-Z_][a-zA-Z0-9_]*)`,
		func() { NewStoreCollector(StoreCollectorConfig{Namespace: "a.b"}) })
}
