package cli

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
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

			now := time.Now()
			for _, ev := range []string{"e1", "e2", "e3"} {
				seedClaim(t, st, idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: ev}, now.Add(-time.Minute))
			}
			seedClaim(t, st, idem.Key{Tenant: "acme", Consumer: "mailer@v1", EventID: "e1"}, now)
			seedDeadLetter(t, st, "d1", idem.ReasonPermanentError, 3*time.Hour)
			seedDeadLetter(t, st, "d2", idem.ReasonKeyReuse, time.Hour)
			_, err := st.DeadLetters.InsertDeadLetter(ctx, idem.DeadLetter{
				Consumer: "audit@v3", Message: idem.Message{EventID: "d3"}, Reason: idem.ReasonTooOld, Source: "queue:audit",
			})
			require.NoError(t, err)
			require.NoError(t, st.Queue.QueuePublish(ctx, "payments", idem.Message{EventID: "q1"}, idem.Message{EventID: "q2"}))
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
			require.EqualValues(t, 1, byName["mailer@v1"].Processed)
			require.Zero(t, byName["mailer@v1"].DeadLettersPending)
			require.Zero(t, byName["audit@v3"].Processed)
			require.EqualValues(t, 1, byName["audit@v3"].DeadLettersPending)

			require.EqualValues(t, 3, rep.DeadLetters.Pending)
			require.Equal(t, map[string]int64{"permanent_error": 1, "key_reuse": 1, "too_old": 1}, rep.DeadLetters.ByReason)
			// Queues: the ones dead letters came from, plus payments.
			require.Len(t, rep.Queues, 2)
			require.Equal(t, "audit", rep.Queues[0].Queue)
			require.EqualValues(t, 1, rep.Queues[0].Backlog)
			require.Equal(t, "payments", rep.Queues[1].Queue)
			require.EqualValues(t, 2, rep.Queues[1].Backlog)
			require.NotNil(t, rep.Queues[1].OldestAt)
			require.Zero(t, rep.Outbox.Backlog)

			r = idemCLI(t, "status", "--store", dsn, "--queue", "other")
			requireOK(t, r)
			require.Regexp(t, `ledger@v1\s+3\s+\S+ \S+ \(\S+ ago\)\s+2\s+`, r.stdout)
			require.Regexp(t, `other\s+0\s+-`, r.stdout)
			require.NotRegexp(t, `\npayments\s`, r.stdout)
			require.Contains(t, r.stdout, "dead letters: 3 pending (")
			t.Logf("status:\n%s", r.stdout)
		})
	}
}

func TestGC(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := kind.dsn(t)
			st := openMigrated(t, dsn)
			now := time.Now()
			old := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "old"}
			oldOther := idem.Key{Tenant: "acme", Consumer: "mailer@v1", EventID: "old"}
			recent := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "recent"}
			seedClaim(t, st, old, now.Add(-10*day))
			seedClaim(t, st, oldOther, now.Add(-10*day))
			seedClaim(t, st, recent, now.Add(-6*day))
			seedOutbox(t, st,
				idem.Outgoing{EventID: "o1", Topic: "payments"},
				idem.Outgoing{EventID: "o2", Topic: "payments"},
				idem.Outgoing{EventID: "o3", Topic: "payments"})
			rows, err := st.Outbox.OutboxFetch(ctx, idem.OutboxFetchParams{Partitions: allPartitions(st), Limit: 10})
			require.NoError(t, err)
			require.Len(t, rows, 3)
			require.NoError(t, st.Outbox.OutboxMarkPublished(ctx, []int64{rows[0].ID}, now.Add(-2*day)))
			require.NoError(t, st.Outbox.OutboxMarkPublished(ctx, []int64{rows[1].ID}, now.Add(-time.Hour)))

			// Only one consumer's old claims.
			r := idemCLI(t, "gc", "--store", dsn, "--consumer", "ledger@v1", "--outbox-retention", "0")
			requireOK(t, r)
			require.Contains(t, r.stdout, "deleted 1 claim of ledger@v1 older than 7d")
			require.Equal(t, idem.ClaimNew, claimStatus(t, st, old))
			require.Equal(t, idem.ClaimDuplicate, claimStatus(t, st, oldOther))
			require.Equal(t, idem.ClaimDuplicate, claimStatus(t, st, recent))

			// All consumers, in batches of one; published outbox rows go too.
			r = idemCLI(t, "gc", "--store", dsn, "--batch", "1", "--retention", "8d", "--json")
			requireOK(t, r)
			var res struct {
				ClaimsDeleted int `json:"claims_deleted"`
				OutboxDeleted int `json:"outbox_deleted"`
			}
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), r.stdout)
			require.Equal(t, 1, res.ClaimsDeleted)
			require.Equal(t, 1, res.OutboxDeleted, "the row published 2 days ago, not the recent or unpublished ones")
			ob, err := st.Outbox.OutboxStats(ctx)
			require.NoError(t, err)
			require.EqualValues(t, 1, ob.Backlog)
			require.Equal(t, idem.ClaimNew, claimStatus(t, st, oldOther))
			require.Equal(t, idem.ClaimDuplicate, claimStatus(t, st, recent))

			// A retention shorter than the redelivery window needs --force.
			requireOneLineError(t, idemCLI(t, "gc", "--store", dsn, "--retention", "1d"), ExitUsage, "too short")
			r = idemCLI(t, "gc", "--store", dsn, "--retention", "1d", "--force")
			requireOK(t, r)
			require.Contains(t, r.stdout, "deleted 1 claim of all consumers older than 1d")
			require.Equal(t, idem.ClaimNew, claimStatus(t, st, recent))
		})
	}
}
