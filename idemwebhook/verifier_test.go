package idemwebhook

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemauth"
	"github.com/idemkit/idem/idemhttp"
)

var (
	t0        = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	keyAcme   = []byte("whsec_acme_0123456789abcdefghijkl")
	keyAcme2  = []byte("whsec_acme_rolled_0123456789abcdef")
	keyGlobex = []byte("whsec_globex_0123456789abcdefghij")
	keyOther  = []byte("whsec_someone_else_0123456789abcd")
	qstashURL = "https://hooks.example.com/qstash"
)

func fixedNow() time.Time { return t0 }

// verifyCase is one request against one verifier: want is the error reason (nil for success),
// tenant the tenant a success must report.
type verifyCase struct {
	name   string
	req    func() *http.Request
	want   error
	tenant string
	id     string
}

func post(body string, headers map[string]string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/hook", strings.NewReader(body))
	for k, v := range headers {
		r.Header.Set(k, v)
	}
	return r
}

func runVerify(t *testing.T, v Verifier, cases []verifyCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.req()
			body := new(bytes.Buffer)
			_, _ = body.ReadFrom(r.Body)
			got, err := v.Verify(r, body.Bytes())
			if tc.want == nil {
				require.NoError(t, err)
				require.Equal(t, tc.tenant, got.Tenant)
				require.Equal(t, tc.id, got.EventID)
				return
			}
			require.ErrorIs(t, err, tc.want)
			if !errors.Is(tc.want, idem.ErrInvalidPayload) {
				require.ErrorIs(t, err, idem.ErrUnauthenticated)
				require.Empty(t, got.Tenant, "a refused request has no tenant")
			}
			require.Equal(t, tc.id, got.EventID, "the claimed event id is reported for the dead letter")
			for _, k := range [][]byte{keyAcme, keyAcme2, keyGlobex, keyOther} {
				require.NotContains(t, err.Error(), string(k), "no secret in an error")
			}
		})
	}
}

func TestStripeVerify(t *testing.T) {
	v, err := NewStripe(StripeConfig{Secrets: []Secret{{Tenant: "acme", Key: keyAcme}, {Tenant: "acme", Key: keyAcme2}, {Tenant: "globex", Key: keyGlobex}}, Now: fixedNow})
	require.NoError(t, err)
	body := `{"id":"evt_1","type":"payment_intent.succeeded","created":1780315200,"data":{}}`
	signed := func(key []byte, at time.Time, b string) func() *http.Request {
		return func() *http.Request {
			return post(b, map[string]string{HeaderStripeSignature: SignStripe(key, at, []byte(b))})
		}
	}
	runVerify(t, v, []verifyCase{
		{name: "valid", req: signed(keyAcme, t0, body), tenant: "acme", id: "evt_1"},
		{name: "rolled secret", req: signed(keyAcme2, t0, body), tenant: "acme", id: "evt_1"},
		{name: "other tenant's secret decides the tenant", req: signed(keyGlobex, t0.Add(-time.Minute), body), tenant: "globex", id: "evt_1"},
		{name: "several v1, one genuine", req: func() *http.Request {
			h := SignStripe(keyOther, t0, []byte(body)) + "," + strings.SplitN(SignStripe(keyAcme, t0, []byte(body)), ",", 2)[1] + ",v0=00"
			return post(body, map[string]string{HeaderStripeSignature: h})
		}, tenant: "acme", id: "evt_1"},
		{name: "tampered body", req: func() *http.Request {
			return post(strings.Replace(body, "evt_1", "evt_2", 1), map[string]string{HeaderStripeSignature: SignStripe(keyAcme, t0, []byte(body))})
		}, want: ErrBadSignature, id: "evt_2"},
		{name: "tampered timestamp", req: func() *http.Request {
			h := strings.Replace(SignStripe(keyAcme, t0, []byte(body)), "t=1780315200", "t=1780315201", 1)
			return post(body, map[string]string{HeaderStripeSignature: h})
		}, want: ErrBadSignature, id: "evt_1"},
		{name: "stale", req: signed(keyAcme, t0.Add(-6*time.Minute), body), want: ErrStaleSignature, id: "evt_1"},
		{name: "from the future", req: signed(keyAcme, t0.Add(6*time.Minute), body), want: ErrStaleSignature, id: "evt_1"},
		{name: "wrong key", req: signed(keyOther, t0, body), want: ErrBadSignature, id: "evt_1"},
		{name: "not signed", req: func() *http.Request { return post(body, nil) }, want: ErrNotSigned, id: "evt_1"},
		{name: "malformed", req: func() *http.Request { return post(body, map[string]string{HeaderStripeSignature: "t=abc,v1=zz"}) }, want: ErrMalformedSignature, id: "evt_1"},
		{name: "signed but no id", req: signed(keyAcme, t0, `{"type":"x"}`), want: idem.ErrInvalidPayload, tenant: "acme"},
		{name: "signed but not JSON", req: signed(keyAcme, t0, `not json`), want: idem.ErrInvalidPayload, tenant: "acme"},
	})
}

