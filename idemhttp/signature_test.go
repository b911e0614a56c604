package idemhttp_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

var sampleRequest = idemhttp.SignedRequest{Method: "POST", Target: "/hooks/payments", IdempotencyKey: "acme:pay-1", EventID: "pay-1",
	Tenant: "acme", Type: "payment.captured", OccurredAt: "2025-03-01T11:59:00Z", Body: []byte(`{"amount":5}`)}

func TestVerify(t *testing.T) {
	t.Parallel()
	secret := []byte("s3cret-of-at-least-32-random-bytes")
	req := sampleRequest
	at := time.Unix(1740830400, 0)
	good := idemhttp.Sign(secret, "", at, req)
	h1 := strings.TrimPrefix(good[strings.Index(good, "h1="):], "h1=")
	withKID := idemhttp.Sign(secret, "k1", at, req)
	h1kid := withKID[strings.Index(withKID, "h1=")+3:]
	other := idemhttp.Sign([]byte("old-key-of-at-least-32-random-bytes"), "", at, req)
	ts := strconv.FormatInt(at.Unix(), 10)
	change := func(f func(r *idemhttp.SignedRequest)) idemhttp.SignedRequest {
		r := req
		f(&r)
		return r
	}
	for _, tc := range []struct {
		name      string
		secret    []byte
		header    string
		req       idemhttp.SignedRequest
		now       time.Time
		tolerance time.Duration
		want      string // substring of the error; empty means valid
	}{
		{"valid", secret, good, req, at, time.Minute, ""},
		{"valid with kid", secret, withKID, req, at, time.Minute, ""},
		{"valid with blanks and unknown fields", secret, " t=" + ts + " , x=y , h1=" + h1, req, at, time.Minute, ""},
		{"rotation: one of two signatures", secret, other + ",h1=" + h1, req, at, time.Minute, ""},
		{"within tolerance", secret, good, req, at.Add(59 * time.Second), time.Minute, ""},
		{"default tolerance", secret, good, req, at.Add(4 * time.Minute), 0, ""},
		{"wrong secret", []byte("wrong-secret-of-at-least-32-bytes"), good, req, at, time.Minute, "no h1 signature matches"},
		{"tampered body", secret, good, change(func(r *idemhttp.SignedRequest) { r.Body = []byte(`{"amount":500}`) }), at, time.Minute, "no h1 signature matches"},
		{"new idempotency key", secret, good, change(func(r *idemhttp.SignedRequest) { r.IdempotencyKey = "acme:pay-2" }), at, time.Minute, "no h1 signature matches"},
		{"other tenant", secret, good, change(func(r *idemhttp.SignedRequest) { r.Tenant = "globex" }), at, time.Minute, "no h1 signature matches"},
		{"other event id", secret, good, change(func(r *idemhttp.SignedRequest) { r.EventID = "pay-2" }), at, time.Minute, "no h1 signature matches"},
		{"other type", secret, good, change(func(r *idemhttp.SignedRequest) { r.Type = "payment.refunded" }), at, time.Minute, "no h1 signature matches"},
		{"other occurrence time", secret, good, change(func(r *idemhttp.SignedRequest) { r.OccurredAt = "2025-02-28T11:59:00Z" }), at, time.Minute, "no h1 signature matches"},
		{"other path", secret, good, change(func(r *idemhttp.SignedRequest) { r.Target = "/hooks/refunds" }), at, time.Minute, "no h1 signature matches"},
		{"other method", secret, good, change(func(r *idemhttp.SignedRequest) { r.Method = "PUT" }), at, time.Minute, "no h1 signature matches"},
		{"kid swapped", secret, "t=" + ts + ",kid=k2,h1=" + h1kid, req, at, time.Minute, "no h1 signature matches"},
		{"old timestamp (replay)", secret, good, req, at.Add(10 * time.Minute), time.Minute, "beyond the tolerance"},
		{"old beyond default tolerance", secret, good, req, at.Add(6 * time.Minute), 0, "beyond the tolerance of 5m0s"},
		{"future timestamp", secret, good, req, at.Add(-10 * time.Minute), time.Minute, "beyond the tolerance"},
		{"timestamp not signed", secret, "t=" + strconv.FormatInt(at.Unix()+1, 10) + ",h1=" + h1, req, at, time.Minute, "no h1 signature matches"},
		{"empty secret", nil, good, req, at, time.Minute, "secret is empty"},
		{"missing header", secret, "", req, at, time.Minute, "header is missing"},
		{"no timestamp", secret, "h1=" + h1, req, at, time.Minute, "no timestamp"},
		{"two timestamps", secret, "t=" + ts + ",t=" + ts + ",h1=" + h1, req, at, time.Minute, "more than one t"},
		{"two kids", secret, "t=" + ts + ",kid=a,kid=b,h1=" + h1, req, at, time.Minute, "more than one kid"},
		{"no signature", secret, "t=" + ts, req, at, time.Minute, "no h1 signature"},
		{"a broker or old body-only signature", secret, "t=" + ts + ",v1=" + h1, req, at, time.Minute, "v1/v2 is a broker signature"},
		{"signed timestamp", secret, "t=+" + ts + ",h1=" + h1, req, at, time.Minute, "not unix seconds"},
		{"leading zero", secret, "t=0" + ts + ",h1=" + h1, req, at, time.Minute, "not unix seconds"},
		{"huge timestamp", secret, "t=99999999999999999999,h1=" + h1, req, at, time.Minute, "not unix seconds"},
		{"short h1", secret, "t=" + ts + ",h1=abcd", req, at, time.Minute, "hex-encoded"},
		{"not key=value", secret, "t=" + ts + ",garbage,h1=" + h1, req, at, time.Minute, "not key=value"},
		{"too long", secret, good + strings.Repeat(",x=y", 2000), req, at, time.Minute, "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := idemhttp.VerifyHeader(tc.secret, tc.header, tc.req, tc.now, tc.tolerance)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, idem.ErrUnauthenticated)
			require.ErrorContains(t, err, tc.want)
			require.Equal(t, idem.ClassPermanent, idem.Classify(err))
		})
	}
}

