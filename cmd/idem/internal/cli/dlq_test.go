package cli

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemredact"
	"github.com/idemkit/idem/idemstore"
)

func TestDLQWorkflow(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := kind.dsn(t)
			st := openMigrated(t, dsn)
			dl := seedDeadLetter(t, st, "evt-1", idem.ReasonPermanentError, 2*time.Hour)
			seedDeadLetter(t, st, "evt-2", idem.ReasonRetriesExhausted, time.Minute)
			id := strconv.FormatInt(dl.ID, 10)

			// list --json: an array of objects with the documented keys.
			r := idemCLI(t, "dlq", "list", "--store", dsn, "--json")
			requireOK(t, r)
			var list []map[string]any
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &list), r.stdout)
			require.Len(t, list, 2)
			for _, key := range []string{"id", "event_id", "tenant", "consumer", "owner", "reason", "attempts", "status", "first_failed_at", "last_failed_at"} {
				require.Contains(t, list[0], key)
			}
			require.Equal(t, "evt-1", list[0]["event_id"])
			require.Equal(t, "acme", list[0]["tenant"])
			require.Equal(t, "ledger@v1", list[0]["consumer"])
			require.Equal(t, "payments", list[0]["owner"])
			require.Equal(t, "permanent_error", list[0]["reason"])
			require.EqualValues(t, 3, list[0]["attempts"])
			require.Equal(t, "pending", list[0]["status"])
			_, err := time.Parse(time.RFC3339Nano, list[0]["last_failed_at"].(string))
			require.NoError(t, err)

			// Filters.
			r = idemCLI(t, "dlq", "list", "--store", dsn, "--json", "--reason", "retries_exhausted")
			requireOK(t, r)
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &list))
			require.Len(t, list, 1)
			require.Equal(t, "evt-2", list[0]["event_id"])
			r = idemCLI(t, "dlq", "list", "--store", dsn, "--json", "--older-than", "1h")
			requireOK(t, r)
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &list))
			require.Len(t, list, 1)
			require.Equal(t, "evt-1", list[0]["event_id"])
			r = idemCLI(t, "dlq", "list", "--store", dsn, "--json", "--owner", "payments")
			requireOK(t, r)
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &list))
			require.Len(t, list, 2, "both seeded dead letters are the payments team's")
			r = idemCLI(t, "dlq", "list", "--store", dsn, "--json", "--owner", "growth")
			requireOK(t, r)
			require.Equal(t, "[]\n", r.stdout)
			requireOneLineError(t, idemCLI(t, "dlq", "list", "--store", dsn, "--owner", "Growth Team"), ExitUsage, `--owner "Growth Team" is not an owner`)
			r = idemCLI(t, "dlq", "list", "--store", dsn, "--json", "--tenant", "other")
			requireOK(t, r)
			require.Equal(t, "[]\n", r.stdout)

			// list as a table.
			r = idemCLI(t, "dlq", "list", "--store", dsn)
			requireOK(t, r)
			lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
			require.Len(t, lines, 3)
			require.Regexp(t, `^ID\s+CONSUMER\s+OWNER\s+TENANT\s+EVENT ID\s+REASON\s+ATTEMPTS\s+STATUS\s+FIRST FAILED\s+LAST FAILED\s+ERROR$`, lines[0])
			require.Regexp(t, `^`+id+`\s+ledger@v1\s+payments\s+acme\s+evt-1\s+permanent_error\s+3\s+pending\s+`, lines[1])
			t.Logf("dlq list:\n%s", r.stdout)

			// show masks the Authorization header and the password field, keeps the rest.
			r = idemCLI(t, "dlq", "show", id, "--store", dsn)
			requireOK(t, r)
			require.NotContains(t, r.stdout, "s3cr3t-token")
			require.NotContains(t, r.stdout, "hunter2")
			require.Regexp(t, `Authorization:\s+\[REDACTED\]`, r.stdout)
			require.Contains(t, r.stdout, `"password": "[REDACTED]"`)
			require.Contains(t, r.stdout, `"last4": "4242"`)
			require.Contains(t, r.stdout, "trace-1")
			require.Contains(t, r.stdout, "charge failed: card declined")
			require.Regexp(t, `Owner:\s+payments`, r.stdout)
			t.Logf("dlq show:\n%s", r.stdout)

			r = idemCLI(t, "dlq", "show", id, "--store", dsn, "--json")
			requireOK(t, r)
			require.NotContains(t, r.stdout, "s3cr3t-token")
			require.NotContains(t, r.stdout, "hunter2")
			var shown struct {
				ID      int64             `json:"id"`
				EventID string            `json:"event_id"`
				Headers map[string]string `json:"headers"`
				Payload map[string]any    `json:"payload"`
			}
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &shown), r.stdout)
			require.Equal(t, dl.ID, shown.ID)
			require.Equal(t, idemredact.Masked, shown.Headers["Authorization"])
			require.Equal(t, idemredact.Masked, shown.Payload["card"].(map[string]any)["password"])
			require.EqualValues(t, 1250, shown.Payload["amount_cents"])

			// replay --id republishes the original message to its queue and marks it replayed.
			r = idemCLI(t, "dlq", "replay", "--id", id, "--store", dsn, "--actor", "alice", "--note", "fixed the card service")
			requireOK(t, r)
			require.Contains(t, r.stdout, "replayed 1 dead letter")
			jobs, err := st.Queue.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: "payments", Max: 10, Lease: time.Minute, Now: time.Now()})
			require.NoError(t, err)
			require.Len(t, jobs, 1)
			m := jobs[0].Message
			require.Equal(t, "evt-1", m.EventID)
			require.Equal(t, "acme", m.Tenant)
			require.Equal(t, "payment.captured", m.Type)
			require.JSONEq(t, string(dl.Message.Payload), string(m.Payload))
			require.Equal(t, "Bearer s3cr3t-token", m.Headers["Authorization"], "the original headers travel unmasked")
			require.Equal(t, "trace-1", m.Headers["X-Trace-Id"])
			require.Equal(t, id, m.Headers[idem.HeaderReplayOf])
			require.Equal(t, "alice (os:tester)", m.Headers[idem.HeaderReplayedBy], "--actor is asserted: the OS user is recorded beside it")
			got, err := st.DeadLetters.GetDeadLetter(ctx, dl.ID)
			require.NoError(t, err)
			require.Equal(t, idem.DeadLetterReplayed, got.Status)

			// Replaying it again is refused: it is no longer pending.
			requireOneLineError(t, idemCLI(t, "dlq", "replay", "--id", id, "--store", dsn), ExitFailure, "is replayed, not pending")

			// The audit trail has the replay.
			r = idemCLI(t, "dlq", "audit", "--store", dsn, "--json")
			requireOK(t, r)
			var audit []map[string]any
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &audit), r.stdout)
			require.Len(t, audit, 1)
			require.Equal(t, "replay", audit[0]["action"])
			require.Equal(t, "alice (os:tester)", audit[0]["actor"])
			require.EqualValues(t, dl.ID, audit[0]["dead_letter_id"])
			require.Equal(t, "evt-1", audit[0]["event_id"])
			require.Equal(t, "fixed the card service", audit[0]["reason"])
			require.Equal(t, "payments", audit[0]["destination"], "the audit says where the replay went")
			r = idemCLI(t, "dlq", "audit", "--store", dsn)
			requireOK(t, r)
			require.Regexp(t, `\n\d+\s+\S+ \S+\s+alice \(os:tester\)\s+replay\s+`+id+`\s+evt-1\s+payments\s+fixed the card service`, r.stdout)

			// list --status replayed finds it.
			r = idemCLI(t, "dlq", "list", "--store", dsn, "--json", "--status", "replayed")
			requireOK(t, r)
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &list))
			require.Len(t, list, 1)
			require.Equal(t, "evt-1", list[0]["event_id"])
		})
	}
}

