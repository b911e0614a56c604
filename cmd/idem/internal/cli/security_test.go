package cli

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/idemauth"
	"github.com/idemkit/idem/idemdlq"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemstore"
)

// execSQL runs one statement on the store as an operator with a SQL prompt would.
func execSQL(t testing.TB, st *connect.Stores, sqliteQuery, pgQuery string, args ...any) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch {
	case st.SQLite != nil:
		err = st.SQLite.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, sqliteQuery, args...)
			return err
		})
	default:
		schema := st.URL.Schema
		if schema == "" {
			schema = "public"
		}
		err = st.Postgres.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SET LOCAL search_path TO "+pgx.Identifier{schema}.Sanitize())
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, pgQuery, args...)
			return err
		})
	}
	require.NoError(t, err)
}

// TestReplayRefusesEditedDeadLetter (issue 10 item 3): an operator changes a pending
// permanent_error dead letter's payload in SQL and replays it. Before, the edited payload was
// republished under the original event id (money moved); now replay refuses it and publishes
// nothing, unless --as-new-event says to send it as a new event whose audit row names the
// original.
func TestReplayRefusesEditedDeadLetter(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := kind.dsn(t)
			st := openMigrated(t, dsn)
			dl := seedDeadLetter(t, st, "pay-7", idem.ReasonPermanentError, time.Hour)
			id := strconv.FormatInt(dl.ID, 10)
			edited := []byte(`{"order_id":42,"amount_cents":999999,"card":{"last4":"4242"}}`)
			execSQL(t, st, "UPDATE idem_dead_letters SET payload = ? WHERE id = ?", "UPDATE idem_dead_letters SET payload = $1 WHERE id = $2", edited, dl.ID)
			backlog := func() int64 {
				qs, err := st.Queue.QueueStats(ctx, "payments")
				require.NoError(t, err)
				return qs.Backlog
			}

			r := idemCLI(t, "dlq", "replay", "--id", id, "--store", dsn, "--actor", "alice")
			requireOneLineError(t, r, ExitFailure, "no longer matches the fingerprint")
			require.Zero(t, backlog(), "nothing was published")
			got, err := st.DeadLetters.GetDeadLetter(ctx, dl.ID)
			require.NoError(t, err)
			require.Equal(t, idem.DeadLetterPending, got.Status)

			r = idemCLI(t, "dlq", "replay", "--id", id, "--store", dsn, "--actor", "alice", "--as-new-event", "--note", "amount fixed by hand")
			requireOK(t, r)
			jobs, err := st.Queue.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: "payments", Max: 10, Lease: time.Minute, Now: time.Now()})
			require.NoError(t, err)
			require.Len(t, jobs, 1)
			m := jobs[0].Message
			require.Equal(t, "pay-7~edit-"+id, m.EventID, "an edited payload is another event")
			require.Equal(t, "pay-7", m.Headers[idem.HeaderReplayNewEventOf])
			require.JSONEq(t, string(edited), string(m.Payload))

			r = idemCLI(t, "dlq", "audit", "--store", dsn, "--json")
			requireOK(t, r)
			var audit []map[string]any
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &audit), r.stdout)
			require.Len(t, audit, 1)
			require.Equal(t, "pay-7", audit[0]["event_id"], "the audit row names the original")
			require.Contains(t, audit[0]["reason"], `replayed as new event "pay-7~edit-`+id+`"`)
			require.Contains(t, audit[0]["reason"], "amount fixed by hand")
		})
	}
}