func TestGitHubVerify(t *testing.T) {
	v, err := NewGitHub(GitHubConfig{Secrets: []Secret{{Tenant: "acme", Key: keyAcme}, {Tenant: "globex", Key: keyGlobex}}})
	require.NoError(t, err)
	body := `{"action":"opened","number":7}`
	signed := func(key []byte, b, id string) func() *http.Request {
		return func() *http.Request {
			return post(b, map[string]string{HeaderGitHubSignature: SignGitHub(key, []byte(body)), HeaderGitHubDelivery: id, HeaderGitHubEvent: "pull_request"})
		}
	}
	runVerify(t, v, []verifyCase{
		{name: "valid", req: signed(keyAcme, body, "d-1"), tenant: "acme", id: "d-1"},
		{name: "second secret", req: signed(keyGlobex, body, "d-1"), tenant: "globex", id: "d-1"},
		{name: "upper-case hex", req: func() *http.Request {
			return post(body, map[string]string{HeaderGitHubSignature: "sha256=" + strings.ToUpper(strings.TrimPrefix(SignGitHub(keyAcme, []byte(body)), "sha256=")), HeaderGitHubDelivery: "d-1"})
		}, tenant: "acme", id: "d-1"},
		{name: "tampered body", req: signed(keyAcme, strings.Replace(body, "7", "8", 1), "d-1"), want: ErrBadSignature, id: "d-1"},
		{name: "wrong key", req: signed(keyOther, body, "d-1"), want: ErrBadSignature, id: "d-1"},
		{name: "SHA-1 only", req: func() *http.Request {
			return post(body, map[string]string{"X-Hub-Signature": "sha1=00", HeaderGitHubDelivery: "d-1"})
		}, want: ErrNotSigned, id: "d-1"},
		{name: "malformed", req: func() *http.Request {
			return post(body, map[string]string{HeaderGitHubSignature: "md5=abc", HeaderGitHubDelivery: "d-1"})
		}, want: ErrMalformedSignature, id: "d-1"},
		{name: "no delivery id", req: signed(keyAcme, body, ""), want: idem.ErrInvalidPayload, tenant: "acme"},
	})
}

func qstashClaims(body string, now time.Time) QStashClaims {
	return QStashClaims{Issuer: QStashIssuer, Subject: qstashURL, Expires: now.Add(5 * time.Minute).Unix(), NotBefore: now.Unix(), IssuedAt: now.Unix(), ID: "jwt_1", Body: QStashBodyClaim([]byte(body))}
}