// TestDLQReplayLimit: a filter touches at most --limit dead letters and says how many remain;
// more takes --all --yes, and --all alone touches nothing.
func TestDLQReplayLimit(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := kind.dsn(t)
			st := openMigrated(t, dsn)
			for i := range 15 {
				seedDeadLetter(t, st, fmt.Sprintf("perm-%02d", i), idem.ReasonPermanentError, time.Hour)
			}
			seedDeadLetter(t, st, "other", idem.ReasonKeyReuse, time.Hour)
			pending := func() int {
				dls, err := st.DeadLetters.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Status: idem.DeadLetterPending, Reason: idem.ReasonPermanentError, Limit: 100})
				require.NoError(t, err)
				return len(dls)
			}
			backlog := func() int64 {
				qs, err := st.Queue.QueueStats(ctx, "payments")
				require.NoError(t, err)
				return qs.Backlog
			}

			// --all without --yes says how many and touches nothing.
			r := idemCLI(t, "dlq", "replay", "--reason", "permanent_error", "--all", "--store", dsn)
			requireOneLineError(t, r, ExitUsage, "--all would replay 15 pending dead letters with reason permanent_error; add --yes")
			require.Equal(t, 15, pending())
			require.Zero(t, backlog())

			r = idemCLI(t, "dlq", "replay", "--reason", "permanent_error", "--store", dsn)
			requireOK(t, r)
			require.Contains(t, r.stdout, "replayed 10 dead letters")
			require.Contains(t, r.stdout, "5 more pending dead letters match")
			t.Logf("dlq replay:\n%s", r.stdout)
			require.Equal(t, 5, pending())
			require.EqualValues(t, 10, backlog())

			r = idemCLI(t, "dlq", "replay", "--reason", "permanent_error", "--limit", "2", "--json", "--store", dsn)
			requireOK(t, r)
			var res struct {
				Replayed  []int64 `json:"replayed"`
				Remaining int     `json:"remaining"`
			}
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), r.stdout)
			require.Len(t, res.Replayed, 2)
			require.Equal(t, 3, res.Remaining)

			r = idemCLI(t, "dlq", "replay", "--reason", "permanent_error", "--limit", "1", "--all", "--yes", "--store", dsn)
			requireOK(t, r)
			require.Contains(t, r.stdout, "replayed 3 dead letters")
			require.NotContains(t, r.stdout, "more pending")
			require.Zero(t, pending())
			require.EqualValues(t, 15, backlog())

			r = idemCLI(t, "dlq", "replay", "--reason", "permanent_error", "--store", dsn)
			requireOK(t, r)
			require.Contains(t, r.stdout, "no pending dead letters with reason permanent_error to replay")

			// The key_reuse dead letter was never touched; the audit trail has 15 replays.
			other, err := st.DeadLetters.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Reason: idem.ReasonKeyReuse})
			require.NoError(t, err)
			require.Equal(t, idem.DeadLetterPending, other[0].Status)
			audit, err := st.DeadLetters.ListAudit(ctx, 100)
			require.NoError(t, err)
			require.Len(t, audit, 15)
			require.Equal(t, "tester", audit[0].Actor, "the actor defaults to the OS user")
		})
	}
}