// TestReplaySignedDeadLetterAfterTolerance (issue 11 finding 13): a dead letter signed by its
// producer two hours ago is replayed with an operator replay key and applied, once; a copy
// carrying a forged replay signature (the right key id, not the key) is refused. Before, the only
// way was an unsigned replay, which the verifier refuses as stale.
func TestReplaySignedDeadLetterAfterTolerance(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn := sqliteDSN(t)
	st := openMigrated(t, dsn)

	producer := idemauth.Key{ID: "acme-1", Tenant: "acme", Secret: bytes.Repeat([]byte{'p'}, 32)}
	operator := idemauth.ReplayKey{ID: "ops-1", Secret: bytes.Repeat([]byte{'o'}, 32)}
	ring, err := idemauth.NewKeyring(producer)
	require.NoError(t, err)
	verifier, err := idemauth.NewVerifier(ring, idemauth.VerifierConfig{ReplayKeys: []idemauth.ReplayKey{operator}})
	require.NoError(t, err)

	// The dead letter as the consumer stored it: verified, two hours ago.
	signedAt := time.Now().Add(-2 * time.Hour)
	msg := idem.Message{EventID: "pay-1", Type: "payment.captured", Payload: []byte(`{"amount_cents":500}`),
		OccurredAt: signedAt}
	require.NoError(t, idemauth.SignMessage(producer, &msg, signedAt))
	fp, err := idem.ComputeFingerprint(msg, idem.FingerprintConfig{})
	require.NoError(t, err)
	dl, err := st.DeadLetters.InsertDeadLetter(ctx, idem.DeadLetter{Consumer: "ledger@v1", Message: msg, Fingerprint: fp,
		Reason: idem.ReasonPermanentError, Attempts: 1, FirstFailed: signedAt, LastFailed: signedAt, Source: "queue:payments"})
	require.NoError(t, err)

	// An attacker who captured the message sends it as a "replay" without the operator's key.
	forged := msg.Clone()
	forged.Headers[idem.HeaderReplayOf] = strconv.FormatInt(dl.ID, 10)
	forger, err := idemauth.NewReplaySigner(idemauth.ReplayKey{ID: operator.ID, Secret: bytes.Repeat([]byte{'x'}, 32)}, nil)
	require.NoError(t, err)
	require.NoError(t, forger.SignReplay(ctx, &forged))
	require.NoError(t, idemqueue.NewSink(st.Queue).Publish(ctx, "payments", forged))

	keyFile := filepath.Join(t.TempDir(), "replay.key")
	require.NoError(t, os.WriteFile(keyFile, []byte(operator.ID+":"+hex.EncodeToString(operator.Secret)+"\n"), 0o600))
	r := idemCLI(t, "dlq", "replay", "--id", strconv.FormatInt(dl.ID, 10), "--store", dsn, "--actor", "alice", "--replay-key-file", keyFile)
	requireOK(t, r)
	require.NotContains(t, r.stdout, hex.EncodeToString(operator.Secret))

	var (
		mu      sync.Mutex
		applied []idem.Message
	)
	consumer, err := idem.NewConsumer(st.SQLite, idem.ConsumerConfig[*sql.Tx]{
		Name: "ledger@v1",
		Handler: func(ctx context.Context, tx *sql.Tx, m idem.Message) error {
			mu.Lock()
			defer mu.Unlock()
			applied = append(applied, m)
			return nil
		},
		Input: idem.InputConfig{
			Authenticator: verifier,
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

	require.Eventually(t, func() bool {
		got, err := st.DeadLetters.GetDeadLetter(ctx, dl.ID)
		require.NoError(t, err)
		return !got.RecoveredAt.IsZero()
	}, 10*time.Second, 10*time.Millisecond, "the signed replay was never applied")
	require.Eventually(t, func() bool {
		dls, err := st.DeadLetters.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Reason: idem.ReasonUnauthenticated, Limit: 10})
		require.NoError(t, err)
		return len(dls) == 1 && dls[0].Message.EventID == "pay-1"
	}, 10*time.Second, 10*time.Millisecond, "the forged replay was not refused as unauthenticated")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, applied, 1, "applied once")
	require.Equal(t, "acme", applied[0].Tenant)
	require.Equal(t, "alice (os:tester)", applied[0].Header(idem.HeaderReplayedBy))
}