// TestSignFormat pins the MAC input to its documentation with an independent implementation.
func TestSignFormat(t *testing.T) {
	t.Parallel()
	got := idemhttp.Sign([]byte("key"), "k7", time.Unix(1700000000, 0), sampleRequest)
	m := hmac.New(sha256.New, []byte("key"))
	sum := sha256.Sum256(sampleRequest.Body)
	for _, f := range []string{"idem-http-signature-h1", "1700000000", "k7", "POST", "/hooks/payments", "acme:pay-1", "pay-1", "acme",
		"payment.captured", "2025-03-01T11:59:00Z", string(sum[:])} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		m.Write(n[:])
		m.Write([]byte(f))
	}
	require.Equal(t, "t=1700000000,kid=k7,h1="+hex.EncodeToString(m.Sum(nil)), got)
	require.Equal(t, "k7", idemhttp.SignatureKeyID(got))
	require.Empty(t, idemhttp.SignatureKeyID(idemhttp.Sign([]byte("key"), "", time.Unix(1, 0), sampleRequest)))
}

// TestIdempotencyKeyUnambiguous (finding 8): tenant and event id are escaped so that ':' only
// separates them. Before, ("acme:eu", "42") and ("acme", "eu:42") both sent "acme:eu:42".
func TestIdempotencyKeyUnambiguous(t *testing.T) {
	t.Parallel()
	require.NotEqual(t, idemhttp.IdempotencyKey("acme:eu", "42"), idemhttp.IdempotencyKey("acme", "eu:42"))
	require.Equal(t, "acme:pay-1", idemhttp.IdempotencyKey("acme", "pay-1"), "plain ids read as before")
	seen := map[string][2]string{}
	parts := []string{"", ":", "a", "a:", ":a", "a:b", "%3A", "+", " ", "%", "a b", "é"}
	for _, tenant := range parts {
		for _, id := range parts {
			k := idemhttp.IdempotencyKey(tenant, id)
			require.Equal(t, 1, strings.Count(k, ":"), k)
			if prev, ok := seen[k]; ok {
				t.Fatalf("%q and %q both encode to %q", prev, [2]string{tenant, id}, k)
			}
			seen[k] = [2]string{tenant, id}
		}
	}
}

// FuzzVerify checks that VerifyHeader never panics, refuses with ErrUnauthenticated, accepts what
// Sign produced, and never accepts a header for another body or idempotency key.
func FuzzVerify(f *testing.F) {
	f.Add([]byte("secret-of-at-least-32-random-bytes"), "t=1700000000,h1=00", []byte("{}"), "acme:e", int64(1700000000))
	f.Add([]byte("k"), "", []byte(nil), "", int64(0))
	f.Add([]byte("k"), "t=1,kid=a,h1=zz,h1=", []byte("x"), "x", int64(1))
	f.Fuzz(func(t *testing.T, secret []byte, header string, body []byte, key string, unix int64) {
		if unix < 0 || unix > 1<<40 {
			unix = 1700000000
		}
		now := time.Unix(unix, 0)
		req := idemhttp.SignedRequest{Method: "POST", Target: "/h", IdempotencyKey: key, Body: body}
		err := idemhttp.VerifyHeader(secret, header, req, now, time.Minute)
		if err != nil && !errors.Is(err, idem.ErrUnauthenticated) {
			t.Fatalf("error does not wrap ErrUnauthenticated: %v", err)
		}
		if err == nil && len(secret) < idemhttp.SecretMinBytes {
			t.Fatalf("verified with a %d-byte secret", len(secret))
		}
		if err == nil {
			other := req
			other.Body = append(append([]byte(nil), body...), '!')
			if idemhttp.VerifyHeader(secret, header, other, now, time.Minute) == nil {
				t.Fatalf("header %q verifies two bodies", header)
			}
			other = req
			other.IdempotencyKey += "!"
			if idemhttp.VerifyHeader(secret, header, other, now, time.Minute) == nil {
				t.Fatalf("header %q verifies two idempotency keys", header)
			}
		}
		if len(secret) < idemhttp.SecretMinBytes {
			return
		}
		signed := idemhttp.Sign(secret, "", now, req)
		if err := idemhttp.VerifyHeader(secret, signed, req, now, time.Minute); err != nil {
			t.Fatalf("Sign output %q does not verify: %v", signed, err)
		}
	})
}
