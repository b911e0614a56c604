package idemauth_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemauth"
)

// longSecret is longer than SHA-256's block size: HMAC uses SHA-256 of it as the key.
var longSecret = bytes.Repeat([]byte("L"), 65)

func hashed(b []byte) []byte { s := sha256.Sum256(b); return s[:] }

func withZero(b []byte) []byte { return append(append([]byte(nil), b...), 0, 0) }

// TestNewKeyringRefusesSharedSecret (F3, F-HMAC): one secret (or an HMAC-equivalent one) listed
// for two tenants would let one tenant's producer sign for the other; NewKeyring refuses it,
// naming both keys and tenants and never the secret.
func TestNewKeyringRefusesSharedSecret(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		a, b       []byte // secrets of acme-1 and globex-1
		wantRefuse bool
	}{
		{"distinct secrets", secret('a'), secret('g'), false},
		{"same secret", secret('a'), secret('a'), true},
		{"same secret plus trailing zero bytes", secret('a'), withZero(secret('a')), true},
		{"long secret and its SHA-256", longSecret, hashed(longSecret), true},
		{"long secret and its SHA-256 plus zero bytes", longSecret, withZero(hashed(longSecret)), true},
		{"zero bytes in front are not equivalent", secret('a'), append([]byte{0}, secret('a')...), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := idemauth.NewKeyring(idemauth.Key{ID: "acme-1", Tenant: "acme", Secret: tt.a},
				idemauth.Key{ID: "globex-1", Tenant: "globex", Secret: tt.b})
			if !tt.wantRefuse {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range []string{`"acme-1"`, `"acme"`, `"globex-1"`, `"globex"`, "same HMAC key"} {
				require.ErrorContains(t, err, w)
			}
			require.NotContains(t, err.Error(), string(tt.a[:8]))
		})
	}
	// Two keys of one tenant may share a secret: neither speaks for anyone else.
	_, err := idemauth.NewKeyring(idemauth.Key{ID: "acme-1", Tenant: "acme", Secret: secret('a')},
		idemauth.Key{ID: "acme-2", Tenant: "acme", Secret: secret('a')})
	require.NoError(t, err)
}

// TestNewVerifierRefusesReplayKeyReuse (F4, F-HMAC): a replay key that reuses a producer key's id
// or secret (or another replay key's secret) would let a producer, or an operator limited to some
// tenants, sign replays it should not; NewVerifier refuses it.
func TestNewVerifierRefusesReplayKeyReuse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		keys []idemauth.ReplayKey
		want []string // substrings of the error; none means success
	}{
		{name: "distinct", keys: []idemauth.ReplayKey{{ID: "ops-1", Secret: secret('o')}}},
		{name: "producer key id", keys: []idemauth.ReplayKey{{ID: acmeNew.ID, Secret: secret('o')}},
			want: []string{"ReplayKeys[0]", `"acme-2025-06"`, "producer key"}},
		{name: "producer key secret", keys: []idemauth.ReplayKey{{ID: "ops-1", Secret: secret('g')}},
			want: []string{"ReplayKeys[0]", `"ops-1"`, `"globex-1"`, "same HMAC key"}},
		{name: "producer key secret plus zero bytes", keys: []idemauth.ReplayKey{{ID: "ops-1", Secret: withZero(secret('b'))}},
			want: []string{"ReplayKeys[0]", `"ops-1"`, `"acme-2025-06"`, "same HMAC key"}},
		{name: "another replay key's secret", keys: []idemauth.ReplayKey{{ID: "ops-1", Secret: secret('o')},
			{ID: "ops-globex", Secret: secret('o'), Tenants: []string{"globex"}}},
			want: []string{"ReplayKeys[1]", `"ops-globex"`, `"ops-1"`, "same HMAC key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := idemauth.NewVerifier(ring(t), idemauth.VerifierConfig{ReplayKeys: tt.keys})
			if len(tt.want) == 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tt.want {
				require.ErrorContains(t, err, w)
			}
			require.NotContains(t, err.Error(), string(secret('o')[:8]))
		})
	}
}

// TestReplayNeedsKnownProducerKey (F-v1): a replay that is not sent as a new event must carry a
// producer signature the verifier can check. Otherwise a replay key alone could put any payload
// under any event id by naming a producer key the verifier does not hold.
func TestReplayNeedsKnownProducerKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := t0.Add(3 * time.Hour)
	ops := idemauth.ReplayKey{ID: "ops-1", Secret: secret('o')}
	v, err := idemauth.NewVerifier(ring(t), idemauth.VerifierConfig{Now: func() time.Time { return now },
		ReplayKeys: []idemauth.ReplayKey{ops}})
	require.NoError(t, err)
	s, err := idemauth.NewReplaySigner(ops, func() time.Time { return now })
	require.NoError(t, err)
	tests := []struct {
		name     string
		producer idemauth.Key // signs the original; not necessarily in the verifier's ring
		reason   error        // nil means accepted
	}{
		{"producer key in the ring", acmeNew, nil},
		{"producer key not in the ring", idemauth.Key{ID: "ghost", Tenant: "acme", Secret: secret('x')}, idemauth.ErrUnknownKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := payment("evt-1")
			m.Payload = []byte(`{"amount_cents":99999}`)
			m = signed(t, tt.producer, m, t0)
			m.Headers[idem.HeaderReplayOf] = "17"
			require.NoError(t, s.SignReplay(ctx, &m))
			m.PublishedAt = now
			err := v.Authenticate(ctx, &m)
			if tt.reason == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, idem.ErrUnauthenticated)
			require.ErrorIs(t, err, tt.reason)
		})
	}
}