func TestQStashVerify(t *testing.T) {
	v, err := NewQStash(QStashConfig{Secrets: []Secret{{Tenant: "acme", Key: []byte("sig_current_0123456789abcdefgh")}, {Tenant: "acme", Key: []byte("sig_next_0123456789abcdefghijk")}}, URL: qstashURL, Now: fixedNow})
	require.NoError(t, err)
	body := `{"order":"o-1"}`
	cur, next := []byte("sig_current_0123456789abcdefgh"), []byte("sig_next_0123456789abcdefghijk")
	req := func(key []byte, c QStashClaims, b string) func() *http.Request {
		return func() *http.Request {
			return post(b, map[string]string{HeaderQStashSignature: SignQStash(key, c), HeaderQStashMessageID: "msg_1", HeaderQStashRetried: "2"})
		}
	}
	edit := func(f func(*QStashClaims)) QStashClaims { c := qstashClaims(body, t0); f(&c); return c }
	runVerify(t, v, []verifyCase{
		{name: "valid, current key", req: req(cur, qstashClaims(body, t0), body), tenant: "acme", id: "msg_1"},
		{name: "valid, next key", req: req(next, qstashClaims(body, t0), body), tenant: "acme", id: "msg_1"},
		{name: "body claim without padding", req: req(cur, edit(func(c *QStashClaims) { c.Body = strings.TrimRight(c.Body, "=") }), body), tenant: "acme", id: "msg_1"},
		{name: "within clock skew after exp", req: req(cur, qstashClaims(body, t0.Add(-5*time.Minute-20*time.Second)), body), tenant: "acme", id: "msg_1"},
		{name: "tampered body", req: req(cur, qstashClaims(body, t0), `{"order":"o-2"}`), want: ErrClaimMismatch, id: "msg_1"},
		{name: "tampered claims", req: func() *http.Request {
			tok := SignQStash(cur, qstashClaims(body, t0))
			parts := strings.Split(tok, ".")
			other := strings.Split(SignQStash(cur, edit(func(c *QStashClaims) { c.Subject = "https://evil.example.com/" })), ".")
			return post(body, map[string]string{HeaderQStashSignature: parts[0] + "." + other[1] + "." + parts[2], HeaderQStashMessageID: "msg_1"})
		}, want: ErrBadSignature, id: "msg_1"},
		{name: "other destination", req: req(cur, edit(func(c *QStashClaims) { c.Subject = "https://hooks.example.com/other" }), body), want: ErrClaimMismatch, id: "msg_1"},
		{name: "other issuer", req: req(cur, edit(func(c *QStashClaims) { c.Issuer = "Evil" }), body), want: ErrClaimMismatch, id: "msg_1"},
		{name: "stale: expired", req: req(cur, qstashClaims(body, t0.Add(-10*time.Minute)), body), want: ErrStaleSignature, id: "msg_1"},
		{name: "not yet valid", req: req(cur, qstashClaims(body, t0.Add(2*time.Minute)), body), want: ErrStaleSignature, id: "msg_1"},
		{name: "no exp", req: req(cur, edit(func(c *QStashClaims) { c.Expires = 0 }), body), want: ErrStaleSignature, id: "msg_1"},
		{name: "wrong key", req: req([]byte("sig_someone_else_0123456789abc"), qstashClaims(body, t0), body), want: ErrBadSignature, id: "msg_1"},
		{name: "alg none", req: func() *http.Request {
			parts := strings.Split(SignQStash(cur, qstashClaims(body, t0)), ".")
			return post(body, map[string]string{HeaderQStashSignature: "eyJhbGciOiJub25lIn0." + parts[1] + ".", HeaderQStashMessageID: "msg_1"})
		}, want: ErrMalformedSignature, id: "msg_1"},
		{name: "not signed", req: func() *http.Request { return post(body, map[string]string{HeaderQStashMessageID: "msg_1"}) }, want: ErrNotSigned, id: "msg_1"},
		{name: "no message id", req: func() *http.Request {
			return post(body, map[string]string{HeaderQStashSignature: SignQStash(cur, qstashClaims(body, t0))})
		}, want: idem.ErrInvalidPayload, tenant: "acme"},
	})

	r := req(cur, qstashClaims(body, t0), body)()
	got, err := v.Verify(r, []byte(body))
	require.NoError(t, err)
	require.Equal(t, 3, got.Attempt, "Upstash-Retried 2 is the third attempt")
}

// TestQStashPublishedExample checks the parser against the token layout of QStash's published
// example (docs "Request Signing"): same header, same claim names and value shapes.
func TestQStashPublishedExample(t *testing.T) {
	key := []byte("sig_5wKXQ6mPSerYPu6DRqYpA5dDjVZW") // the example key of QStash's own SDK docs
	c := QStashClaims{Issuer: "Upstash", Subject: "https://qstash-remote.requestcatcher.com/test", Expires: 1656580612,
		NotBefore: 1656580312, IssuedAt: 1656580312, ID: "jwt_67kxXD6UBAk7DqU6hzuHMDdXFXfP", Body: "qK78N0k3pNKI8zN62Fq2Gm-_LtWkJk1z9ykio3zZvY4="}
	tok, err := ParseQStashToken(SignQStash(key, c))
	require.NoError(t, err)
	require.Equal(t, c, tok.Claims)
	require.True(t, strings.HasPrefix(tok.SigningInput, "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."), "the header every QStash token starts with")
}