// TestShowBoundsHostilePayloads (findings 6, 7): a 20 KB "[[[…]]]" payload made dlq show print
// 200 MB (0.7–1.0 GB of memory), and escape sequences in a payload, an id or an error reached the
// operator's terminal raw and could fake lines.
func TestShowBoundsHostilePayloads(t *testing.T) {
	t.Parallel()
	dsn := sqliteDSN(t)
	st := openMigrated(t, dsn)
	insert := func(msg idem.Message, errText string) string {
		dl, err := st.DeadLetters.InsertDeadLetter(context.Background(), idem.DeadLetter{Consumer: "ledger@v1", Message: msg,
			Fingerprint: idem.Fingerprint{7}, Reason: idem.ReasonInvalidPayload, Error: errText, Source: "queue:payments"})
		require.NoError(t, err)
		return strconv.FormatInt(dl.ID, 10)
	}

	deep := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	wide := "[" + strings.Repeat(`{"a":[1,2,3]},`, 20000) + "0]"
	for name, payload := range map[string]string{"deep": deep, "wide": wide} {
		id := insert(idem.Message{EventID: name, Payload: []byte(payload)}, "bad")
		for _, args := range [][]string{{"dlq", "show", id, "--store", dsn}, {"dlq", "show", id, "--store", dsn, "--json"}} {
			r := idemCLI(t, args...)
			requireOK(t, r)
			require.Less(t, len(r.stdout), 80<<10, "%s %v: %d bytes", name, args, len(r.stdout))
			if name == "wide" {
				require.Contains(t, r.stdout, fmt.Sprintf("… (truncated, payload of %d bytes)", len(payload)))
			}
		}
	}

	esc := "\x1b[2J\x1b[1;1Hidem: all dead letters replayed\r\n\u009b31m\u202egnp.exe"
	id := insert(idem.Message{EventID: "evt\x1b[31m-red", Tenant: "acme\x07", Payload: []byte("note " + esc),
		Headers: map[string]string{"X-Note": esc}}, "handler said "+esc)
	for _, args := range [][]string{{"dlq", "show", id, "--store", dsn}, {"dlq", "list", "--store", dsn},
		{"dlq", "show", id, "--store", dsn, "--json"}, {"dlq", "list", "--store", dsn, "--json"}} {
		r := idemCLI(t, args...)
		requireOK(t, r)
		for _, raw := range []string{"\x1b", "\x07", "\r", "\u009b", "\u202e"} {
			require.NotContains(t, r.stdout, raw, "%v", args)
		}
		require.Regexp(t, `\\(x|u00)1b\[`, r.stdout, "%v", args)
	}
	r := idemCLI(t, "dlq", "show", id, "--store", dsn)
	require.Contains(t, r.stdout, `note \x1b[2J\x1b[1;1Hidem: all dead letters replayed\x0d`)
	require.Contains(t, r.stdout, `\u009b31m\u202egnp.exe`)
	require.Contains(t, r.stdout, `evt\x1b[31m-red`)
}

// failingOutbox is a store whose health check fails with an error that names the database.
type failingOutbox struct{ idemstore.OutboxRelayStore }

func (failingOutbox) OutboxStats(context.Context) (idemstore.QueueStats, error) {
	return idemstore.QueueStats{}, errors.New(`failed to connect to user=app database=payments host=db-7.internal: password=hunter2 authentication failed`)
}

