package idem_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
)

func memConsumer(t *testing.T, store *memStore, mod func(*idem.ConsumerConfig[*memTx])) *idem.Consumer[*memTx] {
	t.Helper()
	cfg := idem.ConsumerConfig[*memTx]{
		Name:    "ledger@v1",
		Handler: func(context.Context, *memTx, idem.Message) error { return nil },
		Observe: idem.ObserveConfig{
			Logger: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)),
		},
	}
	if mod != nil {
		mod(&cfg)
	}
	c, err := idem.NewConsumer[*memTx](store, cfg)
	require.NoError(t, err)
	return c
}

func TestHostileIdentitiesAreInvalidPayload(t *testing.T) {
	t.Parallel()
	ok := func(id, tenant, typ string) idem.Message {
		return idem.Message{EventID: id, Tenant: tenant, Type: typ, Payload: []byte(`{"a":1}`)}
	}
	for _, tc := range []struct {
		name    string
		msg     idem.Message
		field   string // "" means the message is valid
		problem string
	}{
		{"plain", ok("evt-1", "acme", "payment.captured"), "", ""},
		{"no tenant, no type", ok("evt-1", "", ""), "", ""},
		{"longest id", ok(strings.Repeat("i", idem.MaxEventIDBytes), strings.Repeat("t", idem.MaxTenantBytes), strings.Repeat("y", idem.MaxTypeBytes)), "", ""},
		{"unicode id", ok("événement-1", "société", "paiement"), "", ""},
		{"empty id", ok("", "acme", "t"), idem.FieldEventID, "is empty"},
		{"blank id", ok("   ", "acme", "t"), idem.FieldEventID, "is blank"},
		{"no-break space id", ok("\u00a0\u2003", "acme", "t"), idem.FieldEventID, "is blank"},
		{"tab-only id", ok("\t", "acme", "t"), idem.FieldEventID, "control character U+0009"},
		{"CR LF id", ok("evt-1\r\nlevel=INFO", "acme", "t"), idem.FieldEventID, "control character U+000D at byte 5"},
		{"NUL id", ok("evt\x001", "acme", "t"), idem.FieldEventID, "control character U+0000"},
		{"escape id", ok("evt\x1b[2J", "acme", "t"), idem.FieldEventID, "control character U+001B"},
		{"DEL id", ok("evt\x7f", "acme", "t"), idem.FieldEventID, "control character U+007F"},
		{"C1 id", ok("evt\u0085", "acme", "t"), idem.FieldEventID, "control character U+0085"},
		{"line separator id", ok("evt\u2028x", "acme", "t"), idem.FieldEventID, "control character U+2028"},
		{"invalid UTF-8 id", ok("evt\xff", "acme", "t"), idem.FieldEventID, "is not valid UTF-8"},
		{"12 KB id", ok(strings.Repeat("x", 12<<10), "acme", "t"), idem.FieldEventID, "is 12288 bytes, over the limit of 1024"},
		{"id one over", ok(strings.Repeat("x", idem.MaxEventIDBytes+1), "acme", "t"), idem.FieldEventID, "over the limit"},
		{"10 KB tenant", ok("evt-1", strings.Repeat("t", 10<<10), "t"), idem.FieldTenant, "is 10240 bytes, over the limit of 256"},
		{"blank tenant", ok("evt-1", " ", "t"), idem.FieldTenant, "is blank"},
		{"NUL tenant", ok("evt-1", "acme\x00", "t"), idem.FieldTenant, "control character U+0000"},
		{"LF tenant", ok("evt-1", "acme\nfake", "t"), idem.FieldTenant, "control character U+000A"},
		{"invalid UTF-8 tenant", ok("evt-1", "\xc3\x28", "t"), idem.FieldTenant, "is not valid UTF-8"},
		{"long type", ok("evt-1", "acme", strings.Repeat("y", idem.MaxTypeBytes+1)), idem.FieldType, "over the limit"},
		{"NUL type", ok("evt-1", "acme", "pay\x00"), idem.FieldType, "control character U+0000"},
		{"blank type", ok("evt-1", "acme", "  "), idem.FieldType, "is blank"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := idem.ValidateIdentity(tc.msg)
			store := newMemStore()
			res := memConsumer(t, store, nil).Process(context.Background(), tc.msg)
			perr := res.Err
			if tc.field == "" {
				require.NoError(t, err)
				require.NoError(t, perr)
				require.Equal(t, idem.OutcomeProcessed, res.Outcome)
				return
			}
			var ie *idem.IdentityError
			require.ErrorAs(t, err, &ie)
			require.Equal(t, tc.field, ie.Field)
			require.Contains(t, ie.Problem, tc.problem)
			require.ErrorIs(t, err, idem.ErrInvalidPayload)

			require.ErrorAs(t, perr, &ie, "Process reports the identity error")
			require.Equal(t, idem.OutcomeFailed, res.Outcome)
			require.Equal(t, idem.ClassPermanent, res.Class)
			require.Equal(t, idem.ReasonInvalidPayload, res.Reason)
			require.False(t, store.claimed(res.Key), "nothing claimed")
			require.LessOrEqual(t, len(perr.Error()), 300, "the error is bounded: %q", perr.Error())
			for _, r := range perr.Error() {
				require.False(t, r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0), "the error is printable: %q", perr.Error())
			}
		})
	}
}

