package idemhttp_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

var goodSecret = []byte("0123456789abcdef0123456789abcdef") // SecretMinBytes long

// signedHTTPRequest builds the request the sink would send for sampleRequest, signed at at.
func signedHTTPRequest(t *testing.T, secret []byte, at time.Time) *http.Request {
	t.Helper()
	r := httptest.NewRequest(sampleRequest.Method, "http://hooks.example.com"+sampleRequest.Target, bytes.NewReader(sampleRequest.Body))
	r.Header.Set(idemhttp.HeaderIdempotencyKey, sampleRequest.IdempotencyKey)
	r.Header.Set(idemhttp.HeaderEventID, sampleRequest.EventID)
	r.Header.Set(idemhttp.HeaderTenant, sampleRequest.Tenant)
	r.Header.Set(idemhttp.HeaderType, sampleRequest.Type)
	r.Header.Set(idemhttp.HeaderOccurredAt, sampleRequest.OccurredAt)
	r.Header.Set(idemhttp.SignatureHeaderDefault, idemhttp.Sign(secret, "k1", at, idemhttp.RequestOf(r, sampleRequest.Body)))
	return r
}

// TestVerifyRefusesRepeatedSignedHeader (H1): the signature covers one value of each signed
// header; a second value (which a receiver reading the last, or all, values would act on) is
// ambiguous, and Verify refuses it rather than vouch for the first only.
func TestVerifyRefusesRepeatedSignedHeader(t *testing.T) {
	t.Parallel()
	at := time.Unix(1740830400, 0)
	tests := []struct {
		name   string
		header string // repeated with a second value; empty means none
		second string
	}{
		{"no repetition", "", ""},
		{"tenant", idemhttp.HeaderTenant, "globex"},
		{"event id", idemhttp.HeaderEventID, "pay-2"},
		{"idempotency key", idemhttp.HeaderIdempotencyKey, "globex:pay-1"},
		{"type", idemhttp.HeaderType, "payment.refunded"},
		{"occurred at", idemhttp.HeaderOccurredAt, "2020-01-01T00:00:00Z"},
		{"signature", idemhttp.SignatureHeaderDefault, "t=1,h1=00"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := signedHTTPRequest(t, goodSecret, at)
			if tt.header == "" {
				require.NoError(t, idemhttp.Verify(goodSecret, r, sampleRequest.Body, at, time.Minute))
				return
			}
			r.Header.Add(tt.header, tt.second)
			err := idemhttp.Verify(goodSecret, r, sampleRequest.Body, at, time.Minute)
			require.ErrorIs(t, err, idem.ErrUnauthenticated)
			require.ErrorContains(t, err, tt.header)
			require.ErrorContains(t, err, "more than one value")
		})
	}
}

// TestShortSecretRefused (H2): a secret shorter than SecretMinBytes is guessable offline from one
// signed request; VerifyHeader and NewSink refuse it, naming the length, not the secret.
func TestShortSecretRefused(t *testing.T) {
	t.Parallel()
	at := time.Unix(1740830400, 0)
	tests := []struct {
		name   string
		secret []byte
		ok     bool
	}{
		{"1 byte", []byte("k"), false},
		{"31 bytes", goodSecret[:31], false},
		{"32 bytes", goodSecret, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := idemhttp.VerifyHeader(tt.secret, idemhttp.Sign(tt.secret, "", at, sampleRequest), sampleRequest, at, time.Minute)
			s, serr := idemhttp.NewSink(idemhttp.SinkConfig{BaseURL: "https://hooks.example.com", Secret: tt.secret})
			if tt.ok {
				require.NoError(t, err)
				require.NoError(t, serr)
				require.NoError(t, s.Close())
				return
			}
			require.ErrorIs(t, err, idem.ErrUnauthenticated)
			require.ErrorContains(t, err, "want at least 32")
			require.ErrorContains(t, serr, "Secret has")
			require.ErrorContains(t, serr, "want at least 32")
			require.NotContains(t, serr.Error(), string(goodSecret[:8]))
		})
	}
}

// TestSignatureBindsTenant (H3): the sink's one secret signs events of every tenant, and the
// Idem-Tenant header is part of the signed input, so a request cannot be moved to another tenant.
func TestSignatureBindsTenant(t *testing.T) {
	t.Parallel()
	at := time.Unix(1740830400, 0)
	r := signedHTTPRequest(t, goodSecret, at)
	r.Header.Set(idemhttp.HeaderTenant, "globex")
	require.ErrorIs(t, idemhttp.Verify(goodSecret, r, sampleRequest.Body, at, time.Minute), idem.ErrUnauthenticated)
	r.Header.Del(idemhttp.HeaderTenant)
	require.ErrorIs(t, idemhttp.Verify(goodSecret, r, sampleRequest.Body, at, time.Minute), idem.ErrUnauthenticated)
}