// TestHealthzSaysNothingToStrangers (finding 11): /healthz sent the masked DSN and the raw
// database error to anyone who could reach the port. Now the body is a bare status and the
// detail goes to the log, masked.
func TestHealthzSaysNothingToStrangers(t *testing.T) {
	t.Parallel()
	st := openMigrated(t, sqliteDSN(t))
	bad := *st
	bad.Outbox = failingOutbox{st.Outbox}
	var logs bytes.Buffer
	srv := httptest.NewServer(metricsServer(&bad, idemprom.New(idemprom.Config{}), nil, slog.New(slog.NewTextHandler(&logs, nil))).Handler)
	defer srv.Close()
	code, body := httpGet(t, srv.URL+"/healthz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "unavailable\n", body)
	require.Contains(t, logs.String(), "db-7.internal", "the operator sees why")
	require.NotContains(t, logs.String(), "hunter2")

	good := httptest.NewServer(metricsServer(st, idemprom.New(idemprom.Config{}), nil, slog.New(slog.NewTextHandler(&logs, nil))).Handler)
	defer good.Close()
	code, body = httpGet(t, good.URL+"/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)
}

// TestAuditActorIsValidated (finding 12): the Replayer accepted " " as the actor; an actor with
// control characters could forge lines in the audit output.
func TestAuditActorIsValidated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := sqliteDSN(t)
	st := openMigrated(t, dsn)
	dl := seedDeadLetter(t, st, "evt-a", idem.ReasonPermanentError, time.Hour)
	rp := idemdlq.NewReplayer(st.DeadLetters, idemqueue.NewSink(st.Queue), idemdlq.ReplayerConfig{})
	for _, actor := range []string{"", " ", "\t\n", "alice\x1b[31m", "alice\nroot replay", strings.Repeat("a", idemdlq.ActorMaxLen+1), "\xff"} {
		_, err := rp.Discard(ctx, idemdlq.Selection{IDs: []int64{dl.ID}, Actor: actor, Reason: "x"})
		require.Error(t, err, "%q", actor)
		_, err = rp.Replay(ctx, idemdlq.ReplayParams{Selection: idemdlq.Selection{IDs: []int64{dl.ID}, Actor: actor}})
		require.Error(t, err, "%q", actor)
	}
	got, err := st.DeadLetters.GetDeadLetter(ctx, dl.ID)
	require.NoError(t, err)
	require.Equal(t, idem.DeadLetterPending, got.Status, "nothing was done")

	r := idemCLI(t, "dlq", "discard", "--id", strconv.FormatInt(dl.ID, 10), "--note", "x", "--actor", "root\x1b[2K", "--store", dsn)
	requireOneLineError(t, r, ExitFailure, `Actor "root\x1b[2K (os:tester)" has a control character`)
}

// TestMovedOccurrenceTimeIsRefused (finding 1): a captured signed message re-sent with
// Idem-Occurred-At moved back a day was accepted (v1 did not sign it) and, on the partitioned
// inbox, claimed in another bucket and applied twice. Against the queue table: the copy is now
// dead-lettered as unauthenticated, and the effect applied once.
func TestMovedOccurrenceTimeIsRefused(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := openMigrated(t, sqliteDSN(t))
	producer := idemauth.Key{ID: "acme-1", Tenant: "acme", Secret: bytes.Repeat([]byte{'p'}, 32)}
	ring, err := idemauth.NewKeyring(producer)
	require.NoError(t, err)
	verifier, err := idemauth.NewVerifier(ring, idemauth.VerifierConfig{})
	require.NoError(t, err)

	msg := idem.Message{EventID: "pay-9", Type: "payment.captured", Payload: []byte(`{"amount_cents":500}`),
		OccurredAt: time.Now().Add(-time.Minute)}
	require.NoError(t, idemauth.SignMessage(producer, &msg, time.Now()))
	moved := msg.Clone()
	moved.OccurredAt = moved.OccurredAt.Add(-24 * time.Hour)
	require.NoError(t, idemqueue.NewSink(st.Queue).Publish(ctx, "payments", msg, moved))

	var (
		mu      sync.Mutex
		applied int
	)
	consumer, err := idem.NewConsumer(st.SQLite, idem.ConsumerConfig[*sql.Tx]{
		Name: "ledger@v1",
		Handler: func(context.Context, *sql.Tx, idem.Message) error {
			mu.Lock()
			defer mu.Unlock()
			applied++
			return nil
		},
		Input: idem.InputConfig{
			Authenticator: verifier,
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
	require.Eventually(t, func() bool {
		dls, err := st.DeadLetters.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Reason: idem.ReasonUnauthenticated, Limit: 10})
		require.NoError(t, err)
		return len(dls) == 1 && strings.Contains(dls[0].Error, "signature does not match")
	}, 10*time.Second, 10*time.Millisecond, "the copy with a moved occurrence time was not refused")
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return applied == 1
	}, 10*time.Second, 10*time.Millisecond, "the original was not applied")
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, applied, "applied once")
}
