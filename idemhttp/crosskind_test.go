package idemhttp_test

import (
	"bytes"
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemauth"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/wire"
)

// TestSignatureKindsNeverCross makes a broker signature (idemauth, Idem-Signature) and an HTTP
// request signature (idemhttp, Idem-Http-Signature) over the same event with the same secret and
// checks that neither verifier accepts the other's, under either header name: before the rename
// both kinds travelled as Idem-Signature with a "v1" field, so a receiver could take one for the
// other.
func TestSignatureKindsNeverCross(t *testing.T) {
	t.Parallel()
	secret := []byte("one-secret-of-32-bytes-or-more!!")
	at := time.Unix(1740830400, 0)
	key := idemauth.Key{ID: "acme-1", Tenant: "acme", Secret: secret}
	msg := idem.Message{EventID: "pay-1", Type: "payment.captured", OccurredAt: at.Add(-time.Minute).UTC(), Payload: []byte(`{"amount":5}`)}
	require.NoError(t, idemauth.SignMessage(key, &msg, at))
	broker := msg.Header(wire.Signature)
	require.NotEmpty(t, broker)
	req := idemhttp.SignedRequest{Method: "POST", Target: "/hooks/payments", IdempotencyKey: idemhttp.IdempotencyKey("acme", "pay-1"),
		EventID: "pay-1", Tenant: "acme", Type: "payment.captured", OccurredAt: msg.OccurredAt.Format(time.RFC3339Nano), Body: msg.Payload}
	httpSig := idemhttp.Sign(secret, key.ID, at, req)

	ring, err := idemauth.NewKeyring(key)
	require.NoError(t, err)
	verifier, err := idemauth.NewVerifier(ring, idemauth.VerifierConfig{Now: func() time.Time { return at }})
	require.NoError(t, err)
	require.NoError(t, verifier.Authenticate(context.Background(), &idem.Message{EventID: msg.EventID, Type: msg.Type,
		OccurredAt: msg.OccurredAt, Payload: msg.Payload, Headers: map[string]string{wire.Signature: broker}}), "the broker signature itself verifies")
	require.NoError(t, idemhttp.VerifyHeader(secret, httpSig, req, at, time.Minute), "the HTTP signature itself verifies")

	t.Run("broker signature as HTTP signature", func(t *testing.T) {
		t.Parallel()
		err := idemhttp.VerifyHeader(secret, broker, req, at, time.Minute)
		require.ErrorIs(t, err, idem.ErrUnauthenticated)
	})
	t.Run("broker signature under the old shared name is not an HTTP signature", func(t *testing.T) {
		t.Parallel()
		r := httptest.NewRequest("POST", req.Target, bytes.NewReader(req.Body))
		for name, v := range map[string]string{wire.Signature: broker, wire.IdempotencyKey: req.IdempotencyKey, wire.EventID: req.EventID,
			wire.Tenant: req.Tenant, wire.Type: req.Type, wire.OccurredAt: req.OccurredAt} {
			r.Header.Set(name, v)
		}
		err := idemhttp.Verify(secret, r, req.Body, at, time.Minute)
		require.ErrorIs(t, err, idem.ErrUnauthenticated)
		require.ErrorContains(t, err, "header is missing")
	})
	for _, tc := range []struct {
		name    string
		headers map[string]string
		reason  error
	}{
		{"HTTP signature under the broker header", map[string]string{wire.Signature: httpSig}, idemauth.ErrMalformedSignature},
		{"HTTP signature under its own header", map[string]string{wire.HTTPSignature: httpSig}, idemauth.ErrNotSigned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := idem.Message{EventID: msg.EventID, Type: msg.Type, OccurredAt: msg.OccurredAt, Payload: msg.Payload, Headers: tc.headers}
			err := verifier.Authenticate(context.Background(), &m)
			require.ErrorIs(t, err, idem.ErrUnauthenticated)
			require.ErrorIs(t, err, tc.reason)
		})
	}
}
