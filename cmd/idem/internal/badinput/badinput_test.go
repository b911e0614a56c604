package badinput_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/consumertest"
	"github.com/idemkit/idem/idemauth"
	"github.com/idemkit/idem/idemschema"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/storetest"
)

// paymentSchema is the contract of payment.captured events.
const paymentSchema = `{
	"type": "object",
	"required": ["tenant_id", "wallet", "amount_cents"],
	"properties": {
		"tenant_id": {"type": "string"},
		"wallet": {"type": "string", "minLength": 1},
		"amount_cents": {"type": "integer", "minimum": 1}
	}
}`

const consumerName = "ledger@v1"

// The wallets: bad messages all aim at victim, the valid message after each case pays canary,
// and the original of the key-reuse case pays reused.
const (
	victim = "victim"
	canary = "canary"
	reused = "reused"
)

var acme = idemauth.Key{ID: "acme-2025-06", Tenant: "acme", Secret: []byte("acme-secret-0123456789abcdef-0123456789")}

// How a case's message reaches the broker.
type sendMode int

const (
	viaSink      sendMode = iota // the transport's idem.Sink
	withoutID                    // no event id at all (a foreign producer)
	afterApplied                 // the same id again, after its first message was applied
)

// catalogueCase is one kind of bad input.
type catalogueCase struct {
	name   string
	id     string // event id ("" for the case without one)
	send   sendMode
	msg    func(f *fixture) idem.Message
	reason idem.Reason
	says   []string // substrings of the dead letter's Error, in words a person understands
	// authed and validated are how often the Authenticator and the Validator see the event id:
	// once at most per message, never again (no retry).
	authed, validated int
	// tooBig marks the case a broker with a smaller message limit refuses before any consumer.
	tooBig bool
}

// fixture signs and builds the catalogue's messages.
type fixture struct{ t *testing.T }

// payment is a payment.captured for tenant acme with the given payload, signed with acme's key
// at signedAt.
func (f fixture) payment(id, payload string, signedAt time.Time) idem.Message {
	m := idem.Message{EventID: id, Type: "payment.captured", Payload: []byte(payload)}
	require.NoError(f.t, idemauth.SignMessage(acme, &m, signedAt))
	return m
}

func validPayload(wallet string, cents int) string {
	return fmt.Sprintf(`{"tenant_id":"acme","wallet":%q,"amount_cents":%d}`, wallet, cents)
}

// oversized is a valid, signed payment whose payload is one byte over the consumer's default
// limit (MaxPayloadBytesDefault).
func oversized() string {
	head := `{"tenant_id":"acme","wallet":"victim","amount_cents":100,"pad":"`
	return head + strings.Repeat("x", idem.MaxPayloadBytesDefault+1-len(head)-2) + `"}`
}