func TestDLQDiscard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := sqliteDSN(t)
	st := openMigrated(t, dsn)
	a := seedDeadLetter(t, st, "a", idem.ReasonKeyReuse, time.Hour)
	b := seedDeadLetter(t, st, "b", idem.ReasonKeyReuse, time.Hour)
	c := seedDeadLetter(t, st, "c", idem.ReasonInvalidPayload, time.Hour)

	requireOneLineError(t, idemCLI(t, "dlq", "discard", "--id", strconv.FormatInt(a.ID, 10), "--store", dsn), ExitUsage, "--note is required")
	requireOneLineError(t, idemCLI(t, "dlq", "discard", "--id", strconv.FormatInt(a.ID, 10), "--reason", "test data", "--store", dsn), ExitUsage,
		`--reason "test data" is not a dead-letter reason`)
	requireOneLineError(t, idemCLI(t, "dlq", "discard", "--reason", "bogus", "--note", "x", "--store", dsn), ExitUsage, `--reason "bogus" is not a dead-letter reason`)
	requireOneLineError(t, idemCLI(t, "dlq", "discard", "--all", "--note", "cleanup", "--store", dsn), ExitUsage, "--all would discard 3 pending dead letters; add --yes")

	r := idemCLI(t, "dlq", "discard", "--reason", "key_reuse", "--note", "producer bug #12", "--store", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, fmt.Sprintf("discarded 2 dead letters: %d, %d", a.ID, b.ID))
	for id, want := range map[int64]idem.DeadLetterStatus{a.ID: idem.DeadLetterDiscarded, b.ID: idem.DeadLetterDiscarded, c.ID: idem.DeadLetterPending} {
		got, err := st.DeadLetters.GetDeadLetter(ctx, id)
		require.NoError(t, err)
		require.Equal(t, want, got.Status)
	}
	r = idemCLI(t, "dlq", "discard", "--id", strconv.FormatInt(c.ID, 10), "--note", "test data", "--actor", "bob", "--json", "--store", dsn)
	requireOK(t, r)
	require.JSONEq(t, fmt.Sprintf(`{"discarded":[%d],"remaining":0}`, c.ID), r.stdout)

	audit, err := st.DeadLetters.ListAudit(ctx, 10)
	require.NoError(t, err)
	require.Len(t, audit, 3)
	require.Equal(t, "discard", audit[0].Action)
	require.Equal(t, "bob (os:tester)", audit[0].Actor)
	require.Equal(t, "test data", audit[0].Reason)
	require.Equal(t, "producer bug #12", audit[1].Reason)
}

