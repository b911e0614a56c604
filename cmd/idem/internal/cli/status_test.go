package cli

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

func TestStatus(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := kind.dsn(t)
			st := openMigrated(t, dsn)

			// Empty store.
			r := idemCLI(t, "status", "--store", dsn, "--json")
			requireOK(t, r)
			var rep statusReport
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r.stdout)
			require.Empty(t, rep.Consumers)
			require.Zero(t, rep.DeadLetters.Pending)
			require.Empty(t, rep.Queues, "no queue is made up")

			now := time.Now()
			for _, ev := range []string{"e1", "e2", "e3"} {
				seedClaim(t, st, idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: ev}, now.Add(-time.Minute))
			}
			seedClaim(t, st, idem.Key{Tenant: "acme", Consumer: "mailer@v1", EventID: "e1"}, now)
			seedIgnore(t, st, idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "gone-1"}, "order_deleted")
			seedDeadLetter(t, st, "d1", idem.ReasonPermanentError, 3*time.Hour)
			seedDeadLetter(t, st, "d2", idem.ReasonKeyReuse, time.Hour)
			_, err := st.DeadLetters.InsertDeadLetter(ctx, idem.DeadLetter{
				Consumer: "audit@v3", Message: idem.Message{EventID: "d3"}, Reason: idem.ReasonTooOld, Source: "queue:audit",
			})
			require.NoError(t, err)
			require.NoError(t, st.Queue.QueuePublish(ctx, "orders", idem.Message{EventID: "q1"}, idem.Message{EventID: "q2"}))
			require.NoError(t, st.Queue.QueuePublish(ctx, "audit", idem.Message{EventID: "q3"}))

			r = idemCLI(t, "status", "--store", dsn, "--json")
			requireOK(t, r)
			rep = statusReport{}
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r.stdout)
			require.NotContains(t, rep.Store, "password")
			byName := map[string]consumerStatus{}
			for _, c := range rep.Consumers {
				byName[c.Consumer] = c
			}
			require.Len(t, byName, 3)
			require.EqualValues(t, 3, byName["ledger@v1"].Processed)
			require.EqualValues(t, 2, byName["ledger@v1"].DeadLettersPending)
			require.NotNil(t, byName["ledger@v1"].LastProcessedAt)
			require.InDelta(t, (3*time.Hour + time.Minute).Seconds(), byName["ledger@v1"].OldestDeadLetterAgeS, 60)
			require.EqualValues(t, 1, byName["ledger@v1"].Ignored)
			require.Zero(t, byName["mailer@v1"].Ignored)
			require.EqualValues(t, 1, byName["mailer@v1"].Processed)
			require.Zero(t, byName["mailer@v1"].DeadLettersPending)
			require.Zero(t, byName["audit@v3"].Processed)
			require.EqualValues(t, 1, byName["audit@v3"].DeadLettersPending)

			require.EqualValues(t, 3, rep.DeadLetters.Pending)
			require.Equal(t, map[string]int64{"permanent_error": 1, "key_reuse": 1, "too_old": 1}, rep.DeadLetters.ByReason)
			// Queues: the ones that hold jobs, and the ones dead letters came from.
			require.Len(t, rep.Queues, 3)
			require.Equal(t, "audit", rep.Queues[0].Queue)
			require.EqualValues(t, 1, rep.Queues[0].Backlog)
			require.Equal(t, "orders", rep.Queues[1].Queue)
			require.EqualValues(t, 2, rep.Queues[1].Backlog)
			require.NotNil(t, rep.Queues[1].OldestAt)
			require.Equal(t, "payments", rep.Queues[2].Queue, "seeded dead letters came from queue:payments")
			require.Zero(t, rep.Queues[2].Backlog)
			require.Zero(t, rep.Outbox.Backlog)

			// A topic with subscriptions: each subscription's queue follows it.
			subs, ok := st.Queue.(idemstore.QueueSubscriptionStore)
			require.True(t, ok, "every store has subscriptions")
			require.NoError(t, subs.QueueSubscribe(ctx, "shipments", "ledger"))
			require.NoError(t, subs.QueueSubscribe(ctx, "shipments", "email"))
			require.NoError(t, st.Queue.QueuePublish(ctx, "shipments", idem.Message{EventID: "o1"}, idem.Message{EventID: "o2"}))
			r = idemCLI(t, "status", "--store", dsn, "--json", "--queue", "shipments", "--queue", "shipments#email")
			requireOK(t, r)
			rep = statusReport{}
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r.stdout)
			var got []string
			for _, q := range rep.Queues {
				got = append(got, q.Queue+"="+strconv.FormatInt(q.Backlog, 10))
			}
			require.Equal(t, []string{"shipments=0", "shipments#email=2", "shipments#ledger=2"}, got)

			r = idemCLI(t, "status", "--store", dsn, "--queue", "other")
			requireOK(t, r)
			require.Regexp(t, `ledger@v1\s+3\s+\S+ \S+ \(\S+ ago\)\s+1\s+2\s+`, r.stdout)
			require.Contains(t, r.stdout, "IGNORED")

			require.Regexp(t, `other\s+0\s+-`, r.stdout)
			require.NotRegexp(t, `\norders\s`, r.stdout)
			require.NotRegexp(t, `\npayments\s`, r.stdout)
			require.Contains(t, r.stdout, "CLAIMS")
			require.Contains(t, r.stdout, "dead letters: 3 pending (")
			t.Logf("status:\n%s", r.stdout)
			r = idemCLI(t, "dlq", "audit", "--store", dsn)
			requireOK(t, r)
			require.Regexp(t, `ledger@v1\s+ignore\s+-\s+gone-1\s+-\s+order_deleted`, r.stdout)
		})
	}
}
