package idemwebhook

import (
	"bytes"
	"context"
	"crypto/sha256"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemauth"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/wire"
)

// idemFixture is an Idem verifier over a producer key of tenant "acme" and an operator's replay
// key, on the real clock (the consumer's retention is measured on it too).
type idemFixture struct {
	v        *Idem
	producer idemauth.Key
	replay   *idemauth.ReplaySigner
}

func newIdemFixture(t *testing.T) idemFixture {
	t.Helper()
	producer := idemauth.Key{ID: "acme-1", Tenant: "acme", Secret: bytes.Repeat([]byte{7}, 32)}
	rk := idemauth.ReplayKey{ID: "ops-1", Secret: bytes.Repeat([]byte{5}, 32)}
	ring, err := idemauth.NewKeyring(producer)
	require.NoError(t, err)
	av, err := idemauth.NewVerifier(ring, idemauth.VerifierConfig{ReplayKeys: []idemauth.ReplayKey{rk}})
	require.NoError(t, err)
	v, err := NewIdem(av)
	require.NoError(t, err)
	rs, err := idemauth.NewReplaySigner(rk, nil)
	require.NoError(t, err)
	return idemFixture{v: v, producer: producer, replay: rs}
}

// request is what an idemhttp sink POSTs for msg: its headers as they are, plus the Idem-* ones.
func idemRequest(msg idem.Message) *http.Request {
	h := map[string]string{idemhttp.HeaderEventID: msg.EventID, idemhttp.HeaderTenant: msg.Tenant, idemhttp.HeaderType: msg.Type}
	if !msg.OccurredAt.IsZero() {
		h[idemhttp.HeaderOccurredAt] = msg.OccurredAt.UTC().Format(time.RFC3339Nano)
	}
	for k, v := range msg.Headers {
		h[k] = v
	}
	return post(string(msg.Payload), h)
}

// signed is a producer-signed message made at signedAt.
func (f idemFixture) signed(t *testing.T, signedAt time.Time) idem.Message {
	t.Helper()
	msg := idem.Message{EventID: "e-1", Type: "payment.captured", Payload: []byte(`{"do":"ok"}`), OccurredAt: signedAt.Add(-time.Minute)}
	require.NoError(t, idemauth.SignMessage(f.producer, &msg, signedAt))
	return msg
}

// replayed is msg as an operator replays it: replay headers, then the replay signature.
func (f idemFixture) replayed(t *testing.T, msg idem.Message, eventTime time.Time) idem.Message {
	t.Helper()
	h := map[string]string{}
	for k, v := range msg.Headers {
		h[k] = v
	}
	h[idem.HeaderReplayOf] = "41"
	h[idem.HeaderReplayedBy] = "alice"
	h[idem.HeaderReplayEventTime] = eventTime.UTC().Format(time.RFC3339Nano)
	msg.Headers = h
	require.NoError(t, f.replay.SignReplay(context.Background(), &msg))
	return msg
}

// seenHeaders records the headers of every message the consumer's handler sees.
func seenHeaders(seen *[]map[string]string) func(*idem.ConsumerConfig[*fakeTx], *Config) {
	return func(cc *idem.ConsumerConfig[*fakeTx], _ *Config) {
		cc.Handler = func(ctx context.Context, tx *fakeTx, msg idem.Message) error {
			*seen = append(*seen, msg.Headers)
			return effectHandler(ctx, tx, msg)
		}
	}
}

func replayHeaders(h map[string]string) []string {
	var out []string
	for k := range h {
		if strings.HasPrefix(k, wire.ReplayPrefix) {
			out = append(out, k)
		}
	}
	return out
}

