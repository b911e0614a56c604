package idemauth

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestV1RotationWindow: v1 signatures (which do not cover OccurredAt) are refused by default and
// verified only inside AcceptV1Until.
func TestV1RotationWindow(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	key := Key{ID: "acme-1", Tenant: "acme", Secret: []byte("0123456789abcdef0123456789abcdef")}
	ring, err := NewKeyring(key)
	require.NoError(t, err)
	signV1 := func(at time.Time) idem.Message {
		m := idem.Message{EventID: "e1", Type: "t", Payload: []byte(`{}`), Tenant: "acme", OccurredAt: t0}
		s := Signature{KeyID: key.ID, Timestamp: at, Version: 1}
		s.MAC = computeMACv1(key, at.Unix(), m)
		m.Headers = map[string]string{HeaderSignature: s.String()}
		return m
	}
	verifier := func(until, now time.Time) *Verifier {
		v, err := NewVerifier(ring, VerifierConfig{AcceptV1Until: until, Now: func() time.Time { return now }})
		require.NoError(t, err)
		return v
	}
	tests := []struct {
		name       string
		v          *Verifier
		signedAt   time.Time
		wantReason error
	}{
		{"off by default", verifier(time.Time{}, t0), t0, ErrVersionRetired},
		{"inside the window", verifier(t0.Add(time.Hour), t0), t0, nil},
		{"signed after the window", verifier(t0.Add(time.Hour), t0.Add(time.Hour+time.Second)), t0.Add(time.Hour + time.Second), ErrVersionRetired},
		{"verified after the window", verifier(t0.Add(time.Hour), t0.Add(2*time.Hour)), t0.Add(time.Hour), ErrVersionRetired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := signV1(tt.signedAt)
			err := tt.v.Authenticate(context.Background(), &m)
			if tt.wantReason == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tt.wantReason)
		})
	}
}

// TestReplayV1RotationWindow (F-v1): the producer signature a replay keeps is held to the same v1
// rotation window as one verified directly: after AcceptV1Until, a v1 original is refused.
func TestReplayV1RotationWindow(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	key := Key{ID: "acme-1", Tenant: "acme", Secret: []byte("0123456789abcdef0123456789abcdef")}
	ops := ReplayKey{ID: "ops-1", Secret: []byte("ops-0123456789abcdef0123456789abcdef")}
	ring, err := NewKeyring(key)
	require.NoError(t, err)
	replayV1 := func(now time.Time) idem.Message {
		m := idem.Message{EventID: "e1", Type: "t", Payload: []byte(`{}`), Tenant: "acme", OccurredAt: t0}
		s := Signature{KeyID: key.ID, Timestamp: t0, Version: 1}
		s.MAC = computeMACv1(key, t0.Unix(), m)
		m.Headers = map[string]string{HeaderSignature: s.String(), idem.HeaderReplayOf: "17"}
		rs, err := NewReplaySigner(ops, func() time.Time { return now })
		require.NoError(t, err)
		require.NoError(t, rs.SignReplay(context.Background(), &m))
		m.PublishedAt = now
		return m
	}
	tests := []struct {
		name       string
		until, now time.Time
		wantReason error
	}{
		{"v1 never allowed", time.Time{}, t0.Add(time.Hour), ErrVersionRetired},
		{"inside the window", t0.Add(2 * time.Hour), t0.Add(time.Hour), nil},
		{"replayed after the window", t0.Add(2 * time.Hour), t0.Add(3 * time.Hour), ErrVersionRetired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v, err := NewVerifier(ring, VerifierConfig{AcceptV1Until: tt.until, Now: func() time.Time { return tt.now },
				ReplayKeys: []ReplayKey{ops}})
			require.NoError(t, err)
			m := replayV1(tt.now)
			err = v.Authenticate(context.Background(), &m)
			if tt.wantReason == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tt.wantReason)
		})
	}
}