// TestHostileIdentityDeadLetterIsStored runs hostile identities through Run: each becomes an
// invalid_payload dead letter that a store refusing what PostgreSQL refuses accepts, with the
// bounded identity, and the delivery is terminated rather than retried.
func TestHostileIdentityDeadLetterIsStored(t *testing.T) {
	t.Parallel()
	msgs := []idem.Message{
		{EventID: strings.Repeat("x", 12<<10), Tenant: "acme", Payload: []byte(`{}`)},
		{EventID: strings.Repeat("x", 12<<10) + "y", Tenant: "acme", Payload: []byte(`{}`)},
		{EventID: "evt-t", Tenant: strings.Repeat("t", 10<<10), Payload: []byte(`{}`)},
		{EventID: "evt\x00nul", Tenant: "acme", Type: "t\x00", Payload: []byte(`{}`), Headers: map[string]string{"X-Trace\x00": "a\x00b", "Ok": "fine"}},
	}
	store := newMemStore()
	var logs bytes.Buffer
	c := memConsumer(t, store, func(cfg *idem.ConsumerConfig[*memTx]) {
		cfg.Observe.Logger = slog.New(slog.NewJSONHandler(&syncWriter{w: &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
		cfg.Workers = 1 // in order, so dead letter i is message i
	})
	src := newMemSource(msgs...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, src) }()
	require.Eventually(t, func() bool { return len(store.dls()) == len(msgs) }, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	dls := store.dls()
	seen := map[idem.Fingerprint]bool{}
	for i, dl := range dls {
		require.Equal(t, idem.ReasonInvalidPayload, dl.Reason)
		require.LessOrEqual(t, len(dl.Message.EventID), idem.BoundIDBytes+len("…"))
		require.LessOrEqual(t, len(dl.Message.Tenant), idem.BoundIDBytes+len("…"))
		require.NotContains(t, dl.Message.EventID+dl.Message.Tenant+dl.Message.Type, "\x00")
		require.NotEmpty(t, dl.Message.Headers[idem.HeaderInvalidIdentity])
		require.Len(t, dl.Message.Headers[idem.HeaderEventIDSHA256], 64)
		require.False(t, seen[dl.Fingerprint], "dead letter %d: two hostile messages never share a fingerprint", i)
		seen[dl.Fingerprint] = true
		require.Equal(t, idemtest.SettledTerm, src.Settled(msgs[i].EventID), "terminated, not retried")
	}
	require.Equal(t, msgs[0].EventID[:idem.BoundIDBytes]+"…", dls[0].Message.EventID)
	require.Equal(t, dls[0].Message.EventID, dls[1].Message.EventID, "the bounded forms agree…")
	require.Equal(t, `evt\x00nul`, dls[3].Message.EventID)
	require.Equal(t, `a\x00b`, dls[3].Message.Headers[`X-Trace\x00`])
	require.Equal(t, "fine", dls[3].Message.Headers["Ok"])
	require.Zero(t, src.Naks())
	require.Less(t, logs.Len(), 16<<10, "no log line carries a whole hostile identity")
}

// syncWriter serialises a logger's writes into w.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

func TestBoundID(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 100)
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"evt-1", "evt-1"},
		{"événement", "événement"},
		{`a"b\c`, `a\"b\\c`},
		{"a\nb\rc\td", `a\nb\rc\td`},
		{"nul\x00", `nul\x00`},
		{"esc\x1b[2J", `esc\x1b[2J`},
		{"del\x7f", `del\x7f`},
		{"c1\u0085", `c1\u0085`},
		{"bidi\u202e", `bidi\u202e`},
		{"bad\xff\xfe", `bad\xff\xfe`},
		{strings.Repeat("a", 64), strings.Repeat("a", 64)},
		{long, strings.Repeat("a", 64) + "…"},
		{strings.Repeat("\x00", 40), strings.Repeat(`\x00`, 16) + "…"},
		{strings.Repeat("é", 40), strings.Repeat("é", 32) + "…"},
		{strings.Repeat("a", 63) + "é", strings.Repeat("a", 63) + "…"},
	} {
		got := idem.BoundID(tc.in)
		require.Equal(t, tc.want, got, "BoundID(%q)", tc.in)
		require.LessOrEqual(t, len(strings.TrimSuffix(got, "…")), idem.BoundIDBytes)
	}
}