// F1 and F2: replay headers decide the outcome only under a replay signature that verified, and
// such a replay verifies.
func TestIdemReplayHeaders(t *testing.T) {
	f := newIdemFixture(t)
	now := time.Now()
	cases := []struct {
		name       string
		req        func() *http.Request
		status     int
		keptReplay bool
	}{
		{name: "fresh, unsigned replay headers claiming 1970 are dropped", req: func() *http.Request {
			r := idemRequest(f.signed(t, now))
			r.Header.Set(idem.HeaderReplayEventTime, "1970-01-01T00:00:00Z")
			r.Header.Set(idem.HeaderReplayOf, "7")
			r.Header.Set(idem.HeaderReplayedBy, "mallory")
			return r
		}, status: 200},
		{name: "stale producer signature, signed replay verifies and keeps its headers", req: func() *http.Request {
			return idemRequest(f.replayed(t, f.signed(t, now.Add(-2*time.Hour)), now.Add(-2*time.Hour)))
		}, status: 200, keptReplay: true},
		{name: "signed replay with an edited replay header", req: func() *http.Request {
			r := idemRequest(f.replayed(t, f.signed(t, now.Add(-2*time.Hour)), now.Add(-2*time.Hour)))
			r.Header.Set(idem.HeaderReplayEventTime, "1970-01-01T00:00:00Z")
			return r
		}, status: 401},
		{name: "signed replay under another tenant", req: func() *http.Request {
			r := idemRequest(f.replayed(t, f.signed(t, now.Add(-2*time.Hour)), now.Add(-2*time.Hour)))
			r.Header.Set(idemhttp.HeaderTenant, "globex")
			return r
		}, status: 401},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var seen []map[string]string
			b := setup(t, f.v, seenHeaders(&seen))
			w := serve(b.h, tc.req())
			require.Equal(t, tc.status, w.Code, w.Body.String())
			effects, _, dls := b.store.snapshot()
			require.Empty(t, dls)
			if tc.status != 200 {
				require.Empty(t, effects)
				return
			}
			require.Equal(t, []string{"acme/e-1"}, effects)
			require.Len(t, seen, 1)
			if tc.keptReplay {
				require.Equal(t, "41", seen[0][idem.HeaderReplayOf])
				require.NotEmpty(t, seen[0][idemauth.HeaderReplaySignature])
			} else {
				require.Empty(t, replayHeaders(seen[0]), "unsigned replay headers never reach the consumer")
			}
		})
	}
}

// F2 at the verifier: the tenant of a replay is the one its replay signature covers.
func TestIdemVerifyReplay(t *testing.T) {
	f := newIdemFixture(t)
	now := time.Now()
	msg := f.replayed(t, f.signed(t, now.Add(-2*time.Hour)), now.Add(-2*time.Hour))
	got, err := f.v.Verify(idemRequest(msg), msg.Payload)
	require.NoError(t, err)
	require.Equal(t, "acme", got.Tenant)
	require.True(t, got.Replay)
	require.Equal(t, "e-1", got.EventID)

	got, err = f.v.Verify(idemRequest(f.signed(t, now)), msg.Payload)
	require.NoError(t, err)
	require.False(t, got.Replay, "a producer signature alone is not a replay")
}

// F-DL: a request that fails verification is answered 401, counted and logged, and never stored.
func TestHandlerUnauthenticatedNotStored(t *testing.T) {
	body := `{"do":"ok","pad":"` + strings.Repeat("x", 4096) + `"}`
	cases := []struct {
		name string
		req  func() *http.Request
		want error
	}{
		{name: "wrong key", req: func() *http.Request { return ghRequest(body, "d-1", keyOther) }, want: ErrBadSignature},
		{name: "not signed", req: func() *http.Request {
			r := ghRequest(body, "d-1", keyAcme)
			r.Header.Del(HeaderGitHubSignature)
			return r
		}, want: ErrNotSigned},
		{name: "malformed", req: func() *http.Request {
			r := ghRequest(body, "d-1", keyAcme)
			r.Header.Set(HeaderGitHubSignature, "sha256=zz")
			return r
		}, want: ErrMalformedSignature},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obs := &recordingObserver{}
			b := setup(t, githubVerifier(t), func(cc *idem.ConsumerConfig[*fakeTx], _ *Config) { cc.Observe.Observer = obs })
			w := serve(b.h, tc.req())
			require.Equal(t, http.StatusUnauthorized, w.Code)
			require.Contains(t, w.Header().Get("WWW-Authenticate"), `realm="github"`)
			p := decodeProblem(t, w)
			require.Equal(t, string(idem.ReasonUnauthenticated), p.Reason)
			require.Equal(t, "signature verification failed: "+tc.want.Error(), p.Detail)
			effects, claims, dls := b.store.snapshot()
			require.Empty(t, effects)
			require.Zero(t, claims)
			require.Empty(t, dls, "unauthenticated input is not stored")
			require.Len(t, obs.events, 1, "but it is counted")
			require.Equal(t, idem.OutcomeFailed, obs.events[0].Outcome)
			require.Equal(t, idem.ReasonUnauthenticated, obs.events[0].Reason)
			require.Empty(t, obs.events[0].Tenant)
			require.Contains(t, b.logs.String(), "signature refused")
			require.NotContains(t, b.logs.String(), "xxxxxxxx", "the body is not logged")
		})
	}
}