func TestIdemVerify(t *testing.T) {
	secret := bytes.Repeat([]byte{7}, 32)
	ring, err := idemauth.NewKeyring(idemauth.Key{ID: "acme-1", Tenant: "acme", Secret: secret})
	require.NoError(t, err)
	av, err := idemauth.NewVerifier(ring, idemauth.VerifierConfig{Now: fixedNow})
	require.NoError(t, err)
	v, err := NewIdem(av)
	require.NoError(t, err)
	other, err := idemauth.NewKeyring(idemauth.Key{ID: "acme-1", Tenant: "acme", Secret: bytes.Repeat([]byte{9}, 32)})
	require.NoError(t, err)

	body := `{"order":"o-1"}`
	msg := idem.Message{EventID: "e-1", Tenant: "acme", Type: "payment.captured", Payload: []byte(body), OccurredAt: t0.Add(-time.Hour)}
	build := func(ring *idemauth.Keyring, at time.Time, m idem.Message, change func(*http.Request)) func() *http.Request {
		return func() *http.Request {
			k, _ := ring.SigningKey("acme", at)
			sig, err := idemauth.Sign(k, msg, at)
			require.NoError(t, err)
			r := post(string(m.Payload), map[string]string{
				idemauth.HeaderSignature: sig, idemhttp.HeaderEventID: m.EventID, idemhttp.HeaderTenant: m.Tenant,
				idemhttp.HeaderType: m.Type, idemhttp.HeaderOccurredAt: m.OccurredAt.Format(time.RFC3339Nano),
			})
			if change != nil {
				change(r)
			}
			return r
		}
	}
	tampered := msg
	tampered.Payload = []byte(`{"order":"o-2"}`)
	runVerify(t, v, []verifyCase{
		{name: "valid", req: build(ring, t0, msg, nil), tenant: "acme", id: "e-1"},
		{name: "tampered body", req: build(ring, t0, tampered, nil), want: idemauth.ErrBadSignature, id: "e-1"},
		{name: "tampered type", req: build(ring, t0, msg, func(r *http.Request) { r.Header.Set(idemhttp.HeaderType, "refund") }), want: idemauth.ErrBadSignature, id: "e-1"},
		{name: "claims another tenant", req: build(ring, t0, msg, func(r *http.Request) { r.Header.Set(idemhttp.HeaderTenant, "globex") }), want: idemauth.ErrTenantMismatch, id: "e-1"},
		{name: "stale", req: build(ring, t0.Add(-10*time.Minute), msg, nil), want: idemauth.ErrStaleSignature, id: "e-1"},
		{name: "wrong key", req: build(other, t0, msg, nil), want: idemauth.ErrBadSignature, id: "e-1"},
		{name: "not signed", req: build(ring, t0, msg, func(r *http.Request) { r.Header.Del(idemauth.HeaderSignature) }), want: idemauth.ErrNotSigned, id: "e-1"},
		{name: "occurred-at not RFC 3339", req: build(ring, t0, msg, func(r *http.Request) { r.Header.Set(idemhttp.HeaderOccurredAt, "yesterday") }), want: ErrMalformedSignature, id: "e-1"},
	})
	got, err := v.Verify(build(ring, t0, msg, nil)(), []byte(body))
	require.NoError(t, err)
	require.Equal(t, Verified{EventID: "e-1", Tenant: "acme", Type: "payment.captured", OccurredAt: msg.OccurredAt}, got)
}

func TestVerifierConfigErrors(t *testing.T) {
	short := []byte("short")
	cases := []struct {
		name string
		new  func() error
		want []string
	}{
		{"stripe without secrets", func() error { _, err := NewStripe(StripeConfig{}); return err }, []string{"stripe config", "Secrets is empty"}},
		{"stripe short key, no tenant", func() error {
			_, err := NewStripe(StripeConfig{Secrets: []Secret{{Key: short}}, Tolerance: -1})
			return err
		}, []string{"Secrets[0]: Tenant is empty", "Secrets[0]: Key has 5 bytes", "Tolerance is -1ns"}},
		{"github one key for two tenants", func() error {
			_, err := NewGitHub(GitHubConfig{Secrets: []Secret{{Tenant: "a", Key: keyAcme}, {Tenant: "b", Key: keyAcme}}})
			return err
		}, []string{"github config", "Secrets[1]: the same Key as Secrets[0] for another tenant"}},
		{"qstash without URL", func() error {
			_, err := NewQStash(QStashConfig{Secrets: []Secret{{Tenant: "a", Key: keyAcme}}})
			return err
		}, []string{"qstash config", "URL \"\""}},
		{"qstash relative URL", func() error {
			_, err := NewQStash(QStashConfig{Secrets: []Secret{{Tenant: "a", Key: keyAcme}}, URL: "/hook", ClockSkew: -time.Second})
			return err
		}, []string{"URL \"/hook\"", "ClockSkew is -1s"}},
		{"idem without verifier", func() error { _, err := NewIdem(nil); return err }, []string{"verifier is nil"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.new()
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestSecretNeverPrinted(t *testing.T) {
	s := Secret{Tenant: "acme", Key: keyAcme}
	for _, out := range []string{s.String(), s.GoString()} {
		require.NotContains(t, out, string(keyAcme))
		require.Contains(t, out, "REDACTED 33 bytes")
	}
}