// TestErrorShape: every error the consumer reports about a delivery ends with the event id once,
// as ` (event "id")`, in its bounded form, and the text names it nowhere else.
func TestErrorShape(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	handlerErr := errors.New("upstream 503")
	c := memConsumer(t, store, func(cfg *idem.ConsumerConfig[*memTx]) {
		cfg.Handler = func(ctx context.Context, tx *memTx, msg idem.Message) error {
			switch msg.Type {
			case "fail":
				return handlerErr
			case "permanent":
				return idem.Permanent(errors.New("card declined"))
			case "panic":
				panic("boom")
			}
			return nil
		}
		cfg.Input.Validator = idem.ValidatorFunc(func(ctx context.Context, msg idem.Message) error {
			if msg.Type == "invalid" {
				return errors.New("schema: amount is required")
			}
			return nil
		})
		cfg.Input.Authenticator = idem.AuthenticatorFunc(func(ctx context.Context, msg *idem.Message) error {
			if msg.Type == "forged" {
				return errors.New("bad signature")
			}
			return nil
		})
	})
	ctx := context.Background()
	msg := func(id, typ, payload string) idem.Message {
		return idem.Message{EventID: id, Tenant: "acme", Type: typ, Payload: []byte(payload)}
	}
	err := c.Process(ctx, msg("evt-k", "ok", `{"a":1}`)).Err
	require.NoError(t, err)
	long := strings.Repeat("L", idem.MaxEventIDBytes)
	for _, tc := range []struct {
		name string
		msg  idem.Message
		is   error
	}{
		{"handler error", msg("evt-1", "fail", `{}`), handlerErr},
		{"permanent", msg("evt-2", "permanent", `{}`), nil},
		{"panic", msg("evt-3", "panic", `{}`), nil},
		{"validator", msg("evt-4", "invalid", `{}`), idem.ErrInvalidPayload},
		{"authenticator", msg("evt-5", "forged", `{}`), idem.ErrUnauthenticated},
		{"key reuse", msg("evt-k", "ok", `{"a":2}`), idem.ErrKeyReuse},
		{"duplicate keys", msg("evt-7", "ok", `{"a":1,"a":2}`), idem.ErrInvalidPayload},
		{"not JSON", msg("evt-6", "ok", `{"a":`), idem.ErrInvalidPayload},
		{"too old", idem.Message{EventID: "evt-8", Payload: []byte(`{}`), OccurredAt: time.Now().Add(-30 * 24 * time.Hour)}, idem.ErrTooOld},
		{"long id", msg(long, "fail", `{}`), handlerErr},
		{"hostile id", msg("evt\n\"9\"\x00", "ok", `{}`), idem.ErrInvalidPayload},
		{"12 KB id", msg(strings.Repeat("x", 12<<10), "ok", `{}`), idem.ErrInvalidPayload},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := c.Process(ctx, tc.msg)
			err := res.Err
			require.Error(t, err)
			require.Equal(t, err, res.Err)
			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			}
			text := err.Error()
			suffix := ` (event "` + idem.BoundID(tc.msg.EventID) + `")`
			require.True(t, strings.HasSuffix(text, suffix), "%q ends with %q", text, suffix)
			require.Equal(t, 1, strings.Count(text, `(event "`), "the event is named once: %q", text)
			body := strings.TrimSuffix(text, suffix)
			if len(tc.msg.EventID) >= 4 {
				require.NotContains(t, body, idem.BoundID(tc.msg.EventID), "the id appears only in the suffix: %q", text)
			}
			require.Less(t, len(text), 400, "bounded: %q", text)
		})
	}
}