// F5: the line and paragraph separators are refused (or replaced) like control characters.
func TestIdentityCharacters(t *testing.T) {
	cases := []struct {
		name string
		id   string
		ok   bool
	}{
		{"plain", "evt_1", true},
		{"non-ASCII letters", "évt-ü", true},
		{"NUL", "e\x00", false},
		{"newline", "e\n1", false},
		{"NEL (C1)", "e\u00851", false},
		{"line separator", "e\u20281", false},
		{"paragraph separator", "e\u20291", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := checkEventID(tc.id, "id")
			bound := boundID(tc.id)
			if tc.ok {
				require.NoError(t, err)
				require.Equal(t, tc.id, bound)
				return
			}
			require.ErrorIs(t, err, idem.ErrInvalidPayload)
			require.NotEqual(t, tc.id, bound, "the bounded form replaces it")
			require.NoError(t, checkEventID(bound, "bounded id"))
		})
	}
}

// F6: a configured tenant must be a valid identity.
func TestSecretTenantIsIdentity(t *testing.T) {
	cases := []struct {
		name   string
		tenant string
		ok     bool
	}{
		{"plain", "acme", true},
		{"blank", "   ", false},
		{"newline", "acme\nglobex", false},
		{"line separator", "acme\u2028", false},
		{"not UTF-8", "acme\xff", false},
		{"too long", strings.Repeat("a", idem.MaxTenantBytes+1), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			secrets := []Secret{{Tenant: tc.tenant, Key: keyAcme}}
			for name, build := range map[string]func() error{
				"stripe": func() error { _, err := NewStripe(StripeConfig{Secrets: secrets}); return err },
				"github": func() error { _, err := NewGitHub(GitHubConfig{Secrets: secrets}); return err },
				"qstash": func() error { _, err := NewQStash(QStashConfig{Secrets: secrets, URL: qstashURL}); return err },
			} {
				err := build()
				if tc.ok {
					require.NoError(t, err, name)
					continue
				}
				require.Error(t, err, name)
				require.Contains(t, err.Error(), "Secrets[0]: Tenant", name)
			}
		})
	}
}

// tenantVerifier is a custom Verifier that verifies everything and reports tenant.
type tenantVerifier struct {
	tenant string
	err    error
}

func (v tenantVerifier) Provider() Provider {
	return Provider{Name: "custom", StopStatus: http.StatusBadRequest}
}

func (v tenantVerifier) Verify(*http.Request, []byte) (Verified, error) {
	return Verified{EventID: "e-1", Tenant: v.tenant}, v.err
}

// F7: a verifier that reports no (or no valid) tenant has not verified anything the ingress can
// use.
func TestHandlerRefusesVerifierWithoutTenant(t *testing.T) {
	cases := []struct {
		name   string
		v      tenantVerifier
		status int
		dls    int
	}{
		{name: "tenant set", v: tenantVerifier{tenant: "acme"}, status: 200},
		{name: "empty tenant", v: tenantVerifier{}, status: 401},
		{name: "tenant with a newline", v: tenantVerifier{tenant: "acme\n"}, status: 401},
		{name: "invalid payload, tenant set", v: tenantVerifier{tenant: "acme", err: invalid("no id")}, status: 400, dls: 1},
		{name: "invalid payload, empty tenant", v: tenantVerifier{err: invalid("no id")}, status: 401},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t, tc.v, nil)
			w := serve(b.h, post(`{"do":"ok"}`, nil))
			require.Equal(t, tc.status, w.Code, w.Body.String())
			effects, _, dls := b.store.snapshot()
			require.Len(t, dls, tc.dls)
			if tc.status == 200 {
				require.Equal(t, []string{"acme/e-1"}, effects)
				return
			}
			require.Empty(t, effects)
			if tc.status == 401 {
				require.Contains(t, b.logs.String(), "tenant")
			}
		})
	}
}

// One HMAC key for two tenants is refused however it is spelled: HMAC pads a key with zero bytes
// and hashes one longer than its block, so these secrets sign alike.
func TestSecretsHMACEquivalentRefused(t *testing.T) {
	long := bytes.Repeat([]byte("k"), 65)
	sum := sha256.Sum256(long)
	cases := []struct {
		name string
		a, b []byte
	}{
		{"same bytes", keyAcme, keyAcme},
		{"trailing zero bytes", keyAcme, append(append([]byte(nil), keyAcme...), 0, 0)},
		{"a long key and its SHA-256", long, sum[:]},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewGitHub(GitHubConfig{Secrets: []Secret{{Tenant: "acme", Key: tc.a}, {Tenant: "globex", Key: tc.b}}})
			require.ErrorContains(t, err, "the same Key as Secrets[0] for another tenant")
			_, err = NewGitHub(GitHubConfig{Secrets: []Secret{{Tenant: "acme", Key: tc.a}, {Tenant: "acme", Key: tc.b}}})
			require.NoError(t, err, "one tenant may list one key twice (a rotation)")
		})
	}
}