func catalogue() []catalogueCase {
	now := time.Now
	return []catalogueCase{
		{name: "invalid JSON", id: "bad-json",
			msg: func(f *fixture) idem.Message {
				return f.payment("bad-json", `{"tenant_id":"acme","wallet":victim,"amount_cents":100}`, now())
			},
			reason: idem.ReasonInvalidPayload, says: []string{"invalid JSON at offset 30", "invalid character 'v'"}, authed: 1, validated: 1},
		{name: "truncated JSON", id: "bad-truncated",
			msg: func(f *fixture) idem.Message {
				return f.payment("bad-truncated", `{"tenant_id":"acme","wallet":"victim","amount_ce`, now())
			},
			reason: idem.ReasonInvalidPayload, says: []string{"invalid JSON at offset 48", "unexpected end of JSON input"}, authed: 1, validated: 1},
		{name: "wrong types", id: "bad-types",
			msg: func(f *fixture) idem.Message {
				return f.payment("bad-types", `{"tenant_id":"acme","wallet":"victim","amount_cents":"100"}`, now())
			},
			reason: idem.ReasonInvalidPayload, says: []string{"/amount_cents: got string, want integer"}, authed: 1, validated: 1},
		{name: "missing required field", id: "bad-missing",
			msg: func(f *fixture) idem.Message {
				return f.payment("bad-missing", `{"tenant_id":"acme","wallet":"victim"}`, now())
			},
			reason: idem.ReasonInvalidPayload, says: []string{"missing required field amount_cents"}, authed: 1, validated: 1},
		{name: "unknown event type", id: "bad-type",
			msg: func(f *fixture) idem.Message {
				m := idem.Message{EventID: "bad-type", Type: "payment.refunded", Payload: []byte(validPayload(victim, 100))}
				require.NoError(f.t, idemauth.SignMessage(acme, &m, now()))
				return m
			},
			reason: idem.ReasonInvalidPayload, says: []string{`unknown event type "payment.refunded"`}, authed: 1, validated: 1},
		{name: "empty event id", id: "", send: withoutID,
			msg: func(f *fixture) idem.Message {
				return idem.Message{Tenant: "acme", Type: "payment.captured", Payload: []byte(validPayload(victim, 100))}
			},
			reason: idem.ReasonInvalidPayload, says: []string{"event id is empty"}},
		{name: "oversized payload", id: "bad-size", tooBig: true,
			msg:    func(f *fixture) idem.Message { return f.payment("bad-size", oversized(), now()) },
			reason: idem.ReasonInvalidPayload, says: []string{"payload is 1048577 bytes, limit 1048576"}},
		{name: "key reuse with another payload", id: "bad-reuse", send: afterApplied,
			msg:    func(f *fixture) idem.Message { return f.payment("bad-reuse", validPayload(victim, 100000), now()) },
			reason: idem.ReasonKeyReuse, says: []string{"event id reused with different content", `tenant "acme", consumer ledger@v1`, `(event "bad-reuse")`}, authed: 2, validated: 2},
		{name: "tenant the key may not speak for", id: "bad-tenant",
			msg: func(f *fixture) idem.Message {
				return f.payment("bad-tenant", `{"tenant_id":"globex","wallet":"victim","amount_cents":100}`, now())
			},
			reason: idem.ReasonUnauthenticated, says: []string{`payload field "tenant_id" claims tenant "globex"`, `speaks for tenant "acme"`}, authed: 1},
		{name: "bad signature", id: "bad-mac",
			msg: func(f *fixture) idem.Message {
				m := f.payment("bad-mac", validPayload(victim, 100), now())
				m.Payload = []byte(validPayload(victim, 100000)) // changed after signing
				return m
			},
			reason: idem.ReasonUnauthenticated, says: []string{"signature does not match the message", "changed after signing"}, authed: 1},
		{name: "missing signature", id: "bad-unsigned",
			msg: func(f *fixture) idem.Message {
				return idem.Message{EventID: "bad-unsigned", Tenant: "acme", Type: "payment.captured", Payload: []byte(validPayload(victim, 100))}
			},
			reason: idem.ReasonUnauthenticated, says: []string{"message is not signed", "no Idem-Signature header"}, authed: 1},
		{name: "signature older than the tolerance", id: "bad-replay",
			msg: func(f *fixture) idem.Message {
				return f.payment("bad-replay", validPayload(victim, 100), now().Add(-10*time.Minute))
			},
			reason: idem.ReasonUnauthenticated, says: []string{"signature timestamp outside the tolerance", "before the message was published", "replayed"}, authed: 1},
		{name: "non-UTF-8 bytes", id: "bad-utf8",
			msg: func(f *fixture) idem.Message {
				return f.payment("bad-utf8", "{\"tenant_id\":\"acme\",\"wallet\":\"vict\xffim\",\"amount_cents\":100}", now())
			},
			reason: idem.ReasonInvalidPayload, says: []string{"payload is not valid UTF-8", "0xff at offset 34"}, authed: 1, validated: 1},
		{name: "deeply nested JSON", id: "bad-deep",
			msg: func(f *fixture) idem.Message {
				return f.payment("bad-deep", `{"tenant_id":"acme","wallet":`+strings.Repeat("[", 10000)+strings.Repeat("]", 10000)+`,"amount_cents":100}`, now())
			},
			reason: idem.ReasonInvalidPayload, says: []string{"JSON nested deeper than 64 levels"}, authed: 1, validated: 1},
	}
}