// TestReplayRecovery: a replayed dead letter processed by a consumer records its recovery.
func TestReplayRecovery(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn := sqliteDSN(t)
	st := openMigrated(t, dsn)
	dl := seedDeadLetter(t, st, "evt-recover", idem.ReasonPermanentError, time.Hour)
	requireOK(t, idemCLI(t, "dlq", "replay", "--id", strconv.FormatInt(dl.ID, 10), "--store", dsn))

	handled := make(chan idem.Message, 1)
	consumer, err := idem.NewConsumer(st.SQLite, idem.ConsumerConfig[*sql.Tx]{
		Name: "ledger@v1",
		Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			select {
			case handled <- msg:
			default:
			}
			return nil
		},
	})
	require.NoError(t, err)
	src, err := idemqueue.NewSource(st.SQLite, idemqueue.SourceConfig{Queue: "payments", MaxWait: 20 * time.Millisecond})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(runCtx, src) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()

	select {
	case msg := <-handled:
		require.Equal(t, "evt-recover", msg.EventID)
	case <-ctx.Done():
		t.Fatal("the consumer never received the replay")
	}
	require.Eventually(t, func() bool {
		got, err := st.DeadLetters.GetDeadLetter(ctx, dl.ID)
		require.NoError(t, err)
		return !got.RecoveredAt.IsZero()
	}, 10*time.Second, 10*time.Millisecond, "RecoveredAt was never set")

	r := idemCLI(t, "dlq", "show", strconv.FormatInt(dl.ID, 10), "--store", dsn, "--json")
	requireOK(t, r)
	var shown map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &shown))
	require.NotNil(t, shown["recovered_at"])
}

// TestShowNonJSONPayload: a payload that is not JSON is shown as text, secrets masked.
func TestShowNonJSONPayload(t *testing.T) {
	t.Parallel()
	dsn := sqliteDSN(t)
	st := openMigrated(t, dsn)
	msg := idem.Message{EventID: "e", Payload: []byte("to=a@b.c password=hunter2\xff")}
	fp, err := idem.ComputeFingerprint(msg, idem.FingerprintConfig{Raw: true}) // the mailer's payloads are not JSON
	require.NoError(t, err)
	dl, err := st.DeadLetters.InsertDeadLetter(context.Background(), idem.DeadLetter{
		Consumer:    "mailer@v2",
		Message:     msg,
		Fingerprint: fp,
		Reason:      idem.ReasonInvalidPayload,
		Source:      "outbox:mail",
	})
	require.NoError(t, err)
	id := strconv.FormatInt(dl.ID, 10)
	r := idemCLI(t, "dlq", "show", id, "--store", dsn)
	requireOK(t, r)
	require.NotContains(t, r.stdout, "hunter2")
	require.Contains(t, r.stdout, "to=a@b.c password=[REDACTED]")
	require.Contains(t, r.stdout, "Headers:       -")
	r = idemCLI(t, "dlq", "show", id, "--store", dsn, "--json")
	requireOK(t, r)
	var shown map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &shown))
	require.Contains(t, shown["payload"], "password=[REDACTED]")

	// A dead letter from the outbox has no queue to go back to without --topic.
	requireOneLineError(t, idemCLI(t, "dlq", "replay", "--id", id, "--store", dsn), ExitFailure, `source "outbox:mail" is not a queue`)
	r = idemCLI(t, "dlq", "replay", "--id", id, "--topic", "mail", "--store", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, "to mail")
}