// counter counts calls per event id.
type counter struct {
	mu sync.Mutex
	n  map[string]int
	// slowest is the longest single call, to show that hostile input is refused quickly.
	slowest time.Duration
}

func (c *counter) add(id string, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
	c.slowest = max(c.slowest, d)
}

func (c *counter) slowestCall() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.slowest
}

func (c *counter) get(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// logBuffer keeps the consumer's log lines, to explain a failure.
type logBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// lines returns the logged lines about event id, the first few of them.
func (l *logBuffer) lines(id string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	field := "event_id=" + id + " "
	if id == "" {
		field = `event_id="" `
	}
	var out []string
	for _, line := range strings.Split(l.buf.String(), "\n") {
		if strings.Contains(line, field) && len(out) < 5 {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestBadInput runs the catalogue through every transport that is available.
func TestBadInput(t *testing.T) {
	t.Parallel()
	t.Run("QueueSQLite", func(t *testing.T) {
		t.Parallel()
		store, b := testdb.SQLite(t)
		runCatalogue[*sql.Tx](t, b, sqliteQueue(t, store))
	})
	t.Run("QueuePostgres", func(t *testing.T) {
		t.Parallel()
		store, b := testdb.Postgres(t)
		runCatalogue[pgx.Tx](t, b, postgresQueue(t, store))
	})
	t.Run("QueueMySQL", func(t *testing.T) {
		t.Parallel()
		store, b := testdb.MySQL(t)
		runCatalogue[*sql.Tx](t, b, mysqlQueue(t, store))
	})
	t.Run("JetStream", func(t *testing.T) {
		t.Parallel()
		tr := jetStream(t)
		_, b := testdb.SQLite(t)
		runCatalogue[*sql.Tx](t, b, tr)
	})
	t.Run("RabbitMQ", func(t *testing.T) {
		t.Parallel()
		tr := rabbitMQ(t)
		_, b := testdb.SQLite(t)
		runCatalogue[*sql.Tx](t, b, tr)
	})
	t.Run("Redis", func(t *testing.T) {
		t.Parallel()
		tr := redisStreams(t)
		_, b := testdb.SQLite(t)
		runCatalogue[*sql.Tx](t, b, tr)
	})
}

// runCatalogue starts a consumer on tr over b and sends every case of the catalogue, each
// followed by a valid message.
func runCatalogue[TTx any](t *testing.T, b storetest.Bundle[TTx], tr transport) {
	ctx := context.Background()
	for _, w := range []string{victim, canary, reused} {
		require.NoError(t, b.CreateWallet(ctx, w))
	}

	ring, err := idemauth.NewKeyring(acme)
	require.NoError(t, err)
	verifier, err := idemauth.NewVerifier(ring, idemauth.VerifierConfig{TenantField: "tenant_id"})
	require.NoError(t, err)
	validator, err := idemschema.New(map[string][]byte{"payment.captured": []byte(paymentSchema)}, idemschema.Config{})
	require.NoError(t, err)

	var authed, validated, handled counter
	rec := &consumertest.Recorder{}
	logs := &logBuffer{}
	c, err := idem.NewConsumer(b.Store, idem.ConsumerConfig[TTx]{
		Name: consumerName,
		Handler: func(ctx context.Context, tx TTx, msg idem.Message) error {
			handled.add(msg.EventID, 0)
			var p struct {
				Wallet      string `json:"wallet"`
				AmountCents int64  `json:"amount_cents"`
			}
			if err := json.Unmarshal(msg.Payload, &p); err != nil {
				return idem.Permanent(err)
			}
			n, err := b.Credit(ctx, tx, msg.EventID, p.Wallet, p.AmountCents)
			if err != nil {
				return err
			}
			return idem.ExpectRows(n, 1)
		},
		// Input.MaxPayloadBytes is left at its default on purpose: the oversized case tests it.
		Workers:         4,
		ShutdownTimeout: 5 * time.Second,
		Input: idem.InputConfig{
			Authenticator: idem.AuthenticatorFunc(func(ctx context.Context, msg *idem.Message) error {
				start := time.Now()
				defer func() { authed.add(msg.EventID, time.Since(start)) }()
				return verifier.Authenticate(ctx, msg)
			}),
			Validator: idem.ValidatorFunc(func(ctx context.Context, msg idem.Message) error {
				start := time.Now()
				defer func() { validated.add(msg.EventID, time.Since(start)) }()
				return validator.Validate(ctx, msg)
			}),
		},
		Failure: idem.FailureConfig{
			Retry: retry.Policy{MaxAttempts: 5, MaxElapsed: time.Minute, Base: 20 * time.Millisecond, Cap: 100 * time.Millisecond},
		},
		Claims: idem.ClaimConfig{
			Retention: 48 * time.Hour,
			// Covers every transport's redelivery window (RabbitMQ: message TTL + longest delay tier
			// + consumer_timeout), which Run checks (idem.CheckSourceLimits).
			RedeliveryWindow: 24 * time.Hour,
		},
		Observe: idem.ObserveConfig{
			Observer: rec,
			Logger:   slog.New(slog.NewTextHandler(logs, nil)),
		},
	})
	require.NoError(t, err)

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, tr.source) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err, "Run")
		case <-time.After(20 * time.Second):
			t.Error("Run did not return within 20s of cancel")
		}
	})

	deadLetters := func(t *testing.T, id string) []idem.DeadLetter {
		t.Helper()
		all, err := b.Store.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Limit: 1000})
		require.NoError(t, err)
		var out []idem.DeadLetter
		for _, dl := range all {
			if dl.Message.EventID == id {
				out = append(out, dl)
			}
		}
		return out
	}
	eventually := func(t *testing.T, id, what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out after 20s waiting for %s; the consumer logged about event %q:\n%s", what, id, logs.lines(id))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ledger := func(t *testing.T, id string) int64 {
		t.Helper()
		n, err := b.LedgerRows(ctx, id)
		require.NoError(t, err)
		return n
	}
	balance := func(t *testing.T, wallet string) int64 {
		t.Helper()
		n, err := b.Balance(ctx, wallet)
		require.NoError(t, err)
		return n
	}

	cases := catalogue()
	var (
		mu   sync.Mutex
		ran  []catalogueCase // the cases that ended as they should
		sent []string        // the valid messages sent after each case
	)
	t.Run("cases", func(t *testing.T) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				f := &fixture{t: t}
				bad := tc.msg(f)
				if tc.tooBig && tr.maxPayload > 0 && len(bad.Payload)+4096 > tr.maxPayload {
					// The broker itself refuses the message at publish, so nothing reaches the
					// consumer; the consumer's own limit is what the queue-table runs check.
					t.Skipf("the broker's max_payload (%d bytes) refuses a %d-byte message before any consumer sees it", tr.maxPayload, len(bad.Payload))
				}
				switch tc.send {
				case viaSink:
					tr.publish(t, bad)
				case withoutID:
					tr.publishWithoutID(t, bad)
				case afterApplied:
					orig := f.payment(tc.id, validPayload(reused, 5), time.Now())
					tr.publish(t, orig)
					eventually(t, tc.id, "the original of "+tc.id+" applied", func() bool { return rec.Count(idem.OutcomeProcessed, tc.id) == 1 })
					tr.publishAgain(t, bad)
				}
				// The consumer keeps serving: a valid message right behind the bad one.
				nextID := "next-" + strings.ReplaceAll(tc.name, " ", "-")
				tr.publish(t, f.payment(nextID, validPayload(canary, 1), time.Now()))
				mu.Lock()
				sent = append(sent, nextID)
				mu.Unlock()

				eventually(t, tc.id, "one dead letter for "+tc.name, func() bool {
					if n := rec.Count(idem.OutcomeRetried, tc.id); n > 0 {
						t.Fatalf("event %q was nak'ed for a retry %d time(s) instead of being dead-lettered at once; the consumer logged:\n%s",
							tc.id, n, logs.lines(tc.id))
					}
					return len(deadLetters(t, tc.id)) == 1
				})
				eventually(t, nextID, "the next message processed", func() bool { return rec.Count(idem.OutcomeProcessed, nextID) == 1 })
				dl := deadLetters(t, tc.id)[0]
				t.Logf("dead letter: reason %s: %s", dl.Reason, dl.Error)
				require.Equal(t, tc.reason, dl.Reason, "dead letter: %s", dl.Error)
				for _, s := range tc.says {
					require.Contains(t, dl.Error, s)
				}
				require.Contains(t, dl.Error, tc.id, "the error names the event")
				require.Equal(t, 1, dl.Attempts, "dead-lettered on the first attempt")
				require.Equal(t, consumerName, dl.Consumer)
				require.Equal(t, idem.DeadLetterPending, dl.Status)
				require.Equal(t, bad.Payload, dl.Message.Payload, "the dead letter keeps the original payload")
				require.NotContains(t, dl.Error, string(acme.Secret))
				if sig := bad.Header(idemauth.HeaderSignature); sig != "" {
					_, mac, _ := strings.Cut(sig, "v2=")
					require.NotContains(t, dl.Error, mac, "the error never repeats the MAC")
				}
				if tc.id == "bad-deep" {
					require.Less(t, validated.slowestCall(), 2*time.Second, "hostile nesting is refused quickly")
				}
				mu.Lock()
				ran = append(ran, tc)
				mu.Unlock()
			})
		}
	})

	// Longer than a lease: a redelivery of any bad message would have happened by now. The
	// checks below cover the cases that passed, so that one failing case does not hide the rest.
	time.Sleep(lease + time.Second)
	known := map[string]bool{}
	for _, tc := range cases {
		known[tc.id] = true
	}
	all, err := b.Store.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Limit: 1000})
	require.NoError(t, err)
	for _, dl := range all {
		require.True(t, known[dl.Message.EventID], "unexpected dead letter of event %q: %s", dl.Message.EventID, dl.Error)
	}
	for _, tc := range ran {
		require.Len(t, deadLetters(t, tc.id), 1, "%s: exactly one dead letter", tc.name)
		require.Equal(t, tc.authed, authed.get(tc.id), "%s: authenticated once per message, never retried", tc.name)
		require.Equal(t, tc.validated, validated.get(tc.id), "%s: validated once per message, never retried", tc.name)
		wantApplied := 0
		if tc.send == afterApplied {
			wantApplied = 1 // the original, not the reuse
		}
		require.Equal(t, wantApplied, handled.get(tc.id), "%s: handler calls", tc.name)
		require.EqualValues(t, wantApplied, ledger(t, tc.id), "%s: ledger rows", tc.name)
	}
	var applied int64
	for _, id := range sent {
		n := ledger(t, id)
		require.LessOrEqual(t, n, int64(1), "%s applied at most once", id)
		applied += n
	}
	require.EqualValues(t, 0, balance(t, victim), "no bad message moved money")
	require.EqualValues(t, applied, balance(t, canary))
	if rec.Count(idem.OutcomeProcessed, "bad-reuse") == 1 {
		require.EqualValues(t, 5, balance(t, reused), "only the original of the reused id applied")
	}
}
